//! The fetch query uses an index, not a sequential scan of the resource table, when most rows are finished
//! (DESIGN §2: "Indexes serve the fetch"), its index scan does not walk leased rows, a batched refetch reuses
//! its cached plan, an apply locks rows before writing them only when its lease holds related rows, and the next
//! expiry reads one index entry per status however many leases are live. Needs PostgreSQL (see `support::pg`;
//! never skips).

#![cfg(not(madsim))]

use crate::support;

use lockstep::store::conformance::Harness;
use lockstep::store::{
    ApplyOutcome, ApplyParams, FetchParams, Lease, LockOutcome, LockRelatedParams, NewRow, RowUpdate, Store,
};
use std::time::Duration;
use support::pg::PgHarness;

/// Finished rows in the table: enough that a sequential scan costs far more than an index scan.
const FINISHED_ROWS: usize = 100_000;
/// Rows the fetch can take.
const READY_ROWS: usize = 5;

fn fetch_params() -> FetchParams {
    FetchParams {
        pipeline: "jobs".into(),
        kind: "job".into(),
        statuses: vec!["ready".into()],
        limit: 10,
        lease_ttl: Duration::from_secs(30),
        min_processing_interval: Duration::from_secs(60),
        retry_delay: Duration::from_secs(5),
    }
}

async fn plan_text(h: &PgHarness, params: &FetchParams) -> String {
    let plan = h.store().explain_fetch(params).await.expect("explain the fetch");
    plan.join("\n")
}

/// The generic plan: what a connection reuses after five fetches (PgStore caches plans; the fetch's limit is in
/// its text so that this plan can see it).
async fn generic_plan_text(h: &PgHarness, params: &FetchParams) -> String {
    let plan = h.store().explain_fetch_generic(params).await.expect("explain the fetch's generic plan");
    plan.join("\n")
}

fn assert_index_scan(plan: &str) {
    assert!(!plan.contains("Seq Scan on resources"), "the fetch scans the whole resource table:\n{plan}");
    assert!(plan.contains("resources_fetch_idx"), "the fetch does not use resources_fetch_idx:\n{plan}");
}

#[tokio::test]
async fn fetch_among_many_finished_rows_uses_the_fetch_index_not_a_seq_scan() {
    let h = PgHarness::new().await;
    let store = h.store();
    let finished = (0..FINISHED_ROWS).map(|i| NewRow::new("job", "done", serde_json::json!({ "i": i }))).collect();
    let ids = store.insert_many(finished, Vec::new()).await.expect("insert finished rows");
    assert_eq!(ids.len(), FINISHED_ROWS);
    let ready = (0..READY_ROWS).map(|_| NewRow::new("job", "ready", serde_json::json!({}))).collect();
    let ready = store.insert_many(ready, Vec::new()).await.expect("insert ready rows");

    let one_status = plan_text(&h, &fetch_params()).await;
    assert_index_scan(&one_status);
    assert!(
        !one_status.contains("Sort Key: resources."),
        "a one-status fetch sorts the rows it scans instead of reading the index in order:\n{one_status}"
    );
    let generic = generic_plan_text(&h, &fetch_params()).await;
    assert_index_scan(&generic);
    assert!(!generic.contains("Sort Key: resources."), "the generic one-status plan sorts:\n{generic}");
    let mut two_statuses = fetch_params();
    two_statuses.statuses.push("retrying".into());
    assert_index_scan(&plan_text(&h, &two_statuses).await);

    // The plan is the fetch's: running it leases exactly the ready rows.
    let leased = store.fetch(fetch_params()).await.expect("fetch");
    let leased: Vec<_> = leased.iter().map(|row| row.id).collect();
    assert_eq!(leased, ready, "the fetch leased other rows than the ready ones");
}

