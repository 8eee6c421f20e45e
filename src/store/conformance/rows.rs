//! Plain reads and writes: insert, get, list and the store's clock ([`Store::insert`], [`Store::get`],
//! [`Store::list`], [`Store::now`]; DESIGN §2, Schema).

use super::*;
use crate::store::{
    FailureParams, InsertKeyedParams, KeyedInsert, NewHint, RelatedUpdate, Retry, RowQuery, RowUpdate, StoreError,
    WriteOutcome,
};
use serde_json::json;

/// An inserted row is stored as given, unleased, unprocessed and not hinted, created and updated at the
/// insert's `now`; `get` reads it back the same.
pub async fn insert_stores_an_unleased_unprocessed_row<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let new = NewRow::new("job", "pending", json!({"command": "train", "ranks": [0, 1]})).with_parent(parent.id);
    let before = now(&h).await;
    let row = insert_new(&h, new.clone()).await;
    let after = now(&h).await;
    assert_eq!(row.kind, new.kind, "kind of row {}", row.id);
    assert_eq!(row.parent_id, Some(parent.id), "parent of row {}", row.id);
    assert_eq!(row.status, new.status, "status of row {}", row.id);
    assert_eq!(row.data, new.data, "data of row {}", row.id);
    assert_within(row.created_at, before, after, "created_at");
    assert_eq!(row.updated_at, row.created_at, "updated_at of row {}", row.id);
    assert_eq!(row.last_processed_at, None, "last_processed_at of row {}", row.id);
    assert_unlocked(&row);
    assert!(!row.hinted, "row {} is hinted", row.id);
    assert_eq!(get(&h, row.id).await, row, "insert returned row {} not as stored", row.id);
}

/// `insert_id` stores the row `insert` would, and refuses what `insert` refuses.
pub async fn insert_id_stores_the_row_insert_would<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let new = NewRow::new("inbox", "new", json!({"type": "job_started", "i": [1, 2]})).with_parent(parent.id);
    let row = insert_new(&h, new.clone()).await;
    let id = h.store().insert_id(new.clone()).await.expect("insert_id");
    assert!(id > row.id, "id {id} after {}", row.id);
    let stored = get(&h, id).await;
    let (r, s) = (&row, &stored);
    assert_eq!((&s.kind, s.parent_id, &s.status, &s.data), (&r.kind, r.parent_id, &r.status, &r.data), "row {id}");
    assert_unlocked(&stored);
    assert_eq!((stored.last_processed_at, stored.hinted), (None, false), "row {id} processed or hinted");
    let bad = h.store().insert_id(NewRow::new("inbox", "new", json!({"m": "a\0b"}))).await;
    assert!(matches!(&bad, Err(StoreError::Invalid(m)) if m.contains("data")), "{bad:?}");
}

async fn insert_keyed<H: Harness>(h: &H, key: &str, row: NewRow) -> KeyedInsert {
    let params = InsertKeyedParams { key: key.to_string(), row };
    h.store().insert_keyed(params).await.unwrap_or_else(|e| panic!("insert_keyed {key:?}: {e}"))
}

/// A keyed insert stores its row as `insert` would the first time; a second one with the same key, whatever row
/// it carries, inserts nothing and returns the first row's id (a retried submit runs once); another key
/// inserts another row.
pub async fn insert_keyed_inserts_once_per_key_and_then_returns_the_first_row<H: Harness>(h: H) {
    let first = NewRow::new("operation", "starting", json!({"spec": 1}));
    let done = insert_keyed(&h, "submit-a", first.clone()).await;
    assert!(done.inserted, "the first insert with key submit-a inserted nothing: {done:?}");
    let stored = get(&h, done.id).await;
    assert_eq!(
        (&stored.kind, &stored.status, &stored.data),
        (&first.kind, &first.status, &first.data),
        "row {}",
        done.id
    );
    assert_unlocked(&stored);
    let again = insert_keyed(&h, "submit-a", NewRow::new("operation", "starting", json!({"spec": 2}))).await;
    assert_eq!(again, KeyedInsert { id: done.id, inserted: false }, "the second insert with key submit-a");
    assert_eq!(get(&h, done.id).await, stored, "a second insert with key submit-a wrote row {}", done.id);
    let other = insert_keyed(&h, "submit-b", first.clone()).await;
    assert!(other.inserted && other.id != done.id, "key submit-b: {other:?}");
    let rows = h.store().list("operation", None).await.expect("list");
    assert_eq!(ids(&rows), sorted(vec![done.id, other.id]), "one row per key");
}

