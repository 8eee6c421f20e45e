//! Lease exclusivity (DESIGN §5): no write succeeds under a superseded token.
//!
//! Replays the commit history, tracking per row the token the store handed out last (by a fetch, or to a
//! related row by a successful `lock_related`) and whether it is still current: an applied apply, a held
//! reset, a recorded failure and a release consume it, and a write API's update that takes over an expired lease voids it. A commit
//! fails the check when it succeeded with any token other than the row's current one: an applied apply (main
//! and related rows), a heartbeat that extended, a held reset, a recorded failure, a release, a lock attempt that locked or left
//! intent marks. A fetch must also hand out a token larger than every earlier one of the row, or the fence is
//! no fence.

use super::CheckInput;
use super::row_map::RowMap;
use crate::store::{Commit, CommitOp, LockOutcome, LockToken, RowId, WriteOutcome};

/// A row's last handed-out token.
#[derive(Clone, Copy, Debug)]
struct Latest {
    token: LockToken,
    /// Still usable: not consumed by an apply, reset or release, nor voided by a write API.
    current: bool,
    /// Index of the commit that handed it out.
    from: usize,
}

/// The check; the error names the first offending commit.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    // By row id: a lookup per lease of every commit.
    let mut latest: RowMap<Latest> = RowMap::new();
    for (index, commit) in input.history.iter().enumerate() {
        let uses = |latest: &RowMap<Latest>, id: RowId, token: LockToken| -> Result<(), String> {
            match latest.get(id) {
                Some(held) if held.token == token && held.current => Ok(()),
                Some(held) => Err(format!(
                    "commit {index} `{}`: row {id} written with token {token}, but its latest token is {} ({}), \
                     handed out by commit {} `{}`",
                    describe(commit),
                    held.token,
                    if held.current { "current" } else { "already used up" },
                    held.from,
                    describe(&input.history[held.from])
                )),
                None => Err(format!(
                    "commit {index} `{}`: row {id} written with token {token}, which was never handed out",
                    describe(commit)
                )),
            }
        };
        let consume = |latest: &mut RowMap<Latest>, id: RowId| {
            if let Some(held) = latest.get_mut(id) {
                held.current = false;
            }
        };
        match &commit.op {
            CommitOp::Fetch { leases, .. } => {
                for lease in leases {
                    if let Some(previous) = latest.get(lease.id).filter(|previous| previous.token >= lease.token) {
                        return Err(format!(
                            "commit {index} `{}`: token {} of row {} is not above its previous token {}",
                            describe(commit),
                            lease.token,
                            lease.id,
                            previous.token
                        ));
                    }
                    latest.insert(lease.id, Latest { token: lease.token, current: true, from: index });
                }
            }
            CommitOp::LockRelated { holder, related, outcome, .. } => match outcome {
                LockOutcome::Locked => {
                    uses(&latest, holder.id, holder.token)?;
                    for id in related {
                        latest.insert(*id, Latest { token: holder.token, current: true, from: index });
                    }
                }
                LockOutcome::Contended { .. } => uses(&latest, holder.id, holder.token)?,
                LockOutcome::Stale => {}
            },
            CommitOp::Apply { lease, applied: true, related, .. } => {
                uses(&latest, lease.id, lease.token)?;
                for id in related {
                    uses(&latest, *id, lease.token)?;
                }
                consume(&mut latest, lease.id);
                for id in related {
                    consume(&mut latest, *id);
                }
            }
            CommitOp::Heartbeat { held } => {
                for lease in held {
                    uses(&latest, lease.id, lease.token)?;
                }
            }
            CommitOp::Reset { lease, held: true } | CommitOp::Failure { lease, attempts: Some(_), .. } => {
                uses(&latest, lease.id, lease.token)?;
                consume(&mut latest, lease.id);
            }
            CommitOp::Release { released } => {
                for lease in released {
                    uses(&latest, lease.id, lease.token)?;
                    consume(&mut latest, lease.id);
                }
            }
            CommitOp::UpdateUnleased { id, outcome: WriteOutcome::Written } => consume(&mut latest, *id),
            _ => {}
        }
    }
    Ok(())
}

fn describe(commit: &Commit) -> String {
    match &commit.caller {
        Some(caller) => format!("{} by {caller}: {}", commit.at, commit.op),
        None => format!("{}: {}", commit.at, commit.op),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{apply, commit, fetch, input, lease};
    use super::*;
    use crate::store::{CommitOp, LockOutcome};

    fn run(history: &[Commit]) -> Result<(), String> {
        check(&input(history, &[], &[]))
    }

    #[test]
    fn a_clean_takeover_passes() {
        let history =
            [fetch(1, lease(1, 1)), fetch(9, lease(1, 2)), apply(10, lease(1, 1), false), apply(11, lease(1, 2), true)];
        assert_eq!(run(&history), Ok(()));
    }

    #[test]
    fn an_apply_with_a_superseded_token_fires() {
        let history = [fetch(1, lease(1, 1)), fetch(9, lease(1, 2)), apply(10, lease(1, 1), true)];
        let violation = run(&history).expect_err("the checker missed a superseded apply");
        assert!(violation.contains("row 1 written with token 1, but its latest token is 2"), "{violation}");
    }

    #[test]
    fn a_second_apply_with_one_token_fires() {
        let history = [fetch(1, lease(1, 1)), apply(2, lease(1, 1), true), apply(3, lease(1, 1), true)];
        let violation = run(&history).expect_err("the checker missed a double apply");
        assert!(violation.contains("already used up"), "{violation}");
    }

    #[test]
    fn a_related_row_applied_under_a_lost_lock_fires() {
        let lock = commit(
            2,
            CommitOp::LockRelated {
                holder: lease(1, 1),
                related: vec![RowId(2)],
                owner: "p".into(),
                outcome: LockOutcome::Locked,
            },
        );
        let mut stale_related = apply(4, lease(1, 1), true);
        if let CommitOp::Apply { related, .. } = &mut stale_related.op {
            related.push(RowId(2));
        }
        let history = [fetch(1, lease(1, 1)), lock, fetch(3, lease(2, 5)), stale_related];
        let violation = run(&history).expect_err("the checker missed a superseded related row");
        assert!(violation.contains("row 2 written with token 1"), "{violation}");
    }

    #[test]
    fn a_heartbeat_of_a_lost_lease_and_a_non_increasing_token_fire() {
        let heartbeat = commit(10, CommitOp::Heartbeat { held: vec![lease(1, 1)] });
        let violation = run(&[fetch(1, lease(1, 1)), fetch(8, lease(1, 3)), heartbeat]).unwrap_err();
        assert!(violation.contains("heartbeat"), "{violation}");
        let violation = run(&[fetch(1, lease(1, 3)), fetch(8, lease(1, 3))]).unwrap_err();
        assert!(violation.contains("not above its previous token"), "{violation}");
    }
}
