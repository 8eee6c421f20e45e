//! A run's readable summary, as `lockstep sim run` prints it and the snapshot tests pin it: the scenario and
//! seed, simulated time (never wall time, so the text is a function of scenario, seed and build), what the
//! client did, rows by kind and final status, the faults injected (counted from the trace), the engine paths
//! taken, and each checker's verdict; for a failed check, its message and the last trace events about the rows
//! it names. A run with a gang part also shows, per operation, its final state and result, when it was submitted
//! and ended, each incarnation with its reason, trigger and time, and its job counts by task and state; a failed
//! check that names operations shows the last trace events about each (`op=<id>` lines).

use super::checkers;
use super::explain;
use super::gang::OperationReport;
use super::run::RunReport;
use super::trace::{self, TraceEvent};
use crate::text::count;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// Trace events shown under a failed check (the last ones about the rows it names, or about each operation).
pub const EVENTS_SHOWN: usize = 12;

/// Operations whose trace events a failed check shows at most (the first it names).
pub const OPERATIONS_SHOWN: usize = 3;

/// Incarnations listed per operation at most (the first ones; the rest are counted).
pub const INCARNATIONS_SHOWN: usize = 10;

/// Engine paths the summary counts (from [`super::coverage::Coverage`]).
const PATHS: [&str; 9] = [
    "applied",
    "stale-apply",
    "takeover",
    "reset",
    "contended",
    "failure-recorded",
    "gave-up",
    "call-timeout",
    "reply-dropped",
];

/// The checker the run's drain is reported under (a replica that cannot drain within the bound).
const DRAIN: &str = "drain";

/// The summary of `report`, several lines, each ending in a newline.
pub fn render(report: &RunReport) -> String {
    let mut text = String::new();
    let verdict = match (report.passed(), report.outgrown.is_some()) {
        (_, true) => "NOT JUDGED",
        (true, false) => "PASSED",
        (false, false) => "FAILED",
    };
    let _ = writeln!(text, "scenario {} seed {}: {verdict}", report.scenario, report.seed);
    let c = &report.client;
    if report.panic.is_some() || report.outgrown.is_some() {
        // The run never reached its end: its client, database and engine-path counts were never read.
        let why = if report.panic.is_some() { "the run panicked" } else { "the run outgrew one run" };
        let _ = writeln!(text, "simulated time: {} (its last trace event: {why})", seconds(report.simulated));
        let _ = writeln!(text, "client, rows and commits: not known ({why} before its end)");
    } else if report.gang && c.rows() == 0 {
        let _ = writeln!(text, "simulated time: {}", seconds(report.simulated));
        let refused = report.operations.iter().filter(|o| o.refused.is_some()).count();
        let _ = writeln!(
            text,
            "client submitted {} ({refused} refused); {} in the database, {}",
            count(report.operations.len() as u64, "operation"),
            count(report.rows as u64, "row"),
            count(report.commits as u64, "commit")
        );
    } else if c.user_rows > 0 {
        let _ = writeln!(text, "simulated time: {}", seconds(report.simulated));
        let _ = writeln!(
            text,
            "client inserted {} (the pipeline set's workload); {} in the database, {}",
            count(c.user_rows as u64, "row"),
            count(report.rows as u64, "row"),
            count(report.commits as u64, "commit")
        );
    } else {
        let _ = writeln!(text, "simulated time: {}", seconds(report.simulated));
        let _ = writeln!(
            text,
            "client inserted {}: {} of {}, {}, {}; {} in the database, {}",
            count(c.rows() as u64, "row"),
            count(c.jobs as u64, "job"),
            count(c.tasks as u64, "task"),
            count(c.claims as u64, "claim"),
            count(c.resources as u64, "resource"),
            count(report.rows as u64, "row"),
            count(report.commits as u64, "commit")
        );
    }
    if !report.statuses.is_empty() {
        let _ = writeln!(text, "rows by kind and final status:");
        let width = report.statuses.keys().map(String::len).max().unwrap_or(0);
        for (kind, statuses) in &report.statuses {
            let counts: Vec<String> = statuses.iter().map(|(status, count)| format!("{status} {count}")).collect();
            let _ = writeln!(text, "  {kind:<width$}  {}", counts.join(", "));
        }
    }
    let _ = writeln!(text, "faults injected: {}", counted(&fault_counts(&report.trace)));
    if report.panic.is_none() && report.outgrown.is_none() {
        let paths: BTreeMap<String, u64> =
            PATHS.iter().map(|path| (path.to_string(), report.coverage.get(path))).collect();
        let _ = writeln!(text, "engine paths: {}", counted(&paths));
    }
    if report.gang {
        push_operations(&mut text, &report.operations);
        push_refused_controls(&mut text, &report.trace);
    }
    match (&report.panic, &report.outgrown) {
        (None, Some(what)) => {
            let _ = writeln!(text, "the run outgrew one run before the checkers ran: {what}");
            let _ = writeln!(text, "  {}", super::run::OUTGROWN_ADVICE);
        }
        (Some(panic), _) => {
            let _ = writeln!(text, "the run panicked before the checkers ran: {panic}");
            let _ = writeln!(text, "  last {EVENTS_SHOWN} trace events:");
            push_events(&mut text, tail(&report.trace, EVENTS_SHOWN));
        }
        (None, None) => push_checkers(&mut text, report),
    }
    text
}

