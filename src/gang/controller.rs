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
//! 6. pending jobs get free allocations, ranked jobs first.

use super::env::job_environment;
use super::model::{
    Allocation, AllocationRef, Job, JobData, JobId, JobLaunch, JobOutcome, JobStatus, LastJob, Message, OperationData,
    OperationStatus, incarnation_id,
};
use super::rules::{self, Ending, HeldAllocation, PlannedJob, SwitchReason};
use super::spec::OperationSpec;
use super::validate;
use crate::store::{LockToken, RowId};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

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
/// Event kind: the operation's status changed (data: from, to, reason).
pub const EVENT_OPERATION_STATE: &str = "operation_state_changed";

/// Abort reason of the jobs a gang restart ends (DESIGN §4).
pub const REASON_INCARNATION_CHANGED: &str = "incarnation changed";
/// Abort reason of a reserved job whose gang task completed.
pub const REASON_GANG_COMPLETED: &str = "gang task completed";
/// Abort reason of a job whose node's session ended.
pub const REASON_NODE_LOST: &str = "node lost";

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
    /// Every job of the operation, in creation order.
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
}

/// Runs one pass (see the module docs for its order).
pub fn run_pass(input: PassInput) -> PassOutput {
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
    jobs: Vec<Job>,
    dirty_jobs: BTreeSet<usize>,
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
}

impl Pass {
    fn new(input: PassInput) -> Pass {
        let mut jobs = input.jobs;
        jobs.sort_by_key(|job| job.data.id.index);
        let mut free = input.free;
        free.reverse(); // popped from the back
        Pass {
            operation: input.operation,
            status: input.status,
            data: input.data,
            jobs,
            dirty_jobs: BTreeSet::new(),
            allocations: input.allocations.into_iter().map(|a| (a.row, a)).collect(),
            dirty_allocations: BTreeSet::new(),
            messages: input.messages,
            free,
            recycled: Vec::new(),
            node_sessions: input.node_sessions,
            revival: input.revival,
            consumed: Vec::new(),
            events: Vec::new(),
        }
    }

    fn finish(self) -> PassOutput {
        let mut updated_jobs = Vec::new();
        let mut new_jobs = Vec::new();
        for (i, job) in self.jobs.into_iter().enumerate() {
            match job.row {
                None => new_jobs.push(job),
                Some(_) if self.dirty_jobs.contains(&i) => updated_jobs.push(job),
                Some(_) => {}
            }
        }
        let mut allocations = self.allocations;
        let allocations = self.dirty_allocations.iter().filter_map(|row| allocations.remove(row)).collect();
        PassOutput {
            status: self.status,
            data: self.data,
            updated_jobs,
            new_jobs,
            allocations,
            consumed: self.consumed,
            events: self.events,
        }
    }

    // ---- lifecycle -------------------------------------------------------------------------------------------

    fn start(&mut self) {
        self.set_status(OperationStatus::Running, None);
        self.begin_incarnation(SwitchReason::OperationStarted, None);
    }

    fn set_status(&mut self, to: OperationStatus, reason: Option<String>) {
        let from = self.status;
        assert!(!from.is_terminal(), "operation {} changes status after it ended ({from} → {to})", self.operation);
        self.status = to;
        if to.is_terminal() {
            self.data.result = reason.clone();
        }
        self.events.push((EVENT_OPERATION_STATE.into(), json!({ "from": from, "to": to, "reason": reason })));
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
        self.set_status(to, Some(reason));
    }