/// Leased rows are out of the fetch index's range (`migrations/0004_fetch_index_unleased.sql`): with a
/// thousand rows of the fetched status under lease, the fetch's scan of `resources_fetch_idx` meets only rows it
/// can take (none removed by its filter), and expired leases come from `resources_lease_expiry_idx`. Before, the
/// scan walked every leased row, first in fetch order, before the first eligible one.
#[tokio::test]
async fn fetch_under_many_leases_reads_no_leased_row_from_the_fetch_index() {
    let h = PgHarness::new().await;
    let store = h.store();
    let finished = (0..FINISHED_ROWS).map(|i| NewRow::new("job", "done", serde_json::json!({ "i": i }))).collect();
    store.insert_many(finished, Vec::new()).await.expect("insert finished rows");
    const LEASED: usize = 1_000;
    let ready = (0..LEASED + READY_ROWS).map(|_| NewRow::new("job", "ready", serde_json::json!({}))).collect();
    let ready = store.insert_many(ready, Vec::new()).await.expect("insert ready rows");
    let leased = store.fetch(FetchParams { limit: LEASED, ..fetch_params() }).await.expect("lease the first rows");
    assert_eq!(leased.len(), LEASED);

    let plan = store.explain_analyze_fetch_generic(&fetch_params()).await.expect("explain analyze the fetch");
    let plan = plan.join("\n");
    assert_index_scan(&plan);
    assert!(plan.contains("resources_lease_expiry_idx"), "expired leases are not read from their index:\n{plan}");
    let fetch_scan = index_scan_block(&plan, "resources_fetch_idx");
    assert!(fetch_scan.contains(&format!("rows={READY_ROWS} loops=")), "the scan returned other rows:\n{fetch_scan}");
    assert!(!fetch_scan.contains("Rows Removed by Filter"), "the scan walked leased rows:\n{fetch_scan}");

    // The explained fetch was rolled back: the unleased rows are still there to take, and only they.
    let taken = store.fetch(FetchParams { limit: LEASED, ..fetch_params() }).await.expect("fetch");
    let taken: Vec<_> = taken.iter().map(|row| row.id).collect();
    assert_eq!(taken, ready[LEASED..], "the fetch took other rows than the unleased ones");
}

/// The lines of `plan` from the index scan of `index` up to the next plan node.
fn index_scan_block<'a>(plan: &'a str, index: &str) -> &'a str {
    let start =
        plan.find(&format!("Index Scan using {index}")).unwrap_or_else(|| panic!("no scan of {index}:\n{plan}"));
    let rest = &plan[start..];
    let end = rest[1..].find("->").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// A batched refetch of a few leases runs the cached generic plan after five calls, as a single refetch does,
/// instead of planning at every call (`REFETCH_BATCH_LEN_MIN` in src/store/pg/sql.rs).
#[tokio::test]
async fn refetch_batch_of_a_few_leases_reuses_a_generic_plan() {
    use lockstep::store::Lease;
    // One connection, so that every call and the plan counts share one session.
    let h = PgHarness::with(|options| options.max_connections = 1).await;
    let store = h.store();
    // A table of a real pipeline's size: on a handful of rows every plan costs next to nothing.
    let finished = (0..FINISHED_ROWS).map(|i| NewRow::new("job", "done", serde_json::json!({ "i": i }))).collect();
    store.insert_many(finished, Vec::new()).await.expect("insert finished rows");
    let ready = (0..3).map(|_| NewRow::new("job", "ready", serde_json::json!({}))).collect();
    store.insert_many(ready, Vec::new()).await.expect("insert ready rows");
    let leased = store.fetch(fetch_params()).await.expect("fetch");
    assert_eq!(leased.len(), 3);
    let leases: Vec<Lease> =
        leased.iter().map(|row| Lease { id: row.id, token: row.lock_token.expect("leased") }).collect();
    const CALLS: i64 = 8;
    for _ in 0..CALLS {
        let rows = store.refetch_batch(leases[..2].to_vec()).await.expect("refetch_batch");
        assert_eq!(rows, vec![Some(leased[0].clone()), Some(leased[1].clone())]);
    }
    let (generic, custom) = store.refetch_batch_plans().await.expect("plan counts").expect("the statement prepared");
    assert_eq!(generic + custom, CALLS, "plans of {CALLS} calls");
    assert!(generic >= CALLS - 5, "{generic} generic and {custom} custom plans in {CALLS} calls");
}

/// The rows the apply's `locked` step locked before any write (its `LockRows` node), from `EXPLAIN ANALYZE`.
/// The rows the `LockRows` node of `plan` returned (locked before the write), 0 when it has none.
fn rows_locked_first(plan: &[String]) -> usize {
    let Some(node) = plan.iter().find(|line| line.contains("LockRows")) else { return 0 };
    let rows = node.split("rows=").nth(1).and_then(|rest| rest.split(' ').next());
    rows.and_then(|rows| rows.parse().ok()).unwrap_or_else(|| panic!("no actual rows in {node:?}:\n{plan:#?}"))
}

