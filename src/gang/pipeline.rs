//! The operation pipeline: the gang controller as a pipeline over `operation` rows (DESIGN §3, §4).
//!
//! One pass over one operation:
//! 1. load: read the current incarnation's jobs, the unconsumed inbox, the gang queue, then the store's `now`, the
//!    nodes, and the allocations granted to the operation and the free ones (the queue before the allocations: see
//!    step 3), each through an indexed [`Store::query`], so a pass costs what the operation has now, not its
//!    history; decide whether this pass is a *revival* (a job of the operation still carries the related
//!    lock of a pass whose lease expired before it applied: that holder died or stalled mid-pass). A replica whose
//!    own last pass wrote the operation's data (its lease token is in it, [`OperationData::written_by`]) takes the
//!    jobs and granted allocations as that pass left them (`gang::last_pass`: no one else writes them) and reads
//!    only the ids of the job rows that pass inserted and the incarnation's first job, whose lock tells a revival.
//!    Otherwise job and allocation rows are decoded only when their version changed since this replica's last read
//!    ([`Row::version`]);
//! 2. run [`run_pass`] (pure) on what was read;
//! 3. lock what the pass writes: the jobs it writes, the incarnation's first job (every pass locks it, so that a
//!    pass that dies after its locks leaves its token where the next pass looks; in a revival, every live job) and
//!    the consumed messages as children (`lock_related`, owner = the pipeline); the gang queue row alone, if the
//!    pass writes it, and re-read it: if its version is not the one read, another pass changed the queue or spent
//!    free allocations since, and this pass is contended and retried ([`super::placement`]); then the allocations
//!    it grants, reassigns or releases as shared resources (`lock_shared`, owner `operations:{id}`), and re-read
//!    those it took from the free list: if another operation took one between the read and the lock, the pass is
//!    contended and retried;
//! 4. process returns the pass's writes as [`Changes`], applied guarded by the lease, with a fetch hint for
//!    `allocation` so agents see their new jobs at once.
//!
//! Jobs, inbox messages and held allocations have no other writer while the operation's lease is held: agents and
//! write APIs only insert inbox rows. Free allocations are the one resource operations contend for.

use super::controller::{PassInput, PassOutput, run_pass};
use super::decoded::{Fresh, KeptRows};
use super::last_pass::LastPass;
use super::model::{
    ALLOCATION_FREE, Allocation, INBOX_DONE, INBOX_NEW, Job, KIND_ALLOCATION, KIND_INBOX, KIND_JOB, KIND_NODE,
    KIND_OPERATION, Message, NodeData, OperationData, OperationStatus, node_lease_owner,
};
use super::node_watch::live_sessions;
use super::placement::{GANG_QUEUE_STATUS, GangQueue, KIND_GANG_QUEUE, PlacementSettings, canonical_queue};
use crate::pipeline::{Changes, Handler, LoadCx, PipelineConfig, RetryPolicy, WorkError};
use crate::store::{LockToken, NewEvent, NewRow, RelatedUpdate, Row, RowId, RowQuery, RowUpdate, Store, Timestamp};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Name (and lock owner) of the operation pipeline.
pub const OPERATION_PIPELINE: &str = "operations";

/// The operation pipeline's config: rows of kind `operation` in `starting` or `running`, every other field at its
/// default (a running operation is looked at every `min_processing_interval`, 5 s, and at once on a hint from an
/// agent's report or a write API) but the retry policy, [`operation_retry_policy`].
pub fn operation_pipeline_config() -> PipelineConfig {
    let statuses = [OperationStatus::Starting.as_str(), OperationStatus::Running.as_str()];
    let config = PipelineConfig::new(OPERATION_PIPELINE, KIND_OPERATION, &statuses);
    PipelineConfig { retry: operation_retry_policy(&config), ..config }
}

/// The operation pipeline's retry policy: a pass that fails never fails its operation. An operation ends only by
/// the rules of DESIGN §4 (its jobs, `max_failed_job_count`, an abort), so the pass is retried for ever
/// (`attempts_max: None`), backing off from 1 s to at most `min_processing_interval` (5 s): a failing operation is
/// looked at no less often than a healthy running one, and a cured cause is picked up within one interval.
/// `failed_status` is never used; it names the operation status the controller itself sets on failure.
pub fn operation_retry_policy(config: &PipelineConfig) -> RetryPolicy {
    RetryPolicy {
        attempts_max: None,
        backoff_max: config.min_processing_interval,
        failed_status: OperationStatus::Failed.as_str().to_string(),
        ..RetryPolicy::default()
    }
}

