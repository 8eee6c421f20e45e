//! Apply: the guarded write that ends a lease ([`Store::apply`]; dstack PIPELINES, checklist 5 and 6, "Guarded
//! apply by lock token", "Bulk apply with one consistent current time").

use super::*;
use crate::store::{NewEvent, RelatedUpdate, RowUpdate};
use serde_json::json;

/// A held lease's apply writes the update, clears every lease column and sets `last_processed_at` and
/// `updated_at` to the apply's `now`, which it returns.
pub async fn apply_writes_the_update_and_unlocks_the_row<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    h.advance(Duration::from_secs(1));
    let update = RowUpdate { status: Some("done".into()), data: Some(json!({"exit_code": 0})) };
    let before = now(&h).await;
    let outcome = apply(&h, ApplyParams::new(lease, update)).await;
    let after = now(&h).await;
    let at = applied_now(&outcome, lease);
    assert_within(at, before, after, "the apply's now");
    let nothing_inserted = ApplyOutcome::Applied { inserted: vec![], now: at };
    assert_eq!(outcome, nothing_inserted);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, "done", "status of row {}", row.id);
    assert_eq!(stored.data, json!({"exit_code": 0}), "data of row {}", row.id);
    assert_unlocked(&stored);
    assert_eq!(stored.last_processed_at, Some(at), "last_processed_at of row {}", row.id);
    assert_eq!(stored.updated_at, at, "updated_at of row {}", row.id);
    assert_eq!(stored.created_at, row.created_at, "created_at of row {}", row.id);
    assert_eq!(refetch(&h, lease).await, None, "token {} survived its apply", lease.token);
}

/// Columns an update leaves `None` keep their values.
pub async fn apply_with_an_empty_update_keeps_status_and_data<H: Harness>(h: H) {
    let row = insert_new(&h, NewRow::new("job", READY, json!({"attempt": 3}))).await;
    let lease = lease_single(&h, "jobs", &row).await;
    h.advance(Duration::from_secs(1));
    let at = applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::default())).await, lease);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, READY, "status of row {}", row.id);
    assert_eq!(stored.data, json!({"attempt": 3}), "data of row {}", row.id);
    assert_eq!(stored.last_processed_at, Some(at), "last_processed_at of row {}", row.id);
}

/// An apply ends its lease: a second apply with the same token is stale and writes nothing.
pub async fn a_second_apply_with_the_same_token_is_stale<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::status("done"))).await, lease);
    let done = get(&h, row.id).await;
    h.advance(Duration::from_secs(1));
    let again = apply(&h, ApplyParams::new(lease, RowUpdate::status("again"))).await;
    assert_eq!(again, ApplyOutcome::Stale, "second apply of {}#{}", lease.id, lease.token);
    assert_eq!(get(&h, row.id).await, done, "a stale apply wrote row {}", row.id);
}

/// The main row's `last_processed_at` and `updated_at`, the related rows' `updated_at`, the inserted rows'
/// `created_at` and `updated_at`, and the events' `at` are all the apply's one `now`.
pub async fn apply_stamps_every_row_it_writes_with_one_now<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(Duration::from_secs(1));
    let params = ApplyParams {
        lease,
        update: RowUpdate::status("running"),
        related: children
            .iter()
            .map(|child| RelatedUpdate { id: child.id, update: RowUpdate::status("started") })
            .collect(),
        inserts: vec![NewRow::new("allocation", "new", json!({})).with_parent(parent.id)],
        events: vec![
            NewEvent { row_id: parent.id, kind: "started".into(), data: json!({}) },
            NewEvent { row_id: children[0].id, kind: "started".into(), data: json!({}) },
        ],
        locked: Vec::new(),
        hints: Vec::new(),
    };
    let before = now(&h).await;
    let outcome = apply(&h, params).await;
    let after = now(&h).await;
    let at = applied_now(&outcome, lease);
    assert_within(at, before, after, "the apply's now");
    let main = get(&h, parent.id).await;
    assert_eq!(main.last_processed_at, Some(at), "last_processed_at of main row {}", parent.id);
    assert_eq!(main.updated_at, at, "updated_at of main row {}", parent.id);
    for child in &children {
        let stored = get(&h, child.id).await;
        assert_eq!(stored.status, "started", "status of related row {}", child.id);
        assert_eq!(stored.updated_at, at, "updated_at of related row {}", child.id);
        assert_unlocked(&stored);
    }
    let ApplyOutcome::Applied { inserted, .. } = outcome else { unreachable!("checked by applied_now") };
    assert_eq!(inserted.len(), 1, "one insert");
    let allocation = get(&h, inserted[0]).await;
    assert_eq!(allocation.created_at, at, "created_at of inserted row {}", allocation.id);
    assert_eq!(allocation.updated_at, at, "updated_at of inserted row {}", allocation.id);
    for row_id in [parent.id, children[0].id] {
        let events = h.store().events(row_id).await.expect("events");
        assert_eq!(events.len(), 1, "events of row {row_id}");
        assert_eq!(events[0].at, at, "at of the event about row {row_id}");
    }
}

