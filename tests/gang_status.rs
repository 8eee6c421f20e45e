//! The status report `lockstep status` prints: state, incarnation, and jobs by task with gang rank, job cookie,
//! state and node; its table as an insta snapshot and its JSON form. On MemStore with the simulated executor, on
//! tokio's paused clock (row ids and names are deterministic).
#![cfg(not(madsim))]

use lockstep::agent::{Agent, AgentConfig, Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::SpecFormat;
use lockstep::gang::api;
use lockstep::gang::model::{JobStatus, OperationStatus};
use lockstep::gang::pipeline::{OperationHandler, operation_pipeline_config};
use lockstep::gang::status::StatusReport;
use lockstep::pipeline::Pipeline;
use lockstep::store::{MemStore, Timestamp, TokioClock};
use std::sync::Arc;

const SPEC: &str = "{tasks={trainer={job_count=3;command=t;gang_options={size=2}};loader={job_count=1;command=l}}}";

async fn controller_pass(replica: &Pipeline<MemStore>) {
    replica.fetcher(1).run_once().await.unwrap();
    while replica.work_one(&OperationHandler::default()).await.is_some() {}
}

#[tokio::test(start_paused = true)]
async fn the_status_report_shows_ranks_cookies_states_and_nodes_of_the_current_incarnation() {
    let store = MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000)));
    let replica = Pipeline::new(Arc::new(store.clone()), operation_pipeline_config()).unwrap();
    let script = JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() };
    let executor = SimulatedExecutor::new(script, ProcessLog::default());
    let mut agents: Vec<_> = ["node-a", "node-b", "node-c"]
        .into_iter()
        .map(|name| Agent::new(Arc::new(store.clone()), executor.clone(), AgentConfig::new(name, 1)))
        .collect();
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    let op = api::submit_text(&store, SPEC, SpecFormat::Yson).await.unwrap();
    controller_pass(&replica).await;
    for agent in &mut agents {
        agent.run_once().await.unwrap();
    }
    controller_pass(&replica).await;

    let report = StatusReport::read(&store, op, false).await.unwrap();
    assert_eq!(report.state, OperationStatus::Running);
    let trainer = report.tasks.iter().find(|t| t.name == "trainer").unwrap();
    assert_eq!(trainer.gang_size, Some(2));
    let running: Vec<_> = trainer.jobs.iter().filter(|j| j.state == JobStatus::Running).collect();
    assert_eq!(running.len(), 2, "the two ranked jobs run first, one per node");
    assert!(running.iter().all(|j| j.gang_rank.is_some() && j.node.is_some()));
    let loader = report.tasks.iter().find(|t| t.name == "loader").unwrap();
    assert_eq!(loader.jobs[0].gang_rank, Some(0), "a task without gang_options of a gang operation is ranked too");
    assert_eq!(loader.jobs[0].state, JobStatus::Running, "and placed with the ranked jobs, before the reserved one");
    insta::assert_snapshot!(report.render());

    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(serde_json::from_str::<StatusReport>(&json).unwrap(), report, "--json round-trips");

    api::abort(&store, op, "enough").await.unwrap();
    controller_pass(&replica).await;
    let report = StatusReport::read(&store, op, true).await.unwrap();
    assert_eq!((report.state, report.result.as_deref()), (OperationStatus::Aborted, Some("enough")));
    assert!(report.tasks.iter().flat_map(|t| &t.jobs).all(|j| j.state == JobStatus::Aborted));
}