/// Two keyed inserts with one key at once insert one row, and both return it.
pub async fn concurrent_keyed_inserts_with_one_key_insert_one_row<H: Harness>(h: H) {
    let row = || NewRow::new("operation", "starting", json!({}));
    let (a, b) = tokio::join!(insert_keyed(&h, "racing", row()), insert_keyed(&h, "racing", row()));
    assert_eq!(a.id, b.id, "two rows for one key: {a:?} {b:?}");
    assert!(a.inserted != b.inserted, "exactly one of the two inserted: {a:?} {b:?}");
    let rows = h.store().list("operation", None).await.expect("list");
    assert_eq!(ids(&rows), vec![a.id], "rows of kind operation");
}

/// A keyed insert with an empty key, a NUL in its key or a key past [`KEY_TEXT_BYTES_MAX`](crate::store::KEY_TEXT_BYTES_MAX),
/// or a row `insert` would refuse, is refused naming the field, and nothing is inserted.
pub async fn insert_keyed_refuses_a_bad_key_or_row<H: Harness>(h: H) {
    let row = || NewRow::new("operation", "starting", json!({}));
    let long = "k".repeat(crate::store::KEY_TEXT_BYTES_MAX + 1);
    let cases = [("", row(), "key"), ("a\0b", row(), "key"), (long.as_str(), row(), "key")];
    let bad_row = NewRow::new("operation", "starting", json!({"m": "a\0b"}));
    for (key, row, field) in cases.into_iter().chain([("fine", bad_row, "data")]) {
        let result = h.store().insert_keyed(InsertKeyedParams { key: key.to_string(), row }).await;
        assert!(
            matches!(&result, Err(StoreError::Invalid(m)) if m.contains(field)),
            "key of {} bytes: {result:?}",
            key.len()
        );
    }
    let rows = h.store().list("operation", None).await.expect("list");
    assert_eq!(ids(&rows), vec![], "a refused keyed insert inserted rows");
    assert!(insert_keyed(&h, "fine", row()).await.inserted, "a refused insert took the key");
}

/// Ids grow with every insert.
pub async fn insert_assigns_increasing_ids<H: Harness>(h: H) {
    let mut last = None;
    for kind in ["job", "node", "job"] {
        let id = insert(&h, kind).await.id;
        assert!(Some(id) > last, "id {id} after {last:?}");
        last = Some(id);
    }
}

/// `get` of an id that was never given out is `None`, not an error.
pub async fn get_of_a_missing_row_is_none<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let missing = RowId(row.id.0 + 1_000);
    assert_eq!(h.store().get(missing).await.expect("get"), None, "row {missing} exists");
}

/// `list` returns the rows of one kind, under one parent or any, by id.
pub async fn list_filters_by_kind_and_parent_in_id_order<H: Harness>(h: H) {
    let first = insert(&h, "operation").await;
    let second = insert(&h, "operation").await;
    let child = |parent: &Row| NewRow::new("job", READY, json!({})).with_parent(parent.id);
    let a = insert_new(&h, child(&first)).await;
    let b = insert_new(&h, child(&second)).await;
    let c = insert_new(&h, child(&first)).await;
    let orphan = insert(&h, "job").await;
    insert_new(&h, NewRow::new("node", READY, json!({})).with_parent(first.id)).await;
    assert_eq!(list_ids(&h, "job", Some(first.id)).await, vec![a.id, c.id], "jobs of {}", first.id);
    assert_eq!(list_ids(&h, "job", Some(second.id)).await, vec![b.id], "jobs of {}", second.id);
    assert_eq!(list_ids(&h, "job", None).await, vec![a.id, b.id, c.id, orphan.id], "all jobs");
    assert_eq!(list_ids(&h, "operation", None).await, vec![first.id, second.id], "all operations");
    assert_eq!(list_ids(&h, "allocation", None).await, vec![], "a kind with no rows");
}

async fn list_ids<H: Harness>(h: &H, kind: &str, parent: Option<RowId>) -> Vec<RowId> {
    ids(&h.store().list(kind, parent).await.expect("list"))
}

