//! Related locks and reset-and-retry ([`Store::lock_related`], [`Store::reset_for_retry`]; dstack PIPELINES,
//! "Locking many related resources", "Locking a shared related resource", "Reset-and-retry", checklist 7;
//! DESIGN §3, related locks).

use super::*;
use crate::store::{HeartbeatParams, LockRead, RelatedUpdate, RowUpdate};

/// Owner of a shared related row locked for item `id` of [`CHILD_PIPELINE`] (dstack:
/// `f"{Pipeline.__name__}:{item.id}"`).
fn shared_owner(id: RowId) -> String {
    crate::store::shared_owner(CHILD_PIPELINE, id)
}

/// Leases the `job` items `a` and `b` for [`CHILD_PIPELINE`] in one fetch.
async fn lease_both<H: Harness>(h: &H, a: &Row, b: &Row) -> (Lease, Lease) {
    let leased = fetch(h, CHILD_PIPELINE, "job").await;
    assert_eq!(sorted(ids(&leased)), vec![a.id, b.id], "both items leased");
    let lease = |id: RowId| lease_of(leased.iter().find(|row| row.id == id).expect("leased"));
    (lease(a.id), lease(b.id))
}

/// A successful lock puts the holder's token, the owner and `now + lease_ttl` on every related row, and their
/// own pipeline no longer takes them.
pub async fn lock_related_locks_every_row_with_the_holders_token_and_owner<H: Harness>(h: H) {
    let (parent, children) = family(&h, 3).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    h.advance(Duration::from_secs(1));
    let before = now(&h).await;
    let outcome = lock_related(&h, lease, &ids(&children), PARENT_PIPELINE).await;
    let after = now(&h).await;
    assert_eq!(outcome, LockOutcome::Locked, "children of {} are free", parent.id);
    for child in &children {
        let stored = get(&h, child.id).await;
        assert_eq!(stored.lock_token, Some(lease.token), "token of related row {}", child.id);
        assert_eq!(stored.lock_owner.as_deref(), Some(PARENT_PIPELINE), "owner of related row {}", child.id);
        let expires = stored.lock_expires_at.expect("a locked row has an expiry");
        assert_within(expires, before.plus(LEASE_TTL), after.plus(LEASE_TTL), "related lock_expires_at");
        assert_eq!(stored.status, child.status, "status of related row {}", child.id);
    }
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "child pipeline took a locked child");
    assert_eq!(refetch(&h, lease).await.map(|row| row.id), Some(parent.id), "the main lease is still held");
}

/// When one related row is busy, no row is locked; the free ones get the owner as an intent mark (no token,
/// expiring after the lease ttl) and the busy one is left as it was.
pub async fn lock_related_under_contention_locks_nothing_and_marks_the_free_rows<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 2).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let busy_before = get(&h, busy_lease.id).await;
    let parent_before = get(&h, parent.id).await;
    h.advance(Duration::from_secs(1));
    let related = [free[0].id, busy_lease.id, free[1].id];
    let before = now(&h).await;
    let outcome = lock_related(&h, lease, &related, PARENT_PIPELINE).await;
    let after = now(&h).await;
    assert_eq!(
        outcome,
        LockOutcome::Contended { by_own_pipeline: false },
        "row {} is leased by {CHILD_PIPELINE}",
        busy_lease.id
    );
    for row in &free {
        let stored = get(&h, row.id).await;
        assert_eq!(stored.lock_token, None, "free row {} got a token under contention", row.id);
        assert_eq!(stored.lock_owner.as_deref(), Some(PARENT_PIPELINE), "intent mark on row {}", row.id);
        let expires = stored.lock_expires_at.expect("an intent mark expires");
        assert_within(expires, before.plus(LEASE_TTL), after.plus(LEASE_TTL), "intent mark expiry");
    }
    assert_eq!(get(&h, busy_lease.id).await, busy_before, "the busy row {} was written", busy_lease.id);
    assert_eq!(get(&h, parent.id).await, parent_before, "main row {} was written", parent.id);
    let mut params = ApplyParams::new(lease, RowUpdate::default());
    params.related = vec![RelatedUpdate { id: free[0].id, update: RowUpdate::status("started") }];
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "an intent mark is not a lock");
}

