//! Gang operations in the simulated world (DESIGN §4, §5): what a scenario's gang part holds (agents, the
//! operations to submit and when, the jobs' behaviour, control actions, expectations), the client that submits
//! them over the network, the trace lines about operations, and the per-operation summary of a run.
//!
//! Every trace line about an operation, one of its jobs or one of its allocations carries the token
//! `op=<operation row id>` among its fields, which are space-separated `key=value` pairs (a value with spaces,
//! quotes or `=` is written as a Rust string literal, `reason="node lost"`), so that one operation's timeline can
//! be cut from a trace file alone. The lines:
//!
//! | node      | kind            | when                                                                    |
//! |-----------|-----------------|-------------------------------------------------------------------------|
//! | `client`  | `submit`        | the client's submit committed (`op name attempts`)                      |
//! | `client`  | `submit-refused`| the spec was refused (`name error`; no operation exists)                |
//! | `client`  | `abort`, `update-spec`, `control-refused` | a control action went in, or was refused      |
//! | replica   | `commit`        | a store commit on the operation's row (`op=` appended to the commit)    |
//! | replica   | `incarnation`   | an incarnation started (`op index inc reason trigger…`)                 |
//! | replica   | `job`           | a job changed state (`op job task cookie rank inc alloc node from to reason`) |
//! | replica   | `node-lost`     | the same, for a job the controller ended because its node was lost      |
//! | replica   | `op-state`      | the operation changed state (`op from to reason`)                       |
//! | replica   | `spec-update`   | a spec update was applied or refused                                    |
//! | replica   | `gang-wait`     | an all-or-nothing incarnation began to wait (`op inc need position reserved_ahead free cluster_slots`) |
//! | replica   | `gang-placed`   | an all-or-nothing incarnation was placed whole (`op inc need reused waited_ms`) |
//! | agent     | `proc-start`, `proc-exit`, `proc-kill`, `proc-start-failed`, `proc-pause`, `proc-resume` | a process event (`op job alloc inc`) |
//! | agent     | `fence`, `fence-kill` | the agent fenced itself (`reason killed`; then `op jobs` per operation) |
//! | agent     | `job-kill`      | the agent killed jobs the controller moved on from (`op jobs`)          |
//! | agent     | `session`       | the agent took a new node lease (`token`)                               |
//! | agent     | `calls-fault`, `calls-healed` | a fault on one kind of the agent's store calls began (`calls effect [delay] span`) or ended (`calls`) |

