//! The store conformance suite: every documented behaviour of [`Store`], written once and run against every backend
//! (DESIGN §2, "identical results"; STYLE, Tests: Conformance).
//!
//! A backend's test file builds a [`Harness`] (a fresh, empty store plus a way to move its clock) and invokes
//! [`conformance_tests!`](crate::conformance_tests), which expands to one `#[tokio::test]` per case, so a failing
//! case names itself (`fetch::skips_rows_whose_status_is_not_listed`). The cases live one file per area: [`fetch`],
//! [`apply`], [`apply_batch`], [`refetch`], [`related`], [`heartbeat`], [`release`], [`rows`], [`update_unleased`],
//! [`hint`], [`failure`], [`values`], [`purge`], [`parents`], [`waits`]. Each case is a `pub async fn case<H: Harness>(h: H)`
//! that panics, naming the rows involved, when the store breaks the rule it is named after; change semantics here
//! first, then in the backends.
//!
//! The cases fit a store on a manual clock (MemStore on [`ManualClock`](crate::store::ManualClock)) and one on
//! real time (PostgreSQL's `now()` plus an offset) alike, because:
//! 1. They assert relations between timestamps, never absolute values: a time a call writes lies between the
//!    store's `now()` read before and after the call (on a manual clock that pins it exactly), and one apply's
//!    rows share one `now`.
//! 2. They cross expiry and intervals only with [`Harness::advance`], never by sleeping. Every span is seconds
//!    long and every crossing overshoots by `MARGIN`, so the milliseconds a case takes in real time never cross
//!    or fall short of one by themselves.
//! 3. They advance the clock before a write whose time they check, so that a store that forgot to write the
//!    time (and kept the insert's) fails on a manual clock too.
//! 4. Each starts from an empty store, but assumes nothing about absolute ids or tokens.

pub mod apply;
pub mod apply_batch;
pub mod failure;
pub mod fetch;
pub mod heartbeat;
pub mod hint;
pub mod parents;
pub mod purge;
pub mod refetch;
pub mod related;
pub mod release;
pub mod rows;
pub mod update_unleased;
pub mod values;
pub mod waits;

use crate::store::{
    ApplyOutcome, ApplyParams, FetchParams, Lease, LockOutcome, LockRelatedParams, NewRow, Row, RowId, Store, Timestamp,
};
use serde_json::json;
use std::time::Duration;

/// A fresh store for one conformance case, and control over its clock.
///
/// Every case builds its own harness, so a backend must hand out an empty store each time (MemStore: a new
/// instance; PostgreSQL: a new database or schema, kept when the case fails, STYLE Tests).
pub trait Harness: Send + Sync + 'static {
    /// The backend under test.
    type S: Store;

    /// The store under test.
    fn store(&self) -> &Self::S;

    /// Moves the store's clock forward by `span` (MemStore: `ManualClock::advance`; PgStore: an offset added to
    /// `now()`). Every later store call, including [`Store::now`], reads the moved clock.
    fn advance(&self, span: Duration);
}

/// Expands to one `#[tokio::test]` per conformance case, each on a fresh harness.
///
/// `$make` is an async expression (a future) whose output implements [`Harness`]; it is evaluated and awaited
/// once per case. The tests are grouped in one module per area, so a case's test is named like
/// `fetch::skips_rows_whose_status_is_not_listed`. Invoke it once, at the root of an integration test file;
/// the expansion needs `tokio` (this crate's renamed `madsim-tokio`) among the test's dependencies.
///
/// ```
/// use lockstep::store::conformance::Harness;
/// use lockstep::store::{ManualClock, MemStore, Timestamp};
/// use std::time::Duration;
///
/// struct MemHarness {
///     store: MemStore,
///     clock: ManualClock,
/// }
///
/// impl Harness for MemHarness {
///     type S = MemStore;
///     fn store(&self) -> &MemStore {
///         &self.store
///     }
///     fn advance(&self, span: Duration) {
///         self.clock.advance(span)
///     }
/// }
///
/// async fn mem_harness() -> MemHarness {
///     let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
///     MemHarness { store: MemStore::new(clock.clone()), clock }
/// }
///
/// lockstep::conformance_tests!(mem_harness());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr $(,)?) => {
        $crate::__conformance_cases!(tests($make));
    };
}