/// The per-operation section of a gang run.
fn push_operations(text: &mut String, operations: &[OperationReport]) {
    let _ = writeln!(text, "operations:");
    if operations.is_empty() {
        let _ = writeln!(text, "  none submitted");
    }
    for operation in operations {
        let Some(id) = operation.id else {
            let refused = operation.refused.as_deref().unwrap_or("?");
            let _ = writeln!(text, "  {}: refused: {refused}", operation.name);
            continue;
        };
        let status = operation.status.map_or("?".to_string(), |s| s.to_string());
        let result = operation.result.as_deref().map_or(String::new(), |r| format!(" ({r})"));
        let _ = writeln!(text, "  {} (op={id}): {status}{result}", operation.name);
        let submitted = operation.submitted_at.map_or("?".into(), seconds);
        let ended = match (operation.ended_at, operation.completion()) {
            (Some(at), Some(took)) => format!("ended at {} (after {})", seconds(at), seconds(took)),
            _ => "not ended".into(),
        };
        let _ = writeln!(text, "    submitted at {submitted}, {ended}");
        for incarnation in operation.incarnations.iter().take(INCARNATIONS_SHOWN) {
            let trigger = incarnation.trigger.as_deref().map_or(String::new(), |job| format!(", trigger job {job}"));
            let _ = writeln!(
                text,
                "    incarnation {} at {}: {}{trigger}",
                incarnation.index,
                seconds(incarnation.at),
                incarnation.reason
            );
        }
        if operation.incarnations.len() > INCARNATIONS_SHOWN {
            let _ = writeln!(text, "    and {} more incarnations", operation.incarnations.len() - INCARNATIONS_SHOWN);
        }
        let tasks: Vec<String> = operation
            .jobs
            .iter()
            .map(|(task, states)| {
                let counts: Vec<String> =
                    states.iter().map(|(state, count)| format!("{} {count}", state.as_str())).collect();
                format!("{task}: {}", counts.join(", "))
            })
            .collect();
        let _ = writeln!(text, "    jobs: {}", if tasks.is_empty() { "none".into() } else { tasks.join("; ") });
    }
}

fn push_checkers(text: &mut String, report: &RunReport) {
    let _ = writeln!(text, "checkers:");
    let names: Vec<&str> = match report.checkers.is_empty() {
        true => checkers::names().chain([DRAIN]).collect(),
        false => report.checkers.clone(),
    };
    let width = names.iter().map(|name| name.len()).max().unwrap_or(0);
    for name in names {
        let violations: Vec<_> = report.violations.iter().filter(|violation| violation.checker == name).collect();
        if violations.is_empty() {
            let _ = writeln!(text, "  {name:<width$}  ok");
        }
        for violation in violations {
            let _ = writeln!(text, "  {name:<width$}  FAILED: {}", violation.message);
            let operations = operations_named(&violation.message);
            match operations.is_empty() {
                true => push_row_events(text, report, &violation.message),
                false => push_operation_events(text, report, &operations),
            }
        }
    }
}

/// The last trace events about the rows `message` names, or the trace's last events if it names none.
fn push_row_events(text: &mut String, report: &RunReport, message: &str) {
    let rows = rows_named(message);
    let about: Vec<&TraceEvent> =
        report.trace.iter().filter(|event| explain::event_mentions_rows(event, &rows)).collect();
    if rows.is_empty() || about.is_empty() {
        let _ = writeln!(text, "    last {EVENTS_SHOWN} trace events:");
        push_events(text, tail(&report.trace, EVENTS_SHOWN));
    } else {
        let shown = about.len().min(EVENTS_SHOWN);
        let _ = writeln!(
            text,
            "    last {shown} of {} trace events about row{} {}:",
            about.len(),
            if rows.len() == 1 { "" } else { "s" },
            rows.join(", ")
        );
        push_events(text, about[about.len() - shown..].iter().copied().cloned().collect());
    }
}

