//! Retention ([`Store::purge`]): which finished rows go, with what, and which stay.

use super::*;
use crate::store::{NewEvent, PURGE_LIMIT_MAX, PurgeParams, RowUpdate, StoreError};

/// The age of the cases' rule.
const AGE: Duration = Duration::from_secs(3600);

fn rule(kind: &str, limit: usize) -> PurgeParams {
    PurgeParams {
        kind: kind.to_string(),
        statuses: vec!["done".to_string()],
        older_than: AGE,
        limit,
        parent_statuses: Vec::new(),
    }
}

async fn purge<H: Harness>(h: &H, params: PurgeParams) -> usize {
    let what = format!("purge of {}", params.kind);
    h.store().purge(params).await.expect(&what)
}

async fn exists<H: Harness>(h: &H, id: RowId) -> bool {
    h.store().get(id).await.expect("get").is_some()
}

/// Inserts a row of `kind` in `done`.
async fn done<H: Harness>(h: &H, kind: &str) -> Row {
    insert_new(h, NewRow::new(kind, "done", json!({}))).await
}

/// A finished row of the kind and status the rule names, past its age, goes with its events; a row of another
/// status or kind stays.
pub async fn purge_deletes_old_finished_rows_of_its_kind_with_their_events<H: Harness>(h: H) {
    let finished = insert(&h, "job").await;
    let lease = lease_single(&h, CHILD_PIPELINE, &finished).await;
    let mut params = ApplyParams::new(lease, RowUpdate { status: Some("done".into()), data: None });
    params.events = vec![NewEvent { row_id: finished.id, kind: "finished".into(), data: json!({}) }];
    applied_now(&apply(&h, params).await, lease);
    assert_eq!(h.store().events(finished.id).await.expect("events").len(), 1);
    let ready = insert(&h, "job").await;
    let other_kind = done(&h, "node").await;
    h.advance(past(AGE));
    assert_eq!(purge(&h, rule("job", 100)).await, 1, "rows deleted");
    assert!(!exists(&h, finished.id).await, "the finished job {} is still there", finished.id);
    assert!(h.store().events(finished.id).await.expect("events").is_empty(), "its events outlived it");
    assert!(exists(&h, ready.id).await, "a job in another status was deleted");
    assert!(exists(&h, other_kind.id).await, "a row of another kind was deleted");
    assert_eq!(purge(&h, rule("job", 100)).await, 0, "a second call found more");
}

/// A row younger than the rule's age stays; it goes once the age has passed.
pub async fn purge_keeps_rows_younger_than_its_age<H: Harness>(h: H) {
    let row = done(&h, "job").await;
    h.advance(AGE - Duration::from_secs(10));
    assert_eq!(purge(&h, rule("job", 100)).await, 0, "a row younger than the age was deleted");
    h.advance(Duration::from_secs(20));
    assert_eq!(purge(&h, rule("job", 100)).await, 1);
    assert!(!exists(&h, row.id).await);
}

/// A leased row stays until its lease has expired, and a row its pipeline reset for retry (an owner mark with no
/// expiry) stays for good: someone may still write it.
pub async fn purge_keeps_a_leased_or_marked_row<H: Harness>(h: H) {
    let leased = done(&h, "job").await;
    let marked = done(&h, "job").await;
    h.advance(past(AGE));
    let params = FetchParams { statuses: vec!["done".into()], ..fetch_params(CHILD_PIPELINE, "job") };
    let rows = fetch_with(&h, params).await;
    assert_eq!(sorted(ids(&rows)), vec![leased.id, marked.id], "both rows leased");
    let reset = lease_of(rows.iter().find(|row| row.id == marked.id).expect("leased"));
    assert!(reset_for_retry(&h, reset).await);
    assert_eq!(purge(&h, rule("job", 100)).await, 0, "a row under a live lease or a reset mark was deleted");
    h.advance(past(LEASE_TTL));
    assert_eq!(purge(&h, rule("job", 100)).await, 1, "an expired lease kept its row");
    assert!(!exists(&h, leased.id).await);
    assert!(exists(&h, marked.id).await, "a row with its pipeline's reset mark was deleted");
}

/// A parent stays while any row names it as its parent, whatever the child's kind: its children go first.
pub async fn purge_keeps_a_parent_until_its_children_are_gone<H: Harness>(h: H) {
    let parent = done(&h, "operation").await;
    let child = insert_new(&h, NewRow::new("job", "done", json!({})).with_parent(parent.id)).await;
    h.advance(past(AGE));
    assert_eq!(purge(&h, rule("operation", 100)).await, 0, "a parent with a child was deleted");
    assert_eq!(purge(&h, rule("job", 100)).await, 1);
    assert!(!exists(&h, child.id).await);
    assert_eq!(purge(&h, rule("operation", 100)).await, 1, "a parent whose children are gone stayed");
    assert!(!exists(&h, parent.id).await);
}

/// One call deletes at most its limit, oldest id first.
pub async fn purge_deletes_at_most_its_limit_oldest_first<H: Harness>(h: H) {
    let rows = [done(&h, "job").await, done(&h, "job").await, done(&h, "job").await];
    h.advance(past(AGE));
    assert_eq!(purge(&h, rule("job", 2)).await, 2);
    assert!(!exists(&h, rows[0].id).await && !exists(&h, rows[1].id).await, "the oldest two were not the ones");
    assert!(exists(&h, rows[2].id).await);
    assert_eq!(purge(&h, rule("job", 2)).await, 1);
}

