//! The gang controller's rows as plain data (DESIGN §2: operations, jobs, allocations and nodes are kinds of the
//! one resource table; §4 for their fields). Each type converts from a [`Row`] and into its `data` column.
//!
//! - `operation` (no parent): status [`OperationStatus`], data [`OperationData`].
//! - `job` (parent: its operation): status [`JobStatus`], data [`JobData`]. Only controller passes write jobs.
//! - `allocation` (parent: its node): one slot of a node; status `free` or `allocated`, data [`AllocationData`].
//!   Each grant to an operation raises `generation`, so (row, generation) names one allocation
//!   ([`AllocationRef`]); a job of a new incarnation placed in the same [`AllocationRef`] *reused* it.
//! - `node` (no parent): status = the node's name (so its agent, and only it, fetches it), data [`NodeData`];
//!   leased by its agent, whose lease token is the node's *session*.
//! - `inbox` (parent: an operation): a [`Message`] to the operation from an agent (job started, job ended) or a
//!   write API (abort); status `new` until a controller pass consumes it (`done`). Writers only insert, so they
//!   never contend with the operation's lease.

use super::placement::GangWait;
use super::spec::{FilePath, GangPlacement, OperationSpec};
use crate::store::{LockToken, Row, RowId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Row kind of operations.
pub const KIND_OPERATION: &str = "operation";
/// Row kind of jobs.
pub const KIND_JOB: &str = "job";
/// Row kind of allocations (node slots).
pub const KIND_ALLOCATION: &str = "allocation";
/// Row kind of nodes.
pub const KIND_NODE: &str = "node";
/// Row kind of operation inbox messages.
pub const KIND_INBOX: &str = "inbox";
/// Status of an unconsumed inbox message.
pub const INBOX_NEW: &str = "new";
/// Status of a consumed inbox message.
pub const INBOX_DONE: &str = "done";
/// Status of a free allocation.
pub const ALLOCATION_FREE: &str = "free";
/// Status of an allocation granted to an operation.
pub const ALLOCATION_ALLOCATED: &str = "allocated";

/// A row's data did not decode as its kind's type: a bug or a foreign writer, reported with the row id.
#[derive(Debug, thiserror::Error)]
#[error("row {row} ({kind}): {message}")]
pub struct DecodeError {
    /// The row.
    pub row: RowId,
    /// Its kind.
    pub kind: String,
    /// What did not decode.
    pub message: String,
}

fn decode<T: for<'de> Deserialize<'de>>(row: &Row) -> Result<T, DecodeError> {
    // From the borrowed value: no clone of the row's data first (clones dominated a gang restart's CPU).
    T::deserialize(&row.data).map_err(|e| DecodeError { row: row.id, kind: row.kind.clone(), message: e.to_string() })
}

fn encode<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("gang model types serialize to JSON")
}

/// An operation's lifecycle (DESIGN §4): starting → running → completed, failed or aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationStatus {
    /// Submitted; the first pass creates the jobs of incarnation 0.
    Starting,
    /// Jobs are scheduled and run.
    Running,
    /// Every task completed.
    Completed,
    /// Failed jobs reached `max_failed_job_count`, or `fail_on_job_restart` fired.
    Failed,
    /// Aborted by a user's request.
    Aborted,
}

impl OperationStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [OperationStatus; 5] = [
        OperationStatus::Starting,
        OperationStatus::Running,
        OperationStatus::Completed,
        OperationStatus::Failed,
        OperationStatus::Aborted,
    ];

    /// The status column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationStatus::Starting => "starting",
            OperationStatus::Running => "running",
            OperationStatus::Completed => "completed",
            OperationStatus::Failed => "failed",
            OperationStatus::Aborted => "aborted",
        }
    }

    /// Parses the status column.
    pub fn parse(status: &str) -> Option<OperationStatus> {
        OperationStatus::ALL.into_iter().find(|s| s.as_str() == status)
    }

    /// Whether the operation has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, OperationStatus::Completed | OperationStatus::Failed | OperationStatus::Aborted)
    }
}

