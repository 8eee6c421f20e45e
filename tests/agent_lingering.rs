//! Node agents and a rank that may still run where the controller moved on from it
//! (`gang::model::Lingering`): an agent answers for a job its allocation is marked with, even one it never
//! started, and a fence waits for every kill it began before it gives the node lease back. On MemStore with the
//! simulated executor, on tokio's paused clock.
#![cfg(not(madsim))]

use lockstep::agent::simulated::ProcessEventKind;
use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, REASON_NOT_RUNNING, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{
    ALLOCATION_ALLOCATED, Allocation, JobId, JobOutcome, KIND_ALLOCATION, KIND_INBOX, KIND_NODE, LastJob, Message,
};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::pipeline::Pipeline;
use lockstep::store::{CommitOp, MemStore, RowUpdate, Store, Timestamp, TokioClock};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const START: Timestamp = Timestamp(1_700_000_000_000_000);
const ONE_JOB: &str = "{tasks={t={job_count=1;command=c}}}";

fn hanging() -> JobScript {
    JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() }
}

/// The runtime instant of a store timestamp, the store's clock having read START at `origin`.
fn instant(origin: Instant, at: Timestamp) -> Instant {
    origin + Duration::from_micros((at.as_micros() - START.as_micros()) as u64)
}

async fn controller_pass(replica: &Pipeline<MemStore>) {
    replica.fetcher(1).run_once().await.unwrap();
    while replica.work_one(&OperationHandler::default()).await.is_some() {}
}

/// The inbox messages of `operation`.
async fn inbox(store: &MemStore, operation: lockstep::store::RowId) -> Vec<Message> {
    let rows = store.list(KIND_INBOX, Some(operation)).await.unwrap();
    rows.iter().map(|row| Message::from_row(row).unwrap()).collect()
}

#[tokio::test(start_paused = true)]
async fn an_agent_answers_once_for_a_job_marked_lingering_in_its_allocation_that_it_never_started() {
    let store = MemStore::new(TokioClock::new(START));
    let executor = SimulatedExecutor::new(hanging(), ProcessLog::default());
    let mut agent = Agent::new(Arc::new(store.clone()), executor, AgentConfig::new("node-0", 1));
    agent.run_once().await.unwrap();
    let (node, session) = (agent.node().unwrap(), agent.session().unwrap());
    let op = api::submit_text(&store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    // As a controller leaves it after a gang restart moved on from job X placed there, whose start was never
    // reported: granted under this session, idle, marked with X.
    let row = store.list(KIND_ALLOCATION, Some(node)).await.unwrap().remove(0);
    let mut allocation = Allocation::from_row(&row).unwrap();
    let job = JobId { operation: op, index: 0 };
    let data = allocation.data_mut();
    data.generation = 1;
    data.operation = Some(op);
    data.node_session = Some(session);
    data.last = Some(LastJob { job, task: "t".into(), job_cookie: 0, gang_rank: Some(0), monitoring_descriptor: None });
    data.lingering = Some(job);
    let update = RowUpdate { status: Some(ALLOCATION_ALLOCATED.into()), data: Some(allocation.data_json()) };
    store.update_unleased(row.id, update).await.unwrap();

    let pass = agent.run_once().await.unwrap();
    assert_eq!(pass.answered, vec![job]);
    assert!(pass.started.is_empty() && pass.killed.is_empty(), "{pass:?}");
    let expected = Message::JobEnded {
        job,
        allocation: allocation.current(),
        outcome: JobOutcome::Aborted { reason: REASON_NOT_RUNNING.into() },
    };
    assert_eq!(inbox(&store, op).await, vec![expected.clone()]);
    tokio::time::advance(Duration::from_secs(1)).await;
    let pass = agent.run_once().await.unwrap();
    assert!(pass.answered.is_empty(), "answered again: {pass:?}");
    assert_eq!(inbox(&store, op).await, vec![expected], "one report");
}

#[tokio::test(start_paused = true)]
async fn a_fence_waits_for_a_kill_it_began_before_it_gives_the_node_lease_back() {
    let origin = Instant::now();
    let store = MemStore::with_history(TokioClock::new(START));
    let log = ProcessLog::default();
    // A process tree that takes 9 s to die: longer than the local lease left after the heartbeat before the kill
    // (10 s lease − 2 s margin), shorter than the lease in the store.
    let executor = SimulatedExecutor::new(hanging(), log.clone()).with_kill_delay(Duration::from_secs(9));
    let mut agent = Agent::new(Arc::new(store.clone()), executor, AgentConfig::new("node-0", 1));
    let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
    agent.run_once().await.unwrap();
    let op = api::submit_text(&store, ONE_JOB, SpecFormat::Yson).await.unwrap();
    controller_pass(&replica).await;
    assert_eq!(agent.run_once().await.unwrap().started.len(), 1);
    let expiry = || async {
        let nodes = store.list(KIND_NODE, None).await.unwrap();
        nodes[0].lock_expires_at.expect("leased")
    };
    let first = expiry().await;
    let running = tokio::spawn(agent.run());
    // Right after the agent's next heartbeat, the controller moves on (the operation is aborted): the agent's pass
    // begins the kill, which outlasts the lease's local deadline, so the pass is abandoned and the agent fences.
    while expiry().await == first {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed = expiry().await;
    api::abort(&store, op, "user asked").await.unwrap();
    controller_pass(&replica).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    running.abort();

    let killed = log.events().iter().find(|e| e.kind == ProcessEventKind::Killed).expect("killed").at;
    assert!(killed < instant(origin, renewed), "the process died before the store let the lease go");
    let released = store
        .history()
        .into_iter()
        .find(|commit| matches!(&commit.op, CommitOp::Release { released } if !released.is_empty()))
        .expect("the fence gave the lease back");
    let released = instant(origin, released.at);
    assert!(released >= killed, "the lease was given back at {released:?}, before the process died at {killed:?}");
}
