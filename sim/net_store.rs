//! A [`Store`] whose every call crosses the simulated network to the database node (DESIGN §5).
//!
//! A call is one request and one reply, each crossing the link between the client's node and the database node
//! ([`Wire`](super::wire::Wire)): either can be delayed, lost, or cut off by a partition, and the database may die
//! or drop the reply after committing. The client waits at most its call time-out and then returns
//! [`StoreError::Timeout`]: the outcome is unknown, as with a PostgreSQL connection that broke mid-call. Fetch
//! hints reach every replica: each subscribes at the database node (and renews the subscription every second
//! across its link, so it survives database restarts and healed partitions), and the node pushes every hint to
//! every subscriber.
//!
//! A call takes two timers of the simulator: the database node's task waits out the request's latency and its
//! queue delay, and the caller waits until the reply arrives, or until its time-out when the reply will not come
//! (a lost request or reply is known when it is lost, so no time-out timer waits beside every call).

use super::db::Database;
use super::rpc::{Call, InsertHint, Reply, Request, Response};
use super::trace::Trace;
use crate::store::{
    ApplyOutcome, ApplyParams, Event, FailureOutcome, FailureParams, FetchParams, HINT_BUFFER_LEN_MAX, HeartbeatParams,
    Hint, InsertKeyedParams, KeyedInsert, Lease, LockOutcome, LockRead, LockRelatedParams, NewHint, NewRow,
    PurgeParams, Row, RowId, RowQuery, RowUpdate, Store, StoreError, Timestamp, WriteOutcome, check_insert_keyed,
};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often a subscriber renews its hint subscription.
pub const HINT_RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// How to connect a [`NetStore`].
#[derive(Clone)]
pub struct NetStoreOptions {
    /// The node this client runs on, as traces and commits name it.
    pub node: Arc<str>,
    /// That node's IP address.
    pub ip: IpAddr,
    /// The database.
    pub db: Arc<Database>,
    /// How long a call waits for its reply (simulated time).
    pub call_timeout: Duration,
    /// Whether to subscribe to fetch hints (replicas do; the workload client does not).
    pub hints: bool,
}

/// A reply-tag range for a new client of the world's services: `(n + 1) << 32` for the n-th client of the run.
pub fn tag_base(clients: &AtomicU64) -> u64 {
    (clients.fetch_add(1, Ordering::SeqCst) + 1) << 32
}

/// A store client on a simulated node. Dropping it stops its hint tasks.
pub struct NetStore {
    options: NetStoreOptions,
    hints: broadcast::Sender<Hint>,
    trace: Trace,
    tasks: Vec<JoinHandle<()>>,
}

impl NetStore {
    /// A client on the current node; with `options.hints`, it starts receiving hints.
    pub async fn connect(options: NetStoreOptions, trace: Trace) -> NetStore {
        let (hints, _) = broadcast::channel(HINT_BUFFER_LEN_MAX);
        let mut tasks = Vec::new();
        if options.hints {
            let (sender, received) = mpsc::unbounded_channel();
            tasks.push(tokio::spawn(receive_hints(received, hints.clone())));
            tasks.push(tokio::spawn(renew_subscription(options.db.clone(), options.ip, sender)));
        }
        NetStore { options, hints, trace, tasks }
    }

    /// Inserts `row` unless one was inserted under `key` already; returns the row either way. Safe to retry
    /// after an error whose outcome is unknown.
    pub async fn insert_keyed(&self, key: String, row: NewRow) -> Result<Row, StoreError> {
        self.insert_keyed_hinting(key, row, None).await
    }

    /// [`NetStore::insert_keyed`], then, in the same call, the fetch hint `hint` (if any) for the row's kind.
    pub async fn insert_keyed_hinting(
        &self,
        key: String,
        row: NewRow,
        hint: Option<InsertHint>,
    ) -> Result<Row, StoreError> {
        match self.call(Call::InsertKeyed { key, row, hint }).await? {
            Reply::Keyed(row, _) => Ok(*row),
            other => unexpected("insert_keyed", other),
        }
    }

    /// Inserts a workload job and its tasks in one call ([`Call::InsertJob`]); returns the job. Safe to retry after
    /// an error whose outcome is unknown: every row is keyed.
    pub async fn insert_job(&self, key: String, tasks: Vec<NewRow>, job: NewRow) -> Result<Row, StoreError> {
        match self.call(Call::InsertJob { key, tasks, job }).await? {
            Reply::Row(row) => Ok(*row),
            other => unexpected("insert_job", other),
        }
    }

    /// Inserts `rows` together under `key` in one call ([`Call::InsertManyKeyed`]): all or none, each kind hinted
    /// once committed, nothing inserted twice for one key; returns the rows the key names, in input order. Safe to
    /// retry after an error whose outcome is unknown.
    pub async fn insert_many_keyed(&self, key: String, rows: Vec<NewRow>) -> Result<Vec<Row>, StoreError> {
        match self.call(Call::InsertManyKeyed { key, rows }).await? {
            Reply::Rows(rows) => Ok(rows),
            other => unexpected("insert_many_keyed", other),
        }
    }

