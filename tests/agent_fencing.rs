//! Node agents: self-fencing when the node lease cannot be renewed, sessions, and killing the jobs of older
//! incarnations; on MemStore with the simulated executor, on tokio's paused clock.
#![cfg(not(madsim))]

use lockstep::agent::simulated::ProcessEventKind;
use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, REASON_MOVED_ON, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobOutcome, JobStatus, KIND_INBOX, KIND_NODE, Message, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, Store, Timestamp, TokioClock};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::gang_support::link;
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
    // Two slots: job 1 ends after 3 s, so the pass after it has a report to send; job 0 runs on.
    let script = hanging().with("t", 1, 0, Behaviour::exit_after(Duration::from_secs(3), 0));
    let executor = SimulatedExecutor::new(script, setup.log.clone());
    let mut agent = Agent::new(Arc::new(setup.link.clone()), executor, AgentConfig::new("node-0", 2));
    agent.run_once().await.unwrap();
    api::submit_text(&setup.store, "{tasks={t={job_count=2;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    assert_eq!(agent.run_once().await.unwrap().started.len(), 2);
    let first_expiry = setup.node_lease_expiry("node-0").await;
    // The next pass is due for a heartbeat (its local deadline is within the trigger): it lists its allocations,
    // extends the lease, then hangs on its next call (the report of job 1's exit).
    tokio::time::advance(Duration::from_millis(3_500)).await;
    settle().await;
    setup.link.set(Mode::HeartbeatsAndListingsOnly);
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

/// An agent that can renew its node lease but not list its allocations neither starts what the controller places
/// in its node nor kills what it moved on from: it must not hold the lease (DESIGN §4, Agents). It renews nothing,
/// fences before the store lets the lease go, and takes no new session until a listing succeeds.
#[tokio::test(start_paused = true)]
async fn an_agent_that_cannot_list_its_allocations_renews_no_lease_and_fences_before_the_store_lets_it_go() {
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let op = api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    assert_eq!(agent.run_once().await.unwrap().started.len(), 1);
    let expiry = setup.node_lease_expiry("node-0").await;

    setup.link.set(Mode::AllocationListsFailing);
    let mut fenced = None;
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(1)).await;
        if let Ok(pass) = agent.run_once().await
            && pass.fenced.is_some()
        {
            fenced = pass.fenced;
            break;
        }
    }
    assert_eq!(fenced.as_deref(), Some("node lease expired locally"));
    assert!(agent.running().is_empty());
    assert!(setup.kill_time() < expiry, "killed at {:?}, lease ends at {expiry:?}", setup.kill_time());
    // The fence gave the lease back, and no pass takes it again while its listing fails.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(agent.run_once().await.is_err(), "the listing fails");
        assert!(agent.session().is_none(), "a new session while the agent cannot see its allocations");
    }
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    assert_eq!(view.jobs[0].status, JobStatus::Aborted);
    assert_eq!(view.jobs[0].data.reason.as_deref(), Some("node lost"));
    setup.link.set(Mode::Open);
    assert!(agent.run_once().await.unwrap().leased, "a listing succeeded: the agent serves its node again");
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

#[tokio::test(start_paused = true)]
async fn an_agent_reports_each_process_it_kills_because_the_controller_moved_on() {
    // The controller learns from the report that the old process is gone (gang::model::Lingering).
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let op = api::submit_text(&setup.store, "{tasks={w={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    setup.controller_pass().await;
    api::abort(&setup.store, op, "enough").await.unwrap();
    setup.controller_pass().await;
    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.killed.len(), 1);
    let reports: Vec<Message> = setup
        .store
        .list(KIND_INBOX, Some(op))
        .await
        .unwrap()
        .iter()
        .map(|row| Message::from_row(row).unwrap())
        .collect();
    let killed = Message::JobEnded {
        job: pass.killed[0],
        allocation: api::status(&setup.store, op).await.unwrap().jobs[0].data.allocation.unwrap(),
        outcome: JobOutcome::Aborted { reason: REASON_MOVED_ON.into() },
    };
    assert!(reports.contains(&killed), "{reports:#?}");
}

