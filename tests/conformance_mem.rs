//! The store conformance suite (`lockstep::store::conformance`) against MemStore on a manual clock.

use lockstep::store::conformance::Harness;
use lockstep::store::{ManualClock, MemStore, Timestamp};
use std::time::Duration;

/// A fresh MemStore and the manual clock it reads.
struct MemHarness {
    store: MemStore,
    clock: ManualClock,
}

impl Harness for MemHarness {
    type S = MemStore;

    fn store(&self) -> &MemStore {
        &self.store
    }

    fn advance(&self, span: Duration) {
        self.clock.advance(span);
    }
}

async fn mem_harness() -> MemHarness {
    let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
    MemHarness { store: MemStore::new(clock.clone()), clock }
}

lockstep::conformance_tests!(mem_harness());

/// MemStore's look at a simulated replica for `[faults] pause_inside_pass`: a live lease of the caller's own
/// fetch under which related rows are locked; not before its related lock, not another caller's, not once
/// applied or expired.
#[tokio::test]
async fn a_callers_lease_in_pass_is_its_own_live_lease_past_its_related_locks() {
    use lockstep::store::{ApplyParams, FetchParams, Lease, LockOutcome, LockRelatedParams, NewRow, RowUpdate, Store};
    let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
    let db = MemStore::with_history(clock.clone());
    let (mine, theirs) = (db.as_caller("replica-0"), db.as_caller("replica-1"));
    let job = || NewRow::new("job", "ready", serde_json::json!({}));
    let (row, spare, child) =
        (db.insert(job()).await.unwrap(), db.insert(job()).await.unwrap(), db.insert(job()).await.unwrap());
    let ttl = Duration::from_secs(10);
    let fetch = FetchParams {
        pipeline: "jobs".into(),
        kind: "job".into(),
        statuses: vec!["ready".into()],
        limit: 1,
        lease_ttl: ttl,
        min_processing_interval: Duration::ZERO,
        retry_delay: Duration::from_secs(5),
    };
    assert_eq!(mine.lease_in_pass("replica-0"), None, "no lease yet");
    let leased = mine.fetch(fetch.clone()).await.unwrap();
    let lease = Lease { id: leased[0].id, token: leased[0].lock_token.unwrap() };
    assert_eq!(lease.id, row.id);
    assert_eq!(mine.lease_in_pass("replica-0"), None, "no related lock yet");
    let lock = |holder: Lease, related| LockRelatedParams {
        holder,
        related: vec![related],
        owner: "jobs".into(),
        lease_ttl: ttl,
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(mine.lock_related(lock(lease, child.id)).await.unwrap(), LockOutcome::Locked);
    assert_eq!(mine.lease_in_pass("replica-0"), Some(lease));
    assert_eq!(mine.lease_in_pass("replica-1"), None, "another caller's lease");
    // The other replica's pass, past its own related lock, is its own.
    let other = theirs.fetch(fetch.clone()).await.unwrap();
    let other = Lease { id: other[0].id, token: other[0].lock_token.unwrap() };
    assert_eq!(other.id, spare.id);
    let grandchild = db.insert(job()).await.unwrap();
    assert_eq!(theirs.lock_related(lock(other, grandchild.id)).await.unwrap(), LockOutcome::Locked);
    assert_eq!(theirs.lease_in_pass("replica-1"), Some(other));
    assert_eq!(mine.lease_in_pass("replica-0"), Some(lease));
    mine.apply(ApplyParams::new(lease, RowUpdate::status("done"))).await.unwrap();
    assert_eq!(mine.lease_in_pass("replica-0"), None, "applied: the pass is over");
    clock.advance(ttl + Duration::from_secs(1));
    assert_eq!(theirs.lease_in_pass("replica-1"), None, "expired");
    assert_eq!(MemStore::new(clock.clone()).lease_in_pass("replica-0"), None, "no history");
}