/// `query` returns, for each query in input order, the rows of its kind that pass every filter it gives (parent,
/// statuses, a keyset cursor, ids), by id; a status written later moves a row between status filters.
pub async fn query_filters_by_parent_status_cursor_and_ids_in_id_order<H: Harness>(h: H) {
    let first = insert(&h, "operation").await;
    let second = insert(&h, "operation").await;
    let child = |parent: &Row, status: &str| NewRow::new("inbox", status, json!({})).with_parent(parent.id);
    let a = insert_new(&h, child(&first, "new")).await;
    let b = insert_new(&h, child(&first, "done")).await;
    let c = insert_new(&h, child(&second, "new")).await;
    let d = insert_new(&h, child(&first, "new")).await;
    let orphan = insert_new(&h, NewRow::new("inbox", "new", json!({}))).await;
    insert_new(&h, NewRow::new("job", "new", json!({})).with_parent(first.id)).await;
    let inbox = || RowQuery::new("inbox");
    let queries = vec![
        inbox().parent(first.id).statuses(["new"]),
        inbox().parent(first.id),
        inbox().parent(first.id).after(Some(a.id)),
        inbox().statuses(["new"]),
        inbox().statuses(["new", "done"]).after(Some(b.id)),
        inbox().ids([d.id, a.id, d.id, RowId(orphan.id.0 + 1_000), first.id]),
        inbox().parent(second.id).statuses(Vec::<String>::new()),
        inbox(),
        RowQuery::new("allocation"),
    ];
    let answers: Vec<Vec<RowId>> = h.store().query(queries).await.expect("query").iter().map(|r| ids(r)).collect();
    let expected = vec![
        vec![a.id, d.id],
        vec![a.id, b.id, d.id],
        vec![b.id, d.id],
        vec![a.id, c.id, d.id, orphan.id],
        vec![c.id, d.id, orphan.id],
        vec![a.id, d.id],
        vec![],
        vec![a.id, b.id, c.id, d.id, orphan.id],
        vec![],
    ];
    for (i, (got, want)) in answers.iter().zip(&expected).enumerate() {
        assert_eq!(got, want, "query {i} (rows a={} b={} c={} d={} orphan={})", a.id, b.id, c.id, d.id, orphan.id);
    }
    assert_eq!(answers.len(), expected.len(), "one answer per query");
    let rows = h.store().query(vec![inbox().ids([a.id])]).await.expect("query");
    assert_eq!(rows, vec![vec![get(&h, a.id).await]], "a query returns whole rows as stored");

    let written = h.store().update_unleased(a.id, RowUpdate::status("done")).await.expect("update_unleased");
    assert_eq!(written, WriteOutcome::Written);
    let undone = h.store().query(vec![inbox().parent(first.id).statuses(["new"])]).await.expect("query");
    assert_eq!(ids(&undone[0]), vec![d.id], "row {} left the status it was written out of", a.id);
    let done = h.store().query(vec![inbox().parent(first.id).statuses(["done"])]).await.expect("query");
    assert_eq!(ids(&done[0]), vec![a.id, b.id], "row {} joined the status it was written into", a.id);
}

/// `query_map` hands `read` the rows `query` returns, in the same order, and refuses what `query` refuses;
/// `list_map` the rows `list` returns.
pub async fn query_map_and_list_map_read_the_rows_query_and_list_return<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    for (i, status) in ["new", "done", "new"].into_iter().enumerate() {
        insert_new(&h, NewRow::new("inbox", status, json!({ "i": i })).with_parent(parent.id)).await;
    }
    let queries = || {
        vec![
            RowQuery::new("inbox").parent(parent.id).statuses(["new"]),
            RowQuery::new("inbox"),
            RowQuery::new("operation").ids([parent.id]),
            RowQuery::new("job"),
        ]
    };
    let rows = h.store().query(queries()).await.expect("query");
    let read = |row: &Row| (row.id, row.status.clone(), row.data.clone());
    let mapped = h.store().query_map(queries(), read).await.expect("query_map");
    let expected: Vec<Vec<_>> = rows.iter().map(|answer| answer.iter().map(read).collect()).collect();
    assert_eq!(mapped, expected, "query_map read other rows than query returned");
    assert_eq!(mapped.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 3, 1, 0], "rows per query");
    for parent in [Some(parent.id), None] {
        let listed = h.store().list("inbox", parent).await.expect("list");
        let mapped = h.store().list_map("inbox", parent, read).await.expect("list_map");
        assert_eq!(mapped, listed.iter().map(read).collect::<Vec<_>>(), "list_map of parent {parent:?}");
    }
    let bad = h.store().query_map(vec![RowQuery::new("in\0box")], |row| row.id).await;
    assert!(matches!(&bad, Err(StoreError::Invalid(m)) if m.contains("query 0") && m.contains("kind")), "{bad:?}");
}