impl fmt::Display for OperationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's lifecycle: pending (waiting for an allocation) → assigned (its agent is to start it) → running →
/// completed, failed or aborted. Terminal job rows are never written again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting for an allocation.
    Pending,
    /// Placed in an allocation; its node's agent starts it.
    Assigned,
    /// Its agent reported the process started.
    Running,
    /// Exited with code 0.
    Completed,
    /// Exited with another code, or could not start.
    Failed,
    /// Ended by the system: incarnation changed, node lost, operation ended, interrupted.
    Aborted,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 6] = [
        JobStatus::Pending,
        JobStatus::Assigned,
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Failed,
        JobStatus::Aborted,
    ];

    /// The status column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Assigned => "assigned",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Aborted => "aborted",
        }
    }

    /// Parses the status column.
    pub fn parse(status: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|s| s.as_str() == status)
    }

    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Completed | JobStatus::Failed | JobStatus::Aborted)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's id: its operation and its index in the operation's job sequence. Displayed `"{operation}-{index}"`
/// (the `YT_JOB_ID` of the job). The controller assigns it, so a pass can place a job it is about to insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId {
    /// The operation's row.
    pub operation: RowId,
    /// Position in the operation's job sequence, from 0.
    pub index: u64,
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.operation, self.index)
    }
}

impl JobId {
    /// The id as displayed (`"{operation}-{index}"`), written with `itoa` rather than the formatting machinery: a
    /// gang restart of 10 000 jobs writes it into 30 000 events and launches.
    pub fn to_text(&self) -> String {
        joined(self.operation.0, "-", self.index)
    }
}

/// `"{a}{separator}{b}"` for two integers, written with `itoa` into a string allocated once.
fn joined(a: impl itoa::Integer, separator: &str, b: impl itoa::Integer) -> String {
    let (mut first, mut second) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (first, second) = (first.format(a), second.format(b));
    let mut text = String::with_capacity(first.len() + separator.len() + second.len());
    text.push_str(first);
    text.push_str(separator);
    text.push_str(second);
    text
}

/// One allocation: a grant of an allocation row (node slot) to an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AllocationRef {
    /// The allocation row.
    pub row: RowId,
    /// Which grant of the row.
    pub generation: u64,
}

impl fmt::Display for AllocationRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.row, self.generation)
    }
}

impl AllocationRef {
    /// The reference as displayed (`"{row}.{generation}"`), written with `itoa` (see [`JobId::to_text`]).
    pub fn to_text(&self) -> String {
        joined(self.row.0, ".", self.generation)
    }
}

/// The id of incarnation `index` of `operation`: fresh at start and at every gang restart (DESIGN §4).
/// `"{operation}-i{index}"`, written with `itoa`.
pub fn incarnation_id(operation: RowId, index: u32) -> String {
    joined(operation.0, "-i", index)
}

