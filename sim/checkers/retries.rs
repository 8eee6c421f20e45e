//! Failing rows end (DESIGN §3, failures; issue 13): no row of the workload loops on its failures.
//!
//! Replays the commit history's recorded failures ([`CommitOp::Failure`]) per row of the workload's pipelines:
//! 1. each failure's attempt number is one more than the row's failures since its last applied apply (the count
//!    the store keeps is the one the engine backs off and gives up by);
//! 2. no attempt goes past the scenario's `attempts_max`, and a row gives up exactly at it (the workload's
//!    handlers leave the decision to the policy);
//! 3. no fetch leases a row after it gave up, and a row that gave up ends in the failed status, and only such a
//!    row does;
//! 4. a row that failed after the heal, and did not give up, is fetched again no later than
//!    [`CheckInput::retry_lateness_bound`] after its retry falls due (its policy's longest delay for that attempt,
//!    jitter included, or the minimum processing interval since the row was last applied or reset, whichever is
//!    later): a replica wakes its fetcher for a retry, rather than leaving the row to its empty-fetch
//!    backoff (a new user's trial saw a 1 s retry wait 3.6 s). A retry whose row a related lock or intent mark
//!    named before the fetch is not judged: the lock holds the row off, and its end wakes no fetcher of the row's
//!    kind.

use super::row_map::RowMap;
use super::{CheckInput, RowModel, listed};
use crate::sim::gang::is_gang_row;
use crate::sim::workload::{self, FAILED_STATUS};
use crate::store::{CommitOp, Row, RowId, Timestamp};
use std::collections::BTreeMap;