/// The one list of conformance cases, by area; `conformance_tests!` expands it into tests and a unit test of
/// this crate checks it against the `pub async fn`s of the area files, so that no case is skipped silently.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($mode:ident $args:tt) => {
        $crate::__conformance_expand! { $mode $args
            fetch {
                skips_rows_whose_status_is_not_listed,
                skips_rows_of_other_kinds,
                writes_a_lease_with_a_token_its_owner_and_an_expiry,
                never_leases_a_row_whose_lease_is_live,
                takes_over_its_own_expired_lease_with_a_larger_token,
                takes_an_expired_lease_of_another_pipeline,
                skips_a_row_another_pipeline_reset_for_retry,
                retries_a_row_it_reset_after_retry_delay,
                a_row_reset_for_retry_keeps_its_place_in_fetch_order,
                skips_a_processed_row_until_min_processing_interval_passed,
                takes_a_new_row_without_waiting_min_processing_interval,
                takes_a_hinted_row_without_waiting_min_processing_interval,
                takes_never_processed_rows_first_then_oldest_processed_then_by_id,
                returns_leased_rows_in_selection_order,
                leases_at_most_limit_rows,
                concurrent_fetches_never_lease_one_row_twice,
                tokens_strictly_increase_from_fetch_to_fetch,
                next_expiry_is_the_span_to_the_first_lease_or_mark_on_the_rows_a_fetch_looks_at,
                next_expiry_over_several_statuses_is_the_least_over_each,
                an_expiry_read_after_a_lease_taken_since_the_empty_fetch_counts_that_lease,
            }
            apply {
                apply_writes_the_update_and_unlocks_the_row,
                apply_with_an_empty_update_keeps_status_and_data,
                a_second_apply_with_the_same_token_is_stale,
                apply_stamps_every_row_it_writes_with_one_now,
                apply_unlocks_every_related_row_locked_with_the_token,
                apply_inserts_rows_and_returns_their_ids_in_order,
                apply_appends_events_in_sequence_order,
                apply_with_superseded_token_is_stale,
                stale_apply_writes_no_related_update_insert_or_event,
                apply_is_stale_when_a_related_row_lost_the_token,
                apply_is_stale_when_a_locked_row_it_does_not_update_lost_the_token,
                apply_with_held_locked_rows_applies_and_unlocks_them_unwritten,
                apply_is_stale_when_a_related_row_was_never_locked,
                apply_after_expiry_succeeds_while_no_one_took_the_row,
            }
            apply_batch {
                apply_batch_applies_every_held_item_at_one_now,
                apply_batch_reports_a_stale_item_alone_and_applies_the_others,
                apply_batch_item_with_a_lost_related_row_is_stale_alone,
                apply_batch_item_with_a_lost_locked_row_is_stale_alone,
                apply_batch_writes_each_items_related_updates_inserts_and_events,
                apply_batch_with_a_lease_twice_applies_only_the_first_copy,
                apply_batch_of_stale_items_writes_nothing,
                apply_batch_of_main_updates_unlocks_only_its_items_related_rows,
            }
            refetch {
                refetch_batch_reads_each_lease_as_refetch_would_in_input_order,
                refetch_batch_of_no_leases_is_empty,
            }
            related {
                lock_related_locks_every_row_with_the_holders_token_and_owner,
                lock_related_under_contention_locks_nothing_and_marks_the_free_rows,
                child_fetch_skips_fresh_intent_marks_and_takes_expired_ones,
                contended_retries_leave_existing_intent_marks_as_they_are,
                parent_acquires_every_child_once_the_contended_child_is_applied,
                a_shared_owner_makes_two_items_contend_for_one_row,
                a_shared_owners_intent_mark_holds_off_another_item,
                a_younger_items_intent_mark_gives_way_to_an_older_item,
                a_younger_items_mark_of_another_pipeline_gives_way_to_an_older_item,
                a_shared_lock_takes_a_row_its_own_pipeline_reset,
                lock_related_takes_an_expired_lease_of_another_pipeline,
                lock_related_takes_an_expired_intent_mark_of_another_owner,
                lock_related_is_contended_by_another_pipelines_reset_mark,
                lock_related_with_a_stale_holder_is_stale_and_writes_nothing,
                reset_for_retry_keeps_the_owner_and_releases_the_lease_and_related_locks,
                reset_for_retry_of_a_lease_no_longer_held_writes_nothing,
                lock_related_and_read_returns_the_rows_it_locked,
                lock_related_and_read_resets_when_contended_and_is_stale_for_a_stale_holder,
                a_reset_after_the_contended_holder_lost_its_lease_writes_nothing,
            }
            heartbeat {
                heartbeat_extends_held_leases_to_now_plus_ttl,
                heartbeat_extends_related_rows_with_their_main_lease,
                heartbeat_returns_only_held_leases_and_leaves_lost_ones_untouched,
                heartbeat_does_not_revive_an_expired_lease,
                heartbeat_never_shortens_a_lease,
            }
            release {
                release_clears_the_lease_and_related_locks_without_processing,
                release_keeps_last_processed_at,
                release_counts_and_clears_only_leases_still_held,
            }
            rows {
                insert_stores_an_unleased_unprocessed_row,
                insert_assigns_increasing_ids,
                insert_id_stores_the_row_insert_would,
                insert_keyed_inserts_once_per_key_and_then_returns_the_first_row,
                concurrent_keyed_inserts_with_one_key_insert_one_row,
                insert_keyed_refuses_a_bad_key_or_row,
                insert_many_stores_every_row_in_order_and_publishes_its_hints,
                insert_many_with_a_bad_row_stores_none,
                an_enqueue_batch_stores_the_callers_row_and_its_work_items_together_and_hints_each_kind,
                get_of_a_missing_row_is_none,
                list_filters_by_kind_and_parent_in_id_order,
                query_filters_by_parent_status_cursor_and_ids_in_id_order,
                query_map_and_list_map_read_the_rows_query_and_list_return,
                query_refuses_a_nul_in_a_kind_or_a_status,
                a_rows_version_changes_at_every_write_of_its_status_or_data,
                now_moves_forward_by_at_least_the_advanced_span,
            }
            update_unleased {
                update_unleased_writes_a_row_with_no_lease,
                update_unleased_is_busy_while_a_lease_is_live,
                update_unleased_is_busy_on_a_reset_mark,
                update_unleased_is_busy_on_a_fresh_intent_mark,
                update_unleased_of_a_missing_row_is_missing,
                update_unleased_takes_over_an_expired_lease_so_its_apply_is_stale,
                update_unleased_of_a_related_row_leaves_the_main_rows_lease,
            }
            purge {
                purge_deletes_old_finished_rows_of_its_kind_with_their_events,
                purge_keeps_rows_younger_than_its_age,
                purge_keeps_a_leased_or_marked_row,
                purge_keeps_a_parent_until_its_children_are_gone,
                purge_deletes_at_most_its_limit_oldest_first,
                purge_refuses_an_empty_kind_or_status_and_a_limit_out_of_range,
                a_purge_racing_child_inserts_never_leaves_an_orphan,
                purge_with_parent_statuses_deletes_only_children_of_a_parent_in_one_of_them,
            }
            parents {
                an_insert_under_a_missing_parent_is_refused_and_stores_nothing,
                an_apply_inserting_under_a_missing_parent_is_refused_and_keeps_the_lease,
                an_apply_batch_with_one_item_under_a_missing_parent_writes_nothing,
                a_stale_apply_under_a_missing_parent_is_stale_not_refused,
            }
            hint {
                hint_with_a_row_marks_only_that_row_hinted,
                hint_reaches_every_subscriber_after_commit,
                hint_during_a_lease_survives_the_apply,
                apply_publishes_its_hints_after_commit,
                stale_apply_publishes_no_hint,
                apply_batch_publishes_the_hints_of_its_applied_items_once_per_kind,
            }
            failure {
                record_failure_counts_the_attempt_records_the_error_and_clears_the_lease,
                a_failed_row_is_not_fetched_before_its_delay_even_when_hinted,
                a_row_failed_since_it_was_processed_waits_for_its_retry_not_the_interval,
                record_failure_keeps_the_last_errors_bounded,
                give_up_sets_the_failed_status_and_clears_the_lease,
                record_failure_with_a_stale_token_writes_nothing,
                an_apply_resets_the_attempts_and_keeps_the_errors,
                record_failure_unlocks_related_rows,
                record_failure_refuses_a_bad_give_up_status,
            }
            values {
                insert_refuses_nul_and_oversized_keys,
                apply_refuses_a_bad_value_and_keeps_the_lease,
                apply_batch_with_one_bad_item_writes_nothing,
                update_unleased_refuses_a_bad_value,
            }
            waits {
                a_parked_lock_keeps_the_lease_and_tells_when_the_lock_it_met_expires,
                a_row_reset_by_its_own_pipeline_makes_the_span_unknown,
                the_holders_apply_wakes_the_waiters_of_its_row,
                a_reset_a_release_and_a_failure_of_the_holder_each_wake_its_waiters,
                a_row_no_one_waits_on_wakes_no_one,
            }
        }
    };
}

