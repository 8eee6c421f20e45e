//! The pure rules of DESIGN §4, each alone: restart triggers, failure limit, allocation reuse planning,
//! completion, scheduling order.

use lockstep::gang::model::{AllocationRef, Job, JobData, JobId, JobStatus, LastJob};
use lockstep::gang::rules::{
    Ending, HeldAllocation, PlannedJob, SwitchReason, failed_limit_reached, gang_restart_trigger, gang_task_completed,
    plain_task_completed, plan_task, schedule_key,
};
use lockstep::gang::{GangOptions, OperationSpec, TaskSpec};
use lockstep::store::RowId;
use std::collections::BTreeMap;

fn task(job_count: u32, gang: Option<Option<u32>>) -> TaskSpec {
    TaskSpec {
        job_count,
        command: "c".into(),
        file_paths: Vec::new(),
        environment: BTreeMap::new(),
        output_table_paths: Vec::new(),
        gang_options: gang.map(|size| GangOptions { size }),
        fail_on_job_restart: false,
        restart_completed_jobs: false,
    }
}

fn job(cookie: u32, rank: Option<u32>) -> JobData {
    JobData {
        id: JobId { operation: RowId(1), index: cookie as u64 },
        task: "t".into(),
        job_cookie: cookie,
        gang_rank: rank,
        reserved: rank.is_none(),
        incarnation: 0,
        allocation: None,
        monitoring_descriptor: None,
        exit_code: None,
        reason: None,
    }
}

fn held(row: i64, cookie: u32, rank: Option<u32>) -> HeldAllocation {
    HeldAllocation {
        allocation: AllocationRef { row: RowId(row), generation: 1 },
        last: LastJob {
            job: JobId { operation: RowId(1), index: 50 + cookie as u64 },
            task: "t".into(),
            job_cookie: cookie,
            gang_rank: rank,
            monitoring_descriptor: Some(format!("d{row}")),
        },
    }
}

fn reuse(row: i64) -> Option<(AllocationRef, Option<String>)> {
    Some((AllocationRef { row: RowId(row), generation: 1 }, Some(format!("d{row}"))))
}

fn planned(
    cookie: u32,
    rank: Option<u32>,
    reserved: bool,
    reuse: Option<(AllocationRef, Option<String>)>,
) -> PlannedJob {
    PlannedJob { job_cookie: cookie, gang_rank: rank, reserved, reuse }
}

#[test]
fn a_ranked_job_that_aborts_fails_or_is_interrupted_triggers_a_restart() {
    let gang = task(3, Some(None));
    let ranked = job(0, Some(0));
    let cases = [
        (Ending::Aborted { reason: "x".into() }, SwitchReason::JobAborted),
        (Ending::Failed { code: Some(1), reason: "x".into() }, SwitchReason::JobFailed),
        (Ending::Interrupted { reason: "x".into() }, SwitchReason::JobInterrupted),
    ];
    for (ending, reason) in cases {
        assert_eq!(gang_restart_trigger(&gang, &ranked, &ending), Some(reason));
    }
}

#[test]
fn completions_reserved_jobs_and_plain_tasks_never_trigger_a_restart() {
    let gang = task(3, Some(Some(2)));
    let failed = Ending::Failed { code: Some(1), reason: "x".into() };
    assert_eq!(gang_restart_trigger(&gang, &job(0, Some(0)), &Ending::Completed), None);
    assert_eq!(gang_restart_trigger(&gang, &job(2, None), &failed), None, "reserved");
    assert_eq!(gang_restart_trigger(&task(3, None), &job(0, None), &failed), None, "plain task");
}

#[test]
fn the_operation_fails_once_failed_jobs_reach_the_limit() {
    assert!(!failed_limit_reached(1, 2));
    assert!(failed_limit_reached(2, 2));
    assert!(failed_limit_reached(1, 1));
}

#[test]
fn at_the_start_cookies_below_the_gang_size_are_ranked_and_the_rest_reserved() {
    let plan = plan_task(&task(4, Some(Some(2))), 2, Vec::new());
    assert_eq!(
        plan.jobs,
        vec![
            planned(0, Some(0), false, None),
            planned(1, Some(1), false, None),
            planned(2, None, true, None),
            planned(3, None, true, None),
        ]
    );
}

#[test]
fn ranked_allocations_are_reused_with_their_cookie_rank_and_descriptor() {
    // Cookie 1 (rank 1) was the trigger: its allocation is not offered.
    let plan = plan_task(&task(3, Some(None)), 3, vec![held(12, 2, Some(2)), held(10, 0, Some(0))]);
    assert_eq!(
        plan.jobs,
        vec![
            planned(0, Some(0), false, reuse(10)),
            planned(1, Some(1), false, None),
            planned(2, Some(2), false, reuse(12))
        ]
    );
    assert!(plan.released.is_empty());
}

#[test]
fn a_reserved_allocation_takes_the_freed_rank() {
    // Size 2 of 4: rank 0 (cookie 0) was the trigger; reserved cookies 2 and 3 hold allocations.
    let plan = plan_task(&task(4, Some(Some(2))), 2, vec![held(11, 1, Some(1)), held(13, 3, None), held(12, 2, None)]);
    assert_eq!(
        plan.jobs,
        vec![
            planned(0, None, true, None),
            planned(1, Some(1), false, reuse(11)),
            planned(2, Some(0), false, reuse(12)),
            planned(3, None, true, reuse(13)),
        ]
    );
}

#[test]
fn plain_task_allocations_are_reused_by_cookie() {
    let plan = plan_task(&task(3, None), 0, vec![held(20, 2, None)]);
    assert_eq!(
        plan.jobs,
        vec![planned(0, None, false, None), planned(1, None, false, None), planned(2, None, false, reuse(20))]
    );
}

