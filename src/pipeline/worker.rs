//! A worker: takes one leased item at a time and runs load → process → guarded apply (dstack PIPELINES,
//! "Typical worker structure"; DESIGN §3, Worker).
//!
//! The refetch goes to the pipeline's refetch batcher, which may read it in one store call with other workers'
//! refetches; the worker waits for its row. With apply batching on, the worker hands its apply to the pipeline's
//! apply batcher and takes its next item while the apply waits for its batch and the store; a small task of its own
//! finishes the item (counters, and the lease leaves the ledger) once the outcome arrives. The worker's loop
//! ends only after every such task has: a drain waits for the applies of the items the worker started.
//!
//! An item that fails (its handler returns `WorkError::Failed`, panics, or writes a value the store refuses) fails
//! alone: the worker records the failure on the row at once by a guarded write ([`Store::record_failure`]: one more
//! attempt, the error, a backoff or the pipeline's failed status, as its [`RetryPolicy`](super::RetryPolicy) and the
//! handler's [`Handler::retry`] decide), logs it with the row id, and goes on with its next item (DESIGN §3).

use super::Core;
use super::batcher::PendingApply;
use super::handler::{Failure, Handler, LoadCx, RetryDecision, WorkError};
use super::metrics::Metrics;
use super::queue::Item;
use crate::buggify::{self, Point};
use crate::store::{ApplyOutcome, ApplyParams, FailureOutcome, FailureParams, Lease, Retry, Store, StoreError};
use futures_util::FutureExt;
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How one item ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemOutcome {
    /// The guarded apply wrote the result.
    Applied,
    /// The lease was lost (locally, at refetch, or at apply): nothing was written.
    Stale,
    /// A related lock was contended: the lease was reset for retry. `behind_other_replica`: the rows that turned
    /// it away were all held by items of its own pipeline in another replica ([`WorkError::ContendedReset`]),
    /// which lengthens the contention streak ([`Shared::note_ended`](super::queue::Shared::note_ended)).
    Retried {
        /// Whether the rows were held by items of its own pipeline in another replica (see above).
        behind_other_replica: bool,
    },
    /// A related lock was contended and the item was parked in its replica with its lease (DESIGN §3, "Parked
    /// waiters"): a wake, or the expiry of the lock it met, queues it again.
    Parked,
    /// The store failed (unavailable, timed out): the lease is left to expire and no attempt is counted.
    Failed,
    /// The item failed (handler error, panic, refused value): the failure was recorded on the row, which is
    /// retried after its backoff.
    BackedOff,
    /// The item failed for the last time: the row took its pipeline's failed status.
    GaveUp,
}

/// Runs one item through its handler. Never panics, whatever the handler does: a failure of the item is recorded
/// on its row (see the module doc), a store error leaves the lease to expire; either is logged and counted.
pub async fn work<S: Store, H: Handler<S>>(core: &Core<S>, handler: &H, item: Item) -> ItemOutcome {
    let lease = item.lease;
    let outcome = match work_leased(core, handler, item).await {
        Step::Done(outcome) => outcome,
        Step::Park(parking) => park(core, *parking).await,
        Step::Applying(applying) => applying.finish(core, handler).await,
    };
    record(core, lease, outcome);
    outcome
}

/// An item turned away by a contended related lock, to be parked (see [`WorkError::Parked`]).
struct Parking {
    item: Item,
    rows: Vec<crate::store::RowId>,
    until: Option<std::time::Duration>,
    behind_other_replica: bool,
}