/// The controller's [`Handler`] for operation rows. Clones share one `Decoded` cache and its counters.
#[derive(Clone, Debug)]
pub struct OperationHandler {
    pipeline: String,
    settings: PlacementSettings,
    decoded: Arc<Decoded>,
}

impl OperationHandler {
    /// A handler for the pipeline named `pipeline` (the name its config gives, which is the lock owner of the
    /// related rows it locks), with the default [`PlacementSettings`]. Use [`OPERATION_PIPELINE`] with
    /// [`operation_pipeline_config`].
    pub fn new(pipeline: impl Into<String>) -> OperationHandler {
        OperationHandler { pipeline: pipeline.into(), settings: PlacementSettings::default(), decoded: Arc::default() }
    }

    /// Job and allocation rows this handler's passes decoded so far (every clone's), and those they read but took
    /// decoded from the previous pass because the row's version had not changed since: what a test counts to see
    /// that a pass decodes what changed, not what it read.
    pub fn decode_counts(&self) -> DecodeCounts {
        DecodeCounts {
            decoded: self.decoded.decoded.load(Ordering::Relaxed),
            reused: self.decoded.reused.load(Ordering::Relaxed),
            known: self.decoded.known.load(Ordering::Relaxed),
        }
    }

    /// The same handler with `settings` (the placement default of gang operations, the unfit timeout).
    pub fn with_settings(mut self, settings: PlacementSettings) -> OperationHandler {
        self.settings = settings;
        self
    }
}

impl Default for OperationHandler {
    fn default() -> Self {
        OperationHandler::new(OPERATION_PIPELINE)
    }
}

/// What load hands to process: the pass's writes.
#[derive(Debug)]
pub struct Pass {
    operation: RowId,
    /// The pass's lease token, written into the operation's data ([`OperationData::written_by`]).
    token: LockToken,
    output: PassOutput,
    /// The gang queue row and its data as the pass writes it, if it does (locked, version raised).
    queue: Option<(RowId, GangQueue)>,
}

fn failed(error: impl std::fmt::Display) -> WorkError {
    WorkError::Failed(error.to_string())
}

impl<S: Store> Handler<S> for OperationHandler {
    type Context = Pass;

