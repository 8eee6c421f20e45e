//! One controller pass over one operation, as a pure function of what the pass read ([`PassInput`]) to what it
//! writes ([`PassOutput`]): the rules of DESIGN §4 in the order a pass applies them. The operation pipeline
//! ([`super::pipeline`]) reads the rows, calls [`run_pass`], and applies the output guarded by its lease.
//!
//! Order of one pass:
//! 1. a starting operation creates incarnation 0 and runs;
//! 2. revival: if the previous pass's lease expired, a ranked job lost with its node restarts the gang with no
//!    allocation reuse;
//! 3. inbox messages, oldest first: job started, job ended (which may restart the job, restart the gang or fail
//!    the operation), abort; a message about a job of an older incarnation or an ended job is consumed and
//!    ignored;
//! 4. jobs on lost nodes are aborted ("node lost"), with the same consequences as any abort;
//! 5. the operation completes when every task did;
//! 6. pending jobs get free allocations, ranked jobs first, leaving those the gang queue reserves for waiting
//!    gangs ahead; an all-or-nothing incarnation not yet placed is placed whole or waits in the queue holding
//!    nothing ([`super::placement`]).

use super::env::job_environment_of;
use super::lingering::LingeringSet;
use super::model::{
    Allocation, AllocationRef, Job, JobData, JobId, JobLaunch, JobOutcome, JobStatus, LastJob, Lingering, Message,
    OperationData, OperationStatus, incarnation_id,
};
use super::placement::{self, GangPlacement, GangWait, PlacementSettings, QueueEntry};
use super::rules::{self, Ending, HeldAllocation, PlannedJob, SwitchReason};
use super::spec::OperationSpec;
use super::validate;
use crate::store::{LockToken, RowId, Timestamp};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Event kind: an incarnation started (data: incarnation, index, reason, trigger).
pub const EVENT_INCARNATION_STARTED: &str = "incarnation_started";
/// Event kind: a job's status changed (data: job, task, job_cookie, gang_rank, incarnation, from, to, reason).
pub const EVENT_JOB_STATE: &str = "job_state_changed";
/// Event kind: a spec update was applied (data: job_count changes by task).
pub const EVENT_SPEC_UPDATED: &str = "spec_updated";
/// Event kind: a spec update was refused when consumed (data: violations).
pub const EVENT_SPEC_UPDATE_REFUSED: &str = "spec_update_refused";
/// Abort reason of the jobs a smaller `job_count` removes.
pub const REASON_JOB_COUNT_DECREASED: &str = "job_count decreased";
/// Event kind: the operation's status changed (data: from, to, reason, and the placement fixed at the start).
pub const EVENT_OPERATION_STATE: &str = "operation_state_changed";
/// Event kind: an all-or-nothing incarnation could not be placed whole and began to wait in the gang queue (data:
/// incarnation, need, position, reserved ahead, free allocations, allocations of the live nodes).
pub const EVENT_GANG_WAITING: &str = "gang_waiting";
/// Event kind: an all-or-nothing incarnation was placed whole (data: incarnation, need, reused allocations, how
/// long it waited in ms).
pub const EVENT_GANG_PLACED: &str = "gang_placed";

/// Abort reason of the jobs a gang restart ends (DESIGN §4).
pub const REASON_INCARNATION_CHANGED: &str = "incarnation changed";
/// Abort reason of a reserved job whose gang task completed.
pub const REASON_GANG_COMPLETED: &str = "gang task completed";
/// Abort reason of a job whose node's session ended.
pub const REASON_NODE_LOST: &str = "node lost";
/// How the result of an operation failed by `max_node_loss_restart_count` begins (the audit knows it by this).
pub const NODE_LOSS_LIMIT_PREFIX: &str = "gang restarts caused by lost nodes";

/// What a pass read: the operation, its jobs and allocations, its unconsumed inbox, and the free allocations
/// and live node sessions it may use.
#[derive(Clone, Debug)]
pub struct PassInput {
    /// The operation's row.
    pub operation: RowId,
    /// Its status.
    pub status: OperationStatus,
    /// Its data.
    pub data: OperationData,
    /// The jobs of the current incarnation, in creation order: the pipeline reads those after
    /// [`OperationData::jobs_after`]. Jobs of older incarnations may be among them (they were ended when their
    /// incarnation was) and change nothing: every rule looks at live jobs or at the current incarnation's.
    pub jobs: Vec<Job>,
    /// Allocations granted to the operation.
    pub allocations: Vec<Allocation>,
    /// Unconsumed inbox messages, oldest first.
    pub messages: Vec<(RowId, Message)>,
    /// Free allocations on live nodes with each node's session, in the order the pass should use them.
    pub free: Vec<(Allocation, LockToken)>,
    /// The live session of each node; a node missing here is dead.
    pub node_sessions: BTreeMap<RowId, LockToken>,
    /// The previous pass's lease expired before it applied: this pass is a revival.
    pub revival: bool,
    /// The store's time at the pass's read: waits and the unfit timeout are measured on it.
    pub now: Timestamp,
    /// The gang queue's entries, read before the allocations (empty when there is no queue row yet).
    pub queue: Vec<QueueEntry>,
    /// Allocations the live nodes offer, free or granted.
    pub cluster_slots: u32,
    /// Allocations of the nodes expected back: no live session, their lease expired less than
    /// [`PlacementSettings::node_return_grace`] ago. With `cluster_slots`, the most an incarnation could ever get.
    pub returning_slots: u32,
    /// The replica's placement settings.
    pub settings: PlacementSettings,
}

/// What a pass writes.
#[derive(Clone, Debug, PartialEq)]
pub struct PassOutput {
    /// New status of the operation.
    pub status: OperationStatus,
    /// New data of the operation.
    pub data: OperationData,
    /// Existing jobs that changed (each has a row).
    pub updated_jobs: Vec<Job>,
    /// Jobs to insert (no row yet).
    pub new_jobs: Vec<Job>,
    /// Allocations that changed: granted, reassigned, idled or released.
    pub allocations: Vec<Allocation>,
    /// Inbox messages consumed.
    pub consumed: Vec<RowId>,
    /// Events about the operation, in order: (kind, data).
    pub events: Vec<(String, Value)>,
    /// The gang queue's entries to write, when the pass joined or left the queue or took free allocations while
    /// gangs waited: written under the queue row's lock, version raised, only if the version is still the one
    /// read ([`super::placement`]). `None`: the pass neither changed nor relied on the queue.
    pub queue: Option<Vec<QueueEntry>>,
    /// What the pass leaves of the operation's jobs and allocations, should its apply apply: what the replica's
    /// next pass is given without reading them (`gang::last_pass`).
    pub left: PassLeft,
}

