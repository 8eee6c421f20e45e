//! Audits of the rules of DESIGN §4 over what the store recorded: the invariants the simulator's checkers assert
//! on every run (DESIGN §5), written once as pure functions of an [`OperationView`] so tests on MemStore and the
//! simulator's `sim/checkers` share them. Each returns every violation found, as a sentence naming the ids.
//! Allocation exclusivity is judged from the executors' process log: [`ProcessLog::exclusivity_violations`].
//!
//! [`ProcessLog::exclusivity_violations`]: crate::agent::ProcessLog::exclusivity_violations

use super::api::OperationView;
use super::controller::{EVENT_INCARNATION_STARTED, NODE_LOSS_LIMIT_PREFIX};
use super::model::{AllocationRef, JobStatus, OperationStatus};
use super::placement::{GangPlacement, UNFIT_REASON_PREFIX};
use std::collections::{BTreeMap, BTreeSet};

/// Rank uniqueness: within one task with `gang_options` and one incarnation, each gang rank is given to at most
/// one job, and only ranks below the task's gang size. A task without `gang_options` of a gang operation ranks its
/// jobs by cookie ([`OperationSpec::task_gang_size`]: rank = job cookie), so its job that restarts alone in one
/// incarnation keeps its rank; a job of a plain operation has none.
///
/// [`OperationSpec::task_gang_size`]: crate::gang::OperationSpec::task_gang_size
pub fn rank_uniqueness(view: &OperationView) -> Vec<String> {
    let mut seen: BTreeMap<(&str, u32, u32), String> = BTreeMap::new();
    let mut violations = Vec::new();
    let spec = &view.data.spec;
    for job in &view.jobs {
        let Some(rank) = job.data.gang_rank else { continue };
        let Some(task) = spec.tasks.get(&job.data.task) else { continue };
        let size = spec.task_gang_size(task);
        if rank >= size {
            violations.push(format!("job {} has rank {rank} of a gang of size {size}", job.data.id));
        }
        if !task.is_gang() {
            if rank != job.data.job_cookie {
                violations.push(format!(
                    "job {} of task {} (no gang_options) has rank {rank} but job cookie {}",
                    job.data.id, job.data.task, job.data.job_cookie
                ));
            }
            continue;
        }
        let key = (job.data.task.as_str(), job.data.incarnation, rank);
        if let Some(other) = seen.insert(key, job.data.id.to_string()) {
            violations.push(format!(
                "rank {rank} of task {} given twice in incarnation {}: jobs {other} and {}",
                job.data.task, job.data.incarnation, job.data.id
            ));
        }
    }
    violations
}

/// Reuse keeps identity: every job placed in an allocation (grant) that an earlier job of the operation used has
/// the earlier job's task, job cookie and monitoring descriptor, and its rank if the earlier job had one (a
/// reserved job's allocation may gain a freed rank).
pub fn reuse_keeps_identity(view: &OperationView) -> Vec<String> {
    let mut last: BTreeMap<AllocationRef, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    let mut jobs: Vec<usize> = (0..view.jobs.len()).collect();
    jobs.sort_by_key(|&i| view.jobs[i].data.id.index);
    for i in jobs {
        let job = &view.jobs[i].data;
        let Some(allocation) = job.allocation else { continue };
        if let Some(&before) = last.get(&allocation) {
            let old = &view.jobs[before].data;
            let same = old.task == job.task
                && old.job_cookie == job.job_cookie
                && old.monitoring_descriptor == job.monitoring_descriptor
                && old.gang_rank.is_none_or(|rank| job.gang_rank == Some(rank));
            if !same {
                violations.push(format!(
                    "job {} reuses allocation {allocation} of job {} but changes its identity: {}/{}/{:?}/{:?} → \
                     {}/{}/{:?}/{:?}",
                    job.id,
                    old.id,
                    old.task,
                    old.job_cookie,
                    old.gang_rank,
                    old.monitoring_descriptor,
                    job.task,
                    job.job_cookie,
                    job.gang_rank,
                    job.monitoring_descriptor
                ));
            }
        }
        last.insert(allocation, i);
    }
    violations
}

