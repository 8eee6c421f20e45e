//! Enqueue in the caller's own transaction on PostgreSQL (`PgStore::insert_in`, `PgStore::insert_keyed_in`;
//! docs/real-mode.md, "Enqueue in your own transaction"): the rows and their fetch hints commit with the caller's
//! transaction or not at all, on a caller's connection whose `search_path` does not name the store's schema. Needs
//! PostgreSQL (see `support::pg`; never skips). Each case has a schema of its own, dropped when it passes.
//!
//! A hint that must come only at the commit is told from one sent earlier without waiting on a clock: a second
//! store on the schema (another replica) sends a marker hint while the caller's transaction is still open, and
//! PostgreSQL delivers notifications in commit order, so a hint sent before the marker's commit would reach the
//! first store's subscribers ahead of the marker.

#![cfg(not(madsim))]

use crate::support;

use lockstep::store::conformance::Harness;
use lockstep::store::{
    FetchParams, Hint, InsertKeyedParams, NewHint, NewRow, PgOptions, PgStore, RowId, Store, StoreError,
};
use serde_json::json;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::time::Duration;
use support::pg::{PgHarness, database_url};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;

/// Longest wait for a hint that should come.
const HINT_WAIT: Duration = Duration::from_secs(10);
/// How often, and how many times, the concurrent keyed case looks for the later caller's lock wait (10 s in all).
const LOCK_WAIT_POLL: Duration = Duration::from_millis(25);
const LOCK_WAIT_POLLS_MAX: usize = 400;

async fn next_hint(rx: &mut broadcast::Receiver<Hint>, which: &str) -> Hint {
    support::pg::next_hint(rx, which, HINT_WAIT).await
}

/// A second store (replica) on the harness's schema: its hints reach the harness's store through `NOTIFY`.
async fn replica(h: &PgHarness) -> PgStore {
    let mut options = PgOptions::new(database_url());
    options.schema = h.store().schema().to_string();
    options.max_connections = 2;
    PgStore::connect_with(options).await.expect("a second store on the schema")
}

/// The caller's own connection, as an application opens it: its `search_path` is `public`, not the store's schema.
async fn caller() -> PgConnection {
    let mut conn = PgConnection::connect(&database_url()).await.expect("the caller's connection");
    sqlx::query("SET search_path TO public").execute(&mut conn).await.expect("the caller's search_path");
    conn
}

/// Sends a marker hint from `replica` (committed at once) and requires it to be the next hint `rx` hears: nothing
/// the caller's open or rolled-back transaction sent went out before it.
async fn marker_comes_first(replica: &PgStore, rx: &mut broadcast::Receiver<Hint>, after: &str) {
    replica.hint("marker", None).await.expect("the replica's hint");
    assert_eq!(next_hint(rx, "the store's subscriber").await, "marker", "a hint went out {after}");
}

fn fetch_params(kind: &str) -> FetchParams {
    FetchParams {
        pipeline: format!("{kind}s"),
        kind: kind.to_string(),
        statuses: vec!["queued".to_string()],
        limit: 10,
        lease_ttl: Duration::from_secs(30),
        min_processing_interval: Duration::from_secs(60),
        retry_delay: Duration::from_secs(1),
    }
}

fn work_items() -> Vec<NewRow> {
    vec![
        NewRow::new("email", "queued", json!({"to": "buyer"})),
        NewRow::new("sms", "queued", json!({"to": "+100"})),
        NewRow::new("email", "queued", json!({"to": "seller"})),
    ]
}