/// The expansions of [`__conformance_cases!`]: `tests($make)` writes the tests, `names()` lists
/// `(area, case)` pairs.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_expand {
    (tests($make:expr) $($area:ident { $($case:ident),* $(,)? })*) => {
        $(
            mod $area {
                #[allow(unused_imports)]
                use super::*;
                $(
                    #[tokio::test]
                    async fn $case() {
                        let harness = $make.await;
                        $crate::store::conformance::$area::$case(harness).await;
                    }
                )*
            }
        )*
    };
    (names() $($area:ident { $($case:ident),* $(,)? })*) => {
        [$($((stringify!($area), stringify!($case)),)*)*]
    };
}

// Spans of the cases. Each is seconds long, so the real time a case takes never crosses one (see the module doc).

/// Lease length of every fetch, related lock and heartbeat unless a case says otherwise.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// `min_processing_interval` of every fetch.
const MIN_PROCESSING_INTERVAL: Duration = Duration::from_secs(600);
/// `retry_delay` of every fetch.
const RETRY_DELAY: Duration = Duration::from_secs(5);
/// How far past a deadline a case advances to cross it.
const MARGIN: Duration = Duration::from_secs(1);
/// Longest wait for a fetch hint to arrive (a real-time bound for PostgreSQL's `NOTIFY`; no case waits for a hint
/// that should not come).
const HINT_WAIT: Duration = Duration::from_secs(10);