/// Parks an item whose related lock was contended until a wake or the expiry of the lock it met (plus the fetch's
/// expiry slack; with no expiry known, `retry_delay`); an item that cannot be parked (no room, stopping, lease
/// lost) is reset for retry as before.
async fn park<S: Store>(core: &Core<S>, parking: Parking) -> ItemOutcome {
    let Parking { item, rows, until, behind_other_replica } = parking;
    let lease = item.lease;
    let config = &core.config;
    let wait = until.map_or(config.retry_delay, |until| until + config.fetch_expiry_slack);
    match core.shared.park(item, rows, core.clock.now() + wait) {
        true => {
            core.shared.note_ended(behind_other_replica);
            ItemOutcome::Parked
        }
        false => match core.store.reset_for_retry(lease, config.retry_delay).await {
            Ok(true) => ItemOutcome::Retried { behind_other_replica },
            Ok(false) => ItemOutcome::Stale,
            Err(error) => failed(&config.name, lease, WorkError::Store(error)),
        },
    }
}

/// Counts how an item ended and drops its lease from the ledger.
fn record<S: Store>(core: &Core<S>, lease: Lease, outcome: ItemOutcome) {
    if outcome == ItemOutcome::Parked {
        // The lease stays in the ledger, renewed while the item waits; the item's turns go to the next in line.
        Metrics::bump(&core.metrics.parked);
        core.waitlist.release(lease);
        return;
    }
    match outcome {
        ItemOutcome::Parked => {}
        ItemOutcome::Applied => Metrics::bump(&core.metrics.applied),
        ItemOutcome::Stale => Metrics::bump(&core.metrics.stale),
        ItemOutcome::Retried { .. } => Metrics::bump(&core.metrics.retries),
        ItemOutcome::Failed => Metrics::bump(&core.metrics.errors),
        ItemOutcome::BackedOff => Metrics::bump(&core.metrics.failures),
        ItemOutcome::GaveUp => {
            Metrics::bump(&core.metrics.failures);
            Metrics::bump(&core.metrics.gave_up);
        }
    }
    core.shared.forget(lease);
    core.shared.note_ended(outcome == ItemOutcome::Retried { behind_other_replica: true });
    core.waitlist.release(lease);
}

/// Where an item's work stopped: done, or handed to the batcher with its apply not yet answered.
enum Step {
    Done(ItemOutcome),
    Park(Box<Parking>),
    Applying(Box<Applying>),
}

/// An item whose guarded apply was handed over (or is to be made, with batching off), and what follows it.
struct Applying {
    lease: Lease,
    /// The row's failures in a row when it was loaded (for the attempt number should the apply be refused).
    attempts: u32,
    /// A copy of the apply to send again after it succeeds (buggify).
    repeat: Option<ApplyParams>,
    started: Instant,
    apply: Apply,
}

enum Apply {
    /// Batching off: the store call, still to be made.
    Direct(ApplyParams),
    /// Batching on: handed to the batcher.
    Pending(PendingApply),
}

impl Applying {
    /// Waits for the apply's outcome (an apply that applied published the item's fetch hints); an apply the store
    /// refused (a bad value) is the item's failure.
    async fn finish<S: Store, H: Handler<S>>(self, core: &Core<S>, handler: &H) -> ItemOutcome {
        // The store calls below are boxed: their futures (a PgStore call's is kilobytes) would otherwise be part
        // of this one's, which a handed-over apply's task carries, and tokio copies a task's future when it spawns
        // it. The common path (a pending apply that applies) awaits only the small `outcome`.
        let applied = match self.apply {
            Apply::Direct(params) => Box::pin(core.batcher.apply(params)).await,
            Apply::Pending(pending) => pending.outcome().await,
        };
        core.metrics.apply_latency.record(core.clock.now().duration_since(self.started));
        match applied {
            Ok(ApplyOutcome::Applied { .. }) => {
                if let Some(params) = self.repeat {
                    // A retried apply: the first one cleared the token, so this one must be stale. The simulator's
                    // checkers, not this worker, judge what the store did with it.
                    let _ = Box::pin(core.store.apply(params)).await;
                }
                ItemOutcome::Applied
            }
            Ok(ApplyOutcome::Stale) => ItemOutcome::Stale,
            Err(error) => Box::pin(fail(core, handler, self.lease, self.attempts, WorkError::Store(error))).await,
        }
    }
}

