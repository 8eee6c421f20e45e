//! Failures: the guarded write that ends a lease whose item failed ([`Store::record_failure`]; DESIGN §3,
//! failures; river's `attempt`/`errors`/`scheduled_at`, graphile-worker's `attempts`/`last_error`/`run_at`).

use super::*;
use crate::store::{
    FAILURE_ERROR_BYTES_MAX, FAILURE_ERRORS_KEPT, FailureOutcome, FailureParams, Retry, RowUpdate, StoreError,
};

/// The delay of the retries in these cases: longer than the margin, shorter than a lease.
const BACKOFF: Duration = Duration::from_secs(10);

async fn record<H: Harness>(h: &H, lease: Lease, error: &str, retry: Retry) -> FailureOutcome {
    let params = FailureParams { lease, error: error.to_string(), retry };
    let what = format!("record_failure {}#{}", lease.id, lease.token);
    h.store().record_failure(params).await.expect(&what)
}

/// Leases `row` for `jobs` once it is eligible again: advances past [`BACKOFF`] first.
async fn lease_after_backoff<H: Harness>(h: &H, row: &Row) -> Lease {
    h.advance(past(BACKOFF));
    lease_single(h, "jobs", row).await
}

/// A failure counts the attempt, records the error with its attempt and the store's time, clears every lease
/// column (owner too), stamps `updated_at`, and sets `not_before` to now plus the delay; `last_processed_at` stays.
pub async fn record_failure_counts_the_attempt_records_the_error_and_clears_the_lease<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    h.advance(Duration::from_secs(1));
    let before = now(&h).await;
    let outcome = record(&h, lease, "exit code 3", Retry::After(BACKOFF)).await;
    let after = now(&h).await;
    assert_eq!(outcome, FailureOutcome::Recorded { attempts: 1 }, "first failure of row {}", row.id);
    let stored = get(&h, row.id).await;
    assert_unlocked(&stored);
    assert_eq!(stored.attempts, 1, "attempts of row {}", row.id);
    assert_eq!(stored.errors.len(), 1, "errors of row {}: {:?}", row.id, stored.errors);
    let error = &stored.errors[0];
    assert_eq!((error.attempt, error.error.as_str()), (1, "exit code 3"), "error of row {}", row.id);
    assert_within(error.at, before, after, "the error's time");
    assert_eq!(stored.updated_at, error.at, "updated_at of row {}", row.id);
    assert_eq!(stored.not_before, Some(error.at.plus(BACKOFF)), "not_before of row {}", row.id);
    assert_eq!(stored.status, READY, "status of row {}", row.id);
    assert_eq!(stored.last_processed_at, None, "last_processed_at of row {}", row.id);
    assert_eq!(refetch(&h, lease).await, None, "token {} survived its failure", lease.token);
}

/// No fetch takes a failed row before its delay passed, even when the row is hinted; any pipeline takes it after.
pub async fn a_failed_row_is_not_fetched_before_its_delay_even_when_hinted<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    record(&h, lease, "boom", Retry::After(BACKOFF)).await;
    h.store().hint("job", Some(row.id)).await.expect("hint");
    h.advance(BACKOFF - MARGIN);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} fetched inside its backoff", row.id);
    assert_eq!(ids(&fetch(&h, "others", "job").await), vec![], "row {} fetched inside its backoff", row.id);
    h.advance(MARGIN * 2);
    lease_single(&h, "others", &row).await;
}

/// A row that failed since it was last processed is paced by its retry time, not by the minimum processing
/// interval since that processing (a retry shorter than the interval would otherwise wait out the interval: the
/// simulator's swarm saw a claim reset for retry, then failed, fetched a second past its retry while its fetcher
/// had woken for it on time); once processed again, the interval paces it again.
pub async fn a_row_failed_since_it_was_processed_waits_for_its_retry_not_the_interval<H: Harness>(h: H) {
    const _: () = assert!(BACKOFF.as_secs() < MIN_PROCESSING_INTERVAL.as_secs());
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    assert!(
        h.store().reset_for_retry(lease, RETRY_DELAY).await.expect("reset_for_retry"),
        "lease {} lost",
        lease.token
    );
    h.advance(past(RETRY_DELAY));
    let lease = lease_single(&h, "jobs", &row).await;
    record(&h, lease, "boom", Retry::After(BACKOFF)).await;
    h.advance(BACKOFF - MARGIN);
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} fetched inside its backoff", row.id);
    h.advance(MARGIN * 2);
    let lease = lease_single(&h, "jobs", &row).await;
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::default())).await, lease);
    h.advance(past(BACKOFF));
    let again = fetch(&h, "jobs", "job").await;
    assert_eq!(ids(&again), vec![], "row {} fetched again inside its minimum processing interval", row.id);
}

