//! Group commit: the dispatcher behind the pipeline's batchers ([`ApplyBatcher`] for guarded applies,
//! [`RefetchBatcher`] for the workers' refetches). It groups the store calls of one kind that a pipeline's workers
//! make at about the same time into one batched store call, so that N calls cost one round trip instead of N
//! (DESIGN §3, Batching; seed "Performance analysis": workers' store calls dominate the store's load).
//!
//! A caller hands its item over ([`GroupCommit::submit`]) and gets a [`Pending`] outcome. A dispatcher task
//! (spawned on first use, on the runtime and node of the first caller) forms batches:
//! 1. a batch opens when an item arrives and no batch is open; the dispatcher takes every item already waiting;
//! 2. it is sent at once when it holds `batch_max` items, or when fewer than `in_flight_max` batches of this
//!    dispatcher are in the store (none, with the default of one): an unsaturated pipeline adds no delay;
//! 3. otherwise it collects items until a batch in the store is answered, for at most `window` after its first
//!    item arrived: a batch never delays an item by more than the window;
//! 4. a sent batch runs as a task of its own, so a slow store call does not hold back the next batch.
//!
//! A batch that fails with an error that retrying cannot cure (`!is_retryable()`: a value the store refuses) is
//! sent again one item at a time, so that only the bad item fails (DESIGN §2, "Bad values are refused before SQL").
//!
//! So batches grow with the load: one item alone when the pipeline is quiet, as many as arrive during one store
//! round trip when it is busy. Each item's outcome is its own (the batched store calls report per item). A window
//! of zero or a `batch_max` of 1 means no batching ([`Policy::is_batching`]); the batchers then call the store
//! directly. Everything here runs on tokio's (madsim's) primitives and the pipeline's local clock, with a `biased`
//! select, so a simulated run stays a function of its seed.
//!
//! [`ApplyBatcher`]: super::ApplyBatcher
//! [`RefetchBatcher`]: super::RefetchBatcher

use super::clock::LocalClock;
use super::metrics::Metrics;
use crate::store::{Store, StoreError};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Duration;

/// One kind of batched store call: what an item is, what its outcome is, and the store call that takes many.
pub trait BatchedCall<S: Store>: Send + Sync + 'static {
    /// One caller's part of a batch (cloned when a batch of several is sent, to split it should it fail whole).
    type Item: Clone + Send + 'static;
    /// One item's outcome.
    type Outcome: Send + 'static;
    /// What an item is, for messages ("apply", "refetch").
    const WHAT: &'static str;
    /// The counter of store calls made for this kind (one per batch).
    fn calls(metrics: &Metrics) -> &AtomicU64;
    /// The batched store call: one outcome per item, in input order, or an error for the whole batch.
    fn send(store: &S, items: Vec<Self::Item>) -> impl Future<Output = Result<Vec<Self::Outcome>, StoreError>> + Send;
}

/// How a dispatcher forms batches (from the pipeline's config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Longest wait of a batch's first item, local clock.
    pub window: Duration,
    /// Most items in one batch.
    pub batch_max: usize,
    /// Most batches of this dispatcher in the store at once before a batch that is not full waits (at least 1).
    /// With more than one, the next batch goes to the store (on another connection) while one commits, so the
    /// pipeline does not wait a whole round trip for each batch; batches are then smaller.
    pub in_flight_max: usize,
}

impl Policy {
    /// Whether items are batched at all: a non-zero window and room for two items.
    pub fn is_batching(&self) -> bool {
        !self.window.is_zero() && self.batch_max > 1
    }
}

/// One caller's item, waiting for its batch, where its outcome goes, and a slot the caller holds until the
/// outcome is sent (the apply batcher's bound on unanswered applies).
struct Request<I, O> {
    item: I,
    reply: oneshot::Sender<Result<O, StoreError>>,
    _slot: Option<OwnedSemaphorePermit>,
}

/// An item handed to a dispatcher: await [`Pending::outcome`] for what the store did with it.
pub struct Pending<O> {
    outcome: oneshot::Receiver<Result<O, StoreError>>,
    what: &'static str,
}

