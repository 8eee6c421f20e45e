//! The store's lease rules, call by call (DESIGN §2 and §3): not only outcomes. A change that breaks one of these
//! rules but no final outcome (every row still ends, no stale write takes effect) passes every other checker; this
//! one reads the commit history and fires at the first commit that breaks a rule:
//!
//! 1. **no live lease is taken**: a fetch never leases a row whose lease, or whose related lock under another row's
//!    lease, is live (handed out or extended less than the lease ttl ago, and not ended by an apply, a failure, a
//!    reset or a release);
//! 2. **a heartbeat never revives a lease**: a heartbeat extends only leases still live when it commits;
//! 3. **a reset waits `retry_delay`**: a row its pipeline reset for retry is not leased by that pipeline again
//!    sooner than the pipeline's retry delay, unless a hint named the row (or its kind) since;
//! 4. **a reset mark holds the row for its pipeline**: while the mark of a reset stands (owner, no lease), no other
//!    pipeline's fetch leases the row;
//! 5. **a failed row waits for its retry**: a row whose failure was recorded is not leased again before the shortest
//!    delay its pipeline's policy draws for that attempt;
//! 6. **a fetch hint is acted on**: after the heal has settled ([`super::capacity::Capacity::settle`]), a hint of a
//!    row kind is followed by a fetch of every pipeline of that kind within [`HINT_PICKUP_BOUND`] of idle time
//!    (time in which some replica of the pipeline had an idle worker, [`super::capacity`]; a worker running a
//!    handler on past a lapsed lease is busy until its write): a fetcher that sleeps through hints leaves ready
//!    rows to its polling. A lock of the pipeline turned away by rows its own items hold starts the wait again: a
//!    replica whose items meet its pipeline's holders elsewhere backs off and lets hints wait, the holders having
//!    heard the same hint.
//!
//! Rules 1, 2, 5 and 6 are judged for the pipelines whose lease ttl and kinds are known (the built-in workload's row
//! pipelines, [`CheckInput::capacity`]); 3 and 4 for every pipeline.

use super::capacity::IdleClock;
use super::row_map::RowMap;
use super::{CheckInput, listed};
use crate::store::{CommitOp, LockToken, RowId, Timestamp};
use std::collections::BTreeMap;
use std::time::Duration;

/// `retry_delay` of the built-in workload's pipelines (the engine's default: the workload does not set it).
pub const RETRY_DELAY: Duration = crate::pipeline::config::RETRY_DELAY_DEFAULT;

/// How much idle time after a hint of its kind a pipeline may take to fetch (rule 6), in simulated time: a hint
/// wakes a fetcher at once in every state (DESIGN §3), so this is a fetch's round trip with room to spare.
pub const HINT_PICKUP_BOUND: Duration = Duration::from_secs(1);

/// A lease the history handed out: its pipeline, the rows it locks (its own first) and until when it lives.
struct Live {
    pipeline: String,
    rows: Vec<RowId>,
    expires: Timestamp,
}

/// What a row last went through, for rules 3 to 5.
enum Mark {
    /// Reset for retry by its pipeline at this time.
    Reset { pipeline: String, at: Timestamp },
    /// Failed; no fetch before this time.
    Failed { not_before: Timestamp },
}