#[cfg(madsim)]
use super::net_store::NetStore;
use super::scenario::Mutation;
use super::trace::Trace;
use crate::agent::{AgentConfig, AgentPass, JobScript, ProcessEvent, ProcessEventKind};
use crate::gang::api::{self, GangError, OperationView};
use crate::gang::controller::{
    EVENT_GANG_PLACED, EVENT_GANG_WAITING, EVENT_INCARNATION_STARTED, EVENT_JOB_STATE, EVENT_OPERATION_STATE,
    EVENT_SPEC_UPDATE_REFUSED, EVENT_SPEC_UPDATED, REASON_NODE_LOST,
};
use crate::gang::model::{
    JobId, JobStatus, KIND_ALLOCATION, KIND_INBOX, KIND_JOB, KIND_NODE, KIND_OPERATION, OperationStatus,
};
use crate::gang::pipeline::operation_pipeline_config;
use crate::gang::placement::{
    GangPlacement, KIND_GANG_QUEUE, NODE_RETURN_GRACE_DEFAULT, PlacementSettings, UNFIT_TIMEOUT_DEFAULT,
};
use crate::gang::{OperationSpec, SpecFormat};
use crate::pipeline::PipelineConfig;
use crate::pipeline::clock::RATE_PPM_EXACT;
use crate::store::{
    ApplyOutcome, ApplyParams, Event, FetchParams, HeartbeatParams, Hint, Lease, LockOutcome, LockRelatedParams,
    NewRow, Row, RowId, RowUpdate, Store, StoreError, Timestamp, WriteOutcome,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::broadcast;

/// The gang part of a scenario: agent nodes `agent-0..agent-{agents-1}`, each offering `slots` allocations, the
/// operations a client submits at given times, how their jobs behave, and control actions on them.
#[derive(Clone, Debug)]
pub struct GangWorkload {
    /// Agent nodes, named `agent-0`, `agent-1`, …; at most 200 (addresses 10.0.2.1 to 10.0.2.200).
    pub agents: usize,
    /// Allocations (slots) each agent offers; at least 1.
    pub slots: u32,
    /// The agents' node lease and pacing.
    pub agent: AgentTunables,
    /// The operation pipeline every replica runs.
    pub controller: ControllerTunables,
    /// What the client submits, and when. Names must be unique and not empty.
    pub operations: Vec<Submission>,
    /// How the simulated jobs behave (durations, exit codes, hangs, start failures), matched by task, job cookie
    /// and start number of the (operation, task, cookie). Its `seed` is ignored: the run sets it from its seed.
    pub jobs: JobScript,
    /// Control actions on submitted operations (abort, spec update), each at its time.
    pub controls: Vec<Control>,
}

impl GangWorkload {
    /// When the client's last submission or control action is due (simulated time since the start).
    pub fn span(&self) -> Duration {
        let submissions = self.operations.iter().map(|s| s.at);
        submissions.chain(self.controls.iter().map(|c| c.at)).max().unwrap_or(Duration::ZERO)
    }

    /// The operation pipeline's config for the replicas.
    pub fn pipeline_config(&self) -> PipelineConfig {
        let mut config = operation_pipeline_config().with_lease_ttl(self.controller.lease_ttl);
        config.workers = self.controller.workers;
        config.lease_margin = self.controller.lease_margin;
        config.min_processing_interval = self.controller.min_processing_interval;
        config
    }

    /// The controller's placement settings on every replica, with the bugs `mutation` plants (`[mutation]
    /// gang_gate_disabled`, `lingering_gate_disabled`).
    pub fn placement_settings(&self, mutation: &Mutation) -> PlacementSettings {
        PlacementSettings {
            default: self.controller.gang_placement,
            unfit_timeout: self.controller.gang_unfit_timeout,
            node_return_grace: self.controller.node_return_grace.unwrap_or(NODE_RETURN_GRACE_DEFAULT),
            gate_disabled_for_mutation_test: mutation.gang_gate_disabled,
            lingering_gate_disabled_for_mutation_test: mutation.lingering_gate_disabled,
        }
    }

    /// The longest apart the ranks of an all-or-nothing incarnation may start (checker `gang_ranks_together`):
    /// they are placed in one pass, and a live agent starts a job placed on its node within its node lease ttl
    /// (past its local deadline it fences, and its next session never starts the job) plus two polls.
    pub fn start_skew_max(&self) -> Duration {
        self.agent.lease_ttl + self.agent.poll_interval * 2
    }

    /// The slowest clock rate (ppm) an agent may run at under the margin rule of DESIGN §2: at
    /// r < 1 − lease_margin / lease_ttl it believes in its node lease past the store's expiry. Rounded up.
    pub fn agent_rate_min_ppm(&self) -> u64 {
        let (ttl, margin) = (self.agent.lease_ttl.as_micros(), self.agent.lease_margin.as_micros());
        let exact = RATE_PPM_EXACT as u128;
        (exact * (ttl - margin)).div_ceil(ttl) as u64
    }

    /// Agent `index`'s configuration.
    pub fn agent_config(&self, index: usize) -> AgentConfig {
        let tunables = &self.agent;
        AgentConfig {
            lease_ttl: tunables.lease_ttl,
            lease_margin: tunables.lease_margin,
            heartbeat_trigger: tunables.heartbeat_trigger,
            poll_interval: tunables.poll_interval,
            ..AgentConfig::new(agent_name(index), self.slots)
        }
    }

    /// Checks the gang part. Errors: the first broken rule, naming its field (`gang.operations[2].spec`).
    pub fn check(&self) -> Result<(), String> {
        if self.agents > 200 {
            return Err(format!("gang.agents: {} exceeds 200", self.agents));
        }
        if self.slots == 0 {
            return Err("gang.slots: must be at least 1".into());
        }
        if !self.operations.is_empty() && self.agents == 0 {
            return Err("gang.agents: operations need at least one agent".into());
        }
        let a = &self.agent;
        if a.lease_margin >= a.lease_ttl || a.heartbeat_trigger >= a.lease_ttl - a.lease_margin {
            return Err(format!(
                "gang.agent: lease_margin {:?} and heartbeat_trigger {:?} must both fit inside lease_ttl {:?} \
                 (margin < ttl, trigger < ttl - margin)",
                a.lease_margin, a.heartbeat_trigger, a.lease_ttl
            ));
        }
        if a.poll_interval.is_zero() {
            return Err("gang.agent.poll_interval: must be above 0".into());
        }
        self.pipeline_config().validate().map_err(|error| format!("gang.controller: {error}"))?;
        let mut names = BTreeMap::new();
        for (index, submission) in self.operations.iter().enumerate() {
            if submission.name.is_empty() {
                return Err(format!("gang.operations[{index}].name: empty"));
            }
            if let Some(first) = names.insert(submission.name.as_str(), index) {
                return Err(format!(
                    "gang.operations[{index}].name: {:?} already names gang.operations[{first}]",
                    submission.name
                ));
            }
            OperationSpec::parse(&submission.spec, submission.format)
                .map_err(|error| format!("gang.operations[{index}].spec ({}): {error}", submission.name))?;
        }
        for (index, control) in self.controls.iter().enumerate() {
            if !names.contains_key(control.operation.as_str()) {
                return Err(format!("gang.controls[{index}].operation: no operation named {:?}", control.operation));
            }
            if let ControlAction::UpdateSpec { spec, format } = &control.action {
                OperationSpec::parse(spec, *format).map_err(|error| format!("gang.controls[{index}].spec: {error}"))?;
            }
        }
        Ok(())
    }
}

/// The name of agent `index`: `agent-{index}`.
pub fn agent_name(index: usize) -> String {
    format!("agent-{index}")
}

/// An agent's node lease and pacing (the fields of [`AgentConfig`] besides name and slots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentTunables {
    /// Node lease length, store clock. Default 10 s ([`crate::agent::NODE_LEASE_TTL_DEFAULT`]).
    pub lease_ttl: Duration,
    /// The agent fences itself this long before the store-side expiry. Default 2 s.
    pub lease_margin: Duration,
    /// The lease is extended when its local deadline is this close. Default `lease_ttl / 2`.
    pub heartbeat_trigger: Duration,
    /// Pause between agent passes, local clock. Default 1 s.
    pub poll_interval: Duration,
}