/// The next hint a subscriber receives, within [`HINT_WAIT`]; `which` names the subscriber in a failure.
async fn next_hint(rx: &mut tokio::sync::broadcast::Receiver<crate::store::Hint>, which: &str) -> crate::store::Hint {
    match tokio::time::timeout(HINT_WAIT, rx.recv()).await {
        Ok(Ok(kind)) => kind,
        Ok(Err(e)) => panic!("{which} subscriber: {e}"),
        Err(_) => panic!("{which} subscriber got no hint within {HINT_WAIT:?}"),
    }
}

// A reset row is retried before `min_processing_interval` would allow, and while its intent marks are still fresh.
const _: () = assert!(RETRY_DELAY.as_secs() + MARGIN.as_secs() < LEASE_TTL.as_secs());
// Crossing a lease's expiry does not also cross `min_processing_interval`.
const _: () = assert!(LEASE_TTL.as_secs() * 4 < MIN_PROCESSING_INTERVAL.as_secs());

/// The status every fetch of the cases asks for unless a case says otherwise.
const READY: &str = "ready";

/// `span` plus [`MARGIN`]: advancing by it crosses a deadline `span` away.
fn past(span: Duration) -> Duration {
    span + MARGIN
}

/// Fetch parameters of `pipeline` for rows of `kind` in [`READY`], with the suite's spans and a limit of 100.
fn fetch_params(pipeline: &str, kind: &str) -> FetchParams {
    FetchParams {
        pipeline: pipeline.to_string(),
        kind: kind.to_string(),
        statuses: vec![READY.to_string()],
        limit: 100,
        lease_ttl: LEASE_TTL,
        min_processing_interval: MIN_PROCESSING_INTERVAL,
        retry_delay: RETRY_DELAY,
    }
}

