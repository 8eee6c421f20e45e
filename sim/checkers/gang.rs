//! The gang checkers (DESIGN §4, §5), run on every simulation with a gang part, from the executors' process log
//! and the operations' rows and events as the database holds them at the end:
//! - `allocation_exclusivity`: no allocation ever has two live processes ([`ProcessLog::exclusivity_violations`]);
//! - `rank_exclusivity`: no two processes of one (operation, task, gang rank) run at once, in any allocations
//!   ([`super::ranks::rank_exclusivity`]);
//! - `gang_ranks_together`: the ranks of an all-or-nothing incarnation start together
//!   ([`super::ranks::ranks_together`]);
//! - `process_outlived_operation`: at the end (every operation ended, the replicas drained, a lease ttl passed) no
//!   process is alive: agents killed what their operations left, and fenced agents killed theirs;
//! - `gang_audit`: rank uniqueness per incarnation, reuse keeping cookie/rank/descriptor, the completion and
//!   failure rules ([`audit::operation`] on every operation's view), and no controller pass failed (a panic or an
//!   error recorded on an operation row, [`failed_passes`]);
//! - `liveness`: every submitted operation ended within the liveness bound after the heal;
//! - `expect`: the scenario's per-operation expectations (final state, incarnation bounds, completion time) and
//!   trace expectations (counts of trace lines of a kind: what must have happened).
//!
//! [`ProcessLog::exclusivity_violations`]: crate::agent::ProcessLog::exclusivity_violations
//! [`audit::operation`]: crate::gang::audit::operation

use super::{Violation, listed, ranks};
use crate::agent::ProcessEvent;
use crate::gang::api::OperationView;
use crate::gang::audit;
use crate::gang::model::JobId;
use crate::sim::gang::{Expectations, OperationExpectation, OperationReport, TraceExpectation};
use crate::sim::trace::TraceEvent;
use crate::store::RowId;
use std::collections::BTreeMap;
use std::time::Duration;

/// What the gang checkers read.
#[derive(Clone, Copy, Debug)]
pub struct GangCheckInput<'a> {
    /// Every submission's report, in submission order.
    pub reports: &'a [OperationReport],
    /// Every submitted operation's view at the end.
    pub views: &'a [OperationView],
    /// The process log's allocation-exclusivity violations.
    pub exclusivity: &'a [String],
    /// The process log, in order.
    pub processes: &'a [ProcessEvent],
    /// The longest apart the ranks of an all-or-nothing incarnation may start (`gang_ranks_together`).
    pub start_skew_max: Duration,
    /// Processes alive at the end, by allocation row.
    pub live_at_end: &'a BTreeMap<RowId, Vec<JobId>>,
    /// Operations (name, status) not ended when the liveness wait stopped.
    pub unfinished: &'a [String],
    /// The scenario's expectations.
    pub expectations: &'a Expectations,
    /// The run's trace (for trace expectations).
    pub trace: &'a [TraceEvent],
}

/// The gang checkers' names, in the order they run (`liveness` is also a row checker's name: the summary lists it
/// once).
pub const NAMES: [&str; 7] = [
    "allocation_exclusivity",
    "rank_exclusivity",
    "gang_ranks_together",
    "process_outlived_operation",
    "gang_audit",
    "liveness",
    "expect",
];

