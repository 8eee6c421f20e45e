//! The gang part of `lockstep chaos run`: the harness as the gang client (it submits the scenario's
//! `[[operations]]` and runs its `[[controls]]` at their times through `gang::api`, the path of `lockstep submit`
//! and `lockstep abort`), and what the gang checkers read, built from what PostgreSQL and the agents recorded:
//!
//! - the operations' reports and views (`gang::api::status`, as `lockstep status` reads them);
//! - the process log: every agent's record ([`super::jobs`]) as the simulator's [`ProcessEvent`]s, merged in time
//!   order, with allocation exclusivity and the processes alive at the end computed by [`ProcessLog`] itself;
//! - the trace lines the simulator writes for the same facts: `commit` per recorded commit (on the node whose
//!   session wrote it), `incarnation`, `job`, `node-lost`, `op-state` per controller event ([`event_line`], on
//!   the replica whose apply wrote it), `proc-*` per process record ([`process_line`]), `fence` and `session` per
//!   agent pass the agent recorded. The scenario's `[[expect.trace]]` counts these, as in the simulator.

use super::ChaosError;
use super::jobs::{self, AgentRecord};
use crate::agent::{ProcessEvent, ProcessLog};
use crate::gang::OperationSpec;
use crate::gang::api::{self, GangError};
use crate::gang::model::{AllocationData, KIND_ALLOCATION, KIND_OPERATION, OperationStatus};
use crate::sim::gang::{
    ControlAction, GangWorkload, OperationReport, SubmitOutcome, event_line, is_gang_row, process_line, value,
};
use crate::sim::run::GangOutcome;
use crate::sim::trace::{Fields, Trace, TraceEvent};
use crate::sim::workload;
use crate::store::{Commit, CommitOp, Event, PgStore, Row, RowId, Store, Timestamp};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Attempts of one submission or control action before the run fails (the harness's session goes to
/// PostgreSQL directly, so an error is a server hiccup).
pub const CLIENT_ATTEMPTS_MAX: u32 = 20;

/// Pause between two attempts of a client call.
const CLIENT_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How the gang client retries a submission whose outcome is unknown ([`api::submit_keyed`]): as [`retried`] does
/// its other calls.
const SUBMIT_RETRY: api::SubmitRetry = api::SubmitRetry {
    attempts_max: CLIENT_ATTEMPTS_MAX,
    backoff_min: CLIENT_RETRY_PAUSE,
    backoff_max: CLIENT_RETRY_PAUSE,
};

/// Trace kinds built from what was recorded (PostgreSQL's history and events, the agents' records), as opposed
/// to what the harness did (faults, heals, submissions): `faults.txt` leaves them out.
pub const RECORDED_KINDS: [&str; 18] = [
    "commit",
    "incarnation",
    "job",
    "node-lost",
    "op-state",
    "spec-update",
    "gang-wait",
    "gang-placed",
    "op-event",
    "proc-start",
    "proc-start-failed",
    "proc-exit",
    "proc-kill",
    "proc-pause",
    "proc-resume",
    "fence",
    "fence-kill",
    "session",
];

/// The start of a run on each clock the records use: the harness's monotonic clock, this machine's wall clock
/// (the agents' records, µs since the Unix epoch) and PostgreSQL's (history, events, rows).
#[derive(Clone, Copy, Debug)]
pub struct Origin {
    /// The harness's clock at the start.
    pub local: Instant,
    /// The wall clock at the start, µs since the Unix epoch.
    pub wall_us: i64,
    /// PostgreSQL's clock at the start.
    pub db: Timestamp,
}

impl Origin {
    /// A database time as an offset from the start (0 before it).
    pub fn since_db(&self, at: Timestamp) -> Duration {
        Duration::from_micros(u64::try_from(at.as_micros() - self.db.as_micros()).unwrap_or(0))
    }
}

/// The harness's gang client: every submission and control action of the gang part at its (scaled) time.
pub struct GangClient {
    gang: GangWorkload,
    time_scale: f64,
    trace: Trace,
}

impl GangClient {
    /// The client of `gang`, its times multiplied by `time_scale`, tracing to `trace`.
    pub fn new(gang: GangWorkload, time_scale: f64, trace: Trace) -> GangClient {
        GangClient { gang, time_scale, trace }
    }

    /// Runs every submission and control action at its time after `started` (a submission before a control at
    /// the same time), on `store`; returns what became of each submission, in submission order.
    ///
    /// Errors: a call that failed [`CLIENT_ATTEMPTS_MAX`] times on a store error.
    pub async fn run(self, store: &PgStore, started: Instant) -> Result<Vec<(String, SubmitOutcome)>, ChaosError> {
        let client: Arc<str> = Arc::from("client");
        let mut steps: Vec<(Duration, usize)> = Vec::new();
        let operations = self.gang.operations.len();
        steps.extend(self.gang.operations.iter().enumerate().map(|(index, s)| (s.at, index)));
        steps.extend(self.gang.controls.iter().enumerate().map(|(index, c)| (c.at, operations + index)));
        steps.sort();
        let mut outcomes: Vec<(String, SubmitOutcome)> = Vec::new();
        for (at, step) in steps {
            tokio::time::sleep_until(started + at.mul_f64(self.time_scale)).await;
            if let Some(submission) = self.gang.operations.get(step) {
                let outcome = match OperationSpec::parse(&submission.spec, submission.format) {
                    Err(error) => Err(error.to_string()),
                    // Keyed as the real `submit` and the simulator's client submit: a retry after an unknown
                    // outcome creates nothing twice.
                    Ok(spec) => {
                        match api::submit_keyed(store, spec, &format!("operation-{}", submission.name), SUBMIT_RETRY)
                            .await
                        {
                            Ok(submitted) => Ok(submitted.operation),
                            Err(GangError::Store(error)) => {
                                let message =
                                    format!("the gang client's submit failed {CLIENT_ATTEMPTS_MAX} times: {error}");
                                return Err(ChaosError { code: 1, message });
                            }
                            Err(error) => Err(error.to_string()),
                        }
                    }
                };
                match outcome {
                    Ok(id) => {
                        let fields = format!("op={id} name={}", value(&submission.name));
                        self.trace.record(&client, "submit", fields);
                        outcomes.push((submission.name.clone(), SubmitOutcome::Submitted(id)));
                    }
                    Err(error) => {
                        let fields = format!("name={} error={}", value(&submission.name), value(&error));
                        self.trace.record(&client, "submit-refused", fields);
                        outcomes.push((submission.name.clone(), SubmitOutcome::Refused(error)));
                    }
                }
                continue;
            }
            let index = step - operations;
            let control = &self.gang.controls[index];
            let name = value(&control.operation);
            let op = outcomes.iter().find(|(n, _)| *n == control.operation).and_then(|(_, outcome)| match outcome {
                SubmitOutcome::Submitted(id) => Some(*id),
                SubmitOutcome::Refused(_) => None,
            });
            let Some(op) = op else {
                let fields = format!("name={name} control={index} error=\"operation not submitted\"");
                self.trace.record(&client, "control-refused", fields);
                continue;
            };
            let (kind, result) = match &control.action {
                ControlAction::Abort { reason } => ("abort", retried(|| api::abort(store, op, reason)).await?),
                ControlAction::UpdateSpec { spec, format } => match OperationSpec::parse(spec, *format) {
                    Err(error) => ("update-spec", Err(error.to_string())),
                    Ok(spec) => ("update-spec", retried(|| api::update_spec(store, op, spec.clone())).await?),
                },
            };
            match result {
                Ok(()) => self.trace.record(&client, kind, format!("op={op} name={name} control={index}")),
                Err(error) => {
                    let fields = format!("op={op} name={name} control={index} error={}", value(&error));
                    self.trace.record(&client, "control-refused", fields);
                }
            }
        }
        Ok(outcomes)
    }
}

/// `call` until it does not fail on a store error, at most [`CLIENT_ATTEMPTS_MAX`] times: its result, or its
/// refusal (a gang rule) as text.
async fn retried<T, F, Fut>(call: F) -> Result<Result<T, String>, ChaosError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, GangError>>,
{
    let mut last = None;
    for _ in 0..CLIENT_ATTEMPTS_MAX {
        match call().await {
            Ok(value) => return Ok(Ok(value)),
            Err(GangError::Store(error)) => {
                last = Some(error);
                tokio::time::sleep(CLIENT_RETRY_PAUSE).await;
            }
            Err(error) => return Ok(Err(error.to_string())),
        }
    }
    Err(ChaosError { code: 1, message: format!("the gang client's call failed {CLIENT_ATTEMPTS_MAX} times: {last:?}") })
}

/// Whether every workload row is final and every gang operation ended (the liveness wait's end).
pub fn converged(rows: &[Row]) -> bool {
    rows.iter().all(|row| match is_gang_row(row) {
        false => workload::is_terminal(row),
        true => row.kind != KIND_OPERATION || OperationStatus::parse(&row.status).is_some_and(|s| s.is_terminal()),
    })
}

/// What the gang checkers read: every submission's report and view from PostgreSQL, and the agents' records
/// (`records[i]`: agent `i`'s) as one process log.
///
/// Errors: an operation that cannot be read back.
pub async fn outcome(
    store: &PgStore,
    submitted: &[(String, SubmitOutcome)],
    unfinished: Vec<String>,
    records: &[Vec<AgentRecord>],
    origin: &Origin,
) -> Result<GangOutcome, ChaosError> {
    let fail = |what: String| ChaosError { code: 1, message: what };
    let mut reports = Vec::new();
    let mut views = Vec::new();
    for (name, outcome) in submitted {
        match outcome {
            SubmitOutcome::Refused(error) => reports.push(OperationReport::refused(name, error)),
            SubmitOutcome::Submitted(id) => {
                let view = api::status(store, *id).await.map_err(|e| fail(format!("operation {id}: {e}")))?;
                let row = store.get(*id).await.map_err(|e| fail(format!("operation {id}: {e}")))?;
                let created_at = row.map_or(origin.db, |row| row.created_at);
                reports.push(OperationReport::of(name, &view, created_at, origin.db));
                views.push(view);
            }
        }
    }
    let processes = process_log(records, origin);
    let log = ProcessLog::from_events(processes.clone());
    Ok(GangOutcome {
        reports,
        views,
        unfinished,
        exclusivity: log.exclusivity_violations(),
        processes,
        live_at_end: log.live(),
    })
}

/// Every agent's process records as one process log, in time order (each agent's own order kept at ties).
pub fn process_log(records: &[Vec<AgentRecord>], origin: &Origin) -> Vec<ProcessEvent> {
    let mut events: Vec<ProcessEvent> =
        records.iter().flat_map(|records| jobs::process_events(records, origin.local, origin.wall_us)).collect();
    events.sort_by_key(|event| event.at);
    events
}

/// The trace lines of what was recorded (module docs), each at its offset from the run's start. `names` maps a
/// session's application_name (a history record's caller) to its node's name.
pub fn trace_lines(
    history: &[Commit],
    events: &[Event],
    rows: &[Row],
    records: &[Vec<AgentRecord>],
    origin: &Origin,
    names: BTreeMap<String, Arc<str>>,
) -> Vec<TraceEvent> {
    let node_of_caller = |commit: &Commit| -> Arc<str> {
        let caller = commit.caller.as_deref().unwrap_or("db");
        names.get(caller).cloned().unwrap_or_else(|| Arc::from(caller))
    };
    let mut lines = Vec::new();
    // Each controller event was written in the transaction of its operation's apply: same row, same `now()`.
    let mut writer: BTreeMap<(RowId, Timestamp), Arc<str>> = BTreeMap::new();
    for commit in history {
        if let CommitOp::Apply { lease, applied: true, .. } = &commit.op {
            writer.insert((lease.id, commit.at), node_of_caller(commit));
        }
        let at = origin.since_db(commit.at);
        let fields = Fields::Commit { op: commit.op.clone(), operation: None };
        lines.push(TraceEvent { at, node: node_of_caller(commit), kind: "commit", fields });
    }
    let kinds: BTreeMap<RowId, &str> = rows.iter().map(|row| (row.id, row.kind.as_str())).collect();
    let allocation_nodes: BTreeMap<RowId, String> = rows
        .iter()
        .filter(|row| row.kind == KIND_ALLOCATION)
        .filter_map(|row| {
            serde_json::from_value::<AllocationData>(row.data.clone()).ok().map(|d| (row.id, d.node_name))
        })
        .collect();
    for event in events.iter().filter(|event| kinds.get(&event.row_id) == Some(&KIND_OPERATION)) {
        let (kind, fields) = event_line(event, |row| allocation_nodes.get(&row).cloned());
        let node = writer.get(&(event.row_id, event.at)).cloned().unwrap_or_else(|| Arc::from("db"));
        lines.push(TraceEvent { at: origin.since_db(event.at), node, kind, fields: fields.into() });
    }
    for event in process_log(records, origin) {
        let (kind, fields) = process_line(&event);
        let at = event.at.saturating_duration_since(origin.local);
        lines.push(TraceEvent { at, node: Arc::from(event.node.as_str()), kind, fields: fields.into() });
    }
    let since_wall = |at_us: i64| Duration::from_micros(u64::try_from(at_us - origin.wall_us).unwrap_or(0));
    for (agent, records) in records.iter().enumerate() {
        let node: Arc<str> = Arc::from(crate::sim::gang::agent_name(agent));
        for record in records {
            match record {
                AgentRecord::Fence { at_us, reason, killed } => {
                    let fields = format!("reason={} killed={}", value(reason), killed.len()).into();
                    lines.push(TraceEvent { at: since_wall(*at_us), node: node.clone(), kind: "fence", fields });
                }
                AgentRecord::Session { at_us, token } => {
                    let fields = format!("token={token}").into();
                    lines.push(TraceEvent { at: since_wall(*at_us), node: node.clone(), kind: "session", fields });
                }
                _ => {}
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Lease, LockToken, NewRow};
    use serde_json::json;

    fn row(id: i64, kind: &str, status: &str, parent: Option<i64>) -> Row {
        let mut row = NewRow::new(kind, status, json!({})).into_row(RowId(id), Timestamp(0));
        row.parent_id = parent.map(RowId);
        row
    }

    #[test]
    fn the_run_converges_when_every_operation_ended_whatever_its_jobs_and_nodes() {
        let running = [row(1, KIND_OPERATION, "running", None), row(2, "node", "agent-0", None)];
        assert!(!converged(&running));
        let ended = [row(1, KIND_OPERATION, "completed", None), row(2, "node", "agent-0", None)];
        assert!(converged(&ended));
    }

    #[test]
    fn commits_land_on_their_node_and_an_event_on_the_replica_whose_apply_wrote_it() {
        let origin = Origin { local: Instant::now(), wall_us: 0, db: Timestamp(1_000_000) };
        let lease = Lease { id: RowId(5), token: LockToken(9) };
        let apply = CommitOp::Apply { lease, applied: true, related: Vec::new(), inserted: Vec::new() };
        let history =
            [Commit { at: Timestamp(3_000_000), caller: Some(Arc::from("lockstep serve s-replica-1")), op: apply }];
        let event = Event {
            seq: 1,
            row_id: RowId(5),
            kind: crate::gang::controller::EVENT_OPERATION_STATE.into(),
            data: json!({ "from": "pending", "to": "running", "reason": null }),
            at: Timestamp(3_000_000),
        };
        let names = BTreeMap::from([("lockstep serve s-replica-1".to_string(), Arc::from("replica-1"))]);
        let rows = [row(5, KIND_OPERATION, "running", None)];
        let lines = trace_lines(&history, &[event], &rows, &[], &origin, names);
        let shown: Vec<(&str, &str, Duration)> = lines.iter().map(|l| (&*l.node, l.kind, l.at)).collect();
        assert_eq!(
            shown,
            [("replica-1", "commit", Duration::from_secs(2)), ("replica-1", "op-state", Duration::from_secs(2))]
        );
    }
}
