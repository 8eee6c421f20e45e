//! Fetch hints: the row mark and the broadcast ([`Store::hint`], [`Store::subscribe_hints`]; dstack PIPELINES,
//! checklist 8; DESIGN §2, PgStore `LISTEN/NOTIFY`).

use super::*;
use crate::store::{NewHint, RowUpdate};

async fn hint<H: Harness>(h: &H, kind: &str, row: Option<RowId>) {
    h.store().hint(kind, row).await.expect("hint");
}

/// A hint naming a row marks that row hinted and no other; a hint naming no row marks none.
pub async fn hint_with_a_row_marks_only_that_row_hinted<H: Harness>(h: H) {
    let named = insert(&h, "job").await;
    let other = insert(&h, "job").await;
    hint(&h, "job", None).await;
    assert!(!get(&h, named.id).await.hinted, "a hint without a row marked row {}", named.id);
    assert!(!get(&h, other.id).await.hinted, "a hint without a row marked row {}", other.id);
    hint(&h, "job", Some(named.id)).await;
    assert!(get(&h, named.id).await.hinted, "row {} named by a hint is not hinted", named.id);
    assert!(!get(&h, other.id).await.hinted, "a hint for row {} marked row {}", named.id, other.id);
}

/// Every subscription sees each hint's kind, and by the time it arrives the hinted row is committed as such.
pub async fn hint_reaches_every_subscriber_after_commit<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let mut first = h.store().subscribe_hints();
    let mut second = h.store().subscribe_hints();
    hint(&h, "job", Some(row.id)).await;
    assert_eq!(next_hint(&mut first, "first").await, "job", "kind of the first hint");
    assert!(get(&h, row.id).await.hinted, "row {} not hinted when its hint arrived", row.id);
    assert_eq!(next_hint(&mut second, "second").await, "job", "kind of the first hint");
    hint(&h, "node", None).await;
    assert_eq!(next_hint(&mut first, "first").await, "node", "kind of the second hint");
    assert_eq!(next_hint(&mut second, "second").await, "node", "kind of the second hint");
}

/// A hint that arrives while the row is leased is kept through the apply, so the next fetch takes the row at
/// once: the worker may have read the row before whatever the hint announces.
pub async fn hint_during_a_lease_survives_the_apply<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    hint(&h, "job", Some(row.id)).await;
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::default())).await, lease);
    assert!(get(&h, row.id).await.hinted, "the apply dropped row {}'s hint", row.id);
    lease_single(&h, "jobs", &row).await;
}

/// An apply's hints ([`ApplyParams::hints`]) are published once it commits, as [`Store::hint`] would: by the
/// time a subscriber hears the kind, the apply's write and the hinted row's mark are committed.
pub async fn apply_publishes_its_hints_after_commit<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let named = insert(&h, "task").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let mut rx = h.store().subscribe_hints();
    let hints = vec![NewHint::row("task", named.id)];
    applied_now(&apply(&h, ApplyParams { hints, ..ApplyParams::new(lease, RowUpdate::status("done")) }).await, lease);
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "task", "kind of the apply's hint");
    assert_eq!(get(&h, row.id).await.status, "done", "row {} not applied when its apply's hint arrived", row.id);
    assert!(get(&h, named.id).await.hinted, "row {} named by the apply's hint is not hinted", named.id);
}

/// A stale apply publishes none of its hints and marks no row: the next hint a subscriber hears is a later one.
pub async fn stale_apply_publishes_no_hint<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let named = insert(&h, "task").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let stale = Lease { id: lease.id, token: crate::store::LockToken(lease.token.0 + 1_000_000) };
    let mut rx = h.store().subscribe_hints();
    let hints = vec![NewHint::row("task", named.id)];
    let outcome = apply(&h, ApplyParams { hints, ..ApplyParams::new(stale, RowUpdate::status("done")) }).await;
    assert_eq!(outcome, ApplyOutcome::Stale, "apply {}#{} with a token never issued", stale.id, stale.token);
    hint(&h, "marker", None).await;
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "marker", "a stale apply published its hint");
    assert!(!get(&h, named.id).await.hinted, "a stale apply marked row {} hinted", named.id);
}

/// A batch publishes the hints of its applied items, each kind once however many items name it, and the rows
/// they name are marked; a stale item's hints are not published and its row is not marked.
pub async fn apply_batch_publishes_the_hints_of_its_applied_items_once_per_kind<H: Harness>(h: H) {
    let rows = [insert(&h, "job").await, insert(&h, "job").await, insert(&h, "job").await];
    let named = [insert(&h, "task").await, insert(&h, "task").await, insert(&h, "task").await];
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(sorted(ids(&leased)), sorted(ids(&rows)), "the three jobs were to be leased");
    let lease_of_row = |row: &Row| lease_of(leased.iter().find(|l| l.id == row.id).expect("leased"));
    let stale = Lease { id: rows[2].id, token: crate::store::LockToken(lease_of_row(&rows[2]).token.0 + 1_000_000) };
    let item =
        |lease: Lease, hints: Vec<NewHint>| ApplyParams { hints, ..ApplyParams::new(lease, RowUpdate::status("done")) };
    let batch = vec![
        item(lease_of_row(&rows[0]), vec![NewHint::row("task", named[0].id)]),
        item(lease_of_row(&rows[1]), vec![NewHint::row("task", named[1].id), "task".into()]),
        item(stale, vec![NewHint::row("stale-kind", named[2].id)]),
    ];
    let mut rx = h.store().subscribe_hints();
    let outcomes = h.store().apply_batch(batch).await.expect("apply_batch");
    assert!(matches!(outcomes[0], ApplyOutcome::Applied { .. }), "item 0: {:?}", outcomes[0]);
    assert!(matches!(outcomes[1], ApplyOutcome::Applied { .. }), "item 1: {:?}", outcomes[1]);
    assert_eq!(outcomes[2], ApplyOutcome::Stale, "item 2, a token never issued");
    hint(&h, "marker", None).await;
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "task", "the applied items' kind");
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "marker", "a kind published twice, or a stale item's");
    assert!(get(&h, named[0].id).await.hinted, "row {} named by item 0 is not hinted", named[0].id);
    assert!(get(&h, named[1].id).await.hinted, "row {} named by item 1 is not hinted", named[1].id);
    assert!(!get(&h, named[2].id).await.hinted, "the stale item marked row {} hinted", named[2].id);
}
