//! The engine on real PostgreSQL behind the chaos proxy: a half-open `LISTEN` session is noticed and
//! replaced, and its rows processed well within the poll interval; a session cut before its `COMMIT` and a reply
//! lost after it apply nothing twice and lose nothing, and leave no worker stuck. Each test has its own schema and
//! names its sessions after it. Needs PostgreSQL (see `support::pg`; never skips).

#![cfg(not(madsim))]

use crate::support;

use lockstep::chaos::proxy::Proxy;
use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineConfig, PipelineManager, WorkError};
use lockstep::store::conformance::Harness;
use lockstep::store::{NewEvent, NewRow, PgOptions, PgStore, Row, RowQuery, Store};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::chaos::{CONDITION_WAIT, Scoped, wait_until};
use support::pg::{PgHarness, store_with};

/// The fetchers' empty-fetch backoff in these tests: long, so that only a hint (or the listener's catch-up)
/// brings rows in quickly.
const POLL_INTERVAL: Duration = Duration::from_secs(60);
/// The listener's session check in these tests.
const LISTEN_CHECK: Duration = Duration::from_millis(500);
/// Bound on the time from inserting rows (and hinting them) to their processing while the listener is
/// half-open: a check and its time-out, a reconnect, a fetch and the applies, on a loaded machine. Well under
/// [`POLL_INTERVAL`].
const HALF_OPEN_PROCESSED_MAX: Duration = Duration::from_secs(15);
const _: () = assert!(HALF_OPEN_PROCESSED_MAX.as_millis() * 4 <= POLL_INTERVAL.as_millis());

/// Marks a row done with one `done` event in the same guarded transaction, and counts its calls.
struct Finish {
    processed: Arc<AtomicU64>,
}

impl<S: Store> Handler<S> for Finish {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, row: Row, _: ()) -> Result<Changes, WorkError> {
        self.processed.fetch_add(1, Ordering::Relaxed);
        let mut changes = Changes::status("done");
        changes.events.push(NewEvent { row_id: row.id, kind: "done".into(), data: json!({}) });
        Ok(changes)
    }
}

fn config(lease_ttl: Duration) -> PipelineConfig {
    let config = PipelineConfig::new("finish", "job", &["ready"]).with_lease_ttl(lease_ttl);
    PipelineConfig { workers: 4, lease_margin: Duration::from_secs(1), ..config }
}

/// [`config`] with every empty-fetch backoff step [`POLL_INTERVAL`] long.
fn config_polling_slowly(lease_ttl: Duration) -> PipelineConfig {
    PipelineConfig {
        fetch_backoff: vec![POLL_INTERVAL],
        fetch_jitter: 0.0,
        fetch_shortest_chance: 0.0,
        ..config(lease_ttl)
    }
}

/// A store reaching the run's schema through `proxy`, its sessions named after the run, its listener checked
/// every [`LISTEN_CHECK`].
async fn store_through(run: &Scoped, proxy: &Proxy, schema: &str) -> PgStore {
    let (url, schema, app) = (run.url_through(proxy), schema.to_string(), run.app("replica"));
    store_with(move |o: &mut PgOptions| {
        o.url = url;
        o.schema = schema;
        o.application_name = app;
        o.listen_check_interval = LISTEN_CHECK;
        o.listen_check_timeout = LISTEN_CHECK;
    })
    .await
}

async fn insert_ready(store: &PgStore, count: usize) -> Vec<lockstep::store::RowId> {
    let rows = (0..count).map(|i| NewRow::new("job", "ready", json!({ "n": i }))).collect();
    store.insert_many(rows, Vec::new()).await.expect("insert rows")
}

async fn all_done(store: &PgStore, ids: &[lockstep::store::RowId]) -> bool {
    for id in ids {
        match store.get(*id).await {
            Ok(Some(row)) if row.status == "done" => {}
            _ => return false,
        }
    }
    true
}