impl Default for AgentTunables {
    fn default() -> Self {
        let config = AgentConfig::new("", 0);
        AgentTunables {
            lease_ttl: config.lease_ttl,
            lease_margin: config.lease_margin,
            heartbeat_trigger: config.heartbeat_trigger,
            poll_interval: config.poll_interval,
        }
    }
}

/// The operation pipeline's knobs on every replica (the rest of its config is
/// [`operation_pipeline_config`]'s).
#[derive(Clone, PartialEq, Eq)]
pub struct ControllerTunables {
    /// Workers per replica. Default: the engine's default.
    pub workers: usize,
    /// Lease ttl of an operation pass, store clock. Default 30 s (the engine's).
    pub lease_ttl: Duration,
    /// Local lease margin. Default: the engine's.
    pub lease_margin: Duration,
    /// A running operation is looked at again at least this often (and at once on a hint). Default 5 s.
    pub min_processing_interval: Duration,
    /// Placement of gang operations whose spec leaves `gang_placement` out. Default incremental.
    pub gang_placement: GangPlacement,
    /// An all-or-nothing incarnation needing more allocations than the live nodes offer fails after this long.
    /// Default 60 s ([`UNFIT_TIMEOUT_DEFAULT`]).
    pub gang_unfit_timeout: Duration,
    /// A node lost less than this long ago counts as expected back ([`PlacementSettings::node_return_grace`]).
    /// `None`: the default, 5 min ([`NODE_RETURN_GRACE_DEFAULT`]).
    pub node_return_grace: Option<Duration>,
}

/// Written by hand so that tunables without `node_return_grace` print as they did before the field existed: the
/// scenario's content hash ([`crate::sim::ScenarioFile::content_hash`]) is taken over this text, and replay files
/// of older runs carry it.
impl std::fmt::Debug for ControllerTunables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut tunables = f.debug_struct("ControllerTunables");
        tunables
            .field("workers", &self.workers)
            .field("lease_ttl", &self.lease_ttl)
            .field("lease_margin", &self.lease_margin)
            .field("min_processing_interval", &self.min_processing_interval)
            .field("gang_placement", &self.gang_placement)
            .field("gang_unfit_timeout", &self.gang_unfit_timeout);
        if let Some(grace) = &self.node_return_grace {
            tunables.field("node_return_grace", grace);
        }
        tunables.finish()
    }
}

impl Default for ControllerTunables {
    fn default() -> Self {
        let config = operation_pipeline_config();
        ControllerTunables {
            workers: config.workers,
            lease_ttl: config.lease_ttl,
            lease_margin: config.lease_margin,
            min_processing_interval: config.min_processing_interval,
            gang_placement: GangPlacement::Incremental,
            gang_unfit_timeout: UNFIT_TIMEOUT_DEFAULT,
            node_return_grace: None,
        }
    }
}

/// One operation the client submits.
#[derive(Clone, Debug, PartialEq)]
pub struct Submission {
    /// The operation's name in the scenario (controls, expectations and reports refer to it).
    pub name: String,
    /// When the client submits it: simulated time since the world started.
    pub at: Duration,
    /// The spec's text.
    pub spec: String,
    /// The spec's format.
    pub format: SpecFormat,
}

/// A control action on a submitted operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    /// When: simulated time since the world started (after the operation's submission, or it is skipped).
    pub at: Duration,
    /// The operation's name (a [`Submission::name`]).
    pub operation: String,
    /// What to do.
    pub action: ControlAction,
}

/// What a [`Control`] does, through `gang::api`.
#[derive(Clone, Debug, PartialEq)]
pub enum ControlAction {
    /// [`api::abort`] with this reason.
    Abort {
        /// The reason given to the abort: the scenario's `reason`, by default `aborted by the scenario`.
        reason: String,
    },
    /// [`api::update_spec`] with this spec text.
    UpdateSpec {
        /// The new spec's text, inline or read from `spec_file` when the scenario was loaded; parsed when the
        /// scenario is checked and again when the control runs.
        spec: String,
        /// The text's format: the scenario's `format`, else the `spec_file`'s extension, else YSON.
        format: SpecFormat,
    },
}