async fn work_leased<S: Store, H: Handler<S>>(core: &Core<S>, handler: &H, item: Item) -> Step {
    let lease = item.lease;
    let name = &core.config.name;
    // 1. A lease the heartbeater gave up on (or whose local deadline passed in the queue) may be another
    //    holder's by now: do nothing with it.
    let clock = &core.clock;
    if !core.shared.holds(lease, clock.now()) {
        return Step::Done(ItemOutcome::Stale);
    }
    // 2. Load: refetch by id + token, batched with other workers' refetches (unless the config trusts the fetched
    //    row, see `PipelineConfig::refetch` and `refetch_after`), then the handler's reads and related locks.
    let waited = clock.now().duration_since(item.fetched_at);
    let row = if core.config.refetch && waited >= core.config.refetch_after {
        match core.refetcher.refetch(lease).await {
            Ok(Some(row)) => row,
            Ok(None) => return Step::Done(ItemOutcome::Stale),
            Err(error) => return Step::Done(failed(name, lease, WorkError::Store(error))),
        }
    } else {
        item.row
    };
    let attempts = row.attempts;
    let cx = LoadCx::new(core, lease);
    // The handler's bound (`PipelineConfig::handler_timeout`) covers `load` and `process`; the ledger carries it, so
    // that the heartbeater renews the lease no longer than the handler may run.
    let timeout = core.config.handler_timeout;
    let cut = (!timeout.is_zero()).then(|| core.shared.start_handler(lease, clock.now() + timeout));
    let context = match within(core, cut.as_deref(), unwound(core, lease, handler.load(&row, &cx))).await {
        Ok(context) => context,
        Err(WorkError::Parked { rows, until, behind_other_replica }) => {
            core.shared.end_handler(lease);
            let item = Item { row, lease, fetched_at: item.fetched_at };
            return Step::Park(Box::new(Parking { item, rows, until, behind_other_replica }));
        }
        Err(error) => {
            core.shared.end_handler(lease);
            return Step::Done(stopped(core, handler, lease, attempts, error).await);
        }
    };
    // 3. Process, holding no store call.
    let started = clock.now();
    let changes = within(core, cut.as_deref(), unwound(core, lease, handler.process(row, context))).await;
    core.shared.end_handler(lease);
    core.metrics.process_latency.record(clock.now().duration_since(started));
    // A related update must be of a row this item locked: else the store finds it not carrying the token and
    // refuses the apply as stale, at every pass, with nothing recorded on the row.
    let changes = match changes.and_then(|changes| cx.unlocked(&changes.related).map(|()| changes)) {
        Ok(changes) => changes,
        Err(error) => return Step::Done(stopped(core, handler, lease, attempts, error).await),
    };
    // 4. Guarded apply, batched with other workers' applies (each still guarded by its own token, and by every
    //    related lock the item took: what it read under them is what it applies to).
    let params = ApplyParams {
        lease,
        update: changes.update,
        related: changes.related,
        locked: cx.locked_rows(),
        inserts: changes.inserts,
        events: changes.events,
        hints: changes.hints,
    };
    if buggify::fires(Point::ApplyStall) {
        // A worker stalled before its apply: only the heartbeater keeps the lease meanwhile.
        clock.sleep(core.config.lease_ttl).await;
    }
    let repeat = buggify::fires(Point::ApplyRepeat).then(|| params.clone());
    let started = clock.now();
    let apply = if core.batcher.is_batching() {
        Apply::Pending(core.batcher.submit(params).await)
    } else {
        Apply::Direct(params)
    };
    Step::Applying(Box::new(Applying { lease, attempts, repeat, started, apply }))
}

