//! PgStore behaviours the conformance suite cannot see: hints between stores through `NOTIFY`, the listener's
//! reconnect, credentials kept out of errors, the schema rule, repeated and concurrent migrations, bulk inserts,
//! spans so long that timestamps saturate (compared with MemStore), the session time-outs that bound a wait on a
//! row lock, a server that is not PostgreSQL named by its address, slow statements logged at INFO, and chaos
//! mode's records of stale writes and its look at a replica's pass. Needs PostgreSQL (see
//! `support::pg`; never skips).

#![cfg(not(madsim))]

use crate::support;

use lockstep::store::conformance::Harness;
use lockstep::store::{
    ApplyOutcome, ApplyParams, CommitOp, FetchParams, HINT_EVERY_KIND, HeartbeatParams, Hint, Lease, LockOutcome,
    LockRelatedParams, ManualClock, MemStore, NewRow, PgOptions, PgStore, Row, RowId, RowQuery, RowUpdate, Store,
    StoreError, Timestamp,
};
use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};
use support::pg::{PgHarness, database_url, store_with, unique_schema};
use tokio::sync::broadcast;

/// Longest wait for a hint that should come.
const HINT_WAIT: Duration = Duration::from_secs(10);
/// How often the reconnect test re-sends a hint before giving up (with [`RECONNECT_PROBE_WAIT`] each).
const RECONNECT_PROBES_MAX: usize = 40;
const RECONNECT_PROBE_WAIT: Duration = Duration::from_millis(250);
const YEAR: Duration = Duration::from_secs(31_557_600);
/// Stores connecting at once to a schema that does not exist yet (a replica and an agent started together).
const CONCURRENT_CONNECTS: usize = 6;
/// Fresh schemas the concurrent-connect test tries (the race it guards against lost 2 of 6 tries).
const CONCURRENT_CONNECT_ROUNDS: usize = 3;
/// Longest a call stuck on a row lock may take past its time-out before the test calls it unbounded.
const TIMEOUT_SLACK: Duration = Duration::from_secs(5);

async fn next_hint(rx: &mut broadcast::Receiver<Hint>, which: &str) -> Hint {
    support::pg::next_hint(rx, which, HINT_WAIT).await
}

/// A second store on `h`'s schema (another replica).
async fn replica(h: &PgHarness) -> PgStore {
    let schema = h.store().schema().to_string();
    store_with(|o| o.schema = schema).await
}

fn params(lease_ttl: Duration, min_processing_interval: Duration) -> FetchParams {
    FetchParams {
        pipeline: "jobs".into(),
        kind: "job".into(),
        statuses: vec!["ready".into()],
        limit: 10,
        lease_ttl,
        min_processing_interval,
        retry_delay: Duration::from_secs(5),
    }
}

fn ready_job() -> NewRow {
    NewRow::new("job", "ready", serde_json::json!({}))
}

fn lease_of(row: &Row) -> Lease {
    Lease { id: row.id, token: row.lock_token.expect("a leased row carries a token") }
}

#[tokio::test]
async fn hints_reach_another_store_on_the_same_schema_and_the_own_store_once() {
    let h = PgHarness::new().await;
    let other = replica(&h).await;
    let mut remote = other.subscribe_hints();
    let mut local = h.store().subscribe_hints();
    h.store().hint("job", None).await.expect("hint");
    assert_eq!(next_hint(&mut remote, "the other store").await, "job");
    assert_eq!(next_hint(&mut local, "the hinting store").await, "job");
    // The hinting store also hears its own NOTIFY; it must not deliver the hint twice.
    h.store().hint("node", None).await.expect("hint");
    assert_eq!(next_hint(&mut remote, "the other store").await, "node");
    assert_eq!(
        next_hint(&mut local, "the hinting store").await,
        "node",
        "the hinting store delivered its first hint twice"
    );
}

#[tokio::test]
async fn the_hint_listener_reconnects_after_its_session_is_terminated() {
    let h = PgHarness::new().await;
    let other = replica(&h).await;
    let mut remote = other.subscribe_hints();
    let ended = other.disconnect_hint_listeners().await.expect("terminate the listeners");
    assert_eq!(ended, 2, "one listener per store on the schema");
    // The old sessions are gone (the call waits for them), so a hint that arrives came over a new connection.
    // Before it, the reconnected listener wakes every fetcher: hints sent while it was away are lost.
    let mut caught_up = false;
    for _ in 0..RECONNECT_PROBES_MAX {
        h.store().hint("job", None).await.expect("hint");
        while let Ok(received) = tokio::time::timeout(RECONNECT_PROBE_WAIT, remote.recv()).await {
            match received.expect("hint channel open") {
                kind if kind == HINT_EVERY_KIND => caught_up = true,
                kind => {
                    assert_eq!(kind, "job");
                    assert!(caught_up, "the reconnected listener sent no catch-up hint before the next hint");
                    return;
                }
            }
        }
    }
    panic!(
        "no hint reached the other store within {RECONNECT_PROBES_MAX} probes of {RECONNECT_PROBE_WAIT:?}: its \
         listener did not reconnect"
    );
}

#[tokio::test]
async fn ending_a_schemas_listeners_or_sessions_never_touches_another_runs() {
    // Another run's schema whose name, and so its channel's, starts with this one's.
    let h = PgHarness::new().await;
    let schema = h.store().schema().to_string();
    let other_run = PgHarness::with(|o| o.schema = format!("{schema}x")).await;
    let ended = h.store().disconnect_hint_listeners().await.expect("terminate the listeners");
    assert_eq!(ended, 1, "only this schema's listener, not the one of {}", other_run.store().schema());
    // The default session name is every run's: refused.
    let refused = h.store().terminate_sessions(PgOptions::APPLICATION_NAME_DEFAULT).await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))), "{refused:?}");
}

#[tokio::test]
async fn connect_errors_never_contain_the_password() {
    let refused = PgStore::connect("postgres://lockstep:hunter2@127.0.0.1:1/nowhere")
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused}");
    let malformed =
        PgStore::connect("postgres://lockstep:hunter2@127.0.0.1:notaport/x").await.expect_err("a malformed URL");
    assert!(matches!(malformed, StoreError::Invalid(_)), "{malformed}");
    for err in [refused, malformed] {
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2"), "the password leaked: {shown}");
    }
}

