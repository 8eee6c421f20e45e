//! Fetch: which rows a pipeline may lease, in which order, how many, and the lease it writes ([`Store::fetch`];
//! dstack PIPELINES, checklist 1 and 2; DESIGN §3, eligibility).

use super::*;
use crate::store::{RowUpdate, Store};

/// A fetch leases only rows whose status is in its status filter, and leaves the others as they were.
pub async fn skips_rows_whose_status_is_not_listed<H: Harness>(h: H) {
    let status = |s: &str| NewRow::new("job", s, serde_json::json!({}));
    let pending = insert_new(&h, status("pending")).await;
    let running = insert_new(&h, status("running")).await;
    let done = insert_new(&h, status("done")).await;
    let mut params = fetch_params("jobs", "job");
    params.statuses = vec!["pending".into(), "running".into()];
    let leased = fetch_with(&h, params).await;
    assert_eq!(sorted(ids(&leased)), vec![pending.id, running.id]);
    assert_eq!(get(&h, done.id).await, done, "row {} with an unlisted status was written", done.id);
}

/// A fetch leases only rows of its kind.
pub async fn skips_rows_of_other_kinds<H: Harness>(h: H) {
    let job = insert(&h, "job").await;
    let node = insert(&h, "node").await;
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(ids(&leased), vec![job.id]);
    assert_eq!(get(&h, node.id).await, node, "row {} of another kind was written", node.id);
}

/// A leased row carries a token, the pipeline as owner and `now + lease_ttl` as expiry; the fetch returns it as
/// stored and leaves its other columns alone.
pub async fn writes_a_lease_with_a_token_its_owner_and_an_expiry<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    h.advance(Duration::from_secs(1));
    let before = now(&h).await;
    let leased = fetch(&h, "jobs", "job").await;
    let after = now(&h).await;
    assert_eq!(ids(&leased), vec![row.id]);
    let got = &leased[0];
    assert!(got.lock_token.is_some(), "row {} leased without a token", row.id);
    assert_eq!(got.lock_owner.as_deref(), Some("jobs"), "owner of row {}", row.id);
    let expires = got.lock_expires_at.expect("a leased row has an expiry");
    assert_within(expires, before.plus(LEASE_TTL), after.plus(LEASE_TTL), "lock_expires_at");
    assert!(!got.hinted, "row {} is still hinted", row.id);
    let unchanged = Row {
        lock_token: got.lock_token,
        lock_owner: got.lock_owner.clone(),
        lock_expires_at: got.lock_expires_at,
        updated_at: got.updated_at,
        // PostgreSQL's version is the tuple's, which a lease writes anew (MemStore's counts status and data only).
        version: got.version,
        ..row.clone()
    };
    assert_eq!(*got, unchanged, "the fetch changed more than row {}'s lease", row.id);
    assert_eq!(get(&h, row.id).await, *got, "the fetch returned row {} not as stored", row.id);
    assert_eq!(refetch(&h, lease_of(got)).await.as_ref(), Some(got), "refetch by the new token");
}

/// While a lease is live, no fetch takes the row: not the holder's pipeline, not another one.
pub async fn never_leases_a_row_whose_lease_is_live<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let held = get(&h, row.id).await;
    for step in [Duration::ZERO, LEASE_TTL / 2] {
        h.advance(step);
        assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "own pipeline refetched {}", row.id);
        assert_eq!(ids(&fetch(&h, "other", "job").await), vec![], "other pipeline took {}", row.id);
    }
    assert_eq!(get(&h, row.id).await, held, "row {} changed under lease {}", row.id, lease.token);
}

/// After its lease expires, the same pipeline leases the row again with a larger token and the old one is stale.
pub async fn takes_over_its_own_expired_lease_with_a_larger_token<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let old = lease_single(&h, "jobs", &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "jobs", &row).await;
    assert!(new.token > old.token, "token {} after {}", new.token, old.token);
    assert_eq!(refetch(&h, old).await, None, "old token {} still reads row {}", old.token, row.id);
}

/// An expired lease is taken whoever held it, so a dead owner never starves the row (dstack #3704).
pub async fn takes_an_expired_lease_of_another_pipeline<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let old = lease_single(&h, "other", &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "jobs", &row).await;
    assert!(new.token > old.token, "token {} after {}", new.token, old.token);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.lock_owner.as_deref(), Some("jobs"), "owner of row {}", row.id);
}