    async fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> Result<Pass, WorkError> {
        let store = cx.store();
        let operation = row.id;
        let status = OperationStatus::parse(&row.status).ok_or_else(|| failed(format!("status {:?}", row.status)))?;
        let data = OperationData::from_row(row).map_err(failed)?;
        let token = cx.lease().token;
        // Decoded rows of this replica's previous pass over the operation, taken out for this pass (a pass of
        // another operation never waits on it) and put back with what this pass read once its reads are done.
        let mut kept = self.decoded.take(operation);
        // What this replica's last pass left, if that pass's apply wrote the data read: then no job or granted
        // allocation was written since, and this pass reads only what changed (`super::last_pass`). A pass that
        // fails from here on leaves nothing to the next, which reads everything.
        let mut last = kept.last.take().filter(|last| data.written_by == Some(last.token) && data.granted.is_some());
        let known = last.as_mut().map(|last| std::mem::take(&mut last.allocations));
        let jobs = match last {
            Some(last) => self.known_jobs(store, (operation, &data), last, token, &mut kept).await?,
            None => self.read_jobs(store, (operation, &data), token, &mut kept).await?,
        };
        // Messages are decoded where they are read: a gang restart of 10 000 jobs consumes 20 000 of them.
        let inbox = RowQuery::new(KIND_INBOX).parent(operation).statuses([INBOX_NEW]);
        let read_message = |r: &Row| (r.id, Message::from_row(r));
        let mut messages = Vec::new();
        for (id, message) in store.query_map(vec![inbox], read_message).await?.pop().ok_or_else(no_answer)? {
            messages.push((id, message.map_err(failed)?));
        }
        // Before the allocations: a pass that spends free allocations after this read raises the queue's version,
        // so this pass's own lock of the queue finds out (module docs, step 3).
        let queue_read = canonical_queue(&store.list(KIND_GANG_QUEUE, None).await?).map_err(failed)?;
        let now = store.now().await?;
        let nodes = store.list(KIND_NODE, None).await?;
        let node_sessions = live_sessions(&nodes, now);
        let slots = node_slots(&nodes);
        // Every live node offers one allocation row per slot: its agent inserts them before it takes its lease.
        let cluster_slots = slots.iter().filter(|(node, _)| node_sessions.contains_key(node)).map(|(_, n)| n).sum();
        let returning = returning_nodes(&nodes, &node_sessions, now, self.settings.node_return_grace);
        let returning_slots = slots.iter().filter(|(node, _)| returning.contains(node)).map(|(_, n)| n).sum();
        let owner = format!("{}:{operation}", self.pipeline);
        let read_allocation = |r: &Row| AllocationRead {
            row: r.id,
            free: r.status == ALLOCATION_FREE,
            lockable: lockable(r, &owner, now),
            allocation: kept.allocations.read(r, Allocation::from_row),
        };
        let reads = allocation_rows(store, &data, known.is_none(), read_allocation).await?;
        let reads: Vec<_> = reads
            .into_iter()
            .map(|read| {
                let allocation = self.decoded.keep(&mut kept.allocations, read.row, read.allocation);
                (read.free, read.lockable, allocation)
            })
            .collect();
        // Every read is done: what this pass read is what the next one compares with. A pass that took its jobs and
        // granted allocations from the last pass read only some rows: it keeps the rest as they are.
        if known.is_none() {
            kept.jobs.end();
            kept.allocations.end();
        }
        self.decoded.put(operation, kept);
        let mut allocations = known.unwrap_or_default();
        self.decoded.count_known(allocations.len());
        let mut free = Vec::new();
        for (free_now, lockable_now, allocation) in reads {
            let allocation = allocation.map_err(failed)?;
            let node = allocation.data.node;
            if allocation.allocated && allocation.data.operation == Some(operation) {
                allocations.push(allocation);
            } else if free_now
                && lockable_now
                && slots.get(&node).is_some_and(|n| allocation.data.slot < *n)
                && let Some(session) = node_sessions.get(&node)
            {
                free.push((allocation, *session));
            }
        }
        // Operations start their search at different free allocations, so two passes rarely want the same one.
        if !free.is_empty() {
            let start = operation.0.unsigned_abs() as usize % free.len();
            free.rotate_left(start);
        }
        let offered: BTreeMap<RowId, u64> = free.iter().map(|(a, _)| (a.row, a.data.generation)).collect();
        let JobsRead { jobs, revival } = jobs;
        // The rows of what the pass was given that it locks whatever it writes (`children`).
        let given = JobsGiven::of(&jobs, revival);
        let input = PassInput {
            operation,
            status,
            data,
            jobs,
            allocations,
            messages,
            free,
            node_sessions,
            revival,
            now,
            queue: queue_read.as_ref().map(|(_, q)| q.entries.clone()).unwrap_or_default(),
            cluster_slots,
            returning_slots,
            settings: self.settings.clone(),
        };
        let mut output = run_pass(input);

        let children = children(given, &output);
        if !children.is_empty() {
            cx.lock_related(children).await?;
        }
        let queue = match &output.queue {
            None => None,
            Some(entries) => Some(lock_queue(cx, queue_read.as_ref(), entries.clone()).await?),
        };
        let written: Vec<RowId> = output.allocations.iter().map(|a| a.row).collect();
        if !written.is_empty() {
            cx.lock_shared(written.clone()).await?;
        }
        // Those taken from the free list must still be free and of the generation read, now that they are locked:
        // read back in one query (a get per row was a round trip each, and a 10 000-job gang's first pass outlasted
        // its liveness bound in the simulator waiting for 10 000 of them: a new user's trial, `tests/sim_gang.rs`).
        let taken: Vec<RowId> = written.iter().copied().filter(|row| offered.contains_key(row)).collect();
        if !taken.is_empty() {
            let still_free = |r: &Row| {
                let allocation = Allocation::from_row(r).ok();
                (r.id, allocation.is_some_and(|a| !a.allocated && Some(&a.data.generation) == offered.get(&r.id)))
            };
            let query = RowQuery::new(KIND_ALLOCATION).ids(taken.iter().copied());
            let read: BTreeMap<RowId, bool> =
                store.query_map(vec![query], still_free).await?.pop().ok_or_else(no_answer)?.into_iter().collect();
            if taken.iter().any(|row| read.get(row) != Some(&true)) {
                return Err(WorkError::Contended);
            }
        }
        let last = LastPass::after(token, &mut output);
        self.decoded.stage(operation, last);
        Ok(Pass { operation, token, output, queue })
    }

