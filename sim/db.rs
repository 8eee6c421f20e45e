//! The database node: serves a [`MemStore`] to the other nodes over the simulated links of [`Wire`] (DESIGN §5).
//! Every store call of every other node crosses the network to it.
//!
//! The [`Database`] (the MemStore with its commit history, and the unique index of keyed inserts) lives outside
//! the node, so a database restart loses what was in flight but keeps what committed, as PostgreSQL's WAL does.
//! The node itself holds only connections: its hint subscribers and its calls in progress, each a task of the
//! node, so a kill of the node drops them. A call spends a short random time queued before it executes and another
//! after it commits, so a restart can cut a call off on either side of its commit. For [`STARTUP`] after each
//! start the node answers every call with `Unavailable`, as PostgreSQL does while it recovers. A fault can make it
//! drop replies after commit.
//!
//! In a gang scenario ([`Database::enable_gang_trace`]) the node also traces what the gang controller recorded:
//! a commit on one operation's row (or on a row of its inbox or jobs) carries `op=<id>`, and every event a commit
//! appended to an operation becomes a trace line of its own ([`gang::event_line`]).

use super::clock::{SimStoreClock, SimTime};
use super::gang;
use super::rng;
use super::rpc::{Call, Delivery, InsertHint, Reply, Request, Response};
use super::trace::{Fields, Trace};
use super::wire::Wire;
use crate::gang::model::{AllocationData, KIND_ALLOCATION};
use crate::store::{
    Clock, CommitOp, Hint, LockOutcome, LockRelatedParams, MemStore, NewHint, NewRow, Row, RowId, Store, StoreError,
    Timestamp,
};
use futures_util::FutureExt;
use madsim::runtime::{Handle, NodeHandle};
use madsim::task::NodeId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Store time when a world is built: 2023-11-14, an arbitrary fixed origin.
pub const ORIGIN: Timestamp = Timestamp(1_700_000_000_000_000);
/// How long a freshly started database answers `Unavailable` (PostgreSQL's "the database system is starting up").
pub const STARTUP: Duration = Duration::from_millis(300);
/// Longest time a call waits before it executes, and again between its commit and its reply.
pub const QUEUE_DELAY_MAX: Duration = Duration::from_micros(500);
/// A hint subscription lapses unless renewed within this span (subscribers renew every second).
pub const SUBSCRIPTION_TTL: Duration = Duration::from_secs(5);

/// Where a subscriber's hints go: each with the instant it arrives (simulated).
pub type HintSender = mpsc::UnboundedSender<(Instant, Hint)>;

/// The database: what survives a restart of its node.
pub struct Database {
    /// The store, with its commit history (the checkers' record).
    pub store: MemStore,
    /// The store's clock (simulated time, read through madsim's handle: [`SimTime`]).
    clock: SimStoreClock,
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
    ip: IpAddr,
    seed: u64,
    /// The links every call and hint crosses.
    wire: Arc<Wire>,
    /// The node's id, once the world built it.
    node_id: OnceLock<NodeId>,
    /// The node's current incarnation, while it runs (`None` while it is down).
    serving: Mutex<Option<Serving>>,
    /// Instants the node was killed (simulated), oldest first: a reply still held by the node when it died is
    /// lost.
    kills: Mutex<Vec<Instant>>,
    /// Subscribers whose hints are dropped in silence (fault `hint-loss`): the machine's, so they outlive a restart
    /// of the node.
    muted: Mutex<BTreeSet<IpAddr>>,
    /// Callers whose requests and replies are lost in silence (fault `store-hang`: their connections went
    /// half-open): the path's, so they outlive a restart of the node.
    hung: Mutex<BTreeSet<IpAddr>>,
}

/// One incarnation of the node: lost at a restart.
struct Serving {
    /// Spawns the incarnation's tasks on the node (a kill drops them).
    node: NodeHandle,
    started: Instant,
    rng: Arc<Mutex<ChaCha8Rng>>,
    /// Hint subscribers by address: where their hints go and when each last renewed its subscription.
    subscribers: BTreeMap<IpAddr, (HintSender, Instant)>,
}

