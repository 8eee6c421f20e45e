//! The protocol between store clients ([`NetStore`](super::net_store::NetStore)) and the database node
//! ([`db`](super::db)): one request per store call, one reply per request, each crossing the simulated links of
//! [`Wire`](super::wire::Wire) (delayed, lost, or cut off by a partition like any packet). Payloads travel as Rust
//! values, so nothing is serialized.

use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Lease, LockOutcome,
    LockRelatedParams, NewHint, NewRow, PurgeParams, Row, RowId, RowQuery, RowUpdate, StoreError, Timestamp,
    WriteOutcome,
};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// One store call on its way to the database.
#[derive(Debug)]
pub struct Request {
    /// The node that sent it, recorded in the commits it makes.
    pub caller: Arc<str>,
    /// That node's address, where the reply goes.
    pub from: IpAddr,
    /// How long the request takes to reach the database (simulated time, drawn when it was sent).
    pub latency: Duration,
    /// The call (boxed: a request moves from the caller's future into the database node's task, and a call's
    /// parameters are over a hundred bytes).
    pub call: Box<Call>,
    /// Where the reply goes; dropped unanswered when the request, the database node or the reply is lost.
    pub reply: oneshot::Sender<Delivery>,
}

/// A reply on its way back to the caller.
#[derive(Debug)]
pub struct Delivery {
    /// What the call returned.
    pub response: Response,
    /// When the database node handed the reply over (simulated): it holds the reply until `leaves`.
    pub handed: Instant,
    /// When the reply leaves the database node: a kill of the node before then loses it.
    pub leaves: Instant,
    /// When the reply reaches the caller.
    pub arrives: Instant,
}