#[tokio::test]
async fn a_committed_enqueue_stores_its_rows_and_hints_each_kind_at_the_commit_not_before() {
    let h = PgHarness::new().await;
    let replica = replica(&h).await;
    let store = h.store();
    let mut rx = store.subscribe_hints();
    let mut conn = caller().await;
    let mut tx = conn.begin().await.expect("begin");
    let ids = store.insert_in(&mut tx, work_items()).await.expect("insert_in");
    assert_eq!(ids.len(), 3, "one id per row");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not increasing in input order: {ids:?}");
    assert_eq!(store.get(ids[0]).await.expect("get"), None, "row {} is visible before the commit", ids[0]);
    marker_comes_first(&replica, &mut rx, "before the caller's commit").await;
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "a hint arrived before the caller's commit");
    tx.commit().await.expect("commit");
    assert_eq!(next_hint(&mut rx, "the store's subscriber").await, "email", "the first kind, at the commit");
    assert_eq!(next_hint(&mut rx, "the store's subscriber").await, "sms", "the second kind, once");
    marker_comes_first(&replica, &mut rx, "twice for one kind").await;
    // The rows are what `insert_many` of the same rows stores.
    let rows = work_items();
    let twins = store.insert_many(rows.clone(), NewHint::kinds_of(&rows)).await.expect("insert_many");
    for ((id, twin), new) in ids.iter().zip(&twins).zip(&rows) {
        let (row, twin) = (store.get(*id).await.unwrap().unwrap(), store.get(*twin).await.unwrap().unwrap());
        assert_eq!((&row.kind, row.parent_id, &row.status, &row.data), (&new.kind, None, &new.status, &new.data));
        assert_eq!(row.updated_at, row.created_at, "updated_at of row {id}");
        assert!(row.created_at <= twin.created_at, "row {id} created after its twin {}", twin.id);
        let unset = |r: &lockstep::store::Row| {
            (r.last_processed_at, r.lock_expires_at, r.lock_token, r.lock_owner.clone(), r.hinted, r.attempts)
        };
        assert_eq!(unset(&row), unset(&twin), "row {id} and its twin {} differ beyond ids and times", twin.id);
    }
    let fetched: Vec<RowId> = store.fetch(fetch_params("email")).await.expect("fetch").iter().map(|r| r.id).collect();
    assert_eq!(fetched, vec![ids[0], ids[2], twins[0], twins[2]], "the enqueued emails are fetched at once");
    drop(replica);
}

#[tokio::test]
async fn a_rolled_back_enqueue_stores_no_row_and_sends_no_hint() {
    let h = PgHarness::new().await;
    let replica = replica(&h).await;
    let store = h.store();
    let mut rx = store.subscribe_hints();
    let mut conn = caller().await;
    let mut tx = conn.begin().await.expect("begin");
    let rolled_back = store.insert_in(&mut tx, work_items()).await.expect("insert_in");
    tx.rollback().await.expect("rollback");
    let mut tx = conn.begin().await.expect("begin");
    let dropped = store.insert_in(&mut tx, work_items()).await.expect("insert_in");
    drop(tx); // a transaction dropped unfinished rolls back
    marker_comes_first(&replica, &mut rx, "from a rolled-back transaction").await;
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "a rolled-back transaction sent a hint");
    for id in rolled_back.iter().chain(&dropped) {
        assert_eq!(store.get(*id).await.expect("get"), None, "row {id} of a rolled-back enqueue exists");
    }
    assert_eq!(store.list("email", None).await.expect("list"), vec![], "emails of rolled-back enqueues");
    // The connection is the caller's still, and the store's calls never used it.
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await.expect("the caller's connection");
    assert_eq!(one, 1);
    drop(replica);
}

#[tokio::test]
async fn the_callers_own_write_and_its_enqueued_rows_commit_together_or_not_at_all() {
    let h = PgHarness::new().await;
    let store = h.store();
    let orders = format!("\"{}\".orders", store.schema());
    let mut conn = caller().await;
    sqlx::query(AssertSqlSafe(format!("CREATE TABLE {orders} (id bigint PRIMARY KEY, item text NOT NULL)")))
        .execute(&mut conn)
        .await
        .expect("the caller's table");
    let place = format!("INSERT INTO {orders} (id, item) VALUES ($1, $2)");
    let order = |id: i64| NewRow::new("email", "queued", json!({"order": id}));

    let mut tx = conn.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(place.clone())).bind(1_i64).bind("book").execute(&mut *tx).await.expect("order 1");
    let placed = store.insert_in(&mut tx, vec![order(1)]).await.expect("insert_in");
    tx.commit().await.expect("commit");

    // The caller's transaction fails after the enqueue (a duplicate order): its rollback takes the email too.
    let mut tx = conn.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(place.clone())).bind(2_i64).bind("pen").execute(&mut *tx).await.expect("order 2");
    let failed = store.insert_in(&mut tx, vec![order(2)]).await.expect("insert_in");
    let duplicate = sqlx::query(AssertSqlSafe(place.clone())).bind(1_i64).bind("again").execute(&mut *tx).await;
    assert!(duplicate.is_err(), "a duplicate order id is refused");
    tx.rollback().await.expect("rollback");

    // A refused row fails before any statement: the caller's transaction goes on, and nothing of it is enqueued.
    let mut tx = conn.begin().await.expect("begin");
    let bad = NewRow::new("email", "queued", json!({"order": "\u{0}"}));
    match store.insert_in(&mut tx, vec![order(3), bad]).await {
        Err(StoreError::Invalid(message)) => assert!(message.contains("insert_in: rows[1]"), "{message}"),
        other => panic!("insert_in of a row with a NUL: {other:?}"),
    }
    sqlx::query(AssertSqlSafe(place)).bind(3_i64).bind("ink").execute(&mut *tx).await.expect("order 3");
    tx.commit().await.expect("commit");

    let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT id FROM {orders} ORDER BY id")))
        .fetch_all(&mut conn)
        .await
        .expect("the caller's orders");
    assert_eq!(ids, vec![1, 3], "the caller's committed orders");
    let emails = store.list("email", None).await.expect("list");
    let emailed: Vec<(RowId, serde_json::Value)> = emails.into_iter().map(|row| (row.id, row.data)).collect();
    assert_eq!(emailed, vec![(placed[0], json!({"order": 1}))], "only the committed order's email exists");
    assert_eq!(store.get(failed[0]).await.expect("get"), None, "the failed order's email {}", failed[0]);
}

