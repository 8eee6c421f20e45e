//! A store reached through a link a test can cut: every call fails, or hangs, as under a partition. Include with
//! `use crate::gang_support::link;`.

#![allow(dead_code)]

use lockstep::store::*;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use tokio::sync::broadcast;

/// How a [`Link`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Calls go through.
    Open = 0,
    /// Calls fail at once with `Unavailable`.
    Failing = 1,
    /// Calls never return (until the link opens again).
    Hanging = 2,
    /// Heartbeats and listings of allocation rows go through; every other call hangs (a store that renews leases
    /// and answers an agent's reads, but whose writes stall).
    HeartbeatsAndListingsOnly = 3,
    /// Listings of allocation rows fail at once; every other call goes through (an agent that renews its lease
    /// but cannot see its allocations).
    AllocationListsFailing = 4,
}

/// A handle on `inner` through a link; clones share the link.
#[derive(Clone)]
pub struct Link {
    inner: MemStore,
    mode: Arc<AtomicU8>,
}

impl Link {
    /// An open link to `inner`.
    pub fn new(inner: MemStore) -> Link {
        Link { inner, mode: Arc::new(AtomicU8::new(Mode::Open as u8)) }
    }

    /// Sets how calls from now on are answered.
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    async fn gate(&self) -> Result<(), StoreError> {
        self.gate_for(false).await
    }

    /// `passes`: the call goes through under [`Mode::HeartbeatsAndListingsOnly`].
    async fn gate_for(&self, passes: bool) -> Result<(), StoreError> {
        loop {
            match self.mode.load(Ordering::SeqCst) {
                0 => return Ok(()),
                3 if passes => return Ok(()),
                4 => return Ok(()),
                1 => return Err(StoreError::Unavailable("link cut".into())),
                // A hanging call waits for the link to open, polling on simulated time.
                _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }

    async fn via<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        self.gate().await?;
        call.await
    }
}

impl Store for Link {
    fn fetch(&self, p: FetchParams) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send {
        self.via(self.inner.fetch(p))
    }
    fn refetch(&self, lease: Lease) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send {
        self.via(self.inner.refetch(lease))
    }
    async fn heartbeat(&self, p: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        self.gate_for(true).await?;
        self.inner.heartbeat(p).await
    }
    fn lock_related(&self, p: LockRelatedParams) -> impl Future<Output = Result<LockOutcome, StoreError>> + Send {
        self.via(self.inner.lock_related(p))
    }
    fn apply(&self, p: ApplyParams) -> impl Future<Output = Result<ApplyOutcome, StoreError>> + Send {
        self.via(self.inner.apply(p))
    }
    fn record_failure(
        &self,
        p: lockstep::store::FailureParams,
    ) -> impl Future<Output = Result<lockstep::store::FailureOutcome, StoreError>> + Send {
        self.via(self.inner.record_failure(p))
    }
    fn reset_for_retry(
        &self,
        lease: Lease,
        delay: std::time::Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.via(self.inner.reset_for_retry(lease, delay))
    }
    fn release(&self, leases: Vec<Lease>) -> impl Future<Output = Result<usize, StoreError>> + Send {
        self.via(self.inner.release(leases))
    }
    fn insert(&self, row: NewRow) -> impl Future<Output = Result<Row, StoreError>> + Send {
        self.via(self.inner.insert(row))
    }
    fn get(&self, id: RowId) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send {
        self.via(self.inner.get(id))
    }
    fn list(&self, kind: &str, parent: Option<RowId>) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send {
        let kind = kind.to_string();
        async move {
            let mode = self.mode.load(Ordering::SeqCst);
            if kind == "allocation" && mode == Mode::AllocationListsFailing as u8 {
                return Err(StoreError::Unavailable("allocation listing failed".into()));
            }
            self.gate_for(kind == "allocation" && mode == Mode::HeartbeatsAndListingsOnly as u8).await?;
            self.inner.list(&kind, parent).await
        }
    }
    fn query(&self, queries: Vec<RowQuery>) -> impl Future<Output = Result<Vec<Vec<Row>>, StoreError>> + Send {
        self.via(self.inner.query(queries))
    }
    fn events(&self, row: RowId) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send {
        self.via(self.inner.events(row))
    }
    fn update_unleased(
        &self,
        id: RowId,
        update: RowUpdate,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send {
        self.via(self.inner.update_unleased(id, update))
    }
    fn hint(&self, kind: &str, row: Option<RowId>) -> impl Future<Output = Result<(), StoreError>> + Send {
        let kind = kind.to_string();
        async move {
            self.gate().await?;
            self.inner.hint(&kind, row).await
        }
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.subscribe_hints()
    }
    fn now(&self) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        self.via(Store::now(&self.inner))
    }
}
