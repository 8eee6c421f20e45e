//! Batched apply: several guarded applies in one transaction ([`Store::apply_batch`]; DESIGN §3, Batching). Each
//! item keeps its own guard, a stale item is reported alone, and the outcomes are those of applying the items one
//! after another.

use super::*;
use crate::store::{NewEvent, RelatedUpdate, RowUpdate};
use serde_json::json;

async fn apply_batch<H: Harness>(h: &H, batch: Vec<ApplyParams>) -> Vec<ApplyOutcome> {
    let what: Vec<String> = batch.iter().map(|p| format!("{}#{}", p.lease.id, p.lease.token)).collect();
    h.store().apply_batch(batch).await.unwrap_or_else(|e| panic!("apply_batch [{}]: {e}", what.join(", ")))
}

/// Every held item is written and unlocked, all at the batch's one `now`, which each outcome returns.
pub async fn apply_batch_applies_every_held_item_at_one_now<H: Harness>(h: H) {
    let rows = [insert(&h, "job").await, insert(&h, "job").await, insert(&h, "job").await];
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(sorted(ids(&leased)), ids(&rows), "jobs was to lease every row");
    h.advance(Duration::from_secs(1));
    let batch = leased
        .iter()
        .map(|row| ApplyParams::new(lease_of(row), RowUpdate::status(format!("done-{}", row.id))))
        .collect();
    let before = now(&h).await;
    let outcomes = apply_batch(&h, batch).await;
    let after = now(&h).await;
    assert_eq!(outcomes.len(), leased.len(), "one outcome per item: {outcomes:?}");
    let at = applied_now(&outcomes[0], lease_of(&leased[0]));
    assert_within(at, before, after, "the batch's now");
    for (row, outcome) in leased.iter().zip(&outcomes) {
        assert_eq!(*outcome, ApplyOutcome::Applied { inserted: vec![], now: at }, "outcome of row {}", row.id);
        let stored = get(&h, row.id).await;
        assert_eq!(stored.status, format!("done-{}", row.id), "status of row {}", row.id);
        assert_unlocked(&stored);
        assert_eq!(stored.last_processed_at, Some(at), "last_processed_at of row {}", row.id);
        assert_eq!(stored.updated_at, at, "updated_at of row {}", row.id);
    }
}

/// An item whose token a later fetch superseded is stale and writes nothing; the items around it apply.
pub async fn apply_batch_reports_a_stale_item_alone_and_applies_the_others<H: Harness>(h: H) {
    let taken = insert(&h, "node").await;
    let old = lease_single(&h, "nodes", &taken).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "other", &taken).await;
    let held_by_other = get(&h, taken.id).await;
    let (a, b) = (insert(&h, "job").await, insert(&h, "job").await);
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(sorted(ids(&leased)), vec![a.id, b.id], "jobs was to lease both job rows");
    let lease = |id: RowId| lease_of(leased.iter().find(|row| row.id == id).expect("leased"));
    let batch = vec![
        ApplyParams::new(lease(a.id), RowUpdate::status("done")),
        ApplyParams::new(old, RowUpdate::status("done")),
        ApplyParams::new(lease(b.id), RowUpdate::status("done")),
    ];
    let outcomes = apply_batch(&h, batch).await;
    assert!(matches!(outcomes[0], ApplyOutcome::Applied { .. }), "row {}: {outcomes:?}", a.id);
    assert_eq!(outcomes[1], ApplyOutcome::Stale, "superseded {}#{}: {outcomes:?}", old.id, old.token);
    assert!(matches!(outcomes[2], ApplyOutcome::Applied { .. }), "row {}: {outcomes:?}", b.id);
    assert_eq!(get(&h, taken.id).await, held_by_other, "a stale item wrote row {}", taken.id);
    for id in [a.id, b.id] {
        assert_eq!(get(&h, id).await.status, "done", "status of row {id}");
    }
    applied_now(&apply(&h, ApplyParams::new(new, RowUpdate::status("done"))).await, new);
}

