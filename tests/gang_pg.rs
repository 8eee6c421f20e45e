//! The gang controller unchanged on PostgreSQL: the operation pipeline and agents (simulated executor) over a
//! PgStore, in real time with short jobs. Needs PostgreSQL (DATABASE_URL); never skips.
#![cfg(not(madsim))]

use crate::support;

use lockstep::agent::{Agent, AgentConfig, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::api::{self, OperationView};
use lockstep::gang::model::{JobStatus, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::{SpecFormat, audit};
use lockstep::pipeline::{ManagerOptions, PipelineConfig, PipelineManager};
use lockstep::store::conformance::Harness;
use lockstep::store::{PgStore, RowId, Store};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

struct Cluster {
    store: Arc<PgStore>,
    manager: PipelineManager<PgStore>,
    agents: BTreeMap<String, JoinHandle<()>>,
    log: ProcessLog,
    /// Owns the schema: dropped when the test passes, kept when it fails.
    _harness: support::pg::PgHarness,
}

impl Cluster {
    async fn start(nodes: usize, slots: u32, job: Duration) -> Cluster {
        let harness = support::pg::PgHarness::with(|options| options.max_connections = 40).await;
        let store = Arc::new(harness.store().clone());
        let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: 3 });
        let config = PipelineConfig {
            workers: 4,
            min_processing_interval: Duration::from_secs(1),
            ..operation_pipeline_config()
        };
        manager.register(config, OperationHandler::default()).unwrap();
        manager.start();
        let log = ProcessLog::default();
        let executor = SimulatedExecutor::new(JobScript::uniform(job), log.clone());
        let mut agents = BTreeMap::new();
        for i in 0..nodes {
            let name = format!("node-{i}");
            let config = AgentConfig { poll_interval: Duration::from_millis(200), ..AgentConfig::new(&name, slots) };
            agents.insert(name, tokio::spawn(Agent::new(store.clone(), executor.clone(), config).run()));
        }
        Cluster { store, manager, agents, log, _harness: harness }
    }

    async fn wait_for(&self, op: RowId, limit: Duration, done: impl Fn(&OperationView) -> bool) -> OperationView {
        let started = tokio::time::Instant::now();
        loop {
            let view = api::status(self.store.as_ref(), op).await.unwrap();
            if done(&view) {
                return view;
            }
            assert!(started.elapsed() < limit, "operation {op} not done after {limit:?}: {:?}", view.status);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(mut self) {
        for (_, agent) in std::mem::take(&mut self.agents) {
            agent.abort();
        }
        self.manager.shutdown().await;
        assert_eq!(self.log.exclusivity_violations(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_with_a_lost_node_restarts_once_and_completes_on_postgres() {
    let mut cluster = Cluster::start(4, 1, Duration::from_secs(3)).await;
    let gang = "{tasks={worker={job_count=3;command=w;gang_options={}}}}";
    let op = api::submit_text(cluster.store.as_ref(), gang, SpecFormat::Yson).await.unwrap();
    let running = |v: &OperationView| v.current_jobs().filter(|j| j.status == JobStatus::Running).count() == 3;
    let before = cluster.wait_for(op, Duration::from_secs(20), running).await;
    let victim = before.current_jobs().find(|j| j.data.job_cookie == 1).unwrap();
    let node = cluster.store.get(victim.data.allocation.unwrap().row).await.unwrap().unwrap().parent_id.unwrap();
    let name = cluster.store.get(node).await.unwrap().unwrap().status;
    cluster.agents.remove(&name).unwrap().abort();

    let view = cluster.wait_for(op, Duration::from_secs(60), |v| v.status.is_terminal()).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.incarnation_events().len(), 2);
    let reused =
        view.current_jobs().filter(|j| before.current_jobs().any(|b| b.data.allocation == j.data.allocation)).count();
    assert_eq!(reused, 2, "two allocations reused");
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_master_slave_example_completes_on_postgres() {
    let cluster = Cluster::start(6, 8, Duration::from_millis(200)).await;
    let spec = include_str!("../scenarios/specs/seed-master-slave.yson");
    let op = api::submit_text(cluster.store.as_ref(), spec, SpecFormat::Yson).await.unwrap();
    let view = cluster.wait_for(op, Duration::from_secs(60), |v| v.status.is_terminal()).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.jobs.iter().filter(|j| j.status == JobStatus::Completed).count(), 101);
    assert_eq!(audit::operation(&view), Vec::<String>::new());
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_all_or_nothing_gangs_on_three_slots_take_turns_through_the_gang_queue_on_postgres() {
    // Issue 14: the second gang waits in the gang queue row (inserted, locked and written through PgStore) holding
    // nothing, and runs whole once the first gang is done.
    let cluster = Cluster::start(3, 1, Duration::from_secs(2)).await;
    let gang = "{tasks={w={job_count=2;command=w;gang_options={}}};gang_placement=all_or_nothing}";
    let a = api::submit_text(cluster.store.as_ref(), gang, SpecFormat::Yson).await.unwrap();
    let b = api::submit_text(cluster.store.as_ref(), gang, SpecFormat::Yson).await.unwrap();
    for op in [a, b] {
        let view = cluster.wait_for(op, Duration::from_secs(60), |v| v.status.is_terminal()).await;
        assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
        assert_eq!(audit::operation(&view), Vec::<String>::new());
    }
    let rows = cluster.store.list(lockstep::gang::placement::KIND_GANG_QUEUE, None).await.unwrap();
    let (_, queue) = lockstep::gang::placement::canonical_queue(&rows).unwrap().expect("a gang waited");
    assert!(queue.entries.is_empty());
    assert!(queue.version >= 2, "joined and left: version {}", queue.version);
    // Each gang's two processes started together.
    let events = cluster.log.events();
    for op in [a, b] {
        let starts: Vec<_> = events
            .iter()
            .filter(|e| e.job.operation == op && e.kind == lockstep::agent::ProcessEventKind::Started)
            .map(|e| e.at)
            .collect();
        assert_eq!(starts.len(), 2);
        assert!(starts[1] - starts[0] < Duration::from_secs(1), "operation {op}: {starts:?}");
    }
    cluster.finish().await;
}

/// A submit is keyed on PostgreSQL as everywhere (a retried submit runs once): a second submit with the
/// same key, even of another spec, returns the first operation and inserts nothing; another key submits another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_submit_with_the_same_key_returns_the_first_operation_and_inserts_nothing_on_postgres() {
    use lockstep::gang::OperationSpec;
    let harness = support::pg::PgHarness::new().await;
    let store = harness.store().clone();
    let retry = api::SubmitRetry {
        attempts_max: 1,
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(10),
    };
    let spec = |command: &str| {
        let text = format!(r#"{{"tasks": {{"t": {{"job_count": 1, "command": "{command}"}}}}}}"#);
        OperationSpec::parse(&text, SpecFormat::Json).unwrap()
    };
    let first = api::submit_keyed(&store, spec("true"), "nightly-42", retry).await.unwrap();
    assert!(first.created, "{first:?}");
    let rows_after_first = store.list("operation", None).await.unwrap();
    let again = api::submit_keyed(&store, spec("false"), "nightly-42", retry).await.unwrap();
    assert_eq!((again.operation, again.created), (first.operation, false), "the second submit with the key");
    let rows = store.list("operation", None).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].data, rows_after_first[0].data, "the second submit changed the first operation's spec");
    assert!(rows[0].hinted, "each submit hints the operation it names");
    let other = api::submit_keyed(&store, spec("true"), "nightly-43", retry).await.unwrap();
    assert!(other.created && other.operation != first.operation, "{other:?}");
}
