//! A [`Store`] whose every call crosses the simulated network to the database node (DESIGN §5).
//!
//! A call is one request and one reply, each crossing the link between the client's node and the database node
//! ([`Wire`](super::wire::Wire)): either can be delayed, lost, or cut off by a partition, and the database may die
//! or drop the reply after committing. The client waits at most its call time-out and then returns
//! [`StoreError::Timeout`]: the outcome is unknown, as with a PostgreSQL connection that broke mid-call. A store
//! call that PgStore runs as two statements or transactions (`fetch_with_expiry`, a contended
//! `lock_related_or_reset` or `lock_related_and_read` and its reset, `apply`, `apply_batch` and `insert_many`
//! and their hints) is two such calls here, so every fault can fall between the steps as on PostgreSQL
//! (docs/simulator.md, "Atomic units").
//!
//! Fetch hints reach every replica: each subscribes at the database node (and renews the subscription every
//! second across its link, so it survives database restarts and healed partitions), and the node pushes every
//! hint to every subscriber.
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
    check_key,
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

    /// Publishes the fetch hints of a call that committed, in a call of its own ([`Call::PublishHints`]), as
    /// PgStore's `publish_hints` runs a statement after the commit: a fault between the two can lose them. A
    /// failure is logged, not returned: the call committed, and a lost hint costs a fetcher at most its backoff.
    async fn publish_hints(&self, hints: Vec<NewHint>) {
        if hints.is_empty() {
            return;
        }
        match self.call(Call::PublishHints(hints)).await {
            Ok(Reply::Done) => {}
            Ok(other) => unexpected("publish_hints", other),
            Err(error) => tracing::warn!(node = %self.options.node, %error, "fetch hints after a commit failed"),
        }
    }

    /// One call: send the request, wait for the reply within the call time-out.
    async fn call(&self, call: Call) -> Response {
        let options = &self.options;
        let name = call.name();
        let deadline = options.db.time().now() + options.call_timeout;
        let (reply, replied) = oneshot::channel();
        // The reply sender is dropped (here, or by the database node) when the request is lost, when the node dies
        // or when it drops the reply: the call then times out. Under a `store-hang` the request is lost on its
        // way (the database never runs it).
        let hung = options.db.calls_hang(options.ip);
        if hung {
            self.trace.record(&options.node, "store-hang-lost", format!("call={name} lost=request"));
        }
        match options.db.wire().send(options.ip, options.db.ip()).filter(|_| !hung) {
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
            // A reply that reaches a hung caller is lost after the database ran the call (`store-hang`).
            if options.db.calls_hang(options.ip) {
                self.trace.record(&options.node, "store-hang-lost", format!("call={name} lost=reply"));
            } else if let Some(response) = options.db.delivered(delivery) {
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

    async fn apply(&self, mut params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        let hints = std::mem::take(&mut params.hints);
        let outcome = match self.call(Call::Apply(params)).await? {
            Reply::Apply(outcome) => outcome,
            other => unexpected("apply", other),
        };
        if matches!(outcome, ApplyOutcome::Applied { .. }) {
            self.publish_hints(hints).await;
        }
        Ok(outcome)
    }

    async fn apply_batch(&self, mut batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // One datagram each way for the whole batch: a lost reply leaves every item's outcome unknown. The applied
        // items' hints follow in a call of their own.
        let hints: Vec<Vec<NewHint>> = batch.iter_mut().map(|p| std::mem::take(&mut p.hints)).collect();
        let outcomes = match self.call(Call::ApplyBatch(batch)).await? {
            Reply::Applies(outcomes) => outcomes,
            other => unexpected("apply_batch", other),
        };
        let applied = hints.into_iter().zip(&outcomes).filter(|(_, o)| matches!(o, ApplyOutcome::Applied { .. }));
        self.publish_hints(applied.flat_map(|(hints, _)| hints).collect()).await;
        Ok(outcomes)
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
        // The hints' kinds are checked before anything is written, as MemStore and PgStore check them.
        for (i, hint) in hints.iter().enumerate() {
            check_key(&format!("insert_many: hints[{i}]"), "kind", &hint.kind)?;
        }
        let ids = match self.call(Call::InsertMany(rows)).await? {
            Reply::Ids(ids) => ids,
            other => unexpected("insert_many", other),
        };
        self.publish_hints(hints).await;
        Ok(ids)
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

#[cfg(test)]
mod tests {
    //! The net store runs a call as PgStore's steps: a fault between two steps falls between them here as it does on
    //! PostgreSQL (docs/simulator.md, "Atomic units").

    use super::*;
    use crate::sim::db::{self, Database};
    use crate::sim::wire::Wire;
    use crate::store::{CommitOp, MemStore};
    use futures_util::FutureExt;
    use madsim::runtime::{Handle, Runtime};
    use std::net::Ipv4Addr;

    const DB_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const LEASE_TTL: Duration = Duration::from_secs(30);
    const CALL_TIMEOUT: Duration = Duration::from_secs(1);

    fn fetch_params(pipeline: &str, kind: &str, lease_ttl: Duration) -> FetchParams {
        FetchParams {
            pipeline: pipeline.to_string(),
            kind: kind.to_string(),
            statuses: vec!["ready".to_string()],
            limit: 10,
            lease_ttl,
            min_processing_interval: Duration::from_secs(600),
            retry_delay: Duration::from_secs(5),
        }
    }

    /// Leases `kind`'s one eligible row for `pipeline` straight on the database's store (another replica's call).
    async fn lease(store: &MemStore, pipeline: &str, kind: &str, lease_ttl: Duration) -> Lease {
        let rows = store.fetch(fetch_params(pipeline, kind, lease_ttl)).await.expect("fetch");
        assert_eq!(rows.len(), 1, "{pipeline} was to lease one row of {kind}");
        Lease { id: rows[0].id, token: rows[0].lock_token.expect("leased") }
    }

    /// A database node and a client node with a net store on it; runs `test` with them.
    fn simulate<F, Fut>(test: F)
    where
        F: FnOnce(Arc<Database>, Arc<NetStore>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let runtime = Runtime::with_seed_and_config(1, madsim::Config::default());
        runtime.block_on(async move {
            let handle = Handle::current();
            let trace = Trace::new();
            let wire = Arc::new(Wire::new(1, Duration::from_millis(1)..Duration::from_millis(2)));
            let db = Database::new(1, DB_IP, wire, trace.clone());
            let db_node = {
                let db = db.clone();
                handle.create_node().name("db").ip(DB_IP).init(move || db::serve(db.clone())).build()
            };
            db.set_node_id(db_node.id());
            tokio::time::sleep(db::STARTUP).await;
            let client = handle.create_node().name("client").ip(CLIENT_IP).build();
            let options = NetStoreOptions {
                node: Arc::from("client"),
                ip: CLIENT_IP,
                db: db.clone(),
                call_timeout: CALL_TIMEOUT,
                hints: false,
            };
            let store = Arc::new(client.spawn(NetStore::connect(options, trace)).await.expect("connects"));
            client.spawn(test(db, store)).await.expect("the test ran");
        });
    }

    /// Waits until the database commits something after its `before`-th commit, then runs `between` at once
    /// (before the reply of the call that committed reaches its caller).
    async fn after_next_commit(db: &Database, before: usize, between: impl FnOnce()) {
        while db.store.history_len() == before {
            tokio::time::sleep(Duration::from_micros(20)).await;
        }
        between();
    }

    /// Rows for a contended related lock: a parent leased by `operations`, a free child and a child `jobs` holds.
    async fn contended(db: &Database) -> (Lease, LockRelatedParams) {
        let parent = db.store.insert(NewRow::new("operation", "ready", serde_json::json!({}))).await.expect("insert");
        let busy = NewRow::new("job", "ready", serde_json::json!({})).with_parent(parent.id);
        let busy = db.store.insert(busy).await.expect("insert");
        lease(&db.store, "jobs", "job", LEASE_TTL).await;
        let free = NewRow::new("job", "ready", serde_json::json!({})).with_parent(parent.id);
        let free = db.store.insert(free).await.expect("insert");
        let holder = lease(&db.store, "operations", "operation", LEASE_TTL).await;
        let params = LockRelatedParams {
            holder,
            related: vec![free.id, busy.id],
            owner: "operations".to_string(),
            lease_ttl: LEASE_TTL,
            retry_delay: Duration::from_secs(5),
            park: false,
        };
        (holder, params)
    }

    /// The lock and the reset of a contended `lock_related_or_reset` (and `lock_related_and_read`) are two calls,
    /// as on PostgreSQL: a partition that cuts the caller off after the lock committed loses the reset. The call
    /// fails (`Timeout`, its outcome unknown), the free row keeps the intent mark the lock left, and the holder
    /// keeps its lease until it expires, as after PgStore's lock transaction and a failed reset statement. In one
    /// call, the reset committed with the lock.
    #[test]
    fn a_partition_between_a_contended_lock_and_its_reset_loses_the_reset() {
        for reading in [false, true] {
            simulate(move |db, store| async move {
                let (holder, params) = contended(&db).await;
                let free = params.related[0];
                let before = db.store.history_len();
                let call = {
                    let store = store.clone();
                    tokio::spawn(async move {
                        if reading {
                            store.lock_related_and_read(params).await.map(|_| ())
                        } else {
                            store.lock_related_or_reset(params).await.map(|_| ())
                        }
                    })
                };
                after_next_commit(&db, before, || db.wire().isolate(CLIENT_IP)).await;
                let outcome = call.await.expect("the call's task");
                assert!(matches!(outcome, Err(StoreError::Timeout(_))), "reading={reading}: the reset was not lost");
                let row = db.store.row(holder.id).expect("the holder's row");
                assert_eq!(row.lock_token, Some(holder.token), "reading={reading}: the holder was reset");
                assert_eq!(row.not_before, None, "reading={reading}: the holder got a retry time");
                let marked = db.store.row(free).expect("the free row");
                assert_eq!(marked.lock_owner.as_deref(), Some("operations"), "reading={reading}: the intent mark");
                assert_eq!(marked.lock_token, None, "reading={reading}: the free row was locked");
                let ops: Vec<CommitOp> = db.store.map_history_from(before, |commit| commit.op.clone());
                assert_eq!(ops.len(), 1, "reading={reading}: only the lock committed: {ops:?}");
                assert!(matches!(ops[0], CommitOp::LockRelated { .. }), "reading={reading}: {ops:?}");
            });
        }
    }

    /// The fetch and the expiry read of an empty `fetch_with_expiry` are two calls, as PgStore's two statements: a
    /// lease another replica takes between them is in the expiry (its 2 s, not the 60 s lease the fetch skipped).
    /// In one call, the expiry was the one the fetch saw.
    #[test]
    fn an_expiry_read_after_a_concurrent_lease_counts_that_lease() {
        simulate(|db, store| async move {
            db.store.insert(NewRow::new("task", "ready", serde_json::json!({}))).await.expect("insert");
            lease(&db.store, "other", "task", Duration::from_secs(60)).await;
            let before = db.store.history_len();
            let call = {
                let store = store.clone();
                tokio::spawn(async move { store.fetch_with_expiry(fetch_params("mine", "task", LEASE_TTL)).await })
            };
            let other = db.store.clone();
            after_next_commit(&db, before, move || {
                let row = NewRow::new("task", "ready", serde_json::json!({}));
                other.insert(row).now_or_never().expect("ready").expect("insert");
                let leased = other.fetch(fetch_params("other", "task", Duration::from_secs(2))).now_or_never();
                assert_eq!(leased.expect("ready").expect("fetch").len(), 1, "the concurrent lease");
            })
            .await;
            let (rows, expiry) = call.await.expect("the call's task").expect("fetch_with_expiry");
            assert_eq!(rows, Vec::new(), "every row was leased by another pipeline");
            let expiry = expiry.expect("a lease to wait for");
            assert!(expiry <= Duration::from_secs(2), "the expiry {expiry:?} misses the lease taken between the steps");
        });
    }

    /// The hints of an apply follow it in a call of their own, as PgStore's statement after the commit: a partition
    /// that cuts the caller off once the apply committed loses them. The apply is `Applied` (its reply came), the
    /// row it hinted is not marked hinted and no hint commit follows the apply's, as on PostgreSQL when the caller's
    /// connection breaks between the commit and the hints. In one call, the hints committed with the apply.
    #[test]
    fn a_partition_between_an_apply_and_its_hints_loses_the_hints() {
        simulate(|db, store| async move {
            db.store.insert(NewRow::new("task", "ready", serde_json::json!({}))).await.expect("insert");
            let woken = db.store.insert(NewRow::new("job", "ready", serde_json::json!({}))).await.expect("insert");
            let lease = lease(&db.store, "tasks", "task", LEASE_TTL).await;
            let before = db.store.history_len();
            let call = {
                let store = store.clone();
                let mut params = ApplyParams::new(lease, RowUpdate::status("done"));
                params.hints = vec![NewHint { kind: "job".to_string(), row: Some(woken.id) }];
                tokio::spawn(async move { store.apply(params).await })
            };
            after_next_commit(&db, before, || db.wire().isolate(CLIENT_IP)).await;
            let outcome = call.await.expect("the call's task").expect("the apply's reply came");
            assert!(matches!(outcome, ApplyOutcome::Applied { .. }), "apply {lease:?}: {outcome:?}");
            assert!(!db.store.row(woken.id).expect("the hinted row").hinted, "the hint crossed the partition");
            let ops: Vec<CommitOp> = db.store.map_history_from(before, |commit| commit.op.clone());
            assert_eq!(ops.len(), 1, "only the apply committed: {ops:?}");
            assert!(matches!(ops[0], CommitOp::Apply { applied: true, .. }), "{ops:?}");
        });
    }
}
