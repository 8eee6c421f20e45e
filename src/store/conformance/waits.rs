//! Parked waiters (DESIGN §3, "Parked waiters"; [`LockRelatedParams::park`]): a contended related lock that parks
//! its holder records it as a waiter on the rows that turned it away and resets nothing, tells how long the
//! longest lock it met has to run, and the write that frees such a row (its holder's apply, reset, release or
//! failure) publishes a [`wake_hint`](crate::store::wake_hint) naming it once committed. Rows no one waits on
//! wake no one.

use super::*;
use crate::store::{FailureParams, LockAttempt, LockRead, Retry, RowUpdate, parse_wake_hint};

/// A parent leased by [`PARENT_PIPELINE`] and one child leased by [`CHILD_PIPELINE`] (its holder).
async fn parent_and_busy_child<H: Harness>(h: &H) -> (Lease, Lease) {
    let (parent, _) = family(h, 0).await;
    let parent_lease = lease_single(h, PARENT_PIPELINE, &parent).await;
    let (busy, _) = busy_child_then_free_ones(h, &parent, 0).await;
    (parent_lease, busy)
}

/// `holder`'s related lock of `related` with [`LockRelatedParams::park`].
async fn park<H: Harness>(h: &H, holder: Lease, related: &[RowId]) -> LockAttempt {
    let params = LockRelatedParams { park: true, ..lock_params(holder, related, PARENT_PIPELINE) };
    h.store().lock_related_or_reset(params).await.expect("lock_related_or_reset with park")
}

/// The next hint a subscriber hears, which must be a wake: the rows it names.
async fn next_wake(rx: &mut tokio::sync::broadcast::Receiver<crate::store::Hint>) -> Vec<RowId> {
    let hint = next_hint(rx, "the subscriber").await;
    parse_wake_hint(&hint).unwrap_or_else(|| panic!("the next hint was {hint:?}, not a wake"))
}

/// A parked lock resets nothing (the holder keeps its lease), takes no lock, and tells the span until the lock
/// it met expires: at most the holder's ttl and more than the ttl less the case's margin.
pub async fn a_parked_lock_keeps_the_lease_and_tells_when_the_lock_it_met_expires<H: Harness>(h: H) {
    let (parent, busy) = parent_and_busy_child(&h).await;
    let attempt = park(&h, parent, &[busy.id]).await;
    let LockAttempt::Parked { until: Some(until), by_own_pipeline: false } = attempt else {
        panic!("parent {} parked on child {}: {attempt:?}", parent.id, busy.id);
    };
    assert!(until <= LEASE_TTL, "until {until:?} past the child's ttl");
    assert!(until + MARGIN > LEASE_TTL, "until {until:?} short of the child's lease");
    assert!(refetch(&h, parent).await.is_some(), "parked parent {} lost its lease", parent.id);
    assert_eq!(get(&h, busy.id).await.lock_token, Some(busy.token), "child {} changed hands", busy.id);
    let read = LockRelatedParams { park: true, ..lock_params(parent, &[busy.id], PARENT_PIPELINE) };
    let read = h.store().lock_related_and_read(read).await.expect("lock_related_and_read with park");
    assert!(matches!(read, LockRead::Parked { until: Some(_), .. }), "the read lock parks too: {read:?}");
}

/// The span is the longest over the rows met; a row reset for retry by its own pipeline, which only its apply
/// frees, makes it unknown.
pub async fn a_row_reset_by_its_own_pipeline_makes_the_span_unknown<H: Harness>(h: H) {
    let (parent, busy) = parent_and_busy_child(&h).await;
    let parent_row = get(&h, parent.id).await;
    let (reset, _) = busy_child_then_free_ones(&h, &parent_row, 0).await;
    assert!(reset_for_retry(&h, reset).await, "child {} reset", reset.id);
    let attempt = park(&h, parent, &[busy.id, reset.id]).await;
    assert!(matches!(attempt, LockAttempt::Parked { until: None, .. }), "{attempt:?}");
}

/// The holder's apply wakes the waiters of its row, once committed.
pub async fn the_holders_apply_wakes_the_waiters_of_its_row<H: Harness>(h: H) {
    let (parent, busy) = parent_and_busy_child(&h).await;
    park(&h, parent, &[busy.id]).await;
    let mut rx = h.store().subscribe_hints();
    applied_now(&apply(&h, ApplyParams::new(busy, RowUpdate::status("done"))).await, busy);
    assert_eq!(next_wake(&mut rx).await, vec![busy.id], "the apply of child {} woke", busy.id);
    assert_eq!(get(&h, busy.id).await.status, "done", "child {} not applied when its wake arrived", busy.id);
}

/// The holder's reset, release and failure each wake the waiters of its row; each wake is sent once.
pub async fn a_reset_a_release_and_a_failure_of_the_holder_each_wake_its_waiters<H: Harness>(h: H) {
    let (parent, _) = family(&h, 0).await;
    let parent_lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let (reset, _) = busy_child_then_free_ones(&h, &parent, 0).await;
    let (released, _) = busy_child_then_free_ones(&h, &parent, 0).await;
    let (failed, _) = busy_child_then_free_ones(&h, &parent, 0).await;
    park(&h, parent_lease, &[reset.id, released.id, failed.id]).await;
    let mut rx = h.store().subscribe_hints();
    assert!(reset_for_retry(&h, reset).await, "child {} reset", reset.id);
    assert_eq!(next_wake(&mut rx).await, vec![reset.id], "the reset woke");
    assert_eq!(h.store().release(vec![released]).await.expect("release"), 1);
    assert_eq!(next_wake(&mut rx).await, vec![released.id], "the release woke");
    let failure = FailureParams { lease: failed, error: "boom".into(), retry: Retry::After(RETRY_DELAY) };
    h.store().record_failure(failure).await.expect("record_failure");
    assert_eq!(next_wake(&mut rx).await, vec![failed.id], "the failure woke");
    // A row's waiters are woken once: its next free (a lease taken and applied) wakes no one.
    let again = lease_single(&h, CHILD_PIPELINE, &get(&h, released.id).await).await;
    applied_now(&apply(&h, ApplyParams::new(again, RowUpdate::default())).await, again);
    h.store().hint("marker", None).await.expect("hint");
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "marker", "a second free woke row {}", released.id);
}

/// A row no parked waiter waits on wakes no one when freed: not after a contended lock that did not park, nor
/// after an uncontended one.
pub async fn a_row_no_one_waits_on_wakes_no_one<H: Harness>(h: H) {
    let (parent, busy) = parent_and_busy_child(&h).await;
    let outcome = lock_related(&h, parent, &[busy.id], PARENT_PIPELINE).await;
    assert!(matches!(outcome, LockOutcome::Contended { .. }), "{outcome:?}");
    let mut rx = h.store().subscribe_hints();
    applied_now(&apply(&h, ApplyParams::new(busy, RowUpdate::status("done"))).await, busy);
    h.store().hint("marker", None).await.expect("hint");
    assert_eq!(next_hint(&mut rx, "the subscriber").await, "marker", "a free of row {} woke", busy.id);
}
