//! What a user writes: a [`Handler`] that loads, processes and describes the result of one leased row
//! (dstack PIPELINES, "Typical worker structure": load → process → apply).

use super::Core;
use super::clock::LocalClock;
use super::waitlist::Waitlist;
use crate::store::{
    Lease, LockAttempt, LockRead, LockRelatedParams, NewEvent, NewHint, NewRow, RelatedUpdate, Row, RowId, RowUpdate,
    Store, StoreError, shared_owner,
};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// Why a worker stopped short of a guarded apply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkError {
    /// A related row is held by someone else: the engine resets the main lease for retry (keeps the owner,
    /// clears token and expiry) so the same pipeline retries on a later fetch (dstack PIPELINES, checklist 7).
    #[error("related lock contended")]
    Contended,
    /// A related row was held by someone else and the store already reset the main lease for retry in the same
    /// call ([`Store::lock_related_or_reset`], what [`LoadCx`]'s locks make); `held`: whether the lease was still
    /// held at the reset; `behind_other_replica`: whether every row that turned it away was held by another item
    /// of the same pipeline ([`LockOutcome::Contended`](crate::store::LockOutcome::Contended)'s
    /// `by_own_pipeline`) after this item had taken every row's turn in this replica's [`Waitlist`], that is by an
    /// item of another replica. The engine writes nothing more.
    #[error("related lock contended; lease reset for retry (held={held})")]
    ContendedReset {
        /// Whether the lease was still held at the reset (else nothing was reset).
        held: bool,
        /// Whether every row that turned the item away was held by an item of the same pipeline in another
        /// replica (see above).
        behind_other_replica: bool,
    },
    /// A related row was held by someone else and the item is to be parked (DESIGN §3, "Parked waiters";
    /// [`PipelineConfig::park_waiters`](super::PipelineConfig::park_waiters)): the store recorded it as a waiter
    /// on the rows that turned it away and left its lease as it is. `rows`: the related rows it asked for (a wake
    /// hint naming one wakes it); `until`: the longest span, store clock, until a lock it met expires (`None`:
    /// unknown, the pipeline's `retry_delay` bounds the wait). The engine parks the item, or resets it when it
    /// cannot.
    #[error("related lock contended; parked until a holder frees a row")]
    Parked {
        /// The related rows it asked for.
        rows: Vec<RowId>,
        /// Longest span until a lock it met expires, store clock.
        until: Option<Duration>,
        /// As [`WorkError::ContendedReset::behind_other_replica`].
        behind_other_replica: bool,
    },
    /// The lease was lost: nothing is written.
    #[error("lease lost")]
    Stale,
    /// The store failed. A value the store refused (`StoreError::Invalid`) is the item's own failure, counted as
    /// [`WorkError::Failed`] is; any other store error leaves the lease to expire and the row is retried after it,
    /// counting no attempt (the store being down is not the item's fault).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The handler failed: the engine records the failure on the row at once (one more attempt, the error) and
    /// retries it after a backoff, or gives up, as the pipeline's [`RetryPolicy`](super::config::RetryPolicy) and
    /// [`Handler::retry`] say.
    #[error("{0}")]
    Failed(String),
    /// The handler panicked in `load` or `process` (the message is the panic's): a failure of its item like
    /// [`WorkError::Failed`]; the worker goes on with its next item (DESIGN §3).
    #[error("handler panicked: {0}")]
    Panicked(String),
}

impl WorkError {
    /// Whether the error is the item's own (its handler failed, panicked, or wrote a value the store refuses), so
    /// that it counts an attempt and is recorded on the row; other errors leave the lease to expire.
    pub fn is_item_failure(&self) -> bool {
        matches!(self, WorkError::Failed(_) | WorkError::Panicked(_) | WorkError::Store(StoreError::Invalid(_)))
    }
}

/// An item's failure as [`Handler::retry`] sees it.
#[derive(Debug)]
pub struct Failure<'a> {
    /// The failed row.
    pub row: RowId,
    /// The attempt that failed, from 1: the row's failures in a row, this one included.
    pub attempt: u32,
    /// What went wrong.
    pub error: &'a WorkError,
}