/// The check; the error lists the commits that broke a rule (the first per row).
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    let ttl = input.capacity.lease_ttl;
    let judged = |pipeline: &str| input.capacity.workers.contains_key(pipeline) && !ttl.is_zero();
    let policy = crate::sim::workload::retry_policy(input.attempts_max);
    let mut leases: BTreeMap<LockToken, Live> = BTreeMap::new();
    // The token whose lease (or related lock) holds each row, and until when the row's own lock lives (a related
    // lock lives a lease ttl from when it was taken, and heartbeats of its token extend it).
    let mut held_by: RowMap<(LockToken, Timestamp)> = RowMap::new();
    let mut marks: RowMap<Mark> = RowMap::new();
    // Rows hinted since their last fetch (a hint during a lease survives its apply or reset; a fetch clears it).
    let mut hinted: RowMap<()> = RowMap::new();
    let mut broken: BTreeMap<RowId, String> = BTreeMap::new();
    let mut fail = |id: RowId, index: usize, what: String| {
        broken.entry(id).or_insert_with(|| format!("row {id}: commit {index}: {what}"));
    };
    // Rule 6: per pipeline, the first hint not yet followed by a fetch: its commit, its row, and the pipeline's idle
    // time then.
    let mut clock =
        IdleClock::new(input.capacity, input.history.first().map_or(input.heal_at, |c| c.at), input.history);
    let mut unanswered: BTreeMap<String, (usize, Option<RowId>, u64)> = BTreeMap::new();
    let mut ignored: Vec<String> = Vec::new();
    let bound = HINT_PICKUP_BOUND.as_micros() as u64;
    let mut judge_hint =
        |pipeline: &str, (index, row, idle_then): (usize, Option<RowId>, u64), clock: &IdleClock<'_>, what: &str| {
            let waited = clock.idle_us(pipeline).saturating_sub(idle_then);
            if waited > bound && ignored.len() < 1_000 {
                let row = row.map_or("its kind".to_string(), |row| format!("row {row}"));
                ignored.push(format!(
                    "commit {index}: a hint of {row}: {pipeline} {what} {:.3} s of idle time later (rule 6)",
                    waited as f64 / 1e6
                ));
            }
        };
    for (index, commit) in input.history.iter().enumerate() {
        let now = commit.at;
        clock.advance(now);
        clock.observe(commit);
        match &commit.op {
            CommitOp::Hint { kind, row } if now >= input.heal_at.plus(input.capacity.settle) => {
                for pipeline in input.capacity.pipelines_of_kind.get(kind).into_iter().flatten() {
                    let idle = clock.idle_us(pipeline);
                    unanswered.entry(pipeline.clone()).or_insert((index, *row, idle));
                }
            }
            _ => {}
        }
        match &commit.op {
            CommitOp::Fetch { pipeline, leases: handed } => {
                if let Some(hint) = unanswered.remove(pipeline) {
                    judge_hint(pipeline, hint, &clock, "fetched only");
                }
                for lease in handed {
                    let holder = held_by.get(lease.id).filter(|(_, expires)| *expires > now);
                    if let Some(&(token, expires)) = holder {
                        let owner = leases.get(&token).map_or("?", |live| live.pipeline.as_str());
                        fail(
                            lease.id,
                            index,
                            format!(
                                "{pipeline} leased it while token {} of {owner} held it until {expires} (rule 1)",
                                token.0
                            ),
                        );
                    }
                    let was_hinted = hinted.remove(lease.id).is_some();
                    let mark = marks.remove(lease.id);
                    if let Some(what) = broken_mark(mark, pipeline, now, was_hinted, judged(pipeline)) {
                        fail(lease.id, index, what);
                    }
                    if judged(pipeline) {
                        let live = Live { pipeline: pipeline.clone(), rows: vec![lease.id], expires: now.plus(ttl) };
                        leases.insert(lease.token, live);
                        held_by.insert(lease.id, (lease.token, now.plus(ttl)));
                    }
                }
            }
            CommitOp::Heartbeat { held } => {
                for lease in held {
                    let Some(entry) = leases.get_mut(&lease.token) else { continue };
                    if entry.expires <= now {
                        fail(
                            lease.id,
                            index,
                            format!(
                                "a heartbeat extended token {} after it lapsed at {} (rule 2)",
                                lease.token.0, entry.expires
                            ),
                        );
                    }
                    entry.expires = entry.expires.max(now.plus(ttl));
                    for &id in &entry.rows {
                        if let Some((token, expires)) = held_by.get_mut(id).filter(|(token, _)| *token == lease.token) {
                            debug_assert_eq!(*token, lease.token);
                            *expires = (*expires).max(now.plus(ttl));
                        }
                    }
                }
            }
            CommitOp::LockRelated { holder, related, outcome: crate::store::LockOutcome::Locked, .. } => {
                for &id in related {
                    // The lock replaces a reset mark another pipeline left on the row.
                    marks.remove(id);
                }
                if let Some(entry) = leases.get_mut(&holder.token) {
                    for &id in related {
                        entry.rows.push(id);
                        held_by.insert(id, (holder.token, now.plus(ttl)));
                    }
                }
            }
            CommitOp::LockRelated {
                holder,
                outcome: crate::store::LockOutcome::Contended { by_own_pipeline: true },
                ..
            } => {
                // Items of the pipeline turned away by rows its items elsewhere hold: a replica in that state backs
                // off and lets hints wait, since the holders got the same hint (`Shared::backs_off_for_contention`),
                // so a hint's wait starts again from here.
                if let Some(live) = leases.get(&holder.token)
                    && let Some(hint) = unanswered.get_mut(&live.pipeline)
                {
                    hint.2 = clock.idle_us(&live.pipeline);
                }
            }
            CommitOp::Apply { lease, .. } => end(&mut leases, &mut held_by, lease.token),
            CommitOp::Reset { lease, held } => {
                let pipeline = leases.get(&lease.token).map(|live| live.pipeline.clone());
                end(&mut leases, &mut held_by, lease.token);
                if let (true, Some(pipeline)) = (*held, pipeline) {
                    marks.insert(lease.id, Mark::Reset { pipeline, at: now });
                }
            }
            CommitOp::Failure { lease, attempts, gave_up } => {
                let pipeline = leases.get(&lease.token).map(|live| live.pipeline.clone());
                end(&mut leases, &mut held_by, lease.token);
                if let (Some(attempt), false, Some(_)) = (attempts, gave_up, pipeline) {
                    let shortest = policy.backoff(*attempt, -1.0);
                    marks.insert(lease.id, Mark::Failed { not_before: now.plus(shortest) });
                }
            }
            CommitOp::Release { released } => {
                for lease in released {
                    end(&mut leases, &mut held_by, lease.token);
                }
            }
            CommitOp::Hint { row: Some(id), .. } => {
                // A hint of the row makes it eligible at once for its pipeline until a fetch leases it (rule 3; a hint
                // of a whole kind marks no row).
                hinted.insert(*id, ());
            }
            _ => {}
        }
    }
    clock.advance(input.liveness_at.max(clock_now(input)));
    for (pipeline, hint) in std::mem::take(&mut unanswered) {
        judge_hint(&pipeline, hint, &clock, "had not fetched");
    }
    if broken.is_empty() && ignored.is_empty() {
        return Ok(());
    }
    let broken: Vec<String> = broken.into_values().chain(ignored).collect();
    let rows = crate::text::count(broken.len() as u64, "row");
    Err(format!("{rows} broke the store's lease rules or a hint went unheard: {}", listed(&broken)))
}