#[test]
fn a_task_without_gang_options_in_a_gang_operation_ranks_every_cookie_and_keeps_ranks_on_reuse() {
    // DESIGN §4: its rank pool is its job_count, so no job is reserved and rank = cookie.
    let plan = plan_task(&task(3, None), 3, Vec::new());
    assert_eq!(
        plan.jobs,
        vec![planned(0, Some(0), false, None), planned(1, Some(1), false, None), planned(2, Some(2), false, None)]
    );
    let plan = plan_task(&task(3, None), 3, vec![held(21, 1, Some(1))]);
    assert_eq!(
        plan.jobs,
        vec![planned(0, Some(0), false, None), planned(1, Some(1), false, reuse(21)), planned(2, Some(2), false, None)]
    );
}

#[test]
fn task_gang_sizes_count_job_count_for_tasks_without_gang_options_only_in_gang_operations() {
    let spec = |tasks: Vec<(&str, TaskSpec)>| OperationSpec {
        tasks: tasks.into_iter().map(|(name, t)| (name.to_string(), t)).collect(),
        max_failed_job_count: 10,
        fail_on_job_restart: false,
        restart_completed_jobs: false,
        gang_placement: None,
        max_node_loss_restart_count: None,
        unrecognized: Vec::new(),
    };
    let gang = spec(vec![("a", task(3, Some(Some(2)))), ("b", task(2, None))]);
    assert_eq!(gang.task_gang_size(&gang.tasks["a"]), 2);
    assert_eq!(gang.task_gang_size(&gang.tasks["b"]), 2, "b's rank pool is its job_count");
    assert_eq!(gang.gang_size(), 4, "YT_GANG_SIZE sums both");
    let plain = spec(vec![("b", task(2, None))]);
    assert_eq!(plain.task_gang_size(&plain.tasks["b"]), 0);
    assert_eq!(plain.gang_size(), 0);
}

#[test]
fn allocations_whose_cookie_no_longer_fits_are_released() {
    let plan = plan_task(&task(2, None), 0, vec![held(20, 5, None)]);
    assert_eq!(plan.released, vec![AllocationRef { row: RowId(20), generation: 1 }]);
    assert!(plan.jobs.iter().all(|j| j.reuse.is_none()));
}

#[test]
fn of_two_allocations_claiming_one_rank_or_one_cookie_the_second_is_not_reused() {
    // Reachable for a cookie: one allocation kept for a process that may still run there while the
    // cookie's next job ran in another; a rank would need the gate against lingering processes broken.
    let plan = plan_task(&task(3, Some(None)), 3, vec![held(10, 0, Some(0)), held(11, 1, Some(0))]);
    assert_eq!(plan.released, vec![AllocationRef { row: RowId(11), generation: 1 }]);
    let plan = plan_task(&task(4, Some(Some(2))), 2, vec![held(10, 2, Some(0)), held(11, 2, None)]);
    assert_eq!(plan.released, vec![AllocationRef { row: RowId(11), generation: 1 }]);
    assert_eq!(plan.jobs.iter().filter(|j| j.reuse.is_some()).count(), 1);
    assert_eq!(plan.jobs.len(), 4, "one job per cookie");
}

fn with_status(data: JobData, status: JobStatus) -> Job {
    Job { row: Some(RowId(1)), status, data: data.into() }
}

#[test]
fn a_gang_task_completes_when_every_rank_completed_without_its_reserved_jobs() {
    let t = task(3, Some(Some(2)));
    let jobs = [
        with_status(job(0, Some(0)), JobStatus::Completed),
        with_status(job(1, Some(1)), JobStatus::Running),
        with_status(job(2, None), JobStatus::Running),
    ];
    assert!(!gang_task_completed(&t, &jobs.iter().collect::<Vec<_>>()));
    let jobs = [jobs[0].clone(), with_status(job(1, Some(1)), JobStatus::Completed), jobs[2].clone()];
    assert!(gang_task_completed(&t, &jobs.iter().collect::<Vec<_>>()));
}

#[test]
fn a_plain_task_completes_when_job_count_cookies_completed() {
    let t = task(2, None);
    let spec = OperationSpec {
        tasks: BTreeMap::from([("t".to_string(), t.clone())]),
        max_failed_job_count: 10,
        fail_on_job_restart: false,
        restart_completed_jobs: false,
        gang_placement: None,
        max_node_loss_restart_count: None,
        unrecognized: Vec::new(),
    };
    let jobs = [
        with_status(job(0, None), JobStatus::Failed),
        with_status(job(0, None), JobStatus::Completed),
        with_status(job(1, None), JobStatus::Completed),
    ];
    let refs: Vec<&Job> = jobs.iter().collect();
    assert!(plain_task_completed(&spec, &t, &refs));
    assert!(!plain_task_completed(&spec, &t, &refs[..2]));
    let rerun = OperationSpec { restart_completed_jobs: true, ..spec };
    assert!(!plain_task_completed(&rerun, &t, &refs), "a task that reruns completed jobs never completes alone");
}

#[test]
fn ranked_jobs_are_scheduled_before_rankless_ones() {
    let mut jobs = [job(3, None), job(1, Some(1)), job(0, None), job(2, Some(0))];
    jobs[0].task = "a".into();
    jobs.sort_by_key(schedule_key);
    let order: Vec<(u32, Option<u32>)> = jobs.iter().map(|j| (j.job_cookie, j.gang_rank)).collect();
    assert_eq!(order, vec![(2, Some(0)), (1, Some(1)), (3, None), (0, None)]);
}