/// A row reset for retry keeps its owner's mark with no lease; other pipelines skip it however long it waits, and
/// its owner still takes it.
pub async fn skips_a_row_another_pipeline_reset_for_retry<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "other", &row).await;
    assert!(reset_for_retry(&h, lease).await, "reset of a held lease");
    let marked = get(&h, row.id).await;
    h.advance(past(MIN_PROCESSING_INTERVAL));
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "jobs took row {} reset by other", row.id);
    assert_eq!(get(&h, row.id).await, marked, "row {} was written by a skipping fetch", row.id);
    lease_single(&h, "other", &row).await;
}

/// A pipeline retries a row it reset once `retry_delay` passed, without waiting `min_processing_interval`.
pub async fn retries_a_row_it_reset_after_retry_delay<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    assert!(reset_for_retry(&h, lease).await, "reset of a held lease");
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} retried at once", row.id);
    h.advance(RETRY_DELAY / 2);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} retried early", row.id);
    h.advance(past(RETRY_DELAY / 2));
    let retry = lease_single(&h, "jobs", &row).await;
    assert!(retry.token > lease.token, "token {} after {}", retry.token, lease.token);
}

/// A row reset for retry keeps its place in fetch order: once its retry delay passed it is fetched before rows
/// that arrived while it waited (dstack's reset stamps `last_processed_at = now`, which sent a contended row behind
/// every newer row, and under overload a contended parent waited for the whole backlog).
pub async fn a_row_reset_for_retry_keeps_its_place_in_fetch_order<H: Harness>(h: H) {
    let first = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &first).await;
    assert!(reset_for_retry(&h, lease).await, "reset of a held lease");
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(insert(&h, "job").await.id);
    }
    h.advance(past(RETRY_DELAY));
    let mut params = fetch_params("jobs", "job");
    params.limit = 2;
    let leased = ids(&fetch_with(&h, params).await);
    assert_eq!(leased, vec![first.id, later[0]], "the reset row {} lost its place to newer rows", first.id);
}

/// A processed row waits `min_processing_interval` from its `last_processed_at`.
pub async fn skips_a_processed_row_until_min_processing_interval_passed<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let outcome = apply(&h, ApplyParams::new(lease, RowUpdate::default())).await;
    applied_now(&outcome, lease);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} refetched at once", row.id);
    h.advance(MIN_PROCESSING_INTERVAL / 2);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} refetched early", row.id);
    h.advance(past(MIN_PROCESSING_INTERVAL / 2));
    lease_single(&h, "jobs", &row).await;
}

/// A never-processed row is taken at once, however long `min_processing_interval` is and however recently the
/// row was inserted.
pub async fn takes_a_new_row_without_waiting_min_processing_interval<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let mut params = fetch_params("jobs", "job");
    params.min_processing_interval = Duration::from_secs(365 * 24 * 3600);
    assert_eq!(ids(&fetch_with(&h, params).await), vec![row.id]);
}

/// A hinted row is taken at once after it was processed; the fetch consumes the hint.
pub async fn takes_a_hinted_row_without_waiting_min_processing_interval<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let first = lease_single(&h, "jobs", &row).await;
    applied_now(&apply(&h, ApplyParams::new(first, RowUpdate::default())).await, first);
    h.store().hint("job", Some(row.id)).await.expect("hint");
    let leased = fetch(&h, "jobs", "job").await;
    assert_eq!(ids(&leased), vec![row.id], "hinted row {} was not taken", row.id);
    assert!(!leased[0].hinted, "fetch returned row {} still hinted", row.id);
    assert!(!get(&h, row.id).await.hinted, "fetch left row {} hinted", row.id);
    let second = lease_of(&leased[0]);
    applied_now(&apply(&h, ApplyParams::new(second, RowUpdate::default())).await, second);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {}'s hint was used twice", row.id);
}