/// What [`Handler::retry`] decides for a failed item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// As the pipeline's [`RetryPolicy`](super::config::RetryPolicy) says: back off, or give up at
    /// `attempts_max`.
    Policy,
    /// Try again after this span (store clock), whatever the attempt.
    After(Duration),
    /// Give up now: the row takes the policy's `failed_status`.
    GiveUp,
}

/// Everything one processing pass writes, applied in one guarded transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Changes to the leased row.
    pub update: RowUpdate,
    /// Changes to related rows locked in the load phase through [`LoadCx`] (they must still carry the lease's
    /// token); an update of a row no lock of the item's `LoadCx` covers fails the item.
    pub related: Vec<RelatedUpdate>,
    /// Rows to create.
    pub inserts: Vec<NewRow>,
    /// Events to append.
    pub events: Vec<NewEvent>,
    /// Fetch hints the apply publishes when it commits, in its transaction (dstack PIPELINES, checklist 8):
    /// `vec!["job".into()]` wakes the fetchers of `job` rows on every replica, [`NewHint::row`] also marks one row
    /// hinted. A stale apply publishes none ([`ApplyParams::hints`]).
    ///
    /// [`NewHint::row`]: crate::store::NewHint::row
    /// [`ApplyParams::hints`]: crate::store::ApplyParams::hints
    pub hints: Vec<NewHint>,
}

impl Changes {
    /// Changes that set only the main row's status.
    pub fn status(status: impl Into<String>) -> Changes {
        Changes { update: RowUpdate::status(status), ..Changes::default() }
    }
}

/// The load phase's access to the store: short reads and related locks, all on behalf of one lease.
///
/// [`Changes::related`] may update only rows locked through this context: the engine fails an item whose
/// handler updates any other row ([`WorkError::Failed`], "related row … is not locked by this lease"), where the
/// store would find the row not carrying the lease's token and refuse the apply as stale, again at every retry
/// (a new user's trial: an item that never finished and never said why).
///
/// Every row locked through it guards the item's apply, updated or not ([`ApplyParams::locked`]): if one of its
/// locks expired while the item stalled and the row's own pipeline took it, the apply is stale and writes nothing,
/// so a handler never applies what it decided from rows someone else has changed since.
///
/// [`ApplyParams::locked`]: crate::store::ApplyParams::locked
pub struct LoadCx<'a, S: Store> {
    store: &'a S,
    lease: Lease,
    pipeline: &'a str,
    lease_ttl: Duration,
    /// The pipeline's waitlist in this replica, the clock of its waits, and their bound (`retry_delay`).
    waitlist: &'a Waitlist,
    clock: &'a LocalClock,
    wait: Duration,
    /// [`PipelineConfig::waitlist_disabled_for_mutation_test`](super::PipelineConfig).
    waitlist_off: bool,
    /// Whether a contended lock parks the item ([`PipelineConfig::park_waiters`](super::PipelineConfig), and room
    /// among the replica's parked waiters) rather than resetting it.
    park: bool,
    /// Rows locked by this context's calls (a set: a gang restart's pass locks and updates 10 000 rows).
    locked: Mutex<BTreeSet<RowId>>,
}

impl<'a, S: Store> LoadCx<'a, S> {
    pub(crate) fn new(core: &'a Core<S>, lease: Lease) -> Self {
        let config = core.config.as_ref();
        LoadCx {
            store: core.store.as_ref(),
            lease,
            pipeline: &config.name,
            lease_ttl: config.lease_ttl,
            waitlist: &core.waitlist,
            clock: &core.clock,
            wait: config.retry_delay,
            waitlist_off: config.waitlist_disabled_for_mutation_test,
            park: config.park_waiters && core.shared.parked_len() < core.shared.parked_max(),
            locked: Mutex::new(BTreeSet::new()),
        }
    }