/// An apply of a lease that holds no related rows (every apply of the per-item mode) writes its row with one
/// plain `UPDATE`, which locks the row itself: one statement, no separate row lock first (a heap write and a WAL
/// record per item) and no CTEs. A lease that holds related rows runs that statement, which writes
/// nothing, and then the one that locks every row it holds in id order before writing any (DESIGN §2, one lock
/// order). Both applies then write what they did before.
#[tokio::test]
async fn an_apply_locks_first_only_the_rows_of_a_lease_that_holds_related_rows() {
    let h = PgHarness::new().await;
    let store = h.store();
    let rows = (0..4).map(|_| NewRow::new("job", "ready", serde_json::json!({}))).collect();
    let ids = store.insert_many(rows, Vec::new()).await.expect("insert rows");
    let leased = store.fetch(FetchParams { limit: 2, ..fetch_params() }).await.expect("lease two rows");
    let lease = |i: usize| Lease { id: leased[i].id, token: leased[i].lock_token.expect("a leased row has a token") };
    let (alone, parent) = (lease(0), lease(1));
    let related = vec![ids[2], ids[3]];
    let lock = LockRelatedParams {
        holder: parent,
        related,
        owner: "jobs".into(),
        lease_ttl: Duration::from_secs(30),
        retry_delay: std::time::Duration::from_millis(500),
        park: false,
    };
    assert_eq!(store.lock_related(lock).await.expect("lock related rows"), LockOutcome::Locked);
    let done = || RowUpdate { status: Some("done".into()), data: None };

    let plans = store.explain_analyze_apply(alone, done()).await.expect("explain the apply of a lone lease");
    assert_eq!(plans.len(), 1, "the lone lease's apply ran more than one statement:\n{plans:#?}");
    assert!(plans[0][0].starts_with("Update on resources"), "not a plain UPDATE:\n{plans:#?}");
    assert_eq!(rows_locked_first(&plans[0]), 0, "the lone lease's apply locked its row before writing it:\n{plans:#?}");
    let plans = store.explain_analyze_apply(parent, done()).await.expect("explain the apply of the parent");
    assert_eq!(plans.len(), 2, "the parent's apply did not fall back to its second statement:\n{plans:#?}");
    assert_eq!(rows_locked_first(&plans[0]), 0, "the parent's first statement locked rows:\n{plans:#?}");
    assert_eq!(rows_locked_first(&plans[1]), 3, "the parent's apply did not lock its three rows first:\n{plans:#?}");

    // The explained applies were rolled back; the applies themselves write and unlock as before.
    for lease in [alone, parent] {
        let outcome = store.apply(ApplyParams::new(lease, done())).await.expect("apply");
        assert!(matches!(outcome, ApplyOutcome::Applied { .. }), "{lease:?}: {outcome:?}");
        let row = store.get(lease.id).await.expect("get").expect("the row");
        assert_eq!((row.status.as_str(), row.lock_token), ("done", None));
    }
    for id in &ids[2..] {
        let row = store.get(*id).await.expect("get").expect("a related row");
        assert_eq!((row.status.as_str(), row.lock_token), ("ready", None), "a related row is still locked");
    }
}

