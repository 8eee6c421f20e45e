//! The database node: serves a [`MemStore`] over simulated RPC (DESIGN §5). Every store call of every other node
//! crosses the network to it.
//!
//! The [`Database`] (the MemStore with its commit history, and the unique index of keyed inserts) lives outside
//! the node, so a database restart loses what was in flight but keeps what committed, as PostgreSQL's WAL does.
//! The node itself holds only connections: its endpoint, its hint subscribers, its calls in progress. A call
//! spends a short random time queued before it executes and another after it commits, so a restart can cut a
//! call off on either side of its commit. For [`STARTUP`] after each start the node answers every call with
//! `Unavailable`, as PostgreSQL does while it recovers. A fault can make it drop replies after commit.
//!
//! In a gang scenario ([`Database::enable_gang_trace`]) the node also traces what the gang controller recorded:
//! a commit on one operation's row (or on a row of its inbox or jobs) carries `op=<id>`, and every event a commit
//! appended to an operation becomes a trace line of its own ([`gang::event_line`]).

use super::gang;
use super::rng;
use super::rpc::{CALL_PORT, Call, Reply, Request, Response, TAG_CALL, TAG_HINT, TAG_SUBSCRIBE};
use super::trace::Trace;
use crate::gang::model::{AllocationData, KIND_ALLOCATION};
use crate::store::{Clock, CommitOp, MemStore, RowId, Store, StoreError, Timestamp, TokioClock};
use madsim::net::Endpoint;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

/// Store time when a world is built: 2023-11-14, an arbitrary fixed origin.
pub const ORIGIN: Timestamp = Timestamp(1_700_000_000_000_000);
/// How long a freshly started database answers `Unavailable` (PostgreSQL's "the database system is starting up").
pub const STARTUP: Duration = Duration::from_millis(300);
/// Longest time a call waits before it executes, and again between its commit and its reply.
pub const QUEUE_DELAY_MAX: Duration = Duration::from_micros(500);
/// Tasks receiving calls at once. Under `buggify` madsim delays one receive in ten by 1–5 s, and a receiving task
/// takes no other call meanwhile; with 8 receivers the database then served about 25 calls per second and a
/// run with buggify on throughout fell minutes behind its schedule. 64 keep it at several hundred.
pub const RECEIVERS: usize = 64;
/// A hint subscription lapses unless renewed within this span (subscribers renew every second).
pub const SUBSCRIPTION_TTL: Duration = Duration::from_secs(5);

/// The database: what survives a restart of its node.
pub struct Database {
    /// The store, with its commit history (the checkers' record).
    pub store: MemStore,
    /// The store's clock.
    clock: TokioClock,
    /// The unique index of [`Call::InsertKeyed`].
    keys: Mutex<BTreeMap<String, RowId>>,
    /// Chance, in parts per million, that the node drops a reply after its call committed.
    reply_loss_ppm: AtomicU64,
    incarnations: AtomicU64,
    /// Whether commits and events of the gang controller are traced.
    gang_trace: AtomicBool,
    /// Node name of each allocation row seen so far (allocation rows never move).
    allocation_nodes: Mutex<BTreeMap<RowId, String>>,
    trace: Trace,
    node: Arc<str>,
    addr: SocketAddr,
    seed: u64,
}

impl Database {
    /// An empty database whose node listens on `ip`; its store's clock starts at [`ORIGIN`] now.
    pub fn new(seed: u64, ip: IpAddr, trace: Trace) -> Arc<Database> {
        let clock = TokioClock::new(ORIGIN);
        Arc::new(Database {
            store: MemStore::with_history(clock.clone()),
            clock,
            keys: Mutex::new(BTreeMap::new()),
            reply_loss_ppm: AtomicU64::new(0),
            incarnations: AtomicU64::new(0),
            gang_trace: AtomicBool::new(false),
            allocation_nodes: Mutex::new(BTreeMap::new()),
            trace,
            node: Arc::from("db"),
            addr: SocketAddr::new(ip, CALL_PORT),
            seed,
        })
    }

    /// The store's time now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Where store calls go.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the chance in [0, 1] that a reply is dropped after its call committed (0 heals the fault).
    pub fn set_reply_loss(&self, chance: f64) {
        assert!((0.0..=1.0).contains(&chance), "reply loss chance {chance} not in [0, 1]");
        self.reply_loss_ppm.store((chance * 1e6).round() as u64, Ordering::SeqCst);
    }

    /// Rows inserted through [`Call::InsertKeyed`]: every row a client inserted, each once.
    pub fn keyed_rows(&self) -> usize {
        self.keys().len()
    }

