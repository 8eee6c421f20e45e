//! Failing rows end (DESIGN §3, failures): no row of the workload loops on its failures.
//!
//! Replays the commit history's recorded failures ([`CommitOp::Failure`]) per row of the workload's pipelines:
//! 1. each failure's attempt number is one more than the row's failures since its last applied apply (the count
//!    the store keeps is the one the engine backs off and gives up by);
//! 2. no attempt goes past the scenario's `attempts_max`, and a row gives up exactly at it (the workload's
//!    handlers leave the decision to the policy);
//! 3. no fetch leases a row after it gave up, and a row that gave up ends in the failed status, and only such a
//!    row does;
//! 4. a row that failed after the heal (anywhere in a fault-free world), and did not give up, is fetched again within
//!    [`CheckInput::retry_lateness_bound`] of idle time after its retry falls due (its policy's longest delay for
//!    that attempt, jitter included: a row that failed since it was last processed is paced by its retry time
//!    alone, [`crate::store::Store::fetch`]): a replica wakes its fetcher for a retry, rather than leaving the
//!    row to its empty-fetch backoff (a new user's trial saw a 1 s retry wait 3.6 s). Idle time is store time in
//!    which some replica of the row's pipeline had an idle worker ([`super::capacity`]): a retry that waits while
//!    every worker is busy (an overloaded world) waits for capacity, not for a fetcher. A retry waits its turn in
//!    fetch order too: a fetch of its pipeline that leased only rows ahead of it (processed longer ago, or never,
//!    then by id) starts its wait again, since fetches serve the oldest rows first and a row reset for retry keeps
//!    its place ([`crate::store::Store::reset_for_retry`]); and so does a lock of its pipeline turned away from a
//!    row the retry needs (one its row locked before): its turn is that row's, not a fetcher's. A retry whose row a
//!    related lock or intent mark named before the fetch is not judged: the lock holds the row off, and its end
//!    wakes no fetcher of the row's kind.

use super::capacity::IdleClock;
use super::row_map::RowMap;
use super::{CheckInput, RowModel, listed};
use crate::sim::gang::is_gang_row;
use crate::sim::workload::{self, FAILED_STATUS};
use crate::store::{CommitOp, LockOutcome, Row, RowId, Timestamp};
use std::collections::BTreeMap;