/// The check; the error lists every row that broke a rule (the first break of each).
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    if !matches!(input.rows, RowModel::Builtin) {
        // A user's pipelines set their own retry policies; the built-in workload's limit says nothing of them.
        return Ok(());
    }
    // By row id: a lookup per failure, apply and leased row of the history (issue 17).
    let rows: RowMap<&Row> = input
        .rows_final
        .iter()
        .filter(|row| workload::is_processed(row) && !is_gang_row(row))
        .map(|row| (row.id, row))
        .collect();
    let mut streaks: RowMap<u32> = RowMap::new();
    let mut gave_up: RowMap<()> = RowMap::new();
    // Rows failed after the heal, not yet fetched again: the latest their retry may be fetched, and the failure.
    let mut due: RowMap<(Timestamp, usize)> = RowMap::new();
    // When each row was last processed: applied, or reset for retry (the store's `last_processed_at`).
    let mut processed: RowMap<Timestamp> = RowMap::new();
    let policy = workload::retry_policy(input.attempts_max);
    let mut broken: BTreeMap<RowId, String> = BTreeMap::new();
    let mut fail = |id: RowId, index: usize, what: String| {
        broken.entry(id).or_insert_with(|| format!("row {id}: commit {index}: {what}"));
    };
    for (index, commit) in input.history.iter().enumerate() {
        match &commit.op {
            CommitOp::Failure { lease, attempts: Some(attempt), gave_up: giving_up } if rows.contains(lease.id) => {
                let streak = streaks.get_or_insert_with(lease.id, u32::default);
                if *attempt != *streak + 1 {
                    fail(lease.id, index, format!("attempt {attempt} recorded after {streak} failures in a row"));
                }
                *streak = *attempt;
                if *attempt > input.attempts_max {
                    fail(lease.id, index, format!("attempt {attempt} past attempts_max {}", input.attempts_max));
                }
                if *giving_up != (*attempt == input.attempts_max) {
                    let what = if *giving_up { "gave up" } else { "did not give up" };
                    fail(lease.id, index, format!("{what} at attempt {attempt} of {}", input.attempts_max));
                }
                if *giving_up {
                    gave_up.insert(lease.id, ());
                } else if let Some(bound) = input.retry_lateness_bound
                    && commit.at >= input.heal_at
                {
                    // Eligible once its delay has passed and, unless hinted, the minimum processing interval since
                    // it was last processed ([`crate::store::Store::fetch`]); a hint only makes it sooner.
                    let delayed = commit.at.plus(policy.backoff(*attempt, 1.0));
                    let interval = processed.get(lease.id).map(|at| at.plus(input.min_processing_interval));
                    let latest = interval.map_or(delayed, |interval| interval.max(delayed)).plus(bound);
                    due.insert(lease.id, (latest, index));
                }
            }
            CommitOp::Apply { lease, applied: true, .. } => {
                streaks.insert(lease.id, 0);
                processed.insert(lease.id, commit.at);
            }
            CommitOp::Reset { lease, held: true } => {
                processed.insert(lease.id, commit.at);
            }
            CommitOp::LockRelated { related, .. } => {
                // A related lock or intent mark holds the row from its own fetch (a parent first, DESIGN §3), and
                // its end wakes no fetcher of the row's kind: a retry a related lock met is not judged.
                for &id in related {
                    due.remove(id);
                }
            }
            CommitOp::Fetch { leases, .. } => {
                for lease in leases {
                    if gave_up.contains(lease.id) {
                        fail(lease.id, index, "leased again after it gave up".into());
                    }
                    if let Some((latest, failed)) = due.remove(lease.id)
                        && commit.at > latest
                    {
                        let late = late_by(commit.at, latest);
                        fail(
                            lease.id,
                            index,
                            format!("fetched {late} past its retry after the failure of commit {failed}"),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    for (id, (latest, failed)) in due.iter() {
        if input.liveness_at > *latest {
            let late = late_by(input.liveness_at, *latest);
            fail(id, *failed, format!("not fetched again {late} past its retry when the liveness wait ended"));
        }
    }
    for (id, row) in rows.iter() {
        let failed = row.status == FAILED_STATUS;
        if failed != gave_up.contains(id) {
            let what = if failed { "is failed but never gave up" } else { "gave up but ends" };
            fail(id, input.history.len(), format!("{what} in status {}", row.status));
        }
    }
    if broken.is_empty() {
        return Ok(());
    }
    let broken: Vec<String> = broken.into_values().collect();
    let rows = crate::sim::summary::count(broken.len() as u64, "row");
    Err(format!("{rows} broke the retry rules: {}", listed(&broken)))
}

/// How far `at` is past `latest`, for a message: seconds with milliseconds.
fn late_by(at: Timestamp, latest: Timestamp) -> String {
    format!("{:.3} s", (at.as_micros() - latest.as_micros()) as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{apply, at, commit, fetch, input, lease, row};
    use super::*;
    use crate::store::Lease;
    use std::time::Duration;

    fn failure(secs: u64, l: Lease, attempt: u32, gave_up: bool) -> crate::store::Commit {
        commit(secs, CommitOp::Failure { lease: l, attempts: Some(attempt), gave_up })
    }

    /// Fixtures' `attempts_max` is 3.
    #[test]
    fn retries_that_end_pass() {
        let history = [
            fetch(1, lease(1, 1)),
            failure(2, lease(1, 1), 1, false),
            fetch(3, lease(1, 2)),
            apply(4, lease(1, 2), true),
            fetch(5, lease(2, 3)),
            failure(6, lease(2, 3), 1, false),
            fetch(7, lease(2, 4)),
            failure(8, lease(2, 4), 2, false),
            fetch(9, lease(2, 5)),
            failure(10, lease(2, 5), 3, true),
        ];
        let rows = [row(1, "task", "finished"), row(2, "task", FAILED_STATUS)];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
    }

    #[test]
    fn a_row_failing_past_attempts_max_fires() {
        let history = [
            failure(1, lease(2, 3), 1, false),
            failure(2, lease(2, 4), 2, false),
            failure(3, lease(2, 5), 3, false),
            failure(4, lease(2, 6), 4, false),
        ];
        let rows = [row(2, "task", "ready")];
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a looping row");
        assert!(violation.contains("row 2: commit 2: did not give up at attempt 3 of 3"), "{violation}");
    }

    #[test]
    fn a_row_leased_after_giving_up_fires() {
        let history = [
            failure(1, lease(2, 3), 1, false),
            failure(2, lease(2, 4), 2, false),
            failure(3, lease(2, 5), 3, true),
            fetch(4, lease(2, 6)),
        ];
        let rows = [row(2, "task", FAILED_STATUS)];
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a fetch after give-up");
        assert!(violation.contains("leased again after it gave up"), "{violation}");
    }

    /// Fixtures heal at 100 s and end the liveness wait at 150 s, with a lateness bound of 1 s; a first failure's
    /// longest delay is 120 ms (100 ms, jitter 0.2).
    #[test]
    fn a_retry_fetched_within_the_bound_after_the_heal_passes() {
        let history = [failure(101, lease(2, 3), 1, false), fetch(102, lease(2, 4)), apply(103, lease(2, 4), true)];
        let rows = [row(2, "task", "finished")];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
    }

    #[test]
    fn a_retry_fetched_late_after_the_heal_fires() {
        let history = [failure(101, lease(2, 3), 1, false), fetch(103, lease(2, 4)), apply(104, lease(2, 4), true)];
        let rows = [row(2, "task", "finished")];
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a late retry");
        assert!(
            violation.contains("row 2: commit 1: fetched 0.880 s past its retry after the failure of commit 0"),
            "{violation}"
        );
        let unjudged = CheckInput { retry_lateness_bound: None, ..input(&history, &[], &rows) };
        assert_eq!(check(&unjudged), Ok(()), "a chaos run judges no lateness");
        let before_heal = [failure(1, lease(2, 3), 1, false), fetch(9, lease(2, 4)), apply(10, lease(2, 4), true)];
        assert_eq!(check(&input(&before_heal, &[], &rows)), Ok(()), "a failure before the heal is not judged");
    }

    /// A row reset for retry at 100.9 s and failing at 101 s (longest delay 120 ms) is eligible only at 101.9 s, the
    /// fixtures' 1 s minimum processing interval after the reset: a fetch at 102.5 s is in time (it would be late
    /// by the delay alone), one at 103 s is late.
    #[test]
    fn a_retry_also_waits_the_minimum_processing_interval_since_the_row_was_last_processed() {
        let mut reset = commit(100, CommitOp::Reset { lease: lease(2, 2), held: true });
        reset.at = at(100).plus(Duration::from_millis(900));
        let mut history = vec![reset, failure(101, lease(2, 3), 1, false), fetch(102, lease(2, 4))];
        history[2].at = at(102).plus(Duration::from_millis(500));
        let rows = [row(2, "task", "ready")];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
        history[2].at = at(103);
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a late retry");
        assert!(violation.contains("fetched 0.100 s past its retry"), "{violation}");
    }

    #[test]
    fn a_retry_a_related_lock_met_is_not_judged() {
        let locked = commit(
            102,
            CommitOp::LockRelated {
                holder: lease(1, 9),
                related: vec![RowId(2)],
                owner: "jobs".into(),
                outcome: crate::store::LockOutcome::Locked,
            },
        );
        let history =
            [failure(101, lease(2, 3), 1, false), locked, fetch(110, lease(2, 4)), apply(111, lease(2, 4), true)];
        let rows = [row(2, "task", "finished")];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
    }

    #[test]
    fn a_retry_never_fetched_by_the_liveness_wait_fires() {
        let history = [failure(101, lease(2, 3), 1, false)];
        let rows = [row(2, "task", "ready")];
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a retry never fetched");
        assert!(violation.contains("row 2: commit 0: not fetched again 47.880 s past its retry"), "{violation}");
    }

    #[test]
    fn a_failed_row_that_never_gave_up_fires() {
        let rows = [row(2, "task", FAILED_STATUS)];
        let violation = check(&input(&[], &[], &rows)).expect_err("the checker missed a failed row");
        assert!(violation.contains("is failed but never gave up"), "{violation}");
    }
}