    /// Traces the gang controller's commits and events from now on (see the module docs).
    pub fn enable_gang_trace(&self) {
        self.gang_trace.store(true, Ordering::SeqCst);
    }

    /// The node name of allocation row `row`, if it is one.
    fn allocation_node(&self, row: RowId) -> Option<String> {
        let mut nodes = self.allocation_nodes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(name) = nodes.get(&row) {
            return Some(name.clone());
        }
        let read = |r: &crate::store::Row| {
            use serde::Deserialize;
            let data = (r.kind == KIND_ALLOCATION).then(|| AllocationData::deserialize(&r.data).ok());
            data.flatten().map(|data| data.node_name)
        };
        let name = self.store.read_row(row, read).flatten()?;
        nodes.insert(row, name.clone());
        Some(name)
    }

    /// The operation a commit concerns, if exactly one (for `op=` on its trace line).
    fn commit_operation(&self, op: &CommitOp) -> Option<RowId> {
        let row = match op {
            CommitOp::Apply { lease, .. } | CommitOp::Reset { lease, .. } | CommitOp::Failure { lease, .. } => lease.id,
            CommitOp::LockRelated { holder, .. } => holder.id,
            CommitOp::Insert { id, .. } => *id,
            CommitOp::Fetch { leases, .. } if leases.len() == 1 => leases[0].id,
            _ => return None,
        };
        self.store.read_row(row, gang::commit_operation).flatten()
    }

    /// How many times the node started.
    pub fn incarnations(&self) -> u64 {
        self.incarnations.load(Ordering::SeqCst)
    }

    fn keys(&self) -> MutexGuard<'_, BTreeMap<String, RowId>> {
        self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The node's life: bind, forward hints, serve calls, until the node is killed. Its init function.
pub async fn serve(db: Arc<Database>) {
    let incarnation = db.incarnations.fetch_add(1, Ordering::SeqCst) + 1;
    db.trace.record(&db.node, "start", format!("incarnation={incarnation}"));
    let endpoint = Endpoint::bind(db.addr).await.expect("db: the call port is free after a kill");
    let node = Arc::new(Node {
        db: db.clone(),
        endpoint,
        started: Instant::now(),
        rng: Mutex::new(rng::keyed(db.seed, "db", incarnation)),
        subscribers: Mutex::new(BTreeMap::new()),
    });
    tokio::spawn(node.clone().forward_hints());
    tokio::spawn(node.clone().accept_subscriptions());
    for _ in 0..RECEIVERS {
        tokio::spawn(node.clone().receive_calls());
    }
    std::future::pending::<()>().await;
}

/// One incarnation of the node: lost at a restart.
struct Node {
    db: Arc<Database>,
    endpoint: Endpoint,
    started: Instant,
    rng: Mutex<ChaCha8Rng>,
    /// Hint addresses and when each last renewed its subscription.
    subscribers: Mutex<BTreeMap<SocketAddr, Instant>>,
}

impl Node {
    async fn receive_calls(self: Arc<Self>) {
        while let Ok((payload, from)) = self.endpoint.recv_from_raw(TAG_CALL).await {
            let request = *payload.downcast::<Request>().expect("a call datagram carries a Request");
            tokio::spawn(self.clone().handle(request, from));
        }
    }

    async fn handle(self: Arc<Self>, request: Request, from: SocketAddr) {
        let name = request.call.name();
        tokio::time::sleep(self.queue_delay()).await;
        let response = if self.started.elapsed() < STARTUP {
            Err(StoreError::Unavailable("the database system is starting up".into()))
        } else {
            execute(&self.db, &request.caller, request.call).await
        };
        tokio::time::sleep(self.queue_delay()).await;
        if self.drops_reply() {
            self.db.trace.record(&request.caller, "reply-dropped", name);
            return;
        }
        // A send error means the network refused the datagram: the same as losing it.
        let _ = self.endpoint.send_to_raw(from, request.reply_tag, Box::new(response)).await;
    }

    fn queue_delay(&self) -> Duration {
        let micros = self.rng().random_range(0..QUEUE_DELAY_MAX.as_micros() as u64);
        Duration::from_micros(micros)
    }

    fn drops_reply(&self) -> bool {
        let ppm = self.db.reply_loss_ppm.load(Ordering::SeqCst);
        ppm > 0 && self.rng().random_range(0..1_000_000) < ppm
    }