/// The check; the error lists every row that broke a rule (the first break of each).
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    if !matches!(input.rows, RowModel::Builtin) {
        // A user's pipelines set their own retry policies; the built-in workload's limit says nothing of them.
        return Ok(());
    }
    // By row id: a lookup per failure, apply and leased row of the history.
    let rows: RowMap<&Row> = input
        .rows_final
        .iter()
        .filter(|row| workload::is_processed(row) && !is_gang_row(row))
        .map(|row| (row.id, row))
        .collect();
    let mut streaks: RowMap<u32> = RowMap::new();
    let mut gave_up: RowMap<()> = RowMap::new();
    // Rows failed after the heal, not yet fetched again: when the retry falls due, the pipeline's idle time then
    // (once the clock passed it), and the failure's commit.
    let mut due: RowMap<Due> = RowMap::new();
    // Retries not yet due, by when they fall due: the clock reads each pipeline's idle time at that instant.
    let mut pending: std::collections::BTreeSet<(Timestamp, RowId)> = std::collections::BTreeSet::new();
    let mut clock =
        IdleClock::new(input.capacity, input.history.first().map_or(input.heal_at, |c| c.at), input.history);
    // The pipeline of each live lease's fetch, by row: a failure's retry is judged by its pipeline's idle time.
    let mut pipeline_of: RowMap<String> = RowMap::new();
    // When each row was last processed (its applied applies), for its place in fetch order; and the rows of `due`
    // whose retry fell due (some may have left `due` since).
    let mut processed_at: RowMap<Timestamp> = RowMap::new();
    let mut past_due: std::collections::BTreeSet<RowId> = std::collections::BTreeSet::new();
    // The related rows each row last asked to lock: the rows its retry will need again.
    let mut needs: RowMap<Vec<RowId>> = RowMap::new();
    let policy = workload::retry_policy(input.attempts_max);
    let mut broken: BTreeMap<RowId, String> = BTreeMap::new();
    let mut fail = |id: RowId, index: usize, what: String| {
        broken.entry(id).or_insert_with(|| format!("row {id}: commit {index}: {what}"));
    };
    for (index, commit) in input.history.iter().enumerate() {
        while let Some(&(at, id)) = pending.first().filter(|(at, _)| *at <= commit.at) {
            pending.pop_first();
            clock.advance(at);
            // Only this retry's own instant: a row fetched before an earlier retry fell due may have failed again.
            if let Some(due) = due.get_mut(id).filter(|due| due.at == at) {
                due.idle_at_due = Some(clock.idle_us(&due.pipeline));
                past_due.insert(id);
            }
        }
        clock.advance(commit.at);
        clock.observe(commit);
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
                } else if input.retry_lateness_bound.is_some()
                    && (input.capacity.fault_free || commit.at >= input.heal_at.plus(input.capacity.settle))
                {
                    // Eligible once its delay has passed ([`crate::store::Store::fetch`]); a hint only makes it
                    // sooner.
                    let at = commit.at.plus(policy.backoff(*attempt, 1.0));
                    let pipeline = pipeline_of.get(lease.id).cloned().unwrap_or_default();
                    due.insert(lease.id, Due { at, pipeline, idle_at_due: None, failed: index, failed_at: commit.at });
                    pending.insert((at, lease.id));
                }
            }
            CommitOp::LockRelated { holder, related, outcome, .. } => {
                // A related lock or intent mark holds the row from its own fetch (a parent first, DESIGN §3), and
                // its end wakes no fetcher of the row's kind: a retry a related lock met is not judged.
                for &id in related {
                    due.remove(id);
                }
                needs.insert(holder.id, related.clone());
                // Rows of its pipeline turned away from a row a due retry needs: the retry's turn is that row's,
                // not a fetcher's (a worker that took it now would be turned away too), so its wait restarts.
                if matches!(outcome, LockOutcome::Contended { .. })
                    && let Some(pipeline) = pipeline_of.get(holder.id)
                {
                    let idle = clock.idle_us(pipeline);
                    past_due.retain(|&id| match due.get_mut(id) {
                        Some(due) => {
                            let hot = needs.get(id).is_some_and(|rows| rows.iter().any(|row| related.contains(row)));
                            if &due.pipeline == pipeline && due.idle_at_due.is_some() && hot {
                                due.idle_at_due = Some(idle);
                            }
                            true
                        }
                        None => false,
                    });
                }
            }
            CommitOp::Apply { lease, applied: true, .. } => {
                processed_at.insert(lease.id, commit.at);
                // An applied apply ends the row's run of failures (the store sets its attempts back to 0), whether
                // or not it changed the row's status: a parent that found its children unfinished and failed later
                // fails its attempt 1 again (the handler-hang fault's hung jobs showed the rule was not applied).
                streaks.remove(lease.id);
            }
            CommitOp::Fetch { leases, pipeline } => {
                // A fetch that leased only rows ahead of a due retry served them first: the retry's wait restarts.
                let place = |id: RowId| (processed_at.get(id).copied(), id);
                if let Some(last) = leases.iter().map(|lease| place(lease.id)).max() {
                    let idle = clock.idle_us(pipeline);
                    past_due.retain(|&id| match due.get_mut(id) {
                        Some(due) => {
                            if &due.pipeline == pipeline && due.idle_at_due.is_some() && last < place(id) {
                                due.idle_at_due = Some(idle);
                            }
                            true
                        }
                        None => false,
                    });
                }
                for lease in leases {
                    pipeline_of.insert(lease.id, pipeline.clone());
                    if gave_up.contains(lease.id) {
                        fail(lease.id, index, "leased again after it gave up".into());
                    }
                    let Some(due) = due.remove(lease.id) else { continue };
                    if let Some(late) = due.late(&clock, input.retry_lateness_bound) {
                        fail(
                            lease.id,
                            index,
                            format!(
                                "fetched {late}: failed at {}, due at {} (its longest delay), fetched at {}, while \
                                 a worker of its pipeline {} idled",
                                due.failed_at, due.at, commit.at, due.pipeline
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    while let Some((at, id)) = pending.pop_first().filter(|(at, _)| *at <= input.liveness_at) {
        clock.advance(at);
        if let Some(due) = due.get_mut(id).filter(|due| due.at == at) {
            due.idle_at_due = Some(clock.idle_us(&due.pipeline));
        }
    }
    clock.advance(input.liveness_at);
    for (id, due) in due.iter() {
        if let Some(late) = due.late(&clock, input.retry_lateness_bound) {
            fail(
                id,
                due.failed,
                format!(
                    "not fetched again {late}, when the liveness wait ended: failed at {}, due at {}, while a worker of \
                     its pipeline {} idled",
                    due.failed_at, due.at, due.pipeline
                ),
            );
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
    let rows = crate::text::count(broken.len() as u64, "row");
    Err(format!("{rows} broke the retry rules: {}", listed(&broken)))
}

/// A failed row's retry, not yet fetched.
struct Due {
    /// When it falls due.
    at: Timestamp,
    /// The pipeline whose lease failed.
    pipeline: String,
    /// The pipeline's idle time when it fell due ([`IdleClock::idle_us`]), once the clock passed that instant.
    idle_at_due: Option<u64>,
    /// The failure's commit, and its time.
    failed: usize,
    failed_at: Timestamp,
}

impl Due {
    /// How far past `bound` of idle time since the retry fell due the clock is now, for a message (`0.052 s past
    /// the bound of 0.500 s of idle time`); `None` within it, or before the retry fell due.
    fn late(&self, clock: &IdleClock<'_>, bound: Option<std::time::Duration>) -> Option<String> {
        let (bound, idle_at_due) = (bound?, self.idle_at_due?);
        let waited = clock.idle_us(&self.pipeline).saturating_sub(idle_at_due);
        let bound = bound.as_micros() as u64;
        let seconds = |micros: u64| micros as f64 / 1e6;
        (waited > bound).then(|| {
            format!(
                "{:.3} s of idle time after its retry fell due ({:.3} s past the bound)",
                seconds(waited),
                seconds(waited - bound)
            )
        })
    }
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

    /// An applied apply ends a run of failures even when it changes nothing (a parent whose children were not
    /// done): the next failure is attempt 1 again, and one that counts on is a break.
    #[test]
    fn an_applied_apply_ends_a_run_of_failures() {
        let history = [
            failure(1, lease(1, 1), 1, false),
            apply(2, lease(1, 2), true),
            failure(3, lease(1, 3), 1, false),
            apply(4, lease(1, 4), true),
        ];
        let rows = [row(1, "job", "done")];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
        let counted_on =
            [failure(1, lease(1, 1), 1, false), apply(2, lease(1, 2), true), failure(3, lease(1, 3), 2, false)];
        let violation = check(&input(&counted_on, &[], &rows)).expect_err("a streak carried past an apply");
        assert!(violation.contains("attempt 2 recorded after 0 failures in a row"), "{violation}");
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
            violation.contains("row 2: commit 1: fetched 1.880 s of idle time after its retry fell due (0.880 s past"),
            "{violation}"
        );
        let unjudged = CheckInput { retry_lateness_bound: None, ..input(&history, &[], &rows) };
        assert_eq!(check(&unjudged), Ok(()), "a chaos run judges no lateness");
        let before_heal = [failure(1, lease(2, 3), 1, false), fetch(9, lease(2, 4)), apply(10, lease(2, 4), true)];
        assert_eq!(check(&input(&before_heal, &[], &rows)), Ok(()), "a failure before the heal is not judged");
    }

    /// A retry falls due at its delay alone, however recently the row was processed: a row reset for retry at
    /// 100.9 s and failing at 101 s (longest delay 120 ms) is due at 101.12 s (the store's rule, conformance case
    /// `a_row_failed_since_it_was_processed_waits_for_its_retry_not_the_interval`).
    #[test]
    fn a_retry_falls_due_at_its_delay_even_just_after_a_reset() {
        let mut reset = commit(100, CommitOp::Reset { lease: lease(2, 2), held: true });
        reset.at = at(100).plus(Duration::from_millis(900));
        let mut history = vec![reset, failure(101, lease(2, 3), 1, false), fetch(102, lease(2, 4))];
        let rows = [row(2, "task", "ready")];
        assert_eq!(check(&input(&history, &[], &rows)), Ok(()));
        history[2].at = at(102).plus(Duration::from_millis(500));
        let violation = check(&input(&history, &[], &rows)).expect_err("the checker missed a late retry");
        assert!(
            violation.contains("fetched 1.380 s of idle time after its retry fell due (0.380 s past"),
            "{violation}"
        );
    }

    /// A retry that waits while every worker of its pipeline is busy waits for capacity: only the time in which a
    /// worker idled counts. One replica with one worker of `p`: row 5's lease holds it from 100 s to 104.5 s, so
    /// row 2, failing its second attempt at 101 s (due at 101.24 s) and fetched at 105 s, waited 0.5 s of idle
    /// time (in time); fetched at 106 s, 1.5 s (late by 0.5 s).
    #[test]
    fn a_retry_waiting_while_every_worker_is_busy_is_judged_by_the_idle_time_only() {
        let capacity = super::super::capacity::Capacity {
            replicas: 1,
            lease_ttl: Duration::from_secs(30),
            workers: BTreeMap::from([("p".to_string(), 1)]),
            pipelines_of_kind: BTreeMap::new(),
            settle: Duration::ZERO,
            fault_free: false,
        };
        let by_replica = |mut commit: crate::store::Commit| {
            commit.caller = Some(std::sync::Arc::from("replica-0"));
            commit
        };
        let mut busy_until = apply(104, lease(5, 9), true);
        busy_until.at = at(104).plus(Duration::from_millis(500));
        let mut history = vec![
            by_replica(fetch(99, lease(2, 3))),
            by_replica(failure(99, lease(2, 3), 1, false)),
            by_replica(fetch(100, lease(5, 9))),
            by_replica(failure(101, lease(2, 30), 1, false)),
            busy_until,
            by_replica(fetch(105, lease(2, 4))),
        ];
        // The second failure is the judged one (after the heal); its lease was fetched before by `p`.
        history[3] = by_replica(failure(101, lease(2, 3), 2, false));
        let rows = [row(2, "task", "ready"), row(5, "task", "finished")];
        let judged = CheckInput { capacity: &capacity, ..input(&history, &[], &rows) };
        assert_eq!(check(&judged), Ok(()), "0.5 s of idle time is within the bound");
        history[5].at = at(106);
        let judged = CheckInput { capacity: &capacity, ..input(&history, &[], &rows) };
        let violation = check(&judged).expect_err("the checker missed a retry late by idle time");
        assert!(violation.contains("after its retry fell due (0.500 s past the bound)"), "{violation}");
        let unbounded = input(&history, &[], &rows);
        assert!(check(&unbounded).is_err(), "judged whole, the wait is late too");
    }

    /// A row fetched before its retry fell due and failing again is judged by its new retry only: the earlier
    /// retry's instant passing later says nothing (a swarm world's row failing attempts 5 and 6 was called 1.4 s
    /// late by the first one's instant).
    #[test]
    fn a_row_failing_again_before_its_retry_fell_due_is_judged_by_its_new_retry() {
        let ms = |commit: crate::store::Commit, ms: u64| crate::store::Commit {
            at: commit.at.plus(Duration::from_millis(ms)),
            ..commit
        };
        // Attempts 1 to 4 before the heal. Attempt 5 at 100 s: its longest delay (1.6 s, jitter 0.2) ends at
        // 101.92 s, but its drawn delay was shorter: fetched at 101.3 s, it fails attempt 6 at 101.4 s, whose longest
        // delay (capped at 2 s) ends at 103.4 s; fetched at 103.3 s, in time. Judged from 101.92 s it would be late.
        let mut history = Vec::new();
        for attempt in 1..=4u32 {
            let token = i64::from(attempt);
            history.push(fetch(u64::from(attempt) * 10, lease(2, token)));
            history.push(ms(failure(u64::from(attempt) * 10, lease(2, token), attempt, false), 10));
        }
        history.push(fetch(99, lease(2, 5)));
        history.push(failure(100, lease(2, 5), 5, false));
        history.push(ms(fetch(101, lease(2, 6)), 300));
        history.push(ms(failure(101, lease(2, 6), 6, false), 400));
        history.push(ms(fetch(103, lease(2, 7)), 300));
        let rows = [row(2, "task", "ready")];
        assert_eq!(check(&CheckInput { attempts_max: 10, ..input(&history, &[], &rows) }), Ok(()));
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
        assert!(violation.contains("row 2: commit 0: not fetched again 48.880 s of idle time"), "{violation}");
    }

    #[test]
    fn a_failed_row_that_never_gave_up_fires() {
        let rows = [row(2, "task", FAILED_STATUS)];
        let violation = check(&input(&[], &[], &rows)).expect_err("the checker missed a failed row");
        assert!(violation.contains("is failed but never gave up"), "{violation}");
    }
}