    async fn process(&self, _row: Row, pass: Pass) -> Result<Changes, WorkError> {
        if pass.output.status.is_terminal() {
            self.decoded.forget(pass.operation);
        }
        Ok(changes(pass))
    }
}

/// Whether a pass whose shared lock owner is `owner` (`{pipeline}:{operation}`) could lock the free allocation
/// `row` now: no live lease or intent mark of another holder. A lock left by a pass that died has expired and does
/// not count, or the slot would leak.
fn lockable(row: &Row, owner: &str, now: Timestamp) -> bool {
    let live = row.lock_expires_at.is_some_and(|expires| expires > now);
    let ours = row.lock_owner.as_deref() == Some(owner);
    !live || (ours && row.lock_token.is_none())
}

/// What a pass needs of an allocation row: its decoded data (or that the last pass's still holds), and whether it
/// is free and lockable now.
struct AllocationRead {
    row: RowId,
    free: bool,
    lockable: bool,
    allocation: Fresh<Allocation>,
}

/// How many job and allocation rows passes decoded, and how many they read unchanged and took from `Decoded`
/// instead ([`OperationHandler::decode_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeCounts {
    /// Rows decoded from their data.
    pub decoded: u64,
    /// Rows read at the version a previous pass had decoded them at, not decoded again.
    pub reused: u64,
    /// Rows taken as this replica's last pass left them, neither decoded nor read (but for the ids of the job rows
    /// its apply inserted): that pass's apply wrote the operation's data, so no one wrote them since
    /// (`gang::last_pass`).
    pub known: u64,
}

/// Job and allocation rows as this replica's last pass over each operation decoded them, with the version of the
/// row they were decoded from (decoding every job and allocation of a 10 000-job incarnation was most of
/// every pass of a gang restart, though each pass changes a few of them).
///
/// An entry is used only for a row read at the [`Row::version`] and `updated_at` it was decoded at (and the same
/// status), which every store changes at each write of the row's status or data: so what a pass decides never
/// depends on the cache, and a row written since by anyone (another replica that took the operation over, a pass
/// of this replica that applied or not, an agent) is decoded again. The id is the key and the kind the query's.
/// (Comparing the data itself instead cost about what decoding it did: the allocations' job launches.) A pass
/// keeps only the rows it read, so a finished incarnation's rows leave with it; an operation's entry is dropped
/// when its pass ends it, and at most [`OPERATIONS_DECODED_MAX`] operations are kept.
#[derive(Debug, Default)]
struct Decoded {
    operations: Mutex<BTreeMap<RowId, OperationRows>>,
    decoded: AtomicU64,
    reused: AtomicU64,
    known: AtomicU64,
}

/// Most operations whose rows `Decoded` keeps: beyond it, the lowest operation ids are dropped (their next pass
/// decodes every row, as without the cache).
pub const OPERATIONS_DECODED_MAX: usize = 64;

/// The decoded rows of one operation's last pass, by row id, and what the last pass left.
#[derive(Debug, Default)]
struct OperationRows {
    jobs: KeptRows<Job>,
    allocations: KeptRows<Allocation>,
    /// The jobs and granted allocations as this replica's last pass that got past its locks left them, should its
    /// apply have applied.
    last: Option<LastPass>,
}

impl Decoded {
    /// The rows kept for `operation`, taken out (empty if none).
    fn take(&self, operation: RowId) -> OperationRows {
        self.operations.lock().unwrap_or_else(PoisonError::into_inner).remove(&operation).unwrap_or_default()
    }

    /// Keeps `rows` as `operation`'s, dropping the lowest operation ids beyond [`OPERATIONS_DECODED_MAX`].
    fn put(&self, operation: RowId, rows: OperationRows) {
        let mut operations = self.operations.lock().unwrap_or_else(PoisonError::into_inner);
        operations.insert(operation, rows);
        while operations.len() > OPERATIONS_DECODED_MAX {
            operations.pop_first();
        }
    }

    /// Keeps `last` as what `operation`'s last pass left.
    fn stage(&self, operation: RowId, last: LastPass) {
        let mut operations = self.operations.lock().unwrap_or_else(PoisonError::into_inner);
        operations.entry(operation).or_default().last = Some(last);
        while operations.len() > OPERATIONS_DECODED_MAX {
            operations.pop_first();
        }
    }