/// A child's own pipeline skips children carrying a fresh intent mark, and takes them once the mark expired, so
/// a parent that died never starves them (dstack #3704).
pub async fn child_fetch_skips_fresh_intent_marks_and_takes_expired_ones<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 2).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let related = [free[0].id, busy_lease.id, free[1].id];
    assert_eq!(
        lock_related(&h, lease, &related, PARENT_PIPELINE).await,
        LockOutcome::Contended { by_own_pipeline: false }
    );
    applied_now(&apply(&h, ApplyParams::new(busy_lease, RowUpdate::status("done"))).await, busy_lease);
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "took a freshly marked child");
    h.advance(LEASE_TTL / 2);
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "took a marked child early");
    h.advance(past(LEASE_TTL / 2));
    let leased = fetch(&h, CHILD_PIPELINE, "job").await;
    assert_eq!(sorted(ids(&leased)), ids(&free), "expired intent marks are taken");
    for row in &leased {
        assert_eq!(row.lock_owner.as_deref(), Some(CHILD_PIPELINE), "owner of row {}", row.id);
    }
}

/// A parent's contended retries leave the intent marks it already left as they are: however often it retries, its
/// marks expire one lease ttl after the attempt that left them, and the child pipeline then takes the children
/// (a parent that re-marked its children at every retry kept their pipeline off them for minutes).
/// The marks still hold the children for the parent until then.
pub async fn contended_retries_leave_existing_intent_marks_as_they_are<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy, free) = busy_child_then_free_ones(&h, &parent, 2).await;
    let related: Vec<RowId> = [ids(&free), vec![busy.id]].concat();
    let first = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(
        lock_related(&h, first, &related, PARENT_PIPELINE).await,
        LockOutcome::Contended { by_own_pipeline: false }
    );
    let marked: Vec<Row> = futures_rows(&h, &ids(&free)).await;
    assert!(reset_for_retry(&h, first).await, "reset of held lease {}#{}", first.id, first.token);
    // Retries every few seconds for most of a lease ttl: the marks keep their first expiry.
    let mut retried = Duration::ZERO;
    while retried + past(RETRY_DELAY) < LEASE_TTL {
        h.advance(past(RETRY_DELAY));
        retried += past(RETRY_DELAY);
        // The busy child's own pipeline keeps its lease, so the parent stays contended.
        assert_eq!(heartbeat(&h, &[busy]).await, vec![busy], "heartbeat of busy child {}", busy.id);
        let retry = lease_single(&h, PARENT_PIPELINE, &parent).await;
        assert_eq!(
            lock_related(&h, retry, &related, PARENT_PIPELINE).await,
            LockOutcome::Contended { by_own_pipeline: false }
        );
        assert_eq!(futures_rows(&h, &ids(&free)).await, marked, "a retry rewrote the intent marks");
        assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "took a child under a fresh mark");
        assert!(reset_for_retry(&h, retry).await, "reset of held lease {}#{}", retry.id, retry.token);
    }
    // One lease ttl after the first attempt the marks have expired, retries or not: the children are taken, and a
    // retry meanwhile does not mark them again.
    h.advance(past(LEASE_TTL - retried));
    let retry = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(
        lock_related(&h, retry, &related, PARENT_PIPELINE).await,
        LockOutcome::Contended { by_own_pipeline: false }
    );
    assert_eq!(futures_rows(&h, &ids(&free)).await, marked, "a retry renewed expired intent marks");
    let leased = fetch(&h, CHILD_PIPELINE, "job").await;
    assert_eq!(sorted(ids(&leased)), ids(&free), "the children whose marks expired are taken");
}

/// Extends `leases` by [`LEASE_TTL`]; returns those still held.
async fn heartbeat<H: Harness>(h: &H, leases: &[Lease]) -> Vec<Lease> {
    let params = HeartbeatParams { leases: leases.to_vec(), lease_ttl: LEASE_TTL };
    h.store().heartbeat(params).await.expect("heartbeat")
}

/// The rows of `ids`, read one by one, in the order given.
async fn futures_rows<H: Harness>(h: &H, ids: &[RowId]) -> Vec<Row> {
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        rows.push(get(h, *id).await);
    }
    rows
}