#[tokio::test]
async fn a_schema_name_outside_the_rule_is_refused_before_connecting() {
    let mut options = PgOptions::new(support::pg::database_url());
    options.schema = "robert'); DROP TABLE x; --".into();
    let err = PgStore::connect_with(options).await.expect_err("a bad schema name");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

#[tokio::test]
async fn migrations_run_again_as_a_no_op() {
    let h = PgHarness::new().await;
    let row = h.store().insert(ready_job()).await.expect("insert");
    h.store().migrate().await.expect("a second migration run");
    assert_eq!(h.store().get(row.id).await.expect("get"), Some(row));
}

#[tokio::test]
async fn insert_many_gives_ids_in_input_order_and_one_now() {
    let h = PgHarness::new().await;
    let rows = (0..1000).map(|i| NewRow::new("job", "ready", serde_json::json!({ "i": i }))).collect();
    let ids = h.store().insert_many(rows, Vec::new()).await.expect("insert_many");
    let stored = h.store().list("job", None).await.expect("list");
    assert_eq!(stored.iter().map(|r| r.id).collect::<Vec<_>>(), ids);
    for (i, row) in stored.iter().enumerate() {
        assert_eq!(row.data, serde_json::json!({ "i": i }), "row {} data", row.id);
        assert_eq!(row.created_at, stored[0].created_at, "row {} created_at", row.id);
        assert_eq!(row.updated_at, row.created_at, "row {} updated_at", row.id);
    }
}

/// Spans at and past the end of the timestamp ranges saturate in PgStore exactly as `Timestamp::plus` and
/// `Timestamp::minus` saturate in MemStore.
#[tokio::test]
async fn spans_past_the_end_of_time_saturate_as_in_memstore() {
    let h = PgHarness::new().await;
    let pg = h.store();
    let start = pg.now().await.expect("now");
    let clock = ManualClock::new(start);
    let mem = MemStore::new(clock.clone());
    // From a start in this century: fits both ranges; lands past Timestamp's end (294247) but inside
    // timestamptz's (294276); past both; the longest Duration.
    for ttl in [250_000 * YEAR, 292_230 * YEAR, 292_276 * YEAR, Duration::MAX] {
        let pg_row = pg.insert(ready_job()).await.expect("insert");
        mem.insert(ready_job()).await.expect("insert");
        let before = pg.now().await.expect("now");
        let leased = pg.fetch(params(ttl, Duration::ZERO)).await.expect("fetch");
        let after = pg.now().await.expect("now");
        let mem_leased = mem.fetch(params(ttl, Duration::ZERO)).await.expect("fetch");
        let expires = leased[0].lock_expires_at.expect("an expiry");
        assert!(
            expires >= before.plus(ttl) && expires <= after.plus(ttl),
            "ttl {ttl:?}: {expires} outside [{}, {}]",
            before.plus(ttl),
            after.plus(ttl)
        );
        assert_eq!(mem_leased[0].lock_expires_at, Some(clock_now(&clock).plus(ttl)));
        let held = pg
            .heartbeat(HeartbeatParams { leases: vec![lease_of(&leased[0])], lease_ttl: ttl })
            .await
            .expect("heartbeat");
        assert_eq!(held.len(), 1, "ttl {ttl:?}: the lease on row {} was lost", pg_row.id);
        release_both(pg, &mem, &leased[0], &mem_leased[0]).await;
    }
}

/// A lease whose expiry saturated at `'infinity'` never ends, and the next expiry leaves it out (`NEXT_EXPIRY` in
/// src/store/pg/sql.rs): `None` while only such leases are live, and the span to the finite lease once there is
/// one (the read's range of `resources_lease_expiry_idx` ends before `'infinity'`, so it never walks them).
#[tokio::test]
async fn next_expiry_leaves_out_leases_that_end_at_infinity() {
    let h = PgHarness::new().await;
    let pg = h.store();
    pg.insert_many((0..3).map(|_| ready_job()).collect(), Vec::new()).await.expect("insert_many");
    let forever = FetchParams { limit: 2, ..params(Duration::MAX, Duration::ZERO) };
    let leased = pg.fetch(forever.clone()).await.expect("fetch");
    assert_eq!(leased.len(), 2, "leases that never end: {leased:?}");
    assert_eq!(pg.next_expiry(forever.clone()).await.expect("next_expiry"), None, "only leases that never end");
    let ttl = Duration::from_secs(30);
    assert_eq!(pg.fetch(params(ttl, Duration::ZERO)).await.expect("fetch").len(), 1, "the third row");
    let span = pg.next_expiry(forever).await.expect("next_expiry").expect("a lease that ends");
    assert!(span <= ttl, "next expiry {span:?} past the finite lease's ttl {ttl:?}");
}

fn clock_now(clock: &ManualClock) -> Timestamp {
    use lockstep::store::Clock;
    clock.now()
}

async fn release_both(pg: &PgStore, mem: &MemStore, pg_row: &Row, mem_row: &Row) {
    assert_eq!(pg.release(vec![lease_of(pg_row)]).await.expect("release"), 1);
    assert_eq!(mem.release(vec![lease_of(mem_row)]).await.expect("release"), 1);
}

/// A processed row waits out `min_processing_interval` even when `now - interval` falls before the start of
/// either time range; MemStore and PgStore agree on every span.
#[tokio::test]
async fn intervals_before_the_start_of_time_saturate_as_in_memstore() {
    let h = PgHarness::new().await;
    let pg = h.store();
    let clock = ManualClock::new(pg.now().await.expect("now"));
    let mem = MemStore::new(clock.clone());
    for store_is_pg in [true, false] {
        let eligible = if store_is_pg {
            processed_row_eligibility(pg, |span| h.advance(span)).await
        } else {
            processed_row_eligibility(&mem, |span| clock.advance(span)).await
        };
        assert_eq!(
            eligible,
            vec![false, false, false, true],
            "pg={store_is_pg}: eligibility for 10 000 years, 300 000 years, Duration::MAX, zero"
        );
    }
}

/// Processes one row, moves the clock a second, then asks for each interval whether a fetch would take it.
async fn processed_row_eligibility<S: Store>(store: &S, advance: impl Fn(Duration)) -> Vec<bool> {
    let row = store.insert(ready_job()).await.expect("insert");
    let leased = store.fetch(params(Duration::from_secs(30), Duration::ZERO)).await.expect("fetch");
    let lease = lease_of(&leased[0]);
    store.apply(ApplyParams::new(lease, RowUpdate::default())).await.expect("apply");
    advance(Duration::from_secs(1));
    let mut eligible = Vec::new();
    for interval in [10_000 * YEAR, 300_000 * YEAR, Duration::MAX, Duration::ZERO] {
        let taken = store.fetch(params(Duration::from_secs(30), interval)).await.expect("fetch");
        eligible.push(taken.iter().any(|r| r.id == row.id));
    }
    eligible
}

/// One fetch of many rows draws its tokens in fetch order, as MemStore does: the first row leased gets the
/// smallest token.
#[tokio::test]
async fn a_fetch_of_many_rows_draws_tokens_in_fetch_order() {
    let h = PgHarness::new().await;
    let rows = (0..50).map(|_| ready_job()).collect();
    h.store().insert_many(rows, Vec::new()).await.expect("insert_many");
    let mut params = params(Duration::from_secs(30), Duration::ZERO);
    params.limit = 50;
    let leased = h.store().fetch(params).await.expect("fetch");
    assert_eq!(leased.len(), 50);
    let tokens: Vec<_> = leased.iter().map(|row| row.lock_token.expect("a token")).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens out of fetch order: {tokens:?}");
    let ids: Vec<_> = leased.iter().map(|row| row.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "never-processed rows out of id order: {ids:?}");
}

/// A value PostgreSQL cannot store (a NUL character) is refused as an invalid call, not a store failure.
#[tokio::test]
async fn a_nul_character_is_an_invalid_call() {
    let h = PgHarness::new().await;
    let in_text = h.store().insert(NewRow::new("job", "rea\0dy", serde_json::json!({}))).await;
    assert!(matches!(in_text, Err(StoreError::Invalid(_))), "{in_text:?}");
    let in_json = h.store().insert(NewRow::new("job", "ready", serde_json::json!({ "s": "a\u{0}b" }))).await;
    assert!(matches!(in_json, Err(StoreError::Invalid(_))), "{in_json:?}");
}

#[tokio::test]
async fn serialization_failures_deadlocks_and_lost_sessions_are_typed_errors() {
    let h = PgHarness::new().await;
    let store = h.store();
    assert!(matches!(store.raise_for_test("40001").await, StoreError::Conflict(_)), "serialization failure");
    assert!(matches!(store.raise_for_test("40P01").await, StoreError::Conflict(_)), "deadlock");
    assert!(matches!(store.raise_for_test("57P01").await, StoreError::Unavailable(_)), "admin shutdown");
    assert!(matches!(store.raise_for_test("08006").await, StoreError::Unavailable(_)), "connection failure");
    assert!(matches!(store.raise_for_test("XX000").await, StoreError::Other(_)), "internal error");
    for code in ["40001", "40P01", "57P01", "08006"] {
        assert!(store.raise_for_test(code).await.is_retryable(), "{code} is retryable");
    }
}

#[tokio::test]
async fn session_time_outs_are_the_options_defaults_or_their_own() {
    let h = PgHarness::new().await;
    assert_eq!(h.store().session_setting("lock_timeout").await.unwrap(), "2s");
    assert_eq!(h.store().session_setting("statement_timeout").await.unwrap(), "30s");
    assert_eq!(h.store().session_setting("idle_in_transaction_session_timeout").await.unwrap(), "5s");
    let own = PgHarness::with(|o| {
        o.lock_timeout = Duration::from_millis(250);
        o.statement_timeout = Duration::from_secs(7);
        o.idle_in_transaction_timeout = Duration::ZERO;
    })
    .await;
    assert_eq!(own.store().session_setting("lock_timeout").await.unwrap(), "250ms");
    assert_eq!(own.store().session_setting("statement_timeout").await.unwrap(), "7s");
    assert_eq!(own.store().session_setting("idle_in_transaction_session_timeout").await.unwrap(), "0");
}

/// Another session (a person's open transaction, a frozen process) holding `row`'s lock until it is dropped.
async fn hold_row_lock(store: &PgStore, row: RowId) -> PgConnection {
    let mut conn = PgConnection::connect(&database_url()).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut conn).await.expect("begin");
    let lock = format!("SELECT 1 FROM \"{}\".resources WHERE id = $1 FOR UPDATE", store.schema());
    sqlx::query(sqlx::AssertSqlSafe(lock)).bind(row.0).execute(&mut conn).await.expect("lock the row");
    conn
}