async fn fetch_with<H: Harness>(h: &H, params: FetchParams) -> Vec<Row> {
    let what = format!("fetch {} {}", params.pipeline, params.kind);
    h.store().fetch(params).await.expect(&what)
}

/// The pipeline that processes parents (`operation` rows) and locks their children in the cases.
const PARENT_PIPELINE: &str = "operations";
/// The pipeline that processes children (`job` rows).
const CHILD_PIPELINE: &str = "jobs";

/// Inserts an `operation` row and `children` `job` rows under it, all in [`READY`].
async fn family<H: Harness>(h: &H, children: usize) -> (Row, Vec<Row>) {
    let parent = insert(h, "operation").await;
    let mut kids = Vec::with_capacity(children);
    for _ in 0..children {
        let new = NewRow::new("job", READY, json!({})).with_parent(parent.id);
        kids.push(insert_new(h, new).await);
    }
    (parent, kids)
}

/// Leases `parent` for [`PARENT_PIPELINE`] and locks every row of `children` with it (owner [`PARENT_PIPELINE`]).
async fn lease_with_children<H: Harness>(h: &H, parent: &Row, children: &[Row]) -> Lease {
    let lease = lease_single(h, PARENT_PIPELINE, parent).await;
    let outcome = lock_related(h, lease, &ids(children), PARENT_PIPELINE).await;
    assert_eq!(outcome, LockOutcome::Locked, "children of {} were to be free", parent.id);
    lease
}

/// Inserts a `job` child of `parent` and leases it for [`CHILD_PIPELINE`], then inserts `count` free `job`
/// children of `parent`: the leased child stands for one its own pipeline is busy with.
async fn busy_child_then_free_ones<H: Harness>(h: &H, parent: &Row, count: usize) -> (Lease, Vec<Row>) {
    let busy = insert_new(h, NewRow::new("job", READY, json!({})).with_parent(parent.id)).await;
    let busy_lease = lease_single(h, CHILD_PIPELINE, &busy).await;
    let mut free = Vec::with_capacity(count);
    for _ in 0..count {
        free.push(insert_new(h, NewRow::new("job", READY, json!({})).with_parent(parent.id)).await);
    }
    (busy_lease, free)
}

/// Fetches rows of `kind` for `pipeline` with [`fetch_params`].
async fn fetch<H: Harness>(h: &H, pipeline: &str, kind: &str) -> Vec<Row> {
    fetch_with(h, fetch_params(pipeline, kind)).await
}

/// Fetches `row`'s kind for `pipeline`, requiring that the fetch lease exactly `row`.
async fn lease_single<H: Harness>(h: &H, pipeline: &str, row: &Row) -> Lease {
    let leased = fetch(h, pipeline, &row.kind).await;
    assert_eq!(ids(&leased), vec![row.id], "{pipeline} was to lease exactly row {} of kind {}", row.id, row.kind);
    lease_of(&leased[0])
}

/// The lease a fetch put on `row`.
fn lease_of(row: &Row) -> Lease {
    let token = row.lock_token.unwrap_or_else(|| panic!("row {} carries no lock token", row.id));
    Lease { id: row.id, token }
}

fn ids(rows: &[Row]) -> Vec<RowId> {
    rows.iter().map(|row| row.id).collect()
}

/// `ids` in ascending order, for comparing sets of rows where the order is not the rule under test.
fn sorted(mut ids: Vec<RowId>) -> Vec<RowId> {
    ids.sort_unstable();
    ids
}

/// Inserts a parentless row of `kind` in [`READY`].
async fn insert<H: Harness>(h: &H, kind: &str) -> Row {
    insert_new(h, NewRow::new(kind, READY, json!({}))).await
}

async fn insert_new<H: Harness>(h: &H, new: NewRow) -> Row {
    let what = format!("insert a row of kind {}", new.kind);
    h.store().insert(new).await.expect(&what)
}

/// Reads a row that must exist.
async fn get<H: Harness>(h: &H, id: RowId) -> Row {
    h.store().get(id).await.expect("get").unwrap_or_else(|| panic!("row {id} vanished"))
}

/// The store's current time.
async fn now<H: Harness>(h: &H) -> Timestamp {
    h.store().now().await.expect("now")
}