/// The reset-and-retry dance: a parent contended by one busy child resets, its intent marks keep the child
/// pipeline off the free children, and once the busy child is applied the parent's retry locks them all.
pub async fn parent_acquires_every_child_once_the_contended_child_is_applied<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 2).await;
    let all = [free[0].id, busy_lease.id, free[1].id];
    let first = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(lock_related(&h, first, &all, PARENT_PIPELINE).await, LockOutcome::Contended { by_own_pipeline: false });
    assert!(reset_for_retry(&h, first).await, "reset of held lease {}#{}", first.id, first.token);
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "took a marked child");
    applied_now(&apply(&h, ApplyParams::new(busy_lease, RowUpdate::status("done"))).await, busy_lease);
    h.advance(past(RETRY_DELAY));
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "took a marked child after the retry delay");
    let retry = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(lock_related(&h, retry, &all, PARENT_PIPELINE).await, LockOutcome::Locked, "retry of {}", parent.id);
    for id in all {
        assert_eq!(get(&h, id).await.lock_token, Some(retry.token), "token of related row {id}");
    }
    let mut params = ApplyParams::new(retry, RowUpdate::status("running"));
    params.related = all.iter().map(|id| RelatedUpdate { id: *id, update: RowUpdate::status("aborted") }).collect();
    applied_now(&apply(&h, params).await, retry);
    for id in all {
        let stored = get(&h, id).await;
        assert_eq!(stored.status, "aborted", "status of related row {id}");
        assert_unlocked(&stored);
    }
}

/// With an owner naming the item (`Pipeline:{id}`), two items of one pipeline contend for one shared row: the
/// second waits until the first applied.
pub async fn a_shared_owner_makes_two_items_contend_for_one_row<H: Harness>(h: H) {
    let a = insert(&h, "job").await;
    let b = insert(&h, "job").await;
    let shared = insert(&h, "node").await;
    let (lease_a, lease_b) = lease_both(&h, &a, &b).await;
    let owner_a = shared_owner(a.id);
    let owner_b = shared_owner(b.id);
    assert_eq!(lock_related(&h, lease_a, &[shared.id], &owner_a).await, LockOutcome::Locked);
    let locked = get(&h, shared.id).await;
    // Held by another item of the same pipeline: `by_own_pipeline`.
    let outcome = lock_related(&h, lease_b, &[shared.id], &owner_b).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: true });
    assert_eq!(get(&h, shared.id).await, locked, "contention rewrote shared row {}", shared.id);
    let mut params = ApplyParams::new(lease_b, RowUpdate::default());
    params.related = vec![RelatedUpdate { id: shared.id, update: RowUpdate::status("used_by_b") }];
    assert_eq!(apply(&h, params).await, ApplyOutcome::Stale, "b wrote a row a holds");
    applied_now(&apply(&h, ApplyParams::new(lease_a, RowUpdate::default())).await, lease_a);
    assert_unlocked(&get(&h, shared.id).await);
    assert_eq!(lock_related(&h, lease_b, &[shared.id], &owner_b).await, LockOutcome::Locked);
}

/// An intent mark left by one item is respected by another item of the same pipeline (owners differ), and
/// accepted by the item that left it.
pub async fn a_shared_owners_intent_mark_holds_off_another_item<H: Harness>(h: H) {
    let a = insert(&h, "job").await;
    let b = insert(&h, "job").await;
    let (lease_a, lease_b) = lease_both(&h, &a, &b).await;
    let busy = insert(&h, "node").await;
    let busy_lease = lease_single(&h, "nodes", &busy).await;
    let free = insert(&h, "node").await;
    let outcome = lock_related(&h, lease_a, &[free.id, busy.id], &shared_owner(a.id)).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased by nodes", busy.id);
    let marked = get(&h, free.id).await;
    let outcome = lock_related(&h, lease_b, &[free.id], &shared_owner(b.id)).await;
    // An intent mark is no hold: `by_own_pipeline` is false though the mark names the same pipeline.
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "b took row {} marked for a", free.id);
    assert_eq!(get(&h, free.id).await, marked, "b rewrote a's intent mark on row {}", free.id);
    applied_now(&apply(&h, ApplyParams::new(busy_lease, RowUpdate::default())).await, busy_lease);
    let outcome = lock_related(&h, lease_a, &[free.id, busy.id], &shared_owner(a.id)).await;
    assert_eq!(outcome, LockOutcome::Locked, "a's own mark on row {} holds it for a", free.id);
}