/// An apply unlocks every related row locked with its token, also those it has no update for, and leaves their
/// columns alone.
pub async fn apply_unlocks_every_related_row_locked_with_the_token<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    let mut params = ApplyParams::new(lease, RowUpdate::default());
    params.related = vec![RelatedUpdate { id: children[0].id, update: RowUpdate::status("started") }];
    applied_now(&apply(&h, params).await, lease);
    let untouched = get(&h, children[1].id).await;
    assert_unlocked(&untouched);
    assert_eq!(untouched.status, READY, "status of related row {}", untouched.id);
    assert_eq!(untouched.data, children[1].data, "data of related row {}", untouched.id);
    assert_unlocked(&get(&h, children[0].id).await);
    let leased = fetch(&h, CHILD_PIPELINE, "job").await;
    assert_eq!(ids(&leased), vec![untouched.id], "the child pipeline takes the unlocked row at once");
}

/// Inserts are created unleased and unprocessed, and their ids come back in the order given.
pub async fn apply_inserts_rows_and_returns_their_ids_in_order<H: Harness>(h: H) {
    let row = insert(&h, "operation").await;
    let lease = lease_single(&h, "operations", &row).await;
    let news = vec![
        NewRow::new("task", "new", json!({"n": 1})).with_parent(row.id),
        NewRow::new("task", "new", json!({"n": 2})).with_parent(row.id),
        NewRow::new("note", "draft", json!({"n": 3})),
    ];
    let mut params = ApplyParams::new(lease, RowUpdate::default());
    params.inserts = news.clone();
    let outcome = apply(&h, params).await;
    let ApplyOutcome::Applied { inserted, .. } = outcome else {
        panic!("apply {}#{} was stale", lease.id, lease.token)
    };
    assert_eq!(inserted.len(), news.len(), "ids returned: {inserted:?}");
    assert!(inserted.windows(2).all(|w| w[0] < w[1]), "ids not in order: {inserted:?}");
    assert!(inserted[0] > row.id, "id {} not after {}", inserted[0], row.id);
    for (id, new) in inserted.iter().zip(&news) {
        let stored = get(&h, *id).await;
        assert_eq!(stored.kind, new.kind, "kind of row {id}");
        assert_eq!(stored.parent_id, new.parent_id, "parent of row {id}");
        assert_eq!(stored.status, new.status, "status of row {id}");
        assert_eq!(stored.data, new.data, "data of row {id}");
        assert_unlocked(&stored);
        assert_eq!(stored.last_processed_at, None, "last_processed_at of row {id}");
        assert!(!stored.hinted, "row {id} is hinted");
    }
    let tasks = h.store().list("task", Some(row.id)).await.expect("list");
    assert_eq!(ids(&tasks), inserted[..2].to_vec(), "tasks under row {}", row.id);
}

/// Events are stored with their row, kind and data, at the apply's `now`, and a row's events come back in
/// sequence order, later applies after earlier ones.
pub async fn apply_appends_events_in_sequence_order<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let other = insert(&h, "node").await;
    let event = |row_id: RowId, kind: &str, n: i64| NewEvent { row_id, kind: kind.into(), data: json!({ "n": n }) };
    let first = lease_single(&h, "jobs", &row).await;
    let mut params = ApplyParams::new(first, RowUpdate::default());
    params.events = vec![event(row.id, "a", 1), event(row.id, "b", 2), event(other.id, "c", 3)];
    let at_first = applied_now(&apply(&h, params).await, first);
    h.advance(past(MIN_PROCESSING_INTERVAL));
    let second = lease_single(&h, "jobs", &row).await;
    let mut params = ApplyParams::new(second, RowUpdate::default());
    params.events = vec![event(row.id, "d", 4)];
    let at_second = applied_now(&apply(&h, params).await, second);
    assert!(at_second > at_first, "second apply at {at_second}, first at {at_first}");

    let events = h.store().events(row.id).await.expect("events");
    let summary: Vec<_> = events.iter().map(|e| (e.row_id, e.kind.as_str(), e.data.clone(), e.at)).collect();
    let expected = vec![
        (row.id, "a", json!({"n": 1}), at_first),
        (row.id, "b", json!({"n": 2}), at_first),
        (row.id, "d", json!({"n": 4}), at_second),
    ];
    assert_eq!(summary, expected, "events of row {}", row.id);
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seq not increasing: {seqs:?}");
    let others = h.store().events(other.id).await.expect("events");
    assert_eq!(others.len(), 1, "events of row {}", other.id);
    assert_eq!((others[0].kind.as_str(), others[0].at), ("c", at_first), "event of row {}", other.id);
    assert!(!seqs.contains(&others[0].seq), "seq {} given twice", others[0].seq);
}