/// What a run must show besides the invariants; each unmet expectation is a violation of checker `expect`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expectations {
    /// Per-operation expectations.
    pub operations: Vec<OperationExpectation>,
    /// What the trace must show: counts of lines of a kind (what must have happened, e.g. a fence).
    pub trace: Vec<TraceExpectation>,
}

impl Expectations {
    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty() && self.trace.is_empty()
    }
}

/// A count of trace lines the run must show: lines of `kind`, on `node` if given, whose fields hold every
/// `key=value` pair of `fields` (values written as the trace writes them, [`value`]) and one of the texts of
/// `contains` if any, number at least `at_least` and at most `at_most`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceExpectation {
    /// The line's kind (`fence`, `incarnation`, `node-lost`, `commit`, …; the kinds of this module's doc and of
    /// `sim/world.rs`'s faults).
    pub kind: String,
    /// The node (`agent-1`, `replica-0`, `db`, `world`, `client`), or a prefix ending in `*` (`agent-*`).
    pub node: Option<String>,
    /// `key=value` pairs the line's fields must hold, each as one whole field token.
    pub fields: Vec<(String, String)>,
    /// Texts the line's fields must contain one of (empty: no condition).
    pub contains: Vec<String>,
    /// Fewest matching lines.
    pub at_least: u64,
    /// Most matching lines.
    pub at_most: Option<u64>,
}

impl TraceExpectation {
    /// Whether a line on `node` of `kind` with `fields` matches (every condition but the counts).
    pub fn matches(&self, node: &str, kind: &str, fields: &str) -> bool {
        let node_ok = match self.node.as_deref() {
            None => true,
            Some(pattern) => match pattern.strip_suffix('*') {
                Some(prefix) => node.starts_with(prefix),
                None => node == pattern,
            },
        };
        let tokens = super::explain::field_tokens(fields);
        node_ok
            && kind == self.kind
            && (self.contains.is_empty() || self.contains.iter().any(|text| fields.contains(text.as_str())))
            && self.fields.iter().all(|(key, expected)| {
                let token = format!("{key}={}", value(expected));
                tokens.iter().any(|t| *t == token)
            })
    }

    /// The expectation in words: `` `fence` lines on agent-1 `` with its conditions.
    pub fn describe(&self) -> String {
        let mut text = format!("`{}` lines", self.kind);
        if let Some(node) = &self.node {
            text.push_str(&format!(" on {node}"));
        }
        let pairs: Vec<String> = self.fields.iter().map(|(k, v)| format!("{k}={}", value(v))).collect();
        if !pairs.is_empty() {
            text.push_str(&format!(" with {}", pairs.join(" ")));
        }
        match self.contains.as_slice() {
            [] => {}
            [one] => text.push_str(&format!(" containing {one:?}")),
            many => text.push_str(&format!(" containing one of {many:?}")),
        }
        text
    }
}

/// What one operation must show at the end of the run. Absent fields are not checked.
#[derive(Clone, Debug, PartialEq)]
pub struct OperationExpectation {
    /// The operation's name (a [`Submission::name`]).
    pub operation: String,
    /// Its final state.
    pub state: Option<OperationStatus>,
    /// Fewest incarnations it had (1 = it started and never restarted as a gang).
    pub incarnations_min: Option<u32>,
    /// Most incarnations it had.
    pub incarnations_max: Option<u32>,
    /// Longest span from its submission (the row's creation) to its end (its terminal state change), both on
    /// the store's clock (simulated time).
    pub completed_within: Option<Duration>,
}

impl OperationExpectation {
    /// An expectation on `operation` that checks nothing yet.
    pub fn on(operation: impl Into<String>) -> OperationExpectation {
        OperationExpectation {
            operation: operation.into(),
            state: None,
            incarnations_min: None,
            incarnations_max: None,
            completed_within: None,
        }
    }
}

impl Expectations {
    /// Checks that every expectation names a submitted operation and that its bounds are ordered.
    pub fn check(&self, gang: Option<&GangWorkload>) -> Result<(), String> {
        for (index, expectation) in self.operations.iter().enumerate() {
            let known = gang.is_some_and(|g| g.operations.iter().any(|s| s.name == expectation.operation));
            if !known {
                return Err(format!(
                    "expect.operations[{index}].operation: no operation named {:?} in the gang part",
                    expectation.operation
                ));
            }
            if let (Some(min), Some(max)) = (expectation.incarnations_min, expectation.incarnations_max)
                && min > max
            {
                return Err(format!("expect.operations[{index}]: incarnations_min {min} > incarnations_max {max}"));
            }
        }
        for (index, expectation) in self.trace.iter().enumerate() {
            if expectation.kind.is_empty() || expectation.kind.contains(char::is_whitespace) {
                return Err(format!("expect.trace[{index}].kind: {:?} is not one word", expectation.kind));
            }
            if let Some(max) = expectation.at_most
                && expectation.at_least > max
            {
                return Err(format!("expect.trace[{index}]: at_least {} > at_most {max}", expectation.at_least));
            }
        }
        Ok(())
    }
}