/// An operation row's data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationData {
    /// The validated spec.
    pub spec: OperationSpec,
    /// Index of the current incarnation (0 at start, +1 at each gang restart).
    pub incarnation: u32,
    /// Failed jobs counted toward `max_failed_job_count`.
    pub failed_job_count: u32,
    /// Gang restarts caused by a lost node, counted toward `max_node_loss_restart_count`
    /// ([`OperationSpec::node_loss_restarts_max`]).
    #[serde(default)]
    pub node_loss_restart_count: u32,
    /// Index the next job gets.
    pub next_job_index: u64,
    /// Number the next fresh monitoring descriptor gets.
    pub next_descriptor: u64,
    /// Why the operation failed or was aborted.
    pub result: Option<String>,
    /// When its first pass started it (store clock): its place in the gang queue ([`super::placement::QueueEntry`]).
    /// `None` for an operation whose data predates the field (it waits as if it began when it joins the queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The placement of a gang operation's ranked jobs, fixed at its first pass (the spec's `gang_placement`, else
    /// the replica's default), so replicas with other defaults never disagree later. `None` for a plain operation,
    /// and for a gang operation started before lockstep had the key (placed incrementally).
    #[serde(default)]
    pub placement: Option<GangPlacement>,
    /// While an all-or-nothing incarnation waits for allocations: since when, and for how many.
    #[serde(default)]
    pub waiting: Option<GangWait>,
    /// Ranked jobs a gang restart aborted whose processes may still run on their live nodes: their rank is placed
    /// nowhere else until each is known dead ([`Lingering`]).
    #[serde(default)]
    pub lingering: Vec<Lingering>,
    /// Every job of the current incarnation has a row id greater than this one, so a pass reads only the jobs
    /// after it and a finished incarnation costs later passes nothing. A gang restart sets it to the
    /// largest job row its pass read: the new incarnation's jobs are inserted by that pass's apply or later ones,
    /// and the store gives later rows larger ids. `None` until the first gang restart (every job is incarnation
    /// 0's) and for an operation whose data predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs_after: Option<RowId>,
    /// The allocation rows granted to the operation when its last pass applied, by id: the next pass reads these
    /// and the free ones, not every allocation of the cluster. `None` for an operation whose data
    /// predates the field (its pass reads every allocation once, then keeps the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<Vec<RowId>>,
    /// The lease token of the controller pass whose apply wrote this data (tokens are unique store-wide, and a
    /// lease applies at most once): a replica that kept what that pass left knows that no job or granted allocation
    /// of the operation was written since, and its next pass reads only what changed
    /// (`gang::last_pass`). `None` before the first pass and for data that predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<LockToken>,
}

/// A ranked job aborted by a gang restart (or ended by the controller otherwise) while its process may still run:
/// its agent kills the process when it sees its allocation moved on, or fences when it cannot renew its node lease.
/// Until one of those is known, the job's (task, rank) is placed in no other allocation than the one it ran in
/// (where the agent kills before it starts), so no two processes of one rank ever run at once (the simulator's
/// `rank_exclusivity`).
///
/// Known dead only on evidence: the agent reports the job's end (an exit, the kill of a process the
/// controller moved on from, or that it runs no process of the job), or the node's session is no longer the one it
/// ran under (the agent fenced, or its lease expired: DESIGN §2's margin rule). A renewal of the node lease is no
/// evidence: an agent whose start report was not inserted yet, and whose allocation listing then failed after a
/// successful heartbeat, still runs the job. So the allocation stays granted to the operation, idle and marked
/// with the job ([`AllocationData::lingering`]), until the entry settles: the agent, which lists only its node's
/// allocations, learns there which job to answer for, even one it never started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lingering {
    /// The aborted job.
    pub job: JobId,
    /// Its task.
    pub task: String,
    /// Its gang rank.
    pub gang_rank: u32,
    /// The allocation row it ran in.
    pub allocation: RowId,
    /// Its node.
    pub node: RowId,
    /// The node session it ran under.
    pub session: LockToken,
}

impl OperationData {
    /// The data of a new operation running `spec`.
    pub fn new(spec: OperationSpec) -> OperationData {
        OperationData {
            spec,
            incarnation: 0,
            failed_job_count: 0,
            node_loss_restart_count: 0,
            next_job_index: 0,
            next_descriptor: 0,
            result: None,
            started_at: None,
            placement: None,
            waiting: None,
            lingering: Vec::new(),
            jobs_after: None,
            granted: None,
            written_by: None,
        }
    }

    /// Decodes an operation row's data.
    pub fn from_row(row: &Row) -> Result<OperationData, DecodeError> {
        decode(row)
    }

    /// The data column's value.
    pub fn to_json(&self) -> serde_json::Value {
        encode(self)
    }
}

/// A job, as a controller pass sees it: the row's id (none for a job the pass is creating), status and data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The job's row; `None` until inserted.
    pub row: Option<RowId>,
    /// Status.
    pub status: JobStatus,
    /// Fields, shared: a copy of a job (a controller pass copies every job it keeps decoded between passes) shares
    /// them until one is changed ([`Arc::make_mut`]).
    pub data: Arc<JobData>,
}