#[tokio::test]
async fn a_keyed_enqueue_inserts_once_per_key_and_only_when_the_callers_transaction_commits() {
    let h = PgHarness::new().await;
    let store = h.store();
    let params = |key: &str, to: &str| InsertKeyedParams {
        key: key.to_string(),
        row: NewRow::new("email", "queued", json!({"to": to})),
    };
    let mut conn = caller().await;

    // Rolled back: the key is free again.
    let mut tx = conn.begin().await.expect("begin");
    let undone = store.insert_keyed_in(&mut tx, params("k1", "first")).await.expect("insert_keyed_in");
    assert!(undone.inserted, "the first keyed insert inserts");
    tx.rollback().await.expect("rollback");
    assert_eq!(store.get(undone.id).await.expect("get"), None, "row {} of a rolled-back keyed insert", undone.id);
    let stored = store.insert_keyed(params("k1", "second")).await.expect("insert_keyed");
    assert!(stored.inserted, "the key of a rolled-back transaction names no row");

    // A key committed earlier: nothing inserted, its row returned, and the caller's transaction goes on.
    let mut tx = conn.begin().await.expect("begin");
    let again = store.insert_keyed_in(&mut tx, params("k1", "third")).await.expect("insert_keyed_in");
    assert_eq!((again.id, again.inserted), (stored.id, false), "a key committed before names its row");
    let fresh = store.insert_keyed_in(&mut tx, params("k2", "fourth")).await.expect("insert_keyed_in");
    assert!(fresh.inserted, "a new key in the same transaction inserts");
    tx.commit().await.expect("commit");

    // Two callers with one key at once: the later waits for the earlier's commit and returns its row, and its own
    // transaction is still usable (only the savepoint was undone).
    let mut first = caller().await;
    let mut first_tx = first.begin().await.expect("begin");
    let winner = store.insert_keyed_in(&mut first_tx, params("k3", "winner")).await.expect("insert_keyed_in");
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
    let later = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut conn = caller().await;
            let mut tx = conn.begin().await.expect("begin");
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *tx).await.expect("pid");
            pid_tx.send(pid).expect("the test waits for the pid");
            let done = store.insert_keyed_in(&mut tx, params("k3", "loser")).await.expect("insert_keyed_in");
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *tx).await.expect("the transaction goes on");
            tx.commit().await.expect("commit");
            (done, one)
        })
    };
    // The winner commits only once the later caller waits for its key (a lock wait in `pg_stat_activity`), so
    // that the later one meets the key in `ON CONFLICT` and undoes its own row. No event says so: poll, bounded.
    let pid = pid_rx.await.expect("the later caller's pid");
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'";
    for tries in 0.. {
        let waits: i64 = sqlx::query_scalar(waiting).bind(pid).fetch_one(&mut conn).await.expect("pg_stat_activity");
        if waits > 0 {
            break;
        }
        assert!(tries < LOCK_WAIT_POLLS_MAX, "the later keyed insert (session {pid}) never waited for the first");
        tokio::time::sleep(LOCK_WAIT_POLL).await;
    }
    first_tx.commit().await.expect("commit");
    let (done, one) = later.await.expect("the later caller");
    assert_eq!((done.id, done.inserted, one), (winner.id, false, 1), "the later caller gets the winner's row");
    let emails: Vec<serde_json::Value> =
        store.list("email", None).await.expect("list").into_iter().map(|row| row.data["to"].clone()).collect();
    assert_eq!(emails, vec![json!("second"), json!("fourth"), json!("winner")], "one row per committed key");
}