    /// Starts an incarnation: index 0 at the start, else the next one after aborting every live job. Jobs are
    /// planned per task by [`rules::plan_task`] over the allocations that may be reused.
    fn begin_incarnation(&mut self, reason: SwitchReason, trigger: Option<usize>) {
        if reason != SwitchReason::OperationStarted {
            self.data.incarnation += 1;
            for i in self.live_jobs() {
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
        for name in tasks {
            let plan = rules::plan_task(&self.data.spec.tasks[&name], held.remove(&name).unwrap_or_default());
            for allocation in plan.released {
                self.release(allocation.row);
            }
            for planned in plan.jobs {
                self.create_job(&name, planned);
            }
        }
        for (_, orphans) in held {
            for h in orphans {
                self.release(h.allocation.row);
            }
        }
    }

    // ---- messages --------------------------------------------------------------------------------------------

    fn handle(&mut self, message: Message) {
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
        let i = self.jobs.iter().position(|job| job.data.id == id)?;
        let job = &self.jobs[i];
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
                    "{} failed jobs reached max_failed_job_count {} (last: job {})",
                    self.data.failed_job_count, spec.max_failed_job_count, job.id
                );
                self.end(OperationStatus::Failed, reason);
                return;
            }
        }
        if let Some(reason) = rules::gang_restart_trigger(&task, &job, &ending) {
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
            let planned = PlannedJob { job_cookie: job.job_cookie, gang_rank: None, reserved: job.reserved, reuse };
            self.create_job(&job.task, planned);
        }
    }

    // ---- revival, nodes, completion, scheduling --------------------------------------------------------------

    /// Revival (DESIGN §4): every ranked job of the current incarnation placed in an allocation must still be
    /// alive; if one is not, the gang restarts with no allocation reuse.
    fn check_revival(&mut self) {
        let lacking = (0..self.jobs.len()).find(|&i| {
            let job = &self.jobs[i];
            job.data.gang_rank.is_some()
                && job.data.incarnation == self.data.incarnation
                && matches!(job.status, JobStatus::Assigned | JobStatus::Running)
                && !self.job_alive(job)
        });
        if let Some(i) = lacking {
            self.end_job(i, JobStatus::Aborted, None, Some(SwitchReason::LackAfterRevival.to_string()));
            self.begin_incarnation(SwitchReason::LackAfterRevival, Some(i));
        }
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

    /// Pending jobs get free allocations, ranked jobs first (DESIGN §4).
    fn schedule(&mut self) {
        let mut pending: Vec<usize> =
            (0..self.jobs.len()).filter(|&i| self.jobs[i].status == JobStatus::Pending).collect();
        pending.sort_by_key(|&i| rules::schedule_key(&self.jobs[i].data));
        for i in pending {
            let Some((mut allocation, session)) = self.next_free() else { break };
            assert!(!allocation.allocated, "allocation {} offered as free while allocated", allocation.row);
            allocation.allocated = true;
            allocation.data.generation += 1;
            allocation.data.operation = Some(self.operation);
            allocation.data.node_session = Some(session);
            let row = allocation.row;
            let reference = allocation.current();
            self.allocations.insert(row, allocation);
            let descriptor = format!("{}/{}", self.operation, self.data.next_descriptor);
            self.data.next_descriptor += 1;
            self.jobs[i].data.monitoring_descriptor = Some(descriptor);
            self.place(i, reference);
        }
    }

    /// The next allocation to grant: a recycled one on a live node, else the next free one read, else one this
    /// operation holds idle (kept only for reuse at a gang restart; a pending job needs it more, and holding it
    /// could leave the operation waiting on itself).
    fn next_free(&mut self) -> Option<(Allocation, LockToken)> {
        while let Some(row) = self.recycled.pop() {
            let allocation = self.allocations.remove(&row).expect("recycled allocations stay in the map");
            match self.node_sessions.get(&allocation.data.node) {
                Some(session) if !allocation.allocated => return Some((allocation, *session)),
                _ => {
                    self.allocations.insert(row, allocation);
                }
            }
        }
        if let Some(free) = self.free.pop() {
            return Some(free);
        }
        let idle = self.held_allocations().into_iter().find(|row| {
            let allocation = &self.allocations[row];
            allocation.data.job.is_none() && self.alive(allocation)
        })?;
        self.release(idle);
        let allocation = self.allocations.remove(&idle).expect("held");
        let session = self.node_sessions[&allocation.data.node];
        Some((allocation, session))
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
        self.jobs.push(Job { row: None, status: JobStatus::Pending, data });
        let i = self.jobs.len() - 1;
        self.job_event(i, None, None);
        if let Some((allocation, descriptor)) = planned.reuse {
            self.jobs[i].data.monitoring_descriptor = descriptor;
            self.place(i, allocation);
        }
    }

    /// Puts job `i` in `allocation`, held by this operation: the allocation's agent runs it next.
    fn place(&mut self, i: usize, allocation: AllocationRef) {
        let held = self.allocations.get_mut(&allocation.row).expect("placing a job in an allocation not held");
        assert_eq!(held.current(), allocation, "placing job {} in a stale grant", self.jobs[i].data.id);
        let data = &self.jobs[i].data;
        held.data.last = Some(LastJob {
            job: data.id,
            task: data.task.clone(),
            job_cookie: data.job_cookie,
            gang_rank: data.gang_rank,
            monitoring_descriptor: data.monitoring_descriptor.clone(),
        });
        let launch = JobLaunch {
            job: data.id,
            incarnation: incarnation_id(self.operation, data.incarnation),
            task: data.task.clone(),
            job_cookie: data.job_cookie,
            gang_rank: data.gang_rank,
            command: self.data.spec.tasks[&data.task].command.clone(),
            environment: job_environment(&self.data.spec, data),
            file_paths: self.data.spec.tasks[&data.task].file_paths.clone(),
        };
        held.data.job = Some(launch);
        self.dirty_allocations.insert(allocation.row);
        self.jobs[i].data.allocation = Some(allocation);
        self.set_job_status(i, JobStatus::Assigned, None);
    }

    /// The allocation stays granted with no job to run (its agent stops any process still in it).
    fn idle(&mut self, row: RowId) {
        if let Some(allocation) = self.allocations.get_mut(&row) {
            allocation.data.job = None;
            self.dirty_allocations.insert(row);
        }
    }

    /// The allocation goes back to its node's free slots.
    fn release(&mut self, row: RowId) {
        if let Some(allocation) = self.allocations.get_mut(&row) {
            allocation.allocated = false;
            allocation.data.operation = None;
            allocation.data.node_session = None;
            allocation.data.job = None;
            allocation.data.last = None;
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
            allocation.data.job = None;
            self.dirty_allocations.insert(a.row);
        }
        self.jobs[i].data.exit_code = code;
        self.set_job_status(i, status, reason);
    }

    fn set_job_status(&mut self, i: usize, to: JobStatus, reason: Option<String>) {
        let from = self.jobs[i].status;
        assert!(!from.is_terminal(), "job {} changes status after it ended ({from} → {to})", self.jobs[i].data.id);
        self.jobs[i].status = to;
        if reason.is_some() {
            self.jobs[i].data.reason = reason.clone();
        }
        self.dirty_jobs.insert(i);
        self.job_event(i, Some(from), reason);
    }

    fn job_event(&mut self, i: usize, from: Option<JobStatus>, reason: Option<String>) {
        let job = &self.jobs[i];
        let data = json!({
            "job": job.data.id.to_string(), "task": job.data.task, "job_cookie": job.data.job_cookie,
            "gang_rank": job.data.gang_rank, "reserved": job.data.reserved,
            "incarnation": incarnation_id(self.operation, job.data.incarnation),
            "allocation": job.data.allocation.map(|a| a.to_string()),
            "from": from, "to": job.status, "reason": reason,
        });
        self.events.push((EVENT_JOB_STATE.into(), data));
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
