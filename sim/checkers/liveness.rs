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

    /// A user's set judges the kinds it lists in `final_statuses` only (docs/user-pipelines.md): a row of a kind
    /// it does not list is final in any status. (Simulator build: a set is made with its register function.)
    #[cfg(madsim)]
    #[test]
    fn a_kind_not_listed_in_final_statuses_is_not_judged() {
        let set = crate::sim::PipelineSet::new("orders", |_| Ok(())).final_statuses("order", &["done"]);
        let rows = [row(1, "order", "done"), row(2, "line", "new"), row(3, "orders", "new")];
        let user = CheckInput { rows: super::super::RowModel::User(&set), ..input(&[], &[], &rows) };
        assert_eq!(check(&user), Ok(()));
        let rows = [row(1, "order", "new")];
        let user = CheckInput { rows: super::super::RowModel::User(&set), ..input(&[], &[], &rows) };
        assert!(check(&user).is_err(), "a listed kind out of its final statuses passed");
    }
}
