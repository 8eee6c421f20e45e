//! A worker: takes one leased item at a time and runs load → process → guarded apply (dstack PIPELINES,
//! "Typical worker structure"; DESIGN §3, Worker).
//!
//! The refetch goes to the pipeline's refetch batcher, which may read it in one store call with other workers'
//! refetches; the worker waits for its row. With apply batching on, the worker hands its apply to the pipeline's
//! apply batcher and takes its next item while the apply waits for its batch and the store; a small task of its own
//! finishes the item (hints, counters, and the lease leaves the ledger) once the outcome arrives. The worker's loop
//! ends only after every such task has: a drain waits for the applies of the items the worker started.

use super::Core;
use super::batcher::PendingApply;
use super::handler::{Handler, LoadCx, WorkError};
use super::metrics::Metrics;
use super::queue::Item;
use crate::buggify::{self, Point};
use crate::store::{ApplyOutcome, ApplyParams, Lease, Store};
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
    /// A related lock was contended: the lease was reset for retry.
    Retried,
    /// The handler or the store failed: the lease is left to expire.
    Failed,
}

/// Runs one item through its handler. Never panics on a handler or store error: it logs, counts, and leaves the
/// lease to expire, so another pass (on any replica) retries the row.
pub async fn work<S: Store, H: Handler<S>>(core: &Core<S>, handler: &H, item: Item) -> ItemOutcome {
    let lease = item.lease;
    let outcome = match work_leased(core, handler, item).await {
        Step::Done(outcome) => outcome,
        Step::Applying(applying) => applying.finish(core).await,
    };
    record(core, lease, outcome);
    outcome
}

/// Counts how an item ended and drops its lease from the ledger.
fn record<S: Store>(core: &Core<S>, lease: Lease, outcome: ItemOutcome) {
    match outcome {
        ItemOutcome::Applied => Metrics::bump(&core.metrics.applied),
        ItemOutcome::Stale => Metrics::bump(&core.metrics.stale),
        ItemOutcome::Retried => Metrics::bump(&core.metrics.retries),
        ItemOutcome::Failed => Metrics::bump(&core.metrics.errors),
    }
    core.shared.forget(lease);
}

/// Where an item's work stopped: done, or handed to the batcher with its apply not yet answered.
enum Step {
    Done(ItemOutcome),
    Applying(Box<Applying>),
}

/// An item whose guarded apply was handed over (or is to be made, with batching off), and what follows it.
struct Applying {
    lease: Lease,
    hints: Vec<String>,
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
    /// Waits for the apply's outcome and sends the fetch hints of an applied item.
    async fn finish<S: Store>(self, core: &Core<S>) -> ItemOutcome {
        let name = &core.config.name;
        let applied = match self.apply {
            Apply::Direct(params) => core.batcher.apply(params).await,
            Apply::Pending(pending) => pending.outcome().await,
        };
        core.metrics.apply_latency.record(core.clock.now().duration_since(self.started));
        match applied {
            Ok(ApplyOutcome::Applied { .. }) => {
                if let Some(params) = self.repeat {
                    // A retried apply: the first one cleared the token, so this one must be stale. The simulator's
                    // checkers, not this worker, judge what the store did with it.
                    let _ = core.store.apply(params).await;
                }
                for kind in self.hints {
                    if let Err(error) = core.store.hint(&kind, None).await {
                        tracing::warn!(pipeline = %name, %kind, %error, "fetch hint after apply failed");
                    }
                }
                ItemOutcome::Applied
            }
            Ok(ApplyOutcome::Stale) => ItemOutcome::Stale,
            Err(error) => failed(name, self.lease, WorkError::Store(error)),
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
    let cx = LoadCx::new(core.store.as_ref(), lease, name, core.config.lease_ttl);
    let context = match handler.load(&row, &cx).await {
        Ok(context) => context,
        Err(error) => return Step::Done(stopped(core, lease, error).await),
    };
    // 3. Process, holding no store call.
    let started = clock.now();
    let changes = handler.process(row, context).await;
    core.metrics.process_latency.record(clock.now().duration_since(started));
    let changes = match changes {
        Ok(changes) => changes,
        Err(error) => return Step::Done(stopped(core, lease, error).await),
    };
    // 4. Guarded apply, batched with other workers' applies (each still guarded by its own token).
    let hints = changes.hints;
    let params = ApplyParams {
        lease,
        update: changes.update,
        related: changes.related,
        inserts: changes.inserts,
        events: changes.events,
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
    Step::Applying(Box::new(Applying { lease, hints, repeat, started, apply }))
}

/// The load or process phase stopped with `error`.
async fn stopped<S: Store>(core: &Core<S>, lease: crate::store::Lease, error: WorkError) -> ItemOutcome {
    match error {
        WorkError::Contended => match core.store.reset_for_retry(lease).await {
            Ok(true) => ItemOutcome::Retried,
            Ok(false) => ItemOutcome::Stale,
            Err(error) => failed(&core.config.name, lease, WorkError::Store(error)),
        },
        WorkError::Stale => ItemOutcome::Stale,
        error => failed(&core.config.name, lease, error),
    }
}

fn failed(pipeline: &str, lease: crate::store::Lease, error: WorkError) -> ItemOutcome {
    tracing::warn!(%pipeline, row = %lease.id, token = %lease.token, %error, "item failed; lease left to expire");
    ItemOutcome::Failed
}

/// A worker's loop: items until the pipeline stops taking work, then waits for the applies it handed over.
pub async fn run<S: Store, H: Handler<S>>(core: Core<S>, handler: Arc<H>) {
    let mut finishing: Vec<Finishing> = Vec::new();
    while let Some(item) = core.shared.pop().await {
        let lease = item.lease;
        match work_leased(&core, handler.as_ref(), item).await {
            Step::Done(outcome) => record(&core, lease, outcome),
            Step::Applying(applying) if matches!(applying.apply, Apply::Direct(_)) => {
                let outcome = applying.finish(&core).await;
                record(&core, lease, outcome);
            }
            Step::Applying(applying) => {
                finishing.retain(|task| !task.0.is_finished());
                let core = core.clone();
                finishing.push(Finishing(tokio::spawn(async move {
                    let outcome = applying.finish(&core).await;
                    record(&core, lease, outcome);
                })));
            }
        }
    }
    for task in finishing.iter_mut() {
        let _ = (&mut task.0).await;
    }
}

/// The task finishing one handed-over apply; aborted if dropped unfinished (the worker was aborted, as a crash
/// would end it), so nothing of an aborted pipeline runs on.
struct Finishing(JoinHandle<()>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.abort();
    }
}