    /// Counts `rows` rows taken from what the last pass left.
    fn count_known(&self, rows: usize) {
        self.known.fetch_add(rows as u64, Ordering::Relaxed);
    }

    /// Forgets `operation`'s rows (it ended: no pass will read them).
    fn forget(&self, operation: RowId) {
        self.operations.lock().unwrap_or_else(PoisonError::into_inner).remove(&operation);
    }

    /// The value of row `id` as `read` found it ([`KeptRows::keep`]), counted.
    fn keep<T: Clone>(
        &self,
        kept: &mut KeptRows<T>,
        id: RowId,
        read: Fresh<T>,
    ) -> Result<T, super::model::DecodeError> {
        let counter = if matches!(read, Fresh::Unchanged(_)) { &self.reused } else { &self.decoded };
        counter.fetch_add(1, Ordering::Relaxed);
        kept.keep(id, read)
    }
}

/// The jobs a pass is given (in row order), and whether the pass is a revival: a job it read still carries the
/// related lock of a pass whose lease expired before it applied.
struct JobsRead {
    jobs: Vec<Job>,
    revival: bool,
}

impl OperationHandler {
    /// Reads every job of the current incarnation (those after `jobs_after`) and decodes those written since this
    /// replica's last read ([`KeptRows`]), where they are read (`query_map`): no row is copied whole.
    async fn read_jobs<S: Store>(
        &self,
        store: &S,
        (operation, data): (RowId, &OperationData),
        token: LockToken,
        kept: &mut OperationRows,
    ) -> Result<JobsRead, WorkError> {
        let query = RowQuery::new(KIND_JOB).parent(operation).after(data.jobs_after);
        kept.jobs.begin();
        kept.allocations.begin();
        let read = |r: &Row| (r.id, self.locked_by_a_lost_pass(r, token), kept.jobs.read(r, Job::from_row));
        let rows = store.query_map(vec![query], read).await?.pop().ok_or_else(no_answer)?;
        let revival = rows.iter().any(|(_, lost, _)| *lost);
        let mut jobs = Vec::with_capacity(rows.len());
        for (id, _, job) in rows {
            jobs.push(self.decoded.keep(&mut kept.jobs, id, job).map_err(failed)?);
        }
        Ok(JobsRead { jobs, revival })
    }

    /// The jobs as this replica's last pass left them (`last`), with the rows its apply inserted, whose ids are
    /// read (in one call, with the first job of the incarnation: the rows a pass that died after its locks left its
    /// token on, [`children`]). Errors: `Failed` if the store holds another number of job rows after the last pass's
    /// than its apply inserted (then the next pass reads every job).
    async fn known_jobs<S: Store>(
        &self,
        store: &S,
        (operation, data): (RowId, &OperationData),
        last: LastPass,
        token: LockToken,
        kept: &mut OperationRows,
    ) -> Result<JobsRead, WorkError> {
        let after = last.rows_after(data.jobs_after);
        let mut queries = vec![RowQuery::new(KIND_JOB).parent(operation).after(after)];
        queries.extend(last.first_job().map(|row| RowQuery::new(KIND_JOB).ids([row])));
        // Debug builds decode the inserted rows, to check that they hold the jobs the last pass inserted.
        let read = |r: &Row| {
            (r.id, self.locked_by_a_lost_pass(r, token), cfg!(debug_assertions).then(|| Job::from_row(r).ok()))
        };
        let answers = store.query_map(queries, read).await?;
        let revival = answers.iter().flatten().any(|(_, lost, _)| *lost);
        let inserted = answers.first().ok_or_else(no_answer)?;
        let rows: Vec<RowId> = inserted.iter().map(|(id, _, _)| *id).collect();
        let expected = last.inserted.len();
        let jobs = last.into_jobs(&rows).ok_or_else(|| {
            failed(format!(
                "operation {operation}: {} job rows after row {after:?}, but its last pass inserted {expected}",
                rows.len()
            ))
        })?;
        for ((id, _, decoded), job) in inserted.iter().zip(&jobs[jobs.len() - rows.len()..]) {
            debug_assert!(
                decoded.as_ref().is_none_or(|row| row.as_ref() == Some(job)),
                "job row {id} is not what the last pass of operation {operation} inserted"
            );
        }
        // Jobs of finished incarnations are never read again.
        kept.jobs.forget_through(data.jobs_after);
        self.decoded.count_known(jobs.len());
        Ok(JobsRead { jobs, revival })
    }

