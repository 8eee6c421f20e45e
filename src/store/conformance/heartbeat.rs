//! Heartbeat: extending held leases and their related locks ([`Store::heartbeat`]; dstack PIPELINES, Overview,
//! "A heartbeater tracks all rows"; DESIGN §3).

use super::*;
use crate::store::{HeartbeatParams, RowUpdate};

async fn heartbeat<H: Harness>(h: &H, leases: Vec<Lease>, lease_ttl: Duration) -> Vec<Lease> {
    let params = HeartbeatParams { leases, lease_ttl };
    h.store().heartbeat(params).await.expect("heartbeat")
}

/// A heartbeat moves a held lease's expiry to `now + lease_ttl` (the ttl it is given), so the row stays leased
/// past its first expiry.
pub async fn heartbeat_extends_held_leases_to_now_plus_ttl<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    h.advance(LEASE_TTL / 2);
    let longer = LEASE_TTL * 2;
    let before = now(&h).await;
    let held = heartbeat(&h, vec![lease], longer).await;
    let after = now(&h).await;
    assert_eq!(held, vec![lease], "a held lease is returned");
    let expires = get(&h, row.id).await.lock_expires_at.expect("a leased row has an expiry");
    assert_within(expires, before.plus(longer), after.plus(longer), "extended lock_expires_at");
    h.advance(past(LEASE_TTL));
    assert_eq!(ids(&fetch(&h, "other", "job").await), vec![], "row {} taken after its heartbeat", row.id);
    assert_eq!(refetch(&h, lease).await.map(|r| r.id), Some(row.id), "lease {} still held", lease.token);
}

/// Related rows locked with a lease's token get the same new expiry as the main row and stay locked past
/// their first expiry.
pub async fn heartbeat_extends_related_rows_with_their_main_lease<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(LEASE_TTL / 2);
    assert_eq!(heartbeat(&h, vec![lease], LEASE_TTL).await, vec![lease], "a held lease is returned");
    let expires = get(&h, parent.id).await.lock_expires_at;
    for child in &children {
        let stored = get(&h, child.id).await;
        assert_eq!(stored.lock_expires_at, expires, "expiry of related row {}", child.id);
        assert_eq!(stored.lock_token, Some(lease.token), "token of related row {}", child.id);
    }
    h.advance(past(LEASE_TTL / 2));
    assert_eq!(ids(&fetch(&h, CHILD_PIPELINE, "job").await), vec![], "a heartbeated child was taken");
}

/// Only leases still held come back; a superseded lease and a released one are dropped, and their rows are not
/// written.
pub async fn heartbeat_returns_only_held_leases_and_leaves_lost_ones_untouched<H: Harness>(h: H) {
    let kept = insert(&h, "job").await;
    let kept_lease = lease_single(&h, "jobs", &kept).await;
    let superseded = insert(&h, "node").await;
    let old = lease_single(&h, "nodes", &superseded).await;
    assert_eq!(h.store().release(vec![old]).await.expect("release"), 1, "release of {}", superseded.id);
    let new = lease_single(&h, "nodes", &superseded).await;
    let released = insert(&h, "task").await;
    let released_lease = lease_single(&h, "tasks", &released).await;
    assert_eq!(h.store().release(vec![released_lease]).await.expect("release"), 1);
    let superseded_before = get(&h, superseded.id).await;
    let released_before = get(&h, released.id).await;
    h.advance(Duration::from_secs(1));
    let held = heartbeat(&h, vec![kept_lease, old, released_lease], LEASE_TTL).await;
    assert_eq!(held, vec![kept_lease], "only {}#{} is held", kept.id, kept_lease.token);
    assert_eq!(get(&h, superseded.id).await, superseded_before, "a lost lease's heartbeat wrote row {}", superseded.id);
    assert_eq!(get(&h, released.id).await, released_before, "a released lease's heartbeat wrote row {}", released.id);
    let late = apply(&h, ApplyParams::new(old, RowUpdate::default())).await;
    assert_eq!(late, ApplyOutcome::Stale, "the dropped lease {}#{} still applies", old.id, old.token);
    applied_now(&apply(&h, ApplyParams::new(new, RowUpdate::default())).await, new);
}

/// An expired lease is gone even if no one took it over: its heartbeat returns it as not held and writes nothing,
/// so the row stays eligible for any fetcher (a node the controller declared lost must not come back
/// under the same session). Its related rows are not extended either. The guarded apply, whose guard is the
/// token, still accepts it (apply.rs).
pub async fn heartbeat_does_not_revive_an_expired_lease<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    h.advance(past(LEASE_TTL));
    let parent_before = get(&h, parent.id).await;
    let child_before = get(&h, children[0].id).await;
    assert_eq!(
        heartbeat(&h, vec![lease], LEASE_TTL).await,
        vec![],
        "the expired lease {}#{} is held",
        lease.id,
        lease.token
    );
    assert_eq!(get(&h, parent.id).await, parent_before, "an expired lease's heartbeat wrote row {}", parent.id);
    assert_eq!(
        get(&h, children[0].id).await,
        child_before,
        "an expired lease's heartbeat wrote row {}",
        children[0].id
    );
    let taken = fetch(&h, "other", &parent.kind).await;
    assert_eq!(ids(&taken), vec![parent.id], "row {} is not eligible after its expired lease's heartbeat", parent.id);
}

/// A heartbeat never moves an expiry earlier: after one with a long ttl, one with a short ttl leaves the main row
/// and its related rows as they were, and the lease is still held. The PostgreSQL fault this guards against: a
/// heartbeat that ran in a session left inside a transaction begun seconds before read an old `now()` and set a
/// node lease's expiry earlier than the one written, and the controller declared a live node lost (a cancelled
/// `BEGIN`; store/pg/session.rs). A shorter ttl is the same shape of write, and one both stores can be asked for.
pub async fn heartbeat_never_shortens_a_lease<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    assert_eq!(heartbeat(&h, vec![lease], LEASE_TTL * 4).await, vec![lease], "a held lease is returned");
    // The lease's columns, not the whole row: PostgreSQL's version (`xmin`) changes with every write of a tuple.
    let lease_of = |r: Row| (r.lock_expires_at, r.lock_token, r.lock_owner);
    let parent_long = lease_of(get(&h, parent.id).await);
    let child_long = lease_of(get(&h, children[0].id).await);
    h.advance(Duration::from_secs(1));
    assert_eq!(heartbeat(&h, vec![lease], LEASE_TTL / 4).await, vec![lease], "a held lease is returned");
    assert_eq!(lease_of(get(&h, parent.id).await), parent_long, "a shorter heartbeat moved row {}", parent.id);
    let child = lease_of(get(&h, children[0].id).await);
    assert_eq!(child, child_long, "a shorter heartbeat moved related row {}", children[0].id);
    h.advance(past(LEASE_TTL));
    assert_eq!(ids(&fetch(&h, "other", &parent.kind).await), vec![], "row {} taken inside its lease", parent.id);
    assert_eq!(refetch(&h, lease).await.map(|r| r.id), Some(parent.id), "lease {} still held", lease.token);
}
