//! Fetch hints: the row mark and the broadcast ([`Store::hint`], [`Store::subscribe_hints`]; dstack PIPELINES,
//! checklist 8; DESIGN §2, PgStore `LISTEN/NOTIFY`).

use super::*;
use crate::store::{Hint, RowUpdate};
use tokio::sync::broadcast;

async fn hint<H: Harness>(h: &H, kind: &str, row: Option<RowId>) {
    h.store().hint(kind, row).await.expect("hint");
}

/// The next hint a subscriber receives, within [`HINT_WAIT`].
async fn next_hint(rx: &mut broadcast::Receiver<Hint>, which: &str) -> Hint {
    match tokio::time::timeout(HINT_WAIT, rx.recv()).await {
        Ok(Ok(kind)) => kind,
        Ok(Err(e)) => panic!("{which} subscriber: {e}"),
        Err(_) => panic!("{which} subscriber got no hint within {HINT_WAIT:?}"),
    }
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
