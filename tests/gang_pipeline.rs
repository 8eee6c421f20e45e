//! The gang controller on MemStore end to end: the operation pipeline under a `PipelineManager`, node agents with
//! the simulated executor, on simulated time: tokio's paused clock in the normal build, madsim's in the simulator
//! build (revival, which steps the clock by hand, is in `gang_revival.rs`).

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api::{self, OperationView};
use lockstep::gang::audit;
use lockstep::gang::controller::REASON_INCARNATION_CHANGED;
use lockstep::gang::model::{JobStatus, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::replica::register_controller;
use lockstep::pipeline::{ManagerOptions, PipelineConfig, PipelineManager};
use lockstep::store::{MemStore, RowId, Store, Timestamp, TokioClock};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
const GANG3: &str = "{tasks={worker={job_count=3;command=w;gang_options={}}}}";

struct Cluster {
    store: Arc<MemStore>,
    /// Keeps the controller replica running.
    _manager: PipelineManager<MemStore>,
    agents: BTreeMap<String, JoinHandle<()>>,
    executor: SimulatedExecutor,
    log: ProcessLog,
}

impl Cluster {
    /// A controller replica and `nodes` agents of `slots` slots, jobs behaving as `script` says.
    fn start(nodes: usize, slots: u32, script: JobScript) -> Cluster {
        Cluster::start_with(nodes, slots, script, operation_pipeline_config())
    }

    /// [`Cluster::start`] with the operation pipeline's `config`, registered as every replica registers it (with
    /// the node watch beside it).
    fn start_with(nodes: usize, slots: u32, script: JobScript, config: PipelineConfig) -> Cluster {
        let store = Arc::new(MemStore::new(TokioClock::new(START)));
        let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: 7 });
        register_controller(&mut manager, config, OperationHandler::default()).unwrap();
        manager.start();
        let log = ProcessLog::default();
        let executor = SimulatedExecutor::new(script, log.clone());
        let mut cluster = Cluster { store, _manager: manager, agents: BTreeMap::new(), executor, log };
        for i in 0..nodes {
            cluster.spawn_agent(&format!("node-{i}"), slots);
        }
        cluster
    }

    fn spawn_agent(&mut self, name: &str, slots: u32) {
        let agent = Agent::new(self.store.clone(), self.executor.clone(), AgentConfig::new(name, slots));
        self.agents.insert(name.to_string(), tokio::spawn(agent.run()));
    }

    /// Kills an agent as a crash would: its task and, with it, its processes.
    fn kill_agent(&mut self, name: &str) {
        self.agents.remove(name).expect("agent runs").abort();
    }

    async fn submit(&self, spec: &str) -> RowId {
        api::submit_text(self.store.as_ref(), spec, SpecFormat::Yson).await.unwrap()
    }

    async fn view(&self, operation: RowId) -> OperationView {
        api::status(self.store.as_ref(), operation).await.unwrap()
    }

    /// Waits (simulated time, bounded) until `done` holds for the operation.
    async fn wait_for(
        &self,
        operation: RowId,
        limit: Duration,
        done: impl Fn(&OperationView) -> bool,
    ) -> OperationView {
        let started = tokio::time::Instant::now();
        loop {
            let view = self.view(operation).await;
            if done(&view) {
                return view;
            }
            assert!(started.elapsed() < limit, "operation {operation} not done after {limit:?}: {:?}", view.status);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the operation ended, then audits it (rank uniqueness, reuse, completion and failure rules).
    async fn wait_ended(&self, operation: RowId, limit: Duration) -> OperationView {
        let view = self.wait_for(operation, limit, |v| v.status.is_terminal()).await;
        let violations = audit::operation(&view);
        assert!(violations.is_empty(), "operation {operation}: {violations:#?}");
        view
    }

    /// Allocation exclusivity from the process log (DESIGN §5).
    fn check_exclusive(&self) {
        let violations = self.log.exclusivity_violations();
        assert!(violations.is_empty(), "{violations:#?}");
    }
}

fn seconds(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_gang_runs_to_completion_on_agents() {
    let cluster = Cluster::start(3, 1, JobScript::uniform(seconds(5)));
    let op = cluster.submit(GANG3).await;
    let view = cluster.wait_ended(op, seconds(120)).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.jobs.iter().filter(|j| j.status == JobStatus::Completed).count(), 3);
    let env = cluster.log.events();
    assert_eq!(env.len(), 6, "three starts and three exits: {env:#?}");
    assert!(cluster.log.live().is_empty());
    cluster.check_exclusive();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_lost_node_restarts_a_three_job_gang_once_reusing_two_allocations() {
    let mut cluster = Cluster::start(4, 1, JobScript::uniform(seconds(60)));
    let op = cluster.submit(GANG3).await;
    let running = |v: &OperationView| v.current_jobs().filter(|j| j.status == JobStatus::Running).count() == 3;
    let before = cluster.wait_for(op, seconds(30), running).await;
    let victim = before.current_jobs().find(|j| j.data.job_cookie == 1).unwrap().clone();
    let victim_node = cluster.store.get(victim.data.allocation.unwrap().row).await.unwrap().unwrap().parent_id;
    let name = cluster.store.get(victim_node.unwrap()).await.unwrap().unwrap().status;
    cluster.kill_agent(&name);

    let view = cluster.wait_ended(op, seconds(300)).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    let switches = view.incarnation_events();
    assert_eq!(switches.len(), 2, "the start and one switch");
    assert_eq!(switches[1].data["reason"], "job_aborted");
    assert_eq!(switches[1].data["trigger"]["reason"], "node lost");
    assert_eq!(switches[1].data["trigger"]["job"], victim.data.id.to_string());
    let by_switch = view
        .events
        .iter()
        .filter(|e| e.data["to"] == "aborted" && e.data["reason"] == REASON_INCARNATION_CHANGED)
        .count();
    assert_eq!(by_switch, 2, "two jobs aborted by the switch");
    assert_eq!(view.data.incarnation, 1);
    for cookie in [0, 2] {
        let old = before.current_jobs().find(|j| j.data.job_cookie == cookie).unwrap();
        let new = view.current_jobs().find(|j| j.data.job_cookie == cookie).unwrap();
        assert_eq!(new.data.allocation, old.data.allocation, "cookie {cookie} reused its allocation");
        assert_eq!(new.data.gang_rank, old.data.gang_rank);
        assert_eq!(new.data.monitoring_descriptor, old.data.monitoring_descriptor);
    }
    let replacement = view.current_jobs().find(|j| j.data.job_cookie == 1).unwrap();
    assert_ne!(replacement.data.allocation.unwrap().row, victim.data.allocation.unwrap().row);
    cluster.check_exclusive();
}

/// A node lost while nothing else wakes its operation (every other job runs 60 s, passes 30 s apart) is declared
/// lost within a second of its node lease's expiry, not at the operation's next periodic pass: the replica's node
/// watch hints the operation when the session ends.
#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_lost_node_is_declared_lost_within_a_second_of_its_lease_expiry_between_passes() {
    let config = PipelineConfig { min_processing_interval: seconds(30), ..operation_pipeline_config() };
    let mut cluster = Cluster::start_with(4, 1, JobScript::uniform(seconds(60)), config);
    let op = cluster.submit(GANG3).await;
    let running = |v: &OperationView| v.current_jobs().filter(|j| j.status == JobStatus::Running).count() == 3;
    let before = cluster.wait_for(op, seconds(30), running).await;
    let victim = before.current_jobs().find(|j| j.data.job_cookie == 1).unwrap().clone();
    let node = cluster.store.get(victim.data.allocation.unwrap().row).await.unwrap().unwrap().parent_id.unwrap();
    let name = cluster.store.get(node).await.unwrap().unwrap().status;
    cluster.kill_agent(&name);
    // The kill stops renewals: the lease the node holds now is its last.
    let expiry = cluster.store.get(node).await.unwrap().unwrap().lock_expires_at.expect("the node holds its lease");

    let lost = |v: &OperationView| v.jobs.iter().any(|j| j.data.id == victim.data.id && j.status.is_terminal());
    let view = cluster.wait_for(op, seconds(60), lost).await;
    let declared = view
        .events
        .iter()
        .find(|e| e.data["job"] == victim.data.id.to_string() && e.data["reason"] == "node lost")
        .unwrap_or_else(|| panic!("job {} ended, but not as node lost: {:#?}", victim.data.id, view.events));
    let lag = declared.at.as_micros() - expiry.as_micros();
    assert!((0..1_000_000).contains(&lag), "node lost {lag} µs after its lease expired (30 s between passes)");
    cluster.wait_ended(op, seconds(300)).await;
    cluster.check_exclusive();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn a_job_failure_with_max_failed_job_count_two_restarts_once_then_fails() {
    let script = JobScript::uniform(seconds(60)).with("worker", 1, 0, Behaviour::exit_after(seconds(3), 1)).with(
        "worker",
        2,
        1,
        Behaviour::exit_after(seconds(3), 7),
    );
    let cluster = Cluster::start(4, 1, script);
    let op = cluster.submit("{tasks={worker={job_count=3;command=w;gang_options={}}};max_failed_job_count=2}").await;
    let view = cluster.wait_ended(op, seconds(300)).await;
    assert_eq!(view.status, OperationStatus::Failed);
    assert_eq!(view.data.failed_job_count, 2);
    assert_eq!(view.incarnation_events().len(), 2, "one restart, then the limit");
    cluster.wait_for(op, seconds(30), |_| cluster.log.live().is_empty()).await;
    cluster.check_exclusive();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn the_seed_master_slave_example_completes_on_agents() {
    let spec = include_str!("../scenarios/specs/seed-master-slave.yson");
    let mut script = JobScript::uniform(seconds(2));
    script.default.duration = (seconds(1), seconds(10));
    let cluster = Cluster::start(6, 8, script);
    let op = cluster.submit(spec).await;
    let view = cluster.wait_ended(op, seconds(600)).await;
    assert_eq!(view.status, OperationStatus::Completed, "{:?}", view.data.result);
    assert_eq!(view.jobs.iter().filter(|j| j.status == JobStatus::Completed).count(), 101);
    cluster.check_exclusive();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn two_operations_share_scarce_allocations_without_running_two_processes_in_one() {
    let cluster = Cluster::start(2, 2, JobScript::uniform(seconds(3)));
    let a = cluster.submit("{tasks={t={job_count=6;command=a}}}").await;
    let b = cluster.submit("{tasks={t={job_count=3;command=b;gang_options={}}}}").await;
    for op in [a, b] {
        let view = cluster.wait_ended(op, seconds(600)).await;
        assert_eq!(view.status, OperationStatus::Completed, "operation {op}: {:?}", view.data.result);
    }
    cluster.check_exclusive();
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn an_abort_request_ends_the_operation_and_kills_its_processes() {
    let cluster = Cluster::start(3, 1, JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() });
    let op = cluster.submit(GANG3).await;
    cluster.wait_for(op, seconds(30), |v| v.jobs.iter().all(|j| j.status == JobStatus::Running)).await;
    api::abort(cluster.store.as_ref(), op, "user asked").await.unwrap();
    let view = cluster.wait_ended(op, seconds(30)).await;
    assert_eq!(view.status, OperationStatus::Aborted);
    assert_eq!(view.data.result.as_deref(), Some("user asked"));
    cluster.wait_for(op, seconds(30), |_| cluster.log.live().is_empty()).await;
    let error = api::abort(cluster.store.as_ref(), op, "again").await.unwrap_err();
    assert!(error.to_string().contains("already aborted"), "{error}");
}

#[cfg_attr(not(madsim), tokio::test(start_paused = true))]
#[cfg_attr(madsim, tokio::test)]
async fn the_spec_update_api_refuses_a_job_count_change_of_a_running_gang_and_grows_a_plain_task() {
    let cluster = Cluster::start(4, 2, JobScript::uniform(seconds(5)));
    let gang = cluster.submit(GANG3).await;
    let mut bigger = cluster.view(gang).await.data.spec;
    bigger.tasks.get_mut("worker").unwrap().job_count = 4;
    let error = api::update_spec(cluster.store.as_ref(), gang, bigger).await.unwrap_err();
    assert_eq!(error.to_string(), "tasks.worker.job_count: cannot change from 3 to 4 in a running gang operation");

    let plain = cluster.submit("{tasks={t={job_count=2;command=c}}}").await;
    let mut bigger = cluster.view(plain).await.data.spec;
    bigger.tasks.get_mut("t").unwrap().job_count = 4;
    api::update_spec(cluster.store.as_ref(), plain, bigger).await.unwrap();
    let view = cluster.wait_ended(plain, seconds(120)).await;
    assert_eq!(view.status, OperationStatus::Completed);
    let cookies: BTreeSet<u32> =
        view.jobs.iter().filter(|j| j.status == JobStatus::Completed).map(|j| j.data.job_cookie).collect();
    assert_eq!(cookies, BTreeSet::from([0, 1, 2, 3]));
    assert_eq!(cluster.wait_ended(gang, seconds(120)).await.status, OperationStatus::Completed);
}
