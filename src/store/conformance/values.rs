//! Values PostgreSQL cannot store are refused by every backend alike, before anything is written (DESIGN §2, "Bad
//! values are refused before SQL"; `store::values`).

use super::*;
use crate::store::{KEY_TEXT_BYTES_MAX, NewEvent, RelatedUpdate, RowUpdate, StoreError};

fn assert_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>, naming: &str) {
    match result {
        Err(StoreError::Invalid(message)) => assert!(message.contains(naming), "{message} does not name {naming}"),
        other => panic!("expected Invalid naming {naming}, got {other:?}"),
    }
}

/// An insert with a NUL in a text column, a `\u0000` anywhere in its data, or a kind too long for the fetch
/// index is refused, and nothing is inserted.
pub async fn insert_refuses_nul_and_oversized_keys<H: Harness>(h: H) {
    let store = h.store();
    assert_invalid(store.insert(NewRow::new("jo\0b", READY, json!({}))).await, "kind");
    assert_invalid(store.insert(NewRow::new("job", "re\0ady", json!({}))).await, "status");
    assert_invalid(store.insert(NewRow::new("job", READY, json!({"a": ["x\u{0}"]}))).await, "data.a[0]");
    assert_invalid(store.insert(NewRow::new("job", READY, json!({"k\u{0}": 1}))).await, "key");
    let long = "k".repeat(KEY_TEXT_BYTES_MAX + 1);
    assert_invalid(store.insert(NewRow::new(long, READY, json!({}))).await, "kind");
    assert_eq!(store.list("job", None).await.expect("list"), vec![], "a refused insert left a row");
    insert_new(&h, NewRow::new("k".repeat(KEY_TEXT_BYTES_MAX), READY, json!({"ok": "\u{1}"}))).await;
}

/// An apply that would write a bad value (update, related update, insert or event) is refused and writes
/// nothing: the lease stays held, so the holder can still record a failure.
pub async fn apply_refuses_a_bad_value_and_keeps_the_lease<H: Harness>(h: H) {
    let (parent, children) = family(&h, 1).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    let bad_update = RowUpdate { status: None, data: Some(json!({"log": "a\u{0}b"})) };
    let cases = [
        ApplyParams::new(lease, bad_update.clone()),
        ApplyParams {
            related: vec![RelatedUpdate { id: children[0].id, update: bad_update }],
            ..ApplyParams::new(lease, RowUpdate::default())
        },
        ApplyParams {
            inserts: vec![NewRow::new("job", "\0", json!({}))],
            ..ApplyParams::new(lease, RowUpdate::default())
        },
        ApplyParams {
            events: vec![NewEvent { row_id: parent.id, kind: "ev\0".into(), data: json!({}) }],
            ..ApplyParams::new(lease, RowUpdate::default())
        },
    ];
    for params in cases {
        assert_invalid(h.store().apply(params).await, &format!("apply {}#{}", lease.id, lease.token));
    }
    assert!(refetch(&h, lease).await.is_some(), "a refused apply dropped lease {}", lease.token);
    assert_eq!(get(&h, parent.id).await.data, json!({}), "a refused apply wrote row {}", parent.id);
    assert_eq!(h.store().events(parent.id).await.expect("events"), vec![], "a refused apply appended an event");
}

/// A batch with one bad item fails whole and writes nothing (PostgreSQL aborts the transaction); the good items
/// still hold their leases.
pub async fn apply_batch_with_one_bad_item_writes_nothing<H: Harness>(h: H) {
    for _ in 0..3 {
        insert(&h, "job").await;
    }
    let leased = fetch(&h, "jobs", "job").await;
    let leases: Vec<Lease> = leased.iter().map(lease_of).collect();
    let mut batch: Vec<ApplyParams> =
        leases.iter().map(|lease| ApplyParams::new(*lease, RowUpdate::status("done"))).collect();
    batch[1].update = RowUpdate::status("do\0ne");
    assert_invalid(h.store().apply_batch(batch).await, &format!("apply {}#{}", leases[1].id, leases[1].token));
    for lease in leases {
        let row = refetch(&h, lease).await.unwrap_or_else(|| panic!("lease {} lost by a refused batch", lease.token));
        assert_eq!(row.status, READY, "a refused batch wrote row {}", row.id);
    }
}

/// A write API's update with a bad value is refused before it writes.
pub async fn update_unleased_refuses_a_bad_value<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let update = RowUpdate { status: Some("x".repeat(KEY_TEXT_BYTES_MAX + 1)), data: None };
    assert_invalid(h.store().update_unleased(row.id, update).await, "status");
    assert_eq!(get(&h, row.id).await, row, "a refused update wrote row {}", row.id);
}