/// A job row's data (DESIGN §4: job_cookie, gang_rank, reserved flag, incarnation, allocation, monitoring
/// descriptor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobData {
    /// The job's id.
    pub id: JobId,
    /// Its task.
    pub task: String,
    /// Its index in the task, stable across restarts: 0..job_count.
    pub job_cookie: u32,
    /// Its rank in the gang: 0..size, unique per task and incarnation. Every job of a gang operation but the
    /// reserved ones has one (a task without `gang_options` ranks all its jobs, rank = cookie); no job of a plain
    /// operation has one.
    pub gang_rank: Option<u32>,
    /// A reserved job of a gang task: runs, has no rank, its end restarts only itself.
    pub reserved: bool,
    /// Index of the incarnation it started in; never changes.
    pub incarnation: u32,
    /// The allocation it runs in, once placed.
    pub allocation: Option<AllocationRef>,
    /// Its monitoring descriptor, once placed; kept when its allocation is reused.
    pub monitoring_descriptor: Option<String>,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Why it failed or was aborted.
    pub reason: Option<String>,
}

impl Job {
    /// Decodes a job row.
    pub fn from_row(row: &Row) -> Result<Job, DecodeError> {
        let status = JobStatus::parse(&row.status).ok_or_else(|| DecodeError {
            row: row.id,
            kind: row.kind.clone(),
            message: format!("unknown job status {:?}", row.status),
        })?;
        Ok(Job { row: Some(row.id), status, data: Arc::new(decode(row)?) })
    }

    /// The data column's value.
    pub fn data_json(&self) -> serde_json::Value {
        encode(self.data.as_ref())
    }

    /// The fields, to change: copied first if another copy of the job shares them.
    pub fn data_mut(&mut self) -> &mut JobData {
        Arc::make_mut(&mut self.data)
    }

    /// Whether the job has ended.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

/// What an agent runs for a job: everything it needs, so it never reads job rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLaunch {
    /// The job.
    pub job: JobId,
    /// Id of the job's incarnation (`YT_OPERATION_INCARNATION`).
    pub incarnation: String,
    /// Its task.
    pub task: String,
    /// Its job cookie.
    pub job_cookie: u32,
    /// Its gang rank, if ranked.
    pub gang_rank: Option<u32>,
    /// Shell command.
    pub command: String,
    /// Environment: the task's variables and the `YT_*` ones (DESIGN §4).
    pub environment: BTreeMap<String, String>,
    /// Files for the sandbox.
    pub file_paths: Vec<FilePath>,
}

/// The last job an allocation ran, which decides how the allocation is reused at a gang restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastJob {
    /// The job.
    pub job: JobId,
    /// Its task.
    pub task: String,
    /// Its job cookie.
    pub job_cookie: u32,
    /// Its gang rank.
    pub gang_rank: Option<u32>,
    /// Its monitoring descriptor.
    pub monitoring_descriptor: Option<String>,
}

/// An allocation row's data: one slot of a node and, while granted, its operation and job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationData {
    /// The node's row.
    pub node: RowId,
    /// The node's name.
    pub node_name: String,
    /// Slot index on the node.
    pub slot: u32,
    /// Grants so far; the current grant is [`AllocationRef`] { row, generation }.
    pub generation: u64,
    /// The operation it is granted to.
    pub operation: Option<RowId>,
    /// The node session (its agent's node lease token) at the grant. The allocation dies with that session.
    pub node_session: Option<LockToken>,
    /// The job its agent must run now; `None` while idle. Shared (never changed in place: a new launch replaces
    /// it), so a copy of a decoded allocation does not copy the launch's environment (a controller pass
    /// copies every allocation it keeps decoded between passes). Encoded as the launch itself.
    #[serde(default, with = "shared_launch")]
    pub job: Option<Arc<JobLaunch>>,
    /// The last job placed in it during this grant.
    pub last: Option<LastJob>,
    /// A job the controller moved on from while its process may still run here ([`Lingering`]): the allocation
    /// stays granted, idle, until the agent reports the job's end, killing the process if it runs one and saying
    /// that it runs none otherwise. `None` for every other allocation (and for data that predates the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lingering: Option<JobId>,
}