/// A row's `(version, updated_at)` is the same in every read while nothing writes its status or data (get, list,
/// query, query_map), and differs after each write of either: an apply of the row and of it as a related row, a
/// write API's update, a failure that gives up (a reader keeps what it decoded at a version).
pub async fn a_rows_version_changes_at_every_write_of_its_status_or_data<H: Harness>(h: H) {
    let stamp = |row: &Row| (row.version, row.updated_at);
    let (parent, children) = family(&h, 1).await;
    let child = &children[0];
    let read = get(&h, child.id).await;
    assert_eq!(stamp(&read), stamp(child), "get of row {} after its insert", child.id);
    let listed = h.store().list("job", Some(parent.id)).await.expect("list");
    let queried = h.store().query(vec![RowQuery::new("job").ids([child.id])]).await.expect("query");
    let mapped = h.store().query_map(vec![RowQuery::new("job").ids([child.id])], stamp).await.expect("query_map");
    assert_eq!(listed.iter().map(stamp).collect::<Vec<_>>(), vec![stamp(child)], "list of row {}", child.id);
    assert_eq!(queried[0].iter().map(stamp).collect::<Vec<_>>(), vec![stamp(child)], "query of row {}", child.id);
    assert_eq!(mapped, vec![vec![stamp(child)]], "query_map of row {}", child.id);
    // Every (row, version, updated_at) read so far: one transaction's writes may share theirs across rows.
    let mut seen = vec![(parent.id, stamp(&parent)), (child.id, stamp(child))];
    let mut written = |row: &Row, what: &str| {
        let read = (row.id, stamp(row));
        assert!(!seen.contains(&read), "row {} after {what}: version and updated_at seen before", row.id);
        seen.push(read);
    };

    // An apply writes its main row and its related row.
    let lease = lease_with_children(&h, &parent, &children).await;
    let related = vec![RelatedUpdate { id: child.id, update: RowUpdate { status: None, data: Some(json!({"n": 1})) } }];
    let params = ApplyParams { related, ..ApplyParams::new(lease, RowUpdate::status("running")) };
    applied_now(&apply(&h, params).await, lease);
    written(&get(&h, parent.id).await, "an apply");
    let child_now = get(&h, child.id).await;
    written(&child_now, "an apply's related update");
    assert_eq!(stamp(&get(&h, child.id).await), stamp(&child_now), "two reads of row {} with no write", child.id);

    // A write API's update, of the status only.
    let outcome = h.store().update_unleased(child.id, RowUpdate::status("paused")).await.expect("update_unleased");
    assert_eq!(outcome, WriteOutcome::Written, "update_unleased of row {}", child.id);
    written(&get(&h, child.id).await, "update_unleased");

    // A failure that gives up takes the row's terminal status.
    let row = insert(&h, "report").await;
    written(&row, "an insert");
    let lease = lease_single(&h, "reports", &row).await;
    let failure = FailureParams { lease, error: "boom".into(), retry: Retry::GiveUp { status: "failed".into() } };
    h.store().record_failure(failure).await.expect("record_failure");
    written(&get(&h, row.id).await, "a failure that gave up");
}

/// `query` refuses a kind or a status PostgreSQL text cannot hold, naming the query and the field.
pub async fn query_refuses_a_nul_in_a_kind_or_a_status<H: Harness>(h: H) {
    let bad_kind = h.store().query(vec![RowQuery::new("in\0box")]).await;
    assert!(
        matches!(&bad_kind, Err(StoreError::Invalid(m)) if m.contains("query 0") && m.contains("kind")),
        "{bad_kind:?}"
    );
    let bad_status = h.store().query(vec![RowQuery::new("inbox"), RowQuery::new("inbox").statuses(["n\0"])]).await;
    assert!(
        matches!(&bad_status, Err(StoreError::Invalid(m)) if m.contains("query 1") && m.contains("statuses")),
        "{bad_status:?}"
    );
}

/// The store's clock moves forward by at least what the harness advances, and never back.
pub async fn now_moves_forward_by_at_least_the_advanced_span<H: Harness>(h: H) {
    let start = now(&h).await;
    h.advance(Duration::from_secs(3600));
    let later = now(&h).await;
    assert!(later >= start.plus(Duration::from_secs(3600)), "now {later} after advancing an hour from {start}");
    let again = now(&h).await;
    assert!(again >= later, "now went back from {later} to {again}");
}