/// Which of rules 3 to 5 a fetch by `pipeline` at `now` breaks, given the `mark` the row carried, whether it was
/// hinted since its last fetch, and whether the pipeline's policy is known (rule 5).
fn broken_mark(mark: Option<Mark>, pipeline: &str, now: Timestamp, hinted: bool, judged: bool) -> Option<String> {
    let seconds = |from: Timestamp, to: Timestamp| (to.as_micros() - from.as_micros()) as f64 / 1e6;
    match mark? {
        Mark::Reset { pipeline: owner, at } if owner == pipeline => {
            let due = at.plus(RETRY_DELAY);
            (!hinted && now < due).then(|| {
                format!(
                    "{pipeline} leased it again {:.3} s before its retry delay after its reset (rule 3)",
                    seconds(now, due)
                )
            })
        }
        Mark::Reset { pipeline: owner, .. } => {
            Some(format!("{pipeline} leased it while {owner}'s reset mark stood (rule 4)"))
        }
        Mark::Failed { not_before } => (judged && now < not_before).then(|| {
            format!("{pipeline} leased it {:.3} s before its retry could fall due (rule 5)", seconds(now, not_before))
        }),
    }
}

/// The time of the history's last commit (the heal's if there is none).
fn clock_now(input: &CheckInput<'_>) -> Timestamp {
    input.history.last().map_or(input.heal_at, |commit| commit.at)
}