/// The jobs and allocations of an operation after a pass, as its writes leave them (with [`PassOutput::new_jobs`],
/// which the pass's apply inserts).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassLeft {
    /// The jobs with rows after the written data's [`OperationData::jobs_after`] (the current incarnation's), as
    /// the pass left them, by row id.
    pub jobs: Vec<Job>,
    /// The allocations granted to the operation after the pass, by row id.
    pub allocations: Vec<Allocation>,
}

/// Runs one pass (see the module docs for its order).
///
/// An abort always ends the operation: a pass retried on the same inbox would otherwise fail again on
/// every retry for as long as some rule of it panics (a controller bug), and the abort behind it would never apply.
/// So when the inbox holds an abort and the rules panic, the pass is run again as the abort alone: every job is
/// aborted, every allocation released, every message consumed. (Without an abort, the panic fails the pass, as any
/// panic of a handler does, and the pipeline retries it.)
pub fn run_pass(input: PassInput) -> PassOutput {
    let abort = input.messages.iter().find_map(|(_, message)| match message {
        Message::Abort { reason } => Some(reason.clone()),
        _ => None,
    });
    let Some(reason) = abort else { return run_rules(input) };
    let spare = input.clone();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_rules(input))) {
        Ok(output) => output,
        Err(_) => run_abort(spare, reason),
    }
}

/// The pass of an operation whose rules panicked with an abort in its inbox ([`run_pass`]): the abort alone.
fn run_abort(input: PassInput, reason: String) -> PassOutput {
    let mut pass = Pass::new(input);
    pass.consumed = std::mem::take(&mut pass.messages).into_iter().map(|(row, _)| row).collect();
    if !pass.status.is_terminal() {
        pass.end(OperationStatus::Aborted, reason);
    }
    pass.finish()
}

/// The rules of one pass, in the order of the module docs.
fn run_rules(input: PassInput) -> PassOutput {
    let mut pass = Pass::new(input);
    if pass.status == OperationStatus::Starting {
        pass.start();
    }
    if pass.revival && pass.status == OperationStatus::Running {
        pass.check_revival();
    }
    for (row, message) in std::mem::take(&mut pass.messages) {
        pass.consumed.push(row);
        if !pass.status.is_terminal() {
            pass.handle(message);
        }
    }
    if pass.status == OperationStatus::Running {
        pass.check_nodes();
    }
    if pass.status == OperationStatus::Running {
        pass.check_completion();
    }
    if pass.status == OperationStatus::Running {
        pass.schedule();
    }
    pass.finish()
}

struct Pass {
    operation: RowId,
    status: OperationStatus,
    data: OperationData,
    /// The jobs by index (also by row: the store gives an operation's jobs rows in the order the controller
    /// created them), those this pass creates last.
    jobs: Vec<Job>,
    /// Whether the pass changed job `i` (of `jobs`).
    dirty_jobs: Vec<bool>,
    allocations: BTreeMap<RowId, Allocation>,
    dirty_allocations: BTreeSet<RowId>,
    messages: Vec<(RowId, Message)>,
    free: Vec<(Allocation, LockToken)>,
    /// Allocations released this pass by a job that completed with nothing left to run in them: the first offered
    /// to pending jobs (as new grants), so a plain operation with more jobs than slots does not wait a pass.
    recycled: Vec<RowId>,
    node_sessions: BTreeMap<RowId, LockToken>,
    revival: bool,
    consumed: Vec<RowId>,
    events: Vec<(String, Value)>,
    now: Timestamp,
    queue: Vec<QueueEntry>,
    /// The pass joined or left the queue.
    queue_changed: bool,
    /// The pass took free allocations the queue's reservation governs, while gangs waited.
    queue_relied_on: bool,
    cluster_slots: u32,
    returning_slots: u32,
    settings: PlacementSettings,
    /// While an all-or-nothing incarnation is planned: its jobs' planned reuse is deferred, not placed.
    defer_reuse: bool,
    /// Reuse planned for jobs (by index) of an all-or-nothing incarnation, applied only when it is placed whole.
    deferred: BTreeMap<usize, (AllocationRef, Option<String>)>,
    /// The operation's [`Lingering`] entries, indexed; written back to its data at the end of the pass.
    lingering: LingeringSet,
    /// An incarnation's index and id ([`incarnation_id`]), written into every job event and launch: formatted
    /// once for the incarnation of the jobs a pass handles in a row, not once per job.
    incarnation: (u32, String),
}

impl Pass {
    fn new(input: PassInput) -> Pass {
        let mut jobs = input.jobs;
        // Already in order when they come from the store (row order is index order), which a sort checks in one
        // walk.
        jobs.sort_by_key(|job| job.data.id.index);
        let dirty_jobs = vec![false; jobs.len()];
        let mut data = input.data;
        let lingering = LingeringSet::new(std::mem::take(&mut data.lingering));
        let mut free = input.free;
        free.reverse(); // popped from the back
        let incarnation = (data.incarnation, incarnation_id(input.operation, data.incarnation));
        let messages = input.messages.len();
        Pass {
            operation: input.operation,
            status: input.status,
            data,
            jobs,
            dirty_jobs,
            allocations: input.allocations.into_iter().map(|a| (a.row, a)).collect(),
            dirty_allocations: BTreeSet::new(),
            messages: input.messages,
            free,
            recycled: Vec::new(),
            node_sessions: input.node_sessions,
            revival: input.revival,
            consumed: Vec::with_capacity(messages),
            // About one event per message (a job started, a job ended); a gang restart reserves its own.
            events: Vec::with_capacity(messages),
            now: input.now,
            queue: input.queue,
            queue_changed: false,
            queue_relied_on: false,
            cluster_slots: input.cluster_slots,
            returning_slots: input.returning_slots,
            settings: input.settings,
            defer_reuse: false,
            deferred: BTreeMap::new(),
            lingering,
            incarnation,
        }
    }

