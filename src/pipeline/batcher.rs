//! The pipeline's batchers (DESIGN §3, Batching): the [`ApplyBatcher`] groups the workers' guarded applies into
//! [`Store::apply_batch`] calls, the [`RefetchBatcher`] their refetches into [`Store::refetch_batch`] calls. Both
//! form batches by the group-commit rule of [`super::group_commit`]: an item goes at once when fewer batches of its
//! kind than allowed are in the store (`apply_batches_in_flight` for applies, one for refetches), else it joins the
//! next batch, which waits at most its window.
//!
//! Applies: a worker hands its apply over ([`ApplyBatcher::submit`]) and goes on to its next item; the apply's
//! outcome arrives later ([`PendingApply`]), and the lease stays in the pipeline's ledger (so the heartbeater keeps
//! it) until then. Each item stays guarded by its own token in the store, and a stale item is reported alone. At
//! most `apply_batch_max` × `apply_batches_in_flight` applies of a pipeline are handed over and unanswered at once
//! (a full batch for each batch the store may hold): a worker that would exceed it waits for a slot, so a slow
//! store slows the workers down instead of piling up work. Batches in flight at once hold distinct items (each
//! item joins one batch, guarded by its own token), and the rows a batch writes (its items' main rows and the
//! related rows each item locked under its token) are no other batch's: two batches of one pipeline neither apply
//! an item twice nor wait for each other's row locks.
//!
//! Refetches: a worker waits for its refetch (it needs the row to load), so at most `workers` refetches of a
//! pipeline wait at once, and that is the batch bound. Each lease reads as [`Store::refetch`] reads it: a stale one
//! alone reads `None`, and only its item is dropped.
//!
//! A bad value fails alone (DESIGN §2): the store checks every value of a batch before it writes any
//! ([`check_apply`](crate::store::check_apply)), and a batch it refuses whole is sent again item by item (see [`super::group_commit`]), so
//! only the bad item fails. The batcher does not check the values itself first: each value is walked once, by the
//! store (walking a gang restart's 30 000 JSON values twice, here and in the store, was 8 % of its CPU),
//! and a bad value, a bug of its handler, costs its batch one refused call.
//!
//! A window of zero (or a batch bound of 1) turns a batcher off: each call is its own store call, on the worker's
//! task, and the worker waits for it.

use super::clock::LocalClock;
use super::config::PipelineConfig;
use super::group_commit::{BatchedCall, GroupCommit, Pending, Policy};
use super::metrics::Metrics;
use crate::store::{ApplyOutcome, ApplyParams, Lease, Row, Store, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::sync::Semaphore;

/// An apply handed to the [`ApplyBatcher`]: await [`Pending::outcome`] for what the store did with it (the item's
/// own outcome, as [`Store::apply`] would give it).
pub type PendingApply = Pending<ApplyOutcome>;

/// Guarded applies, batched by [`Store::apply_batch`].
pub struct Applies;

impl<S: Store> BatchedCall<S> for Applies {
    type Item = ApplyParams;
    type Outcome = ApplyOutcome;
    const WHAT: &'static str = "apply";

    fn calls(metrics: &Metrics) -> &AtomicU64 {
        &metrics.apply_calls
    }

    fn send(store: &S, items: Vec<ApplyParams>) -> impl Future<Output = Result<Vec<ApplyOutcome>, StoreError>> + Send {
        store.apply_batch(items)
    }
}

/// Refetches by token, batched by [`Store::refetch_batch`].
pub struct Refetches;

impl<S: Store> BatchedCall<S> for Refetches {
    type Item = Lease;
    type Outcome = Option<Row>;
    const WHAT: &'static str = "refetch";

    fn calls(metrics: &Metrics) -> &AtomicU64 {
        &metrics.refetch_calls
    }

    fn send(store: &S, items: Vec<Lease>) -> impl Future<Output = Result<Vec<Option<Row>>, StoreError>> + Send {
        store.refetch_batch(items)
    }
}

/// One pipeline's apply batcher (see the module doc). Shared by its workers through the [`Pipeline`].
///
/// [`Pipeline`]: super::Pipeline
pub struct ApplyBatcher<S: Store> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    group: GroupCommit<S, Applies>,
    /// One permit per apply that may be handed over and unanswered (`apply_batch_max` × `apply_batches_in_flight`).
    slots: Arc<Semaphore>,
}