/// [`AllocationData::job`] encoded and decoded as the launch it shares (serde's own `Arc` support needs its `rc`
/// feature, which would rebuild every crate that uses serde).
mod shared_launch {
    use super::JobLaunch;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub(super) fn serialize<S: Serializer>(launch: &Option<Arc<JobLaunch>>, serializer: S) -> Result<S::Ok, S::Error> {
        launch.as_deref().serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Arc<JobLaunch>>, D::Error> {
        Ok(Option::<JobLaunch>::deserialize(deserializer)?.map(Arc::new))
    }
}

impl AllocationData {
    /// A free, never-granted slot `slot` of the node `node` named `node_name` (generation 0).
    pub fn free(node: RowId, node_name: String, slot: u32) -> AllocationData {
        AllocationData {
            node,
            node_name,
            slot,
            generation: 0,
            operation: None,
            node_session: None,
            job: None,
            last: None,
            lingering: None,
        }
    }
}

/// An allocation row, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The row.
    pub row: RowId,
    /// Whether it is granted (status `allocated`) or free.
    pub allocated: bool,
    /// Fields, shared as [`Job::data`] is.
    pub data: Arc<AllocationData>,
}

impl Allocation {
    /// Decodes an allocation row.
    pub fn from_row(row: &Row) -> Result<Allocation, DecodeError> {
        let data = Arc::new(decode(row)?);
        Ok(Allocation { row: row.id, allocated: row.status == ALLOCATION_ALLOCATED, data })
    }

    /// The current grant.
    pub fn current(&self) -> AllocationRef {
        AllocationRef { row: self.row, generation: self.data.generation }
    }

    /// The status column's value.
    pub fn status(&self) -> &'static str {
        if self.allocated { ALLOCATION_ALLOCATED } else { ALLOCATION_FREE }
    }

    /// The data column's value.
    pub fn data_json(&self) -> serde_json::Value {
        encode(self.data.as_ref())
    }

    /// The fields, to change: copied first if another copy of the allocation shares them.
    pub fn data_mut(&mut self) -> &mut AllocationData {
        Arc::make_mut(&mut self.data)
    }
}

/// A node row's data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeData {
    /// The node's name (also its row's status).
    pub name: String,
    /// Slots (allocation rows) the node offers.
    pub slots: u32,
}

/// The lock owner of a node's lease: its agent's "pipeline" name.
pub fn node_lease_owner(name: &str) -> String {
    format!("agent:{name}")
}

/// How a job's process ended, as its agent reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// The process exited with this code (0: completed, else failed).
    Exited {
        /// The exit code the executor reported; a process a signal its agent did not send ended reports
        /// 128 + the signal, as a shell does.
        code: i32,
    },
    /// The job could not start (e.g. a file was missing): a failure.
    StartFailed {
        /// The executor's error (or a `start_failure` rule's message in the simulator and `chaos run`).
        message: String,
    },
    /// The agent aborted the job (e.g. it lost the process): an abort.
    Aborted {
        /// Why, as the agent's constants say it ([`crate::agent::REASON_MOVED_ON`],
        /// [`crate::agent::REASON_NOT_RUNNING`]) or `process killed`.
        reason: String,
    },
    /// The job was interrupted and needs a restart (e.g. its node is draining).
    Interrupted {
        /// Why, e.g. [`crate::agent::REASON_NODE_STOPPING`] or an allocation slot the node does not serve.
        reason: String,
    },
}

