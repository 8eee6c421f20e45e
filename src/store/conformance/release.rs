//! Release: giving leases back unprocessed on shutdown ([`Store::release`]; DESIGN §3, Manager).

use super::*;
use crate::store::RowUpdate;

/// A released row and its related rows lose every lease column, the row stays unprocessed, and any pipeline
/// takes it at once.
pub async fn release_clears_the_lease_and_related_locks_without_processing<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(Duration::from_secs(1));
    assert_eq!(h.store().release(vec![lease]).await.expect("release"), 1, "release of {}", parent.id);
    let stored = get(&h, parent.id).await;
    assert_unlocked(&stored);
    assert_eq!(stored.last_processed_at, None, "a release processed row {}", parent.id);
    assert_eq!(stored.status, parent.status, "status of released row {}", parent.id);
    for child in &children {
        assert_unlocked(&get(&h, child.id).await);
    }
    assert_eq!(refetch(&h, lease).await, None, "token {} survived its release", lease.token);
    let leased = fetch(&h, "other", "operation").await;
    assert_eq!(ids(&leased), vec![parent.id], "another pipeline takes released row {} at once", parent.id);
}

/// A release leaves `last_processed_at` of a processed row as the last apply set it.
pub async fn release_keeps_last_processed_at<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let first = lease_single(&h, "jobs", &row).await;
    let processed = applied_now(&apply(&h, ApplyParams::new(first, RowUpdate::default())).await, first);
    h.advance(past(MIN_PROCESSING_INTERVAL));
    let second = lease_single(&h, "jobs", &row).await;
    h.advance(Duration::from_secs(1));
    assert_eq!(h.store().release(vec![second]).await.expect("release"), 1, "release of {}", row.id);
    let stored = get(&h, row.id).await;
    assert_unlocked(&stored);
    assert_eq!(stored.last_processed_at, Some(processed), "last_processed_at of released row {}", row.id);
}

/// Only leases still held are released and counted; a superseded lease's row keeps its new holder's lease.
pub async fn release_counts_and_clears_only_leases_still_held<H: Harness>(h: H) {
    let kept = insert(&h, "job").await;
    let kept_lease = lease_single(&h, "jobs", &kept).await;
    let superseded = insert(&h, "node").await;
    let old = lease_single(&h, "nodes", &superseded).await;
    h.advance(past(LEASE_TTL));
    lease_single(&h, "other", &superseded).await;
    let superseded_before = get(&h, superseded.id).await;
    let released = h.store().release(vec![kept_lease, old]).await.expect("release");
    assert_eq!(released, 1, "only {}#{} is held", kept.id, kept_lease.token);
    assert_unlocked(&get(&h, kept.id).await);
    assert_eq!(get(&h, superseded.id).await, superseded_before, "a stale release wrote row {}", superseded.id);
    let again = h.store().release(vec![kept_lease]).await.expect("release");
    assert_eq!(again, 0, "a second release of {}#{}", kept.id, kept_lease.token);
}
