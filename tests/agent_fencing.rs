//! Node agents: self-fencing when the node lease cannot be renewed, sessions, and killing the jobs of older
//! incarnations; on MemStore with the simulated executor, on tokio's paused clock.
#![cfg(not(madsim))]

use lockstep::agent::simulated::ProcessEventKind;
use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, KIND_NODE, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, Store, Timestamp, TokioClock};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[path = "gang_support/link.rs"]
mod link;
use link::{Link, Mode};

const START: Timestamp = Timestamp(1_700_000_000_000_000);

struct Setup {
    store: MemStore,
    /// The runtime instant at which the store's clock read START.
    origin: Instant,
    link: Link,
    log: ProcessLog,
    replica: Pipeline<MemStore>,
}

impl Setup {
    fn new() -> Setup {
        let origin = Instant::now();
        let store = MemStore::new(TokioClock::new(START));
        let link = Link::new(store.clone());
        let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
        Setup { store, origin, link, log: ProcessLog::default(), replica }
    }

    fn agent(&self, name: &str, script: JobScript) -> Agent<Link, SimulatedExecutor> {
        let executor = SimulatedExecutor::new(script, self.log.clone());
        Agent::new(Arc::new(self.link.clone()), executor, AgentConfig::new(name, 1))
    }

    async fn controller_pass(&self) {
        self.replica.fetcher(1).run_once().await.unwrap();
        while self.replica.work_one(&OperationHandler::default()).await.is_some() {}
    }

    /// The runtime instant of a store timestamp.
    fn instant(&self, at: Timestamp) -> Instant {
        self.origin + Duration::from_micros((at.as_micros() - START.as_micros()) as u64)
    }

    async fn node_lease_expiry(&self, name: &str) -> Instant {
        let nodes = self.store.list(KIND_NODE, None).await.unwrap();
        let node = nodes.iter().find(|n| n.status == name).expect("registered");
        self.instant(node.lock_expires_at.expect("leased"))
    }

    fn kill_time(&self) -> Instant {
        let events = self.log.events();
        let killed = events.iter().find(|e| e.kind == ProcessEventKind::Killed).expect("a process was killed");
        killed.at
    }
}

/// Lets the spawned process tasks run (paused time fires their timers, but they run only when this task yields).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Runs `agent` once a second for `seconds` seconds of paused time.
async fn tick(agent: &mut Agent<Link, SimulatedExecutor>, seconds: u64) {
    for _ in 0..seconds {
        tokio::time::advance(Duration::from_secs(1)).await;
        agent.run_once().await.unwrap();
    }
}

fn hanging() -> JobScript {
    JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() }
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_cannot_renew_its_lease_kills_its_jobs_before_the_store_lets_it_go() {
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let op = api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.started.len(), 1);
    let expiry = setup.node_lease_expiry("node-0").await;

    setup.link.set(Mode::Failing);
    let mut fenced = None;
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(1)).await;
        match agent.run_once().await {
            Ok(pass) if pass.fenced.is_some() => {
                fenced = pass.fenced;
                break;
            }
            _ => {}
        }
    }
    assert_eq!(fenced.as_deref(), Some("node lease expired locally"));
    assert!(agent.running().is_empty());
    assert!(agent.session().is_none());
    assert!(setup.kill_time() < expiry, "killed at {:?}, lease ends at {expiry:?}", setup.kill_time());
    assert_eq!(api::status(&setup.store, op).await.unwrap().status, OperationStatus::Running);
}