/// A message in an operation's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// An agent started the job's process in `allocation`.
    JobStarted {
        /// The job whose process started.
        job: JobId,
        /// The grant it runs under: the allocation row and the generation the agent saw.
        allocation: AllocationRef,
    },
    /// The job's process in `allocation` ended.
    JobEnded {
        /// The job whose process ended (or never ran here).
        job: JobId,
        /// The grant it ran under; a report about an older incarnation or placement is ignored (DESIGN §4).
        allocation: AllocationRef,
        /// How it ended.
        outcome: JobOutcome,
    },
    /// A user asked to abort the operation.
    Abort {
        /// The user's reason, checked by [`crate::gang::api::check_abort_reason`] (1 to
        /// [`crate::gang::api::ABORT_REASON_BYTES_MAX`] bytes, one line); it becomes the operation's result.
        reason: String,
    },
    /// A user asked to replace the spec of the running operation (checked again when consumed).
    UpdateSpec {
        /// The new spec, parsed and checked against the one in force when sent ([`crate::gang::api::update_spec`]).
        spec: Box<OperationSpec>,
    },
}

impl Message {
    /// Decodes an inbox row. The two reports agents send are decoded by their `type` first: serde decodes an
    /// internally tagged enum by copying every field of the message aside before it looks at the tag (a
    /// 10 000-job gang restart's passes decode 20 000 reports); the others, and any row these do not fit, as the
    /// enum (with its error).
    pub fn from_row(row: &Row) -> Result<Message, DecodeError> {
        #[derive(Deserialize)]
        struct Started {
            job: JobId,
            allocation: AllocationRef,
        }
        #[derive(Deserialize)]
        struct Ended {
            job: JobId,
            allocation: AllocationRef,
            outcome: JobOutcome,
        }
        let report = match row.data.get("type").and_then(serde_json::Value::as_str) {
            Some("job_started") => Started::deserialize(&row.data)
                .ok()
                .map(|Started { job, allocation }| Message::JobStarted { job, allocation }),
            Some("job_ended") => Ended::deserialize(&row.data)
                .ok()
                .map(|Ended { job, allocation, outcome }| Message::JobEnded { job, allocation, outcome }),
            _ => None,
        };
        report.map_or_else(|| decode(row), Ok)
    }

    /// The data column's value.
    pub fn to_json(&self) -> serde_json::Value {
        encode(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewRow;
    use serde_json::json;

    fn inbox_row(data: serde_json::Value) -> Row {
        NewRow::new(KIND_INBOX, INBOX_NEW, data).into_row(RowId(5), Timestamp(1))
    }

    #[test]
    fn ids_written_with_itoa_read_as_their_display() {
        for (operation, index) in [(0, 0), (7, 12), (-3, 5), (i64::MAX, u64::MAX), (i64::MIN, 1)] {
            let job = JobId { operation: RowId(operation), index };
            assert_eq!(job.to_text(), job.to_string());
            let allocation = AllocationRef { row: RowId(operation), generation: index };
            assert_eq!(allocation.to_text(), allocation.to_string());
        }
        for (operation, index) in [(0, 0), (42, 7), (-1, u32::MAX)] {
            assert_eq!(incarnation_id(RowId(operation), index), format!("{}-i{index}", RowId(operation)));
        }
    }

    #[test]
    fn a_report_decodes_by_its_type_as_the_enum_decodes_it() {
        let (job, allocation) =
            (JobId { operation: RowId(3), index: 7 }, AllocationRef { row: RowId(9), generation: 2 });
        let messages = [
            Message::JobStarted { job, allocation },
            Message::JobEnded { job, allocation, outcome: JobOutcome::Exited { code: 3 } },
            Message::JobEnded { job, allocation, outcome: JobOutcome::Aborted { reason: "moved on".into() } },
            Message::Abort { reason: "user".into() },
        ];
        for message in messages {
            let row = inbox_row(message.to_json());
            assert_eq!(Message::from_row(&row).unwrap(), message);
            assert_eq!(decode::<Message>(&row).unwrap(), message, "the enum's own decoding");
        }
        // A report with a field missing fails as the enum fails, naming the row.
        let broken = inbox_row(json!({ "type": "job_started", "job": { "operation": 3, "index": 7 } }));
        let error = Message::from_row(&broken).unwrap_err();
        assert_eq!(error.to_string(), decode::<Message>(&broken).unwrap_err().to_string());
        assert!(error.to_string().contains("allocation"), "{error}");
    }
}