    /// Takes `related`'s turns in this replica's waitlist before the store is asked for them: waits for the
    /// pipeline's other items in this replica that hold any, up to `retry_delay` (see [`super::waitlist`]).
    /// Returns whether every turn was taken (with the waitlist off, as if it were): then no other item of the
    /// pipeline in this replica holds any of `related`.
    async fn take_turns(&self, related: &[RowId]) -> bool {
        if self.waitlist_off {
            return true;
        }
        self.waitlist.take(self.lease, related, self.wait, self.clock).await
    }

    /// The first of `related` (a handler's related updates) that no lock of this context covers, as the item's
    /// failure.
    pub(crate) fn unlocked(&self, related: &[RelatedUpdate]) -> Result<(), WorkError> {
        let locked = self.locked.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match related.iter().find(|update| !locked.contains(&update.id)) {
            None => Ok(()),
            Some(update) => Err(WorkError::Failed(format!(
                "related row {} is not locked by this lease (lease {}#{}): lock it in load with LoadCx::lock_related \
                 or LoadCx::lock_shared before updating it",
                update.id, self.lease.id, self.lease.token
            ))),
        }
    }

    /// The item's own row among `related` is the handler's mistake: the lease holds it already, and on contention
    /// its intent mark would keep the item's own pipeline off it for a lease ttl (a new user's trial: items that
    /// stalled 30 s each). Refused before any store call, as the item's failure.
    fn not_its_own_row(&self, related: &[RowId]) -> Result<(), WorkError> {
        if related.contains(&self.lease.id) {
            let id = self.lease.id;
            return Err(WorkError::Failed(format!(
                "related rows include the item's own row {id}: the lease holds it already; lock only other rows"
            )));
        }
        Ok(())
    }