/// Runs `call`, which should fail with `Timeout(expected)` once its wait on a row lock ran out; bounded so that
/// an unbounded wait fails the test rather than hanging it.
async fn times_out<T: std::fmt::Debug>(
    what: &str,
    expected: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(expected + TIMEOUT_SLACK, call)
        .await
        .unwrap_or_else(|_| panic!("{what} still waited on the row lock after {:?}", expected + TIMEOUT_SLACK));
    match outcome {
        Err(StoreError::Timeout(t)) => assert_eq!(t, expected, "{what}: the time-out names the bound that ran out"),
        other => panic!("{what}: expected Timeout({expected:?}), got {other:?}"),
    }
    assert!(started.elapsed() >= expected, "{what} gave up after {:?}, before its time-out", started.elapsed());
}

/// A server on a local port that is not PostgreSQL, as it answers PostgreSQL's startup message: each
/// connection gets `greeting` at once (MariaDB and MySQL greet first), then, after the client's first bytes,
/// `reply` (Redis answers an unknown command), then is closed, or never, if `hold` (Redis waits for the rest of a
/// line that never comes). Returns its port; the server lives as long as the test process.
fn not_postgres(greeting: &'static [u8], reply: &'static [u8], hold: bool) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(greeting);
            let _ = stream.read(&mut [0; 1024]);
            let _ = stream.write_all(reply);
            if hold {
                held.push(stream);
            }
        }
    });
    port
}

