//! The wire protocol between store clients ([`NetStore`](super::net_store::NetStore)) and the database node
//! ([`db`](super::db)): one request datagram per store call, one reply datagram per request, over
//! `madsim::net::Endpoint`. Payloads travel as Rust values (the simulator passes `Box<dyn Any>`), so nothing is
//! serialized; every message can be delayed, lost or cut off by a partition like any packet.

use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Lease, LockOutcome,
    LockRelatedParams, NewRow, Row, RowId, RowQuery, RowUpdate, StoreError, Timestamp, WriteOutcome,
};
use std::sync::Arc;
use std::time::Duration;

/// The database node's port for store calls (PostgreSQL's, for familiarity).
pub const CALL_PORT: u16 = 5432;
/// A replica's port for fetch hints pushed by the database node.
pub const HINT_PORT: u16 = 5433;
/// Tag of request datagrams on [`CALL_PORT`].
pub const TAG_CALL: u64 = 1;
/// Tag of hint-subscription datagrams on [`CALL_PORT`]: the payload is the subscriber's hint address.
pub const TAG_SUBSCRIBE: u64 = 2;
/// Tag of hint datagrams on [`HINT_PORT`]: the payload is a [`Hint`](crate::store::Hint).
pub const TAG_HINT: u64 = 3;
/// Reply tags are at least this, so they never collide with the fixed tags above.
pub const REPLY_TAG_MIN: u64 = 1 << 32;

/// One store call on its way to the database.
#[derive(Debug)]
pub struct Request {
    /// Tag the reply must carry: unique per call in the run.
    pub reply_tag: u64,
    /// The node that sent it, recorded in the commits it makes.
    pub caller: Arc<str>,
    /// The call.
    pub call: Call,
}

/// A store call: one variant per [`Store`](crate::store::Store) method, plus the keyed insert the client
/// uses to retry inserts without duplicating rows.
#[derive(Debug)]
pub enum Call {
    Fetch(FetchParams),
    NextExpiry(FetchParams),
    Refetch(Lease),
    RefetchBatch(Vec<Lease>),
    Heartbeat(HeartbeatParams),
    LockRelated(LockRelatedParams),
    Apply(ApplyParams),
    ApplyBatch(Vec<ApplyParams>),
    RecordFailure(FailureParams),
    Reset(Lease),
    Release(Vec<Lease>),
    Insert(NewRow),
    /// Inserts `row` unless a row was already inserted under `key` (a unique index the database keeps), and
    /// returns the row either way: an insert whose reply was lost can be retried.
    InsertKeyed {
        key: String,
        row: NewRow,
    },
    Get(RowId),
    List {
        kind: String,
        parent: Option<RowId>,
    },
    /// Several indexed reads in one call ([`Store::query`](crate::store::Store::query)).
    Query(Vec<RowQuery>),
    Events(RowId),
    UpdateUnleased {
        id: RowId,
        update: RowUpdate,
    },
    Hint {
        kind: String,
        row: Option<RowId>,
    },
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
            Call::Apply(_) => "apply",
            Call::ApplyBatch(_) => "apply_batch",
            Call::RecordFailure(_) => "record_failure",
            Call::Reset(_) => "reset_for_retry",
            Call::Release(_) => "release",
            Call::Insert(_) => "insert",
            Call::InsertKeyed { .. } => "insert_keyed",
            Call::Get(_) => "get",
            Call::List { .. } => "list",
            Call::Query(_) => "query",
            Call::Events(_) => "events",
            Call::UpdateUnleased { .. } => "update_unleased",
            Call::Hint { .. } => "hint",
            Call::Now => "now",
        }
    }
}

/// What a call returned, one variant per result shape.
#[derive(Debug)]
pub enum Reply {
    Rows(Vec<Row>),
    RowSets(Vec<Vec<Row>>),
    MaybeRow(Option<Row>),
    MaybeRows(Vec<Option<Row>>),
    Row(Row),
    Leases(Vec<Lease>),
    Lock(LockOutcome),
    Apply(ApplyOutcome),
    Applies(Vec<ApplyOutcome>),
    Failure(FailureOutcome),
    Held(bool),
    Count(usize),
    Events(Vec<Event>),
    Write(WriteOutcome),
    Done,
    Now(Timestamp),
    Expiry(Option<Duration>),
}

/// A reply datagram's payload.
pub type Response = Result<Reply, StoreError>;
