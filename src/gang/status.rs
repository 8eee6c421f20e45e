//! What `lockstep status OP` shows: an operation's state and incarnation, a gang's placement and, while an
//! all-or-nothing gang waits, its need and place in the gang queue, and its jobs by task with gang rank, job
//! cookie, state and node (the real-mode issue). [`StatusReport`] is plain data built from an [`OperationView`]
//! and the names of the nodes its allocations live on; [`StatusReport::render`] is the human table and the report
//! serializes to the `--json` form.

use super::api::{self, GangError, OperationView};
use super::model::{Allocation, JobStatus, KIND_ALLOCATION, OperationStatus, incarnation_id};
use super::placement::{GangPlacement, KIND_GANG_QUEUE, canonical_queue};
use crate::store::{RowId, Store, Timestamp};
use crate::text::count;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// An operation's state for people and scripts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The operation's id.
    pub operation: RowId,
    /// Its status.
    pub state: OperationStatus,
    /// The current incarnation's id (`YT_OPERATION_INCARNATION` of its jobs, e.g. `5-i1`).
    pub incarnation: String,
    /// The current incarnation's index: 0 at start, +1 at each gang restart.
    pub incarnation_index: u32,
    /// Gang restarts so far (incarnations started after the first).
    pub gang_restarts: usize,
    /// Failed jobs counted toward `max_failed_job_count`.
    pub failed_job_count: u32,
    /// `max_failed_job_count` of the spec.
    pub max_failed_job_count: u32,
    /// Why the operation failed or was aborted; `every task completed` when it completed.
    pub result: Option<String>,
    /// A gang operation's placement, fixed at its first pass (`None` for a plain operation, or before that pass).
    #[serde(default)]
    pub placement: Option<GangPlacement>,
    /// While an all-or-nothing incarnation waits for allocations: for how many, since when, and where in the gang
    /// queue.
    #[serde(default)]
    pub waiting: Option<WaitingStatus>,
    /// Tasks by name, in name order.
    pub tasks: Vec<TaskStatus>,
}

/// An all-or-nothing incarnation waiting in the gang queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingStatus {
    /// Allocations it needs at once.
    pub need: u32,
    /// When it began to wait (store clock).
    pub since: Timestamp,
    /// Since when its need has exceeded the live nodes' allocations, if it does.
    pub unfit_since: Option<Timestamp>,
    /// Its place in the gang queue, from 0 (the head), and the queue's length; `None` if the queue read did not
    /// list it (a pass moved on since the operation row was read).
    pub position: Option<(usize, usize)>,
}

/// One task's jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task's name.
    pub name: String,
    /// Its `job_count`.
    pub job_count: u32,
    /// Its gang size; `None` for a task without `gang_options`.
    pub gang_size: Option<u32>,
    /// The jobs shown: those of the current incarnation (or every job, see [`StatusReport::read`]), by
    /// incarnation, then gang rank (ranked first), then job cookie.
    pub jobs: Vec<JobStatusLine>,
}

/// One job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatusLine {
    /// The job's id (`YT_JOB_ID`).
    pub job: String,
    /// Its gang rank; `None` for a reserved job or a job of a plain task.
    pub gang_rank: Option<u32>,
    /// Its job cookie.
    pub job_cookie: u32,
    /// A reserved job of a gang task.
    pub reserved: bool,
    /// Its state.
    pub state: JobStatus,
    /// The node its allocation is on; `None` while pending.
    pub node: Option<String>,
    /// The incarnation it started in.
    pub incarnation: String,
    /// Why it failed or was aborted.
    pub reason: Option<String>,
}

impl StatusReport {
    /// Reads `operation` from `store` and builds its report: the jobs of the current incarnation, or every job
    /// when `all_jobs`. Errors: as [`api::status`].
    pub async fn read<S: Store>(store: &S, operation: RowId, all_jobs: bool) -> Result<StatusReport, GangError> {
        let view = api::status(store, operation).await?;
        let mut nodes = BTreeMap::new();
        for row in store.list(KIND_ALLOCATION, None).await? {
            let allocation = Allocation::from_row(&row)?;
            nodes.insert(allocation.row, allocation.data.node_name.clone());
        }
        let mut report = StatusReport::from_view(&view, &nodes, all_jobs);
        if let Some(waiting) = &mut report.waiting {
            let queue = canonical_queue(&store.list(KIND_GANG_QUEUE, None).await?)?;
            let entries = queue.map(|(_, queue)| queue.entries).unwrap_or_default();
            waiting.position =
                entries.iter().position(|entry| entry.operation == operation).map(|at| (at, entries.len()));
        }
        Ok(report)
    }

