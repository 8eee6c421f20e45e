//! The checkers (DESIGN §5): one invariant each, run on every simulation, fed from the database's commit history,
//! its events and its rows, never from what replicas believe. Each checker has a test that plants the bug it
//! guards against and watches it fire (STYLE, "Checkers bite").

pub mod capacity;
pub mod exactly_once;
pub mod external;
pub mod gang;
pub mod lease_exclusivity;
pub mod liveness;
pub mod locked_forever;
pub mod protocol;
pub mod ranks;
pub mod retries;
pub mod row_map;
pub mod starvation;

use super::service::Effect;
use super::user::PipelineSet;
use super::workload;
use crate::store::{Commit, Event, Row, Timestamp};
use std::fmt;
use std::time::Duration;

/// Rows a violation message lists at most, so that a failure stays readable.
pub const LISTED_MAX: usize = 10;

/// What the checkers read: the database's record of a run.
#[derive(Clone, Copy, Debug)]
pub struct CheckInput<'a> {
    /// Every commit, in commit order.
    pub history: &'a [Commit],
    /// Every event, in sequence order.
    pub events: &'a [Event],
    /// Rows when the liveness wait ended (every row final, or the bound passed): at least every row not final
    /// then. The simulator hands over only those; `lockstep chaos run` hands over every row.
    pub rows_at_liveness: &'a [Row],
    /// Rows at the end: after the replicas drained and a lease ttl passed.
    pub rows_final: &'a [Row],
    /// Store time when the faults stopped and the world healed.
    pub heal_at: Timestamp,
    /// Store time of `rows_at_liveness`.
    pub liveness_at: Timestamp,
    /// Store time of `rows_final`.
    pub final_at: Timestamp,
    /// After the heal, every row must be final within this span.
    pub liveness_bound: Duration,
    /// After the heal, no parent may wait longer than this for its related locks.
    pub starvation_bound: Duration,
    /// Whose rows these are: the built-in workload's, or a [`PipelineSet`]'s (which says which statuses are
    /// final).
    pub rows: RowModel<'a>,
    /// Every request the simulated external services handled, service by service in order (empty without
    /// services).
    pub effects: &'a [Effect],
    /// Attempts after which the workload's pipelines give up on a row (the scenario's `attempts_max`).
    pub attempts_max: u32,
    /// How late after its retry falls due a row that failed after the heal may be fetched again (checker
    /// `retries`, rule 4); `None` leaves lateness unjudged (`lockstep chaos run`: wall time on a shared machine).
    pub retry_lateness_bound: Option<Duration>,
    /// What the workload's pipelines hold at once (replicas, workers, lease ttl): checkers that bound a wait count
    /// only time in which a worker of the row's pipeline idled ([`capacity`]).
    pub capacity: &'a capacity::Capacity,
}

/// Whose rows a run holds, and so which statuses end their life.
#[derive(Clone, Copy, Debug)]
pub enum RowModel<'a> {
    /// The built-in workload's jobs, tasks, claims and resources ([`workload::is_terminal`]).
    Builtin,
    /// A user's pipeline set ([`PipelineSet::is_final`]).
    User(&'a PipelineSet),
}

impl RowModel<'_> {
    /// Whether `row` reached the end of its life.
    pub fn is_final(&self, row: &Row) -> bool {
        match self {
            RowModel::Builtin => workload::is_terminal(row),
            RowModel::User(set) => set.is_final(row),
        }
    }
}

/// One invariant checked on every run: the built-in checkers and the ones users add to a [`PipelineSet`]
/// implement it alike. A checker reads only what the database and the services recorded ([`CheckInput`]),
/// never what replicas believe.
pub trait Checker: Send + Sync + 'static {
    /// The checker's name, as failures and sweep tables print it: lowercase words joined by `_`, unique in a
    /// run.
    fn name(&self) -> &'static str;

    /// The check. Errors: what broke, naming rows, tokens, times (at most [`LISTED_MAX`] items; see [`listed`]).
    fn check(&self, input: &CheckInput<'_>) -> Result<(), String>;
}

/// A built-in checker: its name and its check function.
struct Builtin(&'static str, fn(&CheckInput<'_>) -> Result<(), String>);