impl<S: Store> ApplyBatcher<S> {
    /// A batcher for the pipeline `config` over `store` (window `apply_batch_window`, batches of at most
    /// `apply_batch_max`, up to `apply_batches_in_flight` of them in the store at once), waiting on `clock` and
    /// counting its store calls in `metrics.apply_calls`. Spawns nothing until the first apply.
    pub fn new(store: Arc<S>, config: &PipelineConfig, clock: LocalClock, metrics: Arc<Metrics>) -> ApplyBatcher<S> {
        let policy = Policy {
            window: config.apply_batch_window,
            batch_max: config.apply_batch_max,
            in_flight_max: config.apply_batches_in_flight,
        };
        let slots = Arc::new(Semaphore::new(config.apply_batch_max * config.apply_batches_in_flight));
        let group = GroupCommit::new(store.clone(), policy, clock, metrics.clone());
        ApplyBatcher { store, metrics, group, slots }
    }

    /// Whether applies are batched at all (a non-zero window and room for two items).
    pub fn is_batching(&self) -> bool {
        self.group.policy().is_batching()
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

    /// Hands `params` to the dispatcher (batching must be on) once one of the pipeline's slots for unanswered
    /// applies (`apply_batch_max` × `apply_batches_in_flight`) is free, and returns where its outcome will arrive, without waiting for it.
    ///
    /// An apply with a value the store refuses ([`check_apply`](crate::store::check_apply)) fails alone with `Invalid`: its batch is refused
    /// whole and sent again item by item (DESIGN §2; see the module doc).
    pub async fn submit(&self, params: ApplyParams) -> PendingApply {
        // The semaphore is never closed; a closed one would only mean no slot is ever needed again.
        let slot = self.slots.clone().acquire_owned().await.ok();
        self.group.submit(params, slot)
    }

    /// Stops the dispatcher at once, as a crash would: applies waiting in it fail with `Unavailable`, and a batch
    /// already in the store finishes on its own. A later apply starts a new dispatcher.
    pub fn abort(&self) {
        self.group.abort();
    }
}

/// One pipeline's refetch batcher (see the module doc). Shared by its workers through the [`Pipeline`].
///
/// [`Pipeline`]: super::Pipeline
pub struct RefetchBatcher<S: Store> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    group: GroupCommit<S, Refetches>,
}

impl<S: Store> RefetchBatcher<S> {
    /// A batcher for the pipeline `config` over `store` (window `refetch_batch_window`, batches of at most
    /// `workers`), waiting on `clock` and counting refetches in `metrics.refetched` and its store calls in
    /// `metrics.refetch_calls`. Spawns nothing until the first refetch.
    pub fn new(store: Arc<S>, config: &PipelineConfig, clock: LocalClock, metrics: Arc<Metrics>) -> RefetchBatcher<S> {
        let policy = Policy { window: config.refetch_batch_window, batch_max: config.workers, in_flight_max: 1 };
        let group = GroupCommit::new(store.clone(), policy, clock, metrics.clone());
        RefetchBatcher { store, metrics, group }
    }

    /// Whether refetches are batched at all (a non-zero window and more than one worker).
    pub fn is_batching(&self) -> bool {
        self.group.policy().is_batching()
    }

    /// The row `lease` still holds, as [`Store::refetch`] reads it (`None`: the lease is stale), read in a batch
    /// with other workers' refetches when batching is on.
    ///
    /// Errors: the store's error for the whole batch, or `Unavailable` when the batcher was stopped with the
    /// refetch in it.
    pub async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        Metrics::bump(&self.metrics.refetched);
        if !self.is_batching() {
            Metrics::bump(&self.metrics.refetch_calls);
            return self.store.refetch(lease).await;
        }
        self.group.submit(lease, None).outcome().await
    }

    /// Stops the dispatcher at once, as a crash would: refetches waiting in it fail with `Unavailable`.
    pub fn abort(&self) {
        self.group.abort();
    }
}
