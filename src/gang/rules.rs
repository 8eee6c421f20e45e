//! The rules of Vanilla and gang operations as pure functions over plain data (DESIGN §4; YTsaurus "Gang-операции").
//! The controller pass ([`super::controller`]) calls them; each is tested alone.

use super::model::{AllocationRef, Job, JobData, JobStatus, LastJob};
use super::spec::{OperationSpec, TaskSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// Why an incarnation started (the `reason` of an `incarnation_started` event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchReason {
    /// Incarnation 0, at the operation's start.
    OperationStarted,
    /// A ranked job of a gang task was aborted.
    JobAborted,
    /// A ranked job of a gang task failed.
    JobFailed,
    /// A ranked job of a gang task was interrupted and needs a restart.
    JobInterrupted,
    /// At revival, a ranked job of the current incarnation was missing ("lack after revival"): no allocation is
    /// reused.
    LackAfterRevival,
}

impl SwitchReason {
    /// Whether allocations of the previous incarnation may be reused (all but revival, YTsaurus "Поведение при
    /// ревайве операции").
    pub fn reuses_allocations(self) -> bool {
        self != SwitchReason::LackAfterRevival
    }
}

impl fmt::Display for SwitchReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SwitchReason::OperationStarted => "operation started",
            SwitchReason::JobAborted => "job aborted",
            SwitchReason::JobFailed => "job failed",
            SwitchReason::JobInterrupted => "job interrupted",
            SwitchReason::LackAfterRevival => "lack after revival",
        })
    }
}

/// How a job ended, as the controller classifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Exit code 0.
    Completed,
    /// A non-zero exit code (`code`) or a failure to start (`code` None); counts toward `max_failed_job_count`.
    Failed {
        /// The exit code; `None` when the job could not start.
        code: Option<i32>,
        /// What the job's status shows: `exit code N`, or the start failure's message.
        reason: String,
    },
    /// Aborted by the system (node lost, agent lost the process).
    Aborted {
        /// Why: the agent's report (e.g. `process killed`), or `node lost` when the controller declared the
        /// node lost.
        reason: String,
    },
    /// Interrupted, needing a restart.
    Interrupted {
        /// Why, as the agent reported it (e.g. `node stopping`).
        reason: String,
    },
}

impl Ending {
    /// The job status this ending gives.
    pub fn status(&self) -> JobStatus {
        match self {
            Ending::Completed => JobStatus::Completed,
            Ending::Failed { .. } => JobStatus::Failed,
            Ending::Aborted { .. } | Ending::Interrupted { .. } => JobStatus::Aborted,
        }
    }
}

/// The gang restart a job's ending triggers, if any (DESIGN §4): a ranked job of a gang task that was aborted,
/// failed or interrupted. Never a completion, never a reserved job, never a job of a task without gang_options.
/// (The caller checks the other exclusion, an operation that is failing, because that depends on the count.)
pub fn gang_restart_trigger(task: &TaskSpec, job: &JobData, ending: &Ending) -> Option<SwitchReason> {
    if !task.is_gang() || job.gang_rank.is_none() {
        return None;
    }
    match ending {
        Ending::Completed => None,
        Ending::Failed { .. } => Some(SwitchReason::JobFailed),
        Ending::Aborted { .. } => Some(SwitchReason::JobAborted),
        Ending::Interrupted { .. } => Some(SwitchReason::JobInterrupted),
    }
}

/// Whether `failed` failed jobs fail an operation allowing `max` (DESIGN §4: fails at failed ≥ max).
pub fn failed_limit_reached(failed: u32, max: u32) -> bool {
    failed >= max
}

/// An allocation the operation holds that a new incarnation may reuse: alive, and not the trigger's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldAllocation {
    /// The allocation.
    pub allocation: AllocationRef,
    /// The last job it ran.
    pub last: LastJob,
}

/// A job of a new incarnation as planned: its cookie and rank, and the allocation it reuses, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedJob {
    /// Job cookie.
    pub job_cookie: u32,
    /// Gang rank, if ranked.
    pub gang_rank: Option<u32>,
    /// A reserved job of a gang task.
    pub reserved: bool,
    /// The reused allocation and the monitoring descriptor the job keeps from the allocation's last job.
    pub reuse: Option<(AllocationRef, Option<String>)>,
}

/// The jobs of one task in a new incarnation, and the held allocations it gives up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskPlan {
    /// One job per cookie 0..job_count, by cookie.
    pub jobs: Vec<PlannedJob>,
    /// Held allocations no job reuses.
    pub released: Vec<AllocationRef>,
}