/// An item whose related row lost the token is stale whole (no main, related, insert or event write), while
/// another item of the batch applies.
pub async fn apply_batch_item_with_a_lost_related_row_is_stale_alone<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    lease_single(&h, CHILD_PIPELINE, &children[0]).await;
    let parent_before = get(&h, parent.id).await;
    let child_before = get(&h, children[0].id).await;
    let task = insert(&h, "task").await;
    let task_lease = lease_single(&h, "tasks", &task).await;
    let mut stale = ApplyParams::new(lease, RowUpdate::status("running"));
    stale.related = vec![RelatedUpdate { id: children[0].id, update: RowUpdate::status("started") }];
    stale.inserts = vec![NewRow::new("allocation", "new", json!({})).with_parent(parent.id)];
    stale.events = vec![NewEvent { row_id: parent.id, kind: "started".into(), data: json!({}) }];
    let outcomes = apply_batch(&h, vec![stale, ApplyParams::new(task_lease, RowUpdate::status("done"))]).await;
    assert_eq!(
        outcomes[0],
        ApplyOutcome::Stale,
        "parent {} lost its child {}: {outcomes:?}",
        parent.id,
        children[0].id
    );
    applied_now(&outcomes[1], task_lease);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale item wrote main row {}", parent.id);
    assert_eq!(get(&h, children[0].id).await, child_before, "a stale item wrote related row {}", children[0].id);
    let allocations = h.store().list("allocation", None).await.expect("list");
    assert_eq!(ids(&allocations), vec![], "a stale item inserted rows");
    assert_eq!(h.store().events(parent.id).await.expect("events"), vec![], "a stale item wrote events");
    assert_eq!(get(&h, task.id).await.status, "done", "status of row {}", task.id);
}

/// An item whose related lock it relies on without updating the row (`ApplyParams::locked`) was lost is stale
/// alone, even in a batch of main-row updates only; the other items apply.
pub async fn apply_batch_item_with_a_lost_locked_row_is_stale_alone<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    let child_lease = lease_single(&h, CHILD_PIPELINE, &children[0]).await;
    applied_now(&apply(&h, ApplyParams::new(child_lease, RowUpdate::status("done"))).await, child_lease);
    let parent_before = get(&h, parent.id).await;
    let task = insert(&h, "task").await;
    let task_lease = lease_single(&h, "tasks", &task).await;
    let mut stale = ApplyParams::new(lease, RowUpdate::status("all-children-ready"));
    stale.locked = ids(&children);
    let outcomes = apply_batch(&h, vec![stale, ApplyParams::new(task_lease, RowUpdate::status("done"))]).await;
    assert_eq!(outcomes[0], ApplyOutcome::Stale, "parent {} lost child {}: {outcomes:?}", parent.id, children[0].id);
    applied_now(&outcomes[1], task_lease);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale item wrote main row {}", parent.id);
    assert_eq!(get(&h, children[0].id).await.status, "done", "status of row {}", children[0].id);
    assert_eq!(get(&h, task.id).await.status, "done", "status of row {}", task.id);
}

/// Each held item writes its own related updates, inserts and events at the batch's `now`, unlocks its related
/// rows, and gets back the ids of its own inserts: item by item, in order.
pub async fn apply_batch_writes_each_items_related_updates_inserts_and_events<H: Harness>(h: H) {
    let (first, first_children) = family(&h, 2).await;
    let first_lease = lease_with_children(&h, &first, &first_children).await;
    let (second, second_children) = family(&h, 1).await;
    let second_lease = lease_with_children(&h, &second, &second_children).await;
    h.advance(Duration::from_secs(1));
    let event = |row_id: RowId, n: i64| NewEvent { row_id, kind: "e".into(), data: json!({ "n": n }) };
    let mut one = ApplyParams::new(first_lease, RowUpdate::status("running"));
    one.related = vec![RelatedUpdate { id: first_children[0].id, update: RowUpdate::status("started") }];
    one.inserts = vec![NewRow::new("allocation", "new", json!({ "n": 1 })).with_parent(first.id)];
    one.events = vec![event(first.id, 1)];
    let mut two = ApplyParams::new(second_lease, RowUpdate::status("running"));
    two.inserts = vec![
        NewRow::new("allocation", "new", json!({ "n": 2 })).with_parent(second.id),
        NewRow::new("allocation", "new", json!({ "n": 3 })).with_parent(second.id),
    ];
    two.events = vec![event(second.id, 2), event(first_children[1].id, 3)];
    let outcomes = apply_batch(&h, vec![one, two]).await;
    let at = applied_now(&outcomes[0], first_lease);
    assert_eq!(applied_now(&outcomes[1], second_lease), at, "both items at the batch's one now");
    let inserted: Vec<Vec<RowId>> = outcomes
        .iter()
        .map(|o| match o {
            ApplyOutcome::Applied { inserted, .. } => inserted.clone(),
            ApplyOutcome::Stale => unreachable!("checked by applied_now"),
        })
        .collect();
    assert_eq!((inserted[0].len(), inserted[1].len()), (1, 2), "inserted ids per item: {inserted:?}");
    let all: Vec<RowId> = inserted.concat();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "ids not in item order: {inserted:?}");
    for (id, n) in all.iter().zip(1..) {
        let row = get(&h, *id).await;
        assert_eq!(row.data, json!({ "n": n }), "data of inserted row {id}");
        assert_eq!((row.created_at, row.updated_at), (at, at), "times of inserted row {id}");
    }
    assert_eq!(get(&h, inserted[0][0]).await.parent_id, Some(first.id), "parent of row {}", inserted[0][0]);
    assert_eq!(get(&h, first_children[0].id).await.status, "started", "status of row {}", first_children[0].id);
    for child in first_children.iter().chain(&second_children) {
        let stored = get(&h, child.id).await;
        assert_unlocked(&stored);
    }
    assert_eq!(get(&h, first_children[1].id).await.status, READY, "row {} had no update", first_children[1].id);
    for (row_id, n) in [(first.id, 1), (second.id, 2), (first_children[1].id, 3)] {
        let events = h.store().events(row_id).await.expect("events");
        let summary: Vec<_> = events.iter().map(|e| (e.data.clone(), e.at)).collect();
        assert_eq!(summary, vec![(json!({ "n": n }), at)], "events of row {row_id}");
    }
}

