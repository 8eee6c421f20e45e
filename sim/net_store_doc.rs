//! A [`Store`] whose every call crosses the simulated network to the database node (DESIGN §5). This page is the
//! plain build's stand-in, for `cargo doc`: the network store and its simulated links exist only in the simulator
//! build (`--cfg madsim`, DESIGN §6), where [`NetStore`] is what
//! [`SimStore`](super::user::SimStore) names and what your handlers run on. Every [`Store`] method is there, each
//! call one request and one reply that a fault can delay, lose or cut off (the outcome is then unknown:
//! [`StoreError::Timeout`]).
//!
//! Nothing here is compiled outside `cargo doc`: `cfg(all(doc, not(madsim)))` in `sim/mod.rs`.

use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Hint, Lease,
    LockOutcome, LockRelatedParams, NewRow, Row, RowId, RowUpdate, Store, StoreError, Timestamp, WriteOutcome,
};
use std::time::Duration;
use tokio::sync::broadcast;

/// A store client on a simulated node (simulator build only). Dropping it stops its hint tasks.
pub struct NetStore {
    _simulator_only: (),
}

/// The [`Store`] methods NetStore implements in the simulator build; their bodies here are never compiled.
impl Store for NetStore {
    async fn fetch(&self, _: FetchParams) -> Result<Vec<Row>, StoreError> {
        unreachable!()
    }
    async fn refetch(&self, _: Lease) -> Result<Option<Row>, StoreError> {
        unreachable!()
    }
    async fn heartbeat(&self, _: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        unreachable!()
    }
    async fn lock_related(&self, _: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        unreachable!()
    }
    async fn apply(&self, _: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        unreachable!()
    }
    async fn record_failure(&self, _: FailureParams) -> Result<FailureOutcome, StoreError> {
        unreachable!()
    }
    async fn reset_for_retry(&self, _: Lease, _: Duration) -> Result<bool, StoreError> {
        unreachable!()
    }
    async fn release(&self, _: Vec<Lease>) -> Result<usize, StoreError> {
        unreachable!()
    }
    async fn insert(&self, _: NewRow) -> Result<Row, StoreError> {
        unreachable!()
    }
    async fn get(&self, _: RowId) -> Result<Option<Row>, StoreError> {
        unreachable!()
    }
    async fn list(&self, _: &str, _: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        unreachable!()
    }
    async fn events(&self, _: RowId) -> Result<Vec<Event>, StoreError> {
        unreachable!()
    }
    async fn update_unleased(&self, _: RowId, _: RowUpdate) -> Result<WriteOutcome, StoreError> {
        unreachable!()
    }
    async fn hint(&self, _: &str, _: Option<RowId>) -> Result<(), StoreError> {
        unreachable!()
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        unreachable!()
    }
    async fn now(&self) -> Result<Timestamp, StoreError> {
        unreachable!()
    }
}