/// The last trace events about each of the first [`OPERATIONS_SHOWN`] `operations` (lines with `op=<id>`).
fn push_operation_events(text: &mut String, report: &RunReport, operations: &[String]) {
    for op in operations.iter().take(OPERATIONS_SHOWN) {
        let about: Vec<&TraceEvent> =
            report.trace.iter().filter(|event| explain::mentions_operation(&event.fields.text(), op)).collect();
        let shown = about.len().min(EVENTS_SHOWN);
        let _ = writeln!(text, "    last {shown} of {} trace events about op={op}:", about.len());
        push_events(text, about[about.len() - shown..].iter().copied().cloned().collect());
    }
    if operations.len() > OPERATIONS_SHOWN {
        let _ = writeln!(text, "    ({} more operations named)", operations.len() - OPERATIONS_SHOWN);
    }
}

/// Operation row ids a violation message names, in order of first mention: tokens `op=12` (`op=12)` too) and
/// `operation 12` (the gang checkers' forms).
pub fn operations_named(message: &str) -> Vec<String> {
    let words: Vec<&str> = message
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ':' | '(' | ')' | '[' | ']' | '`'))
        .filter(|word| !word.is_empty())
        .collect();
    let is_number = |word: &str| !word.is_empty() && word.chars().all(|c| c.is_ascii_digit());
    let mut operations: Vec<String> = Vec::new();
    for (index, word) in words.iter().enumerate() {
        let id = match word.strip_prefix("op=") {
            Some(id) => Some(id),
            None if *word == "operation" => words.get(index + 1).copied(),
            None => None,
        };
        if let Some(id) = id.filter(|id| is_number(id))
            && !operations.iter().any(|known| known == id)
        {
            operations.push(id.to_string());
        }
    }
    operations
}

/// Control actions that went nowhere (the `control-refused` lines of `trace`: an operation not submitted or
/// ended, an update-spec that changes what a running operation may not change), counted with their trace lines.
/// Nothing if none. A refused control breaks no invariant, so the run may still pass; before this only the trace
/// showed it (a new user's trial read PASSED and `(0 refused)`, which counts operations).
fn push_refused_controls(text: &mut String, trace: &[TraceEvent]) {
    let refused: Vec<TraceEvent> = trace.iter().filter(|event| event.kind == "control-refused").cloned().collect();
    if refused.is_empty() {
        return;
    }
    let _ = writeln!(text, "{} refused:", count(refused.len() as u64, "control action"));
    push_events(text, refused);
}

fn push_events(text: &mut String, events: Vec<TraceEvent>) {
    for line in trace::render(&events).lines() {
        let _ = writeln!(text, "    {line}");
    }
}

fn tail(trace: &[TraceEvent], count: usize) -> Vec<TraceEvent> {
    trace[trace.len().saturating_sub(count)..].to_vec()
}

/// Row ids a violation message names, in order of first mention: those it calls `row 12` (`counter row 12`),
/// or if none, the rows of the leases it names (`12#5`).
pub fn rows_named(message: &str) -> Vec<String> {
    let words: Vec<&str> = message
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ':' | '(' | ')' | '[' | ']' | '`'))
        .filter(|word| !word.is_empty())
        .collect();
    let is_number = |word: &str| !word.is_empty() && word.chars().all(|c| c.is_ascii_digit());
    let called_rows = words.windows(2).filter(|pair| pair[0] == "row" && is_number(pair[1])).map(|pair| pair[1]);
    let leases = words.iter().filter_map(|word| {
        let (id, token) = word.split_once('#')?;
        (is_number(id) && is_number(token)).then_some(id)
    });
    let mut rows: Vec<String> = Vec::new();
    for id in called_rows.chain(leases) {
        if !rows.iter().any(|row| row == id) {
            rows.push(id.to_string());
        }
    }
    let called = words.windows(2).any(|pair| pair[0] == "row" && is_number(pair[1]));
    if called {
        rows.retain(|row| words.windows(2).any(|pair| pair[0] == "row" && pair[1] == row));
    }
    rows
}

/// Faults the trace shows injected, by fault kind name (`db-restart` for a kill of the database node; `agent-kill`,
/// `agent-pause`, `agent-partition`, `agent-isolate` for faults on agent nodes, fixed or random), and faults
/// skipped because their target was taken.
pub fn fault_counts(trace: &[TraceEvent]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for event in trace {
        // Read only for the kinds of a fault: a commit's fields are written out when read.
        let agent = || event.node.starts_with("agent-") || event.fields.text().contains("Agent(");
        let kind = match (&*event.node, event.kind) {
            ("db", "kill") => "db-restart",
            (_, "kill") if agent() => "agent-kill",
            (_, "pause") if agent() => "agent-pause",
            (_, "partition") if agent() => "agent-partition",
            (_, "isolate") if agent() => "agent-isolate",
            (_, "clock-drift") if agent() && event.fields.text().contains("beyond_margin=yes") => {
                "agent-clock-beyond-margin"
            }
            (_, "clock-drift") if agent() => "agent-clock-drift",
            (_, "store-hang") if agent() => "agent-store-hang",
            (_, kind @ ("kill" | "pause" | "partition" | "isolate" | "degrade" | "lost-replies" | "clock-drift")) => {
                kind
            }
            (_, kind @ ("contention" | "buggify" | "skipped")) => kind,
            (_, "calls-fault") => "agent-calls",
            (_, kind @ ("hint-loss" | "crash-loop" | "clock-jump" | "handler-hang" | "store-hang")) => kind,
            _ => continue,
        };
        *counts.entry(kind.to_string()).or_default() += 1;
    }
    counts
}