impl<O> Pending<O> {
    /// An outcome known before any batch: `outcome` is what [`Pending::outcome`] returns.
    pub fn resolved(outcome: Result<O, StoreError>, what: &'static str) -> Pending<O> {
        let (reply, received) = oneshot::channel();
        // The receiver is alive: the send cannot fail.
        let _ = reply.send(outcome);
        Pending { outcome: received, what }
    }

    /// The item's own outcome. Errors: the store's error for the whole batch (no item's outcome is known), or
    /// `Unavailable` when the dispatcher was stopped with the item in it.
    pub async fn outcome(self) -> Result<O, StoreError> {
        let what = self.what;
        self.outcome.await.map_err(|_| stopped(what))?
    }
}

fn stopped(what: &str) -> StoreError {
    StoreError::Unavailable(format!("the {what} batcher stopped with this {what} in it; its outcome is unknown"))
}

/// Batches of one dispatcher in the store, and a wake-up when one is answered.
#[derive(Default)]
struct InFlight {
    batches: AtomicUsize,
    landed: Notify,
}

/// The dispatcher's handle: where callers send items, and the task, so a crash-like stop can abort it.
struct Running<I, O> {
    requests: mpsc::UnboundedSender<Request<I, O>>,
    task: JoinHandle<()>,
}

/// One pipeline's dispatcher for the batched call `B` (see the module doc).
pub struct GroupCommit<S: Store, B: BatchedCall<S>> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
    running: Mutex<Option<Running<B::Item, B::Outcome>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Store, B: BatchedCall<S>> GroupCommit<S, B> {
    /// A dispatcher over `store` batching by `policy`, waiting on `clock` and counting its store calls in
    /// `metrics`. Spawns nothing until the first item.
    pub fn new(store: Arc<S>, policy: Policy, clock: LocalClock, metrics: Arc<Metrics>) -> GroupCommit<S, B> {
        GroupCommit { store, metrics, clock, policy, running: Mutex::new(None) }
    }

    /// How it forms batches.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Hands `item` to the dispatcher (batching must be on), with `slot` held until its outcome is sent, and
    /// returns where the outcome will arrive.
    pub fn submit(&self, item: B::Item, slot: Option<OwnedSemaphorePermit>) -> Pending<B::Outcome> {
        debug_assert!(self.policy.is_batching(), "submit needs batching on");
        let (reply, outcome) = oneshot::channel();
        // A send to a stopped dispatcher drops the request, and with it `reply`: the outcome reads as stopped.
        let _ = self.requests().send(Request { item, reply, _slot: slot });
        Pending { outcome, what: B::WHAT }
    }

    /// Stops the dispatcher at once, as a crash would: items waiting in it fail with `Unavailable`, and a batch
    /// already in the store finishes on its own. A later item starts a new dispatcher.
    pub fn abort(&self) {
        if let Some(running) = lock(&self.running).take() {
            running.task.abort();
        }
    }

    /// The dispatcher's sender, starting the dispatcher if it is not running.
    fn requests(&self) -> mpsc::UnboundedSender<Request<B::Item, B::Outcome>> {
        let mut running = lock(&self.running);
        if let Some(running) = running.as_ref().filter(|r| !r.requests.is_closed()) {
            return running.requests.clone();
        }
        let (requests, received) = mpsc::unbounded_channel();
        let dispatcher = Dispatcher::<S, B> {
            store: self.store.clone(),
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            policy: self.policy,
            in_flight: Arc::default(),
            call: std::marker::PhantomData,
        };
        let task = tokio::spawn(dispatcher.run(received));
        *running = Some(Running { requests: requests.clone(), task });
        requests
    }
}

impl<S: Store, B: BatchedCall<S>> Drop for GroupCommit<S, B> {
    fn drop(&mut self) {
        // The dispatcher would end by itself once its sender is gone; ending it now keeps no task behind.
        self.abort();
    }
}

/// The dispatcher task's state.
struct Dispatcher<S: Store, B: BatchedCall<S>> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    clock: LocalClock,
    policy: Policy,
    in_flight: Arc<InFlight>,
    call: std::marker::PhantomData<fn() -> B>,
}