/// Whether `row` belongs to the gang controller (operations, their jobs and inbox, allocations, nodes, the gang
/// queue) rather
/// than to the row workload. The workload's `job` rows have no parent; the controller's are children of their
/// operation.
pub fn is_gang_row(row: &Row) -> bool {
    match row.kind.as_str() {
        KIND_OPERATION | KIND_ALLOCATION | KIND_NODE | KIND_INBOX | KIND_GANG_QUEUE => true,
        KIND_JOB => row.parent_id.is_some(),
        _ => false,
    }
}

/// A trace value: as is, or quoted as a Rust string literal if it is empty or holds whitespace, quotes or `=`.
pub fn value(text: &str) -> String {
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c == '"' || c == '=') {
        format!("{text:?}")
    } else {
        text.to_string()
    }
}

fn json_value(value_json: &Value) -> String {
    match value_json {
        Value::Null => "-".into(),
        Value::String(text) => value(text),
        other => value(&other.to_string()),
    }
}

/// The operation a commit concerns, if exactly one: `row` is the commit's main row (lease row or inserted row)
/// as it is now.
pub fn commit_operation(row: &Row) -> Option<RowId> {
    match row.kind.as_str() {
        KIND_OPERATION => Some(row.id),
        KIND_INBOX | KIND_JOB => row.parent_id,
        _ => None,
    }
}

/// The trace line (kind, fields) of an event the controller recorded on operation `event.row_id`. `node_of`
/// names the node of an allocation row.
pub fn event_line(event: &Event, node_of: impl Fn(RowId) -> Option<String>) -> (&'static str, String) {
    (event_kind(event), event_fields(event, event_node(event, node_of).as_deref()))
}

/// The kind of the trace line of an event the controller recorded on an operation ([`event_line`]).
pub fn event_kind(event: &Event) -> &'static str {
    match event.kind.as_str() {
        EVENT_INCARNATION_STARTED => "incarnation",
        EVENT_JOB_STATE if event.data["reason"].as_str() == Some(REASON_NODE_LOST) => "node-lost",
        EVENT_JOB_STATE => "job",
        EVENT_OPERATION_STATE => "op-state",
        EVENT_SPEC_UPDATED | EVENT_SPEC_UPDATE_REFUSED => "spec-update",
        EVENT_GANG_WAITING => "gang-wait",
        EVENT_GANG_PLACED => "gang-placed",
        _ => "op-event",
    }
}

/// The node of the allocation a job's state change names (`node_of` the allocation's row), if any: read when the
/// event is recorded, as the allocation is then.
pub fn event_node(event: &Event, node_of: impl Fn(RowId) -> Option<String>) -> Option<String> {
    if event.kind != EVENT_JOB_STATE {
        return None;
    }
    let allocation = event.data["allocation"].as_str()?;
    node_of(RowId(allocation.split('.').next()?.parse().ok()?))
}

/// The fields of the trace line of an event the controller recorded on operation `event.row_id`, with `node`
/// from [`event_node`] (`-` when none).
pub fn event_fields(event: &Event, node: Option<&str>) -> String {
    let data = &event.data;
    let op = event.row_id;
    match event.kind.as_str() {
        EVENT_INCARNATION_STARTED => {
            let mut fields = format!(
                "op={op} index={} inc={} reason={}",
                json_value(&data["index"]),
                json_value(&data["incarnation"]),
                json_value(&data["reason"])
            );
            let trigger = &data["trigger"];
            if trigger.is_object() {
                fields.push_str(&format!(
                    " trigger={} trigger_task={} trigger_cookie={} trigger_rank={} trigger_status={}",
                    json_value(&trigger["job"]),
                    json_value(&trigger["task"]),
                    json_value(&trigger["job_cookie"]),
                    json_value(&trigger["gang_rank"]),
                    json_value(&trigger["status"])
                ));
            }
            fields
        }
        EVENT_JOB_STATE => format!(
            "op={op} job={} task={} cookie={} rank={} reserved={} inc={} alloc={} node={} from={} to={} reason={}",
            json_value(&data["job"]),
            json_value(&data["task"]),
            json_value(&data["job_cookie"]),
            json_value(&data["gang_rank"]),
            json_value(&data["reserved"]),
            json_value(&data["incarnation"]),
            json_value(&data["allocation"]),
            value(node.unwrap_or("-")),
            json_value(&data["from"]),
            json_value(&data["to"]),
            json_value(&data["reason"])
        ),
        EVENT_OPERATION_STATE => format!(
            "op={op} from={} to={} reason={}",
            json_value(&data["from"]),
            json_value(&data["to"]),
            json_value(&data["reason"])
        ),
        EVENT_SPEC_UPDATED => format!("op={op} outcome=updated job_count={}", json_value(data)),
        EVENT_GANG_WAITING => format!(
            "op={op} inc={} need={} position={} reserved_ahead={} free={} cluster_slots={}",
            json_value(&data["incarnation"]),
            json_value(&data["need"]),
            json_value(&data["position"]),
            json_value(&data["reserved_ahead"]),
            json_value(&data["free"]),
            json_value(&data["cluster_slots"])
        ),
        EVENT_GANG_PLACED => format!(
            "op={op} inc={} need={} reused={} waited_ms={}",
            json_value(&data["incarnation"]),
            json_value(&data["need"]),
            json_value(&data["reused"]),
            json_value(&data["waited_ms"])
        ),
        EVENT_SPEC_UPDATE_REFUSED => format!("op={op} outcome=refused violations={}", json_value(&data["violations"])),
        other => format!("op={op} event={}", value(other)),
    }
}

