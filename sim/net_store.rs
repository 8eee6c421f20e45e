//! A [`Store`] whose every call crosses the simulated network to the database node (DESIGN §5).
//!
//! A call is one request datagram and one reply datagram; either can be delayed, lost, or cut off by a
//! partition, and the database may die or drop the reply after committing. The client waits at most its call
//! time-out and then returns [`StoreError::Timeout`]: the outcome is unknown, as with a PostgreSQL connection
//! that broke mid-call. Fetch hints reach every replica: each subscribes its hint port at the database node
//! (and renews the subscription every second, so it survives database restarts and healed partitions), and the
//! node pushes every hint to every subscriber.

use super::rpc::{Call, HINT_PORT, REPLY_TAG_MIN, Reply, Request, Response, TAG_HINT, TAG_SUBSCRIBE};
use super::trace::Trace;
use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HINT_BUFFER_LEN_MAX, HeartbeatParams,
    Hint, Lease, LockOutcome, LockRelatedParams, NewRow, Row, RowId, RowQuery, RowUpdate, Store, StoreError, Timestamp,
    WriteOutcome,
};
use madsim::net::Endpoint;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// How often a subscriber renews its hint subscription.
pub const HINT_RENEW_INTERVAL: Duration = Duration::from_secs(1);
/// Calls that timed out before a client rebinds its call endpoint. A reply that arrives after its call gave up
/// stays in the endpoint's mailbox for good (madsim keeps unclaimed datagrams), and every later call scans the
/// mailbox, so a long run with many time-outs would slow down quadratically without a fresh endpoint now and then.
pub const ABANDONED_CALLS_MAX: usize = 64;

/// How to connect a [`NetStore`].
#[derive(Clone, Debug)]
pub struct NetStoreOptions {
    /// The node this client runs on, as traces and commits name it.
    pub node: Arc<str>,
    /// That node's IP address.
    pub ip: IpAddr,
    /// The database node's call address.
    pub db: SocketAddr,
    /// How long a call waits for its reply (simulated time).
    pub call_timeout: Duration,
    /// Whether to subscribe to fetch hints (replicas do; the workload client does not).
    pub hints: bool,
    /// First reply tag of this client: unique per client in the run, so a late reply to a call of an earlier
    /// incarnation of the node can never be taken for the reply to a new call.
    pub tag_base: u64,
}

impl NetStoreOptions {
    /// Options for a new client on `node` (at `ip`) of the database at `db`, with the next reply-tag range of the
    /// run's allocator `clients` (see [`tag_base`]).
    pub fn next_client(
        node: Arc<str>,
        ip: IpAddr,
        db: SocketAddr,
        call_timeout: Duration,
        hints: bool,
        clients: &AtomicU64,
    ) -> NetStoreOptions {
        NetStoreOptions { node, ip, db, call_timeout, hints, tag_base: tag_base(clients) }
    }
}

/// A reply-tag range for a new store client: `(n + 1) << 32` for the n-th client of the run.
pub fn tag_base(clients: &AtomicU64) -> u64 {
    (clients.fetch_add(1, Ordering::SeqCst) + 1) << 32
}

/// A store client on a simulated node. Dropping it stops its hint tasks.
pub struct NetStore {
    options: NetStoreOptions,
    endpoint: Mutex<Endpoint>,
    next_tag: AtomicU64,
    abandoned: AtomicUsize,
    hints: broadcast::Sender<Hint>,
    trace: Trace,
    tasks: Vec<JoinHandle<()>>,
}