/// `a 1, b 2`, or `none`.
fn counted(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts.iter().map(|(name, count)| format!("{name} {count}")).collect::<Vec<_>>().join(", ")
}

/// Simulated seconds with millisecond precision: `92.410 s`.
fn seconds(span: Duration) -> String {
    format!("{}.{:03} s", span.as_secs(), span.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn event(node: &str, kind: &'static str, fields: &str) -> TraceEvent {
        TraceEvent { at: Duration::from_millis(1), node: Arc::from(node), kind, fields: fields.into() }
    }

    #[test]
    fn rows_named_finds_rows_and_leases_once_each() {
        let message = "commit 40 `2023 by replica-1: apply 12#5 applied related=[] inserted=[]`: row 12 written with \
                       token 5, but its latest token is 9 (current), handed out by commit 39; counter row 7 holds 3";
        assert_eq!(rows_named(message), ["12", "7"]);
        assert_eq!(rows_named("commit 3 `apply 12#5 applied`: token 5 of 12#5 is not above 13#4"), ["12", "13"]);
        assert!(rows_named("the drain took 61 s").is_empty());
    }

    #[test]
    fn operations_named_finds_op_tokens_and_operation_ids_once_each() {
        let message = "2 broken gang rules: operation 7: rank 0 twice; operation train (op=9): state expected \
                       completed, actual failed; op=7 running; operation 12";
        assert_eq!(operations_named(message), ["7", "9", "12"]);
        assert!(operations_named("row 12 written with token 5").is_empty());
    }

    /// A new user's trial read `client submitted 1 operations (0 refused)`.
    #[test]
    fn the_client_line_says_one_operation_one_row_and_one_commit_in_the_singular() {
        let scenario = crate::sim::scenario::Scenario::quiet();
        let mut report = RunReport::empty(&scenario, 1);
        report.gang = true;
        report.operations = vec![OperationReport::refused("train", "a bad spec")];
        (report.rows, report.commits) = (1, 1);
        let text = render(&report);
        assert!(text.contains("client submitted 1 operation (1 refused); 1 row in the database, 1 commit\n"), "{text}");
        report.operations.push(OperationReport::refused("eval", "a bad spec"));
        (report.rows, report.commits) = (2, 3);
        let text = render(&report);
        assert!(
            text.contains("client submitted 2 operations (2 refused); 2 rows in the database, 3 commits\n"),
            "{text}"
        );
    }

    #[test]
    fn a_gang_runs_refused_control_actions_are_counted_and_listed() {
        let scenario = crate::sim::scenario::Scenario::quiet();
        let mut report = RunReport::empty(&scenario, 1);
        report.gang = true;
        let text = render(&report);
        assert!(!text.contains("refused:"), "{text}");
        report.trace = vec![
            event("client", "submit", "op=5 name=train attempts=1"),
            event("client", "control-refused", "op=5 name=train control=0 error=\"gang_placement cannot change\""),
        ];
        let text = render(&report);
        assert!(text.contains("1 control action refused:\n"), "{text}");
        assert!(
            text.contains("control-refused op=5 name=train control=0 error=\"gang_placement cannot change\""),
            "{text}"
        );
    }

    #[test]
    fn faults_are_counted_by_kind_from_the_trace() {
        let trace = [
            event("replica-0", "pause", "span=7s"),
            event("replica-0", "resume", ""),
            event("db", "kill", "down=1s"),
            event("db", "start", "incarnation=2"),
            event("replica-1", "kill", ""),
            event("world", "skipped", "Pause (Replica(0) busy)"),
            event("replica-1", "commit", "apply 1#1 applied related=[] inserted=[]"),
            event("agent-2", "kill", ""),
            event("world", "partition", "Agent(1)<->Db span=30s"),
            event("world", "partition", "Replica(1)<->Db span=3s"),
        ];
        let counts = fault_counts(&trace);
        let expected: BTreeMap<String, u64> = [
            ("agent-kill", 1),
            ("agent-partition", 1),
            ("db-restart", 1),
            ("kill", 1),
            ("partition", 1),
            ("pause", 1),
            ("skipped", 1),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        assert_eq!(counts, expected);
    }
}