    /// Whether `row` still carries a related lock of this pipeline from a lease other than `token`: the pass that
    /// took it never applied, reset or released, so its holder lost the lease mid-pass (DESIGN §4, revival).
    fn locked_by_a_lost_pass(&self, row: &Row, token: LockToken) -> bool {
        row.lock_owner.as_deref() == Some(self.pipeline.as_str()) && row.lock_token.is_some_and(|t| t != token)
    }
}

fn no_answer() -> WorkError {
    failed("the store answered no query")
}

/// The allocation rows a pass may use, by id, in one read, as `read` makes them: those granted to the operation
/// when its last pass applied (`data.granted`; unless `granted` is false: the pass has them from the last pass) and
/// the free ones; every allocation for an operation whose data predates the list.
async fn allocation_rows<S: Store, T: Send>(
    store: &S,
    data: &OperationData,
    granted: bool,
    read: impl Fn(&Row) -> T + Send + Sync,
) -> Result<Vec<T>, WorkError> {
    let Some(ids) = &data.granted else {
        return Ok(store.list(KIND_ALLOCATION, None).await?.iter().map(read).collect());
    };
    let mut queries = vec![RowQuery::new(KIND_ALLOCATION).statuses([ALLOCATION_FREE])];
    if granted {
        queries.insert(0, RowQuery::new(KIND_ALLOCATION).ids(ids.iter().copied()));
    }
    let mut rows: Vec<(RowId, T)> =
        store.query_map(queries, |row| (row.id, read(row))).await?.into_iter().flatten().collect();
    // A granted row that is free again (it is not, while the operation's passes are its only writer) is read once.
    rows.sort_by_key(|(id, _)| *id);
    rows.dedup_by_key(|(id, _)| *id);
    Ok(rows.into_iter().map(|(_, read)| read).collect())
}

/// The job rows a pass locks whatever it writes, from the jobs it was given (taken before [`run_pass`] consumes
/// them): the first job of the incarnation (their lowest row) and, in a revival, every live one.
struct JobsGiven {
    first: Option<RowId>,
    live: Vec<RowId>,
}

impl JobsGiven {
    fn of(jobs: &[Job], revival: bool) -> JobsGiven {
        let first = jobs.iter().filter_map(|job| job.row).min();
        let live = match revival {
            true => jobs.iter().filter(|job| !job.is_terminal()).filter_map(|job| job.row).collect(),
            false => Vec::new(),
        };
        JobsGiven { first, live }
    }
}