/// Runs every gang checker; returns what they found, in checker order.
pub fn check_all(input: &GangCheckInput<'_>) -> Vec<Violation> {
    let mut violations = Vec::new();
    // `what` is the phrase for one found and for more: "1 unmet expectation", "2 unmet expectations".
    let mut push = |checker: &'static str, found: Vec<String>, what: (&str, &str)| {
        if !found.is_empty() {
            let counted = crate::text::count_as(found.len() as u64, what.0, what.1);
            violations.push(Violation { checker, message: format!("{counted}: {}", listed(&found)) });
        }
    };
    let second = ("second live process in one allocation", "second live processes in one allocation");
    push("allocation_exclusivity", input.exclusivity.to_vec(), second);
    let overlaps = ranks::rank_exclusivity(input.processes);
    push(
        "rank_exclusivity",
        overlaps,
        ("second live process of one gang rank", "second live processes of one gang rank"),
    );
    let apart = ranks::ranks_together(input.views, input.processes, input.start_skew_max);
    let apart_what = (
        "all-or-nothing incarnation whose ranks did not start together",
        "all-or-nothing incarnations whose ranks did not start together",
    );
    push("gang_ranks_together", apart, apart_what);
    let live: Vec<String> =
        input.live_at_end.iter().map(|(row, jobs)| format!("allocation {row} still runs jobs {jobs:?}")).collect();
    let alive = (
        "process alive at the end, after every operation ended",
        "processes alive at the end, after every operation ended",
    );
    push("process_outlived_operation", live, alive);
    let mut audits: Vec<String> = input
        .views
        .iter()
        .flat_map(|view| audit::operation(view).into_iter().map(move |v| format!("operation {}: {v}", view.id)))
        .collect();
    audits.extend(failed_passes(input.trace));
    push("gang_audit", audits, ("broken gang rule", "broken gang rules"));
    let unfinished = (
        "operation not ended within the liveness bound after the heal",
        "operations not ended within the liveness bound after the heal",
    );
    push("liveness", input.unfinished.to_vec(), unfinished);
    let unmet = expectations(input.expectations, input.reports, input.trace);
    push("expect", unmet, ("unmet expectation", "unmet expectations"));
    violations
}

/// Every controller pass that failed (part of `gang_audit`): a failure recorded on an operation row, from the
/// trace's `commit failure` lines about an operation. A pass fails only by a panic or an error of its own (a store
/// that fails or a lock that is contended leaves the lease to expire or resets it, recording nothing), and a pass
/// retried on the same inbox fails again: the operation never moves and an abort waits behind it.
pub fn failed_passes(trace: &[TraceEvent]) -> Vec<String> {
    trace
        .iter()
        .filter(|e| e.kind == "commit" && e.node.starts_with("replica-"))
        .filter_map(|e| {
            let text = e.fields.text();
            let failed = text.starts_with("failure ") && text.split_whitespace().any(|t| t.starts_with("op="));
            failed.then(|| format!("a controller pass failed at {:.6} s: {text}", e.at.as_secs_f64()))
        })
        .collect()
}

/// Every unmet expectation, as a sentence naming the operation (or the trace lines), what was expected and what
/// happened.
pub fn expectations(expectations: &Expectations, reports: &[OperationReport], trace: &[TraceEvent]) -> Vec<String> {
    let mut unmet = Vec::new();
    for expectation in &expectations.operations {
        match reports.iter().find(|report| report.name == expectation.operation) {
            None => {
                unmet.push(format!("operation {}: expected it to run, actual: never submitted", expectation.operation))
            }
            Some(report) => unmet.extend(unmet_by(expectation, report)),
        }
    }
    unmet.extend(expectations.trace.iter().filter_map(|expectation| unmet_trace(expectation, trace)));
    unmet
}

fn unmet_trace(expectation: &TraceExpectation, trace: &[TraceEvent]) -> Option<String> {
    // The kind first: a commit's fields are written out when read.
    let matches =
        |e: &&TraceEvent| e.kind == expectation.kind && expectation.matches(&e.node, e.kind, &e.fields.text());
    let count = trace.iter().filter(matches).count() as u64;
    let what = expectation.describe();
    if count < expectation.at_least {
        return Some(format!("trace: {what} expected at least {}, actual {count}", expectation.at_least));
    }
    match expectation.at_most {
        Some(max) if count > max => Some(format!("trace: {what} expected at most {max}, actual {count}")),
        _ => None,
    }
}