    /// One call: send the request, wait for the reply within the call time-out.
    async fn call(&self, call: Call) -> Response {
        let options = &self.options;
        let name = call.name();
        let deadline = options.db.time().now() + options.call_timeout;
        let (reply, replied) = oneshot::channel();
        // The reply sender is dropped (here, or by the database node) when the request is lost, when the node dies
        // or when it drops the reply: the call then times out.
        match options.db.wire().send(options.ip, options.db.ip()) {
            Some(latency) => options.db.submit(Request {
                caller: options.node.clone(),
                from: options.ip,
                latency,
                call: Box::new(call),
                reply,
            }),
            None => drop(reply),
        }
        if let Ok(delivery) = replied.await
            && delivery.arrives <= deadline
        {
            tokio::time::sleep_until(delivery.arrives).await;
            if let Some(response) = options.db.delivered(delivery) {
                return response;
            }
        }
        tokio::time::sleep_until(deadline).await;
        self.trace.record(&options.node, "call-timeout", name);
        Err(StoreError::Timeout(options.call_timeout))
    }
}

impl Drop for NetStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Hands every hint to the local subscribers once it arrives.
async fn receive_hints(mut received: mpsc::UnboundedReceiver<(Instant, Hint)>, hints: broadcast::Sender<Hint>) {
    while let Some((arrives, kind)) = received.recv().await {
        tokio::time::sleep_until(arrives).await;
        // No local subscriber yet is not an error.
        let _ = hints.send(kind);
    }
}

/// Renews the hint subscription of the node at `ip` every [`HINT_RENEW_INTERVAL`], forever; a renewal crosses
/// the link to the database (a lost one is not retried before the next). A renewal that subscribes anew (the
/// subscription lapsed, a hint to it was lost, or the database restarted) hands the local subscribers the catch-up
/// hint ([`crate::store::HINT_EVERY_KIND`]): hints sent meanwhile were lost, as PgStore's listener does after it
/// listens again.
async fn renew_subscription(db: Arc<Database>, ip: IpAddr, hints: super::db::HintSender) {
    let mut subscribed = false;
    loop {
        if db.wire().send(ip, db.ip()).is_some() && db.subscribe(ip, hints.clone()) {
            if subscribed {
                let _ = hints.send((Instant::now(), crate::store::HINT_EVERY_KIND.to_string()));
            }
            subscribed = true;
        }
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

    // `fetch_with_expiry` is the trait's default: a fetch, then (when it leased nothing) a `next_expiry`, two calls
    // as PgStore's two statements, so every fault can fall between them (docs/simulator.md, "Atomic units").

    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        match self.call(Call::Refetch(lease)).await? {
            Reply::MaybeRow(row) => Ok(row.map(|row| *row)),
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

    async fn lock_related_until(
        &self,
        params: LockRelatedParams,
    ) -> Result<(LockOutcome, Option<Duration>), StoreError> {
        match self.call(Call::LockRelatedUntil(params)).await? {
            Reply::LockUntil(outcome, until) => Ok((outcome, until)),
            other => unexpected("lock_related_until", other),
        }
    }

    // `lock_related_or_reset` is the trait's default: the lock, then on contention the reset, two calls as
    // PgStore's transaction and statement (docs/simulator.md, "Atomic units").

    async fn lock_related_and_read(&self, params: LockRelatedParams) -> Result<LockRead, StoreError> {
        // The lock and the read of what it locked in one call, as PgStore's one transaction; the reset of a
        // contended lock is a second call, as PgStore's second statement (docs/simulator.md, "Atomic units").
        let (holder, retry_delay, park) = (params.holder, params.retry_delay, params.park);
        let (outcome, rows, until) = match self.call(Call::LockRelatedAndRead(params)).await? {
            Reply::LockReading(outcome, rows, until) => (outcome, rows, until),
            other => unexpected("lock_related_and_read", other),
        };
        Ok(match outcome {
            LockOutcome::Locked => LockRead::Locked(rows),
            LockOutcome::Stale => LockRead::Stale,
            LockOutcome::Contended { by_own_pipeline } if park => LockRead::Parked { until, by_own_pipeline },
            LockOutcome::Contended { by_own_pipeline } => {
                LockRead::Reset { held: self.reset_for_retry(holder, retry_delay).await?, by_own_pipeline }
            }
        })
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

    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        match self.call(Call::Reset(lease, delay)).await? {
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
            Reply::Row(row) => Ok(*row),
            other => unexpected("insert", other),
        }
    }

    async fn insert_many(&self, rows: Vec<NewRow>, hints: Vec<NewHint>) -> Result<Vec<RowId>, StoreError> {
        match self.call(Call::InsertMany { rows, hints }).await? {
            Reply::Ids(ids) => Ok(ids),
            other => unexpected("insert_many", other),
        }
    }

    async fn insert_keyed(&self, params: InsertKeyedParams) -> Result<KeyedInsert, StoreError> {
        // The database's unique index of keyed inserts serves it, as it serves the workload's keyed inserts.
        check_insert_keyed(&params)?;
        match self.call(Call::InsertKeyed { key: params.key, row: params.row, hint: None }).await? {
            Reply::Keyed(row, inserted) => Ok(KeyedInsert { id: row.id, inserted }),
            other => unexpected("insert_keyed", other),
        }
    }

    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        match self.call(Call::Get(id)).await? {
            Reply::MaybeRow(row) => Ok(row.map(|row| *row)),
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

    async fn purge(&self, params: PurgeParams) -> Result<usize, StoreError> {
        match self.call(Call::Purge(params)).await? {
            Reply::Count(count) => Ok(count),
            other => unexpected("purge", other),
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
