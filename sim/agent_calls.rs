//! Faults on one kind of an agent's store calls: its reports (the inserts of its inbox messages), its
//! allocation listings, or its heartbeats (node lease renewals) fail at once or are delayed, while its other calls
//! go through. Such faults reach controller-side states no network fault reaches alone: an agent that renewed its
//! lease and then cannot list its allocations (so it neither starts nor kills until it fences at its lease's local
//! deadline: it renews only after a listing), or one whose start reports stay behind while it runs the job.
//!
//! Each agent node has one [`CallFaults`], shared by the world's fault handle and every incarnation's
//! [`AgentStore`] (a fault outlives a restart of the agent: it is the machine's, like its clock), and cleared when
//! the world heals.

use super::faults::{AgentCall, CallEffect};
use super::net_store::NetStore;
use crate::gang::model::{KIND_ALLOCATION, KIND_INBOX};
use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Hint, Lease,
    LockAttempt, LockOutcome, LockRead, LockRelatedParams, NewHint, NewRow, Row, RowId, RowQuery, RowUpdate, Store,
    StoreError, Timestamp, WriteOutcome,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::broadcast;

/// The call faults in force on one agent node, by kind of call.
#[derive(Debug, Default)]
pub struct CallFaults {
    in_force: Mutex<BTreeMap<AgentCall, CallEffect>>,
}

impl CallFaults {
    /// Puts `effect` on the agent's calls of kind `call` (in place of any before).
    pub fn set(&self, call: AgentCall, effect: CallEffect) {
        self.lock().insert(call, effect);
    }

    /// Lifts the fault on the agent's calls of kind `call`.
    pub fn clear(&self, call: AgentCall) {
        self.lock().remove(&call);
    }

    /// Lifts every fault (the world heals).
    pub fn clear_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<AgentCall, CallEffect>> {
        self.in_force.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies the fault on calls of kind `call`, if one is in force: fails, or waits out the delay.
    async fn gate(&self, call: AgentCall) -> Result<(), StoreError> {
        let effect = self.lock().get(&call).copied();
        match effect {
            None => Ok(()),
            Some(CallEffect::Fail) => {
                Err(StoreError::Unavailable(format!("injected: the agent's {} fail", call.name())))
            }
            Some(CallEffect::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                Ok(())
            }
        }
    }
}

/// An agent node's store: its [`NetStore`], with the node's [`CallFaults`] applied to the calls of each kind.
pub struct AgentStore {
    inner: NetStore,
    faults: Arc<CallFaults>,
}

impl AgentStore {
    /// `inner` with `faults` applied.
    pub fn new(inner: NetStore, faults: Arc<CallFaults>) -> AgentStore {
        AgentStore { inner, faults }
    }
}

impl Store for AgentStore {
    async fn fetch(&self, params: FetchParams) -> Result<Vec<Row>, StoreError> {
        self.inner.fetch(params).await
    }
    async fn next_expiry(&self, params: FetchParams) -> Result<Option<Duration>, StoreError> {
        self.inner.next_expiry(params).await
    }
    async fn fetch_with_expiry(&self, params: FetchParams) -> Result<(Vec<Row>, Option<Duration>), StoreError> {
        self.inner.fetch_with_expiry(params).await
    }
    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        self.inner.refetch(lease).await
    }
    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        self.inner.refetch_batch(leases).await
    }
    async fn heartbeat(&self, params: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        self.faults.gate(AgentCall::Heartbeats).await?;
        self.inner.heartbeat(params).await
    }
    async fn lock_related(&self, params: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        self.inner.lock_related(params).await
    }
    async fn lock_related_or_reset(&self, params: LockRelatedParams) -> Result<LockAttempt, StoreError> {
        self.inner.lock_related_or_reset(params).await
    }
    async fn lock_related_and_read(&self, params: LockRelatedParams) -> Result<LockRead, StoreError> {
        self.inner.lock_related_and_read(params).await
    }
    async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.inner.apply(params).await
    }
    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        self.inner.apply_batch(batch).await
    }
    async fn record_failure(&self, params: FailureParams) -> Result<FailureOutcome, StoreError> {
        self.inner.record_failure(params).await
    }
    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        self.inner.reset_for_retry(lease, delay).await
    }
    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        self.inner.release(leases).await
    }
    async fn insert(&self, row: NewRow) -> Result<Row, StoreError> {
        if row.kind == KIND_INBOX {
            self.faults.gate(AgentCall::Reports).await?;
        }
        self.inner.insert(row).await
    }
    async fn insert_many(&self, rows: Vec<NewRow>, hints: Vec<NewHint>) -> Result<Vec<RowId>, StoreError> {
        if rows.iter().any(|row| row.kind == KIND_INBOX) {
            self.faults.gate(AgentCall::Reports).await?;
        }
        self.inner.insert_many(rows, hints).await
    }
    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        self.inner.get(id).await
    }
    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        if kind == KIND_ALLOCATION {
            self.faults.gate(AgentCall::Allocations).await?;
        }
        self.inner.list(kind, parent).await
    }
    async fn query(&self, queries: Vec<RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        self.inner.query(queries).await
    }
    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        self.inner.events(row).await
    }
    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        self.inner.update_unleased(id, update).await
    }
    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        self.inner.hint(kind, row).await
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.subscribe_hints()
    }
    async fn now(&self) -> Result<Timestamp, StoreError> {
        self.inner.now().await
    }
}