/// Plans a task's jobs for a new incarnation (DESIGN §4, gang restart; YTsaurus "Рестарт gang-операции",
/// "Резервные джобы"). `rank_pool` is the task's gang size in its operation
/// ([`OperationSpec::task_gang_size`]: its `gang_options` size, its `job_count` for a task without them in a gang
/// operation, 0 in a plain operation); `held` are the reusable allocations whose last job belonged to this task.
///
/// Ranked task (rank pool s > 0) with job_count n:
/// 1. an allocation whose last job had rank r is reused for rank r, keeping job_cookie, gang_rank and
///    monitoring_descriptor;
/// 2. each rank left free (the trigger's, or one whose node was lost) is taken by a reserved allocation, in
///    cookie order, which keeps its job_cookie and monitoring_descriptor and gains the rank;
/// 3. the other reserved allocations are reused for reserved jobs, keeping their cookies;
/// 4. cookies without an allocation get the ranks still free, smallest cookie first, then stay reserved.
///
/// Task without ranks (pool 0): an allocation is reused by the cookie of its last job. At the start (nothing
/// held) cookie c of a ranked task gets rank c for c < s (so a task without `gang_options` in a gang operation,
/// whose pool is its `job_count`, has rank = cookie always). An allocation whose cookie or rank no longer fits the
/// task is released, and so is one whose last job's cookie or rank a held allocation before it (ranked first, by
/// rank, then by cookie) claimed: two held allocations may name one cookie when one is kept for a process that may
/// still run there (`gang::model::Lingering`) while the cookie's next job ran elsewhere. The caller
/// keeps those it must keep.
pub fn plan_task(task: &TaskSpec, rank_pool: u32, mut held: Vec<HeldAllocation>) -> TaskPlan {
    let n = task.job_count;
    let size = rank_pool;
    let ranked = rank_pool > 0;
    let mut plan = TaskPlan::default();
    held.sort_by_key(|h| (h.last.gang_rank.is_none(), h.last.gang_rank, h.last.job_cookie));
    let mut cookies_used = BTreeSet::new();
    let mut ranks_used = BTreeSet::new();
    let mut reserved_held = Vec::new();
    for h in held {
        let fits = h.last.job_cookie < n && h.last.gang_rank.is_none_or(|r| r < size);
        let rank_taken = ranked && h.last.gang_rank.is_some_and(|rank| ranks_used.contains(&rank));
        if !fits || rank_taken || !cookies_used.insert(h.last.job_cookie) {
            plan.released.push(h.allocation);
            continue;
        }
        match h.last.gang_rank {
            Some(rank) if ranked => {
                ranks_used.insert(rank);
                plan.jobs.push(planned(h.last.job_cookie, Some(rank), true, &h));
            }
            _ if ranked => reserved_held.push(h),
            _ => plan.jobs.push(planned(h.last.job_cookie, None, false, &h)),
        }
    }
    let mut free_ranks = (0..size).filter(|r| !ranks_used.contains(r));
    for h in reserved_held {
        let rank = free_ranks.next();
        plan.jobs.push(planned(h.last.job_cookie, rank, true, &h));
    }
    for cookie in (0..n).filter(|c| !cookies_used.contains(c)) {
        let rank = free_ranks.next();
        let reserved = ranked && rank.is_none();
        plan.jobs.push(PlannedJob { job_cookie: cookie, gang_rank: rank, reserved, reuse: None });
    }
    assert!(free_ranks.next().is_none(), "ranks left over after planning {n} jobs of gang size {size}");
    plan.jobs.sort_by_key(|job| job.job_cookie);
    plan
}

fn planned(job_cookie: u32, gang_rank: Option<u32>, gang: bool, held: &HeldAllocation) -> PlannedJob {
    let reuse = Some((held.allocation, held.last.monitoring_descriptor.clone()));
    PlannedJob { job_cookie, gang_rank, reserved: gang && gang_rank.is_none(), reuse }
}

/// Whether a gang task completed: every rank 0..size has a completed job among `jobs` (the task's jobs of the
/// current incarnation). Reserved jobs are not waited for (DESIGN §4).
pub fn gang_task_completed(task: &TaskSpec, jobs: &[&Job]) -> bool {
    let done: BTreeSet<u32> =
        jobs.iter().filter(|job| job.status == JobStatus::Completed).filter_map(|job| job.data.gang_rank).collect();
    (0..task.gang_size()).all(|rank| done.contains(&rank))
}

/// Whether a plain task completed: `job_count` distinct cookies have a completed job among `jobs` (the task's
/// jobs of the current incarnation). A task that reruns completed jobs never completes on its own (YTsaurus: such
/// an operation runs until it is completed or aborted by hand).
pub fn plain_task_completed(spec: &OperationSpec, task: &TaskSpec, jobs: &[&Job]) -> bool {
    if spec.restarts_completed(task) {
        return false;
    }
    // Cookies at or above job_count belong to jobs a spec update removed.
    let done: BTreeSet<u32> = jobs
        .iter()
        .filter(|job| job.status == JobStatus::Completed && job.data.job_cookie < task.job_count)
        .map(|job| job.data.job_cookie)
        .collect();
    done.len() as u64 >= task.job_count as u64
}

/// The order in which pending jobs get allocations: ranked jobs first (DESIGN §4), then by task and cookie.
pub fn schedule_key(job: &JobData) -> (bool, String, u32, u32) {
    (job.gang_rank.is_none(), job.task.clone(), job.gang_rank.unwrap_or(0), job.job_cookie)
}
