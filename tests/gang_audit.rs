//! The audits bite: each fires on the bug it guards against, planted in an otherwise clean run of the pure
//! controller (STYLE: checkers bite).

use crate::gang_support;

use gang_support::{OP, World};
use lockstep::agent::simulated::{ProcessEvent, ProcessEventKind};
use lockstep::agent::{Behaviour, JobScript, ProcessLog, SimulatedExecutor};
use lockstep::gang::api::OperationView;
use lockstep::gang::audit;
use lockstep::gang::model::{AllocationRef, JobId, JobStatus, OperationStatus};
use lockstep::store::RowId;

const GANG3: &str = "{tasks={worker={job_count=3;command=w;gang_options={}}}}";

fn view(world: &World) -> OperationView {
    world.view()
}

/// A gang that restarted once and completed: every audit passes.
fn clean() -> World {
    let mut world = World::new(GANG3, 5, 1);
    world.pass();
    world.start_assigned();
    world.end("worker", 1, lockstep::gang::model::JobOutcome::Aborted { reason: "x".into() });
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
    assert_eq!(audit::operation(&view(&world)), Vec::<String>::new());
    world
}

#[test]
fn a_rank_given_twice_in_an_incarnation_is_reported() {
    let world = clean();
    let mut bad = view(&world);
    let i = bad.jobs.iter().position(|j| j.data.incarnation == 1 && j.data.gang_rank == Some(2)).unwrap();
    bad.jobs[i].data_mut().gang_rank = Some(0);
    let found = audit::rank_uniqueness(&bad);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("rank 0 of task worker given twice in incarnation 1"), "{found:?}");
}

#[test]
fn a_reused_allocation_that_changes_the_cookie_is_reported() {
    let world = clean();
    let mut bad = view(&world);
    let i = bad.jobs.iter().position(|j| j.data.incarnation == 1 && j.data.job_cookie == 0).unwrap();
    bad.jobs[i].data_mut().job_cookie = 7;
    let found = audit::reuse_keeps_identity(&bad);
    assert!(found.iter().any(|v| v.contains("changes its identity")), "{found:?}");
}

#[test]
fn completion_without_every_rank_is_reported() {
    let world = clean();
    let mut bad = view(&world);
    let i = bad.jobs.iter().position(|j| j.data.incarnation == 1 && j.data.gang_rank == Some(1)).unwrap();
    bad.jobs[i].status = JobStatus::Aborted;
    let found = audit::completion_and_failure(&bad);
    assert!(found.iter().any(|v| v.starts_with("completed with task worker ranks")), "{found:?}");
}

#[test]
fn a_restart_triggered_by_a_completed_job_and_a_miscounted_failure_are_reported() {
    let world = clean();
    let mut bad = view(&world);
    let switch = bad.events.iter().position(|e| e.kind == "incarnation_started" && e.data["index"] == 1).unwrap();
    bad.events[switch].data["trigger"]["status"] = "completed".into();
    bad.data.failed_job_count = 1;
    let found = audit::completion_and_failure(&bad);
    assert!(found.iter().any(|v| v.contains("may not trigger")), "{found:?}");
    assert!(found.iter().any(|v| v.starts_with("failed_job_count 1 but 0 failed jobs")), "{found:?}");
}

#[test]
fn a_failed_operation_below_the_limit_is_reported() {
    let world = clean();
    let mut bad = view(&world);
    bad.status = OperationStatus::Failed;
    let found = audit::completion_and_failure(&bad);
    assert!(found.iter().any(|v| v.starts_with("failed with 0 failed jobs of 10 allowed")), "{found:?}");
}

#[tokio::test]
async fn two_live_processes_in_one_allocation_are_reported() {
    let log = ProcessLog::default();
    let executor =
        SimulatedExecutor::new(JobScript { seed: 0, default: Behaviour::hang(), rules: Vec::new() }, log.clone());
    let request = |index| lockstep::agent::StartRequest {
        node: "node-0".into(),
        allocation: AllocationRef { row: RowId(4), generation: 1 },
        launch: lockstep::gang::model::JobLaunch {
            job: JobId { operation: OP, index },
            incarnation: "1-i0".into(),
            task: "t".into(),
            job_cookie: index as u32,
            gang_rank: None,
            command: "c".into(),
            environment: Default::default(),
            file_paths: Vec::new(),
        },
    };
    use lockstep::agent::Executor;
    let first = executor.start(request(0)).await.unwrap();
    assert!(log.exclusivity_violations().is_empty());
    let _second = executor.start(request(1)).await.unwrap();
    let found = log.exclusivity_violations();
    assert_eq!(found, vec!["allocation 4.1 starts job 1-1 while job 1-0 (allocation 4.1) still runs".to_string()]);
    first.kill().await;
    log.node_died("node-0");
    let events = log.events();
    let killed = events.iter().filter(|e: &&ProcessEvent| e.kind == ProcessEventKind::Killed).count();
    assert_eq!(killed, 2, "one killed by its agent, one with its node");
    assert!(log.live().is_empty());
}