/// Ends the lease `token` and frees the rows it held.
fn end(leases: &mut BTreeMap<LockToken, Live>, held_by: &mut RowMap<(LockToken, Timestamp)>, token: LockToken) {
    let Some(live) = leases.remove(&token) else { return };
    for id in live.rows {
        if held_by.get(id).is_some_and(|(holder, _)| *holder == token) {
            held_by.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::capacity::Capacity;
    use super::super::fixtures::{apply, commit, input, lease, row};
    use super::*;
    use crate::store::{Commit, LockOutcome};

    fn capacity() -> Capacity {
        Capacity {
            replicas: 1,
            lease_ttl: Duration::from_secs(10),
            workers: BTreeMap::from([("tasks".to_string(), 1), ("jobs".to_string(), 1)]),
            pipelines_of_kind: BTreeMap::from([("task".to_string(), vec!["tasks".to_string()])]),
            settle: Duration::ZERO,
            fault_free: false,
        }
    }

    fn fetch(secs: u64, pipeline: &str, id: i64, token: i64) -> Commit {
        commit(secs, CommitOp::Fetch { pipeline: pipeline.into(), leases: vec![lease(id, token)] })
    }

    fn judge(history: &[Commit]) -> Result<(), String> {
        let capacity = capacity();
        let rows = [row(1, "task", "finished")];
        check(&CheckInput { capacity: &capacity, ..input(history, &[], &rows) })
    }

    fn millis(commit: Commit, ms: u64) -> Commit {
        Commit { at: commit.at.plus(Duration::from_millis(ms)), ..commit }
    }

    #[test]
    fn leases_that_follow_the_rules_pass() {
        let history = [
            fetch(1, "tasks", 1, 1),
            commit(6, CommitOp::Heartbeat { held: vec![lease(1, 1)] }),
            commit(7, CommitOp::Reset { lease: lease(1, 1), held: true }),
            fetch(8, "tasks", 1, 2),
            commit(9, CommitOp::Failure { lease: lease(1, 2), attempts: Some(1), gave_up: false }),
            fetch(10, "tasks", 1, 3),
            apply(11, lease(1, 3), true),
            fetch(12, "jobs", 1, 4),
        ];
        assert_eq!(judge(&history), Ok(()));
    }

    #[test]
    fn a_fetch_of_a_row_under_a_live_lease_or_related_lock_fires() {
        let taken = [fetch(1, "tasks", 1, 1), fetch(5, "tasks", 1, 2)];
        let error = judge(&taken).expect_err("a live lease taken");
        assert!(error.contains("row 1: commit 1: tasks leased it while token 1 of tasks held it"), "{error}");
        let lapsed = [fetch(1, "tasks", 1, 1), fetch(12, "tasks", 1, 2)];
        assert_eq!(judge(&lapsed), Ok(()), "a lapsed lease is taken over");
        let locked = commit(
            2,
            CommitOp::LockRelated {
                holder: lease(2, 1),
                related: vec![RowId(1)],
                owner: "jobs".into(),
                outcome: LockOutcome::Locked,
            },
        );
        let related = [fetch(1, "jobs", 2, 1), locked, fetch(3, "tasks", 1, 2)];
        let error = judge(&related).expect_err("a related lock taken");
        assert!(error.contains("rule 1"), "{error}");
    }

    #[test]
    fn a_heartbeat_of_a_lapsed_lease_fires() {
        let history = [fetch(1, "tasks", 1, 1), commit(12, CommitOp::Heartbeat { held: vec![lease(1, 1)] })];
        let error = judge(&history).expect_err("a lapsed lease revived");
        assert!(error.contains("a heartbeat extended token 1 after it lapsed"), "{error}");
    }

    #[test]
    fn a_reset_row_leased_again_inside_its_retry_delay_fires_unless_hinted() {
        let reset = commit(2, CommitOp::Reset { lease: lease(1, 1), held: true });
        let early = [fetch(1, "tasks", 1, 1), reset.clone(), millis(fetch(2, "tasks", 1, 2), 100)];
        let error = judge(&early).expect_err("a reset row leased early");
        assert!(error.contains("before its retry delay after its reset (rule 3)"), "{error}");
        let hint = commit(2, CommitOp::Hint { kind: "task".into(), row: Some(RowId(1)) });
        let hinted = [fetch(1, "tasks", 1, 1), reset.clone(), hint.clone(), millis(fetch(2, "tasks", 1, 2), 100)];
        assert_eq!(judge(&hinted), Ok(()), "a hinted reset row is eligible at once");
        let during = [fetch(1, "tasks", 1, 1), hint.clone(), reset.clone(), millis(fetch(2, "tasks", 1, 2), 100)];
        assert_eq!(judge(&during), Ok(()), "a hint during the lease survives the reset");
        let spent = [
            fetch(1, "tasks", 1, 1),
            hint,
            commit(2, CommitOp::Reset { lease: lease(1, 1), held: true }),
            millis(fetch(2, "tasks", 1, 2), 600),
            millis(commit(2, CommitOp::Reset { lease: lease(1, 2), held: true }), 700),
            millis(fetch(2, "tasks", 1, 3), 800),
        ];
        let error = judge(&spent).expect_err("a fetch spends the hint");
        assert!(error.contains("rule 3"), "{error}");
        let other = [fetch(1, "tasks", 1, 1), reset, fetch(5, "jobs", 1, 2)];
        let error = judge(&other).expect_err("another pipeline took a reset mark");
        assert!(error.contains("jobs leased it while tasks's reset mark stood (rule 4)"), "{error}");
    }

    /// Fixtures heal at 100 s. One replica with one `tasks` worker: a hint of a task at 101 s with the worker idle
    /// and no fetch until 103 s went unheard for 2 s; with the worker busy until 102.5 s, 0.5 s.
    #[test]
    fn a_hint_no_fetcher_acts_on_while_a_worker_idles_fires() {
        let by_replica = |mut commit: Commit| {
            commit.caller = Some(std::sync::Arc::from("replica-0"));
            commit
        };
        let hint = commit(101, CommitOp::Hint { kind: "task".into(), row: Some(RowId(7)) });
        let unheard = [hint.clone(), by_replica(fetch(103, "tasks", 7, 1))];
        let error = judge(&unheard).expect_err("an unheard hint");
        assert!(error.contains("a hint of row 7: tasks fetched only 2.000 s of idle time later (rule 6)"), "{error}");
        let busy = [
            by_replica(fetch(100, "tasks", 8, 2)),
            hint.clone(),
            millis(by_replica(apply(102, lease(8, 2), true)), 500),
            by_replica(fetch(103, "tasks", 7, 1)),
        ];
        assert_eq!(judge(&busy), Ok(()), "the only worker was busy until 102.5 s");
        let before_heal =
            [commit(50, CommitOp::Hint { kind: "task".into(), row: None }), by_replica(fetch(60, "tasks", 7, 1))];
        assert_eq!(judge(&before_heal), Ok(()), "a hint before the heal is not judged");
        let never = [hint];
        let error = judge(&never).expect_err("a hint never acted on");
        assert!(error.contains("tasks had not fetched"), "{error}");
    }

    /// Two `tasks` workers on one replica, as in `scenarios/tasks-hint-late.toml`. Task 8's lease lapses at 110 s
    /// unrenewed (its replica was cut off from the store) while its worker runs the handler on; task 7 is leased at
    /// 105 s into the other worker, and task 9 at 105 s into the queue, given back at 111 s with a hint of its kind;
    /// the replica fetches again at 113 s, once task 8's handler returned (its apply stale at 112.5 s). Both workers
    /// were busy from the hint to 112.5 s, so the hint waited 0.5 s of idle time: a worker is busy with its item
    /// until its write, whatever became of the lease in the store (docs/engine.md: a handler runs on past a lapsed
    /// lease, and its guarded apply succeeds if no one took the row). Without that late write the worker was free
    /// from the lapse on, and 2 s of idle time fire.
    #[test]
    fn a_hint_while_a_handler_runs_on_past_its_lapsed_lease_waits_for_that_worker() {
        let by_replica = |mut commit: Commit| {
            commit.caller = Some(std::sync::Arc::from("replica-0"));
            commit
        };
        let capacity = Capacity { workers: BTreeMap::from([("tasks".to_string(), 2)]), ..capacity() };
        let rows = [row(7, "task", "finished"), row(8, "task", "finished"), row(9, "task", "finished")];
        let history = [
            by_replica(fetch(100, "tasks", 8, 1)),
            by_replica(fetch(105, "tasks", 7, 4)),
            by_replica(fetch(105, "tasks", 9, 2)),
            by_replica(commit(111, CommitOp::Release { released: vec![lease(9, 2)] })),
            commit(111, CommitOp::Hint { kind: "task".into(), row: None }),
            millis(by_replica(apply(112, lease(8, 1), false)), 500),
            by_replica(fetch(113, "tasks", 9, 3)),
            by_replica(apply(114, lease(7, 4), true)),
        ];
        assert_eq!(check(&CheckInput { capacity: &capacity, ..input(&history, &[], &rows) }), Ok(()));
        let free: Vec<Commit> = history
            .iter()
            .filter(|commit| !matches!(commit.op, CommitOp::Apply { applied: false, .. }))
            .cloned()
            .collect();
        let error = check(&CheckInput { capacity: &capacity, ..input(&free, &[], &rows) }).expect_err("idle worker");
        assert!(
            error.contains("a hint of its kind: tasks fetched only 2.000 s of idle time later (rule 6)"),
            "{error}"
        );
    }

    #[test]
    fn a_failed_row_leased_before_its_retry_fires() {
        // A first failure's shortest delay is 80 ms (100 ms, jitter 0.2).
        let failure = commit(2, CommitOp::Failure { lease: lease(1, 1), attempts: Some(1), gave_up: false });
        let early = [fetch(1, "tasks", 1, 1), failure, millis(fetch(2, "tasks", 1, 2), 50)];
        let error = judge(&early).expect_err("a failed row leased early");
        assert!(error.contains("before its retry could fall due (rule 5)"), "{error}");
    }
}