/// An apply with a token that a later fetch superseded is stale and writes nothing: no update, no lease change,
/// no insert, no event; the new holder's apply then succeeds.
pub async fn apply_with_superseded_token_is_stale<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let old = lease_single(&h, "jobs", &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "other", &row).await;
    let held = get(&h, row.id).await;
    h.advance(Duration::from_secs(1));
    let mut params = ApplyParams::new(old, RowUpdate::status("done"));
    params.inserts = vec![NewRow::new("allocation", "new", json!({}))];
    params.events = vec![NewEvent { row_id: row.id, kind: "done".into(), data: json!({}) }];
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "apply of superseded {}#{}", old.id, old.token);
    assert_eq!(get(&h, row.id).await, held, "a stale apply wrote row {}", row.id);
    let allocations = h.store().list("allocation", None).await.expect("list");
    assert_eq!(ids(&allocations), vec![], "a stale apply inserted rows");
    assert_eq!(h.store().events(row.id).await.expect("events"), vec![], "a stale apply wrote events");
    applied_now(&apply(&h, ApplyParams::new(new, RowUpdate::status("done"))).await, new);
}

/// A stale apply of a parent holding related locks writes none of its related updates, inserts or events, and
/// leaves the related rows' lock columns as they were.
pub async fn stale_apply_writes_no_related_update_insert_or_event<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let old = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    lease_single(&h, PARENT_PIPELINE, &parent).await;
    let parent_before = get(&h, parent.id).await;
    let mut children_before = Vec::new();
    for child in &children {
        children_before.push(get(&h, child.id).await);
    }
    h.advance(Duration::from_secs(1));
    let params = ApplyParams {
        lease: old,
        update: RowUpdate::status("running"),
        related: children
            .iter()
            .map(|child| RelatedUpdate { id: child.id, update: RowUpdate::status("started") })
            .collect(),
        inserts: vec![NewRow::new("allocation", "new", json!({})).with_parent(parent.id)],
        events: vec![NewEvent { row_id: children[0].id, kind: "started".into(), data: json!({}) }],
        locked: Vec::new(),
        hints: Vec::new(),
    };
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "apply of superseded {}#{}", old.id, old.token);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale apply wrote main row {}", parent.id);
    for before in &children_before {
        assert_eq!(get(&h, before.id).await, *before, "a stale apply wrote related row {}", before.id);
    }
    let allocations = h.store().list("allocation", None).await.expect("list");
    assert_eq!(ids(&allocations), vec![], "a stale apply inserted rows");
    for row_id in [parent.id, children[0].id] {
        let events = h.store().events(row_id).await.expect("events");
        assert_eq!(events, vec![], "a stale apply wrote events about row {row_id}");
    }
}

/// If a related row no longer carries the token (its lock expired and its own pipeline took it), the whole apply
/// is stale: the main row keeps its lease and nothing is written, though the main row's token still matches.
pub async fn apply_is_stale_when_a_related_row_lost_the_token<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    lease_single(&h, CHILD_PIPELINE, &children[0]).await;
    let parent_before = get(&h, parent.id).await;
    let child_before = get(&h, children[0].id).await;
    let mut params = ApplyParams::new(lease, RowUpdate::status("running"));
    params.related = vec![RelatedUpdate { id: children[0].id, update: RowUpdate::status("started") }];
    params.events = vec![NewEvent { row_id: parent.id, kind: "started".into(), data: json!({}) }];
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "apply with lost related row {}", children[0].id);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale apply wrote main row {}", parent.id);
    assert_eq!(get(&h, children[0].id).await, child_before, "a stale apply wrote row {}", children[0].id);
    assert_eq!(h.store().events(parent.id).await.expect("events"), vec![], "a stale apply wrote events");
}

