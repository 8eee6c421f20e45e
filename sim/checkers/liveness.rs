//! No lost work (DESIGN §5, liveness): after the faults stop, every row reaches its final status within the
//! bound the scenario sets.
//!
//! The world heals, then waits until every row is final or the bound passes, and snapshots the rows; this checker
//! fails on every row of that snapshot that is not final, describing its status and lease columns (a row still
//! leased names the lost holder; a row with an owner and no token names a reset nobody retried).

use super::{CheckInput, describe, listed};

/// The check; the error lists the rows left behind.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    let left: Vec<String> =
        input.rows_at_liveness.iter().filter(|row| !input.rows.is_final(row)).map(describe).collect();
    let waited = input.liveness_at.as_micros() - input.heal_at.as_micros();
    if !left.is_empty() {
        return Err(format!(
            "{} rows not final {:.1} s after the heal (bound {}): {}",
            left.len(),
            waited as f64 / 1e6,
            crate::duration::format(input.liveness_bound),
            listed(&left)
        ));
    }
    let bound = crate::store::duration_micros(input.liveness_bound);
    if waited > bound {
        return Err(format!(
            "the rows became final {:.1} s after the heal, past the bound {}",
            waited as f64 / 1e6,
            crate::duration::format(input.liveness_bound)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{input, row};
    use super::*;

    #[test]
    fn final_rows_pass() {
        let rows = [row(1, "task", "done"), row(2, "resource", "free")];
        assert_eq!(check(&input(&[], &[], &rows)), Ok(()));
    }

    #[test]
    fn a_row_left_behind_fires() {
        let mut stuck = row(2, "task", "ready");
        stuck.lock_owner = Some("tasks".into());
        let rows = [row(1, "task", "done"), stuck];
        let violation = check(&input(&[], &[], &rows)).expect_err("the checker missed an unfinished row");
        assert!(violation.contains("1 rows not final"), "{violation}");
        assert!(violation.contains("row 2 (task ready)"), "{violation}");
    }
}