/// Items of one pipeline that each need two shared rows give way by age (`related_available`): an older item's
/// fresh intent mark holds off a younger one, and a younger item's does not hold off an older one, which takes the
/// row. Without the rule the two below hold each other off (each has marked one row the other needs) until the
/// marks expire, and then again: the livelock a new user's trial found.
pub async fn a_younger_items_intent_mark_gives_way_to_an_older_item<H: Harness>(h: H) {
    let older = insert(&h, "job").await;
    let younger = insert(&h, "job").await;
    let (lease_older, lease_younger) = lease_both(&h, &older, &younger).await;
    let (owner_older, owner_younger) = (shared_owner(older.id), shared_owner(younger.id));
    let second = insert(&h, "node").await;
    let busy = lease_single(&h, "nodes", &second).await;
    let first = insert(&h, "node").await;
    let both = [first.id, second.id];
    let outcome = lock_related(&h, lease_older, &both, &owner_older).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased by nodes", second.id);
    applied_now(&apply(&h, ApplyParams::new(busy, RowUpdate::default())).await, busy);
    let marked = get(&h, first.id).await;
    let outcome = lock_related(&h, lease_younger, &[second.id, first.id], &owner_younger).await;
    let expected = LockOutcome::Contended { by_own_pipeline: false };
    assert_eq!(outcome, expected, "the younger item took row {} marked by the older", first.id);
    assert_eq!(get(&h, first.id).await, marked, "the younger item rewrote the older's mark on row {}", first.id);
    let younger_mark = get(&h, second.id).await;
    assert_eq!(younger_mark.lock_owner.as_deref(), Some(owner_younger.as_str()), "mark on row {}", second.id);
    assert_eq!(younger_mark.lock_token, None, "a contended lock left a token on row {}", second.id);
    let outcome = lock_related(&h, lease_older, &both, &owner_older).await;
    assert_eq!(outcome, LockOutcome::Locked, "the younger item's mark on row {} held off the older", second.id);
    for id in both {
        let stored = get(&h, id).await;
        assert_eq!(stored.lock_token, Some(lease_older.token), "token of row {id}");
        assert_eq!(stored.lock_owner.as_deref(), Some(owner_older.as_str()), "owner of row {id}");
    }
    let outcome = lock_related(&h, lease_younger, &[second.id, first.id], &owner_younger).await;
    assert_eq!(
        outcome,
        LockOutcome::Contended { by_own_pipeline: true },
        "the younger item locked rows the older holds"
    );
}

/// The age rule orders items of different pipelines too: two pipelines that share counters livelocked without it
/// (a new user's trial). Item ids are row ids, unique across pipelines.
pub async fn a_younger_items_mark_of_another_pipeline_gives_way_to_an_older_item<H: Harness>(h: H) {
    let older = insert(&h, "job").await;
    let younger = insert(&h, "job").await;
    let (lease_older, lease_younger) = lease_both(&h, &older, &younger).await;
    let owner_older = shared_owner(older.id);
    let owner_younger = crate::store::shared_owner("other", younger.id);
    let second = insert(&h, "node").await;
    let busy = lease_single(&h, "nodes", &second).await;
    let first = insert(&h, "node").await;
    let outcome = lock_related(&h, lease_younger, &[first.id, second.id], &owner_younger).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased by nodes", second.id);
    applied_now(&apply(&h, ApplyParams::new(busy, RowUpdate::default())).await, busy);
    let outcome = lock_related(&h, lease_older, &[first.id, second.id], &owner_older).await;
    assert_eq!(outcome, LockOutcome::Locked, "another pipeline's younger mark on row {} held off the older", first.id);
    let outcome = lock_related(&h, lease_younger, &[first.id], &owner_younger).await;
    assert_eq!(
        outcome,
        LockOutcome::Contended { by_own_pipeline: false },
        "the younger item locked row {} the older holds",
        first.id
    );
}