    fn finish(self) -> PassOutput {
        let after = self.data.jobs_after;
        let dirty = self.dirty_jobs.iter().filter(|d| **d).count();
        let mut updated_jobs = Vec::with_capacity(dirty);
        let mut new_jobs = Vec::new();
        let mut left_jobs = Vec::with_capacity(self.jobs.len());
        for (job, dirty) in self.jobs.into_iter().zip(self.dirty_jobs) {
            let Some(row) = job.row else {
                new_jobs.push(job);
                continue;
            };
            let left = after.is_none_or(|after| row > after);
            written_and_left(job, dirty, left, &mut updated_jobs, &mut left_jobs);
        }
        // By row: index order is row order (see `jobs`), which the sort checks in one walk.
        left_jobs.sort_by_key(|job| job.row);
        let mut data = self.data;
        data.lingering = self.lingering.into_vec();
        // One walk over the allocations by row: those written (the dirty ones), those granted now (the data's
        // list) and those left granted to the operation (each input allocation is, or was taken from the free ones).
        let mut written = Vec::with_capacity(self.dirty_allocations.len());
        let (mut granted_rows, mut granted) = (Vec::new(), Vec::new());
        let mut dirty = self.dirty_allocations.into_iter().peekable();
        for (row, allocation) in self.allocations {
            while dirty.next_if(|d| *d < row).is_some() {}
            let is_dirty = dirty.next_if_eq(&row).is_some();
            if allocation.allocated {
                granted_rows.push(row);
            }
            let left = allocation.allocated && allocation.data.operation == Some(self.operation);
            written_and_left(allocation, is_dirty, left, &mut written, &mut granted);
        }
        data.granted = Some(granted_rows);
        let queue = (self.queue_changed || self.queue_relied_on).then_some(self.queue);
        PassOutput {
            status: self.status,
            data,
            updated_jobs,
            new_jobs,
            allocations: written,
            consumed: self.consumed,
            events: self.events,
            queue,
            left: PassLeft { jobs: left_jobs, allocations: granted },
        }
    }

    // ---- lifecycle -------------------------------------------------------------------------------------------

    /// The first pass: a gang operation's placement is fixed now (its spec's, else this replica's default), so
    /// replicas with other defaults never disagree about it later.
    fn start(&mut self) {
        if self.data.spec.is_gang() {
            self.data.placement = Some(self.data.spec.gang_placement.unwrap_or(self.settings.default));
        }
        self.data.started_at = Some(self.now);
        self.set_status(OperationStatus::Running, None);
        self.begin_incarnation(SwitchReason::OperationStarted, None);
    }

    /// Whether the all-or-nothing gate applies (the placement is all-or-nothing, and no mutation test turned
    /// the gate off).
    fn all_or_nothing(&self) -> bool {
        self.data.placement == Some(GangPlacement::AllOrNothing) && !self.settings.gate_disabled_for_mutation_test
    }

    fn set_status(&mut self, to: OperationStatus, reason: Option<String>) {
        let from = self.status;
        assert!(!from.is_terminal(), "operation {} changes status after it ended ({from} → {to})", self.operation);
        self.status = to;
        if to.is_terminal() {
            self.data.result = reason.clone();
        }
        let placement = self.data.placement;
        self.events.push((
            EVENT_OPERATION_STATE.into(),
            json!({ "from": from, "to": to, "reason": reason, "placement": placement }),
        ));
    }

    /// Ends the operation: every job still alive is aborted and every allocation released.
    fn end(&mut self, to: OperationStatus, reason: String) {
        let job_reason = format!("operation {to}");
        for i in self.live_jobs() {
            self.end_job(i, JobStatus::Aborted, None, Some(job_reason.clone()));
        }
        for row in self.held_allocations() {
            self.release(row);
        }
        self.leave_queue();
        self.data.waiting = None;
        self.lingering.clear();
        self.set_status(to, Some(reason));
    }

    /// Starts an incarnation: index 0 at the start, else the next one after aborting every live job. Jobs are
    /// planned per task by [`rules::plan_task`] over the allocations that may be reused.
    fn begin_incarnation(&mut self, reason: SwitchReason, trigger: Option<usize>) {
        // Sized up front: each job of the new incarnation is created and, most often, placed (two
        // events), and each live job of the old one aborted (one).
        let live = self.live_jobs();
        let created = usize::try_from(self.data.spec.job_count()).unwrap_or(0);
        self.events.reserve(live.len() + 2 * created + 2);
        self.jobs.reserve(created);
        self.dirty_jobs.reserve(created);
        if reason != SwitchReason::OperationStarted {
            // The new incarnation's jobs get rows after every job read (see `OperationData::jobs_after`).
            self.data.jobs_after = self.jobs.iter().filter_map(|job| job.row).max().or(self.data.jobs_after);
            self.data.incarnation += 1;
            for i in live {
                self.linger(i);
                self.end_job(i, JobStatus::Aborted, None, Some(REASON_INCARNATION_CHANGED.into()));
            }
        }
        let trigger_allocation = trigger.and_then(|i| self.jobs[i].data.allocation);
        let mut held: BTreeMap<String, Vec<HeldAllocation>> = BTreeMap::new();
        for row in self.held_allocations() {
            let allocation = &self.allocations[&row];
            let reusable = reason.reuses_allocations()
                && Some(allocation.current()) != trigger_allocation
                && self.alive(allocation)
                && allocation.data.last.is_some();
            match (reusable, allocation.data.last.clone()) {
                (true, Some(last)) => {
                    held.entry(last.task.clone())
                        .or_default()
                        .push(HeldAllocation { allocation: allocation.current(), last });
                }
                // Kept, idle, until its agent answers for the process that may still run there ([`Lingering`]).
                _ if self.kept_for_lingering(row) => {}
                _ => self.release(row),
            }
        }
        let trigger_data = trigger.map(|i| {
            let job = &self.jobs[i];
            json!({ "job": job.data.id.to_string(), "task": job.data.task, "job_cookie": job.data.job_cookie,
                    "gang_rank": job.data.gang_rank, "status": job.status, "reason": job.data.reason })
        });
        self.events.push((
            EVENT_INCARNATION_STARTED.into(),
            json!({ "incarnation": incarnation_id(self.operation, self.data.incarnation),
                    "index": self.data.incarnation, "reason": reason, "trigger": trigger_data }),
        ));
        let tasks: Vec<String> = self.data.spec.tasks.keys().cloned().collect();
        // An all-or-nothing incarnation keeps the reuse it plans aside: it applies only if the whole incarnation
        // is placed in this pass (see `gather`).
        self.defer_reuse = self.all_or_nothing();
        for name in tasks {
            let task = &self.data.spec.tasks[&name];
            let pool = self.data.spec.task_gang_size(task);
            let plan = rules::plan_task(task, pool, held.remove(&name).unwrap_or_default());
            for allocation in plan.released {
                self.release_unless_kept(allocation.row);
            }
            for planned in plan.jobs {
                self.create_job(&name, planned);
            }
        }
        self.defer_reuse = false;
        for (_, orphans) in held {
            for h in orphans {
                self.release_unless_kept(h.allocation.row);
            }
        }
    }

    // ---- messages --------------------------------------------------------------------------------------------