/// Each failure adds one; the row keeps only the last [`FAILURE_ERRORS_KEPT`] errors, oldest dropped first, each
/// cut to [`FAILURE_ERROR_BYTES_MAX`] bytes with its NUL characters removed.
pub async fn record_failure_keeps_the_last_errors_bounded<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let failures = FAILURE_ERRORS_KEPT as u32 + 2;
    for attempt in 1..=failures {
        let lease =
            if attempt == 1 { lease_single(&h, "jobs", &row).await } else { lease_after_backoff(&h, &row).await };
        let error = format!("failure {attempt}\0 {}", "x".repeat(FAILURE_ERROR_BYTES_MAX));
        let outcome = record(&h, lease, &error, Retry::After(BACKOFF)).await;
        assert_eq!(outcome, FailureOutcome::Recorded { attempts: attempt }, "failure {attempt} of row {}", row.id);
    }
    let stored = get(&h, row.id).await;
    assert_eq!(stored.attempts, failures, "attempts of row {}", row.id);
    let attempts: Vec<u32> = stored.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (3..=failures).collect::<Vec<_>>(), "errors kept on row {}", row.id);
    for error in &stored.errors {
        assert!(error.error.len() <= FAILURE_ERROR_BYTES_MAX, "an error of {} bytes", error.error.len());
        assert!(error.error.starts_with(&format!("failure {} x", error.attempt)), "error {:.40}", error.error);
        assert!(!error.error.contains('\0'), "a NUL kept in attempt {}", error.attempt);
    }
    let times: Vec<Timestamp> = stored.errors.iter().map(|e| e.at).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "error times not increasing: {times:?}");
}

/// Giving up sets the terminal status, clears the lease and `not_before`, and records the error: the row leaves
/// the pipeline's status filter for good.
pub async fn give_up_sets_the_failed_status_and_clears_the_lease<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    record(&h, lease, "first", Retry::After(BACKOFF)).await;
    let lease = lease_after_backoff(&h, &row).await;
    let outcome = record(&h, lease, "last", Retry::GiveUp { status: "failed".into() }).await;
    assert_eq!(outcome, FailureOutcome::Recorded { attempts: 2 }, "the give-up of row {}", row.id);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.status, "failed", "status of row {}", row.id);
    assert_unlocked(&stored);
    assert_eq!(stored.not_before, None, "not_before of row {}", row.id);
    let errors: Vec<&str> = stored.errors.iter().map(|e| e.error.as_str()).collect();
    assert_eq!(errors, vec!["first", "last"], "errors of row {}", row.id);
    h.advance(past(LEASE_TTL));
    assert_eq!(ids(&fetch(&h, "jobs", "job").await), vec![], "row {} fetched after giving up", row.id);
    let failed = FetchParams { statuses: vec!["failed".into()], ..fetch_params("jobs", "job") };
    assert_eq!(ids(&fetch_with(&h, failed).await), vec![row.id], "row {} not found in status failed", row.id);
}

/// A failure under a superseded token writes nothing: the new holder's lease, the count and the errors stay.
pub async fn record_failure_with_a_stale_token_writes_nothing<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let old = lease_single(&h, "jobs", &row).await;
    h.advance(past(LEASE_TTL));
    let new = lease_single(&h, "jobs", &row).await;
    let before = get(&h, row.id).await;
    assert_eq!(record(&h, old, "late", Retry::After(BACKOFF)).await, FailureOutcome::Stale, "token {}", old.token);
    let give_up = Retry::GiveUp { status: "failed".into() };
    assert_eq!(record(&h, old, "late", give_up).await, FailureOutcome::Stale, "token {}", old.token);
    assert_eq!(get(&h, row.id).await, before, "a stale failure wrote row {}", row.id);
    assert_eq!(refetch(&h, new).await.map(|r| r.id), Some(row.id), "the new lease {} was lost", new.token);
}

/// A successful apply ends the streak: `attempts` goes back to 0 (the next failure is attempt 1 again) and the
/// errors stay for the record.
pub async fn an_apply_resets_the_attempts_and_keeps_the_errors<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    record(&h, lease, "once", Retry::After(BACKOFF)).await;
    let lease = lease_after_backoff(&h, &row).await;
    applied_now(&apply(&h, ApplyParams::new(lease, RowUpdate::default())).await, lease);
    let stored = get(&h, row.id).await;
    assert_eq!(stored.attempts, 0, "attempts of row {} after an apply", row.id);
    assert_eq!(stored.errors.len(), 1, "errors of row {} after an apply", row.id);
    h.advance(past(MIN_PROCESSING_INTERVAL));
    let lease = lease_single(&h, "jobs", &row).await;
    let outcome = record(&h, lease, "again", Retry::After(BACKOFF)).await;
    assert_eq!(outcome, FailureOutcome::Recorded { attempts: 1 }, "the failure after an apply of row {}", row.id);
}

/// A failure unlocks the related rows locked with its token, as an apply does.
pub async fn record_failure_unlocks_related_rows<H: Harness>(h: H) {
    let (parent, children) = family(&h, 2).await;
    let lease = lease_with_children(&h, &parent, &children).await;
    record(&h, lease, "boom", Retry::After(BACKOFF)).await;
    for child in &children {
        assert_unlocked(&get(&h, child.id).await);
    }
}

/// A give-up status PostgreSQL cannot store is refused before anything is written.
pub async fn record_failure_refuses_a_bad_give_up_status<H: Harness>(h: H) {
    let row = insert(&h, "job").await;
    let lease = lease_single(&h, "jobs", &row).await;
    let params = FailureParams { lease, error: "x".into(), retry: Retry::GiveUp { status: "fa\0iled".into() } };
    let error = h.store().record_failure(params).await.expect_err("a NUL status was accepted");
    assert!(matches!(error, StoreError::Invalid(_)), "{error}");
    assert_eq!(refetch(&h, lease).await.map(|r| r.attempts), Some(0), "lease {} lost or counted", lease.token);
}