/// A shared lock takes a row its own pipeline reset for retry (the row's owner mark is the pipeline's name, as
/// `lock_related` of the pipeline writes it): two items that lock each other's row as shared otherwise found each
/// other's reset marks and never finished (a new user's trial). Another pipeline's reset mark still holds it off.
pub async fn a_shared_lock_takes_a_row_its_own_pipeline_reset<H: Harness>(h: H) {
    let a = insert(&h, "job").await;
    let b = insert(&h, "job").await;
    let (lease_a, lease_b) = lease_both(&h, &a, &b).await;
    assert!(reset_for_retry(&h, lease_a).await, "reset of a held lease");
    assert_eq!(get(&h, a.id).await.lock_owner.as_deref(), Some(CHILD_PIPELINE), "a reset keeps the owner");
    let outcome = lock_related(&h, lease_b, &[a.id], &crate::store::shared_owner("other", b.id)).await;
    assert_eq!(
        outcome,
        LockOutcome::Contended { by_own_pipeline: false },
        "another pipeline's shared lock took row {}, reset for retry",
        a.id
    );
    let outcome = lock_related(&h, lease_b, &[a.id], &shared_owner(b.id)).await;
    assert_eq!(outcome, LockOutcome::Locked, "the pipeline's own reset mark on row {} held its item off", a.id);
    assert_eq!(get(&h, a.id).await.lock_token, Some(lease_b.token), "token of row {}", a.id);
}

/// A related row whose lease expired is available, whoever held it; its old holder's apply is then stale.
pub async fn lock_related_takes_an_expired_lease_of_another_pipeline<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let child_lease = lease_single(&h, CHILD_PIPELINE, &children[0]).await;
    h.advance(past(LEASE_TTL));
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(lock_related(&h, lease, &[children[0].id], PARENT_PIPELINE).await, LockOutcome::Locked);
    let stored = get(&h, children[0].id).await;
    assert_eq!(stored.lock_token, Some(lease.token), "token of related row {}", stored.id);
    assert_eq!(stored.lock_owner.as_deref(), Some(PARENT_PIPELINE), "owner of related row {}", stored.id);
    let late = apply(&h, ApplyParams::new(child_lease, RowUpdate::status("done"))).await;
    assert_eq!(late, ApplyOutcome::Stale, "the expired holder of row {} applied", stored.id);
}

/// Another owner's intent mark stops holding a row once it expired.
pub async fn lock_related_takes_an_expired_intent_mark_of_another_owner<H: Harness>(h: H) {
    let a = insert(&h, "job").await;
    let lease_a = lease_single(&h, CHILD_PIPELINE, &a).await;
    let busy = insert(&h, "node").await;
    lease_single(&h, "nodes", &busy).await;
    let free = insert(&h, "node").await;
    let outcome = lock_related(&h, lease_a, &[free.id, busy.id], &shared_owner(a.id)).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased by nodes", busy.id);
    h.advance(past(LEASE_TTL));
    let b = insert(&h, "job").await;
    let leased = fetch(&h, CHILD_PIPELINE, "job").await;
    let lease_b = lease_of(leased.iter().find(|row| row.id == b.id).expect("b is leased"));
    let outcome = lock_related(&h, lease_b, &[free.id], &shared_owner(b.id)).await;
    assert_eq!(outcome, LockOutcome::Locked, "a's expired mark on row {} still held it", free.id);
    assert_eq!(get(&h, free.id).await.lock_token, Some(lease_b.token), "token of row {}", free.id);
}

/// A row its own pipeline reset for retry carries that pipeline's mark with no lease: a parent's lock is
/// contended by it however long it waits, and leaves it as it was.
pub async fn lock_related_is_contended_by_another_pipelines_reset_mark<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let child = &children[0];
    let child_lease = lease_single(&h, CHILD_PIPELINE, child).await;
    assert!(reset_for_retry(&h, child_lease).await, "reset of held lease {}#{}", child.id, child_lease.token);
    let marked = get(&h, child.id).await;
    let first = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(
        lock_related(&h, first, &[child.id], PARENT_PIPELINE).await,
        LockOutcome::Contended { by_own_pipeline: false }
    );
    assert_eq!(get(&h, child.id).await, marked, "contention rewrote the reset mark on row {}", child.id);
    applied_now(&apply(&h, ApplyParams::new(first, RowUpdate::default())).await, first);
    h.advance(past(MIN_PROCESSING_INTERVAL));
    let later = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_eq!(
        lock_related(&h, later, &[child.id], PARENT_PIPELINE).await,
        LockOutcome::Contended { by_own_pipeline: false }
    );
    assert_eq!(get(&h, child.id).await, marked, "contention rewrote the reset mark on row {}", child.id);
}