/// A store call: one variant per [`Store`](crate::store::Store) method, plus the keyed insert the client
/// uses to retry inserts without duplicating rows.
#[derive(Debug)]
pub enum Call {
    /// [`Store::fetch`](crate::store::Store::fetch): lease ready rows.
    Fetch(FetchParams),
    /// [`Store::next_expiry`](crate::store::Store::next_expiry): how long until the first lease or mark on the
    /// rows the fetch looks at ends.
    NextExpiry(FetchParams),
    /// [`Store::refetch`](crate::store::Store::refetch): the leased row, if the lease still holds.
    Refetch(Lease),
    /// [`Store::refetch_batch`](crate::store::Store::refetch_batch): [`Call::Refetch`] of several leases, read in one snapshot.
    RefetchBatch(Vec<Lease>),
    /// [`Store::heartbeat`](crate::store::Store::heartbeat): extend the leases still held.
    Heartbeat(HeartbeatParams),
    /// [`Store::lock_related`](crate::store::Store::lock_related): lock rows under the holder's token.
    LockRelated(LockRelatedParams),
    /// [`Store::lock_related_until`](crate::store::Store::lock_related_until): the lock, and on contention the
    /// span until the unavailable rows' locks or marks expire. The first step of
    /// [`Store::lock_related_or_reset`](crate::store::Store::lock_related_or_reset), whose reset is a
    /// [`Call::Reset`] of its own, as PgStore runs a transaction and then a statement (docs/simulator.md, "Atomic
    /// units").
    LockRelatedUntil(LockRelatedParams),
    /// The lock of [`Store::lock_related_and_read`](crate::store::Store::lock_related_and_read) and, when it is
    /// taken, the rows it locked, in one step (PgStore's one transaction); the reset of a contended lock is a
    /// [`Call::Reset`] of its own, as PgStore's is a second statement.
    LockRelatedAndRead(LockRelatedParams),
    /// [`Store::apply`](crate::store::Store::apply): a guarded apply.
    Apply(ApplyParams),
    /// [`Store::apply_batch`](crate::store::Store::apply_batch): several guarded applies, each guarded on its own.
    ApplyBatch(Vec<ApplyParams>),
    /// [`Store::record_failure`](crate::store::Store::record_failure): a leased item failed.
    RecordFailure(FailureParams),
    /// [`Store::reset_for_retry`](crate::store::Store::reset_for_retry): the lease and the delay (simulated time, on the store's clock) before a fetch
    /// may take the row again.
    Reset(Lease, Duration),
    /// [`Store::release`](crate::store::Store::release): give leases back.
    Release(Vec<Lease>),
    /// [`Store::insert`](crate::store::Store::insert): one row, outside any lease.
    Insert(NewRow),
    /// [`Store::insert_many`](crate::store::Store::insert_many)'s rows, inserted in order, all or none: its hints
    /// are a [`Call::PublishHints`] of their own, as PgStore's are a second statement.
    InsertMany(Vec<NewRow>),
    /// The fetch hints of a call that committed ([`Store::apply`](crate::store::Store::apply),
    /// [`Store::apply_batch`](crate::store::Store::apply_batch), [`Store::insert_many`](crate::store::Store::insert_many)),
    /// sent after it as a call of their own, as PgStore sends them in a statement after the commit: the rows they
    /// name marked hinted, each kind published once (docs/simulator.md, "Atomic units").
    PublishHints(Vec<NewHint>),
    /// Inserts `row` unless a row was already inserted under `key` (a unique index the database keeps), and
    /// returns the row either way, and whether this call inserted it: an insert whose reply was lost can be
    /// retried ([`Store::insert_keyed`](crate::store::Store::insert_keyed)). Then sends `hint`, if any.
    InsertKeyed {
        /// The key, unique in the run (the workload's `insert` key).
        key: String,
        /// The row to insert.
        row: NewRow,
        /// The hint sent after the insert (also when the key named a row already), if any.
        hint: Option<InsertHint>,
    },
    /// The workload's job and its tasks in one call, as a service's endpoint that creates a job with its tasks in
    /// one transaction: each of `tasks` keyed `{key}-task-{index}`, then `job` keyed `key` with its data's
    /// `tasks` set to the tasks' ids, each a [`Call::InsertKeyed`] (so a retry inserts nothing twice); then a hint
    /// for the tasks' kind and one that marks the job hinted. Returns the job.
    InsertJob {
        /// The job's key; the tasks' keys derive from it.
        key: String,
        /// The job's tasks, inserted first.
        tasks: Vec<NewRow>,
        /// The job, whose data's `tasks` the call sets.
        job: NewRow,
    },
    /// `rows` inserted together unless rows were inserted under `key` already, and the rows `key` names either
    /// way, in input order: a workload's enqueue in its own transaction (`WorkloadClient::insert_many`). The rows go
    /// in one [`Store::insert_many`](crate::store::Store::insert_many) with
    /// [`NewHint::kinds_of`](crate::store::NewHint::kinds_of) them, all or none, each kind hinted once committed, as
    /// `PgStore::insert_in` stores and hints them at the caller's commit; each is keyed `{key}-{index}`, so a call
    /// whose reply was lost is retried with the same key and inserts nothing twice.
    InsertManyKeyed {
        /// The key of the whole call; each row's key derives from it.
        key: String,
        /// The rows, in order.
        rows: Vec<NewRow>,
    },
    /// [`Store::get`](crate::store::Store::get): one row by id.
    Get(RowId),
    /// [`Store::list`](crate::store::Store::list): the rows of a kind.
    List {
        /// The kind listed.
        kind: String,
        /// Only the children of this row, if given.
        parent: Option<RowId>,
    },
    /// Several indexed reads in one call ([`Store::query`](crate::store::Store::query)).
    Query(Vec<RowQuery>),
    /// [`Store::events`](crate::store::Store::events): a row's events, in sequence order.
    Events(RowId),
    /// [`Store::update_unleased`](crate::store::Store::update_unleased): a write API's update, refused while the row is leased.
    UpdateUnleased {
        /// The row to update.
        id: RowId,
        /// What to write.
        update: RowUpdate,
    },
    /// [`Store::hint`](crate::store::Store::hint): wake the fetchers of a kind on every replica.
    Hint {
        /// The kind hinted.
        kind: String,
        /// The row the hint names, if any.
        row: Option<RowId>,
    },
    /// Retention's delete ([`Store::purge`](crate::store::Store::purge)).
    Purge(PurgeParams),
    /// [`Store::now`](crate::store::Store::now): the database's clock (store time).
    Now,
}