/// Builds four rows whose fetch order is known and returns them in that order: two never processed (by id), then
/// the one processed first, then the one processed later, though their ids run the other way.
async fn rows_in_fetch_order<H: Harness>(h: &H) -> Vec<RowId> {
    let later = insert(h, "job").await;
    let new_low = insert(h, "job").await;
    let earlier = insert(h, "job").await;
    let new_high = insert(h, "job").await;
    let leased = fetch(h, "setup", "job").await;
    assert_eq!(leased.len(), 4, "setup fetch");
    let lease = |id: RowId| lease_of(leased.iter().find(|row| row.id == id).expect("leased"));
    for id in [earlier.id, later.id] {
        applied_now(&apply(h, ApplyParams::new(lease(id), RowUpdate::default())).await, lease(id));
        h.advance(Duration::from_secs(1));
    }
    let released = h.store().release(vec![lease(new_low.id), lease(new_high.id)]).await;
    assert_eq!(released.expect("release"), 2, "setup release");
    h.advance(past(MIN_PROCESSING_INTERVAL));
    vec![new_low.id, new_high.id, earlier.id, later.id]
}

/// Rows are taken never-processed first (by id), then by oldest `last_processed_at`: `ORDER BY last_processed_at
/// NULLS FIRST, id`. Fetches of one row each show the order the store selects in.
pub async fn takes_never_processed_rows_first_then_oldest_processed_then_by_id<H: Harness>(h: H) {
    let expected = rows_in_fetch_order(&h).await;
    let mut taken = Vec::new();
    for _ in 0..expected.len() {
        let mut params = fetch_params("jobs", "job");
        params.limit = 1;
        taken.extend(ids(&fetch_with(&h, params).await));
    }
    assert_eq!(taken, expected);
}

/// One fetch returns its rows in the order it selected them, so the pipeline queues the oldest first.
pub async fn returns_leased_rows_in_selection_order<H: Harness>(h: H) {
    let expected = rows_in_fetch_order(&h).await;
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), expected);
}

/// A fetch leases at most `limit` rows and leaves the rest unleased for the next one.
pub async fn leases_at_most_limit_rows<H: Harness>(h: H) {
    let mut all = Vec::new();
    for _ in 0..5 {
        all.push(insert(&h, "job").await);
    }
    let mut params = fetch_params("jobs", "job");
    params.limit = 0;
    assert_eq!(ids(&fetch_with(&h, params.clone()).await), vec![], "limit 0");
    for row in &all {
        assert_eq!(get(&h, row.id).await, *row, "a fetch with limit 0 wrote row {}", row.id);
    }
    params.limit = 2;
    let mut taken = Vec::new();
    for expected_len in [2, 2, 1, 0] {
        let leased = fetch_with(&h, params.clone()).await;
        assert_eq!(leased.len(), expected_len, "rows leased so far: {taken:?}");
        taken.extend(ids(&leased));
    }
    assert_eq!(sorted(taken), ids(&all), "every row leased exactly once");
}

/// Fetches running at once (PostgreSQL: `SKIP LOCKED` in concurrent transactions) never lease one row twice, and
/// together lease every eligible row.
pub async fn concurrent_fetches_never_lease_one_row_twice<H: Harness>(h: H) {
    let mut all = Vec::new();
    for _ in 0..20 {
        all.push(insert(&h, "job").await.id);
    }
    let params = |pipeline: &str| FetchParams { limit: 8, ..fetch_params(pipeline, "job") };
    let s = h.store();
    let (a, b, c, d) = tokio::join!(
        s.fetch(params("jobs")),
        s.fetch(params("jobs")),
        s.fetch(params("other")),
        s.fetch(params("other")),
    );
    let leased: Vec<Row> = [a, b, c, d].into_iter().flat_map(|rows| rows.expect("concurrent fetch")).collect();
    let mut taken = ids(&leased);
    taken.sort_unstable();
    let distinct = taken.len();
    taken.dedup();
    assert_eq!(taken.len(), distinct, "a row was leased twice: {:?}", ids(&leased));
    assert_eq!(taken, all, "every eligible row is leased by one of the fetches");
    for row in &leased {
        let stored = get(&h, row.id).await;
        assert_eq!(stored.lock_token, row.lock_token, "row {} carries another token", row.id);
        assert_eq!(stored.lock_owner, row.lock_owner, "row {} carries another owner", row.id);
    }
}