/// A session the controller declared lost stays lost: an agent whose local clock runs slow sends its
/// heartbeat after its node lease expired in the store and after the controller aborted its jobs as "node lost".
/// The heartbeat must not bring the old session back (the controller would place jobs under it and declare the
/// node lost a second time, a second gang restart): the agent learns the lease is gone, fences, and starts a new
/// session.
#[tokio::test(start_paused = true)]
async fn a_node_declared_lost_does_not_come_back_under_its_old_session_after_a_late_heartbeat() {
    let setup = Setup::new();
    // The agent's clock runs at half the store's rate, and it extends its 10 s lease only 2 s before its local
    // deadline (8 s local = 16 s of store time): by its own clock its heartbeat is due 12 s after its session
    // started, 2 s after the store let the lease expire (DESIGN §2: a margin smaller than ttl × drift).
    let clock = lockstep::pipeline::LocalClock::drifting();
    clock.set_rate_ppm(500_000);
    let config = AgentConfig { heartbeat_trigger: Duration::from_secs(2), ..AgentConfig::new("node-0", 1) };
    let executor = SimulatedExecutor::new(hanging(), setup.log.clone());
    let mut agent = Agent::new(Arc::new(setup.link.clone()), executor, config).with_local_clock(clock);
    agent.run_once().await.unwrap();
    let old = agent.session().expect("a session");
    let op = api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    assert_eq!(agent.run_once().await.unwrap().started.len(), 1);
    let expiry = setup.node_lease_expiry("node-0").await;

    tokio::time::sleep_until(expiry + Duration::from_secs(1)).await;
    setup.controller_pass().await;
    let view = api::status(&setup.store, op).await.unwrap();
    assert_eq!(view.jobs[0].data.reason.as_deref(), Some("node lost"), "the controller declared node-0 lost");

    let mut fenced = None;
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let pass = agent.run_once().await.unwrap();
        if pass.fenced.is_some() {
            fenced = pass.fenced;
            break;
        }
        assert_eq!(agent.session(), Some(old), "no new session before the old one is found lost");
    }
    assert_eq!(fenced.as_deref(), Some("node lease lost"), "the late heartbeat revived the lost session");
    let nodes = setup.store.list(KIND_NODE, None).await.unwrap();
    let node = nodes.iter().find(|n| n.status == "node-0").unwrap();
    let now = setup.store.now().await.unwrap();
    assert!(
        node.lock_token != Some(old) || node.lock_expires_at.is_none_or(|at| at <= now),
        "session {old} of node-0 is live again: {node:?}"
    );
    let pass = agent.run_once().await.unwrap();
    assert!(pass.leased && agent.session().is_some_and(|new| new > old), "a new session follows the fence");
}

/// A node row carries the running agent's slots: an agent restarted within its predecessor's node
/// lease with fewer `--slots` waits for that lease, writes its slot count before its session starts, and the
/// controller then places jobs only in the slots it offers.
#[tokio::test(start_paused = true)]
async fn an_agent_restarted_with_fewer_slots_updates_its_node_before_its_session_starts() {
    let setup = Setup::new();
    let executor = || SimulatedExecutor::new(hanging(), setup.log.clone());
    let mut first = Agent::new(Arc::new(setup.link.clone()), executor(), AgentConfig::new("node-0", 3));
    first.run_once().await.unwrap();
    let old = first.session().expect("a session");
    drop(first); // killed: its lease runs on until it expires
    let mut second = Agent::new(Arc::new(setup.link.clone()), executor(), AgentConfig::new("node-0", 1));
    let pass = second.run_once().await.unwrap();
    assert!(!pass.leased && second.session().is_none(), "the old session still holds the node");

    let mut new = None;
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(1)).await;
        second.run_once().await.unwrap();
        if let Some(session) = second.session() {
            new = Some(session);
            break;
        }
    }
    assert!(new.is_some_and(|new| new > old), "the restarted agent gets a new session");
    let nodes = setup.store.list(KIND_NODE, None).await.unwrap();
    let node = nodes.iter().find(|n| n.status == "node-0").unwrap();
    assert_eq!(node.data["slots"], 1, "node-0's row still offers the old agent's slots: {}", node.data);

    let op = api::submit_text(&setup.store, "{tasks={t={job_count=3;command=c}}}", SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    let pass = second.run_once().await.unwrap();
    assert_eq!(pass.started.len(), 1, "one slot, one job");
    assert!(pass.unserved.is_empty(), "no job was placed in a slot the agent does not offer: {:?}", pass.unserved);
    let view = api::status(&setup.store, op).await.unwrap();
    let placed = view.jobs.iter().filter(|j| j.data.allocation.is_some() && !j.status.is_terminal()).count();
    assert_eq!(placed, 1, "jobs placed on node-0: {:?}", view.jobs);
}