impl Database {
    /// An empty database whose node listens on `ip` behind the links of `wire`; its store's clock starts at
    /// [`ORIGIN`] now.
    pub fn new(seed: u64, ip: IpAddr, wire: Arc<Wire>, trace: Trace) -> Arc<Database> {
        let clock = SimStoreClock::new(ORIGIN);
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
            ip,
            seed,
            wire,
            node_id: OnceLock::new(),
            serving: Mutex::new(None),
            kills: Mutex::new(Vec::new()),
            muted: Mutex::new(BTreeSet::new()),
            hung: Mutex::new(BTreeSet::new()),
        })
    }

    /// Drops every hint to the subscriber at `ip` in silence from now on, its subscription kept (fault `hint-loss`).
    pub fn mute_hints(&self, ip: IpAddr) {
        self.muted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(ip);
    }

    /// Ends the silence of [`Database::mute_hints`], and the subscription with it: the subscriber's next renewal
    /// subscribes anew and catches up, as a `LISTEN` session found dead is replaced.
    pub fn unmute_hints(&self, ip: IpAddr) {
        let was = self.muted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&ip);
        if let (true, Some(serving)) = (was, self.serving().as_mut()) {
            serving.subscribers.remove(&ip);
        }
    }

    /// Ends every silence ([`Database::unmute_hints`]; the heal).
    pub fn unmute_all_hints(&self) {
        let muted = std::mem::take(&mut *self.muted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        if let Some(serving) = self.serving().as_mut() {
            for ip in muted {
                serving.subscribers.remove(&ip);
            }
        }
    }

    /// From now on every request from `ip` and every reply to it is lost in silence, as on connections gone
    /// half-open (fault `store-hang`): the caller ends each call through its time-out
    /// ([`NetStore`](super::net_store::NetStore)).
    pub fn hang_calls(&self, ip: IpAddr) {
        self.hung.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(ip);
    }

    /// Ends [`Database::hang_calls`] of `ip`: calls sent from now on are answered.
    pub fn unhang_calls(&self, ip: IpAddr) {
        self.hung.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&ip);
    }

    /// Ends every [`Database::hang_calls`] (the heal).
    pub fn unhang_all_calls(&self) {
        self.hung.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clear();
    }

    /// Whether the calls of `ip` hang now ([`Database::hang_calls`]).
    pub fn calls_hang(&self, ip: IpAddr) -> bool {
        self.hung.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains(&ip)
    }

    /// Records the id of the node that serves the database (the world calls it once, right after building the
    /// node and before its init function runs).
    pub fn set_node_id(&self, id: NodeId) {
        self.node_id.set(id).expect("the database node is built once");
    }

    /// The store's time now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The simulated clock, read without `Instant::now()`'s detour through libc ([`SimTime`]).
    pub fn time(&self) -> &SimTime {
        self.clock.time()
    }

    /// The node's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The links every call and hint crosses.
    pub fn wire(&self) -> &Arc<Wire> {
        &self.wire
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

    /// The operation of the row a commit concerns ([`commit_row`]), if any (for `op=` on its trace line).
    fn commit_operation(&self, row: Option<RowId>) -> Option<RowId> {
        self.store.read_row(row?, gang::commit_operation).flatten()
    }

    /// How many times the node started.
    pub fn incarnations(&self) -> u64 {
        self.incarnations.load(Ordering::SeqCst)
    }

    /// The world is about to kill the node: from now on it takes no call and no subscription, and a reply it still
    /// holds is lost.
    pub fn killed(&self) {
        *self.serving() = None;
        self.kills.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(self.time().now());
    }

    /// Whether the node was killed at an instant in `[from, until)`.
    fn killed_within(&self, from: Instant, until: Instant) -> bool {
        let kills = self.kills.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kills.iter().rev().take_while(|kill| **kill >= from).any(|kill| *kill < until)
    }

    /// Hands `request` (already across the link) to the node: a task of the node's current incarnation waits out
    /// the request's latency and runs it. While the node is down the request is lost (its reply sender dropped).
    pub fn submit(self: &Arc<Self>, request: Request) {
        let serving = self.serving();
        let Some(serving) = serving.as_ref() else { return };
        let (started, rng) = (serving.started, serving.rng.clone());
        serving.node.spawn(handle(self.clone(), request, started, rng));
    }

    /// Subscribes (or renews the subscription of) the node at `ip` to every fetch hint, sent to `hints`. While
    /// the node is down the subscription is lost; a restart forgets every subscription.
    pub fn subscribe(&self, ip: IpAddr, hints: HintSender) -> bool {
        let now = self.time().now();
        match self.serving().as_mut() {
            Some(serving) => serving.subscribers.insert(ip, (hints, now)).is_none(),
            None => false,
        }
    }

    /// The reply `delivery` of a call, once it arrived: lost if the node died between handing it over and sending
    /// it.
    pub fn delivered(&self, delivery: Delivery) -> Option<Response> {
        (!self.killed_within(delivery.handed, delivery.leaves)).then_some(delivery.response)
    }

    fn serving(&self) -> MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn keys(&self) -> MutexGuard<'_, BTreeMap<String, RowId>> {
        self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The node's life: a new incarnation that takes calls and subscriptions and forwards hints, until the node is
/// killed. Its init function.
pub async fn serve(db: Arc<Database>) {
    let incarnation = db.incarnations.fetch_add(1, Ordering::SeqCst) + 1;
    db.trace.record(&db.node, "start", format!("incarnation={incarnation}"));
    let id = *db.node_id.get().expect("the world records the database node's id before it starts");
    let node = Handle::current().get_node(id).expect("the database node exists");
    *db.serving() = Some(Serving {
        node,
        started: db.time().now(),
        rng: Arc::new(Mutex::new(rng::keyed(db.seed, "db", incarnation))),
        subscribers: BTreeMap::new(),
    });
    forward_hints(&db).await;
}

/// Runs one request on the node: it waits its latency and a queue delay, executes (or, while the node starts
/// up, answers `Unavailable`), and hands the reply over to cross the link back after another queue delay.
async fn handle(db: Arc<Database>, request: Request, started: Instant, rng: Arc<Mutex<ChaCha8Rng>>) {
    let name = request.call.name();
    tokio::time::sleep(request.latency + queue_delay(&rng)).await;
    // One read of the clock for the start-up check and the hand-over: the call runs in one poll (see `execute`), so
    // both are this instant. Each read goes through madsim's `clock_gettime`.
    let handed = db.time().now();
    let response = if handed.duration_since(started) < STARTUP {
        Err(StoreError::Unavailable("the database system is starting up".into()))
    } else {
        execute(&db, &request.caller, *request.call, handed)
    };
    let leaves = handed + queue_delay(&rng);
    if drops_reply(&db, &rng) {
        db.trace.record(&request.caller, "reply-dropped", name);
        return;
    }
    let Some(latency) = db.wire.send(db.ip, request.from) else { return };
    // A caller that went away (its node killed) needs no answer.
    let _ = request.reply.send(Delivery { response, handed, leaves, arrives: leaves + latency });
}

fn queue_delay(rng: &Mutex<ChaCha8Rng>) -> Duration {
    let micros = lock(rng).random_range(0..QUEUE_DELAY_MAX.as_micros() as u64);
    Duration::from_micros(micros)
}

fn drops_reply(db: &Database, rng: &Mutex<ChaCha8Rng>) -> bool {
    let ppm = db.reply_loss_ppm.load(Ordering::SeqCst);
    ppm > 0 && lock(rng).random_range(0..1_000_000) < ppm
}

fn lock(rng: &Mutex<ChaCha8Rng>) -> MutexGuard<'_, ChaCha8Rng> {
    rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Pushes every hint the store publishes to every live subscriber across its link (PostgreSQL's `NOTIFY` to each
/// `LISTEN` connection). A lost hint ends its subscription; the subscriber's renewal catches up.
async fn forward_hints(db: &Database) {
    let mut hints = db.store.subscribe_hints();
    loop {
        let kind = match hints.recv().await {
            Ok(kind) => kind,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        let now = db.time().now();
        let mut serving = db.serving();
        let Some(serving) = serving.as_mut() else { return };
        serving.subscribers.retain(|_, (_, renewed)| now.duration_since(*renewed) < SUBSCRIPTION_TTL);
        // A hint lost on its link ends that subscription, as a lost `NOTIFY` can only mean a broken `LISTEN`
        // session on PostgreSQL (TCP delivers or breaks): the subscriber's next renewal subscribes anew and catches
        // up on every kind ([`crate::store::HINT_EVERY_KIND`]), as PgStore's listener does after it listens again.
        let muted = db.muted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        serving.subscribers.retain(|ip, (sender, _)| match db.wire.send(db.ip, *ip) {
            // A hint-loss fault: dropped in silence, the subscription kept.
            Some(_) if muted.contains(ip) => true,
            Some(latency) => {
                // A subscriber whose node died is gone until it subscribes again.
                let _ = sender.send((now + latency, kind.clone()));
                true
            }
            None => false,
        });
    }
}

/// Runs one call on the store as `caller` at `now` (the instant [`handle`] read: the call runs in one poll), and
/// traces the commits it made, if any, at that instant.
///
/// MemStore's calls never wait (each takes the store's lock, does its work and returns), so a call finishes in its
/// first poll: it is polled once here ([`FutureExt::now_or_never`]) instead of awaited, and the node's task for
/// the call (one per call, [`Database::submit`]) no longer holds the state of every store call's future, which
/// madsim copied into each new task. Polled once or awaited, a ready call runs the same code at the same simulated
/// instant and the simulator schedules no task more or less, so every trace stays the same.
fn execute(db: &Database, caller: &Arc<str>, call: Call, now: Instant) -> Response {
    let store = db.store.as_caller(caller.clone());
    // The call finishes in its first poll, so no other call commits between these two reads.
    let before = store.history_len();
    let gang_trace = db.gang_trace.load(Ordering::SeqCst);
    let events_before = if gang_trace { store.events_len() } else { 0 };
    let name = call.name();
    let response = dispatch(db, &store, call)
        .now_or_never()
        .unwrap_or_else(|| panic!("the store call {name} did not finish in its first poll"));
    // Each commit is traced as the store recorded it, its text written only when the trace is read.
    for op in store.map_history_from(before, |commit| commit.op.clone()) {
        // The operation is looked up only when traced: the lookup reads a row per commit.
        let operation = if gang_trace { db.commit_operation(commit_row(&op)) } else { None };
        db.trace.record_at(now, caller, "commit", Fields::Commit { op, operation });
    }
    if gang_trace {
        let on_operation = |event: &crate::store::Event| {
            db.store.read_row(event.row_id, |row| row.kind == crate::gang::model::KIND_OPERATION).unwrap_or(false)
        };
        for event in store.events_from(events_before).into_iter().filter(on_operation) {
            let node = gang::event_node(&event, |row| db.allocation_node(row));
            let kind = gang::event_kind(&event);
            db.trace.record_at(now, caller, kind, Fields::OperationEvent { event: Box::new(event), node });
        }
    }
    response
}

/// The row a commit concerns, if exactly one.
fn commit_row(op: &CommitOp) -> Option<RowId> {
    match op {
        CommitOp::Apply { lease, .. } | CommitOp::Reset { lease, .. } | CommitOp::Failure { lease, .. } => {
            Some(lease.id)
        }
        CommitOp::LockRelated { holder, .. } => Some(holder.id),
        CommitOp::Insert { id, .. } => Some(*id),
        CommitOp::Fetch { leases, .. } if leases.len() == 1 => Some(leases[0].id),
        _ => None,
    }
}

/// Inserts `row` unless a row was inserted under `key` already (the database's unique index of keyed inserts);
/// returns the row either way, and whether this call inserted it.
async fn insert_keyed(db: &Database, store: &MemStore, key: String, row: NewRow) -> Result<(Row, bool), StoreError> {
    let existing = db.keys().get(&key).copied();
    Ok(match existing {
        Some(id) => (store.get(id).await?.expect("a keyed row is never deleted"), false),
        None => {
            let row = store.insert(row).await?;
            db.keys().insert(key, row.id);
            (row, true)
        }
    })
}

/// [`Call::InsertManyKeyed`]: the rows keyed `{key}-0`, `{key}-1`, … if `{key}-0` names one (an earlier call's
/// rows, whatever this call's hold), else `rows` inserted in one `insert_many` with a hint per kind and keyed so.
async fn insert_many_keyed(
    db: &Database,
    store: &MemStore,
    key: &str,
    rows: Vec<NewRow>,
) -> Result<Vec<Row>, StoreError> {
    let row_key = |index: usize| format!("{key}-{index}");
    let mut ids: Vec<RowId> = (0..).map_while(|index| db.keys().get(&row_key(index)).copied()).collect();
    if ids.is_empty() && !rows.is_empty() {
        let hints = NewHint::kinds_of(&rows);
        ids = store.insert_many(rows, hints).await?;
        let mut keys = db.keys();
        for (index, id) in ids.iter().enumerate() {
            keys.insert(row_key(index), *id);
        }
    }
    let mut stored = Vec::with_capacity(ids.len());
    for id in ids {
        stored.push(store.get(id).await?.expect("a keyed row is never deleted"));
    }
    Ok(stored)
}

/// [`Call::LockRelatedAndRead`]: the lock and, when it is taken, the rows it locked (by id), in one step, as
/// PgStore's `lock_related_in_transaction` locks and reads in one transaction. The call runs in one poll, so no
/// other call comes between the lock and the read. A contended lock resets nothing: the client sends the reset as
/// a call of its own, as PgStore sends a second statement.
async fn lock_related_reading(
    store: &MemStore,
    params: LockRelatedParams,
) -> Result<(LockOutcome, Vec<Row>, Option<Duration>), StoreError> {
    let mut ids = params.related.clone();
    let (outcome, until) = store.lock_related_until(params).await?;
    let mut rows = Vec::new();
    if outcome == LockOutcome::Locked {
        ids.sort_unstable();
        ids.dedup();
        rows.reserve(ids.len());
        for id in ids {
            rows.push(
                store.get(id).await?.ok_or_else(|| StoreError::Other(format!("locked related row {id} is gone")))?,
            );
        }
    }
    Ok((outcome, rows, until))
}

async fn dispatch(db: &Database, store: &MemStore, call: Call) -> Response {
    Ok(match call {
        Call::Fetch(params) => Reply::Rows(store.fetch(params).await?),
        Call::NextExpiry(params) => Reply::Expiry(store.next_expiry(params).await?),
        Call::Refetch(lease) => Reply::MaybeRow(store.refetch(lease).await?.map(Box::new)),
        Call::RefetchBatch(leases) => Reply::MaybeRows(store.refetch_batch(leases).await?),
        Call::Heartbeat(params) => Reply::Leases(store.heartbeat(params).await?),
        Call::LockRelated(params) => Reply::Lock(store.lock_related(params).await?),
        Call::LockRelatedUntil(params) => {
            let (outcome, until) = store.lock_related_until(params).await?;
            Reply::LockUntil(outcome, until)
        }
        Call::LockRelatedAndRead(params) => {
            let (outcome, rows, until) = lock_related_reading(store, params).await?;
            Reply::LockReading(outcome, rows, until)
        }
        Call::Apply(params) => Reply::Apply(store.apply(params).await?),
        Call::ApplyBatch(batch) => Reply::Applies(store.apply_batch(batch).await?),
        Call::RecordFailure(params) => Reply::Failure(store.record_failure(params).await?),
        Call::Reset(lease, delay) => Reply::Held(store.reset_for_retry(lease, delay).await?),
        Call::Release(leases) => Reply::Count(store.release(leases).await?),
        Call::Insert(row) => Reply::Row(Box::new(store.insert(row).await?)),
        Call::InsertMany(rows) => Reply::Ids(store.insert_many(rows, Vec::new()).await?),
        Call::PublishHints(hints) => {
            // An insert of no rows with hints: the hints alone, as PgStore's statement after the commit.
            store.insert_many(Vec::new(), hints).await?;
            Reply::Done
        }
        Call::InsertKeyed { key, row, hint } => {
            let (row, inserted) = insert_keyed(db, store, key, row).await?;
            match hint {
                None => {}
                Some(InsertHint::Kind) => store.hint(&row.kind, None).await?,
                Some(InsertHint::Row) => store.hint(&row.kind, Some(row.id)).await?,
            }
            Reply::Keyed(Box::new(row), inserted)
        }
        Call::InsertManyKeyed { key, rows } => Reply::Rows(insert_many_keyed(db, store, &key, rows).await?),
        Call::InsertJob { key, tasks, mut job } => {
            let mut ids = Vec::with_capacity(tasks.len());
            let mut kinds = Vec::new();
            for (index, task) in tasks.into_iter().enumerate() {
                let (task, _) = insert_keyed(db, store, format!("{key}-task-{index}"), task).await?;
                if !kinds.contains(&task.kind) {
                    kinds.push(task.kind);
                }
                ids.push(task.id.0);
            }
            job.data["tasks"] = serde_json::json!(ids);
            let (job, _) = insert_keyed(db, store, key, job).await?;
            for kind in kinds {
                store.hint(&kind, None).await?;
            }
            store.hint(&job.kind, Some(job.id)).await?;
            Reply::Row(Box::new(job))
        }
        Call::Get(id) => Reply::MaybeRow(store.get(id).await?.map(Box::new)),
        Call::List { kind, parent } => Reply::Rows(store.list(&kind, parent).await?),
        Call::Query(queries) => Reply::RowSets(store.query(queries).await?),
        Call::Events(id) => Reply::Events(store.events(id).await?),
        Call::UpdateUnleased { id, update } => Reply::Write(store.update_unleased(id, update).await?),
        Call::Hint { kind, row } => {
            store.hint(&kind, row).await?;
            Reply::Done
        }
        Call::Purge(params) => Reply::Count(store.purge(params).await?),
        Call::Now => Reply::Now(Store::now(store).await?),
    })
}