/// Tokens come from one store-wide sequence: every fetch's tokens are larger than all earlier ones, across rows,
/// kinds and pipelines, and distinct within a fetch.
pub async fn tokens_strictly_increase_from_fetch_to_fetch<H: Harness>(h: H) {
    for kind in ["job", "node", "job", "node"] {
        insert(&h, kind).await;
    }
    let mut last = None;
    let one = |pipeline: &str, kind: &str| FetchParams { limit: 1, ..fetch_params(pipeline, kind) };
    for params in [one("jobs", "job"), one("nodes", "node"), one("jobs", "job"), one("nodes", "node")] {
        let leased = fetch_with(&h, params).await;
        assert_eq!(leased.len(), 1, "one row per fetch");
        let token = lease_of(&leased[0]).token;
        assert!(last < Some(token), "token {token} after {last:?}");
        last = Some(token);
    }
    h.advance(past(LEASE_TTL));
    let again = fetch(&h, "jobs", "job").await;
    assert_eq!(again.len(), 2, "both expired job leases are taken again");
    let mut tokens: Vec<_> = again.iter().map(|row| lease_of(row).token).collect();
    assert!(tokens.iter().all(|t| Some(*t) > last), "tokens {tokens:?} not after {last:?}");
    tokens.dedup();
    assert_eq!(tokens.len(), 2, "one fetch gave two rows one token");
}

/// `next_expiry` is the span from the store's now to the first future `lock_expires_at` among the rows of the kind
/// and statuses asked: a lease of any owner counts, and so does an intent mark; rows of other kinds or statuses,
/// and leases that expired, do not; `None` when there is none (takeover without waiting out a backoff).
pub async fn next_expiry_is_the_span_to_the_first_lease_or_mark_on_the_rows_a_fetch_looks_at<H: Harness>(h: H) {
    assert_eq!(next_expiry(&h, "job").await, None, "an empty store");
    // Leases on rows of another kind and of a status not asked for do not count.
    let node = insert(&h, "node").await;
    lease_single(&h, "nodes", &node).await;
    let done = insert_new(&h, NewRow::new("job", "done", serde_json::json!({}))).await;
    let mut done_params = fetch_params("archiver", "job");
    done_params.statuses = vec!["done".into()];
    assert_eq!(ids(&fetch_with(&h, done_params).await), vec![done.id]);
    let job = insert(&h, "job").await;
    assert_eq!(next_expiry(&h, "job").await, None, "only other kinds' and statuses' rows are leased");

    // Another pipeline's live lease on a row asked for.
    lease_single(&h, "other", &job).await;
    let expires = get(&h, job.id).await.lock_expires_at.expect("a leased row has an expiry");
    h.advance(Duration::from_secs(10));
    let before = now(&h).await;
    let span = next_expiry(&h, "job").await.expect("a live lease on a row asked for");
    let after = now(&h).await;
    assert_span(span, expires, before, after, "a live lease");

    // Once it expired it no longer counts; a fresh intent mark does.
    h.advance(past(LEASE_TTL));
    assert_eq!(next_expiry(&h, "job").await, None, "an expired lease");
    let parent = insert(&h, "operation").await;
    let parent_lease = lease_single(&h, PARENT_PIPELINE, &parent).await;
    lease_single(&h, "nodes", &node).await;
    let free = insert(&h, "job").await;
    let outcome = lock_related(&h, parent_lease, &[free.id, node.id], PARENT_PIPELINE).await;
    assert_eq!(outcome, LockOutcome::Contended { by_own_pipeline: false }, "row {} is leased by nodes again", node.id);
    let marked = get(&h, free.id).await.lock_expires_at.expect("an intent mark has an expiry");
    h.advance(Duration::from_secs(3));
    let before = now(&h).await;
    let span = next_expiry(&h, "job").await.expect("a fresh intent mark on a row asked for");
    let after = now(&h).await;
    assert_span(span, marked, before, after, "an intent mark");
}