/// The next expiry reads one entry of `resources_lease_expiry_idx` per status asked, however many leases are live
/// (`NEXT_EXPIRY` in src/store/pg/sql.rs): its generic plan, explained with few and then with many live
/// leases on the rows it looks at, returns at most one index entry per status and reads no more pages with many
/// leases than with few, but for one more level of the index and one more leaf page per status (a descent may land
/// at the end of a leaf and step to the next). A fetcher runs it after every empty
/// fetch; the statement before read every live lease's entry (`status = ANY($3)` kept PostgreSQL from reading the
/// index in order), 3.7–4.2 ms a call at 30 000 live leases.
#[tokio::test]
async fn next_expiry_reads_one_index_entry_per_status_however_many_leases_are_live() {
    const FEW: usize = 10;
    const MANY: usize = 5_000;
    let h = PgHarness::new().await;
    let store = h.store();
    let ready = (0..MANY).map(|_| NewRow::new("job", "ready", serde_json::json!({}))).collect();
    store.insert_many(ready, Vec::new()).await.expect("insert ready rows");
    let retrying = (0..FEW).map(|_| NewRow::new("job", "retrying", serde_json::json!({}))).collect();
    store.insert_many(retrying, Vec::new()).await.expect("insert retrying rows");
    let lease = |status: &str, limit: usize| {
        let params = FetchParams {
            pipeline: "long".into(),
            statuses: vec![status.into()],
            limit,
            lease_ttl: Duration::from_secs(3600),
            ..fetch_params()
        };
        async move {
            let leased = store.fetch(params).await.expect("lease rows");
            assert_eq!(leased.len(), limit, "leased other than {limit} rows");
        }
    };
    lease("retrying", FEW).await;
    lease("ready", FEW).await;
    // The pipeline that would run the next expiry after an empty fetch: both statuses, and one of them again.
    let asked = FetchParams { statuses: vec!["ready".into(), "retrying".into(), "ready".into()], ..fetch_params() };
    let statuses = asked.statuses.len();
    let few_plan = store.explain_analyze_next_expiry_generic(&asked).await.expect("explain the next expiry").join("\n");
    let few = expiry_index_reads(&few_plan);
    lease("ready", MANY - FEW).await;
    let many_plan =
        store.explain_analyze_next_expiry_generic(&asked).await.expect("explain the next expiry").join("\n");
    let many = expiry_index_reads(&many_plan);

    for (leases, reads, plan) in [(2 * FEW, few, &few_plan), (MANY + FEW, many, &many_plan)] {
        assert!(
            reads.entries_per_loop <= 1 && reads.loops == statuses,
            "with {leases} live leases the read returned {} index entries in each of {} loops, not one per status \
             ({statuses}):\n{plan}",
            reads.entries_per_loop,
            reads.loops,
        );
    }
    assert!(
        many.pages <= few.pages + 2 * statuses,
        "the read took {} pages with {} live leases, {} with {}: it grows with the leases:\n{few_plan}\n\n{many_plan}",
        many.pages,
        MANY + FEW,
        few.pages,
        2 * FEW,
    );
    // The explained reads answer what the store does: the first of the leases, within its ttl.
    let expiry = store.next_expiry(asked).await.expect("next expiry").expect("live leases");
    assert!(expiry <= Duration::from_secs(3600), "next expiry {expiry:?} past the leases' ttl");
}

/// What a plan's scan of `resources_lease_expiry_idx` read: entries returned per loop, loops, and pages (shared
/// buffers hit and read: index and, for an index scan, heap pages).
#[derive(Clone, Copy, Debug)]
struct IndexReads {
    entries_per_loop: usize,
    loops: usize,
    pages: usize,
}

fn expiry_index_reads(plan: &str) -> IndexReads {
    // An index scan's node says `Scan using <index>`, a bitmap index scan's `Scan on <index>`.
    let start = ["Scan using resources_lease_expiry_idx", "Scan on resources_lease_expiry_idx"]
        .iter()
        .find_map(|node| plan.find(node))
        .unwrap_or_else(|| panic!("no scan of resources_lease_expiry_idx:\n{plan}"));
    let scan = &plan[start..];
    let end = scan[1..].find("->").map_or(scan.len(), |i| i + 1);
    let scan = &scan[..end];
    let number_after = |key: &str| -> usize {
        scan.split(key).nth(1).map_or(0, |rest| {
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().unwrap_or_else(|_| panic!("no number after {key:?} in:\n{scan}"))
        })
    };
    // `actual time=… rows=R loops=L` (the estimate, `(cost=… rows=…`, comes first).
    let actual = scan.split("actual time=").nth(1).unwrap_or_else(|| panic!("not an EXPLAIN ANALYZE:\n{scan}"));
    let field = |key: &str| -> usize {
        let digits: String =
            actual.split(key).nth(1).unwrap_or_default().chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or_else(|_| panic!("no {key:?} in:\n{scan}"))
    };
    IndexReads {
        entries_per_loop: field("rows="),
        loops: field("loops="),
        pages: number_after("shared hit=") + number_after(" read="),
    }
}