fn unmet_by(expectation: &OperationExpectation, report: &OperationReport) -> Vec<String> {
    let name = match report.id {
        Some(id) => format!("operation {} (op={id})", report.name),
        None => format!("operation {} (refused: {})", report.name, report.refused.as_deref().unwrap_or("?")),
    };
    let mut unmet = Vec::new();
    if let Some(state) = expectation.state
        && report.status != Some(state)
    {
        let actual = report.status.map_or("not submitted".to_string(), |s| s.to_string());
        unmet.push(format!("{name}: state expected {state}, actual {actual} (result {:?})", report.result));
    }
    let incarnations = report.incarnations.len() as u32;
    if let Some(min) = expectation.incarnations_min
        && incarnations < min
    {
        unmet.push(format!("{name}: incarnations expected at least {min}, actual {incarnations}"));
    }
    if let Some(max) = expectation.incarnations_max
        && incarnations > max
    {
        unmet.push(format!("{name}: incarnations expected at most {max}, actual {incarnations}"));
    }
    if let Some(bound) = expectation.completed_within {
        match report.completion() {
            Some(took) if took <= bound => {}
            Some(took) => unmet.push(format!(
                "{name}: completion expected within {}, actual {}",
                crate::duration::format(bound),
                crate::duration::format(took)
            )),
            None => unmet.push(format!(
                "{name}: completion expected within {}, actual: never ended",
                crate::duration::format(bound)
            )),
        }
    }
    unmet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::model::OperationStatus;
    use crate::sim::gang::IncarnationReport;
    use std::time::Duration;

    fn report(status: OperationStatus, incarnations: u32, took: Duration) -> OperationReport {
        let incarnation =
            |index| IncarnationReport { index, reason: "start".into(), trigger: None, at: Duration::ZERO };
        OperationReport {
            name: "train".into(),
            id: Some(RowId(7)),
            refused: None,
            status: Some(status),
            result: None,
            submitted_at: Some(Duration::from_secs(10)),
            ended_at: Some(Duration::from_secs(10) + took),
            incarnations: (0..incarnations).map(incarnation).collect(),
            jobs: BTreeMap::new(),
        }
    }

    fn expecting(expectation: OperationExpectation) -> Expectations {
        Expectations { operations: vec![expectation], trace: Vec::new() }
    }

    #[test]
    fn a_failure_recorded_on_an_operation_row_is_a_broken_gang_rule() {
        let line = |node: &str, text: &str| TraceEvent {
            at: Duration::from_millis(23_500),
            node: node.into(),
            kind: "commit",
            fields: text.to_string().into(),
        };
        let trace = [
            line("replica-0", "failure 13#14 attempt=1 retry op=13"),
            line("replica-1", "failure 8#3 attempt=2 retry"), // a row of the row workload
            line("replica-0", "apply 13#15 applied related=[] inserted=[] op=13"),
        ];
        let failed = failed_passes(&trace);
        assert_eq!(failed, ["a controller pass failed at 23.500000 s: failure 13#14 attempt=1 retry op=13"]);
    }

    #[test]
    fn met_expectations_pass() {
        let expectation = OperationExpectation {
            state: Some(OperationStatus::Completed),
            incarnations_min: Some(2),
            incarnations_max: Some(2),
            completed_within: Some(Duration::from_secs(60)),
            ..OperationExpectation::on("train")
        };
        let reports = [report(OperationStatus::Completed, 2, Duration::from_secs(60))];
        assert_eq!(expectations(&expecting(expectation), &reports, &[]), Vec::<String>::new());
    }

    #[test]
    fn a_wrong_final_state_names_expected_and_actual() {
        let expectation =
            OperationExpectation { state: Some(OperationStatus::Completed), ..OperationExpectation::on("train") };
        let reports = [report(OperationStatus::Failed, 1, Duration::from_secs(5))];
        let unmet = expectations(&expecting(expectation), &reports, &[]);
        assert_eq!(unmet.len(), 1, "{unmet:?}");
        assert!(unmet[0].contains("operation train (op=7): state expected completed, actual failed"), "{unmet:?}");
    }

    #[test]
    fn incarnation_and_completion_bounds_fire() {
        let expectation = OperationExpectation {
            incarnations_min: Some(2),
            incarnations_max: Some(3),
            completed_within: Some(Duration::from_secs(30)),
            ..OperationExpectation::on("train")
        };
        let unmet = expectations(
            &expecting(expectation.clone()),
            &[report(OperationStatus::Completed, 1, Duration::from_secs(31))],
            &[],
        );
        assert_eq!(unmet.len(), 2, "{unmet:?}");
        assert!(unmet[0].contains("incarnations expected at least 2, actual 1"), "{unmet:?}");
        assert!(unmet[1].contains("completion expected within 30s, actual 31s"), "{unmet:?}");
        let unmet = expectations(
            &expecting(expectation),
            &[report(OperationStatus::Completed, 4, Duration::from_secs(1))],
            &[],
        );
        assert_eq!(unmet, vec!["operation train (op=7): incarnations expected at most 3, actual 4".to_string()]);
    }

    #[test]
    fn an_operation_that_never_ended_or_was_refused_fails_its_expectations() {
        let mut running = report(OperationStatus::Running, 1, Duration::ZERO);
        running.ended_at = None;
        let within = OperationExpectation {
            completed_within: Some(Duration::from_secs(1)),
            ..OperationExpectation::on("train")
        };
        let unmet = expectations(&expecting(within), &[running], &[]);
        assert!(unmet[0].contains("actual: never ended"), "{unmet:?}");
        let state =
            OperationExpectation { state: Some(OperationStatus::Completed), ..OperationExpectation::on("train") };
        let unmet = expectations(&expecting(state.clone()), &[OperationReport::refused("train", "tasks: empty")], &[]);
        assert!(unmet[0].contains("refused: tasks: empty") && unmet[0].contains("actual not submitted"), "{unmet:?}");
        let unmet = expectations(&expecting(state), &[], &[]);
        assert!(unmet[0].contains("never submitted"), "{unmet:?}");
    }

    #[test]
    fn trace_expectations_count_matching_lines() {
        let line = |node: &str, kind: &'static str, fields: &str| TraceEvent {
            at: Duration::from_secs(1),
            node: node.into(),
            kind,
            fields: fields.into(),
        };
        let trace = [
            line("agent-1", "fence", "reason=\"lease lost\" killed=1"),
            line("agent-2", "fence", "reason=\"lease lost\" killed=0"),
            line("replica-0", "incarnation", "op=7 index=1 inc=7-i1 reason=job_aborted"),
        ];
        let fence = TraceExpectation {
            kind: "fence".into(),
            node: Some("agent-1".into()),
            fields: vec![("reason".into(), "lease lost".into())],
            contains: vec!["killed=1".into()],
            at_least: 1,
            at_most: Some(1),
        };
        let on = |trace_expectations: Vec<TraceExpectation>| Expectations {
            operations: Vec::new(),
            trace: trace_expectations,
        };
        assert!(expectations(&on(vec![fence.clone()]), &[], &trace).is_empty());
        let any_agent = TraceExpectation { node: Some("agent-*".into()), contains: Vec::new(), ..fence.clone() };
        let unmet = expectations(&on(vec![any_agent]), &[], &trace);
        assert_eq!(unmet, [r#"trace: `fence` lines on agent-* with reason="lease lost" expected at most 1, actual 2"#]);
        let restart = TraceExpectation {
            kind: "incarnation".into(),
            node: None,
            fields: vec![("reason".into(), "lack after revival".into())],
            contains: vec!["nothing".into(), "index=".into()],
            at_least: 1,
            at_most: None,
        };
        let unmet = expectations(&on(vec![restart]), &[], &trace);
        let expected = r#"trace: `incarnation` lines with reason="lack after revival" containing one of ["nothing", "index="] expected at least 1, actual 0"#;
        assert_eq!(unmet, [expected]);
    }

    #[test]
    fn live_processes_and_exclusivity_breaks_are_violations() {
        let live = BTreeMap::from([(RowId(40), vec![JobId { operation: RowId(7), index: 3 }])]);
        let exclusivity = ["allocation 40.1 starts job 7-4 while job 7-3 (allocation 40.1) still runs".to_string()];
        let input = GangCheckInput {
            reports: &[],
            views: &[],
            exclusivity: &exclusivity,
            processes: &[],
            start_skew_max: Duration::from_secs(12),
            live_at_end: &live,
            unfinished: &[],
            expectations: &Expectations::default(),
            trace: &[],
        };
        let found: Vec<&str> = check_all(&input).iter().map(|v| v.checker).collect();
        assert_eq!(found, ["allocation_exclusivity", "process_outlived_operation"]);
    }
}