/// `next_expiry` over several statuses is the least over the rows of each, whichever status holds it and in
/// whatever order the statuses are listed; a status listed twice, or one no row has, changes nothing (PgStore
/// reads one indexed minimum per status).
pub async fn next_expiry_over_several_statuses_is_the_least_over_each<H: Harness>(h: H) {
    let running = insert_new(&h, NewRow::new("job", "running", serde_json::json!({}))).await;
    let pending = insert_new(&h, NewRow::new("job", "pending", serde_json::json!({}))).await;
    let of_status = |status: &str| FetchParams { statuses: vec![status.into()], ..fetch_params("jobs", "job") };
    assert_eq!(ids(&fetch_with(&h, of_status("running")).await), vec![running.id]);
    h.advance(Duration::from_secs(5));
    assert_eq!(ids(&fetch_with(&h, of_status("pending")).await), vec![pending.id]);
    let first = get(&h, running.id).await.lock_expires_at.expect("a leased row has an expiry");
    let second = get(&h, pending.id).await.lock_expires_at.expect("a leased row has an expiry");
    assert!(first < second, "the running row's lease ({first:?}) does not end first ({second:?})");

    let cases: [(&[&str], Timestamp); 4] = [
        (&["pending", "running"], first),
        (&["running", "pending"], first),
        (&["pending", "pending"], second),
        (&["missing", "pending", "running", "running"], first),
    ];
    for (statuses, expires) in cases {
        let before = now(&h).await;
        let span = next_expiry_of(&h, statuses).await.unwrap_or_else(|| panic!("no next expiry for {statuses:?}"));
        let after = now(&h).await;
        assert_span(span, expires, before, after, &format!("statuses {statuses:?}"));
    }
    assert_eq!(next_expiry_of(&h, &["missing"]).await, None, "a status no row has");

    // Once the running row's lease expired, the least is the pending row's, asked for first or second.
    h.advance(LEASE_TTL - Duration::from_secs(2));
    for statuses in [&["running", "pending"][..], &["pending", "running"]] {
        let before = now(&h).await;
        let span = next_expiry_of(&h, statuses).await.unwrap_or_else(|| panic!("no next expiry for {statuses:?}"));
        let after = now(&h).await;
        assert_span(span, second, before, after, &format!("statuses {statuses:?}, the first lease expired"));
    }
}

/// [`Store::next_expiry`] for the rows of kind `job` in `statuses`.
async fn next_expiry_of<H: Harness>(h: &H, statuses: &[&str]) -> Option<Duration> {
    let statuses = statuses.iter().map(|s| s.to_string()).collect();
    let params = FetchParams { statuses, ..fetch_params(CHILD_PIPELINE, "job") };
    h.store().next_expiry(params).await.expect("next_expiry")
}

/// [`Store::next_expiry`] for the rows of `kind` [`CHILD_PIPELINE`] fetches.
async fn next_expiry<H: Harness>(h: &H, kind: &str) -> Option<Duration> {
    h.store().next_expiry(fetch_params(CHILD_PIPELINE, kind)).await.expect("next_expiry")
}

/// Asserts that `span` is `expires` less some `now` between `before` and `after`.
fn assert_span(span: Duration, expires: Timestamp, before: Timestamp, after: Timestamp, what: &str) {
    let micros = crate::store::duration_micros(span);
    let (least, most) = (expires.as_micros() - after.as_micros(), expires.as_micros() - before.as_micros());
    assert!((least..=most).contains(&micros), "{what}: next expiry {span:?} not in [{least}, {most}] µs");
}

/// The two steps of [`Store::fetch_with_expiry`] as PgStore and the simulator's network store run them (a fetch,
/// then [`Store::next_expiry`]), with another pipeline's lease taken between them: the expiry is that lease's,
/// not the later one the fetch had to skip. A fetcher then wakes when the lease taken between the steps ends, no
/// later than it would have (docs/simulator.md, "Atomic units").
pub async fn an_expiry_read_after_a_lease_taken_since_the_empty_fetch_counts_that_lease<H: Harness>(h: H) {
    let taken = insert(&h, "job").await;
    lease_single(&h, "other", &taken).await;
    let first = get(&h, taken.id).await.lock_expires_at.expect("a leased row has an expiry");
    assert_eq!(fetch(&h, CHILD_PIPELINE, "job").await, vec![], "the one job is leased by another pipeline");
    // Between the steps: a row comes in and another pipeline leases it, for a third of the first lease's ttl.
    h.advance(Duration::from_secs(1));
    let arrived = insert(&h, "job").await;
    let short = FetchParams { lease_ttl: LEASE_TTL / 3, ..fetch_params("other", "job") };
    assert_eq!(ids(&fetch_with(&h, short).await), vec![arrived.id], "the other pipeline leases the new row");
    let second = get(&h, arrived.id).await.lock_expires_at.expect("a leased row has an expiry");
    assert!(second < first, "the lease taken between the steps ({second:?}) ends first ({first:?})");
    let before = now(&h).await;
    let span = next_expiry(&h, "job").await.expect("two live leases");
    let after = now(&h).await;
    assert_span(span, second, before, after, "the lease taken between the fetch and the expiry read");
}