    fn rng(&self) -> MutexGuard<'_, ChaCha8Rng> {
        self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn subscribers(&self) -> MutexGuard<'_, BTreeMap<SocketAddr, Instant>> {
        self.subscribers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Pushes every hint the store publishes to every live subscriber, one datagram each (PostgreSQL's
    /// `NOTIFY` to each `LISTEN` connection). A lost hint costs a fetcher at most its backoff.
    async fn forward_hints(self: Arc<Self>) {
        let mut hints = self.db.store.subscribe_hints();
        loop {
            let kind = match hints.recv().await {
                Ok(kind) => kind,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            let now = Instant::now();
            let targets: Vec<SocketAddr> = {
                let mut subscribers = self.subscribers();
                subscribers.retain(|_, renewed| now.duration_since(*renewed) < SUBSCRIPTION_TTL);
                subscribers.keys().copied().collect()
            };
            for target in targets {
                let _ = self.endpoint.send_to_raw(target, TAG_HINT, Box::new(kind.clone())).await;
            }
        }
    }

    async fn accept_subscriptions(self: Arc<Self>) {
        while let Ok((payload, _)) = self.endpoint.recv_from_raw(TAG_SUBSCRIBE).await {
            let hint_addr = *payload.downcast::<SocketAddr>().expect("a subscription carries the hint address");
            self.subscribers().insert(hint_addr, Instant::now());
        }
    }
}

/// Runs one call on the store as `caller`, and traces the commit it made, if any.
async fn execute(db: &Database, caller: &Arc<str>, call: Call) -> Response {
    let store = db.store.as_caller(caller.clone());
    // MemStore's calls finish in their first poll, so no other call commits between these two reads.
    let before = store.history_len();
    let gang_trace = db.gang_trace.load(Ordering::SeqCst);
    let events_before = if gang_trace { store.events_len() } else { 0 };
    let response = dispatch(db, &store, call).await;
    for commit in store.history_from(before) {
        // The operation is looked up only when traced: the lookup reads a row per commit.
        match gang_trace.then(|| db.commit_operation(&commit.op)).flatten() {
            Some(op) => db.trace.record(caller, "commit", format!("{} op={op}", commit.op)),
            None => db.trace.record(caller, "commit", commit.op.to_string()),
        }
    }
    if gang_trace {
        let on_operation = |event: &crate::store::Event| {
            db.store.read_row(event.row_id, |row| row.kind == crate::gang::model::KIND_OPERATION).unwrap_or(false)
        };
        for event in store.events_from(events_before).into_iter().filter(on_operation) {
            let (kind, fields) = gang::event_line(&event, |row| db.allocation_node(row));
            db.trace.record(caller, kind, fields);
        }
    }
    response
}

async fn dispatch(db: &Database, store: &MemStore, call: Call) -> Response {
    Ok(match call {
        Call::Fetch(params) => Reply::Rows(store.fetch(params).await?),
        Call::NextExpiry(params) => Reply::Expiry(store.next_expiry(params).await?),
        Call::Refetch(lease) => Reply::MaybeRow(store.refetch(lease).await?),
        Call::RefetchBatch(leases) => Reply::MaybeRows(store.refetch_batch(leases).await?),
        Call::Heartbeat(params) => Reply::Leases(store.heartbeat(params).await?),
        Call::LockRelated(params) => Reply::Lock(store.lock_related(params).await?),
        Call::Apply(params) => Reply::Apply(store.apply(params).await?),
        Call::ApplyBatch(batch) => Reply::Applies(store.apply_batch(batch).await?),
        Call::RecordFailure(params) => Reply::Failure(store.record_failure(params).await?),
        Call::Reset(lease) => Reply::Held(store.reset_for_retry(lease).await?),
        Call::Release(leases) => Reply::Count(store.release(leases).await?),
        Call::Insert(row) => Reply::Row(store.insert(row).await?),
        Call::InsertKeyed { key, row } => {
            let existing = db.keys().get(&key).copied();
            match existing {
                Some(id) => Reply::Row(store.get(id).await?.expect("a keyed row is never deleted")),
                None => {
                    let row = store.insert(row).await?;
                    db.keys().insert(key, row.id);
                    Reply::Row(row)
                }
            }
        }
        Call::Get(id) => Reply::MaybeRow(store.get(id).await?),
        Call::List { kind, parent } => Reply::Rows(store.list(&kind, parent).await?),
        Call::Query(queries) => Reply::RowSets(store.query(queries).await?),
        Call::Events(id) => Reply::Events(store.events(id).await?),
        Call::UpdateUnleased { id, update } => Reply::Write(store.update_unleased(id, update).await?),
        Call::Hint { kind, row } => {
            store.hint(&kind, row).await?;
            Reply::Done
        }
        Call::Now => Reply::Now(Store::now(store).await?),
    })
}