    /// Records live ranked job `i`, about to be aborted, as [`Lingering`] if its process may still run: it was
    /// placed (its agent may have started it) in an allocation this operation holds, granted under the node's
    /// session that is still live. The allocation is marked with the job ([`AllocationData::lingering`]) and kept
    /// until the entry settles.
    ///
    /// [`AllocationData::lingering`]: super::model::AllocationData::lingering
    fn linger(&mut self, i: usize) {
        let job = &self.jobs[i];
        let (Some(rank), Some(allocation)) = (job.data.gang_rank, job.data.allocation) else { return };
        if !matches!(job.status, JobStatus::Assigned | JobStatus::Running) || !self.holds(allocation) {
            return;
        }
        // Under the session it was granted in: a node whose agent fenced (a new session, or none) killed it.
        let held = &self.allocations[&allocation.row];
        if !self.alive(held) {
            return;
        }
        let Some(session) = held.data.node_session else { return };
        let lingering = Lingering {
            job: job.data.id,
            task: job.data.task.clone(),
            gang_rank: rank,
            allocation: allocation.row,
            node: held.data.node,
            session,
        };
        self.lingering.push(lingering);
        let job = self.jobs[i].data.id;
        if let Some(held) = self.allocations.get_mut(&allocation.row) {
            held.data_mut().lingering = Some(job);
            self.dirty_allocations.insert(allocation.row);
        }
    }

    /// Drops the [`Lingering`] entries whose node's session ended (the agent fenced, or its lease expired): their
    /// processes died with it. Their allocations died with the session too ([`Pass::check_nodes`] releases them).
    fn settle_lingering(&mut self) {
        let sessions = &self.node_sessions;
        self.lingering.retain(|l| sessions.get(&l.node) == Some(&l.session));
    }

    /// The agent reported the end of `job` (its exit, its kill, or that it runs no process of it): a [`Lingering`]
    /// entry of it is settled, and the allocation kept for it, idle, goes back to the free ones (to this pass's
    /// pending jobs first), unless the all-or-nothing restart of this pass plans to reuse it (`deferred`: the
    /// report came behind the one that restarted the gang; [`Pass::gather`] gives it back if the incarnation
    /// waits). Released, it went to a reserved job, and the rank placed there by the planned reuse was then
    /// aborted "node lost" for a grant gone stale, restarting the gang once more.
    fn answered(&mut self, job: JobId) {
        for lingering in self.lingering.remove_job(job) {
            let row = lingering.allocation;
            let kept = self.allocations.get(&row).is_some_and(|a| {
                a.allocated && a.data.operation == Some(self.operation) && a.data.lingering == Some(job)
            });
            let planned = self.deferred.values().any(|(reuse, _)| reuse.row == row);
            if kept && !planned {
                self.release(row);
                self.recycled.push(row);
            }
        }
    }

    /// Releases allocation `row`, to be offered to this pass's pending jobs first, unless it is kept for a process
    /// that may still run there ([`Pass::kept_for_lingering`]).
    fn give_back_unless_kept(&mut self, row: RowId) {
        if !self.kept_for_lingering(row) {
            self.release(row);
            self.recycled.push(row);
        }
    }

    /// Releases allocation `row` unless it is kept for a process that may still run there ([`Pass::kept_for_lingering`]).
    fn release_unless_kept(&mut self, row: RowId) {
        if !self.kept_for_lingering(row) {
            self.release(row);
        }
    }

    /// Whether allocation `row`, held by this operation, is kept for a process that may still run there: marked
    /// with a job that a [`Lingering`] entry names.
    fn kept_for_lingering(&self, row: RowId) -> bool {
        let marked = self.allocations.get(&row).and_then(|a| a.data.lingering.filter(|_| a.allocated));
        marked.is_some_and(|job| self.lingering.holds_job(job))
    }

    /// The allocation row `job`'s (task, rank) must be placed in, if an aborted process of that rank may still
    /// run there (`None`: anywhere).
    fn lingering_row(&self, job: &JobData) -> Option<RowId> {
        if self.settings.lingering_gate_disabled_for_mutation_test {
            return None;
        }
        let rank = job.gang_rank?;
        self.lingering.allocation_of(&job.task, rank)
    }

    fn handle(&mut self, message: Message) {
        if let Message::JobEnded { job, .. } = &message {
            self.answered(*job);
        }
        match message {
            Message::JobStarted { job, allocation } => {
                if let Some(i) = self.current_job(job, allocation)
                    && self.jobs[i].status == JobStatus::Assigned
                {
                    self.set_job_status(i, JobStatus::Running, None);
                }
            }
            Message::JobEnded { job, allocation, outcome } => {
                if let Some(i) = self.current_job(job, allocation) {
                    self.job_ended(i, ending(outcome));
                }
            }
            Message::Abort { reason } => self.end(OperationStatus::Aborted, reason),
            Message::UpdateSpec { spec } => self.update_spec(*spec),
        }
    }

    /// A spec update: checked again against the spec now in force (another update may have come first); plain
    /// tasks whose job_count grew get jobs for the new cookies, and the jobs of removed cookies are aborted.
    fn update_spec(&mut self, spec: OperationSpec) {
        let violations = validate::update_violations(&self.data.spec, &spec);
        if !violations.is_empty() {
            let violations: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
            self.events.push((EVENT_SPEC_UPDATE_REFUSED.into(), json!({ "violations": violations })));
            return;
        }
        let old = std::mem::replace(&mut self.data.spec, spec);
        let mut changes = BTreeMap::new();
        for (name, task) in self.data.spec.tasks.clone() {
            let before = old.tasks[&name].job_count;
            if before == task.job_count {
                continue;
            }
            changes.insert(name.clone(), json!({ "from": before, "to": task.job_count }));
            for cookie in before..task.job_count {
                self.create_job(
                    &name,
                    PlannedJob { job_cookie: cookie, gang_rank: None, reserved: false, reuse: None },
                );
            }
            let removed: Vec<usize> = self
                .live_jobs()
                .into_iter()
                .filter(|&i| self.jobs[i].data.task == name && self.jobs[i].data.job_cookie >= task.job_count)
                .collect();
            for i in removed {
                if let Some(a) = self.jobs[i].data.allocation.filter(|a| self.holds(*a)) {
                    self.release(a.row);
                }
                self.end_job(i, JobStatus::Aborted, None, Some(REASON_JOB_COUNT_DECREASED.into()));
            }
        }
        self.events.push((EVENT_SPEC_UPDATED.into(), json!({ "job_count": changes })));
    }

    /// The live job `id` of the current incarnation placed in `allocation`; `None` means the message is about a
    /// job that ended, an older incarnation or an older placement, and is ignored (DESIGN §4).
    fn current_job(&self, id: JobId, allocation: AllocationRef) -> Option<usize> {
        // `jobs` are in index order: found by binary search.
        let i = self.jobs.binary_search_by_key(&id.index, |job| job.data.id.index).ok()?;
        let job = &self.jobs[i];
        if job.data.id != id {
            return None;
        }
        let current = !job.is_terminal()
            && job.data.incarnation == self.data.incarnation
            && job.data.allocation == Some(allocation);
        current.then_some(i)
    }

