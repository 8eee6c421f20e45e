//! A worker: takes one leased item at a time and runs load → process → guarded apply (dstack PIPELINES,
//! "Typical worker structure"; DESIGN §3, Worker).

use super::Core;
use super::handler::{Handler, LoadCx, WorkError};
use super::metrics::Metrics;
use super::queue::Item;
use crate::buggify::{self, Point};
use crate::store::{ApplyOutcome, ApplyParams, Store};
use std::sync::Arc;

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
    let outcome = work_leased(core, handler, item).await;
    match outcome {
        ItemOutcome::Applied => Metrics::bump(&core.metrics.applied),
        ItemOutcome::Stale => Metrics::bump(&core.metrics.stale),
        ItemOutcome::Retried => Metrics::bump(&core.metrics.retries),
        ItemOutcome::Failed => Metrics::bump(&core.metrics.errors),
    }
    core.shared.forget(lease);
    outcome
}

async fn work_leased<S: Store, H: Handler<S>>(core: &Core<S>, handler: &H, item: Item) -> ItemOutcome {
    let lease = item.lease;
    let name = &core.config.name;
    // 1. A lease the heartbeater gave up on (or whose local deadline passed in the queue) may be another
    //    holder's by now: do nothing with it.
    let clock = &core.clock;
    if !core.shared.holds(lease, clock.now()) {
        return ItemOutcome::Stale;
    }
    // 2. Load: refetch by id + token (unless the config trusts the fetched row, see `PipelineConfig::refetch`),
    //    then the handler's reads and related locks.
    let row = if core.config.refetch {
        match core.store.refetch(lease).await {
            Ok(Some(row)) => row,
            Ok(None) => return ItemOutcome::Stale,
            Err(error) => return failed(name, lease, WorkError::Store(error)),
        }
    } else {
        item.row
    };
    let cx = LoadCx::new(core.store.as_ref(), lease, name, core.config.lease_ttl);
    let context = match handler.load(&row, &cx).await {
        Ok(context) => context,
        Err(error) => return stopped(core, lease, error).await,
    };
    // 3. Process, holding no store call.
    let started = clock.now();
    let changes = {
        // Away from the store: the apply batcher does not wait for this worker while it processes.
        let _away = core.shared.processing();
        handler.process(row, context).await
    };
    core.metrics.process_latency.record(clock.now().duration_since(started));
    let changes = match changes {
        Ok(changes) => changes,
        Err(error) => return stopped(core, lease, error).await,
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
    let applied = core.batcher.apply(params).await;
    core.metrics.apply_latency.record(clock.now().duration_since(started));
    match applied {
        Ok(ApplyOutcome::Applied { .. }) => {
            if let Some(params) = repeat {
                // A retried apply: the first one cleared the token, so this one must be stale. The simulator's
                // checkers, not this worker, judge what the store did with it.
                let _ = core.store.apply(params).await;
            }
            for kind in hints {
                if let Err(error) = core.store.hint(&kind, None).await {
                    tracing::warn!(pipeline = %name, %kind, %error, "fetch hint after apply failed");
                }
            }
            ItemOutcome::Applied
        }
        Ok(ApplyOutcome::Stale) => ItemOutcome::Stale,
        Err(error) => failed(name, lease, WorkError::Store(error)),
    }
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

/// A worker's loop: items until the pipeline stops taking work.
pub async fn run<S: Store, H: Handler<S>>(core: Core<S>, handler: Arc<H>) {
    while let Some(item) = core.shared.pop().await {
        work(&core, handler.as_ref(), item).await;
    }
}