/// `insert_many` stores every row as `insert` would, with increasing ids in input order, and once it commits
/// publishes its hints: the rows they name are marked hinted and each kind is heard once.
pub async fn insert_many_stores_every_row_in_order_and_publishes_its_hints<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let new = vec![
        NewRow::new("inbox", "new", json!({"report": 1})).with_parent(parent.id),
        NewRow::new("inbox", "new", json!({"report": 2})).with_parent(parent.id),
        NewRow::new("inbox", "new", json!({"report": 3})),
    ];
    let mut rx = h.store().subscribe_hints();
    let hints = vec![NewHint::row("operation", parent.id), "operation".into(), NewHint::row("operation", parent.id)];
    let ids = h.store().insert_many(new.clone(), hints).await.expect("insert_many");
    assert_eq!(ids.len(), new.len(), "one id per row");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not increasing in input order: {ids:?}");
    for (id, new) in ids.iter().zip(&new) {
        let row = get(&h, *id).await;
        assert_eq!((&row.kind, &row.status, &row.data), (&new.kind, &new.status, &new.data), "row {id}");
        assert_eq!(row.parent_id, new.parent_id, "parent of row {id}");
        assert_unlocked(&row);
    }
    h.store().hint("marker", None).await.expect("hint");
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "operation", "the kind of insert_many's hints");
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "marker", "a kind published twice by one insert_many");
    assert!(get(&h, parent.id).await.hinted, "row {} named by a hint is not hinted", parent.id);
}

/// An enqueue as one atomic batch, the model of an enqueue in the caller's transaction on every store
/// (docs/real-mode.md, "Enqueue in your own transaction"; `PgStore::insert_in` stores and publishes the same at the
/// caller's commit): the caller's own row and its work items in one `insert_many` with [`NewHint::kinds_of`] the
/// rows. Every row is stored, none marked hinted, each kind hinted once after the commit in the order it first
/// appears, and every work item is fetched at once; a batch with a bad row stores none and hints nothing.
pub async fn an_enqueue_batch_stores_the_callers_row_and_its_work_items_together_and_hints_each_kind<H: Harness>(h: H) {
    let mut rx = h.store().subscribe_hints();
    let bad = vec![NewRow::new("order", "placed", json!({})), NewRow::new("email", READY, json!({"to": "a\u{0}"}))];
    let hints = NewHint::kinds_of(&bad);
    assert!(h.store().insert_many(bad, hints).await.is_err(), "an enqueue batch with a NUL in a work item");
    let new = vec![
        NewRow::new("order", "placed", json!({"order": 7})),
        NewRow::new("email", READY, json!({"order": 7, "to": "buyer"})),
        NewRow::new("email", READY, json!({"order": 7, "to": "seller"})),
        NewRow::new("invoice", READY, json!({"order": 7})),
    ];
    let hints = NewHint::kinds_of(&new);
    assert_eq!(hints, vec!["order".into(), "email".into(), "invoice".into()], "the kinds of the rows, each once");
    let ids = h.store().insert_many(new.clone(), hints).await.expect("insert_many of an enqueue");
    for (id, new) in ids.iter().zip(&new) {
        let row = get(&h, *id).await;
        assert_eq!((&row.kind, &row.status, &row.data), (&new.kind, &new.status, &new.data), "row {id}");
        assert!(!row.hinted, "row {id} of an enqueue is marked hinted");
        assert_unlocked(&row);
    }
    h.store().hint("marker", None).await.expect("hint");
    for kind in ["order", "email", "invoice", "marker"] {
        assert_eq!(next_hint(&mut rx, "the subscriber").await, kind, "hints after an enqueue (the bad one sent none)");
    }
    assert_eq!(h.store().list("order", None).await.expect("list").len(), 1, "the refused batch stored its order");
    let emails: Vec<RowId> = fetch(&h, "emails", "email").await.iter().map(|row| row.id).collect();
    assert_eq!(emails, ids[1..3].to_vec(), "the enqueued emails are fetched at once");
}

/// `insert_many` refuses a row `insert` would refuse, naming it, and then stores none of the rows.
pub async fn insert_many_with_a_bad_row_stores_none<H: Harness>(h: H) {
    let rows = vec![NewRow::new("inbox", "new", json!({})), NewRow::new("inbox", "new", json!({"bad": "a\u{0}b"}))];
    match h.store().insert_many(rows, Vec::new()).await {
        Err(StoreError::Invalid(message)) => assert!(message.contains("rows[1]"), "names the bad row: {message}"),
        other => panic!("insert_many of a row with a NUL: {other:?}"),
    }
    assert_eq!(h.store().list("inbox", None).await.expect("list"), vec![], "a refused insert_many stored rows");
}