/// The trace line (kind, fields) of a process event.
pub fn process_line(event: &ProcessEvent) -> (&'static str, String) {
    let base = format!(
        "op={} job={} alloc={} inc={}",
        event.job.operation,
        event.job,
        event.allocation,
        value(&event.incarnation)
    );
    match event.kind {
        ProcessEventKind::Started => ("proc-start", base),
        ProcessEventKind::StartFailed => ("proc-start-failed", base),
        ProcessEventKind::Exited(code) => ("proc-exit", format!("{base} code={code}")),
        ProcessEventKind::Killed => ("proc-kill", base),
        ProcessEventKind::Paused => ("proc-pause", base),
        ProcessEventKind::Resumed => ("proc-resume", base),
    }
}

/// Writes the trace lines of one agent pass: a new session, a fence and what it killed, jobs killed because the
/// controller moved on.
pub fn trace_pass(trace: &Trace, node: &Arc<str>, pass: &AgentPass) {
    if pass.leased
        && let Some(token) = pass.session
    {
        trace.record(node, "session", format!("token={token}"));
    }
    if let Some(reason) = &pass.fenced {
        trace.record(node, "fence", format!("reason={} killed={}", value(reason), pass.fence_killed.len()));
        for (op, jobs) in by_operation(&pass.fence_killed) {
            trace.record(node, "fence-kill", format!("op={op} jobs={jobs}"));
        }
    }
    for (op, jobs) in by_operation(&pass.killed) {
        trace.record(node, "job-kill", format!("op={op} jobs={jobs}"));
    }
}

fn by_operation(jobs: &[JobId]) -> BTreeMap<RowId, String> {
    let mut grouped: BTreeMap<RowId, Vec<String>> = BTreeMap::new();
    for job in jobs {
        grouped.entry(job.operation).or_default().push(job.to_string());
    }
    grouped.into_iter().map(|(op, jobs)| (op, jobs.join(","))).collect()
}

/// What became of one submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The operation exists: its row id.
    Submitted(RowId),
    /// The spec was refused; the error.
    Refused(String),
}

/// Most attempts the gang client makes at one call before it fails the run.
pub const GANG_CLIENT_ATTEMPTS_MAX: u32 = super::workload::CLIENT_ATTEMPTS_MAX;

/// How the gang client retries a submission whose outcome is unknown: the workload client's attempts and backoff.
const GANG_CLIENT_SUBMIT_RETRY: api::SubmitRetry = api::SubmitRetry {
    attempts_max: GANG_CLIENT_ATTEMPTS_MAX,
    backoff_min: super::workload::CLIENT_BACKOFF.0,
    backoff_max: super::workload::CLIENT_BACKOFF.1,
};

#[cfg(madsim)]
/// The gang client: submits every operation and runs every control action at its time, retrying each call
/// until it succeeds (with the row client's backoff). Every write goes through [`Keyed`], so a retry of a call
/// whose reply was lost finds the row the first attempt inserted instead of inserting a second one.
pub struct GangClient {
    /// The store connection (on the client node).
    pub store: Arc<NetStore>,
    /// The gang part.
    pub gang: Arc<GangWorkload>,
    /// The run's trace.
    pub trace: Trace,
    /// Where outcomes go, in submission order, as soon as each is known (the run reads them).
    pub outcomes: Arc<std::sync::Mutex<Vec<(String, SubmitOutcome)>>>,
}