/// Every row of the schema is done, unlocked, and carries exactly one `done` event (applied once).
async fn assert_applied_once(store: &PgStore) {
    for row in store.list("job", None).await.expect("list rows") {
        assert_eq!(row.status, "done", "row {}", row.id);
        assert_eq!((row.lock_token, row.lock_expires_at), (None, None), "row {} left locked", row.id);
        let events = store.events(row.id).await.expect("events");
        assert_eq!(events.len(), 1, "row {} applied {} times: {events:?}", row.id, events.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_listener_is_replaced_and_its_rows_processed_well_within_the_poll_interval() {
    let run = Scoped::new().await;
    let proxy = run.proxy(21).await;
    let handle = proxy.handle();
    // The inserting side (another replica) reaches PostgreSQL directly.
    let harness = PgHarness::new().await;
    let direct = harness.store().clone();
    let schema = direct.schema().to_string();
    let replica = store_through(&run, &proxy, &schema).await;
    let processed = Arc::new(AtomicU64::new(0));
    let mut manager = PipelineManager::new(Arc::new(replica), ManagerOptions { seed: 1 });
    manager.register(config_polling_slowly(Duration::from_secs(10)), Finish { processed: processed.clone() }).unwrap();
    manager.start();

    // The listener works: a hinted row is processed at once.
    let first = insert_ready(&direct, 1).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("the first hinted row is done", || all_done(&direct, &first)).await;

    // The listener's next session check goes into a black hole: its session is half-open from then on.
    handle.black_hole_from(b"LISTEN");
    wait_until("the listener's check is swallowed", || async { handle.triggers_armed() == 0 }).await;
    let accepted_before = handle.stats().accepted;

    // Rows hinted now reach no listener; the check's time-out, the reconnect and its catch-up bring them in.
    let started = Instant::now();
    let rows = insert_ready(&direct, 5).await;
    direct.hint("job", None).await.expect("hint");
    let bounded = tokio::time::timeout(HALF_OPEN_PROCESSED_MAX, async {
        while !all_done(&direct, &rows).await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let took = started.elapsed();
    assert!(
        bounded.is_ok(),
        "rows hinted while the listener was half-open not done within {HALF_OPEN_PROCESSED_MAX:?} (poll interval \
         {POLL_INTERVAL:?})"
    );
    eprintln!("rows hinted to a half-open listener done in {took:?} (check every {LISTEN_CHECK:?})");
    assert!(handle.stats().accepted > accepted_before, "the listener opened no new session");
    let dead = handle.connections().into_iter().filter(|c| c.black_holed).count();
    assert_eq!(dead, 1, "the half-open session stays open (no FIN, no RST)");
    manager.shutdown().await;
    assert_applied_once(&direct).await;
    drop(proxy);
    run.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_before_the_server_and_a_commit_reply_lost_apply_nothing_twice_and_lose_nothing() {
    const ROWS: usize = 20;
    let run = Scoped::new().await;
    let proxy = run.proxy(22).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let direct = harness.store().clone();
    let schema = direct.schema().to_string();
    let replica = store_through(&run, &proxy, &schema).await;
    // The first COMMIT through the proxy never reaches the server (its session dies before it: rolled back);
    // the second one commits and its reply is lost (the worker hears an error for a write that happened).
    handle.cut_before(b"COMMIT");
    handle.lose_reply_after(b"COMMIT");
    let processed = Arc::new(AtomicU64::new(0));
    let mut manager = PipelineManager::new(Arc::new(replica), ManagerOptions { seed: 2 });
    manager.register(config(Duration::from_secs(6)), Finish { processed: processed.clone() }).unwrap();
    manager.start();

    let rows = insert_ready(&direct, ROWS).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("both faults fired", || async { handle.triggers_armed() == 0 }).await;
    wait_until("every row is done", || all_done(&direct, &rows)).await;
    assert!(handle.stats().resets >= 2, "both faults reset their session: {:?}", handle.stats());
    let metrics = manager.metrics("finish").unwrap();
    assert!(metrics.errors >= 2, "the two failed applies were seen as errors: {metrics:?}");

    // No worker is stuck on a dead session: new rows go through at once.
    let more = insert_ready(&direct, ROWS).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("rows inserted after the faults are done", || all_done(&direct, &more)).await;
    manager.shutdown().await;
    let calls = processed.load(Ordering::Relaxed);
    assert!(calls > 2 * ROWS as u64, "the row whose commit was cut was processed again: {calls} calls");
    assert_applied_once(&direct).await;
    drop(proxy);
    run.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_terminated_between_an_applys_last_statement_and_its_commit_applies_nothing_twice() {
    const ROWS: usize = 10;
    let run = Scoped::new().await;
    let proxy = run.proxy(23).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let direct = harness.store().clone();
    let schema = direct.schema().to_string();
    let replica = store_through(&run, &proxy, &schema).await;
    // The first COMMIT waits in the proxy: the apply's statements ran, its transaction is open on the server.
    handle.hold_before(b"COMMIT");
    let processed = Arc::new(AtomicU64::new(0));
    let mut manager = PipelineManager::new(Arc::new(replica), ManagerOptions { seed: 3 });
    manager.register(config(Duration::from_secs(6)), Finish { processed: processed.clone() }).unwrap();
    manager.start();

    let rows = insert_ready(&direct, ROWS).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("an apply's COMMIT is held", || async { handle.holding().len() == 1 }).await;
    // End that session on the server, as a crash, a failover or an operator would, then let the COMMIT go on.
    // (Another worker's transaction may be between two of its statements just then: it is ended too.)
    let ended = run.terminate_idle_in_transaction("replica").await;
    assert!(ended >= 1, "the held apply's session sat idle in its transaction");
    assert_eq!(handle.release_held(), 1);
    wait_until("every row is done", || all_done(&direct, &rows)).await;

    // No worker is stuck on the dead session: new rows go through.
    let more = insert_ready(&direct, ROWS).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("rows inserted after the fault are done", || all_done(&direct, &more)).await;
    manager.shutdown().await;
    let calls = processed.load(Ordering::Relaxed);
    assert!(calls > 2 * ROWS as u64, "the terminated apply's rows were processed again: {calls} calls");
    assert_applied_once(&direct).await;
    drop(proxy);
    run.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_half_open_connections_fail_within_the_call_timeout_and_the_pool_recovers_after_healing() {
    const CALL_TIMEOUT: Duration = Duration::from_secs(1);
    /// The bound plus scheduling on a loaded machine.
    const CALL_FAILED_MAX: Duration = Duration::from_secs(5);
    let run = Scoped::new().await;
    let proxy = run.proxy(24).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let (url, schema, app) = (run.url_through(&proxy), harness.store().schema().to_string(), run.app("replica"));
    let store = store_with(move |o: &mut PgOptions| {
        o.url = url;
        o.schema = schema;
        o.application_name = app;
        o.max_connections = 1;
        o.acquire_timeout = Duration::from_millis(500);
        o.call_timeout = CALL_TIMEOUT;
    })
    .await;
    store.now().await.expect("a call through the passing proxy");
    // The pool checks a connection given back with two pings (the store's, bounded, then sqlx's, unbounded): the
    // black hole must not open between them (see `call_timeout`).
    wait_until("the connection is back in the pool", || async { store.idle_connections() == 1 }).await;

    // Every session through the proxy goes half-open: no reply, no FIN, no RST.
    handle.set(lockstep::chaos::proxy::LinkFault::BlackHole);
    // More calls than the pool (of one) has connections: an abandoned call must not keep its slot.
    for call in 0..4 {
        let started = Instant::now();
        let failed = store.now().await;
        let took = started.elapsed();
        assert!(matches!(failed, Err(lockstep::store::StoreError::Timeout(_))), "call {call}: {failed:?}");
        assert!(took < CALL_FAILED_MAX, "call {call} took {took:?}");
    }
    handle.set(lockstep::chaos::proxy::LinkFault::Pass);
    // The half-open sessions were closed, not kept: calls get new sessions through the healed link.
    let started = Instant::now();
    while let Err(err) = store.now().await {
        assert!(started.elapsed() < CONDITION_WAIT, "calls fail {CONDITION_WAIT:?} after healing: {err}");
    }
    drop(proxy);
    run.finish().await;
}

/// On production defaults (the store's: only the URL, schema and session name are the test's; the pipeline's
/// lease is shortened), a worker whose apply goes half-open mid-transaction (its session black-holed as it sends
/// the events' insert: no reply, no FIN, no RST) gives the call up within the default call time-out, the item's
/// lease is renewed no more, and once it expires the row is processed again and its effect applied once. Before
/// the bound was the default, the worker waited for ever and the heartbeater renewed the lease for the life of the
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_gone_half_open_on_production_defaults_is_given_up_within_the_bound_and_its_row_done_once() {
    /// The bound plus scheduling on a loaded machine.
    const GIVEN_UP_MAX: Duration = Duration::from_secs(PgOptions::CALL_TIMEOUT_DEFAULT.as_secs() + 10);
    let run = Scoped::new().await;
    let proxy = run.proxy(27).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let direct = harness.store().clone();
    let (url, schema, app) = (run.url_through(&proxy), direct.schema().to_string(), run.app("replica"));
    let replica = store_with(move |o: &mut PgOptions| {
        let defaults = PgOptions::new(url);
        *o = PgOptions { schema, application_name: app, ..defaults };
    })
    .await;
    let processed = Arc::new(AtomicU64::new(0));
    let mut manager = PipelineManager::new(Arc::new(replica), ManagerOptions { seed: 1 });
    manager.register(config(Duration::from_secs(6)), Finish { processed: processed.clone() }).unwrap();
    manager.start();

    handle.black_hole_from(b"INSERT INTO events");
    let rows = insert_ready(&direct, 1).await;
    direct.hint("job", None).await.expect("hint");
    wait_until("the apply's session is black-holed", || async { handle.triggers_armed() == 0 }).await;
    let black_holed = Instant::now();
    let errors = || manager.metrics("finish").expect("the pipeline").errors;
    while errors() == 0 {
        let waited = black_holed.elapsed();
        assert!(waited < GIVEN_UP_MAX, "the worker still waits on its half-open apply after {waited:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let given_up = black_holed.elapsed();
    eprintln!(
        "half-open apply given up after {given_up:?} (default call time-out {:?})",
        PgOptions::CALL_TIMEOUT_DEFAULT
    );
    wait_until("the row is done by a pass after its lease expired", || all_done(&direct, &rows)).await;
    assert_eq!(processed.load(Ordering::Relaxed), 2, "processed again after the given-up apply");
    manager.shutdown().await;
    assert_applied_once(&direct).await;
    drop(proxy);
    run.finish().await;
}

/// `Store::query` (a controller pass's main read), one query or several in one snapshot, is bounded by the call
/// time-out like every other call: on a half-open connection it fails with `Timeout` instead of hanging its worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_on_a_half_open_connection_fail_within_the_call_timeout() {
    const CALL_TIMEOUT: Duration = Duration::from_secs(1);
    /// The bound plus scheduling on a loaded machine.
    const CALL_FAILED_MAX: Duration = Duration::from_secs(5);
    let run = Scoped::new().await;
    let proxy = run.proxy(26).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let (url, schema, app) = (run.url_through(&proxy), harness.store().schema().to_string(), run.app("replica"));
    let store = store_with(move |o: &mut PgOptions| {
        o.url = url;
        o.schema = schema;
        o.application_name = app;
        o.max_connections = 2;
        o.acquire_timeout = Duration::from_millis(500);
        o.call_timeout = CALL_TIMEOUT;
    })
    .await;
    store.query(vec![RowQuery::new("job")]).await.expect("a query through the passing proxy");
    wait_until("the connection is back in the pool", || async { store.connections_out() == 0 }).await;
    handle.set(lockstep::chaos::proxy::LinkFault::BlackHole);
    for queries in [vec![RowQuery::new("job")], vec![RowQuery::new("job"), RowQuery::new("job")]] {
        let count = queries.len();
        let started = Instant::now();
        let answer = tokio::time::timeout(CALL_FAILED_MAX * 2, store.query(queries)).await;
        let took = started.elapsed();
        let answer = answer.unwrap_or_else(|_| panic!("a query of {count} hung past {:?}", CALL_FAILED_MAX * 2));
        assert!(matches!(answer, Err(lockstep::store::StoreError::Timeout(_))), "{count} queries: {answer:?}");
        assert!(took < CALL_FAILED_MAX, "{count} queries took {took:?}");
    }
    handle.set(lockstep::chaos::proxy::LinkFault::Pass);
    drop(proxy);
    run.finish().await;
}

/// A call given up while its `BEGIN` is on its way (an agent's fence at its lease deadline, a call time-out, a
/// `select!` that another branch won) must not give its session back inside that transaction: the next call
/// would run in it, with its `now()` the stale transaction's start, and a heartbeat there would set an expiry
/// earlier than one already written (found by `chaos run` of gang-partitioned-agent-self-fences: a node declared
/// lost while its agent heartbeated). sqlx counts a transaction only once `BEGIN` is answered, so a `BEGIN`
/// dropped in flight is never rolled back by sqlx; the store closes such a session instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_while_its_begin_is_in_flight_leaves_no_stale_transaction_for_the_next_call() {
    /// Each chunk's wait in the proxy: the `BEGIN` is still on its way when the call is given up.
    const DELAY: Duration = Duration::from_millis(400);
    let run = Scoped::new().await;
    let proxy = run.proxy(25).await;
    let handle = proxy.handle();
    let harness = PgHarness::new().await;
    let direct = harness.store().clone();
    let (url, schema, app) = (run.url_through(&proxy), direct.schema().to_string(), run.app("replica"));
    let store = store_with(move |o: &mut PgOptions| {
        o.url = url;
        o.schema = schema;
        o.application_name = app;
        o.max_connections = 1;
    })
    .await;
    store.now().await.expect("a call through the passing proxy");
    wait_until("the connection is back in the pool", || async { store.idle_connections() == 1 }).await;

    handle.set(lockstep::chaos::proxy::LinkFault::Delay(DELAY));
    // Several reads in one snapshot: a transaction, whose first round trip is its BEGIN.
    let reads = vec![RowQuery::new("job"), RowQuery::new("job")];
    let given_up = tokio::time::timeout(DELAY / 4, store.query(reads)).await;
    assert!(given_up.is_err(), "the call was given up while its BEGIN was on its way");
    handle.set(lockstep::chaos::proxy::LinkFault::Pass);
    // The session settles (given back after its BEGIN ran on the server, or closed) before the clock is read.
    wait_until("the given-up call's session settled", || async { store.connections_out() == 0 }).await;

    let before = direct.now().await.expect("the database's clock");
    let next = store.now().await.expect("the next call");
    assert!(
        next >= before,
        "the next call ran inside the given-up call's transaction: its now() {next:?} is before {before:?}"
    );
    drop(proxy);
    run.finish().await;
}