/// A lock attempt by a holder whose lease was superseded is stale and writes nothing: no lock and no intent
/// marks, even where it would have been contended.
pub async fn lock_related_with_a_stale_holder_is_stale_and_writes_nothing<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let old = lease_single(&h, PARENT_PIPELINE, &parent).await;
    h.advance(past(LEASE_TTL));
    lease_single(&h, PARENT_PIPELINE, &parent).await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 1).await;
    let busy_before = get(&h, busy_lease.id).await;
    let parent_before = get(&h, parent.id).await;
    let outcome = lock_related(&h, old, &[free[0].id], PARENT_PIPELINE).await;
    assert_eq!(outcome, LockOutcome::Stale, "lock by superseded {}#{}", old.id, old.token);
    let outcome = lock_related(&h, old, &[free[0].id, busy_lease.id], PARENT_PIPELINE).await;
    assert_eq!(outcome, LockOutcome::Stale, "contended lock by superseded {}#{}", old.id, old.token);
    assert_eq!(get(&h, free[0].id).await, free[0], "a stale holder wrote row {}", free[0].id);
    assert_eq!(get(&h, busy_lease.id).await, busy_before, "a stale holder wrote row {}", busy_lease.id);
    assert_eq!(get(&h, parent.id).await, parent_before, "a stale holder wrote main row {}", parent.id);
}

/// Reset-and-retry keeps the owner, clears the token and expiry, sets `not_before` to now + the delay, leaves
/// `last_processed_at` and the status alone, and releases the related rows locked with the token.
pub async fn reset_for_retry_keeps_the_owner_and_releases_the_lease_and_related_locks<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(Duration::from_secs(1));
    let before = now(&h).await;
    assert!(reset_for_retry(&h, lease).await, "reset of held lease {}#{}", lease.id, lease.token);
    let after = now(&h).await;
    let stored = get(&h, parent.id).await;
    assert_eq!(stored.lock_owner.as_deref(), Some(PARENT_PIPELINE), "owner of reset row {}", parent.id);
    assert_eq!(stored.lock_token, None, "token of reset row {}", parent.id);
    assert_eq!(stored.lock_expires_at, None, "expiry of reset row {}", parent.id);
    assert_eq!(stored.last_processed_at, parent.last_processed_at, "last_processed_at of reset row {}", parent.id);
    let retry = stored.not_before.expect("a reset row waits for its retry");
    assert_within(retry, before.plus(RETRY_DELAY), after.plus(RETRY_DELAY), "not_before of a reset row");
    assert_eq!(stored.status, parent.status, "status of reset row {}", parent.id);
    assert_eq!(refetch(&h, lease).await, None, "token {} survived its reset", lease.token);
    for child in &children {
        assert_unlocked(&get(&h, child.id).await);
    }
    let leased = fetch(&h, CHILD_PIPELINE, "job").await;
    assert_eq!(sorted(ids(&leased)), ids(&children), "released children are taken at once");
}

/// Reset-and-retry of a lease that is no longer held returns false and writes nothing.
pub async fn reset_for_retry_of_a_lease_no_longer_held_writes_nothing<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let old = lease_single(&h, CHILD_PIPELINE, &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "other", &row).await;
    let held = get(&h, row.id).await;
    h.advance(Duration::from_secs(1));
    assert!(!reset_for_retry(&h, old).await, "reset of superseded {}#{}", old.id, old.token);
    assert_eq!(get(&h, row.id).await, held, "a stale reset wrote row {}", row.id);
    assert!(reset_for_retry(&h, new).await, "reset of held lease {}#{}", new.id, new.token);
    let reset = get(&h, row.id).await;
    assert!(!reset_for_retry(&h, new).await, "a second reset of {}#{}", new.id, new.token);
    assert_eq!(get(&h, row.id).await, reset, "a second reset wrote row {}", row.id);
}

async fn lock_and_read<H: Harness>(h: &H, holder: Lease, related: &[RowId], owner: &str) -> LockRead {
    let params = lock_params(holder, related, owner);
    let what = format!("lock_related_and_read {}#{} {owner}", holder.id, holder.token);
    h.store().lock_related_and_read(params).await.expect(&what)
}

