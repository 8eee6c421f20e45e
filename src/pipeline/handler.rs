//! What a user writes: a [`Handler`] that loads, processes and describes the result of one leased row
//! (dstack PIPELINES, "Typical worker structure": load → process → apply).

use crate::store::{
    Lease, LockOutcome, LockRelatedParams, NewEvent, NewRow, RelatedUpdate, Row, RowId, RowUpdate, Store, StoreError,
};
use std::future::Future;
use std::time::Duration;

/// Why a worker stopped short of a guarded apply.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkError {
    /// A related row is held by someone else: the engine resets the main lease for retry (keeps the owner,
    /// clears token and expiry) so the same pipeline retries on a later fetch (dstack PIPELINES, checklist 7).
    #[error("related lock contended")]
    Contended,
    /// The lease was lost: nothing is written.
    #[error("lease lost")]
    Stale,
    /// The store failed; the lease is left to expire and the row is retried after it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The handler failed; the lease is left to expire and the row is retried after it.
    #[error("{0}")]
    Failed(String),
}

/// Everything one processing pass writes, applied in one guarded transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Changes to the leased row.
    pub update: RowUpdate,
    /// Changes to related rows locked in the load phase (they must still carry the lease's token).
    pub related: Vec<RelatedUpdate>,
    /// Rows to create.
    pub inserts: Vec<NewRow>,
    /// Events to append.
    pub events: Vec<NewEvent>,
    /// Kinds to send a fetch hint for after the apply commits (dstack PIPELINES, checklist 8).
    pub hints: Vec<String>,
}

impl Changes {
    /// Changes that set only the main row's status.
    pub fn status(status: impl Into<String>) -> Changes {
        Changes { update: RowUpdate::status(status), ..Changes::default() }
    }
}

/// The load phase's access to the store: short reads and related locks, all on behalf of one lease.
pub struct LoadCx<'a, S: Store> {
    store: &'a S,
    lease: Lease,
    pipeline: &'a str,
    lease_ttl: Duration,
}

impl<'a, S: Store> LoadCx<'a, S> {
    pub(crate) fn new(store: &'a S, lease: Lease, pipeline: &'a str, lease_ttl: Duration) -> Self {
        LoadCx { store, lease, pipeline, lease_ttl }
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
    /// skip them while fresh). Errors: [`WorkError::Contended`] if any is held elsewhere, [`WorkError::Stale`] if
    /// this lease is gone.
    pub async fn lock_related(&self, related: Vec<RowId>) -> Result<(), WorkError> {
        self.lock(related, self.pipeline.to_string()).await
    }

    /// Locks a resource shared by several items with owner `Pipeline:{item_id}`, so two items of the same
    /// pipeline never both hold it (dstack PIPELINES, "Locking a shared related resource"). Errors as
    /// [`LoadCx::lock_related`].
    pub async fn lock_shared(&self, related: Vec<RowId>) -> Result<(), WorkError> {
        self.lock(related, format!("{}:{}", self.pipeline, self.lease.id)).await
    }

    async fn lock(&self, related: Vec<RowId>, owner: String) -> Result<(), WorkError> {
        let params = LockRelatedParams { holder: self.lease, related, owner, lease_ttl: self.lease_ttl };
        match self.store.lock_related(params).await? {
            LockOutcome::Locked => Ok(()),
            LockOutcome::Contended => Err(WorkError::Contended),
            LockOutcome::Stale => Err(WorkError::Stale),
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
}
