//! A row's parent must exist when the row is inserted (DESIGN §2, "Parents"): every call that inserts rows refuses
//! one whose `parent_id` names no row, before it writes anything, with `Invalid` naming the call, the row and the
//! field. PostgreSQL's foreign key on `parent_id` makes the same refusal; with it, a purge racing a child insert
//! never leaves a child whose parent is gone (`purge::a_purge_racing_child_inserts_never_leaves_an_orphan`).

use super::*;
use crate::store::{InsertKeyedParams, PurgeParams, RowUpdate, StoreError};

/// Asserts that `result` is `Invalid` naming `what` (the call and the row), the field `parent_id` and `parent`.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str, parent: RowId) {
    match result {
        Err(StoreError::Invalid(message)) => {
            let named = format!("{what}: parent_id {parent} names no row");
            assert!(message.contains(&named), "{message:?} does not say {named:?}");
        }
        other => panic!("{what} under the missing parent {parent} returned {other:?}"),
    }
}

/// A finished `operation` purged at once (an age of zero): an id that named a row and names none any more.
async fn purged_parent<H: Harness>(h: &H) -> RowId {
    let parent = insert_new(h, NewRow::new("operation", "done", json!({}))).await;
    let params = PurgeParams {
        kind: "operation".into(),
        statuses: vec!["done".into()],
        older_than: Duration::ZERO,
        limit: 1,
        parent_statuses: Vec::new(),
    };
    assert_eq!(h.store().purge(params).await.expect("purge"), 1, "operation {} was to be purged", parent.id);
    parent.id
}

/// A `job` child of `parent` in [`READY`].
fn child(parent: RowId) -> NewRow {
    NewRow::new("job", READY, json!({})).with_parent(parent)
}

/// `insert`, `insert_id`, `insert_many` and `insert_keyed` refuse a row under a parent that was purged or never
/// existed, and store nothing (an `insert_many` none of its rows, an `insert_keyed` not its key: a retry under a
/// parent that exists inserts); a row under an existing parent goes in.
pub async fn an_insert_under_a_missing_parent_is_refused_and_stores_nothing<H: Harness>(h: H) {
    let gone = purged_parent(&h).await;
    let parent = insert(&h, "operation").await;
    let never = RowId(parent.id.0 + 1_000_000);
    let store = h.store();
    for missing in [gone, never] {
        assert_refused(store.insert(child(missing)).await, "insert", missing);
        assert_refused(store.insert_id(child(missing)).await, "insert", missing);
        let rows = vec![child(parent.id), child(missing)];
        assert_refused(store.insert_many(rows, vec!["job".into()]).await, "insert_many: rows[1]", missing);
        let keyed = InsertKeyedParams { key: format!("submit-{missing}"), row: child(missing) };
        assert_refused(store.insert_keyed(keyed).await, "insert_keyed", missing);
    }
    assert_eq!(store.list("job", None).await.expect("list"), vec![], "a refused insert stored a row");
    let keyed = InsertKeyedParams { key: format!("submit-{gone}"), row: child(parent.id) };
    assert!(store.insert_keyed(keyed).await.expect("insert_keyed").inserted, "a refused keyed insert took its key");
    let id = store.insert_id(child(parent.id)).await.expect("insert under an existing parent");
    assert_eq!(get(&h, id).await.parent_id, Some(parent.id));
}

/// An apply that inserts a row under a missing parent is refused whole: the update, the other inserts and the
/// events are not written, and the lease stays held, so its holder can record the failure.
pub async fn an_apply_inserting_under_a_missing_parent_is_refused_and_keeps_the_lease<H: Harness>(h: H) {
    let gone = purged_parent(&h).await;
    let row = insert(&h, "operation").await;
    let lease = lease_single(&h, PARENT_PIPELINE, &row).await;
    let mut params = ApplyParams::new(lease, RowUpdate::status("running"));
    params.inserts = vec![child(row.id), child(gone)];
    let what = format!("apply {}#{}: inserts[1]", lease.id, lease.token);
    assert_refused(h.store().apply(params).await, &what, gone);
    let held = refetch(&h, lease).await.unwrap_or_else(|| panic!("a refused apply dropped lease {}", lease.token));
    assert_eq!(held.status, READY, "a refused apply wrote row {}", row.id);
    assert_eq!(h.store().list("job", None).await.expect("list"), vec![], "a refused apply inserted a row");
}

/// A batch with one item inserting under a missing parent fails whole (PostgreSQL aborts its transaction), so the
/// engine's batcher sends its items again one by one and only that item fails; the other items keep their leases.
pub async fn an_apply_batch_with_one_item_under_a_missing_parent_writes_nothing<H: Harness>(h: H) {
    let gone = purged_parent(&h).await;
    for _ in 0..3 {
        insert(&h, "operation").await;
    }
    let leases: Vec<Lease> = fetch(&h, PARENT_PIPELINE, "operation").await.iter().map(lease_of).collect();
    assert_eq!(leases.len(), 3, "operations was to lease the three live operations");
    let mut batch: Vec<ApplyParams> = leases
        .iter()
        .map(|lease| ApplyParams {
            inserts: vec![child(lease.id)],
            ..ApplyParams::new(*lease, RowUpdate::status("done"))
        })
        .collect();
    batch[1].inserts.push(child(gone));
    let what = format!("apply {}#{}: inserts[1]", leases[1].id, leases[1].token);
    assert_refused(h.store().apply_batch(batch).await, &what, gone);
    for lease in &leases {
        let row = refetch(&h, *lease).await.unwrap_or_else(|| panic!("lease {} lost by a refused batch", lease.token));
        assert_eq!(row.status, READY, "a refused batch wrote row {}", row.id);
    }
    assert_eq!(h.store().list("job", None).await.expect("list"), vec![], "a refused batch inserted a row");
    let alone =
        ApplyParams { inserts: vec![child(leases[0].id)], ..ApplyParams::new(leases[0], RowUpdate::status("done")) };
    assert!(matches!(apply(&h, alone).await, ApplyOutcome::Applied { .. }), "the good item, sent alone");
}

/// A stale apply writes nothing, so its inserts are not judged: one under a missing parent is `Stale`, not
/// refused, alone or in a batch beside an item that applies.
pub async fn a_stale_apply_under_a_missing_parent_is_stale_not_refused<H: Harness>(h: H) {
    let gone = purged_parent(&h).await;
    let row = insert(&h, "operation").await;
    let old = lease_single(&h, PARENT_PIPELINE, &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, PARENT_PIPELINE, &row).await;
    let stale = || ApplyParams { inserts: vec![child(gone)], ..ApplyParams::new(old, RowUpdate::status("done")) };
    assert_eq!(apply(&h, stale()).await, ApplyOutcome::Stale, "a superseded apply under a missing parent");
    let fresh = ApplyParams { inserts: vec![child(row.id)], ..ApplyParams::new(new, RowUpdate::status("done")) };
    let outcomes = h.store().apply_batch(vec![stale(), fresh]).await.expect("a batch whose bad item is stale");
    assert_eq!(outcomes[0], ApplyOutcome::Stale, "{outcomes:?}");
    assert!(matches!(outcomes[1], ApplyOutcome::Applied { .. }), "{outcomes:?}");
    let jobs = h.store().list("job", None).await.expect("list");
    assert_eq!(jobs.iter().map(|job| job.parent_id).collect::<Vec<_>>(), vec![Some(row.id)], "only the fresh insert");
}