enum Step<'a> {
    Submit(&'a Submission),
    Control(usize, &'a Control),
}

#[cfg(madsim)]
impl GangClient {
    /// Runs every submission and control action at its time (in time order; a submission before a control at the
    /// same time), then returns.
    pub async fn run(self) {
        let node: Arc<str> = Arc::from("client");
        let mut steps: Vec<(Duration, usize, Step<'_>)> = Vec::new();
        for (index, submission) in self.gang.operations.iter().enumerate() {
            steps.push((submission.at, index, Step::Submit(submission)));
        }
        for (index, control) in self.gang.controls.iter().enumerate() {
            steps.push((control.at, self.gang.operations.len() + index, Step::Control(index, control)));
        }
        steps.sort_by_key(|(at, order, _)| (*at, *order));
        let start = tokio::time::Instant::now();
        for (at, _, step) in steps {
            tokio::time::sleep_until(start + at).await;
            match step {
                Step::Submit(submission) => self.submit(&node, submission).await,
                Step::Control(index, control) => self.control(&node, index, control).await,
            }
        }
    }

    /// Submits through the real `submit` command's path ([`api::submit_keyed`]: keyed insert, hint, retried with the
    /// key while the outcome is unknown), keyed by the operation's name.
    async fn submit(&self, node: &Arc<str>, submission: &Submission) {
        let key = format!("operation-{}", submission.name);
        let spec = match OperationSpec::parse(&submission.spec, submission.format) {
            Ok(spec) => spec,
            Err(error) => return self.refused(node, submission, error.to_string()),
        };
        match api::submit_keyed(&*self.store, spec, &key, GANG_CLIENT_SUBMIT_RETRY).await {
            Ok(submitted) => {
                let (id, attempts) = (submitted.operation, submitted.attempts);
                self.trace.record(
                    node,
                    "submit",
                    format!("op={id} name={} attempts={attempts}", value(&submission.name)),
                );
                self.outcomes().push((submission.name.clone(), SubmitOutcome::Submitted(id)));
            }
            Err(GangError::Store(error)) => {
                panic!(
                    "gang client: submit of {} failed {GANG_CLIENT_ATTEMPTS_MAX} times in a row: {error}",
                    submission.name
                )
            }
            Err(error) => self.refused(node, submission, error.to_string()),
        }
    }

    fn refused(&self, node: &Arc<str>, submission: &Submission, error: String) {
        let fields = format!("name={} error={}", value(&submission.name), value(&error));
        self.trace.record(node, "submit-refused", fields);
        self.outcomes().push((submission.name.clone(), SubmitOutcome::Refused(error)));
    }

    async fn control(&self, node: &Arc<str>, index: usize, control: &Control) {
        let name = value(&control.operation);
        let submitted =
            self.outcomes().iter().find(|(n, _)| *n == control.operation).map(|(_, outcome)| outcome.clone());
        let Some(SubmitOutcome::Submitted(op)) = submitted else {
            let fields = format!("name={name} control={index} error=\"operation not submitted\"");
            self.trace.record(node, "control-refused", fields);
            return;
        };
        let key = format!("control-{index}");
        let mut backoff = super::workload::CLIENT_BACKOFF.0;
        for attempt in 1..=GANG_CLIENT_ATTEMPTS_MAX {
            let store = Keyed::new(self.store.clone(), key.clone());
            let (kind, result) = match &control.action {
                ControlAction::Abort { reason } => ("abort", api::abort(&store, op, reason).await),
                ControlAction::UpdateSpec { spec, format } => {
                    let spec = OperationSpec::parse(spec, *format).map_err(GangError::from);
                    let result = match spec {
                        Ok(spec) => api::update_spec(&store, op, spec).await,
                        Err(error) => Err(error),
                    };
                    ("update-spec", result)
                }
            };
            match result {
                Ok(()) => {
                    self.trace.record(node, kind, format!("op={op} name={name} control={index} attempts={attempt}"));
                    return;
                }
                Err(GangError::Store(_)) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(super::workload::CLIENT_BACKOFF.1);
                }
                // A retry after a lost reply may find the operation ended by the first attempt: refused too.
                Err(error) => {
                    let fields = format!("op={op} name={name} control={index} error={}", value(&error.to_string()));
                    self.trace.record(node, "control-refused", fields);
                    return;
                }
            }
        }
        panic!("gang client: control {index} failed {GANG_CLIENT_ATTEMPTS_MAX} times in a row")
    }

    fn outcomes(&self) -> std::sync::MutexGuard<'_, Vec<(String, SubmitOutcome)>> {
        self.outcomes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(madsim)]
/// A [`NetStore`] whose one `insert` is keyed by `key` (the database's unique index of keyed inserts): a
/// `gang::api` write call made through it inserts its one row at most once however often it is retried with the
/// same key. Every other call passes through. Panics if a call through it inserts twice (it would hand back the
/// first row for the second).
pub struct Keyed {
    store: Arc<NetStore>,
    key: String,
    inserted: AtomicBool,
}

#[cfg(madsim)]
impl Keyed {
    /// `store` with its next insert keyed by `key`.
    pub fn new(store: Arc<NetStore>, key: String) -> Keyed {
        Keyed { store, key, inserted: AtomicBool::new(false) }
    }
}

#[cfg(madsim)]
impl Store for Keyed {
    async fn fetch(&self, params: FetchParams) -> Result<Vec<Row>, StoreError> {
        self.store.fetch(params).await
    }
    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        self.store.refetch(lease).await
    }
    async fn heartbeat(&self, params: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        self.store.heartbeat(params).await
    }
    async fn lock_related(&self, params: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        self.store.lock_related(params).await
    }
    async fn apply(&self, params: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.store.apply(params).await
    }
    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        self.store.apply_batch(batch).await
    }
    async fn record_failure(
        &self,
        params: crate::store::FailureParams,
    ) -> Result<crate::store::FailureOutcome, StoreError> {
        self.store.record_failure(params).await
    }
    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        self.store.reset_for_retry(lease, delay).await
    }
    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        self.store.release(leases).await
    }
    async fn insert(&self, row: NewRow) -> Result<Row, StoreError> {
        assert!(!self.inserted.swap(true, Ordering::SeqCst), "a keyed call ({}) inserted twice", self.key);
        self.store.insert_keyed(self.key.clone(), row).await
    }
    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        self.store.get(id).await
    }
    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        self.store.list(kind, parent).await
    }
    async fn query(&self, queries: Vec<crate::store::RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        self.store.query(queries).await
    }
    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        self.store.events(row).await
    }
    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        self.store.update_unleased(id, update).await
    }
    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        self.store.hint(kind, row).await
    }
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.store.subscribe_hints()
    }
    async fn now(&self) -> Result<Timestamp, StoreError> {
        Store::now(&*self.store).await
    }
}

