//! Write APIs' updates that respect leases ([`Store::update_unleased`]; DESIGN §3, write APIs; dstack PIPELINES,
//! "All write APIs must respect DB-level locks").

use super::*;
use crate::store::{RowUpdate, WriteOutcome};
use serde_json::json;

async fn update_unleased<H: Harness>(h: &H, id: RowId, update: RowUpdate) -> WriteOutcome {
    h.store().update_unleased(id, update).await.expect("update_unleased")
}

/// A row with no lease and no mark is written: the given columns change, `updated_at` moves to now, and the row
/// stays unleased and unprocessed.
pub async fn update_unleased_writes_a_row_with_no_lease<H: Harness>(h: H) {
    let row = insert_new(&h, NewRow::new("operation", "running", json!({"spec": 1}))).await;
    h.advance(Duration::from_secs(1));
    let before = now(&h).await;
    let outcome = update_unleased(&h, row.id, RowUpdate::status("aborting")).await;
    let after = now(&h).await;
    assert_eq!(outcome, WriteOutcome::Written, "update of free row {}", row.id);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, "aborting", "status of row {}", row.id);
    assert_eq!(stored.data, json!({"spec": 1}), "data of row {}", row.id);
    assert_within(stored.updated_at, before, after, "updated_at");
    assert_unlocked(&stored);
    assert_eq!(stored.last_processed_at, None, "a write API processed row {}", row.id);
}

/// A live lease makes the write busy, and the row is left as it was.
pub async fn update_unleased_is_busy_while_a_lease_is_live<H: Harness>(h: H) {
    let row = insert(&h, "operation").await;
    lease_single(&h, "operations", &row).await;
    let held = get(&h, row.id).await;
    h.advance(LEASE_TTL / 2);
    let outcome = update_unleased(&h, row.id, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Busy, "update of leased row {}", row.id);
    assert_eq!(get(&h, row.id).await, held, "a busy update wrote row {}", row.id);
}

/// A reset mark (owner, no lease) makes the write busy however long it stays, so the pipeline's retry is not
/// overtaken.
pub async fn update_unleased_is_busy_on_a_reset_mark<H: Harness>(h: H) {
    let row = insert(&h, "operation").await;
    let lease = lease_single(&h, "operations", &row).await;
    assert!(reset_for_retry(&h, lease).await, "reset of held lease {}#{}", row.id, lease.token);
    let marked = get(&h, row.id).await;
    h.advance(past(MIN_PROCESSING_INTERVAL));
    let outcome = update_unleased(&h, row.id, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Busy, "update of reset row {}", row.id);
    assert_eq!(get(&h, row.id).await, marked, "a busy update wrote row {}", row.id);
}

/// A fresh intent mark left by a contended related lock makes the write busy.
pub async fn update_unleased_is_busy_on_a_fresh_intent_mark<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 1).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let outcome = lock_related(&h, lease, &[busy_lease.id, free[0].id], PARENT_PIPELINE).await;
    assert_eq!(
        outcome,
        LockOutcome::Contended { by_own_pipeline: false },
        "row {} is leased by {CHILD_PIPELINE}",
        busy_lease.id
    );
    let marked = get(&h, free[0].id).await;
    assert_eq!(marked.lock_owner.as_deref(), Some(PARENT_PIPELINE), "intent mark on row {}", marked.id);
    let outcome = update_unleased(&h, marked.id, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Busy, "update of marked row {}", marked.id);
    assert_eq!(get(&h, marked.id).await, marked, "a busy update wrote row {}", marked.id);
}

/// An id that was never given out is reported missing, not an error.
pub async fn update_unleased_of_a_missing_row_is_missing<H: Harness>(h: H) {
    let row = insert(&h, "operation").await;
    let missing = RowId(row.id.0 + 1_000);
    let outcome = update_unleased(&h, missing, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Missing, "update of row {missing}");
}

/// An expired lease does not block a write API: the write takes the row over and clears the lease, so the old
/// holder's late apply is stale and cannot undo it.
pub async fn update_unleased_takes_over_an_expired_lease_so_its_apply_is_stale<H: Harness>(h: H) {
    let row = insert(&h, "operation").await;
    let lease = lease_single(&h, "operations", &row).await;
    h.advance(past(LEASE_TTL));
    let outcome = update_unleased(&h, row.id, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Written, "update of row {} with an expired lease", row.id);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, "aborting", "status of row {}", row.id);
    assert_eq!(stored.lock_token, None, "token of taken-over row {}", row.id);
    let late = apply(&h, ApplyParams::new(lease, RowUpdate::status("running"))).await;
    assert_eq!(late, ApplyOutcome::Stale, "the expired holder {}#{} applied", row.id, lease.token);
    assert_eq!(get(&h, row.id).await.status, "aborting", "a late apply undid the write to row {}", row.id);
}

/// A write API's update of a related row whose lock expired takes the row over and clears the lock, and those of
/// the other rows locked as related with the same token, but leaves the main row's lease to its holder, as
/// PostgreSQL does (it unlocks the rows carrying the token as `related_token`); the holder's apply is then stale
/// for the lost lock alone (`ApplyParams::locked`).
pub async fn update_unleased_of_a_related_row_leaves_the_main_rows_lease<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    let parent_before = get(&h, parent.id).await;
    let outcome = update_unleased(&h, children[0].id, RowUpdate::status("aborting")).await;
    assert_eq!(outcome, WriteOutcome::Written, "update of row {} with an expired related lock", children[0].id);
    let taken = get(&h, children[0].id).await;
    assert_eq!(taken.status, "aborting", "status of row {}", taken.id);
    assert_unlocked(&taken);
    assert_unlocked(&get(&h, children[1].id).await);
    assert_eq!(
        get(&h, parent.id).await,
        parent_before,
        "the write to related row {} wrote main row {}",
        taken.id,
        parent.id
    );
    let mut late = ApplyParams::new(lease, RowUpdate::status("running"));
    late.locked = ids(&children);
    assert_eq!(
        apply(&h, late).await,
        ApplyOutcome::Stale,
        "apply of {}#{} after losing {}",
        parent.id,
        lease.token,
        taken.id
    );
}
