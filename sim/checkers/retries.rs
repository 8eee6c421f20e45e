//! Failing rows end (DESIGN §3, failures; issue 13): no row of the workload loops on its failures.
//!
//! Replays the commit history's recorded failures ([`CommitOp::Failure`]) per row of the workload's pipelines:
//! 1. each failure's attempt number is one more than the row's failures since its last applied apply (the count
//!    the store keeps is the one the engine backs off and gives up by);
//! 2. no attempt goes past the scenario's `attempts_max`, and a row gives up exactly at it (the workload's
//!    handlers leave the decision to the policy);
//! 3. no fetch leases a row after it gave up, and a row that gave up ends in the failed status, and only such a
//!    row does.

use super::row_map::RowMap;
use super::{CheckInput, RowModel, listed};
use crate::sim::gang::is_gang_row;
use crate::sim::workload::{self, FAILED_STATUS};
use crate::store::{CommitOp, Row, RowId};
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
                }
            }
            CommitOp::Apply { lease, applied: true, .. } => {
                streaks.insert(lease.id, 0);
            }
            CommitOp::Fetch { leases, .. } => {
                for lease in leases.iter().filter(|lease| gave_up.contains(lease.id)) {
                    fail(lease.id, index, "leased again after it gave up".into());
                }
            }
            _ => {}
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
    Err(format!("{} rows broke the retry rules: {}", broken.len(), listed(&broken)))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{apply, commit, fetch, input, lease, row};
    use super::*;
    use crate::store::Lease;

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

    #[test]
    fn a_failed_row_that_never_gave_up_fires() {
        let rows = [row(2, "task", FAILED_STATUS)];
        let violation = check(&input(&[], &[], &rows)).expect_err("the checker missed a failed row");
        assert!(violation.contains("is failed but never gave up"), "{violation}");
    }
}