impl Checker for Builtin {
    fn name(&self) -> &'static str {
        self.0
    }

    fn check(&self, input: &CheckInput<'_>) -> Result<(), String> {
        (self.1)(input)
    }
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The checker that found it: `lease_exclusivity`, `liveness`, `locked_forever`, `starvation`,
    /// `exactly_once`, `retries`.
    pub checker: &'static str,
    /// What broke, naming rows, tokens, commits and times.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.checker, self.message)
    }
}

/// Every built-in checker, in the order they run.
const CHECKS: [Builtin; 8] = [
    Builtin("lease_exclusivity", lease_exclusivity::check),
    Builtin("liveness", liveness::check),
    Builtin("locked_forever", locked_forever::check),
    Builtin("starvation", starvation::check),
    Builtin("exactly_once", exactly_once::check),
    Builtin("retries", retries::check),
    Builtin("external_exactly_once", external::check),
    Builtin("protocol", protocol::check),
];

/// The built-in checkers' names, in the order they run (the names of [`Violation::checker`]).
pub fn names() -> impl Iterator<Item = &'static str> {
    CHECKS.iter().map(|checker| checker.0)
}

/// Runs every built-in checker, then `more` (a pipeline set's own); returns what they found, in checker order.
pub fn check_all(input: &CheckInput<'_>, more: &[std::sync::Arc<dyn Checker>]) -> Vec<Violation> {
    let builtins = CHECKS.iter().map(|checker| checker as &dyn Checker);
    builtins
        .chain(more.iter().map(|checker| checker.as_ref()))
        .filter_map(|checker| checker.check(input).err().map(|message| Violation { checker: checker.name(), message }))
        .collect()
}

/// A one-line description of a row's status and lease columns, for violation messages.
pub fn describe(row: &Row) -> String {
    format!(
        "row {} ({} {}) token={:?} owner={:?} expires={}",
        row.id,
        row.kind,
        row.status,
        row.lock_token.map(|token| token.0),
        row.lock_owner,
        row.lock_expires_at.map_or("none".to_string(), |at| at.to_string())
    )
}

/// `items` joined by "; ", at most [`LISTED_MAX`] of them, with a count of the rest.
pub fn listed(items: &[String]) -> String {
    let mut text = items.iter().take(LISTED_MAX).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > LISTED_MAX {
        text.push_str(&format!("; and {} more", items.len() - LISTED_MAX));
    }
    text
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Hand-made histories and rows for the checkers' planted-bug tests.
    use super::CheckInput;
    use crate::store::{Commit, CommitOp, Event, Lease, LockToken, NewRow, Row, RowId, Timestamp};
    use std::time::Duration;

    pub(crate) const T0: Timestamp = Timestamp(1_700_000_000_000_000);

    pub(crate) fn at(secs: u64) -> Timestamp {
        T0.plus(Duration::from_secs(secs))
    }

    pub(crate) fn lease(id: i64, token: i64) -> Lease {
        Lease { id: RowId(id), token: LockToken(token) }
    }

    pub(crate) fn commit(secs: u64, op: CommitOp) -> Commit {
        Commit { at: at(secs), caller: None, op }
    }

    pub(crate) fn fetch(secs: u64, l: Lease) -> Commit {
        commit(secs, CommitOp::Fetch { pipeline: "p".into(), leases: vec![l] })
    }

    pub(crate) fn apply(secs: u64, l: Lease, applied: bool) -> Commit {
        commit(secs, CommitOp::Apply { lease: l, applied, related: Vec::new(), inserted: Vec::new() })
    }

    pub(crate) fn row(id: i64, kind: &str, status: &str) -> Row {
        NewRow::new(kind, status, serde_json::json!({})).into_row(RowId(id), T0)
    }

    /// An input whose heal is at 100 s, liveness snapshot at 150 s, final snapshot at 200 s, bounds 60 s.
    pub(crate) fn input<'a>(history: &'a [Commit], events: &'a [Event], rows: &'a [Row]) -> CheckInput<'a> {
        CheckInput {
            history,
            events,
            rows_at_liveness: rows,
            rows_final: rows,
            heal_at: at(100),
            liveness_at: at(150),
            final_at: at(200),
            liveness_bound: Duration::from_secs(60),
            starvation_bound: Duration::from_secs(60),
            rows: super::RowModel::Builtin,
            effects: &[],
            attempts_max: 3,
            retry_lateness_bound: Some(Duration::from_secs(1)),
            capacity: &super::capacity::UNBOUNDED,
        }
    }
}