#[tokio::test(start_paused = true)]
async fn an_agent_whose_store_calls_hang_still_fences_at_its_deadline() {
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    let expiry = setup.node_lease_expiry("node-0").await;
    let running = tokio::spawn(agent.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    setup.link.set(Mode::Hanging);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(setup.log.live().is_empty(), "the hanging pass was abandoned and the job killed");
    assert!(setup.kill_time() < expiry);
    running.abort();
}

/// A pass that extends the node lease and then hangs on a later call is abandoned at the *extended* deadline: the
/// agent must not fence itself while its lease is still held (found by `lockstep sim run
/// scenarios/gang-db-restart.toml` under lost replies: a heartbeat went through, the next insert lost its reply,
/// and the agent fenced at the deadline its pass started with, so its node was declared lost and the gang
/// restarted for nothing).
#[tokio::test(start_paused = true)]
async fn a_pass_that_extended_the_lease_and_then_hangs_fences_at_the_extended_deadline() {
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    let first_expiry = setup.node_lease_expiry("node-0").await;
    // The next pass is due for a heartbeat (its local deadline is within the trigger): it extends the lease, then
    // hangs on its next call.
    tokio::time::advance(Duration::from_millis(3_500)).await;
    setup.link.set(Mode::HeartbeatsOnly);
    let running = tokio::spawn(agent.run());
    tokio::time::sleep_until(first_expiry - Duration::from_secs(1)).await;
    let extended = setup.node_lease_expiry("node-0").await;
    assert!(extended > first_expiry, "the hanging pass extended the lease first");
    // Past the deadline the pass started with (first expiry − margin) and past the first expiry itself: the
    // lease is held, so the job must still run.
    tokio::time::sleep_until(first_expiry + Duration::from_secs(1)).await;
    assert_eq!(setup.log.live().len(), 1, "the agent fenced while its extended lease was still held");
    // The pass still hangs: the agent fences at the extended deadline, before the store lets the lease go.
    tokio::time::sleep_until(extended + Duration::from_secs(1)).await;
    assert!(setup.log.live().is_empty(), "the hanging pass was abandoned and the job killed");
    assert!(setup.kill_time() < extended, "killed at {:?}, extended lease ends at {extended:?}", setup.kill_time());
    running.abort();
}

#[tokio::test(start_paused = true)]
async fn after_fencing_the_agent_starts_a_new_session_and_never_runs_the_old_allocations() {
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let first = agent.session().unwrap();
    let op = api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    setup.link.set(Mode::Failing);
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let _ = agent.run_once().await;
    }
    assert!(agent.session().is_none());
    setup.link.set(Mode::Open);
    let pass = agent.run_once().await.unwrap();
    assert!(pass.leased);
    let second = agent.session().unwrap();
    assert!(second > first, "a new session has a new token");
    assert!(pass.started.is_empty(), "the old session's allocation is not run again");

    // The controller sees the old session gone and aborts the job; the slot, released, is free under the new
    // session at its next pass, which places the job's replacement there.
    tick(&mut agent, 6).await;
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    assert_eq!(view.jobs[0].status, JobStatus::Aborted);
    assert_eq!(view.jobs[0].data.reason.as_deref(), Some("node lost"));
    tick(&mut agent, 6).await;
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.started, vec![view.jobs[1].data.id]);
}

#[tokio::test(start_paused = true)]
async fn a_reused_allocation_kills_the_old_incarnations_job_before_starting_the_new_one() {
    let setup = Setup::new();
    let script = hanging().with("w", 1, 0, Behaviour::exit_after(Duration::from_secs(2), 1));
    let mut agents: Vec<_> = (0..4).map(|i| setup.agent(&format!("node-{i}"), script.clone())).collect();
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let op = api::submit_text(&setup.store, "{tasks={w={job_count=3;command=c;gang_options={}}}}", SpecFormat::Yson)
        .await
        .unwrap();
    setup.controller_pass().await;
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    settle().await;
    tokio::time::advance(Duration::from_secs(3)).await;
    settle().await;
    for agent in &mut agents {
        agent.run_once().await.unwrap(); // cookie 1 exits 1 and is reported
    }
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    assert_eq!(view.data.incarnation, 1);
    let mut killed = Vec::new();
    let mut started = Vec::new();
    for agent in &mut agents {
        let pass = agent.run_once().await.unwrap();
        killed.extend(pass.killed);
        started.extend(pass.started);
    }
    let old: Vec<_> = view.jobs.iter().filter(|j| j.data.incarnation == 0 && j.data.job_cookie != 1).collect();
    assert_eq!(killed.len(), 2, "the two jobs of incarnation 0 still running: {killed:?}");
    for job in old {
        assert!(killed.contains(&job.data.id));
    }
    assert_eq!(started.len(), 3, "every job of incarnation 1 starts");
    let events = setup.log.events();
    for job in view.current_jobs() {
        let allocation = job.data.allocation.unwrap();
        let start = events.iter().position(|e| e.job == job.data.id && e.kind == ProcessEventKind::Started).unwrap();
        let earlier_live = events[..start]
            .iter()
            .filter(|e| e.allocation.row == allocation.row)
            .fold(0i32, |live, e| live + if e.kind == ProcessEventKind::Started { 1 } else { -1 });
        assert_eq!(earlier_live, 0, "allocation {allocation} was empty when job {} started", job.data.id);
    }
}