    /// Every row this context's calls locked, by id: the apply's guard covers them all ([`ApplyParams::locked`]).
    ///
    /// [`ApplyParams::locked`]: crate::store::ApplyParams::locked
    pub(crate) fn locked_rows(&self) -> Vec<RowId> {
        self.locked.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).iter().copied().collect()
    }

    fn record_locked(&self, related: &[RowId]) {
        self.locked.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(related.iter().copied());
    }

    /// Whether a contended lock now parks the item: parking is on, and the item holds no related lock yet (a waiter
    /// holds nothing while it waits; a later lock of a handler that locks twice resets as before).
    fn parks(&self) -> bool {
        self.park && self.locked.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_empty()
    }

    /// The store, for reads.
    pub fn store(&self) -> &'a S {
        self.store
    }

    /// The lease being processed.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// Locks `related` rows the parent must hold all of, with the pipeline name as owner (their own pipelines
    /// skip them while fresh). An item of the same pipeline in this replica that holds any of them is waited for
    /// first, up to the pipeline's `retry_delay`, in arrival order ([`Waitlist`]). Errors: [`WorkError::ContendedReset`] if any is held elsewhere (the lease was reset
    /// for retry in the same store call), [`WorkError::Stale`] if this lease is gone.
    pub async fn lock_related(&self, related: Vec<RowId>) -> Result<(), WorkError> {
        self.lock(related, self.pipeline.to_string()).await
    }

    /// Locks a resource shared by several items with owner `Pipeline:{item_id}` ([`shared_owner`]), so two items of
    /// the same pipeline never both hold it (dstack PIPELINES, "Locking a shared related resource"). Items that
    /// contend for several shared rows give way by age: a younger item's intent mark does not hold off an older
    /// item of the pipeline, so the oldest contender always gets all its rows (no cycle of marks). Errors as
    /// [`LoadCx::lock_related`].
    pub async fn lock_shared(&self, related: Vec<RowId>) -> Result<(), WorkError> {
        self.lock(related, shared_owner(self.pipeline, self.lease.id)).await
    }

    /// [`LoadCx::lock_related`], and the rows it locked, as they are under the locks (by id, each once), in the
    /// same store call ([`Store::lock_related_and_read`]): for a handler that reads what it locks. Errors as
    /// [`LoadCx::lock_related`].
    pub async fn lock_and_read_related(&self, related: Vec<RowId>) -> Result<Vec<Row>, WorkError> {
        self.lock_and_read(related, self.pipeline.to_string()).await
    }

    /// [`LoadCx::lock_shared`], and the rows it locked, as [`LoadCx::lock_and_read_related`] reads them.
    pub async fn lock_and_read_shared(&self, related: Vec<RowId>) -> Result<Vec<Row>, WorkError> {
        self.lock_and_read(related, shared_owner(self.pipeline, self.lease.id)).await
    }

    /// The store ask of `lock` and `lock_and_read`, made once the rows passed the own-row check and their turns in
    /// this replica's waitlist were taken; with [`LoadCx::take_turns`]'s answer (every turn taken).
    async fn lock_params(&self, related: Vec<RowId>, owner: String) -> Result<(LockRelatedParams, bool), WorkError> {
        self.not_its_own_row(&related)?;
        let turns = self.take_turns(&related).await;
        let params = LockRelatedParams {
            holder: self.lease,
            related,
            owner,
            lease_ttl: self.lease_ttl,
            retry_delay: self.wait,
            park: self.parks(),
        };
        Ok((params, turns))
    }

    async fn lock_and_read(&self, related: Vec<RowId>, owner: String) -> Result<Vec<Row>, WorkError> {
        let (params, turns) = self.lock_params(related, owner).await?;
        let related = params.related.clone();
        match self.store.lock_related_and_read(params).await? {
            LockRead::Locked(rows) => {
                self.record_locked(&related);
                Ok(rows)
            }
            LockRead::Reset { held, by_own_pipeline } => {
                Err(WorkError::ContendedReset { held, behind_other_replica: by_own_pipeline && turns })
            }
            LockRead::Parked { until, by_own_pipeline } => {
                Err(WorkError::Parked { rows: related, until, behind_other_replica: by_own_pipeline && turns })
            }
            LockRead::Stale => Err(WorkError::Stale),
        }
    }

    async fn lock(&self, related: Vec<RowId>, owner: String) -> Result<(), WorkError> {
        let (params, turns) = self.lock_params(related, owner).await?;
        let related = params.related.clone();
        match self.store.lock_related_or_reset(params).await? {
            LockAttempt::Locked => {
                self.record_locked(&related);
                Ok(())
            }
            LockAttempt::Reset { held, by_own_pipeline } => {
                Err(WorkError::ContendedReset { held, behind_other_replica: by_own_pipeline && turns })
            }
            LockAttempt::Parked { until, by_own_pipeline } => {
                Err(WorkError::Parked { rows: related, until, behind_other_replica: by_own_pipeline && turns })
            }
            LockAttempt::Stale => Err(WorkError::Stale),
        }
    }
}

/// A pipeline's processing logic, generic over the store (STYLE: the engine never names a backend).
///
/// The engine calls `load` with the row (refetched by token, or as the fetch returned it when fresh; see
/// [`PipelineConfig::refetch_after`](super::PipelineConfig::refetch_after)) while the lease is held, then `process`
/// with no store access, then applies the returned [`Changes`] guarded by the lease's token.
pub trait Handler<S: Store>: Send + Sync + 'static {
    /// Whatever `load` gathers for `process`.
    type Context: Send + 'static;

    /// Short store work before processing: read related rows, lock them through `cx`.
    fn load(&self, row: &Row, cx: &LoadCx<'_, S>) -> impl Future<Output = Result<Self::Context, WorkError>> + Send;

    /// The heavy work, outside any store call; returns what to write.
    fn process(&self, row: Row, context: Self::Context) -> impl Future<Output = Result<Changes, WorkError>> + Send;

    /// What to do with an item that failed ([`WorkError::is_item_failure`]): the pipeline's policy by default.
    /// A handler overrides it to give up at once on an error that no retry can cure (a malformed spec), or to
    /// retry sooner or later than the policy would (river's `NextRetry`, pg-boss's per-job options).
    fn retry(&self, failure: &Failure<'_>) -> RetryDecision {
        let _ = failure;
        RetryDecision::Policy
    }
}