/// A lease given twice in one batch applies once: the first copy writes, the second is stale, as two applies
/// one after another would be.
pub async fn apply_batch_with_a_lease_twice_applies_only_the_first_copy<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let mut second = ApplyParams::new(lease, RowUpdate::status("second"));
    second.inserts = vec![NewRow::new("allocation", "new", json!({}))];
    let outcomes = apply_batch(&h, vec![ApplyParams::new(lease, RowUpdate::status("first")), second]).await;
    applied_now(&outcomes[0], lease);
    assert_eq!(outcomes[1], ApplyOutcome::Stale, "the second copy of {}#{}", lease.id, lease.token);
    assert_eq!(get(&h, row.id).await.status, "first", "status of row {}", row.id);
    let allocations = h.store().list("allocation", None).await.expect("list");
    assert_eq!(ids(&allocations), vec![], "the stale copy inserted rows");
}

/// A batch of stale items writes nothing at all, and an empty batch returns no outcome.
pub async fn apply_batch_of_stale_items_writes_nothing<H: Harness>(h: H) {
    assert_eq!(apply_batch(&h, Vec::new()).await, vec![], "an empty batch");
    let (a, b) = (insert(&h, "job").await, insert(&h, "job").await);
    let leased = fetch(&h, "jobs", "job").await;
    let leases: Vec<Lease> = leased.iter().map(lease_of).collect();
    for lease in &leases {
        applied_now(&apply(&h, ApplyParams::new(*lease, RowUpdate::status("done"))).await, *lease);
    }
    let before = [get(&h, a.id).await, get(&h, b.id).await];
    h.advance(Duration::from_secs(1));
    let batch = leases
        .iter()
        .map(|lease| {
            let mut params = ApplyParams::new(*lease, RowUpdate::status("again"));
            params.inserts = vec![NewRow::new("allocation", "new", json!({}))];
            params.events = vec![NewEvent { row_id: lease.id, kind: "again".into(), data: json!({}) }];
            params
        })
        .collect();
    assert_eq!(apply_batch(&h, batch).await, vec![ApplyOutcome::Stale, ApplyOutcome::Stale], "spent leases");
    assert_eq!([get(&h, a.id).await, get(&h, b.id).await], before, "stale items wrote their rows");
    let allocations = h.store().list("allocation", None).await.expect("list");
    assert_eq!(ids(&allocations), vec![], "stale items inserted rows");
    for lease in &leases {
        assert_eq!(h.store().events(lease.id).await.expect("events"), vec![], "stale items wrote events");
    }
}

/// A batch of main-row updates only (the one-statement shape in PostgreSQL) unlocks the related rows its items
/// locked with their tokens, and leaves alone the related rows of a lease that is not in the batch.
pub async fn apply_batch_of_main_updates_unlocks_only_its_items_related_rows<H: Harness>(h: H) {
    // Each family is leased before the next is inserted: a lease takes every ready row of its kind.
    let (with_children, children) = family(&h, 2).await;
    let with_children_lease = lease_with_children(&h, &with_children, &children).await;
    let (plain, _) = family(&h, 0).await;
    let plain_lease = lease_single(&h, PARENT_PIPELINE, &plain).await;
    let (other, other_children) = family(&h, 1).await;
    let other_lease = lease_with_children(&h, &other, &other_children).await;
    let batch = vec![
        ApplyParams::new(with_children_lease, RowUpdate::status("done")),
        ApplyParams::new(plain_lease, RowUpdate::status("done")),
    ];
    let outcomes = apply_batch(&h, batch).await;
    applied_now(&outcomes[0], with_children_lease);
    applied_now(&outcomes[1], plain_lease);
    for id in [with_children.id, plain.id].into_iter().chain(ids(&children)) {
        assert_unlocked(&get(&h, id).await);
    }
    for id in [other.id].into_iter().chain(ids(&other_children)) {
        let row = get(&h, id).await;
        assert_eq!(row.lock_token, Some(other_lease.token), "row {id} lost the token of a lease not in the batch");
    }
}