/// The completion and failure rules of an ended operation, and the trigger rules of its gang restarts:
/// - completed: every gang task has a completed job for each rank, every plain task `job_count` completed
///   cookies, all in the last incarnation;
/// - failed: failed jobs reached `max_failed_job_count`, or `fail_on_job_restart` fired, or an all-or-nothing
///   incarnation needing more allocations than the live nodes offer was never placed (`gang_unfit_timeout`), or
///   gang restarts caused by lost nodes reached `max_node_loss_restart_count`;
/// - `failed_job_count` equals the number of failed jobs;
/// - every restart after the start was triggered by a ranked job of a gang task that did not complete;
/// - no job is left alive once the operation ended.
pub fn completion_and_failure(view: &OperationView) -> Vec<String> {
    let mut violations = Vec::new();
    let spec = &view.data.spec;
    let failed = view.jobs.iter().filter(|j| j.status == JobStatus::Failed).count() as u32;
    if failed != view.data.failed_job_count {
        violations.push(format!("failed_job_count {} but {failed} failed jobs", view.data.failed_job_count));
    }
    for event in view.events.iter().filter(|e| e.kind == EVENT_INCARNATION_STARTED).skip(1) {
        let trigger = &event.data["trigger"];
        let ranked = trigger["gang_rank"].is_u64();
        let task_is_gang = trigger["task"].as_str().and_then(|t| spec.tasks.get(t)).is_some_and(|t| t.is_gang());
        if !ranked || !task_is_gang || trigger["status"] == "completed" {
            violations
                .push(format!("incarnation {} started by a job that may not trigger: {trigger}", event.data["index"]));
        }
    }
    if view.status.is_terminal() && view.jobs.iter().any(|j| !j.is_terminal()) {
        violations.push(format!("operation {} ended {} with jobs alive", view.id, view.status));
    }
    match view.status {
        OperationStatus::Completed => {
            let current: Vec<_> = view.current_jobs().filter(|j| j.status == JobStatus::Completed).collect();
            for (name, task) in &spec.tasks {
                let done = current.iter().filter(|j| j.data.task == *name);
                if task.is_gang() {
                    let ranks: BTreeSet<u32> = done.filter_map(|j| j.data.gang_rank).collect();
                    if ranks.len() as u32 != task.gang_size() {
                        violations.push(format!("completed with task {name} ranks {ranks:?} of {}", task.gang_size()));
                    }
                } else {
                    let cookies: BTreeSet<u32> =
                        done.map(|j| j.data.job_cookie).filter(|c| *c < task.job_count).collect();
                    if cookies.len() as u32 != task.job_count {
                        violations
                            .push(format!("completed with task {name} cookies {cookies:?} of {}", task.job_count));
                    }
                }
            }
        }
        OperationStatus::Failed => {
            let limit = view.data.failed_job_count >= spec.max_failed_job_count;
            let restart = view.data.result.as_deref().is_some_and(|r| r.contains("fail_on_job_restart"));
            let unfit = view.data.placement == Some(GangPlacement::AllOrNothing)
                && view.data.result.as_deref().is_some_and(|r| r.starts_with(UNFIT_REASON_PREFIX));
            let nodes_lost = view.data.node_loss_restart_count >= spec.node_loss_restarts_max()
                && view.data.result.as_deref().is_some_and(|r| r.starts_with(NODE_LOSS_LIMIT_PREFIX));
            if unfit && view.current_jobs().any(|j| j.data.gang_rank.is_some() && j.data.allocation.is_some()) {
                violations.push(format!(
                    "failed as a gang that can never be placed, but incarnation {} had ranks placed",
                    view.data.incarnation
                ));
            }
            if !limit && !restart && !unfit && !nodes_lost {
                violations.push(format!(
                    "failed with {} failed jobs of {} allowed: {:?}",
                    view.data.failed_job_count, spec.max_failed_job_count, view.data.result
                ));
            }
        }
        _ => {}
    }
    violations
}

/// Every audit of one operation.
pub fn operation(view: &OperationView) -> Vec<String> {
    let mut violations = rank_uniqueness(view);
    violations.extend(reuse_keeps_identity(view));
    violations.extend(completion_and_failure(view));
    violations
}
