//! What `lockstep list` shows: the operations of a cluster, newest first, filtered by state and by when they were
//! submitted (docs/real-mode.md, "Listing operations"). [`OperationList::read`] reads the operation rows (one
//! indexed read, by status when states are given) and the store's `now`; [`OperationList::render`] is the human
//! table and the list serializes to the `--json` form.

use super::api::GangError;
use super::model::{DecodeError, KIND_OPERATION, OperationData, OperationStatus, incarnation_id};
use crate::store::{Row, RowId, RowQuery, Store, Timestamp};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Duration;

/// Default most operations listed, newest first: a screen's worth; `lockstep list --limit` raises it.
pub const LIST_LEN_MAX_DEFAULT: u32 = 100;

/// Which operations [`OperationList::read`] lists. Ages are measured on the store's clock, from each operation's
/// submission (its row's `created_at`) to the store's `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListFilter {
    /// Only operations in one of these states; every state when empty.
    pub states: Vec<OperationStatus>,
    /// Only operations submitted at most this long ago.
    pub since: Option<Duration>,
    /// Only operations submitted more than this long ago.
    pub older_than: Option<Duration>,
    /// At most this many operations, the newest (by id: later submissions have larger ids).
    pub limit: u32,
}

impl Default for ListFilter {
    /// Every operation, at most [`LIST_LEN_MAX_DEFAULT`].
    fn default() -> ListFilter {
        ListFilter { states: Vec::new(), since: None, older_than: None, limit: LIST_LEN_MAX_DEFAULT }
    }
}

/// The operations a [`ListFilter`] selected, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationList {
    /// The store's `now` the ages are measured to.
    pub now: Timestamp,
    /// The operations listed, newest first.
    pub operations: Vec<OperationLine>,
    /// Operations that matched the filter but were left out by its limit (the oldest of them).
    pub left_out: usize,
}

/// One operation of a list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationLine {
    /// The operation's id, as `submit` printed it.
    pub operation: RowId,
    /// Its state.
    pub state: OperationStatus,
    /// When it was submitted (store clock).
    pub submitted_at: Timestamp,
    /// How long before the list's `now` it was submitted, in milliseconds.
    pub age_ms: u64,
    /// The current incarnation's id (e.g. `5-i1`).
    pub incarnation: String,
    /// Its tasks, in name order.
    pub tasks: Vec<TaskLine>,
    /// Why it failed or was aborted; `every task completed` when it completed.
    pub result: Option<String>,
}

/// A task of a listed operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLine {
    /// The task's name.
    pub name: String,
    /// Its `job_count`.
    pub job_count: u32,
    /// Whether it is a gang task (it has `gang_options`).
    pub gang: bool,
}

impl ListFilter {
    /// Whether the filter can select anything: `since` must be longer than `older_than` when both are given.
    ///
    /// # Errors
    /// The rule, naming both flags' values (`--since 1h selects nothing with --older-than 2h: …`).
    pub fn check(&self) -> Result<(), String> {
        if let (Some(since), Some(older_than)) = (self.since, self.older_than)
            && since <= older_than
        {
            return Err(format!(
                "--since {} with --older-than {} selects nothing: --since must be longer than --older-than (the \
                 operations submitted between the two ages)",
                flag_text(since),
                flag_text(older_than)
            ));
        }
        Ok(())
    }

    /// Whether an operation submitted at `submitted_at` is in the filter's age window at `now`.
    fn admits(&self, submitted_at: Timestamp, now: Timestamp) -> bool {
        self.since.is_none_or(|since| submitted_at >= now.minus(since))
            && self.older_than.is_none_or(|older_than| submitted_at < now.minus(older_than))
    }
}

impl OperationList {
    /// Reads the operations `filter` selects, newest first, at most `filter.limit` of them.
    ///
    /// # Errors
    /// The store failed, or an operation row does not decode.
    pub async fn read<S: Store>(store: &S, filter: &ListFilter) -> Result<OperationList, GangError> {
        let mut query = RowQuery::new(KIND_OPERATION);
        if !filter.states.is_empty() {
            query = query.statuses(filter.states.iter().map(|state| state.as_str()));
        }
        let rows = store.query(vec![query]).await?.pop().unwrap_or_default();
        let now = store.now().await?;
        let mut selected: Vec<&Row> = rows.iter().filter(|row| filter.admits(row.created_at, now)).collect();
        selected.sort_by_key(|row| std::cmp::Reverse(row.id));
        let limit = usize::try_from(filter.limit).unwrap_or(usize::MAX);
        let left_out = selected.len().saturating_sub(limit);
        selected.truncate(limit);
        let operations = selected.into_iter().map(|row| OperationLine::from_row(row, now)).collect::<Result<_, _>>()?;
        Ok(OperationList { now, operations, left_out })
    }

    /// The human form: a table with a header, one line per operation (columns: operation, state, submitted (UTC, to
    /// the second), age, incarnation, tasks as `name:job_count` with `(gang)` for a gang task, result), or `no
    /// operations` when there is none; a last line says how many the limit left out.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.operations.is_empty() {
            out.push_str("no operations\n");
        } else {
            let header = ["operation", "state", "submitted", "age", "incarnation", "tasks", "result"];
            let rows: Vec<[String; 7]> = self.operations.iter().map(OperationLine::cells).collect();
            out.push_str(&crate::table::render(header, &rows, ""));
        }
        if self.left_out > 0 {
            let _ = writeln!(out, "({} older operations left out by --limit)", self.left_out);
        }
        out
    }
}