impl NetStore {
    /// Binds the client's endpoints on the current node and, with `options.hints`, starts receiving hints.
    pub async fn connect(options: NetStoreOptions, trace: Trace) -> NetStore {
        assert!(options.tag_base >= REPLY_TAG_MIN, "reply tags must not collide with the fixed tags");
        let endpoint = Endpoint::bind(SocketAddr::new(options.ip, 0)).await.expect("an ephemeral port is free");
        let (hints, _) = broadcast::channel(HINT_BUFFER_LEN_MAX);
        let mut tasks = Vec::new();
        if options.hints {
            let hint_addr = SocketAddr::new(options.ip, HINT_PORT);
            let hint_endpoint =
                Endpoint::bind(hint_addr).await.expect("the hint port is free (a restarted node was killed first)");
            tasks.push(tokio::spawn(receive_hints(hint_endpoint, hints.clone())));
            tasks.push(tokio::spawn(renew_subscription(endpoint.clone(), options.db, hint_addr)));
        }
        NetStore {
            next_tag: AtomicU64::new(options.tag_base),
            options,
            endpoint: Mutex::new(endpoint),
            abandoned: AtomicUsize::new(0),
            hints,
            trace,
            tasks,
        }
    }

    /// Inserts `row` unless one was inserted under `key` already; returns the row either way. Safe to retry
    /// after an error whose outcome is unknown.
    pub async fn insert_keyed(&self, key: String, row: NewRow) -> Result<Row, StoreError> {
        match self.call(Call::InsertKeyed { key, row }).await? {
            Reply::Row(row) => Ok(row),
            other => unexpected("insert_keyed", other),
        }
    }

    /// One call: send the request, wait for the reply within the call time-out.
    async fn call(&self, call: Call) -> Response {
        let name = call.name();
        let reply_tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let endpoint = self.endpoint().clone();
        let request = Request { reply_tag, caller: self.options.node.clone(), call };
        let exchange = async {
            endpoint.send_to_raw(self.options.db, super::rpc::TAG_CALL, Box::new(request)).await?;
            endpoint.recv_from_raw(reply_tag).await
        };
        match tokio::time::timeout(self.options.call_timeout, exchange).await {
            Ok(Ok((payload, _))) => *payload.downcast::<Response>().expect("a reply datagram carries a Response"),
            Ok(Err(error)) => Err(StoreError::Unavailable(format!("{name}: {error}"))),
            Err(_) => {
                self.trace.record(&self.options.node, "call-timeout", name);
                self.abandon().await;
                Err(StoreError::Timeout(self.options.call_timeout))
            }
        }
    }

    /// Counts a call that gave up, and rebinds the call endpoint after [`ABANDONED_CALLS_MAX`] of them. Calls
    /// in flight keep the old endpoint until they finish.
    async fn abandon(&self) {
        if self.abandoned.fetch_add(1, Ordering::Relaxed) + 1 < ABANDONED_CALLS_MAX {
            return;
        }
        self.abandoned.store(0, Ordering::Relaxed);
        let fresh = Endpoint::bind(SocketAddr::new(self.options.ip, 0)).await.expect("an ephemeral port is free");
        *self.endpoint() = fresh;
    }

    fn endpoint(&self) -> MutexGuard<'_, Endpoint> {
        self.endpoint.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for NetStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Hands every hint datagram to the local subscribers.
async fn receive_hints(endpoint: Endpoint, hints: broadcast::Sender<Hint>) {
    while let Ok((payload, _)) = endpoint.recv_from_raw(TAG_HINT).await {
        let kind = *payload.downcast::<Hint>().expect("a hint datagram carries a Hint");
        // No local subscriber yet is not an error.
        let _ = hints.send(kind);
    }
}

/// Renews the hint subscription every [`HINT_RENEW_INTERVAL`], forever.
async fn renew_subscription(endpoint: Endpoint, db: SocketAddr, hint_addr: SocketAddr) {
    loop {
        let _ = endpoint.send_to_raw(db, TAG_SUBSCRIBE, Box::new(hint_addr)).await;
        tokio::time::sleep(HINT_RENEW_INTERVAL).await;
    }
}

fn unexpected(call: &str, reply: Reply) -> ! {
    panic!("the database answered {call} with {reply:?}")
}

impl Store for NetStore {
    async fn fetch(&self, params: FetchParams) -> Result<Vec<Row>, StoreError> {
        match self.call(Call::Fetch(params)).await? {
            Reply::Rows(rows) => Ok(rows),
            other => unexpected("fetch", other),
        }
    }