/// The rows a pass locks as its children (owner: the pipeline; DESIGN §3, related locks): the jobs it writes; the
/// first job of the incarnation (`given.first`), so that a pass that dies after its locks leaves its token where
/// every later pass looks (revival, [`OperationHandler::locked_by_a_lost_pass`]); in a revival every live job too
/// (`given.live`), so that none keeps the dead pass's token (it locked only the jobs it wrote, all live when it read
/// them); and the messages it consumes. By id. A pass locks no job it does not write (a gang restart's
/// passes locked and unlocked 10 000 jobs each).
fn children(given: JobsGiven, output: &PassOutput) -> Vec<RowId> {
    let mut rows: Vec<RowId> =
        Vec::with_capacity(output.updated_jobs.len() + 1 + given.live.len() + output.consumed.len());
    rows.extend(output.updated_jobs.iter().filter_map(|job| job.row));
    rows.extend(given.first);
    rows.extend(given.live);
    rows.extend(output.consumed.iter().copied());
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// Locks the gang queue row alone (so a contended lock leaves no intent mark on it) and checks that it is still
/// as the pass read it (`read`: its row and data; `None`: there was none, and then one is created now, empty).
/// Returns the row and the data to write: `entries`, version raised. Errors: [`WorkError::Contended`] if another
/// pass holds the queue or wrote it since the read; the store's.
async fn lock_queue<S: Store>(
    cx: &LoadCx<'_, S>,
    read: Option<&(RowId, GangQueue)>,
    entries: Vec<super::placement::QueueEntry>,
) -> Result<(RowId, GangQueue), WorkError> {
    let store = cx.store();
    let (row, version) = match read {
        Some((row, queue)) => (*row, queue.version),
        None => {
            let data = GangQueue::default().to_json();
            store.insert(NewRow::new(KIND_GANG_QUEUE, GANG_QUEUE_STATUS, data)).await?;
            // Two passes may both have created one: every pass uses the lowest.
            let rows = store.list(KIND_GANG_QUEUE, None).await?;
            let (row, queue) = canonical_queue(&rows).map_err(failed)?.expect("a gang queue row was just inserted");
            if queue != GangQueue::default() {
                return Err(WorkError::Contended);
            }
            (row, 0)
        }
    };
    cx.lock_shared(vec![row]).await?;
    let now = store.get(row).await?.ok_or_else(|| failed(format!("the gang queue row {row} is gone")))?;
    if GangQueue::from_row(&now).map_err(failed)?.version != version {
        return Err(WorkError::Contended);
    }
    Ok((row, GangQueue { version: version + 1, entries }))
}

/// The nodes expected back ([`PlacementSettings::node_return_grace`]): no live session, and their agent's lease
/// expired less than `grace` ago (store clock). A lease given back (a graceful stop, or a fence whose release
/// answered) leaves no expiry: such a node is not waited for (a fenced agent takes a new session at once).
fn returning_nodes(
    nodes: &[Row],
    live: &BTreeMap<RowId, LockToken>,
    now: Timestamp,
    grace: std::time::Duration,
) -> std::collections::BTreeSet<RowId> {
    let recent = |expired: Timestamp| now.as_micros().saturating_sub(expired.as_micros()) < grace.as_micros() as i64;
    nodes
        .iter()
        .filter(|node| !live.contains_key(&node.id))
        .filter(|node| node.lock_owner.as_deref() == Some(node_lease_owner(&node.status).as_str()))
        .filter(|node| node.lock_expires_at.is_some_and(recent))
        .map(|node| node.id)
        .collect()
}

fn node_slots(nodes: &[Row]) -> BTreeMap<RowId, u32> {
    use serde::Deserialize;
    let slots = |node: &Row| NodeData::deserialize(&node.data).map(|d| d.slots).unwrap_or(0);
    nodes.iter().map(|node| (node.id, slots(node))).collect()
}

/// The pass's writes as the engine's [`Changes`].
fn changes(pass: Pass) -> Changes {
    let Pass { operation, token, mut output, queue } = pass;
    output.data.written_by = Some(token);
    let update = RowUpdate { status: Some(output.status.as_str().into()), data: Some(output.data.to_json()) };
    let mut changes = Changes { update, ..Changes::default() };
    let related = output.updated_jobs.len() + output.allocations.len() + output.consumed.len() + 1;
    changes.related.reserve_exact(related);
    changes.inserts.reserve_exact(output.new_jobs.len());
    changes.events.reserve_exact(output.events.len());
    for job in &output.updated_jobs {
        let id = job.row.expect("an updated job has a row");
        let update = RowUpdate { status: Some(job.status.as_str().into()), data: Some(job.data_json()) };
        changes.related.push(RelatedUpdate { id, update });
    }
    for allocation in &output.allocations {
        let update = RowUpdate { status: Some(allocation.status().into()), data: Some(allocation.data_json()) };
        changes.related.push(RelatedUpdate { id: allocation.row, update });
    }
    for id in &output.consumed {
        changes.related.push(RelatedUpdate { id: *id, update: RowUpdate::status(INBOX_DONE) });
    }
    if let Some((row, queue)) = queue {
        let update = RowUpdate { status: None, data: Some(queue.to_json()) };
        changes.related.push(RelatedUpdate { id: row, update });
    }
    for job in &output.new_jobs {
        changes.inserts.push(NewRow::new(KIND_JOB, job.status.as_str(), job.data_json()).with_parent(operation));
    }
    for (kind, data) in output.events {
        changes.events.push(NewEvent { row_id: operation, kind, data });
    }
    if !output.allocations.is_empty() {
        changes.hints.push(KIND_ALLOCATION.into());
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_pipeline_never_gives_up_and_backs_off_at_most_its_processing_interval() {
        let config = operation_pipeline_config();
        config.validate().unwrap();
        assert_eq!(config.retry.attempts_max, None, "a failed pass must never fail its operation");
        assert!(!config.retry.gives_up_at(u32::MAX));
        assert_eq!(config.retry.backoff(u32::MAX, 1.0), config.min_processing_interval);
    }
}