    /// A job ended: record it, then apply the rules of DESIGN §4 in order: count a failure (the operation fails at
    /// the limit, and a failing operation restarts nothing); a ranked gang job restarts the gang;
    /// `fail_on_job_restart` fails the operation instead of restarting a started job; else the job restarts
    /// alone, unless it completed and its task does not rerun completed jobs.
    fn job_ended(&mut self, i: usize, ending: Ending) {
        let was_started = self.jobs[i].status == JobStatus::Running;
        let (code, reason) = match &ending {
            Ending::Completed => (Some(0), None),
            Ending::Failed { code, reason } => (*code, Some(reason.clone())),
            Ending::Aborted { reason } => (None, Some(reason.clone())),
            Ending::Interrupted { reason } => (None, Some(format!("interrupted: {reason}"))),
        };
        self.end_job(i, ending.status(), code, reason);
        let job = self.jobs[i].data.clone();
        let spec = &self.data.spec;
        let task = spec.tasks[&job.task].clone();
        if matches!(ending, Ending::Failed { .. }) {
            self.data.failed_job_count += 1;
            if rules::failed_limit_reached(self.data.failed_job_count, spec.max_failed_job_count) {
                let reason = format!(
                    "failed jobs ({}) reached max_failed_job_count {} (last: job {})",
                    self.data.failed_job_count, spec.max_failed_job_count, job.id
                );
                self.end(OperationStatus::Failed, reason);
                return;
            }
        }
        if let Some(reason) = rules::gang_restart_trigger(&task, &job, &ending) {
            let node_lost = matches!(&ending, Ending::Aborted { reason } if reason == REASON_NODE_LOST);
            if node_lost && self.node_loss_limit_reached(i) {
                return;
            }
            self.begin_incarnation(reason, Some(i));
            return;
        }
        let restarted = ending != Ending::Completed;
        if restarted
            && spec.fails_on_restart(&task)
            && (was_started || matches!(ending, Ending::Failed { code: Some(_), .. }))
        {
            let reason = format!("job {} would be restarted and fail_on_job_restart is set", job.id);
            self.end(OperationStatus::Failed, reason);
            return;
        }
        let keeps_allocation = ending == Ending::Completed;
        let reruns = restarted || (job.reserved && !self.task_completed(&job.task)) || spec.restarts_completed(&task);
        let allocation = job.allocation.filter(|a| self.holds(*a));
        match allocation {
            Some(a) if keeps_allocation && (reruns || spec.is_gang()) => self.idle(a.row),
            Some(a) if keeps_allocation => {
                self.release(a.row);
                self.recycled.push(a.row);
            }
            Some(a) => self.release(a.row),
            None => {}
        }
        if reruns {
            let reuse = allocation.filter(|_| keeps_allocation).map(|a| (a, job.monitoring_descriptor.clone()));
            // A ranked job restarts alone only in a task without gang_options of a gang operation (a gang task's
            // ranked job restarts the gang instead): it keeps its rank, which is its cookie.
            let planned =
                PlannedJob { job_cookie: job.job_cookie, gang_rank: job.gang_rank, reserved: job.reserved, reuse };
            self.create_job(&job.task, planned);
        }
    }

    // ---- revival, nodes, completion, scheduling --------------------------------------------------------------

    /// Revival (DESIGN §4): every ranked job of a gang task of the current incarnation placed in an allocation
    /// must still be alive; if one is not, the gang restarts with no allocation reuse. A task without
    /// `gang_options` has ranked jobs too in a gang operation, but their loss never restarts the gang: one is
    /// aborted "node lost" and restarts alone like any other end of theirs.
    fn check_revival(&mut self) {
        let lacking = (0..self.jobs.len()).find(|&i| {
            let job = &self.jobs[i];
            job.data.gang_rank.is_some()
                && self.data.spec.tasks.get(&job.data.task).is_some_and(|t| t.is_gang())
                && job.data.incarnation == self.data.incarnation
                && matches!(job.status, JobStatus::Assigned | JobStatus::Running)
                && !self.job_alive(job)
        });
        if let Some(i) = lacking {
            self.end_job(i, JobStatus::Aborted, None, Some(SwitchReason::LackAfterRevival.to_string()));
            // The lacking job was lost with its node.
            if self.node_loss_limit_reached(i) {
                return;
            }
            self.begin_incarnation(SwitchReason::LackAfterRevival, Some(i));
        }
    }

    /// Counts a gang restart that job `i`, lost with its node, is about to cause; once the count reaches
    /// `max_node_loss_restart_count`, fails the operation instead and returns true.
    fn node_loss_limit_reached(&mut self, i: usize) -> bool {
        self.data.node_loss_restart_count += 1;
        let (count, max) = (self.data.node_loss_restart_count, self.data.spec.node_loss_restarts_max());
        if count < max {
            return false;
        }
        let job = &self.jobs[i].data;
        let node = job
            .allocation
            .and_then(|a| self.allocations.get(&a.row))
            .map_or_else(|| "?".to_string(), |a| a.data.node_name.clone());
        let reason = format!(
            "{NODE_LOSS_LIMIT_PREFIX} ({count}) reached max_node_loss_restart_count {max} (last: job {} on node {node}): \
             its nodes keep dying",
            job.id
        );
        self.end(OperationStatus::Failed, reason);
        true
    }

    /// Jobs whose node's session ended are aborted ("node lost"); idle allocations there are released.
    fn check_nodes(&mut self) {
        while self.status == OperationStatus::Running {
            let lost = (0..self.jobs.len()).find(|&i| {
                let job = &self.jobs[i];
                matches!(job.status, JobStatus::Assigned | JobStatus::Running) && !self.job_alive(job)
            });
            match lost {
                Some(i) => self.job_ended(i, Ending::Aborted { reason: REASON_NODE_LOST.into() }),
                None => break,
            }
        }
        let dead: Vec<RowId> =
            self.held_allocations().into_iter().filter(|row| !self.alive(&self.allocations[row])).collect();
        for row in dead {
            self.release(row);
        }
    }

    /// Whether task `name` completed in the current incarnation.
    fn task_completed(&self, name: &str) -> bool {
        let spec = &self.data.spec;
        let task = &spec.tasks[name];
        let jobs: Vec<&Job> = self
            .jobs
            .iter()
            .filter(|job| job.data.task == name && job.data.incarnation == self.data.incarnation)
            .collect();
        if task.is_gang() {
            rules::gang_task_completed(task, &jobs)
        } else {
            rules::plain_task_completed(spec, task, &jobs)
        }
    }