impl OperationLine {
    /// The line of an operation row, its age measured to `now`.
    fn from_row(row: &Row, now: Timestamp) -> Result<OperationLine, GangError> {
        let state = OperationStatus::parse(&row.status).ok_or_else(|| DecodeError {
            row: row.id,
            kind: row.kind.clone(),
            message: format!("status {:?}", row.status),
        })?;
        let data = OperationData::from_row(row)?;
        let tasks = data
            .spec
            .tasks
            .iter()
            .map(|(name, task)| TaskLine {
                name: name.clone(),
                job_count: task.job_count,
                gang: task.gang_options.is_some(),
            })
            .collect();
        let age_us = now.as_micros().saturating_sub(row.created_at.as_micros()).max(0);
        Ok(OperationLine {
            operation: row.id,
            state,
            submitted_at: row.created_at,
            age_ms: u64::try_from(age_us / 1_000).unwrap_or(0),
            incarnation: incarnation_id(row.id, data.incarnation),
            tasks,
            result: data.result,
        })
    }

    fn cells(&self) -> [String; 7] {
        let utc = self.submitted_at.utc();
        // `2026-12-07 13:20:48.123 UTC` to the second: the table's width goes to the tasks and the result.
        let submitted = utc.split('.').next().unwrap_or(&utc).to_string();
        let tasks: Vec<String> = self
            .tasks
            .iter()
            .map(|task| format!("{}:{}{}", task.name, task.job_count, if task.gang { "(gang)" } else { "" }))
            .collect();
        [
            self.operation.to_string(),
            self.state.to_string(),
            submitted,
            age(Duration::from_millis(self.age_ms)),
            self.incarnation.clone(),
            tasks.join(" "),
            self.result.clone().unwrap_or_default(),
        ]
    }
}

/// `span` as a flag would give it: whole hours or minutes as `2h`, `30m`, else [`crate::duration::format`]'s form.
fn flag_text(span: Duration) -> String {
    match span.as_nanos() {
        nanos if nanos % 3_600_000_000_000 == 0 => format!("{}h", nanos / 3_600_000_000_000),
        nanos if nanos % 60_000_000_000 == 0 => format!("{}m", nanos / 60_000_000_000),
        _ => crate::duration::format(span),
    }
}

/// An age as people read it, to its two largest units: `42s`, `5m3s`, `2h0m`, `3d4h`.
fn age(span: Duration) -> String {
    let secs = span.as_secs();
    let (days, hours, minutes, seconds) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m{seconds}s"),
        (0, _, _) => format!("{hours}h{minutes}m"),
        _ => format!("{days}d{hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_is_shown_to_its_two_largest_units() {
        assert_eq!(age(Duration::from_millis(42_900)), "42s");
        assert_eq!(age(Duration::from_secs(5 * 60 + 3)), "5m3s");
        assert_eq!(age(Duration::from_secs(2 * 3_600 + 59)), "2h0m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3_600 + 7)), "3d4h");
    }

    /// The table docs/real-mode.md shows ("Listing operations") is what `render` prints for its two operations.
    #[test]
    fn the_real_mode_page_shows_the_table_render_prints() {
        let now = Timestamp(1_796_649_951_000_000); // 2026-12-07 13:25:51 UTC
        let task = |name: &str, job_count, gang| TaskLine { name: name.into(), job_count, gang };
        let line = |operation, state, age: Duration, incarnation: &str, tasks, result: Option<&str>| OperationLine {
            operation: RowId(operation),
            state,
            submitted_at: now.minus(age),
            age_ms: u64::try_from(age.as_millis()).unwrap(),
            incarnation: incarnation.into(),
            tasks,
            result: result.map(String::from),
        };
        let list = OperationList {
            now,
            operations: vec![
                line(
                    9,
                    OperationStatus::Running,
                    Duration::from_secs(303),
                    "9-i1",
                    vec![task("trainer", 8, true), task("ps", 2, false)],
                    None,
                ),
                line(
                    8,
                    OperationStatus::Aborted,
                    Duration::from_secs(5_020),
                    "8-i0",
                    vec![task("worker", 3, false)],
                    Some("aborted by user"),
                ),
            ],
            left_out: 0,
        };
        let page = include_str!("../../docs/real-mode.md");
        let section = &page[page.find("## Listing operations").expect("the section")..];
        let block = section.split("```text\n").nth(1).and_then(|rest| rest.split("```").next()).expect("the table");
        assert_eq!(list.render(), block);
    }

    #[test]
    fn the_age_window_keeps_operations_submitted_between_since_and_older_than() {
        let now = Timestamp(10_000_000_000);
        let filter = ListFilter {
            since: Some(Duration::from_secs(3_600)),
            older_than: Some(Duration::from_secs(60)),
            ..ListFilter::default()
        };
        assert!(filter.admits(now.minus(Duration::from_secs(600)), now));
        assert!(!filter.admits(now.minus(Duration::from_secs(30)), now), "younger than --older-than");
        assert!(!filter.admits(now.minus(Duration::from_secs(7_200)), now), "older than --since");
        assert!(filter.check().is_ok());
        let empty = ListFilter { since: Some(Duration::from_secs(60)), ..filter };
        let error = empty.check().unwrap_err();
        assert!(error.starts_with("--since 1m with --older-than 1m selects nothing"), "{error}");
    }
}