/// A URL pointing at a server that is not PostgreSQL fails to connect saying so, naming the address: one that
/// answers in another protocol is the URL's fault (`Invalid`), one that closes the connection or says nothing
/// (within the acquire time-out, not forever) cannot be reached as PostgreSQL (`Unavailable`).
#[tokio::test]
async fn a_server_that_is_not_postgres_is_named_by_its_address() {
    let connect = |port: u16| {
        let mut options = PgOptions::new(format!("postgres://postgres@127.0.0.1:{port}/test"));
        options.acquire_timeout = Duration::from_millis(500);
        PgStore::connect_with(options)
    };
    let redis_reply = not_postgres(b"", b"-ERR unknown command 'x'\r\n", false);
    let mariadb = not_postgres(b"J\0\0\0\n5.5.5-10.11.6-MariaDB\0", b"", false);
    for port in [redis_reply, mariadb] {
        match connect(port).await.map(|_| ()) {
            Err(StoreError::Invalid(message)) => assert!(
                message.starts_with(&format!("the server at 127.0.0.1:{port} did not answer as PostgreSQL does")),
                "{message}"
            ),
            other => panic!("port {port}: {other:?}"),
        }
    }
    let closing = not_postgres(b"", b"", false);
    match connect(closing).await.map(|_| ()) {
        Err(StoreError::Unavailable(message)) => assert!(
            message.starts_with(&format!("the server at 127.0.0.1:{closing} closed the connection")),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    let silent = not_postgres(b"", b"", true);
    let started = Instant::now();
    match tokio::time::timeout(Duration::from_secs(30), connect(silent)).await.map(|c| c.map(|_| ())) {
        Ok(Err(StoreError::Unavailable(message))) => assert!(
            message.starts_with(&format!("the server at 127.0.0.1:{silent} did not answer within 500ms")),
            "{message}"
        ),
        other => panic!("after {:?}: {other:?}", started.elapsed()),
    }
}

/// The log lines (without colours) written while the returned guard is the thread's default subscriber, at
/// INFO and above.
fn capture_logs() -> (std::sync::Arc<std::sync::Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = std::sync::Arc::clone(&captured);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || Lines(std::sync::Arc::clone(&writer)))
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// The lines of `captured` that sqlx wrote about a slow statement.
fn slow_statement_lines(captured: &std::sync::Mutex<Vec<u8>>) -> Vec<String> {
    let text = String::from_utf8_lossy(&captured.lock().unwrap()).into_owned();
    text.lines().filter(|line| line.contains("slow statement")).map(str::to_string).collect()
}

/// A store call that waits on another session's row lock for `wait` (within its lock time-out) and then goes
/// through.
async fn update_behind_a_row_lock(store: &PgStore, wait: Duration) {
    let row = store.insert(NewRow::new("task", "waiting", serde_json::json!({}))).await.expect("insert");
    let mut other = hold_row_lock(store, row.id).await;
    let release = async {
        tokio::time::sleep(wait).await;
        sqlx::query("COMMIT").execute(&mut other).await.expect("commit")
    };
    let (updated, _) = tokio::join!(store.update_unleased(row.id, RowUpdate::status("blocked")), release);
    updated.expect("the update goes through once the lock is released");
}

/// A statement that waited 1.2 s on a row lock (routine: well within `lock_timeout`, which ends a longer wait
/// with an error of its own) logs no warning with its SQL text, as sqlx does by default past 1 s; one past
/// `slow_statement_threshold` is logged at INFO, which `lockstep`'s default filter (`sqlx=warn`) leaves out.
#[tokio::test]
async fn a_statement_slower_than_a_second_is_no_warning_and_one_past_the_threshold_is_logged_at_info() {
    let h = PgHarness::new().await;
    let (captured, guard) = capture_logs();
    update_behind_a_row_lock(h.store(), Duration::from_millis(1200)).await;
    drop(guard);
    assert_eq!(slow_statement_lines(&captured), Vec::<String>::new());

    let h = PgHarness::with(|o| o.slow_statement_threshold = Duration::from_millis(100)).await;
    let (captured, guard) = capture_logs();
    update_behind_a_row_lock(h.store(), Duration::from_millis(300)).await;
    drop(guard);
    let lines = slow_statement_lines(&captured);
    assert!(!lines.is_empty(), "the slow update was not logged");
    assert!(lines.iter().all(|line| line.contains(" INFO sqlx::query")), "{lines:#?}");
}

#[tokio::test]
async fn a_call_waiting_on_a_row_lock_past_lock_timeout_fails_with_a_timeout_and_writes_nothing() {
    let lock_timeout = Duration::from_millis(300);
    let h = PgHarness::with(|o| o.lock_timeout = lock_timeout).await;
    let store = h.store();
    let holder = store.insert(ready_job()).await.expect("insert");
    let related = store.insert(NewRow::new("task", "waiting", serde_json::json!({}))).await.expect("insert");
    let lease = lease_of(&store.fetch(params(YEAR, Duration::ZERO)).await.expect("fetch")[0]);
    assert_eq!(lease.id, holder.id);
    let other = hold_row_lock(store, related.id).await;
    let update = RowUpdate::status("blocked");
    times_out("update_unleased", lock_timeout, store.update_unleased(related.id, update)).await;
    let lock = LockRelatedParams {
        holder: lease,
        related: vec![related.id],
        owner: "jobs".into(),
        lease_ttl: YEAR,
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    times_out("lock_related", lock_timeout, store.lock_related(lock)).await;
    drop(other);
    assert_eq!(store.get(related.id).await.expect("get"), Some(related), "the calls that timed out wrote nothing");
}

#[tokio::test]
async fn a_statement_running_past_statement_timeout_fails_with_a_timeout() {
    let statement_timeout = Duration::from_millis(300);
    let h = PgHarness::with(|o| {
        o.lock_timeout = Duration::ZERO;
        o.statement_timeout = statement_timeout;
    })
    .await;
    let row = h.store().insert(ready_job()).await.expect("insert");
    let _other = hold_row_lock(h.store(), row.id).await;
    times_out("update_unleased", statement_timeout, h.store().update_unleased(row.id, RowUpdate::status("x"))).await;
}

#[tokio::test]
async fn a_lock_or_statement_time_out_and_an_ended_idle_session_are_typed_errors() {
    let h = PgHarness::with(|o| {
        o.lock_timeout = Duration::from_millis(1500);
        o.statement_timeout = Duration::from_secs(20);
    })
    .await;
    let store = h.store();
    assert!(matches!(store.raise_for_test("55P03").await, StoreError::Timeout(t) if t.as_millis() == 1500));
    assert!(matches!(store.raise_for_test("57014").await, StoreError::Timeout(t) if t.as_secs() == 20));
    assert!(matches!(store.raise_for_test("25P03").await, StoreError::Unavailable(_)), "idle in transaction");
    let shown = store.raise_for_test("XX000").await.to_string();
    assert!(shown.ends_with("raised for a test (SQLSTATE XX000)"), "PostgreSQL's message, no sqlx noise: {shown}");
    assert!(!shown.contains(" at line "), "{shown}");
}

#[tokio::test]
async fn stores_connecting_at_once_to_a_new_schema_all_create_and_migrate_it() {
    for _ in 0..CONCURRENT_CONNECT_ROUNDS {
        let schema = unique_schema();
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..CONCURRENT_CONNECTS {
            let mut options = PgOptions::new(database_url());
            options.schema = schema.clone();
            options.max_connections = 1;
            connects.spawn(PgStore::connect_with(options));
        }
        let mut stores = Vec::new();
        while let Some(connected) = connects.join_next().await {
            match connected.expect("no connect panicked") {
                Ok(store) => stores.push(store),
                Err(err) => {
                    panic!("one of {CONCURRENT_CONNECTS} stores connecting at once to new schema {schema}: {err}")
                }
            }
        }
        let row = stores[0].insert(ready_job()).await.expect("insert");
        for store in &stores {
            assert_eq!(store.get(row.id).await.expect("get").map(|r| r.id), Some(row.id), "one schema, one table");
            store.close().await;
        }
        drop(stores);
        PgStore::drop_schema(&database_url(), &schema).await.expect("drop the test schema");
    }
}

/// A plain connection to `url` with `schema` as its `search_path`.
async fn connect_to_schema(url: &str, schema: &str) -> PgConnection {
    let base: sqlx::postgres::PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    PgConnection::connect_with(&base.options([("search_path", schema)])).await.expect("PostgreSQL is reachable")
}

/// A new schema of this run migrated only up to migration `version` (a deployment of an older lockstep), with a
/// one-connection pool on it: (database URL, schema, pool).
async fn schema_migrated_to(version: i64) -> (String, String, sqlx::PgPool) {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let url = support::pg::database_url();
    let schema = support::pg::unique_schema();
    let base: PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    let mut conn = sqlx::PgConnection::connect_with(&base).await.expect("PostgreSQL is reachable");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\""))).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(base.options([("search_path", schema.as_str())]))
        .await
        .expect("a pool on the new schema");
    sqlx::migrate!("./migrations").run_to(version, &pool).await.expect("the older migrations");
    (url, schema, pool)
}

