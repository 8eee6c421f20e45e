//! Batched refetch: the workers' loads by token in one call ([`Store::refetch_batch`]; DESIGN §3, Batching). Each
//! lease reads as [`Store::refetch`] would read it, in input order, and nothing is written.

use super::*;
use crate::store::RowUpdate;

async fn refetch_batch<H: Harness>(h: &H, leases: Vec<Lease>) -> Vec<Option<Row>> {
    let what: Vec<String> = leases.iter().map(|l| format!("{}#{}", l.id, l.token)).collect();
    h.store().refetch_batch(leases).await.unwrap_or_else(|e| panic!("refetch_batch [{}]: {e}", what.join(", ")))
}

/// Held leases read their rows; a superseded lease, an applied one and one of a missing row read `None`; a lease
/// given twice reads its row twice; outcomes keep the input order (not id order); no row changes.
pub async fn refetch_batch_reads_each_lease_as_refetch_would_in_input_order<H: Harness>(h: H) {
    let taken = insert(&h, "node").await;
    let old = lease_single(&h, "nodes", &taken).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "other", &taken).await;
    let (a, b, c) = (insert(&h, "job").await, insert(&h, "job").await, insert(&h, "job").await);
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(sorted(ids(&leased)), vec![a.id, b.id, c.id], "jobs was to lease every job row");
    let lease = |id: RowId| lease_of(leased.iter().find(|row| row.id == id).expect("leased"));
    let applied = lease(c.id);
    applied_now(&apply(&h, ApplyParams::new(applied, RowUpdate::status("done"))).await, applied);
    let missing = Lease { id: RowId(c.id.0 + 1_000), token: lease(a.id).token };
    let batch = vec![lease(b.id), old, lease(a.id), missing, lease(b.id), new, applied];
    let mut before = Vec::new();
    for id in [taken.id, a.id, b.id, c.id] {
        before.push(get(&h, id).await);
    }
    let rows = refetch_batch(&h, batch.clone()).await;
    assert_eq!(rows.len(), batch.len(), "one outcome per lease: {rows:?}");
    let read_ids: Vec<Option<RowId>> = rows.iter().map(|row| row.as_ref().map(|row| row.id)).collect();
    let expected = vec![Some(b.id), None, Some(a.id), None, Some(b.id), Some(taken.id), None];
    assert_eq!(read_ids, expected, "rows read for [b, superseded, a, missing, b, taken over, applied]");
    for (lease, row) in batch.iter().zip(&rows) {
        assert_eq!(*row, refetch(&h, *lease).await, "lease {}#{} read otherwise by refetch", lease.id, lease.token);
    }
    for row in before {
        assert_eq!(get(&h, row.id).await, row, "refetch_batch changed row {}", row.id);
    }
}

/// An empty batch reads nothing and succeeds.
pub async fn refetch_batch_of_no_leases_is_empty<H: Harness>(h: H) {
    insert(&h, "job").await;
    fetch(&h, "jobs", "job").await;
    assert_eq!(refetch_batch(&h, Vec::new()).await, Vec::<Option<Row>>::new());
}