impl Call {
    /// The call's name in traces.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Fetch(_) => "fetch",
            Call::NextExpiry(_) => "next_expiry",
            Call::Refetch(_) => "refetch",
            Call::RefetchBatch(_) => "refetch_batch",
            Call::Heartbeat(_) => "heartbeat",
            Call::LockRelated(_) => "lock_related",
            Call::LockRelatedUntil(_) => "lock_related_until",
            Call::LockRelatedAndRead(_) => "lock_related_and_read",
            Call::Apply(_) => "apply",
            Call::ApplyBatch(_) => "apply_batch",
            Call::RecordFailure(_) => "record_failure",
            Call::Reset(..) => "reset_for_retry",
            Call::Release(_) => "release",
            Call::Insert(_) => "insert",
            Call::InsertMany(_) => "insert_many",
            Call::PublishHints(_) => "publish_hints",
            Call::InsertKeyed { .. } => "insert_keyed",
            Call::InsertJob { .. } => "insert_job",
            Call::InsertManyKeyed { .. } => "insert_many_keyed",
            Call::Get(_) => "get",
            Call::List { .. } => "list",
            Call::Query(_) => "query",
            Call::Events(_) => "events",
            Call::UpdateUnleased { .. } => "update_unleased",
            Call::Hint { .. } => "hint",
            Call::Purge(_) => "purge",
            Call::Now => "now",
        }
    }
}

/// The fetch hint a keyed insert sends once its row is in, in the same call (as a trigger's `NOTIFY` in the
/// insert's transaction): the workload client's inserts and their hints cost one round trip, not two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertHint {
    /// A hint for the row's kind.
    Kind,
    /// A hint for the row's kind that marks the row hinted (it skips `min_processing_interval` once).
    Row,
}

/// What a call returned, one variant per result shape.
#[derive(Debug)]
pub enum Reply {
    /// Rows: of [`Call::Fetch`] (the leased rows), [`Call::List`] and [`Call::InsertManyKeyed`] (the rows its
    /// key names, in input order).
    Rows(Vec<Row>),
    /// [`Call::Query`]'s rows, one set per query in order.
    RowSets(Vec<Vec<Row>>),
    /// A row is boxed, here and in `Row`: a reply moves by value from the database node's task through the reply
    /// channel into the caller's future, and an inline `Row` (248 bytes) made every reply that large.
    /// [`Call::Refetch`] or [`Call::Get`]: the row, or `None` (lease lost, or no such row).
    MaybeRow(Option<Box<Row>>),
    /// [`Call::RefetchBatch`]: one entry per lease, in order, `None` where the lease is lost.
    MaybeRows(Vec<Option<Row>>),
    /// [`Call::Insert`]'s row as stored, or [`Call::InsertJob`]'s job.
    Row(Box<Row>),
    /// A [`Call::InsertKeyed`]'s row, and whether the call inserted it (false: its key named it already).
    Keyed(Box<Row>, bool),
    /// [`Call::Heartbeat`]: the leases extended.
    Leases(Vec<Lease>),
    /// [`Call::InsertMany`]: the new rows' ids, in input order.
    Ids(Vec<RowId>),
    /// [`Call::LockRelated`]'s outcome.
    Lock(LockOutcome),
    /// [`Call::LockRelatedUntil`]'s outcome and, when contended, the span (on the store's clock, from its `now`)
    /// until the unavailable rows' locks or marks expire (`None` when one has none).
    LockUntil(LockOutcome, Option<Duration>),
    /// [`Call::LockRelatedAndRead`]'s outcome, the rows it locked (empty unless the lock was taken; by id), and
    /// the span of [`Reply::LockUntil`].
    LockReading(LockOutcome, Vec<Row>, Option<Duration>),
    /// [`Call::Apply`]'s outcome.
    Apply(ApplyOutcome),
    /// [`Call::ApplyBatch`]: one outcome per apply, in order.
    Applies(Vec<ApplyOutcome>),
    /// [`Call::RecordFailure`]'s outcome.
    Failure(FailureOutcome),
    /// [`Call::Reset`]: whether the lease was still held, and so reset.
    Held(bool),
    /// A count: of [`Call::Release`] (leases released) or [`Call::Purge`] (rows deleted).
    Count(usize),
    /// [`Call::Events`]: the row's events, in sequence order.
    Events(Vec<Event>),
    /// [`Call::UpdateUnleased`]'s outcome.
    Write(WriteOutcome),
    /// [`Call::Hint`] or [`Call::PublishHints`] was sent.
    Done,
    /// [`Call::Now`]: the database's clock.
    Now(Timestamp),
    /// [`Call::NextExpiry`]: the span (on the store's clock, from its `now`) until the first lease or mark on the
    /// fetch's rows ends; `None` when there is none.
    Expiry(Option<Duration>),
}

/// A reply datagram's payload.
pub type Response = Result<Reply, StoreError>;
