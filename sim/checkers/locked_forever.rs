//! No row locked forever (DESIGN §5): after every replica drained and a lease ttl passed, no row may still be
//! held.
//!
//! A row is held at the final time if it carries a token that has not expired, or an owner mark that has not
//! expired, or an owner with no expiry at all on a row that reached the end of its life (a reset mark left behind:
//! only its own pipeline can take the row again, and it never will, so write APIs answer `Busy` forever).
//! Expired leases and expired marks are fine: the next taker clears them. A reset mark on a row that is not final
//! yet is its pipeline's to fetch again, not a lock: whether that ever happened is the liveness checker's verdict,
//! and listing the row here too only buried it (a new user's trial).

use super::{CheckInput, describe, listed};
use crate::store::{Row, Timestamp};

/// Whether `row` is held by anyone at `now`; `is_final`: whether it reached the end of its life.
pub fn held(row: &Row, now: Timestamp, is_final: bool) -> bool {
    let live = row.lock_expires_at.is_some_and(|expires| expires > now);
    let reset_mark = row.lock_expires_at.is_none() && row.lock_token.is_none() && row.lock_owner.is_some();
    let dangling_token = row.lock_expires_at.is_none() && row.lock_token.is_some();
    live || (reset_mark && is_final) || dangling_token
}

/// The check; the error lists the held rows.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    let held: Vec<String> = input
        .rows_final
        .iter()
        .filter(|row| held(row, input.final_at, input.rows.is_final(row)))
        .map(describe)
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} rows still held at the end ({}), after every replica drained: {}",
        held.len(),
        input.final_at,
        listed(&held)
    ))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{at, input, row};
    use super::*;
    use crate::store::LockToken;

    #[test]
    fn expired_leases_and_marks_pass() {
        let mut expired = row(1, "task", "done");
        expired.lock_token = Some(LockToken(4));
        expired.lock_owner = Some("jobs".into());
        expired.lock_expires_at = Some(at(150));
        assert_eq!(check(&input(&[], &[], &[expired, row(2, "task", "done")])), Ok(()));
    }

    #[test]
    fn a_reset_mark_left_behind_fires() {
        let mut marked = row(3, "claim-0", "done");
        marked.lock_owner = Some("claims-0".into());
        let violation = check(&input(&[], &[], &[marked])).expect_err("the checker missed a reset mark");
        assert!(violation.contains("row 3 (claim-0 done)"), "{violation}");
    }

    #[test]
    fn a_reset_mark_on_a_row_still_to_process_is_left_to_liveness() {
        let mut marked = row(3, "claim-0", "ready");
        marked.lock_owner = Some("claims-0".into());
        assert_eq!(check(&input(&[], &[], &[marked])), Ok(()));
    }

    #[test]
    fn a_live_lease_at_the_end_fires() {
        let mut leased = row(4, "task", "done");
        leased.lock_token = Some(LockToken(9));
        leased.lock_expires_at = Some(at(500));
        assert!(check(&input(&[], &[], &[leased])).is_err());
    }
}