    /// The operation completes when every task did. Before that, a gang task that completed retires its reserved
    /// jobs: they are not waited for (DESIGN §4) and would otherwise hold allocations other tasks wait for. Their
    /// allocations stay, idle, for a later gang restart, unless a pending job needs one first.
    fn check_completion(&mut self) {
        let names: Vec<String> = self.data.spec.tasks.keys().cloned().collect();
        let completed: Vec<&String> = names.iter().filter(|name| self.task_completed(name)).collect();
        if completed.len() == names.len() {
            self.end(OperationStatus::Completed, "every task completed".into());
            return;
        }
        for name in completed {
            let reserved: Vec<usize> = self
                .live_jobs()
                .into_iter()
                .filter(|&i| self.jobs[i].data.task == *name && self.jobs[i].data.reserved)
                .collect();
            for i in reserved {
                self.end_job(i, JobStatus::Aborted, None, Some(REASON_GANG_COMPLETED.into()));
            }
        }
    }

    /// Pending jobs get allocations, ranked jobs first (DESIGN §4). An all-or-nothing incarnation none of whose
    /// ranked jobs was placed yet is first placed whole or not at all ([`Pass::gather`]); until it is, no job of the
    /// operation is placed.
    fn schedule(&mut self) {
        self.settle_lingering();
        let gate = self.all_or_nothing();
        if gate && !self.gathered() && !self.gather() {
            return;
        }
        // A gang placed whole (or an operation placed incrementally) never waits in the queue.
        self.leave_queue();
        self.data.waiting = None;
        let deferred: Vec<(usize, (AllocationRef, Option<String>))> =
            std::mem::take(&mut self.deferred).into_iter().collect();
        for (i, (allocation, descriptor)) in deferred {
            self.jobs[i].data_mut().monitoring_descriptor = descriptor;
            self.place(i, allocation);
        }
        let mut pending: Vec<usize> =
            (0..self.jobs.len()).filter(|&i| self.jobs[i].status == JobStatus::Pending).collect();
        pending.sort_by_key(|&i| rules::schedule_key(&self.jobs[i].data));
        for i in pending {
            if self.lingering_row(&self.jobs[i].data).is_some() {
                continue; // its rank's previous process may still run elsewhere
            }
            // A ranked job of an incarnation placed whole restores its gang: see the module docs of `placement`.
            let exempt = gate && self.jobs[i].data.gang_rank.is_some();
            let Some((allocation, session)) = self.next_free(exempt) else { break };
            self.grant(i, allocation, session);
        }
    }

    /// Whether a ranked job of the current incarnation was ever placed: an all-or-nothing incarnation places all of
    /// them in one pass, so then it was placed whole.
    fn gathered(&self) -> bool {
        self.jobs.iter().any(|job| {
            job.data.incarnation == self.data.incarnation
                && job.data.gang_rank.is_some()
                && job.data.allocation.is_some()
        })
    }