/// An allocation granted under the agent's session in a slot it does not offer (a row written elsewhere, or by a
/// controller that read an out-of-date node row) is reported interrupted, once, instead of staying assigned
/// forever.
#[tokio::test(start_paused = true)]
async fn a_job_placed_in_a_slot_the_agent_does_not_offer_is_reported_interrupted_once() {
    use lockstep::gang::model::{
        ALLOCATION_ALLOCATED, AllocationData, INBOX_NEW, JobId, JobLaunch, KIND_ALLOCATION, KIND_INBOX,
    };
    use lockstep::store::NewRow;
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let session = agent.session().unwrap();
    let node = agent.node().unwrap();
    let op = api::submit_text(&setup.store, "{tasks={t={job_count=1;command=c}}}", SpecFormat::Yson).await.unwrap();
    let job = JobId { operation: op, index: 0 };
    let launch = JobLaunch {
        job,
        incarnation: format!("{op}-i0"),
        task: "t".into(),
        job_cookie: 0,
        gang_rank: None,
        command: "c".into(),
        environment: Default::default(),
        file_paths: Vec::new(),
    };
    let data = AllocationData {
        generation: 1,
        operation: Some(op),
        node_session: Some(session),
        job: Some(std::sync::Arc::new(launch)),
        ..AllocationData::free(node, "node-0".into(), 5)
    };
    let row = NewRow::new(KIND_ALLOCATION, ALLOCATION_ALLOCATED, serde_json::to_value(&data).unwrap());
    setup.store.insert(row.with_parent(node)).await.unwrap();

    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.unserved, vec![job]);
    assert!(pass.started.is_empty());
    let inbox = setup.store.list(KIND_INBOX, Some(op)).await.unwrap();
    let reports: Vec<_> =
        inbox.iter().filter(|r| r.status == INBOX_NEW && r.data.to_string().contains("not served")).collect();
    assert_eq!(reports.len(), 1, "one report: {inbox:?}");
    let pass = agent.run_once().await.unwrap();
    assert!(pass.unserved.is_empty(), "reported again: {:?}", pass.unserved);
}

/// A report queued for an operation that retention deleted meanwhile (`lockstep serve --retain`; the operation
/// ended, and its jobs, inbox and row went) is refused by the store, whose rows need their parent (DESIGN §2,
/// "Parents"). The agent drops it instead of failing every pass on it, which would hold back every report queued
/// behind it: the next operation's reports reach it.
#[tokio::test(start_paused = true)]
async fn a_report_to_an_operation_retention_deleted_is_dropped_and_holds_back_no_other() {
    use lockstep::pipeline::{Retention, RetentionRule};
    let setup = Setup::new();
    let mut agent = setup.agent("node-0", hanging());
    agent.run_once().await.unwrap();
    let spec = "{tasks={w={job_count=1;command=c}}}";
    let op = api::submit_text(&setup.store, spec, SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    setup.controller_pass().await;
    api::abort(&setup.store, op, "enough").await.unwrap();
    setup.controller_pass().await;
    assert_eq!(api::status(&setup.store, op).await.unwrap().status, OperationStatus::Aborted);
    let ended = ["completed", "failed", "aborted"];
    let rules = vec![
        RetentionRule::new("job", &ended, Duration::ZERO).with_parent_statuses(&ended),
        RetentionRule::new("inbox", &["done", "new"], Duration::ZERO).with_parent_statuses(&ended),
        RetentionRule::new("operation", &ended, Duration::ZERO),
    ];
    Retention::new(rules).pass(&setup.store).await.unwrap();
    assert!(setup.store.get(op).await.unwrap().is_none(), "retention was to delete operation {op}");
    let next = api::submit_text(&setup.store, spec, SpecFormat::Yson).await.unwrap();
    let pass = agent.run_once().await.expect("the pass that kills the deleted operation's process and reports it");
    assert_eq!(pass.killed.len(), 1, "the process of the deleted operation's job");
    for _ in 0..3 {
        setup.controller_pass().await;
        agent.run_once().await.expect("an agent pass");
    }
    let status = api::status(&setup.store, next).await.unwrap();
    assert_eq!(status.jobs[0].status, JobStatus::Running, "the next operation's start report arrived");
}