async fn apply<H: Harness>(h: &H, params: ApplyParams) -> ApplyOutcome {
    let what = format!("apply {}#{}", params.lease.id, params.lease.token);
    h.store().apply(params).await.expect(&what)
}

/// The transaction time of an apply that must have been applied.
fn applied_now(outcome: &ApplyOutcome, lease: Lease) -> Timestamp {
    match outcome {
        ApplyOutcome::Applied { now, .. } => *now,
        ApplyOutcome::Stale => panic!("apply {}#{} was stale", lease.id, lease.token),
    }
}

/// The cases' related lock of `related` by `holder` under `owner`: [`LEASE_TTL`], and [`RETRY_DELAY`] for its reset.
fn lock_params(holder: Lease, related: &[RowId], owner: &str) -> LockRelatedParams {
    LockRelatedParams {
        holder,
        related: related.to_vec(),
        owner: owner.to_string(),
        lease_ttl: LEASE_TTL,
        retry_delay: RETRY_DELAY,
        park: false,
    }
}

async fn lock_related<H: Harness>(h: &H, holder: Lease, related: &[RowId], owner: &str) -> LockOutcome {
    let params = lock_params(holder, related, owner);
    let what = format!("lock_related {}#{} {owner}", holder.id, holder.token);
    h.store().lock_related(params).await.expect(&what)
}

async fn refetch<H: Harness>(h: &H, lease: Lease) -> Option<Row> {
    h.store().refetch(lease).await.expect("refetch")
}

async fn reset_for_retry<H: Harness>(h: &H, lease: Lease) -> bool {
    h.store().reset_for_retry(lease, RETRY_DELAY).await.expect("reset_for_retry")
}

/// Asserts `before <= at <= after`: `at` was written by a call made between two reads of the store's clock.
fn assert_within(at: Timestamp, before: Timestamp, after: Timestamp, what: &str) {
    assert!(at >= before, "{what}: {at} is before {before}");
    assert!(at <= after, "{what}: {at} is after {after}");
}

/// Asserts that `row` carries no lease, no owner mark and no token.
fn assert_unlocked(row: &Row) {
    assert_eq!(row.lock_token, None, "row {} still carries a token", row.id);
    assert_eq!(row.lock_expires_at, None, "row {} still has a lock expiry", row.id);
    assert_eq!(row.lock_owner, None, "row {} still has an owner", row.id);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Every `pub async fn` of the area files is listed in `__conformance_cases!`, and every listed case exists, so
    /// `conformance_tests!` skips none.
    #[test]
    fn every_case_of_the_area_files_is_listed_for_the_macro() {
        let files = [
            ("apply", include_str!("apply.rs")),
            ("apply_batch", include_str!("apply_batch.rs")),
            ("failure", include_str!("failure.rs")),
            ("fetch", include_str!("fetch.rs")),
            ("heartbeat", include_str!("heartbeat.rs")),
            ("hint", include_str!("hint.rs")),
            ("parents", include_str!("parents.rs")),
            ("refetch", include_str!("refetch.rs")),
            ("related", include_str!("related.rs")),
            ("purge", include_str!("purge.rs")),
            ("release", include_str!("release.rs")),
            ("rows", include_str!("rows.rs")),
            ("update_unleased", include_str!("update_unleased.rs")),
            ("values", include_str!("values.rs")),
            ("waits", include_str!("waits.rs")),
        ];
        let mut defined = BTreeSet::new();
        for (area, text) in files {
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("pub async fn ") {
                    let name = rest.split(['<', '(']).next().expect("a name");
                    defined.insert((area, name));
                }
            }
        }
        let listed: BTreeSet<(&str, &str)> = crate::__conformance_cases!(names()).into_iter().collect();
        assert!(!defined.is_empty(), "no case found in the area files");
        assert_eq!(
            defined.difference(&listed).collect::<Vec<_>>(),
            Vec::<&(&str, &str)>::new(),
            "cases defined but not listed in __conformance_cases!"
        );
        assert_eq!(
            listed.difference(&defined).collect::<Vec<_>>(),
            Vec::<&(&str, &str)>::new(),
            "cases listed but not defined"
        );
    }
}
