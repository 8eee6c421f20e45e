//! A job's preparation off the agent's loop ([`Executor::prepare`]): a pass never waits for it; the pass after it
//! ends spawns the job, unless the node lease's local deadline has passed by then; its end wakes the agent at once;
//! a job the controller moved on from meanwhile never spawns; a stop reports it interrupted. On MemStore with the
//! simulated executor behind a gate the test opens, on tokio's paused clock. The OS executor's own preparation
//! (a long file copy while the agent heartbeats) is in tests/agent_process.rs.
#![cfg(not(madsim))]

use lockstep::agent::simulated::ProcessEventKind;
use lockstep::agent::{
    Agent, AgentConfig, Behaviour, Executor, ExecutorError, JobScript, ProcessHandle, ProcessLog, REASON_NODE_STOPPING,
    SimulatedExecutor, StartRequest,
};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{INBOX_NEW, JobOutcome, KIND_INBOX, KIND_NODE, Message};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, RowId, Store, Timestamp, TokioClock};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gang_support::link;
use link::{Link, Mode};

const START: Timestamp = Timestamp(1_700_000_000_000_000);

/// The simulated executor (every job hangs until killed) with a preparation that lasts until the test opens the
/// gate.
struct GatedExecutor {
    inner: SimulatedExecutor,
    gate: watch::Receiver<bool>,
    prepares: Arc<AtomicUsize>,
}

impl Executor for GatedExecutor {
    type Prepared = StartRequest;

    fn prepare(
        &self,
        request: StartRequest,
    ) -> impl Future<Output = Result<StartRequest, ExecutorError>> + Send + 'static {
        let mut gate = self.gate.clone();
        self.prepares.fetch_add(1, Ordering::SeqCst);
        async move {
            gate.wait_for(|open| *open).await.expect("the test keeps the gate");
            Ok(request)
        }
    }

    fn spawn(&self, request: StartRequest) -> Result<ProcessHandle, ExecutorError> {
        self.inner.spawn(request)
    }
}

struct Setup {
    store: MemStore,
    link: Link,
    log: ProcessLog,
    replica: Pipeline<MemStore>,
    gate: watch::Sender<bool>,
    prepares: Arc<AtomicUsize>,
}

impl Setup {
    fn new() -> Setup {
        let store = MemStore::new(TokioClock::new(START));
        let link = Link::new(store.clone());
        let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
        let (gate, _) = watch::channel(false);
        Setup { store, link, log: ProcessLog::default(), replica, gate, prepares: Arc::default() }
    }

    fn agent(&self, config: AgentConfig) -> Agent<Link, GatedExecutor> {
        let script = JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() };
        let inner = SimulatedExecutor::new(script, self.log.clone());
        let executor = GatedExecutor { inner, gate: self.gate.subscribe(), prepares: self.prepares.clone() };
        Agent::new(Arc::new(self.link.clone()), executor, config)
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    async fn controller_pass(&self) {
        self.replica.fetcher(1).run_once().await.unwrap();
        while self.replica.work_one(&OperationHandler::default()).await.is_some() {}
    }

    /// The runtime instant at which the node lease ends (the store's clock follows the runtime's from START).
    async fn node_lease_expiry(&self, origin: Instant, name: &str) -> Instant {
        let nodes = self.store.list(KIND_NODE, None).await.unwrap();
        let node = nodes.iter().find(|n| n.status == name).expect("registered");
        let at = node.lock_expires_at.expect("leased");
        origin + Duration::from_micros((at.as_micros() - START.as_micros()) as u64)
    }

    async fn inbox(&self, op: RowId) -> Vec<Message> {
        let rows = self.store.list(KIND_INBOX, Some(op)).await.unwrap();
        rows.iter().filter(|r| r.status == INBOX_NEW).map(|r| Message::from_row(r).unwrap()).collect()
    }

    fn started(&self) -> Vec<Instant> {
        self.log.events().iter().filter(|e| e.kind == ProcessEventKind::Started).map(|e| e.at).collect()
    }
}

/// Lets spawned tasks run (paused time fires their timers, but they run only when this task yields).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

const ONE_JOB: &str = "{tasks={t={job_count=1;command=c}}}";