/// A lock that is taken brings back the related rows as it left them: by id, each once however often named,
/// each as a read of it right after returns it (locked with the holder's token and owner).
pub async fn lock_related_and_read_returns_the_rows_it_locked<H: Harness>(h: H) {
    let (parent, children) = family(&h, 3).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let related = [children[2].id, children[0].id, children[1].id, children[0].id];
    let LockRead::Locked(rows) = lock_and_read(&h, lease, &related, PARENT_PIPELINE).await else {
        panic!("children of {} are free", parent.id)
    };
    assert_eq!(ids(&rows), sorted(ids(&children)), "the locked rows, by id, each once");
    for row in &rows {
        assert_eq!(*row, get(&h, row.id).await, "row {} as the lock left it", row.id);
        assert_eq!(row.lock_token, Some(lease.token), "token of related row {}", row.id);
        assert_eq!(row.lock_owner.as_deref(), Some(PARENT_PIPELINE), "owner of related row {}", row.id);
    }
}

/// A contended lock reads nothing and resets the holder's lease for retry, as `lock_related_or_reset` does; a
/// stale holder's reads nothing and writes nothing.
pub async fn lock_related_and_read_resets_when_contended_and_is_stale_for_a_stale_holder<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 1).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let outcome = lock_and_read(&h, lease, &[free[0].id, busy_lease.id], PARENT_PIPELINE).await;
    assert_eq!(
        outcome,
        LockRead::Reset { held: true, by_own_pipeline: false },
        "row {} is leased by {CHILD_PIPELINE}",
        busy_lease.id
    );
    let reset = get(&h, parent.id).await;
    assert_eq!(reset.lock_token, None, "the contended holder {} was not reset", parent.id);
    assert_eq!(reset.lock_owner.as_deref(), Some(PARENT_PIPELINE), "a reset keeps the owner of {}", parent.id);
    let free_before = get(&h, free[0].id).await;
    let outcome = lock_and_read(&h, lease, &[free[0].id], PARENT_PIPELINE).await;
    assert_eq!(outcome, LockRead::Stale, "lock by {}#{}, reset already", lease.id, lease.token);
    assert_eq!(get(&h, free[0].id).await, free_before, "a stale holder wrote row {}", free[0].id);
}

/// The two steps of a contended [`Store::lock_related_or_reset`] (and of `lock_related_and_read`) as PgStore and
/// the simulator's network store run them ([`Store::lock_related_until`], then [`Store::reset_for_retry`]), with
/// the holder's lease lost between them (it expired and its pipeline fetched the row again): the reset finds the
/// lease gone and writes nothing, so the new lease stands, with no retry time; the intent marks the lock left stay
/// until they expire or the row's own pipeline takes the row (docs/simulator.md, "Atomic units").
pub async fn a_reset_after_the_contended_holder_lost_its_lease_writes_nothing<H: Harness>(h: H) {
    let parent = insert(&h, "operation").await;
    let (busy_lease, free) = busy_child_then_free_ones(&h, &parent, 1).await;
    let lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    let params = lock_params(lease, &[free[0].id, busy_lease.id], PARENT_PIPELINE);
    let (outcome, _) = h.store().lock_related_until(params).await.expect("lock_related_until");
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased", busy_lease.id);
    // Between the steps: the holder stalls past its lease, and its pipeline takes the parent again.
    h.advance(past(LEASE_TTL));
    let again = lease_single(&h, PARENT_PIPELINE, &parent).await;
    assert_ne!(again.token, lease.token, "a new lease on {}", parent.id);
    let marked = get(&h, free[0].id).await;
    let held = h.store().reset_for_retry(lease, RETRY_DELAY).await.expect("reset_for_retry");
    assert!(!held, "the reset of {}#{} found the lease held after it was taken again", lease.id, lease.token);
    let row = get(&h, parent.id).await;
    assert_eq!(row.lock_token, Some(again.token), "the new lease on {} stands", parent.id);
    assert_eq!(row.not_before, None, "the new lease on {} got a retry time", parent.id);
    assert_eq!(get(&h, free[0].id).await, marked, "the reset wrote row {} the lock marked", free[0].id);
    assert_eq!(marked.lock_owner.as_deref(), Some(PARENT_PIPELINE), "the intent mark on {}", free[0].id);
    assert_eq!(marked.lock_token, None, "row {} was locked by a contended lock", free[0].id);
}
