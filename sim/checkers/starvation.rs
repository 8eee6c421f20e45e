//! No lock starvation (DESIGN §3 related locks, dstack #3704; DESIGN §5): after the heal, an item that contends
//! for its related rows gets them within the bound the scenario sets: a parent that must hold all its children
//! (owner: its pipeline), and an item locking resources shared with other items of its pipeline (owner
//! `Pipeline:{item}`).
//!
//! From the commit history: for each `lock_related` holder row, a streak starts at its first contended attempt and
//! ends at its next successful lock, or at the liveness snapshot if it never got one. The part of a streak after
//! the heal must not exceed the bound: children that keep taking their rows back, intent marks that never let the
//! parent in, or items of one pipeline whose marks hold each other off in a cycle (each marked a row another needs;
//! a new user's trial found that livelock, scenarios/rows-shared-pairs.toml runs it) show up here long before a
//! row hangs for good.

use super::row_map::RowMap;
use super::{CheckInput, listed};
use crate::store::{CommitOp, LockOutcome, RowId, Timestamp};

/// The check; the error lists the starved parents and how long each waited.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    let bound = crate::store::duration_micros(input.starvation_bound);
    let mut open: RowMap<(Timestamp, usize)> = RowMap::new();
    let mut starved = Vec::new();
    let mut measure = |id: RowId, start: Timestamp, attempts: usize, end: Timestamp, resolved: bool| {
        let waited = end.as_micros() - start.max(input.heal_at).as_micros();
        if waited > bound {
            let how = if resolved { "before it locked" } else { "and never locked" };
            let times = if attempts == 1 { "time" } else { "times" };
            starved.push(format!(
                "row {id} contended {attempts} {times} from {start}, waited {:.1} s after the heal {how}",
                waited as f64 / 1e6
            ));
        }
    };
    for commit in input.history {
        let CommitOp::LockRelated { holder, outcome, .. } = &commit.op else { continue };
        match outcome {
            LockOutcome::Contended { .. } => open.get_or_insert_with(holder.id, || (commit.at, 0)).1 += 1,
            LockOutcome::Locked => {
                if let Some((start, attempts)) = open.remove(holder.id) {
                    measure(holder.id, start, attempts, commit.at, true);
                }
            }
            LockOutcome::Stale => {}
        }
    }
    for (id, (start, attempts)) in open.iter() {
        measure(id, *start, *attempts, input.liveness_at, false);
    }
    if starved.is_empty() {
        return Ok(());
    }
    let bound = crate::duration::format(input.starvation_bound);
    let rows = crate::text::count(starved.len() as u64, "row");
    Err(format!("{rows} starved past {bound}: {}", listed(&starved)))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{commit, input, lease};
    use super::*;
    use crate::store::Commit;

    fn lock(secs: u64, holder: i64, owner: &str, outcome: LockOutcome) -> Commit {
        commit(
            secs,
            CommitOp::LockRelated { holder: lease(holder, 1), related: vec![RowId(9)], owner: owner.into(), outcome },
        )
    }

    #[test]
    fn contention_resolved_in_time_passes() {
        let history = [
            lock(90, 1, "jobs", LockOutcome::Contended { by_own_pipeline: false }),
            lock(130, 1, "jobs", LockOutcome::Locked),
        ];
        assert_eq!(check(&input(&history, &[], &[])), Ok(()));
    }

    #[test]
    fn a_parent_that_never_locks_after_the_heal_fires() {
        // Heal at 100 s, bound 60 s: contended from 95 s, locked only at 170 s, 70 s after the heal.
        let history: Vec<Commit> = (0..8)
            .map(|i| lock(95 + i * 10, 1, "jobs", LockOutcome::Contended { by_own_pipeline: false }))
            .chain([lock(170, 1, "jobs", LockOutcome::Locked)])
            .collect();
        let violation = check(&input(&history, &[], &[])).expect_err("the checker missed a starved parent");
        assert!(violation.contains("row 1 contended 8 times"), "{violation}");
        assert!(violation.contains("waited 70.0 s"), "{violation}");
    }

    #[test]
    fn an_item_locking_shared_rows_is_held_to_the_bound_too() {
        // Heal at 100 s, bound 60 s: contended at 95 s, locked only at 170 s.
        let owner = "claims-0:2";
        let history = [
            lock(95, 2, owner, LockOutcome::Contended { by_own_pipeline: false }),
            lock(170, 2, owner, LockOutcome::Locked),
        ];
        let violation = check(&input(&history, &[], &[])).expect_err("the checker missed a starved item");
        assert!(violation.contains("row 2 contended 1 time from"), "{violation}");
        assert!(violation.contains("waited 70.0 s"), "{violation}");
    }
}