/// A time-out of the caller's own connection ends the call as the caller's: the error names the setting, not a
/// span of the store's it does not know (a new user's trial saw "timed out after 2s", the store's lock time-out,
/// for a caller's `lock_timeout` of 200 ms).
#[tokio::test]
async fn the_callers_own_lock_timeout_is_reported_as_the_callers() {
    let h = PgHarness::new().await;
    let store = h.store();
    let params = |to: &str| InsertKeyedParams {
        key: "held".to_string(),
        row: NewRow::new("email", "queued", json!({"to": to})),
    };
    let mut first = caller().await;
    let mut first_tx = first.begin().await.expect("begin");
    store.insert_keyed_in(&mut first_tx, params("first")).await.expect("insert_keyed_in");
    let mut later = caller().await;
    sqlx::query("SET lock_timeout = '100ms'").execute(&mut later).await.expect("the caller's lock_timeout");
    let mut later_tx = later.begin().await.expect("begin");
    match store.insert_keyed_in(&mut later_tx, params("later")).await {
        Err(StoreError::Other(message)) => {
            assert!(message.contains("your connection's lock_timeout"), "{message}");
        }
        other => panic!("a keyed insert held up past the caller's lock_timeout returned {other:?}"),
    }
    later_tx.rollback().await.expect("rollback");
    first_tx.rollback().await.expect("rollback");
}

/// A purge of finished operations an hour old (the two cases below).
fn purge_operations() -> lockstep::store::PurgeParams {
    lockstep::store::PurgeParams {
        kind: "operation".into(),
        statuses: vec!["completed".into()],
        older_than: Duration::from_secs(3600),
        limit: 100,
        parent_statuses: Vec::new(),
    }
}

/// The race of a purge and a child insert, the child first (DESIGN §2, "Parents"): a caller's transaction inserts
/// a child under a finished, old operation and has not committed when a purge runs. The purge cannot see the child,
/// but the insert locked its parent (the parent foreign key's `FOR KEY SHARE`), so the purge passes over it; once
/// the child commits, the parent has a child and stays. Without the key the purge deleted the parent and the child
/// committed under a parent that was gone.
#[tokio::test]
async fn a_purge_passes_over_a_parent_while_a_child_is_inserted_under_it_in_an_open_transaction() {
    let h = PgHarness::new().await;
    let store = h.store();
    let parent = store.insert(NewRow::new("operation", "completed", json!({}))).await.expect("insert").id;
    h.advance(Duration::from_secs(3601));
    let mut conn = caller().await;
    let mut tx = conn.begin().await.expect("begin");
    let child = NewRow::new("inbox", "new", json!({"report": "late"})).with_parent(parent);
    let ids = store.insert_in(&mut tx, vec![child]).await.expect("insert_in under a parent that exists");
    assert_eq!(store.purge(purge_operations()).await.expect("purge"), 0, "the parent of an uncommitted child");
    tx.commit().await.expect("commit");
    assert!(store.get(parent).await.expect("get").is_some(), "operation {parent} is gone");
    assert_eq!(store.get(ids[0]).await.expect("get").expect("the child").parent_id, Some(parent));
    assert_eq!(store.purge(purge_operations()).await.expect("purge"), 0, "a parent with a committed child");
}

/// The same race, the purge first: the purge deletes the parent and commits while a caller's transaction is open,
/// then the caller inserts a child under it. The insert is refused (`Invalid`, naming the call, the row and
/// `parent_id`), and the caller's transaction is aborted, so nothing of it commits.
#[tokio::test]
async fn a_child_inserted_after_a_purge_deleted_its_parent_is_refused() {
    let h = PgHarness::new().await;
    let store = h.store();
    let parent = store.insert(NewRow::new("operation", "completed", json!({}))).await.expect("insert").id;
    h.advance(Duration::from_secs(3601));
    let mut conn = caller().await;
    let mut tx = conn.begin().await.expect("begin");
    let before = NewRow::new("email", "queued", json!({"to": "ops"}));
    store.insert_in(&mut tx, vec![before]).await.expect("insert_in");
    assert_eq!(store.purge(purge_operations()).await.expect("purge"), 1);
    let child = NewRow::new("inbox", "new", json!({"report": "late"})).with_parent(parent);
    match store.insert_in(&mut tx, vec![child]).await {
        Err(StoreError::Invalid(message)) => assert_eq!(
            message,
            format!(
                "insert_in: rows[0]: parent_id {parent} names no row (a row's parent must exist when the row is \
                 inserted)"
            )
        ),
        other => panic!("a child of the purged {parent}: {other:?}"),
    }
    tx.rollback().await.expect("rollback");
    for kind in ["inbox", "email"] {
        assert_eq!(store.list(kind, None).await.expect("list"), vec![], "a {kind} row of the aborted transaction");
    }
}
