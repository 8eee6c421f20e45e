//! The apply batcher: groups the guarded applies of one pipeline's workers into [`Store::apply_batch`] calls, so
//! that N workers' writes cost one transaction instead of N (DESIGN §3, Batching; seed "Performance analysis":
//! workers' writes dominate the store's load and can be batched).
//!
//! Each worker hands its apply to the batcher and awaits its own outcome; each item stays guarded by its own
//! token in the store, and a stale item is reported to its worker alone. A dispatcher task (spawned on first use,
//! on the runtime and node of the first worker that applies) forms batches:
//! 1. a batch opens when an apply arrives and no batch is open; the dispatcher takes every apply already waiting;
//! 2. it is sent at once when it holds `apply_batch_max` items, or when it holds the apply of every worker that is
//!    not away ([`Shared::workers_away`]: waiting for an item, or processing one): no one else can come soon, so
//!    an unsaturated pipeline, or one whose processing takes long, adds no delay;
//! 3. otherwise it waits for one of those, or for `apply_batch_window` after its first item arrived, whichever
//!    comes first: a batch never delays an item by more than the window;
//! 4. a sent batch runs as a task of its own, so a slow store call does not hold back the next batch.
//!
//! Workers in a store call (a refetch, or an apply whose batch is in the store) count as coming: with short
//! processing they are back before the window ends, so the pipeline's workers go to the store together, one
//! transaction for all of them, instead of in two half-sized batches that alternate (measured: 3.4 applies per
//! call against 8 workers, BENCHMARKS.md). Workers that are processing do not: a batch never waits for work of
//! unknown length, so throughput keeps following workers / processing time (tests/sim_throughput.rs). A window
//! of zero (or `apply_batch_max` 1) turns batching off: each apply is its own store call, on the worker's task.
//! Everything here runs on tokio's (madsim's) primitives and the pipeline's local clock, with a `biased` select, so
//! a simulated run stays a function of its seed.
//!
//! [`Shared::workers_away`]: super::queue::Shared::workers_away

use super::clock::LocalClock;
use super::config::PipelineConfig;
use super::metrics::Metrics;
use super::queue::Shared;
use crate::store::{ApplyOutcome, ApplyParams, Store, StoreError};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Duration;

/// One worker's apply, waiting for its batch, and where its outcome goes.
struct Request {
    params: ApplyParams,
    reply: oneshot::Sender<Result<ApplyOutcome, StoreError>>,
}

/// How the dispatcher forms batches (from the pipeline's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Policy {
    /// Longest wait of a batch's first item, local clock.
    window: Duration,
    /// Most items in one batch.
    batch_max: usize,
    /// The pipeline's workers: each has at most one apply outstanding, so no batch can grow past them.
    workers: usize,
}

/// The dispatcher's handle: where workers send applies, and the task, so a crash-like stop can abort it.
struct Running {
    requests: mpsc::UnboundedSender<Request>,
    task: JoinHandle<()>,
}

/// One pipeline's apply batcher (see the module doc). Shared by its workers through the [`Pipeline`].
///
/// [`Pipeline`]: super::Pipeline
pub struct ApplyBatcher<S: Store> {
    store: Arc<S>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
    running: Mutex<Option<Running>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Store> ApplyBatcher<S> {
    /// A batcher for the pipeline `config` over `store` whose workers share `shared`, waiting on `clock` and
    /// counting its store calls in `metrics`. Spawns nothing until the first apply.
    pub fn new(
        store: Arc<S>,
        shared: Arc<Shared>,
        config: &PipelineConfig,
        clock: LocalClock,
        metrics: Arc<Metrics>,
    ) -> ApplyBatcher<S> {
        let policy =
            Policy { window: config.apply_batch_window, batch_max: config.apply_batch_max, workers: config.workers };
        ApplyBatcher { store, shared, metrics, clock, policy, running: Mutex::new(None) }
    }

    /// Whether applies are batched at all (a non-zero window and room for two items).
    pub fn is_batching(&self) -> bool {
        !self.policy.window.is_zero() && self.policy.batch_max > 1 && self.policy.workers > 1
    }

    /// The guarded apply of `params`, in a batch with other workers' applies when batching is on: the outcome is
    /// this item's own, as [`Store::apply`] would give it.
    ///
    /// Errors: the store's error for the whole batch (no item's outcome is known), or `Unavailable` when the
    /// batcher was stopped with the apply in it.
    pub async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        if !self.is_batching() {
            Metrics::bump(&self.metrics.apply_calls);
            return self.store.apply(params).await;
        }
        let (reply, outcome) = oneshot::channel();
        self.requests().send(Request { params, reply }).map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }

    /// Stops the dispatcher at once, as a crash would: applies waiting in it fail with `Unavailable`, and a batch
    /// already in the store finishes on its own. A later apply starts a new dispatcher.
    pub fn abort(&self) {
        if let Some(running) = lock(&self.running).take() {
            running.task.abort();
        }
    }

    /// The dispatcher's sender, starting the dispatcher if it is not running.
    fn requests(&self) -> mpsc::UnboundedSender<Request> {
        let mut running = lock(&self.running);
        if let Some(running) = running.as_ref().filter(|r| !r.requests.is_closed()) {
            return running.requests.clone();
        }
        let (requests, received) = mpsc::unbounded_channel();
        let dispatcher = Dispatcher {
            store: self.store.clone(),
            shared: self.shared.clone(),
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            policy: self.policy,
        };
        let task = tokio::spawn(dispatcher.run(received));
        *running = Some(Running { requests: requests.clone(), task });
        requests
    }
}

impl<S: Store> Drop for ApplyBatcher<S> {
    fn drop(&mut self) {
        // The dispatcher would end by itself once its sender is gone; ending it now keeps no task behind.
        self.abort();
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the apply batcher stopped with this apply in it; its outcome is unknown".into())
}

/// The dispatcher task's state.
struct Dispatcher<S: Store> {
    store: Arc<S>,
    /// The pipeline's queue: how many workers are away (they bring no apply soon).
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
}

impl<S: Store> Dispatcher<S> {
    /// Forms and sends batches until every sender is gone (the pipeline was dropped). Never ends otherwise.
    async fn run(self, mut received: mpsc::UnboundedReceiver<Request>) {
        while let Some(first) = received.recv().await {
            let batch = self.gather(first, &mut received).await;
            Metrics::bump(&self.metrics.apply_calls);
            tokio::spawn(flush(self.store.clone(), batch));
        }
    }

    /// The batch that opens with `first`: applies join it until one of the rules of the module doc sends it.
    async fn gather(&self, first: Request, received: &mut mpsc::UnboundedReceiver<Request>) -> Vec<Request> {
        let deadline = self.clock.now() + self.policy.window;
        let mut batch = vec![first];
        loop {
            while batch.len() < self.policy.batch_max {
                match received.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            if self.ready(batch.len()) {
                return batch;
            }
            tokio::select! {
                biased;
                request = received.recv() => match request {
                    Some(request) => batch.push(request),
                    None => return batch,
                },
                _ = self.shared.went_away.notified() => {}
                _ = self.clock.sleep_until(deadline) => return batch,
            }
        }
    }

    /// Whether a batch of `len` items goes now: it is full, or every worker that is not away is in it.
    fn ready(&self, len: usize) -> bool {
        len >= self.policy.batch_max || len + self.shared.workers_away() >= self.policy.workers
    }
}

/// Sends one batch and hands each worker its outcome. Errors go to every item: the batch's outcome is unknown.
async fn flush<S: Store>(store: Arc<S>, batch: Vec<Request>) {
    let len = batch.len();
    let (params, replies): (Vec<ApplyParams>, Vec<_>) = batch.into_iter().map(|r| (r.params, r.reply)).unzip();
    let outcomes = store.apply_batch(params).await;
    match outcomes {
        Ok(outcomes) => {
            assert_eq!(outcomes.len(), len, "apply_batch answered {} outcomes for {len} items", outcomes.len());
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A worker that went away (its task aborted) needs no answer.
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