impl<S: Store, B: BatchedCall<S>> Dispatcher<S, B> {
    /// Forms and sends batches until every sender is gone (the pipeline was dropped). Never ends otherwise.
    async fn run(self, mut received: mpsc::UnboundedReceiver<Request<B::Item, B::Outcome>>) {
        while let Some(first) = received.recv().await {
            let batch = self.gather(first, &mut received).await;
            Metrics::bump(B::calls(&self.metrics));
            self.in_flight.batches.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(flush::<S, B>(self.store.clone(), batch, self.in_flight.clone(), self.metrics.clone()));
        }
    }

    /// The batch that opens with `first`: items join it until one of the rules of the module doc sends it.
    async fn gather(
        &self,
        first: Request<B::Item, B::Outcome>,
        received: &mut mpsc::UnboundedReceiver<Request<B::Item, B::Outcome>>,
    ) -> Vec<Request<B::Item, B::Outcome>> {
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

    /// Whether a batch of `len` items goes now: it is full, or fewer than `in_flight_max` batches of this
    /// dispatcher are in the store.
    fn ready(&self, len: usize) -> bool {
        len >= self.policy.batch_max || self.in_flight.batches.load(Ordering::SeqCst) < self.policy.in_flight_max
    }
}

/// Sends one batch and hands each caller its outcome. A retryable error goes to every item (the batch's outcome is
/// unknown); a batch of several that fails with any other error is split (see [`split`]).
async fn flush<S: Store, B: BatchedCall<S>>(
    store: Arc<S>,
    batch: Vec<Request<B::Item, B::Outcome>>,
    in_flight: Arc<InFlight>,
    metrics: Arc<Metrics>,
) {
    let len = batch.len();
    let (items, replies): (Vec<B::Item>, Vec<_>) = batch.into_iter().map(|r| (r.item, (r.reply, r._slot))).unzip();
    let copies = (len > 1).then(|| items.clone());
    let outcomes = match (B::send(&store, items).await, copies) {
        (Ok(outcomes), _) => {
            assert_eq!(outcomes.len(), len, "batched {} answered {} outcomes for {len} items", B::WHAT, outcomes.len());
            Ok(outcomes.into_iter().map(Ok).collect())
        }
        (Err(error), Some(copies)) if !error.is_retryable() => {
            Ok(split::<S, B>(&store, copies, &error, &metrics).await)
        }
        (Err(error), _) => Err(error),
    };
    // Answered: the next batch may go (a stored permit if the dispatcher is not waiting yet).
    in_flight.batches.fetch_sub(1, Ordering::SeqCst);
    in_flight.landed.notify_one();
    match outcomes {
        Ok(outcomes) => {
            for ((reply, _slot), outcome) in replies.into_iter().zip(outcomes) {
                // A caller that went away (its task aborted) needs no answer.
                let _ = reply.send(outcome);
            }
        }
        Err(error) => {
            for (reply, _slot) in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

/// The items of a batch that failed whole with the non-retryable `error`, each sent alone, one after another: the
/// outcome of each, so that only the bad item fails (a store call that fails whole, as a PostgreSQL transaction
/// does on one bad value, would otherwise fail every item with it, and do so again at every retry).
async fn split<S: Store, B: BatchedCall<S>>(
    store: &S,
    items: Vec<B::Item>,
    error: &StoreError,
    metrics: &Metrics,
) -> Vec<Result<B::Outcome, StoreError>> {
    tracing::warn!(what = B::WHAT, items = items.len(), %error, "a batch failed whole; sending its items one by one");
    let mut outcomes = Vec::with_capacity(items.len());
    for item in items {
        Metrics::bump(B::calls(metrics));
        let outcome = B::send(store, vec![item]).await.map(|mut one| {
            assert_eq!(one.len(), 1, "batched {} answered {} outcomes for 1 item", B::WHAT, one.len());
            one.pop().expect("one outcome")
        });
        outcomes.push(outcome);
    }
    outcomes
}