/// `call` (a handler's `load` or `process`) until `cut` (`None`: unbounded), the signal the heartbeater gives once
/// the handler ran past its `handler_timeout` ([`Shared::cut_handlers`](super::queue::Shared::cut_handlers)):
/// then the call is dropped and fails its item. A call that blocks its thread cannot be dropped; when it returns at
/// last, its result goes on to the guarded apply, which finds it stale if another holder took the row meanwhile
/// (the heartbeater stopped renewing the lease at the deadline).
async fn within<S: Store, T>(
    core: &Core<S>,
    cut: Option<&tokio::sync::Notify>,
    call: impl Future<Output = Result<T, WorkError>>,
) -> Result<T, WorkError> {
    let Some(cut) = cut else { return call.await };
    // Biased: a call that is ready wins over a signal that came while both waited (a paused process).
    tokio::select! {
        biased;
        result = call => result,
        () = cut.notified() => {
            let bound = crate::duration::format(core.config.handler_timeout);
            Err(WorkError::Failed(format!("the handler did not return within its handler_timeout ({bound})")))
        }
    }
}

/// `call` (a handler's `load` or `process`), with a panic in it turned into [`WorkError::Panicked`]: the panic
/// fails its item, not its worker (DESIGN §3). Counted in `panics` and logged with the row id.
async fn unwound<S: Store, T>(
    core: &Core<S>,
    lease: Lease,
    call: impl Future<Output = Result<T, WorkError>>,
) -> Result<T, WorkError> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            Metrics::bump(&core.metrics.panics);
            let message = panic_message(panic.as_ref());
            let pipeline = &core.config.name;
            tracing::error!(%pipeline, row = %lease.id, token = %lease.token, panic = %message, "handler panicked");
            Err(WorkError::Panicked(message))
        }
    }
}

/// The text of a panic's payload (`panic!` with a literal or a format string), or a placeholder.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => text.to_string(),
        (None, Some(text)) => text.clone(),
        (None, None) => "a panic with a payload that is not text".to_string(),
    }
}

/// The load or process phase stopped with `error`.
async fn stopped<S: Store, H: Handler<S>>(
    core: &Core<S>,
    handler: &H,
    lease: Lease,
    attempts: u32,
    error: WorkError,
) -> ItemOutcome {
    match error {
        WorkError::Contended => match core.store.reset_for_retry(lease, core.config.retry_delay).await {
            Ok(true) => ItemOutcome::Retried { behind_other_replica: false },
            Ok(false) => ItemOutcome::Stale,
            Err(error) => failed(&core.config.name, lease, WorkError::Store(error)),
        },
        WorkError::ContendedReset { held: true, behind_other_replica } => ItemOutcome::Retried { behind_other_replica },
        WorkError::ContendedReset { held: false, .. } | WorkError::Stale => ItemOutcome::Stale,
        error => fail(core, handler, lease, attempts, error).await,
    }
}