/// A related row the parent locked and read but does not update guards the apply too (`ApplyParams::locked`): once
/// its lock expired while the parent stalled and its own pipeline took the row and changed it, the parent's apply
/// is stale and writes nothing, though the main row still carries the token. The parent read a row that is no
/// longer the row it would apply to (`Store::lock_related_and_read`).
pub async fn apply_is_stale_when_a_locked_row_it_does_not_update_lost_the_token<H: Harness>(h: H) {
    let (parent, mut children) = family(&h, 1).await;
    // A second child of another kind, so that the child pipeline's fetch takes the first alone.
    children.push(insert_new(&h, NewRow::new("allocation", READY, json!({})).with_parent(parent.id)).await);
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    let child_lease = lease_single(&h, CHILD_PIPELINE, &children[0]).await;
    applied_now(&apply(&h, ApplyParams::new(child_lease, RowUpdate::status("done"))).await, child_lease);
    let parent_before = get(&h, parent.id).await;
    let (lost_before, kept_before) = (get(&h, children[0].id).await, get(&h, children[1].id).await);
    assert_eq!(parent_before.lock_token, Some(lease.token), "main row {} still carries the token", parent.id);
    let mut params = ApplyParams::new(lease, RowUpdate::status("all-children-ready"));
    params.locked = ids(&children);
    params.events = vec![NewEvent { row_id: parent.id, kind: "decided".into(), data: json!({}) }];
    let outcome = apply(&h, params).await;
    assert_eq!(
        outcome,
        ApplyOutcome::Stale,
        "apply of {}#{} after losing child {}",
        parent.id,
        lease.token,
        lost_before.id
    );
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale apply wrote main row {}", parent.id);
    assert_eq!(get(&h, lost_before.id).await, lost_before, "a stale apply wrote row {}", lost_before.id);
    assert_eq!(get(&h, kept_before.id).await, kept_before, "a stale apply unlocked row {}", kept_before.id);
    assert_eq!(h.store().events(parent.id).await.expect("events"), vec![], "a stale apply wrote events");
}

/// Related rows the apply names as locked but does not update, still locked with the token, let it apply: they
/// are unlocked and left as they were (status, data, `updated_at`).
pub async fn apply_with_held_locked_rows_applies_and_unlocks_them_unwritten<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(Duration::from_secs(1));
    let mut params = ApplyParams::new(lease, RowUpdate::status("running"));
    params.related = vec![RelatedUpdate { id: children[0].id, update: RowUpdate::status("started") }];
    params.locked = ids(&children);
    let at = applied_now(&apply(&h, params).await, lease);
    assert_eq!(get(&h, parent.id).await.status, "running", "status of main row {}", parent.id);
    let written = get(&h, children[0].id).await;
    assert_eq!((written.status.as_str(), written.updated_at), ("started", at), "related row {}", written.id);
    assert_unlocked(&written);
    let unwritten = get(&h, children[1].id).await;
    assert_unlocked(&unwritten);
    assert_eq!(unwritten.status, READY, "status of locked row {}", unwritten.id);
    assert_eq!(unwritten.updated_at, children[1].updated_at, "updated_at of locked row {}", unwritten.id);
}

/// A related update for a row that was never locked with the token makes the apply stale: related rows are
/// guarded like the main row.
pub async fn apply_is_stale_when_a_related_row_was_never_locked<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let parent_before = get(&h, parent.id).await;
    let mut params = ApplyParams::new(lease, RowUpdate::status("running"));
    params.related = vec![RelatedUpdate { id: children[0].id, update: RowUpdate::status("started") }];
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "apply with unlocked related row {}", children[0].id);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale apply wrote main row {}", parent.id);
    assert_eq!(get(&h, children[0].id).await, children[0], "a stale apply wrote row {}", children[0].id);
}

/// The guard is `id + lock_token`, not the expiry: an expired lease no one took over still applies (dstack
/// PIPELINES, checklist 5).
pub async fn apply_after_expiry_succeeds_while_no_one_took_the_row<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    h.advance(past(LEASE_TTL));
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::status("done"))).await, lease);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, "done", "status of row {}", row.id);
    assert_unlocked(&stored);
}