/// Parameters the rule cannot mean are refused, naming the field, and nothing is deleted.
pub async fn purge_refuses_an_empty_kind_or_status_and_a_limit_out_of_range<H: Harness>(h: H) {
    let row = done(&h, "job").await;
    h.advance(past(AGE));
    let refused = |params: PurgeParams, field: &'static str| {
        let store = h.store();
        async move {
            match store.purge(params).await {
                Err(StoreError::Invalid(message)) => assert!(message.contains(field), "{message} names no {field}"),
                other => panic!("a purge with a bad {field} returned {other:?}"),
            }
        }
    };
    refused(PurgeParams { statuses: Vec::new(), ..rule("job", 10) }, "statuses").await;
    refused(PurgeParams { kind: String::new(), ..rule("job", 10) }, "kind").await;
    refused(PurgeParams { statuses: vec![String::new()], ..rule("job", 10) }, "status").await;
    refused(PurgeParams { parent_statuses: vec![String::new()], ..rule("job", 10) }, "parent status").await;
    refused(rule("job", 0), "limit").await;
    refused(rule("job", PURGE_LIMIT_MAX + 1), "limit").await;
    assert!(exists(&h, row.id).await, "a refused purge deleted a row");
}

/// A purge racing child inserts never leaves a child whose parent is gone (DESIGN §2, "Parents"): each insert under
/// a finished, old parent either goes in and keeps its parent (the purge passes over a parent while a child is
/// being inserted under it, then sees the child), or is refused with `Invalid` because the purge deleted the parent
/// first. On PostgreSQL the calls run at once on the pool's connections, so some inserts overlap a purge's
/// transaction (without the parent foreign key, a purge that could not see an uncommitted child deleted its
/// parent, and every insert after the purge went in under a parent that was gone).
pub async fn a_purge_racing_child_inserts_never_leaves_an_orphan<H: Harness>(h: H) {
    const PARENTS: usize = 40;
    let mut parents = Vec::with_capacity(PARENTS);
    for _ in 0..PARENTS {
        parents.push(done(&h, "operation").await.id);
    }
    h.advance(past(AGE));
    let store = h.store();
    // A purge of a few parents after every few inserts, all in flight together.
    let inserts = parents.iter().map(|parent| async move {
        (*parent, store.insert(NewRow::new("job", READY, json!({})).with_parent(*parent)).await)
    });
    let purges = (0..PARENTS / 4).map(|_| async move { store.purge(rule("operation", 4)).await.expect("purge") });
    let (inserted, _) = tokio::join!(futures_util::future::join_all(inserts), futures_util::future::join_all(purges));
    let (mut kept, mut refused) = (0, 0);
    for (parent, outcome) in inserted {
        match outcome {
            Ok(child) => {
                kept += 1;
                assert!(exists(&h, parent).await, "child {} went in, and its parent {parent} is gone", child.id);
            }
            Err(StoreError::Invalid(message)) => {
                refused += 1;
                assert!(message.contains(&format!("parent_id {parent} names no row")), "{message}");
                assert!(!exists(&h, parent).await, "an insert under {parent} was refused, and the parent is there");
            }
            Err(other) => panic!("an insert under {parent} failed: {other}"),
        }
    }
    assert_eq!(kept + refused, PARENTS);
    for child in store.list("job", None).await.expect("list") {
        let parent = child.parent_id.expect("every job has a parent");
        assert!(exists(&h, parent).await, "job {} names its parent {parent}, which is gone", child.id);
    }
    // Every parent left either keeps a child or was passed over; a purge now deletes only the childless ones.
    let left = store.list("operation", None).await.expect("list").len();
    assert_eq!(left - purge(&h, rule("operation", 100)).await, kept, "parents left with a child");
}

/// With parent statuses, a row goes only while its parent is in one of them: children of a finished parent go,
/// children of a running one and parentless rows stay, and a child goes once its parent has finished.
pub async fn purge_with_parent_statuses_deletes_only_children_of_a_parent_in_one_of_them<H: Harness>(h: H) {
    let finished = insert_new(&h, NewRow::new("operation", "completed", json!({}))).await;
    let running = insert(&h, "operation").await;
    let of_finished = insert_new(&h, NewRow::new("job", "done", json!({})).with_parent(finished.id)).await;
    let of_running = insert_new(&h, NewRow::new("job", "done", json!({})).with_parent(running.id)).await;
    let parentless = done(&h, "job").await;
    h.advance(past(AGE));
    let params = PurgeParams { parent_statuses: vec!["completed".into(), "failed".into()], ..rule("job", 100) };
    assert_eq!(purge(&h, params.clone()).await, 1, "only the child of the finished operation");
    assert!(!exists(&h, of_finished.id).await, "job {} of a finished operation stayed", of_finished.id);
    assert!(exists(&h, of_running.id).await, "job {} of a running operation was deleted", of_running.id);
    assert!(exists(&h, parentless.id).await, "a job without a parent was deleted");
    let lease = lease_single(&h, PARENT_PIPELINE, &running).await;
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::status("failed"))).await, lease);
    assert_eq!(purge(&h, params).await, 1, "the child of the operation that has failed since");
    assert!(!exists(&h, of_running.id).await);
}