/// One incarnation of an operation, from its `incarnation_started` event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncarnationReport {
    /// Its index (0 at start, +1 at each gang restart).
    pub index: u32,
    /// Why it started (`start`, a gang restart's reason, `lack after revival`, …).
    pub reason: String,
    /// The job that triggered it, if any.
    pub trigger: Option<String>,
    /// When, as simulated time since the world started (store clock).
    pub at: Duration,
}

/// What became of one submitted operation, for reports and the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationReport {
    /// The scenario's name for it.
    pub name: String,
    /// Its row id, if it was submitted.
    pub id: Option<RowId>,
    /// Why the submission was refused, if it was.
    pub refused: Option<String>,
    /// Its state at the end of the run.
    pub status: Option<OperationStatus>,
    /// Its result text (why it failed or was aborted).
    pub result: Option<String>,
    /// When it was submitted (its row's creation), simulated time since the world started.
    pub submitted_at: Option<Duration>,
    /// When it reached its terminal state, simulated time since the world started.
    pub ended_at: Option<Duration>,
    /// Its incarnations, in order.
    pub incarnations: Vec<IncarnationReport>,
    /// Job counts by task, then by state.
    pub jobs: BTreeMap<String, BTreeMap<JobStatus, usize>>,
}

impl OperationReport {
    /// Submission to end, if it ended.
    pub fn completion(&self) -> Option<Duration> {
        Some(self.ended_at?.saturating_sub(self.submitted_at?))
    }

    /// The report of a submission that was refused.
    pub fn refused(name: &str, error: &str) -> OperationReport {
        OperationReport {
            name: name.into(),
            id: None,
            refused: Some(error.into()),
            status: None,
            result: None,
            submitted_at: None,
            ended_at: None,
            incarnations: Vec::new(),
            jobs: BTreeMap::new(),
        }
    }

    /// The report of operation `name` from its view; `origin` is the store time the world started at.
    pub fn of(name: &str, view: &OperationView, created_at: Timestamp, origin: Timestamp) -> OperationReport {
        let since = |at: Timestamp| Duration::from_micros((at.as_micros() - origin.as_micros()).max(0) as u64);
        let incarnations = view
            .incarnation_events()
            .iter()
            .map(|event| IncarnationReport {
                index: event.data["index"].as_u64().unwrap_or(0) as u32,
                reason: event.data["reason"].as_str().unwrap_or("?").to_string(),
                trigger: event.data["trigger"]["job"].as_str().map(str::to_string),
                at: since(event.at),
            })
            .collect();
        let ended_at = view
            .events
            .iter()
            .filter(|e| e.kind == EVENT_OPERATION_STATE)
            .filter(|e| e.data["to"].as_str().and_then(OperationStatus::parse).is_some_and(|s| s.is_terminal()))
            .map(|e| since(e.at))
            .next_back();
        let mut jobs: BTreeMap<String, BTreeMap<JobStatus, usize>> = BTreeMap::new();
        for job in &view.jobs {
            *jobs.entry(job.data.task.clone()).or_default().entry(job.status).or_default() += 1;
        }
        OperationReport {
            name: name.into(),
            id: Some(view.id),
            refused: None,
            status: Some(view.status),
            result: view.data.result.clone(),
            submitted_at: Some(since(created_at)),
            ended_at: if view.status.is_terminal() { ended_at } else { None },
            incarnations,
            jobs,
        }
    }
}
