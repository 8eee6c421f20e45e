//! The apply batcher: groups the guarded applies of one pipeline's workers into [`Store::apply_batch`] calls, so
//! that N applies cost one transaction instead of N (DESIGN §3, Batching; seed "Performance analysis": workers'
//! writes dominate the store's load and can be batched).
//!
//! A worker hands its apply over ([`ApplyBatcher::submit`]) and goes on to its next item; the apply's outcome
//! arrives later ([`PendingApply`]), and the lease stays in the pipeline's ledger (so the heartbeater keeps it)
//! until then. Each item stays guarded by its own token in the store, and a stale item is reported alone. At most
//! `apply_batch_max` applies of a pipeline are handed over and unanswered at once: a worker that would exceed it
//! waits for a slot, so a slow store slows the workers down instead of piling up work.
//!
//! A dispatcher task (spawned on first use, on the runtime and node of the first worker that applies) forms
//! batches, group-commit style:
//! 1. a batch opens when an apply arrives and no batch is open; the dispatcher takes every apply already waiting;
//! 2. it is sent at once when it holds `apply_batch_max` items, or when no batch of the pipeline is in the store:
//!    an unsaturated pipeline adds no delay;
//! 3. otherwise it collects applies while the batch in the store is answered, for at most `apply_batch_window`
//!    after its first item arrived: a batch never delays an item by more than the window;
//! 4. a sent batch runs as a task of its own, so a slow store call does not hold back the next batch.
//!
//! So batches grow with the load: one apply alone when the pipeline is quiet, as many as arrive during one store
//! round trip when it is busy. A window of zero (or `apply_batch_max` 1) turns batching off: each apply is its
//! own store call, on the worker's task, and the worker waits for it. Everything here runs on tokio's (madsim's)
//! primitives and the pipeline's local clock, with a `biased` select, so a simulated run stays a function of its
//! seed.

use super::clock::LocalClock;
use super::config::PipelineConfig;
use super::metrics::Metrics;
use crate::store::{ApplyOutcome, ApplyParams, Store, StoreError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Duration;

/// One worker's apply, waiting for its batch, where its outcome goes, and its slot among the pipeline's
/// unanswered applies (given back once the outcome is sent).
struct Request {
    params: ApplyParams,
    reply: oneshot::Sender<Result<ApplyOutcome, StoreError>>,
    _slot: OwnedSemaphorePermit,
}

/// An apply handed to the batcher: await [`PendingApply::outcome`] for what the store did with it.
pub struct PendingApply(oneshot::Receiver<Result<ApplyOutcome, StoreError>>);

impl PendingApply {
    /// The item's own outcome, as [`Store::apply`] would give it. Errors: the store's error for the whole batch
    /// (no item's outcome is known), or `Unavailable` when the batcher was stopped with the apply in it.
    pub async fn outcome(self) -> Result<ApplyOutcome, StoreError> {
        self.0.await.map_err(|_| stopped())?
    }
}

/// Batches of the pipeline in the store, and a wake-up when one is answered.
#[derive(Default)]
struct InFlight {
    batches: AtomicUsize,
    landed: Notify,
}

/// How the dispatcher forms batches (from the pipeline's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Policy {
    /// Longest wait of a batch's first item, local clock.
    window: Duration,
    /// Most items in one batch.
    batch_max: usize,
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
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
    /// One permit per apply that may be handed over and unanswered (`apply_batch_max`).
    slots: Arc<Semaphore>,
    running: Mutex<Option<Running>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Store> ApplyBatcher<S> {
    /// A batcher for the pipeline `config` over `store`, waiting on `clock` and counting its store calls in
    /// `metrics`. Spawns nothing until the first apply.
    pub fn new(store: Arc<S>, config: &PipelineConfig, clock: LocalClock, metrics: Arc<Metrics>) -> ApplyBatcher<S> {
        let policy = Policy { window: config.apply_batch_window, batch_max: config.apply_batch_max };
        let slots = Arc::new(Semaphore::new(config.apply_batch_max));
        ApplyBatcher { store, metrics, clock, policy, slots, running: Mutex::new(None) }
    }

    /// Whether applies are batched at all (a non-zero window and room for two items).
    pub fn is_batching(&self) -> bool {
        !self.policy.window.is_zero() && self.policy.batch_max > 1
    }

    /// The guarded apply of `params`, in a batch with other applies when batching is on, waiting for its outcome:
    /// this item's own, as [`Store::apply`] would give it.
    ///
    /// Errors: the store's error for the whole batch (no item's outcome is known), or `Unavailable` when the
    /// batcher was stopped with the apply in it.
    pub async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        if !self.is_batching() {
            Metrics::bump(&self.metrics.apply_calls);
            return self.store.apply(params).await;
        }
        self.submit(params).await.outcome().await
    }

    /// Hands `params` to the dispatcher (batching must be on) once one of the pipeline's `apply_batch_max` slots
    /// for unanswered applies is free, and returns where its outcome will arrive, without waiting for it.
    pub async fn submit(&self, params: ApplyParams) -> PendingApply {
        debug_assert!(self.is_batching(), "submit needs batching on");
        let (reply, outcome) = oneshot::channel();
        // The semaphore is never closed; a closed one would only mean no slot is ever needed again.
        if let Ok(slot) = self.slots.clone().acquire_owned().await {
            // A send to a stopped dispatcher drops the request, and with it `reply`: the outcome reads as stopped.
            let _ = self.requests().send(Request { params, reply, _slot: slot });
        }
        PendingApply(outcome)
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
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            policy: self.policy,
            in_flight: Arc::default(),
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
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
    in_flight: Arc<InFlight>,
}

impl<S: Store> Dispatcher<S> {
    /// Forms and sends batches until every sender is gone (the pipeline was dropped). Never ends otherwise.
    async fn run(self, mut received: mpsc::UnboundedReceiver<Request>) {
        while let Some(first) = received.recv().await {
            let batch = self.gather(first, &mut received).await;
            Metrics::bump(&self.metrics.apply_calls);
            self.in_flight.batches.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(flush(self.store.clone(), batch, self.in_flight.clone()));
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
                _ = self.in_flight.landed.notified() => {}
                _ = self.clock.sleep_until(deadline) => return batch,
            }
        }
    }

    /// Whether a batch of `len` items goes now: it is full, or no batch of the pipeline is in the store.
    fn ready(&self, len: usize) -> bool {
        len >= self.policy.batch_max || self.in_flight.batches.load(Ordering::SeqCst) == 0
    }
}

/// Sends one batch and hands each worker its outcome. Errors go to every item: the batch's outcome is unknown.
async fn flush<S: Store>(store: Arc<S>, batch: Vec<Request>, in_flight: Arc<InFlight>) {
    let len = batch.len();
    let (params, replies): (Vec<ApplyParams>, Vec<_>) =
        batch.into_iter().map(|r| (r.params, (r.reply, r._slot))).unzip();
    let outcomes = store.apply_batch(params).await;
    // Answered: the next batch may go (a stored permit if the dispatcher is not waiting yet).
    in_flight.batches.fetch_sub(1, Ordering::SeqCst);
    in_flight.landed.notify_one();
    match outcomes {
        Ok(outcomes) => {
            assert_eq!(outcomes.len(), len, "apply_batch answered {} outcomes for {len} items", outcomes.len());
            for ((reply, _slot), outcome) in replies.into_iter().zip(outcomes) {
                // A worker that went away (its task aborted) needs no answer.
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            for (reply, _slot) in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