    /// The report of `view`; `nodes` names the node of each allocation row (an allocation row stays on its node
    /// for good, so any read of it will do). Jobs of older incarnations are left out unless `all_jobs`.
    pub fn from_view(view: &OperationView, nodes: &BTreeMap<RowId, String>, all_jobs: bool) -> StatusReport {
        let spec = &view.data.spec;
        let tasks = spec
            .tasks
            .iter()
            .map(|(name, task)| {
                let mut jobs: Vec<JobStatusLine> = view
                    .jobs
                    .iter()
                    .filter(|job| job.data.task == *name && (all_jobs || job.data.incarnation == view.data.incarnation))
                    .map(|job| JobStatusLine {
                        job: job.data.id.to_string(),
                        gang_rank: job.data.gang_rank,
                        job_cookie: job.data.job_cookie,
                        reserved: job.data.reserved,
                        state: job.status,
                        node: job.data.allocation.and_then(|a| nodes.get(&a.row).cloned()),
                        incarnation: incarnation_id(view.id, job.data.incarnation),
                        reason: job.data.reason.clone(),
                    })
                    .collect();
                let key = |line: &JobStatusLine| (line.incarnation.clone(), line.gang_rank.is_none(), line.gang_rank);
                jobs.sort_by(|a, b| key(a).cmp(&key(b)).then(a.job_cookie.cmp(&b.job_cookie)));
                let gang_size = task.is_gang().then(|| task.gang_size());
                TaskStatus { name: name.clone(), job_count: task.job_count, gang_size, jobs }
            })
            .collect();
        StatusReport {
            operation: view.id,
            state: view.status,
            incarnation: incarnation_id(view.id, view.data.incarnation),
            incarnation_index: view.data.incarnation,
            gang_restarts: view.incarnation_events().len().saturating_sub(1),
            failed_job_count: view.data.failed_job_count,
            max_failed_job_count: spec.max_failed_job_count,
            result: view.data.result.clone(),
            placement: view.data.placement,
            waiting: view.data.waiting.as_ref().map(|wait| WaitingStatus {
                need: wait.need,
                since: wait.since,
                unfit_since: wait.unfit_since,
                position: None,
            }),
            tasks,
        }
    }

    /// The human form: a header line per fact, then a table of jobs per task. Columns: job, rank (`-` for none,
    /// `reserved` for a reserved job), cookie, state, node (`-` while pending), incarnation, reason.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "operation   {}", self.operation);
        let _ = writeln!(out, "state       {}", self.state);
        let _ = writeln!(
            out,
            "incarnation {} (index {}, {} gang restarts)",
            self.incarnation, self.incarnation_index, self.gang_restarts
        );
        let _ = writeln!(
            out,
            "failed jobs {} of max_failed_job_count {}",
            self.failed_job_count, self.max_failed_job_count
        );
        if let Some(result) = &self.result {
            let _ = writeln!(out, "result      {result}");
        }
        if let Some(placement) = self.placement {
            let _ = writeln!(out, "placement   {placement}");
        }
        if let Some(waiting) = &self.waiting {
            let mut line =
                format!("waiting     for {} at once since {}", count(waiting.need, "allocation"), waiting.since.utc());
            if let Some((at, len)) = waiting.position {
                line.push_str(&format!(", position {} of {len} in the gang queue", at + 1));
            }
            if let Some(since) = waiting.unfit_since {
                line.push_str(&format!("; more than the live nodes offer since {}", since.utc()));
            }
            let _ = writeln!(out, "{line}");
        }
        for task in &self.tasks {
            let kind = task.gang_size.map_or("plain".to_string(), |size| format!("gang, size {size}"));
            let _ = writeln!(out, "\ntask {} (job_count {}, {kind})", task.name, task.job_count);
            let header = ["job", "rank", "cookie", "state", "node", "incarnation", "reason"];
            let rows: Vec<[String; 7]> = task.jobs.iter().map(JobStatusLine::cells).collect();
            out.push_str(&crate::table::render(header, &rows, "  "));
        }
        out
    }
}

impl JobStatusLine {
    fn cells(&self) -> [String; 7] {
        let rank = match (self.gang_rank, self.reserved) {
            (Some(rank), _) => rank.to_string(),
            (None, true) => "reserved".into(),
            (None, false) => "-".into(),
        };
        [
            self.job.clone(),
            rank,
            self.job_cookie.to_string(),
            self.state.to_string(),
            self.node.clone().unwrap_or_else(|| "-".into()),
            self.incarnation.clone(),
            self.reason.clone().unwrap_or_default(),
        ]
    }
}