    /// The all-or-nothing gate: places every ranked job of the current incarnation now (in the allocations its
    /// restart planned to reuse, then in free ones), if the free allocations cover them beyond the reservation of
    /// the gangs ahead in the queue; else releases every allocation it holds (but those kept for a process that may
    /// still run there, until its agent answers) and waits in the queue ([`Pass::join_queue`]). An incarnation that
    /// needs more allocations than the live nodes and those expected back offer fails once that has lasted
    /// `unfit_timeout`. Returns whether the incarnation is placed.
    fn gather(&mut self) -> bool {
        let mut ranked: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                job.status == JobStatus::Pending
                    && job.data.incarnation == self.data.incarnation
                    && job.data.gang_rank.is_some()
            })
            .collect();
        ranked.sort_by_key(|&i| rules::schedule_key(&self.jobs[i].data));
        let need = ranked.len() as u32;
        let from_pool = ranked.iter().filter(|i| !self.deferred.contains_key(i)).count() as u32;
        let reserved = self.reservation();
        // A rank whose previous process may still run must go back to that process's allocation (its agent kills
        // before it starts), which only the reuse a restart planned does.
        let lingers = ranked.iter().any(|i| {
            self.lingering_row(&self.jobs[*i].data)
                .is_some_and(|row| self.deferred.get(i).is_none_or(|(reuse, _)| reuse.row != row))
        });
        if !lingers && self.pool_left() >= reserved + from_pool {
            let mut reused = 0;
            for &i in &ranked {
                if let Some((allocation, descriptor)) = self.deferred.remove(&i) {
                    self.jobs[i].data_mut().monitoring_descriptor = descriptor;
                    self.place(i, allocation);
                    reused += 1;
                }
            }
            for i in ranked {
                if self.jobs[i].status == JobStatus::Pending {
                    let (allocation, session) = self.take_from_pool().expect("the free allocations were counted");
                    self.grant(i, allocation, session);
                }
            }
            if !self.queue.is_empty() && from_pool > 0 {
                self.queue_relied_on = true;
            }
            let waited = self.data.waiting.as_ref().map_or(Duration::ZERO, |w| elapsed(w.since, self.now));
            self.events.push((
                EVENT_GANG_PLACED.into(),
                json!({ "incarnation": incarnation_id(self.operation, self.data.incarnation), "need": need,
                        "reused": reused, "waited_ms": waited.as_millis() as u64 }),
            ));
            return true;
        }
        // A waiting incarnation holds no allocation (the planned reuse included), but those kept, idle, until their
        // agents answer for a process that may still run there ([`Lingering`]).
        self.deferred.clear();
        for row in self.held_allocations() {
            if !self.kept_for_lingering(row) {
                self.release(row);
            }
        }
        let unfit_since = (need > self.possible_slots())
            .then(|| self.data.waiting.as_ref().and_then(|w| w.unfit_since).unwrap_or(self.now));
        if let Some(from) = unfit_since {
            let waited = elapsed(from, self.now);
            if waited >= self.settings.unfit_timeout {
                let reason = placement::unfit_reason(placement::Unfit {
                    index: self.data.incarnation,
                    need,
                    live: self.cluster_slots,
                    returning: self.returning_slots,
                    waited,
                    timeout: self.settings.unfit_timeout,
                    grace: self.settings.node_return_grace,
                });
                self.end(OperationStatus::Failed, reason);
                return false;
            }
        }
        let since = self.join_queue(need);
        self.data.waiting = Some(GangWait { since, need, unfit_since });
        false
    }

    /// Puts the current incarnation in the gang queue, unless it is there already; returns when it began to wait.
    /// First come, first placed, by when each operation began ([`QueueEntry::arrived`]): a gang that restarts waits
    /// ahead of the gangs whose operations began after its own (at the tail, a gang submitted after it
    /// took the slots it freed), and an operation waiting at its start joins at the tail.
    fn join_queue(&mut self, need: u32) -> Timestamp {
        let index = self.data.incarnation;
        if let Some(entry) = self.queue.iter_mut().find(|e| e.operation == self.operation) {
            if (entry.incarnation, entry.need) != (index, need) {
                (entry.incarnation, entry.need) = (index, need);
                self.queue_changed = true;
            }
            return entry.since;
        }
        let arrived = self.data.started_at.unwrap_or(self.now);
        let entry =
            QueueEntry { operation: self.operation, incarnation: index, need, since: self.now, arrived: Some(arrived) };
        // Ties (one store microsecond) go by row id: the operation inserted first.
        let key = (arrived, self.operation);
        let later = |e: &QueueEntry| (e.arrived.unwrap_or(e.since), e.operation) > key;
        let position = self.queue.iter().position(later).unwrap_or(self.queue.len());
        self.queue.insert(position, entry);
        self.queue_changed = true;
        self.events.push((
            EVENT_GANG_WAITING.into(),
            json!({ "incarnation": incarnation_id(self.operation, index), "need": need,
                    "position": position, "reserved_ahead": self.reservation(), "free": self.pool_left(),
                    "cluster_slots": self.cluster_slots, "returning_slots": self.returning_slots }),
        ));
        self.now
    }

    /// Takes this operation out of the gang queue, if it is in it.
    fn leave_queue(&mut self) {
        if let Some(at) = self.queue.iter().position(|e| e.operation == self.operation) {
            self.queue.remove(at);
            self.queue_changed = true;
        }
    }

    /// Free allocations held back for the waiting gangs ahead of this operation ([`placement::reserved_ahead`]).
    fn reservation(&self) -> u32 {
        placement::reserved_ahead(&self.queue, self.operation, self.possible_slots())
    }

    /// The most allocations an incarnation could ever get: those of the live nodes and of the nodes expected back
    /// ([`PlacementSettings::node_return_grace`]).
    fn possible_slots(&self) -> u32 {
        self.cluster_slots.saturating_add(self.returning_slots)
    }

    /// Allocations this pass may still grant from the free pool: the free ones read, and those released this pass
    /// by a completed job on a live node.
    fn pool_left(&self) -> u32 {
        let recycled = self
            .recycled
            .iter()
            .filter(|row| {
                self.allocations.get(row).is_some_and(|a| !a.allocated && self.node_sessions.contains_key(&a.data.node))
            })
            .count();
        (self.free.len() + recycled) as u32
    }

    /// Grants `allocation` (free, on a node whose live session is `session`) to this operation and places job `i`
    /// in it, with a fresh monitoring descriptor.
    fn grant(&mut self, i: usize, mut allocation: Allocation, session: LockToken) {
        assert!(!allocation.allocated, "allocation {} offered as free while allocated", allocation.row);
        allocation.allocated = true;
        allocation.data_mut().generation += 1;
        allocation.data_mut().operation = Some(self.operation);
        allocation.data_mut().node_session = Some(session);
        let row = allocation.row;
        let reference = allocation.current();
        self.allocations.insert(row, allocation);
        let descriptor = format!("{}/{}", self.operation, self.data.next_descriptor);
        self.data.next_descriptor += 1;
        self.jobs[i].data_mut().monitoring_descriptor = Some(descriptor);
        self.place(i, reference);
    }

    /// The next allocation for a pending job: from the free pool (a recycled one on a live node, else the next
    /// free one read) if the pool has more than the gang queue reserves ahead of this operation, or whatever the
    /// queue says when `exempt`; else one this operation holds idle (kept only for reuse at a gang restart; a
    /// pending job needs it more, and holding it could leave the operation waiting on itself).
    fn next_free(&mut self, exempt: bool) -> Option<(Allocation, LockToken)> {
        if (exempt || self.pool_left() > self.reservation())
            && let Some(found) = self.take_from_pool()
        {
            if !exempt && !self.queue.is_empty() {
                self.queue_relied_on = true;
            }
            return Some(found);
        }
        let idle = self.held_allocations().into_iter().find(|row| {
            let allocation = &self.allocations[row];
            allocation.data.job.is_none() && self.alive(allocation) && !self.kept_for_lingering(*row)
        })?;
        self.release(idle);
        let allocation = self.allocations.remove(&idle).expect("held");
        let session = self.node_sessions[&allocation.data.node];
        Some((allocation, session))
    }

    /// The next allocation of the free pool: a recycled one on a live node, else the next free one read.
    fn take_from_pool(&mut self) -> Option<(Allocation, LockToken)> {
        while let Some(row) = self.recycled.pop() {
            let allocation = self.allocations.remove(&row).expect("recycled allocations stay in the map");
            match self.node_sessions.get(&allocation.data.node) {
                Some(session) if !allocation.allocated => return Some((allocation, *session)),
                _ => {
                    self.allocations.insert(row, allocation);
                }
            }
        }
        self.free.pop()
    }

    // ---- jobs and allocations --------------------------------------------------------------------------------

    fn live_jobs(&self) -> Vec<usize> {
        (0..self.jobs.len()).filter(|&i| !self.jobs[i].is_terminal()).collect()
    }

    /// Rows of the allocations granted to this operation now (released ones stay in the map to be written).
    fn held_allocations(&self) -> Vec<RowId> {
        self.allocations.values().filter(|a| a.allocated).map(|a| a.row).collect()
    }

    /// Whether `allocation` is a grant this operation holds now.
    fn holds(&self, allocation: AllocationRef) -> bool {
        self.allocations.get(&allocation.row).is_some_and(|a| a.allocated && a.current() == allocation)
    }

    fn alive(&self, allocation: &Allocation) -> bool {
        let session = self.node_sessions.get(&allocation.data.node);
        session.is_some() && allocation.data.node_session.as_ref() == session
    }

    fn job_alive(&self, job: &Job) -> bool {
        match job.data.allocation {
            None => true,
            Some(a) => self.holds(a) && self.alive(&self.allocations[&a.row]),
        }
    }

    fn create_job(&mut self, task: &str, planned: PlannedJob) {
        let id = JobId { operation: self.operation, index: self.data.next_job_index };
        self.data.next_job_index += 1;
        let data = JobData {
            id,
            task: task.to_string(),
            job_cookie: planned.job_cookie,
            gang_rank: planned.gang_rank,
            reserved: planned.reserved,
            incarnation: self.data.incarnation,
            allocation: None,
            monitoring_descriptor: None,
            exit_code: None,
            reason: None,
        };
        self.jobs.push(Job { row: None, status: JobStatus::Pending, data: Arc::new(data) });
        self.dirty_jobs.push(false);
        let i = self.jobs.len() - 1;
        self.job_event(i, None, None);
        match planned.reuse {
            Some(reuse) if self.defer_reuse => {
                self.deferred.insert(i, reuse);
            }
            // A rank whose previous process may still run in another allocation waits, as any pending lingering
            // rank does (`schedule`), and the allocation planned for it goes back to the free ones (a
            // cookie whose previous jobs linger in two allocations, both kept, is planned into one of them).
            Some((allocation, _))
                if self.lingering_row(&self.jobs[i].data).is_some_and(|row| row != allocation.row) =>
            {
                self.give_back_unless_kept(allocation.row)
            }
            Some((allocation, descriptor)) => {
                self.jobs[i].data_mut().monitoring_descriptor = descriptor;
                self.place(i, allocation);
            }
            None => {}
        }
    }

    /// Puts job `i` in `allocation`, held by this operation: the allocation's agent runs it next. Placing a rank
    /// in the allocation where its previous process may still run settles that [`Lingering`] entry: the agent kills
    /// the old process before it starts the new one.
    ///
    /// Panics if an aborted process of the job's rank may still run in another allocation: every caller looks
    /// first ([`Pass::create_job`], [`Pass::schedule`], [`Pass::gather`]), so only a controller bug gets here.
    fn place(&mut self, i: usize, allocation: AllocationRef) {
        if let Some(row) = self.lingering_row(&self.jobs[i].data) {
            assert_eq!(
                row, allocation.row,
                "job {} placed in allocation {allocation} while its rank's previous process may still run in {row}",
                self.jobs[i].data.id
            );
            let (task, rank) = (self.jobs[i].data.task.clone(), self.jobs[i].data.gang_rank);
            if let Some(rank) = rank {
                self.lingering.remove_rank(&task, rank);
            }
        }
        let incarnation = self.incarnation_id(self.jobs[i].data.incarnation);
        let held = self.allocations.get_mut(&allocation.row).expect("placing a job in an allocation not held");
        assert_eq!(held.current(), allocation, "placing job {} in a stale grant", self.jobs[i].data.id);
        let data = &self.jobs[i].data;
        held.data_mut().last = Some(LastJob {
            job: data.id,
            task: data.task.clone(),
            job_cookie: data.job_cookie,
            gang_rank: data.gang_rank,
            monitoring_descriptor: data.monitoring_descriptor.clone(),
        });
        let launch = JobLaunch {
            job: data.id,
            environment: job_environment_of(&self.data.spec, data, incarnation.clone()),
            incarnation,
            task: data.task.clone(),
            job_cookie: data.job_cookie,
            gang_rank: data.gang_rank,
            command: self.data.spec.tasks[&data.task].command.clone(),
            file_paths: self.data.spec.tasks[&data.task].file_paths.clone(),
        };
        held.data_mut().job = Some(Arc::new(launch));
        // Its agent kills any process still in it before it starts this one.
        held.data_mut().lingering = None;
        self.dirty_allocations.insert(allocation.row);
        self.jobs[i].data_mut().allocation = Some(allocation);
        self.set_job_status(i, JobStatus::Assigned, None);
    }

    /// The allocation stays granted with no job to run (its agent stops any process still in it).
    fn idle(&mut self, row: RowId) {
        if let Some(allocation) = self.allocations.get_mut(&row) {
            allocation.data_mut().job = None;
            self.dirty_allocations.insert(row);
        }
    }

    /// The allocation goes back to its node's free slots.
    fn release(&mut self, row: RowId) {
        if let Some(allocation) = self.allocations.get_mut(&row) {
            allocation.allocated = false;
            allocation.data_mut().operation = None;
            allocation.data_mut().node_session = None;
            allocation.data_mut().job = None;
            allocation.data_mut().last = None;
            allocation.data_mut().lingering = None;
            self.dirty_allocations.insert(row);
        }
    }

    fn end_job(&mut self, i: usize, status: JobStatus, code: Option<i32>, reason: Option<String>) {
        assert!(status.is_terminal());
        let id = self.jobs[i].data.id;
        if let Some(a) = self.jobs[i].data.allocation
            && let Some(allocation) = self.allocations.get_mut(&a.row)
            && allocation.current() == a
            && allocation.data.job.as_ref().is_some_and(|launch| launch.job == id)
        {
            allocation.data_mut().job = None;
            self.dirty_allocations.insert(a.row);
        }
        self.jobs[i].data_mut().exit_code = code;
        self.set_job_status(i, status, reason);
    }

    fn set_job_status(&mut self, i: usize, to: JobStatus, reason: Option<String>) {
        let from = self.jobs[i].status;
        assert!(!from.is_terminal(), "job {} changes status after it ended ({from} → {to})", self.jobs[i].data.id);
        self.jobs[i].status = to;
        if reason.is_some() {
            self.jobs[i].data_mut().reason = reason.clone();
        }
        self.dirty_jobs[i] = true;
        self.job_event(i, Some(from), reason);
    }

    /// The id of incarnation `index` of the operation ([`incarnation_id`]), formatted only when it is not the one
    /// asked for last.
    fn incarnation_id(&mut self, index: u32) -> String {
        if self.incarnation.0 != index {
            self.incarnation = (index, incarnation_id(self.operation, index));
        }
        self.incarnation.1.clone()
    }

    fn job_event(&mut self, i: usize, from: Option<JobStatus>, reason: Option<String>) {
        let incarnation = self.incarnation_id(self.jobs[i].data.incarnation);
        let job = &self.jobs[i];
        let data = json!({
            "job": job.data.id.to_text(), "task": job.data.task, "job_cookie": job.data.job_cookie,
            "gang_rank": job.data.gang_rank, "reserved": job.data.reserved,
            "incarnation": incarnation,
            "allocation": job.data.allocation.map(|a| a.to_text()),
            "from": from, "to": job.status, "reason": reason,
        });
        self.events.push((EVENT_JOB_STATE.into(), data));
    }
}

/// Routes one of a pass's rows at its end (`Pass::finish`): into `written` when the pass `dirty`-ed it (its
/// apply writes it), into `kept` when `left` (it stays in what the pass leaves, `PassOutput::left`); a clone only
/// when both.
fn written_and_left<T: Clone>(item: T, dirty: bool, left: bool, written: &mut Vec<T>, kept: &mut Vec<T>) {
    match (dirty, left) {
        (true, true) => {
            written.push(item.clone());
            kept.push(item);
        }
        (true, false) => written.push(item),
        (false, true) => kept.push(item),
        (false, false) => {}
    }
}

fn ending(outcome: JobOutcome) -> Ending {
    match outcome {
        JobOutcome::Exited { code: 0 } => Ending::Completed,
        JobOutcome::Exited { code } => Ending::Failed { code: Some(code), reason: format!("exit code {code}") },
        JobOutcome::StartFailed { message } => Ending::Failed { code: None, reason: message },
        JobOutcome::Aborted { reason } => Ending::Aborted { reason },
        JobOutcome::Interrupted { reason } => Ending::Interrupted { reason },
    }
}

/// Time from `from` to `to` on the store's clock (zero if `to` is earlier).
fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_micros((to.as_micros() - from.as_micros()).max(0) as u64)
}