/// The item of `lease`, whose row had failed `attempts` times in a row, failed with `error`. An item failure is
/// recorded on the row by a guarded write, with the delay or give-up that the handler's [`Handler::retry`] and the
/// pipeline's policy decide; any other error leaves the lease to expire.
async fn fail<S: Store, H: Handler<S>>(
    core: &Core<S>,
    handler: &H,
    lease: Lease,
    attempts: u32,
    error: WorkError,
) -> ItemOutcome {
    let pipeline = &core.config.name;
    if !error.is_item_failure() {
        return failed(pipeline, lease, error);
    }
    let attempt = attempts.saturating_add(1);
    let policy = &core.config.retry;
    let give_up = Retry::GiveUp { status: policy.failed_status.clone() };
    let retry = match handler.retry(&Failure { row: lease.id, attempt, error: &error }) {
        RetryDecision::Policy if policy.gives_up_at(attempt) => give_up,
        RetryDecision::Policy => Retry::After(policy.backoff(attempt, core.retry_draw())),
        RetryDecision::After(delay) => Retry::After(delay),
        RetryDecision::GiveUp => give_up,
    };
    let retry_in = match retry {
        Retry::After(delay) => Some(delay),
        Retry::GiveUp { .. } => None,
    };
    let gives_up = retry_in.is_none();
    let (row, token) = (lease.id, lease.token);
    match &retry {
        Retry::After(delay) => {
            tracing::warn!(%pipeline, %row, %token, attempt, %error, retry_in = ?delay, "item failed; retried later")
        }
        Retry::GiveUp { status } => {
            tracing::error!(%pipeline, %row, %token, attempt, %error, %status, "item failed; given up")
        }
    }
    let params = FailureParams { lease, error: error.to_string(), retry };
    match core.store.record_failure(params).await {
        Ok(FailureOutcome::Recorded { .. }) if gives_up => ItemOutcome::GaveUp,
        Ok(FailureOutcome::Recorded { .. }) => {
            if let Some(delay) = retry_in.filter(|_| !core.config.retry_wake_disabled_for_mutation_test) {
                let now = core.clock.now();
                core.shared.note_retry(now + delay + core.config.fetch_expiry_slack, now);
            }
            ItemOutcome::BackedOff
        }
        Ok(FailureOutcome::Stale) => ItemOutcome::Stale,
        Err(store) => failed(pipeline, lease, WorkError::Store(store)),
    }
}

/// A failure that is not the item's (the store failed): logged, and the lease left to expire.
fn failed(pipeline: &str, lease: Lease, error: WorkError) -> ItemOutcome {
    debug_assert!(!matches!(error, WorkError::Store(StoreError::Invalid(_))), "an Invalid store error is the item's");
    tracing::warn!(%pipeline, row = %lease.id, token = %lease.token, %error, "item failed; lease left to expire");
    ItemOutcome::Failed
}

/// A worker's loop: items until the pipeline stops taking work, then waits for the applies it handed over.
pub async fn run<S: Store, H: Handler<S>>(core: Core<S>, handler: Arc<H>) {
    let mut finishing: Vec<Finishing> = Vec::new();
    while let Some(item) = core.shared.pop(&core.clock).await {
        let lease = item.lease;
        match work_leased(&core, handler.as_ref(), item).await {
            Step::Done(outcome) => record(&core, lease, outcome),
            Step::Park(parking) => {
                let outcome = park(&core, *parking).await;
                record(&core, lease, outcome);
            }
            Step::Applying(applying) if matches!(applying.apply, Apply::Direct(_)) => {
                let outcome = applying.finish(&core, handler.as_ref()).await;
                record(&core, lease, outcome);
            }
            Step::Applying(applying) => {
                finishing.retain(|task| !task.0.is_finished());
                let (core, handler) = (core.clone(), handler.clone());
                let finish = async move {
                    let outcome = applying.finish(&core, handler.as_ref()).await;
                    record(&core, lease, outcome);
                };
                let size = std::mem::size_of_val(&finish);
                debug_assert!(size <= FINISH_FUTURE_BYTES_MAX, "a handed-over apply's task is {size} bytes");
                finishing.push(Finishing(tokio::spawn(finish)));
            }
        }
    }
    for task in finishing.iter_mut() {
        let _ = (&mut task.0).await;
    }
}

/// Largest a handed-over apply's task may be, in bytes (debug builds assert it at every spawn). tokio copies a
/// task's future as it spawns it, once per item here: with the store calls of `Applying::finish` inline, a PgStore
/// pipeline's task was 20 392 bytes and its copies a tenth of the replica's CPU (docs/benchmarks-history.md,
/// "Third round"); boxed, 984.
const FINISH_FUTURE_BYTES_MAX: usize = 2048;

/// The task finishing one handed-over apply; aborted if dropped unfinished (the worker was aborted, as a crash
/// would end it), so nothing of an aborted pipeline runs on.
struct Finishing(JoinHandle<()>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.abort();
    }
}