/// A schema migrated only to 0001 and holding rows (an early deployment) migrates to 0002 when a store
/// connects: its rows read with no attempts, no errors and no `not_before`, and they fetch, fail with a backoff and
/// apply as new rows do.
#[tokio::test]
async fn a_populated_schema_of_migration_0001_migrates_and_its_rows_fail_and_apply() {
    let (url, schema, pool) = schema_migrated_to(1).await;
    sqlx::query(
        "INSERT INTO resources (kind, status, data, created_at, updated_at, last_processed_at)
         VALUES ('task', 'ready', '{\"n\": 0}', now(), now(), NULL),
                ('task', 'ready', '{\"n\": 1}', now(), now(), now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .expect("rows in the 0001 schema");
    pool.close().await;

    let store = store_with(|options| options.schema = schema.clone()).await;
    let rows = store.list("task", None).await.unwrap();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!((row.attempts, row.errors.len(), row.not_before), (0, 0, None), "row {} after 0002", row.id);
    }
    let params = ready_tasks();
    let leased = store.fetch(params.clone()).await.unwrap();
    assert_eq!(leased.len(), 2, "both old rows are eligible");
    let lease = |row: &Row| Lease { id: row.id, token: row.lock_token.unwrap() };
    let failure = lockstep::store::FailureParams {
        lease: lease(&leased[0]),
        error: "old row failed".into(),
        retry: lockstep::store::Retry::After(Duration::from_secs(60)),
    };
    let outcome = store.record_failure(failure).await.unwrap();
    assert_eq!(outcome, lockstep::store::FailureOutcome::Recorded { attempts: 1 });
    let applied = store.apply(ApplyParams::new(lease(&leased[1]), RowUpdate::status("done"))).await.unwrap();
    assert!(matches!(applied, lockstep::store::ApplyOutcome::Applied { .. }), "{applied:?}");
    assert_eq!(store.fetch(params).await.unwrap(), vec![], "the failed row came back inside its backoff");
    drop(store);
    PgStore::drop_schema(&url, &schema).await.unwrap();
}

/// A schema migrated only to 0002 and holding an operation's inbox (an early deployment) migrates to 0003
/// when a store connects: the parent-and-status index exists, and an indexed query reads the old rows, only the
/// undone messages of the operation, in id order, with PostgreSQL planning it on that index.
#[tokio::test]
async fn a_populated_schema_of_migration_0002_migrates_and_its_inbox_is_queried_by_status() {
    let (url, schema, pool) = schema_migrated_to(2).await;
    let operation: i64 = sqlx::query_scalar(
        "INSERT INTO resources (kind, status, data, created_at, updated_at)
         VALUES ('operation', 'running', '{}', now(), now()) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .expect("an operation in the 0002 schema");
    // 2 000 consumed messages and every tenth of the next 100 undone, as a long-running operation leaves them.
    sqlx::query(
        "INSERT INTO resources (kind, parent_id, status, data, created_at, updated_at)
         SELECT 'inbox', $1, CASE WHEN n > 2000 AND n % 10 = 0 THEN 'new' ELSE 'done' END, jsonb_build_object('n', n),
                now(), now()
         FROM generate_series(1, 2100) AS n ORDER BY n",
    )
    .bind(operation)
    .execute(&pool)
    .await
    .expect("inbox rows in the 0002 schema");
    pool.close().await;

    let store = store_with(|options| options.schema = schema.clone()).await;
    let mut conn = connect_to_schema(&url, &schema).await;
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname")
            .bind(&schema)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(indexes.iter().any(|i| i == "resources_parent_status_idx"), "indexes after 0003: {indexes:?}");
    let undone = RowQuery::new("inbox").parent(RowId(operation)).statuses(["new"]);
    let rows = store.query(vec![undone]).await.expect("query").pop().unwrap();
    let ns: Vec<i64> = rows.iter().map(|row| row.data["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, (2001..=2100).filter(|n| n % 10 == 0).collect::<Vec<_>>(), "the undone messages, by id");
    sqlx::query("ANALYZE resources").execute(&mut conn).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id FROM resources WHERE kind = 'inbox' AND parent_id = $1 AND status = ANY($2::text[])
         ORDER BY id",
    )
    .bind(operation)
    .bind(vec!["new".to_string()])
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(plan.iter().any(|line| line.contains("resources_parent_status_idx")), "plan: {plan:#?}");
    conn.close().await.unwrap();
    drop(store);
    PgStore::drop_schema(&url, &schema).await.unwrap();
}

/// A schema migrated only to 0003 and holding rows in every lease state (an early deployment) migrates to
/// 0004 when a store connects: the fetch index holds only rows without a lease expiry and the new expiry index the
/// others; a fetch takes the unleased ready rows and takes over the expired lease, not the live one; the applies
/// of the new leases succeed; and a query by status still reads the rows of both indexes.
#[tokio::test]
async fn a_populated_schema_of_migration_0003_migrates_and_its_leases_fetch_and_apply() {
    let (url, schema, pool) = schema_migrated_to(3).await;
    // n 0, 1: ready and unleased; 2: ready under another pipeline's live lease; 3: ready under an expired lease;
    // 4: done.
    sqlx::query(
        "INSERT INTO resources (kind, status, data, created_at, updated_at, lock_token, lock_owner, lock_expires_at)
         VALUES ('task', 'ready', '{\"n\": 0}', now(), now(), NULL, NULL, NULL),
                ('task', 'ready', '{\"n\": 1}', now(), now(), NULL, NULL, NULL),
                ('task', 'ready', '{\"n\": 2}', now(), now(), nextval('lock_tokens'), 'other', now() + interval '1 hour'),
                ('task', 'ready', '{\"n\": 3}', now(), now(), nextval('lock_tokens'), 'other', now() - interval '1 minute'),
                ('task', 'done', '{\"n\": 4}', now(), now(), NULL, NULL, NULL)",
    )
    .execute(&pool)
    .await
    .expect("rows in the 0003 schema");
    pool.close().await;

    let store = store_with(|options| options.schema = schema.clone()).await;
    let mut conn = connect_to_schema(&url, &schema).await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname IN
         ('resources_fetch_idx', 'resources_lease_expiry_idx') ORDER BY indexname",
    )
    .bind(&schema)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(indexes.len(), 2, "indexes after 0004: {indexes:?}");
    assert!(indexes[0].1.ends_with("WHERE (lock_expires_at IS NULL)"), "{indexes:?}");
    assert!(indexes[1].1.ends_with("WHERE (lock_expires_at IS NOT NULL)"), "{indexes:?}");
    conn.close().await.unwrap();

    let params = ready_tasks();
    let leased = store.fetch(params.clone()).await.unwrap();
    let ns: Vec<i64> = leased.iter().map(|row| row.data["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, vec![0, 1, 3], "the unleased rows and the expired lease, in fetch order");
    for row in &leased {
        let lease = Lease { id: row.id, token: row.lock_token.unwrap() };
        let applied = store.apply(ApplyParams::new(lease, RowUpdate::status("done"))).await.unwrap();
        assert!(matches!(applied, lockstep::store::ApplyOutcome::Applied { .. }), "row {}: {applied:?}", row.id);
    }
    assert_eq!(store.fetch(params).await.unwrap(), vec![], "the live lease is not taken");
    let done = store.query(vec![RowQuery::new("task").statuses(["done"])]).await.unwrap().pop().unwrap();
    let ns: Vec<i64> = done.iter().map(|row| row.data["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, vec![0, 1, 3, 4], "the done rows, by id");
    let ready = store.query(vec![RowQuery::new("task").statuses(["ready"])]).await.unwrap().pop().unwrap();
    let ns: Vec<i64> = ready.iter().map(|row| row.data["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, vec![2], "the row under a live lease (in the expiry index only)");
    drop(store);
    PgStore::drop_schema(&url, &schema).await.unwrap();
}

/// A schema migrated only to 0004 and holding a lease with related locks (a deployment before the related-token
/// index) migrates to 0005 and 0006 when a store connects: the token index holds related locks only and
/// a lease enters none, and the table's pages are filled to half; the old lease's heartbeat extends its related rows, and its apply unlocks them; a lease and related
/// lock made after the migration heartbeat and release the same way.
#[tokio::test]
async fn a_populated_schema_of_migration_0004_migrates_and_its_related_locks_heartbeat_and_unlock() {
    let (url, schema, pool) = schema_migrated_to(4).await;
    // n 0: a parent under a live lease of `parents`, holding n 1 and 2 as related rows (the same token, owner
    // `parents`); n 3: a task under another live lease; n 4, 5: free children.
    sqlx::query("SELECT setval('lock_tokens', 100)").execute(&pool).await.expect("tokens past the old leases'");
    sqlx::query(
        "INSERT INTO resources (kind, status, data, created_at, updated_at, lock_token, lock_owner, lock_expires_at)
         VALUES ('parent', 'ready', '{\"n\": 0}', now(), now(), 7, 'parents', now() + interval '10 seconds'),
                ('child', 'ready', '{\"n\": 1}', now(), now(), 7, 'parents', now() + interval '10 seconds'),
                ('child', 'ready', '{\"n\": 2}', now(), now(), 7, 'parents', now() + interval '10 seconds'),
                ('task', 'ready', '{\"n\": 3}', now(), now(), 8, 'tasks', now() + interval '10 seconds'),
                ('child', 'ready', '{\"n\": 4}', now(), now(), NULL, NULL, NULL),
                ('child', 'ready', '{\"n\": 5}', now(), now(), NULL, NULL, NULL)",
    )
    .execute(&pool)
    .await
    .expect("rows in the 0004 schema");
    pool.close().await;

    let store = store_with(|options| options.schema = schema.clone()).await;
    let mut conn = connect_to_schema(&url, &schema).await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 AND indexdef LIKE '%token%'",
    )
    .bind(&schema)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(indexes.len(), 1, "token indexes after 0005: {indexes:?}");
    assert!(indexes[0].1.ends_with("(related_token) WHERE (related_token IS NOT NULL)"), "{indexes:?}");
    let options: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT c.reloptions::text[] FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = 'resources'",
    )
    .bind(&schema)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(options, Some(vec!["fillfactor=50".to_string()]), "the table's options after 0006");
    let rows = store.list("child", None).await.unwrap();
    let id = |n: i64| rows.iter().find(|row| row.data["n"] == n).map(|row| row.id).expect("a child");
    let (parent, task) =
        (store.list("parent", None).await.unwrap()[0].id, store.list("task", None).await.unwrap()[0].id);
    let expiry = |row: &Row| row.lock_expires_at.expect("a lease expiry");
    let before = expiry(&store.get(id(1)).await.unwrap().unwrap());

    // The old lease: its heartbeat extends its related rows too, and its apply unlocks them.
    let old = Lease { id: parent, token: lockstep::store::LockToken(7) };
    let beat = HeartbeatParams { leases: vec![old], lease_ttl: Duration::from_secs(3600) };
    assert_eq!(store.heartbeat(beat).await.unwrap(), vec![old], "the old lease is held");
    for n in [1, 2] {
        let row = store.get(id(n)).await.unwrap().unwrap();
        assert!(expiry(&row) > before, "child {n} extended with its holder: {row:?}");
    }
    let applied = store.apply(ApplyParams::new(old, RowUpdate::status("done"))).await.unwrap();
    assert!(matches!(applied, ApplyOutcome::Applied { .. }), "{applied:?}");
    for n in [1, 2] {
        let row = store.get(id(n)).await.unwrap().unwrap();
        assert_eq!((row.lock_token, row.lock_owner.as_deref()), (None, None), "child {n} unlocked: {row:?}");
    }
    let released = store.release(vec![Lease { id: task, token: lockstep::store::LockToken(8) }]).await.unwrap();
    assert_eq!(released, 1, "the other old lease is given back");

    // A new lease and related lock: the lease's own row enters no token index, the related rows do.
    let leased = store.fetch(ready_tasks()).await.unwrap();
    assert_eq!(leased.len(), 1, "the released task is leased again");
    let lease = lease_of(&leased[0]);
    let lock = LockRelatedParams {
        holder: lease,
        related: vec![id(4), id(5)],
        owner: "tasks".into(),
        lease_ttl: Duration::from_secs(30),
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(store.lock_related(lock).await.unwrap(), LockOutcome::Locked);
    let related: Vec<(i64, Option<i64>)> =
        sqlx::query_as("SELECT id, related_token FROM resources WHERE lock_token = $1 ORDER BY id")
            .bind(lease.token.0)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let token = Some(lease.token.0);
    assert_eq!(related, vec![(task.0, None), (id(4).0, token), (id(5).0, token)], "only related rows carry it twice");
    assert_eq!(store.release(vec![lease]).await.unwrap(), 1);
    let locked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM resources WHERE lock_token IS NOT NULL OR related_token IS NOT NULL")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(locked, 0, "the release unlocked the lease and its related rows");
    conn.close().await.unwrap();
    drop(store);
    PgStore::drop_schema(&url, &schema).await.unwrap();
}

/// Chaos mode's look at a replica from outside (`lockstep chaos run`'s `[faults] pause_inside_pass`): a live lease
/// of the store's own fetch (made at least the given time ago) under which related rows are locked, and none while
/// a session of the store's name is inside a transaction (read or write: a SIGSTOP there would keep its row locks,
/// or see it ended for idling) or once the lease is applied; another store's lease is not its own.
#[tokio::test]
async fn a_stores_lease_in_pass_is_its_own_live_lease_past_its_related_locks_outside_any_transaction() {
    let schema = unique_schema();
    let name = format!("lockstep test {schema}");
    let store = store_with(|o| {
        (o.schema, o.history, o.application_name) = (schema.clone(), true, name.clone());
    })
    .await;
    let other = store_with(|o| {
        (o.schema, o.history, o.application_name) = (schema.clone(), true, format!("{name} other"));
    })
    .await;
    let in_pass = || store.lease_in_pass(&name, Duration::ZERO);
    assert_eq!(in_pass().await.unwrap(), None, "no lease yet");
    let (row, spare) = (store.insert(ready_job()).await.unwrap(), store.insert(ready_job()).await.unwrap());
    let child = store.insert(NewRow::new("task", "ready", serde_json::json!({}))).await.unwrap();
    let mut fetch = params(Duration::from_secs(30), Duration::ZERO);
    fetch.limit = 1;
    let leased = store.fetch(fetch.clone()).await.unwrap();
    assert_eq!(leased.iter().map(|r| r.id).collect::<Vec<_>>(), [row.id]);
    let lease = lease_of(&leased[0]);
    assert_eq!(in_pass().await.unwrap(), None, "no related lock yet");
    let ttl = Duration::from_secs(30);
    let lock = LockRelatedParams {
        holder: lease,
        related: vec![child.id],
        owner: "jobs".into(),
        lease_ttl: ttl,
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(store.lock_related(lock).await.unwrap(), LockOutcome::Locked);
    assert_eq!(in_pass().await.unwrap(), Some(lease));
    let hour = Duration::from_secs(3600);
    assert_eq!(store.lease_in_pass(&name, hour).await.unwrap(), None, "fetched less than an hour ago");
    let theirs = other.fetch(fetch).await.unwrap();
    assert_eq!(theirs.iter().map(|r| r.id).collect::<Vec<_>>(), [spare.id]);
    assert_eq!(in_pass().await.unwrap(), Some(lease), "the other store's lease is not its own");
    // A session of the store's name inside a transaction, between its statements, then after a write: not
    // between calls.
    let url = format!("{}?application_name={}", database_url(), name.replace(' ', "%20"));
    let mut session = PgConnection::connect(&url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut session).await.expect("begin");
    sqlx::query("SELECT 1").execute(&mut session).await.expect("read");
    assert_eq!(in_pass().await.unwrap(), None, "a transaction is open between its statements");
    let touch = format!("UPDATE \"{schema}\".resources SET data = data WHERE id = $1");
    sqlx::query(sqlx::AssertSqlSafe(touch)).bind(spare.id.0).execute(&mut session).await.expect("write");
    assert_eq!(in_pass().await.unwrap(), None, "a write transaction is open");
    sqlx::query("ROLLBACK").execute(&mut session).await.expect("rollback");
    assert_eq!(in_pass().await.unwrap(), Some(lease));
    store.apply(ApplyParams::new(lease, RowUpdate::status("done"))).await.unwrap();
    assert_eq!(in_pass().await.unwrap(), None, "applied: the pass is over");
    drop(session);
    store.close().await;
    other.close().await;
    // Its own schema, left behind before (a full test run kept one per run).
    PgStore::drop_schema(&database_url(), &schema).await.unwrap();
}

/// Chaos mode records a guarded write refused for its superseded token, as MemStore does: a stale related lock
/// (its transaction rolled back) gets its `LockRelated … Stale` record, a stale apply in a batch its `Apply`
/// record (`applied: false`), and a refused reset-and-retry its `Reset` record (`held: false`), which
/// `lockstep chaos run`'s trace and a scenario's `[[expect.trace]]` read.
#[tokio::test]
async fn stale_writes_are_recorded_in_the_history_as_in_memstore() {
    let h = PgHarness::with(|o| o.history = true).await;
    let store = h.store();
    let (row, child) = (store.insert(ready_job()).await.unwrap(), store.insert(ready_job()).await.unwrap());
    let ttl = Duration::from_secs(1);
    let old = lease_of(&store.fetch(params(ttl, Duration::ZERO)).await.unwrap()[0]);
    assert_eq!(old.id, row.id);
    h.advance(Duration::from_secs(2));
    let new = store.fetch(params(ttl, Duration::ZERO)).await.unwrap();
    let new = lease_of(new.iter().find(|r| r.id == row.id).expect("the expired lease was taken again"));
    let lock = LockRelatedParams {
        holder: old,
        related: vec![child.id],
        owner: "jobs".into(),
        lease_ttl: ttl,
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(store.lock_related(lock).await.unwrap(), LockOutcome::Stale);
    // A stale apply in a batch with a current one: its record too.
    let batch =
        vec![ApplyParams::new(old, RowUpdate::status("done")), ApplyParams::new(new, RowUpdate::status("done"))];
    let outcomes = store.apply_batch(batch).await.unwrap();
    assert_eq!(outcomes[0], ApplyOutcome::Stale, "{outcomes:?}");
    // A refused reset-and-retry: its `Reset … held=false` record.
    assert!(!store.reset_for_retry(old, std::time::Duration::from_millis(500)).await.unwrap());
    let history = store.history().await.unwrap();
    let refused = history.iter().filter(|c| matches!(c.op, CommitOp::Reset { lease, held: false } if lease == old));
    assert_eq!(refused.count(), 1, "{history:?}");
    let stale_locks =
        history.iter().filter(|c| matches!(c.op, CommitOp::LockRelated { outcome: LockOutcome::Stale, .. }));
    assert_eq!(stale_locks.count(), 1, "{history:?}");
    let stale_applies: Vec<_> =
        history.iter().filter(|c| matches!(c.op, CommitOp::Apply { applied: false, .. })).map(|c| &c.op).collect();
    assert!(matches!(stale_applies[..], [CommitOp::Apply { lease, .. }] if *lease == old), "{history:?}");
}

/// A fetch of up to 10 `ready` rows of kind `task` for pipeline `tasks` (30 s leases): the migration tests'
/// fetch of the rows they wrote under an older schema.
fn ready_tasks() -> FetchParams {
    FetchParams {
        pipeline: "tasks".into(),
        kind: "task".into(),
        statuses: vec!["ready".into()],
        limit: 10,
        lease_ttl: Duration::from_secs(30),
        min_processing_interval: Duration::from_secs(5),
        retry_delay: Duration::from_secs(1),
    }
}

/// TLS is as the URL asks (`sslmode`, as libpq takes it): `sslmode=require` connects over TLS (every session of
/// the store shows `ssl` in `pg_stat_ssl`), a URL that names no mode connects without it, and `verify-full` against
/// a certificate that does not name the URL's host is `Invalid` (the URL's fault, the same on every try), not a
/// server that cannot be reached. Before lockstep built sqlx with a TLS backend a URL asking for TLS failed with
/// "SQLx was built without TLS support", so no managed server that demands TLS could be used (a new user's
/// trial). A server without TLS (`ssl = off`) refuses `require`, saying so.
#[tokio::test]
async fn tls_is_as_the_url_asks() {
    let schema = unique_schema();
    let base = database_url();
    let with = |mode: &str| format!("{base}{}sslmode={mode}", if base.contains('?') { '&' } else { '?' });
    let mut conn = PgConnection::connect(&base).await.expect("PostgreSQL is reachable");
    let server_ssl: String = sqlx::query_scalar("SHOW ssl").fetch_one(&mut conn).await.unwrap();
    let open = |url: String, name: &str| {
        let mut options = PgOptions::new(url);
        (options.schema, options.application_name) = (schema.clone(), format!("lockstep tls {name} {schema}"));
        PgStore::connect_with(options)
    };
    let sessions_ssl = async |conn: &mut PgConnection, name: &str| -> Vec<bool> {
        sqlx::query_scalar(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
        )
        .bind(format!("lockstep tls {name} {schema}"))
        .fetch_all(conn)
        .await
        .unwrap()
    };
    let plain = open(base.clone(), "plain").await.expect("a plain connection");
    plain.now().await.unwrap();
    let ssl = sessions_ssl(&mut conn, "plain").await;
    assert!(!ssl.is_empty() && ssl.iter().all(|&ssl| !ssl), "a URL without sslmode: sessions' ssl {ssl:?}");
    drop(plain);
    let required = open(with("require"), "require").await;
    if server_ssl != "on" {
        let Err(error) = required else { panic!("a server without TLS accepted sslmode=require") };
        assert!(error.to_string().contains("TLS"), "{error}");
        PgStore::drop_schema(&base, &schema).await.unwrap();
        return;
    }
    let store = required.expect("a TLS connection");
    store.now().await.expect("a call over TLS");
    let ssl = sessions_ssl(&mut conn, "require").await;
    assert!(!ssl.is_empty() && ssl.iter().all(|&ssl| ssl), "sslmode=require: sessions' ssl {ssl:?}");
    drop(store);
    // The server's certificate here names no IP address: verify-full to 127.0.0.1 refuses it on every try.
    let verified = open(with("verify-full").replace("localhost", "127.0.0.1"), "verify").await;
    match verified {
        Err(StoreError::Invalid(message)) => assert!(message.contains("certificate"), "{message}"),
        Err(other) => panic!("verify-full against a certificate for another name: {other:?}"),
        Ok(_) => {} // a certificate that names 127.0.0.1 (and a CA this machine trusts): nothing to refuse
    }
    PgStore::drop_schema(&base, &schema).await.unwrap();
}

/// A schema that already holds another application's `resources` (no lockstep migration recorded) is refused as
/// `Invalid` before any migration runs, naming the schema and the tables, and nothing is left behind (the first
/// migration used to fail half-way on the clash and leave sqlx's `_sqlx_migrations`: a new user's trial). A
/// schema lockstep migrated, or one holding only tables of other names, opens as before.
#[tokio::test]
async fn a_schema_holding_another_applications_resources_table_is_refused_and_left_as_it_was() {
    let schema = unique_schema();
    let url = database_url();
    let mut conn = PgConnection::connect(&url).await.expect("PostgreSQL is reachable");
    let setup = format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.orders (id int); CREATE TABLE {schema}.resources (x int)"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(setup)).execute(&mut conn).await.unwrap();
    let mut options = PgOptions::new(url.clone());
    options.schema = schema.clone();
    let Err(error) = PgStore::connect_with(options.clone()).await else { panic!("a clashing schema opened") };
    let expected = format!("schema: {schema} already holds resources, which no lockstep migration made");
    assert!(matches!(&error, StoreError::Invalid(message) if message.starts_with(&expected)), "{error}");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY tablename")
            .bind(&schema)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(tables, ["orders", "resources"], "the schema is as it was");
    // Without the clash the same schema opens, beside the application's own table, and opens again once migrated.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {schema}.resources"))).execute(&mut conn).await.unwrap();
    drop(PgStore::connect_with(options.clone()).await.expect("a schema with other tables opens"));
    drop(PgStore::connect_with(options).await.expect("a migrated schema opens again"));
    PgStore::drop_schema(&url, &schema).await.unwrap();
}