/// A pass that begins before the node lease's local deadline and gets to a prepared job only after it (here its
/// store call hangs meanwhile) does not spawn it: the deadline is checked right before the spawn, not only when
/// the pass begins. The next pass fences.
#[tokio::test(start_paused = true)]
async fn a_job_whose_preparation_ends_after_the_lease_deadline_is_not_spawned() {
    let setup = Setup::new();
    let origin = Instant::now();
    let mut agent = setup.agent(AgentConfig::new("node-0", 1));
    agent.run_once().await.unwrap();
    let expiry = setup.node_lease_expiry(origin, "node-0").await;
    api::submit_text(&setup.store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    let pass = agent.run_once().await.unwrap();
    assert!(pass.started.is_empty(), "the preparation is still running");
    let job = *agent.preparing().values().next().expect("the job's start is being prepared");

    // Early in the lease (no heartbeat due), a pass begins and its allocation read hangs; meanwhile the lease's
    // local deadline (expiry − margin) passes and the preparation ends.
    setup.link.set(Mode::Hanging);
    let later = async {
        tokio::time::sleep_until(expiry - Duration::from_millis(500)).await;
        setup.open_gate();
        settle().await;
        setup.link.set(Mode::Open);
    };
    let (pass, ()) = tokio::join!(agent.run_once(), later);
    let pass = pass.unwrap();
    assert_eq!(pass.late, vec![job]);
    assert!(pass.started.is_empty());
    assert!(setup.log.events().is_empty(), "nothing spawned: {:?}", setup.log.events());
    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.fenced.as_deref(), Some("node lease expired locally"));
    assert!(agent.preparing().is_empty(), "the fence gave the start up");
    assert!(setup.log.events().is_empty());
}

/// While a preparation runs, the agent's passes go on (and heartbeat: the lease outlives its first deadline many
/// times over); when it ends, the agent starts its next pass at once, not after its poll interval, and spawns the
/// job in the session it was placed under.
#[tokio::test(start_paused = true)]
async fn passes_go_on_during_a_preparation_and_its_end_wakes_the_agent_at_once() {
    let setup = Setup::new();
    let config = AgentConfig { poll_interval: Duration::from_secs(2), ..AgentConfig::new("node-0", 1) };
    let (ttl, poll) = (config.lease_ttl, config.poll_interval);
    let agent = setup.agent(config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run_until(async {
        let _ = stopped.await;
    }));
    api::submit_text(&setup.store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    setup.controller_pass().await;
    for _ in 0..50 {
        if setup.prepares.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(setup.prepares.load(Ordering::SeqCst), 1, "the job's preparation began");
    let token = |store: MemStore| async move {
        let nodes = store.list(KIND_NODE, None).await.unwrap();
        nodes.into_iter().find(|n| n.status == "node-0").unwrap().lock_token
    };
    let session = token(setup.store.clone()).await.expect("leased");
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(token(setup.store.clone()).await, Some(session), "the agent kept its node lease");
    assert!(setup.started().is_empty());
    // Mid-pause: the agent's last pass just ended, its next is a poll interval away.
    tokio::time::sleep(poll / 2).await;
    let opened = Instant::now();
    setup.open_gate();
    for _ in 0..50 {
        if !setup.started().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = setup.started();
    assert_eq!(started.len(), 1, "the job started");
    assert!(started[0] < opened + poll / 4, "started {:?} after its preparation ended", started[0] - opened);
    stop.send(()).unwrap();
    assert_eq!(task.await.unwrap().interrupted.len(), 1);
}

/// The controller moves on (here: the operation is aborted) while the job's start is prepared: the preparation is
/// given up and its end spawns nothing.
#[tokio::test(start_paused = true)]
async fn a_job_the_controller_moved_on_from_during_its_preparation_never_spawns() {
    let setup = Setup::new();
    let mut agent = setup.agent(AgentConfig::new("node-0", 1));
    agent.run_once().await.unwrap();
    let op = api::submit_text(&setup.store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    assert_eq!(agent.preparing().len(), 1);
    api::abort(&setup.store, op, "test").await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    assert!(agent.preparing().is_empty(), "the start was given up");
    setup.open_gate();
    settle().await;
    let pass = agent.run_once().await.unwrap();
    assert!(pass.started.is_empty());
    assert!(setup.log.events().is_empty(), "nothing spawned: {:?}", setup.log.events());
}

/// A stopping agent reports a job whose start it was still preparing as interrupted, as it does a running one: the
/// controller restarts it elsewhere at once.
#[tokio::test(start_paused = true)]
async fn a_stopping_agent_reports_a_job_it_was_preparing_as_interrupted() {
    let setup = Setup::new();
    let mut agent = setup.agent(AgentConfig::new("node-0", 1));
    agent.run_once().await.unwrap();
    let op = api::submit_text(&setup.store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    setup.controller_pass().await;
    agent.run_once().await.unwrap();
    let job = *agent.preparing().values().next().expect("preparing");
    let stop = agent.stop().await;
    assert_eq!(stop.interrupted, vec![job]);
    assert!(stop.lease_released);
    let interrupted = JobOutcome::Interrupted { reason: REASON_NODE_STOPPING.into() };
    let inbox = setup.inbox(op).await;
    assert!(
        matches!(&inbox[..], [Message::JobEnded { job: j, outcome, .. }] if *j == job && *outcome == interrupted),
        "{inbox:?}"
    );
    setup.open_gate();
    settle().await;
    assert!(setup.log.events().is_empty(), "nothing spawned after the stop");
}