    async fn next_expiry(&self, params: FetchParams) -> Result<Option<Duration>, StoreError> {
        match self.call(Call::NextExpiry(params)).await? {
            Reply::Expiry(span) => Ok(span),
            other => unexpected("next_expiry", other),
        }
    }

    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        match self.call(Call::Refetch(lease)).await? {
            Reply::MaybeRow(row) => Ok(row),
            other => unexpected("refetch", other),
        }
    }

    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        // One datagram each way for the whole batch, as PgStore's one statement.
        match self.call(Call::RefetchBatch(leases)).await? {
            Reply::MaybeRows(rows) => Ok(rows),
            other => unexpected("refetch_batch", other),
        }
    }

    async fn heartbeat(&self, params: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        match self.call(Call::Heartbeat(params)).await? {
            Reply::Leases(leases) => Ok(leases),
            other => unexpected("heartbeat", other),
        }
    }

    async fn lock_related(&self, params: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        match self.call(Call::LockRelated(params)).await? {
            Reply::Lock(outcome) => Ok(outcome),
            other => unexpected("lock_related", other),
        }
    }

    async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        match self.call(Call::Apply(params)).await? {
            Reply::Apply(outcome) => Ok(outcome),
            other => unexpected("apply", other),
        }
    }

    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // One datagram each way for the whole batch: a lost reply leaves every item's outcome unknown.
        match self.call(Call::ApplyBatch(batch)).await? {
            Reply::Applies(outcomes) => Ok(outcomes),
            other => unexpected("apply_batch", other),
        }
    }

    async fn record_failure(&self, params: FailureParams) -> Result<FailureOutcome, StoreError> {
        match self.call(Call::RecordFailure(params)).await? {
            Reply::Failure(outcome) => Ok(outcome),
            other => unexpected("record_failure", other),
        }
    }

    async fn reset_for_retry(&self, lease: Lease) -> Result<bool, StoreError> {
        match self.call(Call::Reset(lease)).await? {
            Reply::Held(held) => Ok(held),
            other => unexpected("reset_for_retry", other),
        }
    }

    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        match self.call(Call::Release(leases)).await? {
            Reply::Count(count) => Ok(count),
            other => unexpected("release", other),
        }
    }

    async fn insert(&self, row: NewRow) -> Result<Row, StoreError> {
        match self.call(Call::Insert(row)).await? {
            Reply::Row(row) => Ok(row),
            other => unexpected("insert", other),
        }
    }

    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        match self.call(Call::Get(id)).await? {
            Reply::MaybeRow(row) => Ok(row),
            other => unexpected("get", other),
        }
    }

    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        match self.call(Call::List { kind: kind.to_string(), parent }).await? {
            Reply::Rows(rows) => Ok(rows),
            other => unexpected("list", other),
        }
    }

    async fn query(&self, queries: Vec<RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        match self.call(Call::Query(queries)).await? {
            Reply::RowSets(rows) => Ok(rows),
            other => unexpected("query", other),
        }
    }

    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        match self.call(Call::Events(row)).await? {
            Reply::Events(events) => Ok(events),
            other => unexpected("events", other),
        }
    }

    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        match self.call(Call::UpdateUnleased { id, update }).await? {
            Reply::Write(outcome) => Ok(outcome),
            other => unexpected("update_unleased", other),
        }
    }

    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        match self.call(Call::Hint { kind: kind.to_string(), row }).await? {
            Reply::Done => Ok(()),
            other => unexpected("hint", other),
        }
    }

    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.hints.subscribe()
    }

    async fn now(&self) -> Result<Timestamp, StoreError> {
        match self.call(Call::Now).await? {
            Reply::Now(now) => Ok(now),
            other => unexpected("now", other),
        }
    }
}
