//! The gang part of a scenario file: `[agent]`, `[controller]`, `[[operations]]`, `[jobs]` with its
//! `[[jobs.rule]]`s, `[[controls]]`, `[[expect.operation]]` and `[[expect.trace]]` (docs/scenarios.md,
//! "Gang scenarios", documents every key). Each table denies unknown keys; each rule broken is reported
//! at its key, like the rest of the file ([`super::ScenarioError`]).
//!
//! Spec files (`spec_file`) are read when the scenario is parsed, relative to the scenario file's directory
//! ([`SpecSource`]), and their text goes into the [`Scenario`](crate::sim::Scenario) itself: the content hash covers it, and a replay
//! file carries it ([`super::ScenarioFile::spec_files`]), so a replay never needs the spec file again.

use super::{Broken, Dur, DurationRange, KeyPath, Seg, item, key, ordered, positive, within_max};
use crate::agent::{Behaviour, End, JobScript, Rule};
use crate::gang::model::OperationStatus;
use crate::gang::{GangPlacement, OperationSpec, SpecFormat};
use crate::sim::gang::{
    AgentTunables, Control, ControlAction, ControllerTunables, Expectations, GangWorkload, OperationExpectation,
    Submission, TraceExpectation, agent_name,
};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where `spec_file` paths are read from.
#[derive(Clone, Copy, Debug)]
pub enum SpecSource<'a> {
    /// Files on disk, relative to this directory (the scenario file's).
    Dir(&'a Path),
    /// Texts by the path the scenario writes (a replay file's copies); a path missing here is an error.
    Files(&'a BTreeMap<String, String>),
}

impl SpecSource<'_> {
    /// The text of spec file `path` (as the scenario writes it). Errors: the rule, naming the path tried.
    fn read(&self, path: &str) -> Result<String, String> {
        match self {
            SpecSource::Dir(dir) => {
                let full: PathBuf = dir.join(path);
                crate::files::read_text(&full, "spec file", crate::gang::spec::SPEC_FILE_BYTES_MAX)
                    .map_err(|reason| format!("cannot read {}: {reason}", full.display()))
            }
            SpecSource::Files(files) => {
                files.get(path).cloned().ok_or_else(|| format!("the replay file carries no spec file {path:?}"))
            }
        }
    }
}

/// `[agent]`: every agent's node lease and pacing ([`AgentTunables`]).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AgentDoc {
    lease_ttl: Option<Dur>,
    lease_margin: Option<Dur>,
    heartbeat_trigger: Option<Dur>,
    poll_interval: Option<Dur>,
}

/// `[controller]`: the operation pipeline on every replica ([`ControllerTunables`]).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ControllerDoc {
    workers: Option<usize>,
    lease_ttl: Option<Dur>,
    lease_margin: Option<Dur>,
    min_processing_interval: Option<Dur>,
    gang_placement: Option<String>,
    gang_unfit_timeout: Option<Dur>,
    node_return_grace: Option<Dur>,
}

/// One `[[operations]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OperationDoc {
    name: String,
    at: Dur,
    spec: Option<String>,
    spec_file: Option<String>,
    format: Option<FormatDoc>,
}

/// A spec format by name: `yson`, `json` or `yaml`.
#[derive(Clone, Copy, Debug)]
struct FormatDoc(SpecFormat);

impl<'de> Deserialize<'de> for FormatDoc {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<FormatDoc, D::Error> {
        let name = String::deserialize(deserializer)?;
        match name.as_str() {
            "yson" => Ok(FormatDoc(SpecFormat::Yson)),
            "json" => Ok(FormatDoc(SpecFormat::Json)),
            "yaml" => Ok(FormatDoc(SpecFormat::Yaml)),
            _ => Err(serde::de::Error::custom(format!(
                "unknown spec format \"{name}\": expected one of yson, json, yaml"
            ))),
        }
    }
}

/// `[jobs]`: how simulated jobs behave ([`JobScript`]).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JobsDoc {
    duration: Option<DurationRange>,
    exit_code: Option<i32>,
    #[serde(default)]
    rule: Vec<RuleDoc>,
}

/// One `[[jobs.rule]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDoc {
    task: Option<String>,
    cookie: Option<u32>,
    attempt: Option<u32>,
    duration: Option<DurationRange>,
    exit_code: Option<i32>,
    hang: Option<bool>,
    start_failure: Option<String>,
}

/// One `[[controls]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ControlDoc {
    at: Dur,
    operation: String,
    action: String,
    reason: Option<String>,
    spec: Option<String>,
    spec_file: Option<String>,
    format: Option<FormatDoc>,
}

/// One `[[expect.operation]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExpectOperationDoc {
    name: String,
    state: Option<String>,
    incarnations: Option<IncarnationsDoc>,
    completes_within: Option<Dur>,
}

/// `incarnations = { min = 2, max = 2 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IncarnationsDoc {
    min: Option<u32>,
    max: Option<u32>,
}

/// One `[[expect.trace]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExpectTraceDoc {
    kind: String,
    node: Option<String>,
    #[serde(default)]
    fields: BTreeMap<String, String>,
    #[serde(default)]
    contains: Texts,
    at_least: Option<u64>,
    at_most: Option<u64>,
}

/// One text or a list of texts: `contains = "x"` or `contains = ["x", "y"]`.
#[derive(Default)]
struct Texts(Vec<String>);

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Texts, D::Error> {
        struct TextsVisitor;
        impl<'de> serde::de::Visitor<'de> for TextsVisitor {
            type Value = Texts;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Texts, E> {
                Ok(Texts(vec![text.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Texts, A::Error> {
                let mut texts = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    texts.push(text);
                }
                Ok(Texts(texts))
            }
        }
        deserializer.deserialize_any(TextsVisitor)
    }
}

/// The gang part's tables, as the file wrote them.
pub(super) struct GangDocs {
    pub agents: Option<usize>,
    pub slots: Option<u32>,
    pub agent: Option<AgentDoc>,
    pub controller: Option<ControllerDoc>,
    pub operations: Vec<OperationDoc>,
    pub jobs: Option<JobsDoc>,
    pub controls: Vec<ControlDoc>,
}

/// Agent and controller defaults of a scenario file's gang part: those of [`crate::sim::Scenario::gang_quiet`]
/// (operation leases of 10 s, looked at every 2 s), so that faults outlast leases within short scenarios.
pub const CONTROLLER_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);
/// See [`CONTROLLER_LEASE_TTL_DEFAULT`].
pub const CONTROLLER_MIN_PROCESSING_INTERVAL_DEFAULT: Duration = Duration::from_secs(2);
/// Jobs' duration when `[jobs] duration` is left out: uniform in 5–60 s (as [`crate::sim::scenario::gang_jobs`]).
pub const JOB_DURATION_DEFAULT: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));
/// Slots per agent when `topology.slots` is left out.
pub const SLOTS_DEFAULT: u32 = 1;

/// The most allocations an agent offers (`[topology] slots`): each is a row the controller reads every pass, and
/// 200 agents of this many are 204 800 rows; a value of a billion ran out of time and memory before this bound.
/// The real agent's bound ([`crate::agent::SLOTS_MAX`]).
pub const SLOTS_MAX: u32 = crate::agent::SLOTS_MAX;

impl GangDocs {
    /// Whether the file has a gang part at all.
    pub(super) fn present(&self) -> bool {
        self.agents.is_some()
            || self.slots.is_some()
            || self.agent.is_some()
            || self.controller.is_some()
            || !self.operations.is_empty()
            || self.jobs.is_some()
            || !self.controls.is_empty()
    }

    /// The gang part, its spec files' texts by path (as written), every value checked at its key.
    pub(super) fn workload(self, specs: SpecSource<'_>) -> Result<(GangWorkload, BTreeMap<String, String>), Broken> {
        let agents = self.agents.unwrap_or(0);
        if agents > 200 {
            return Err((key(&["topology", "agents"]), format!("{agents} must be in 0..=200")));
        }
        let slots = self.slots.unwrap_or(SLOTS_DEFAULT);
        if !(1..=SLOTS_MAX).contains(&slots) {
            let rule = format!("{slots} must be in 1..={SLOTS_MAX} (allocations per agent)");
            return Err((key(&["topology", "slots"]), rule));
        }
        let mut files = BTreeMap::new();
        let mut operations: Vec<Submission> = Vec::new();
        for (index, doc) in self.operations.iter().enumerate() {
            let at = |field: &str| item(&["operations"], index, field);
            if doc.name.is_empty() {
                return Err((at("name"), "must not be empty".into()));
            }
            if let Some(first) = operations.iter().position(|s| s.name == doc.name) {
                return Err((at("name"), format!("{:?} already names operations[{first}]", doc.name)));
            }
            let what = format!("operation {:?}", doc.name);
            let (spec, format) = spec_of(&doc.spec, &doc.spec_file, doc.format, &at, &what, specs, &mut files)?;
            let submitted = within_max(at("at"), doc.at.0)?;
            operations.push(Submission { name: doc.name.clone(), at: submitted, spec, format });
        }
        if !operations.is_empty() && agents == 0 {
            return Err((key(&["topology", "agents"]), "operations need at least one agent (agents = 0)".into()));
        }
        let mut controls = Vec::new();
        for (index, doc) in self.controls.iter().enumerate() {
            controls.push(control(doc, index, &operations, specs, &mut files)?);
        }
        let jobs = job_script(self.jobs.unwrap_or_default(), &task_names(&operations, &controls))?;
        let gang = GangWorkload {
            agents,
            slots,
            agent: agent_tunables(self.agent.unwrap_or_default())?,
            controller: controller_tunables(self.controller.unwrap_or_default())?,
            operations,
            jobs,
            controls,
        };
        Ok((gang, files))
    }
}

/// A spec's text and format from `spec` or `spec_file` (exactly one), checked: a spec that fails validation names
/// `what` (the operation or control) and the spec's field.
fn spec_of(
    inline: &Option<String>,
    file: &Option<String>,
    format: Option<FormatDoc>,
    at: &dyn Fn(&str) -> KeyPath,
    what: &str,
    specs: SpecSource<'_>,
    files: &mut BTreeMap<String, String>,
) -> Result<(String, SpecFormat), Broken> {
    let (text, format, field) = match (inline, file) {
        (Some(_), Some(_)) => return Err((at("spec_file"), "give `spec` or `spec_file`, not both".into())),
        (None, None) => return Err((at("spec"), "needs `spec` (the text) or `spec_file` (a path)".into())),
        (Some(text), None) => (text.clone(), format.map_or(SpecFormat::Yson, |f| f.0), "spec"),
        (None, Some(path)) => {
            let format = match format {
                Some(format) => format.0,
                None => format_of(path).map_err(|rule| (at("spec_file"), rule))?,
            };
            let text = specs.read(path).map_err(|rule| (at("spec_file"), rule))?;
            files.insert(path.clone(), text.clone());
            (text, format, "spec_file")
        }
    };
    let spec = match OperationSpec::parse(&text, format) {
        Ok(spec) => spec,
        Err(error) => {
            let rule = error.to_string().replace('\n', "; ");
            return Err((at(field), format!("{what}: its {format} spec is invalid: {rule}")));
        }
    };
    // `lockstep submit` keeps (and warns about) keys it does not know; a simulation is strict: a misspelt key
    // would silently simulate another operation (`gang_option` for `gang_options` runs a plain one).
    if let Some(path) = spec.unknown_keys().first() {
        let hint = crate::gang::spec::did_you_mean(path).map_or(String::new(), |key| format!(" (did you mean {key}?)"));
        return Err((
            at(field),
            format!(
                "{what}: its spec has key {path}, which lockstep does not know{hint}; a scenario refuses unknown keys"
            ),
        ));
    }
    Ok((text, format))
}

/// A spec file's format from its extension.
fn format_of(path: &str) -> Result<SpecFormat, String> {
    match Path::new(path).extension().and_then(|ext| ext.to_str()) {
        Some("yson") => Ok(SpecFormat::Yson),
        Some("json") => Ok(SpecFormat::Json),
        Some("yaml" | "yml") => Ok(SpecFormat::Yaml),
        _ => Err(format!(
            "{path:?}: cannot tell the spec's format from its extension (.yson, .json, .yaml, .yml): add `format`"
        )),
    }
}

fn control(
    doc: &ControlDoc,
    index: usize,
    operations: &[Submission],
    specs: SpecSource<'_>,
    files: &mut BTreeMap<String, String>,
) -> Result<Control, Broken> {
    let at = |field: &str| item(&["controls"], index, field);
    let Some(submission) = operations.iter().find(|s| s.name == doc.operation) else {
        let names: Vec<&str> = operations.iter().map(|s| s.name.as_str()).collect();
        return Err((at("operation"), format!("no operation named {:?} (operations: {names:?})", doc.operation)));
    };
    within_max(at("at"), doc.at.0)?;
    if doc.at.0 < submission.at {
        return Err((
            at("at"),
            format!(
                "{} is before operation {:?} is submitted ({})",
                crate::duration::format(doc.at.0),
                doc.operation,
                crate::duration::format(submission.at)
            ),
        ));
    }
    let action = match doc.action.as_str() {
        "abort" => {
            if let Some(field) = [("spec", doc.spec.is_some()), ("spec_file", doc.spec_file.is_some())]
                .into_iter()
                .chain([("format", doc.format.is_some())])
                .find_map(|(field, set)| set.then_some(field))
            {
                return Err((at(field), format!("an abort takes no `{field}` (its fields: reason)")));
            }
            ControlAction::Abort { reason: doc.reason.clone().unwrap_or_else(|| "aborted by the scenario".into()) }
        }
        "update-spec" => {
            if doc.reason.is_some() {
                return Err((
                    at("reason"),
                    "an update-spec takes no `reason` (its fields: spec or spec_file, format)".into(),
                ));
            }
            let what = format!("the update of operation {:?}", doc.operation);
            let (spec, format) = spec_of(&doc.spec, &doc.spec_file, doc.format, &at, &what, specs, files)?;
            ControlAction::UpdateSpec { spec, format }
        }
        other => return Err((at("action"), format!("unknown action {other:?}: expected abort or update-spec"))),
    };
    Ok(Control { at: doc.at.0, operation: doc.operation.clone(), action })
}

fn agent_tunables(doc: AgentDoc) -> Result<AgentTunables, Broken> {
    let mut tunables = AgentTunables::default();
    let at = |field: &str| key(&["agent", field]);
    if let Some(ttl) = doc.lease_ttl {
        tunables.lease_ttl = positive(at("lease_ttl"), ttl.0)?;
        // The agent's own default trigger is half its ttl; keep that relation when only the ttl is given.
        tunables.heartbeat_trigger = tunables.lease_ttl / 2;
    }
    if let Some(margin) = doc.lease_margin {
        tunables.lease_margin = margin.0;
    }
    if let Some(trigger) = doc.heartbeat_trigger {
        tunables.heartbeat_trigger = trigger.0;
    }
    if let Some(interval) = doc.poll_interval {
        tunables.poll_interval = positive(at("poll_interval"), interval.0)?;
    }
    let t = &tunables;
    if t.lease_margin >= t.lease_ttl {
        return Err((at("lease_margin"), format!("{:?} must be below lease_ttl {:?}", t.lease_margin, t.lease_ttl)));
    }
    if t.heartbeat_trigger >= t.lease_ttl - t.lease_margin {
        return Err((
            at("heartbeat_trigger"),
            format!(
                "{:?} must be below lease_ttl - lease_margin ({:?}): the agent would extend its lease too late",
                t.heartbeat_trigger,
                t.lease_ttl - t.lease_margin
            ),
        ));
    }
    Ok(tunables)
}

fn controller_tunables(doc: ControllerDoc) -> Result<ControllerTunables, Broken> {
    let mut tunables = ControllerTunables {
        lease_ttl: CONTROLLER_LEASE_TTL_DEFAULT,
        min_processing_interval: CONTROLLER_MIN_PROCESSING_INTERVAL_DEFAULT,
        ..ControllerTunables::default()
    };
    let at = |field: &str| key(&["controller", field]);
    if let Some(workers) = doc.workers {
        if workers == 0 {
            return Err((at("workers"), "0 must be at least 1".into()));
        }
        tunables.workers = workers;
    }
    if let Some(ttl) = doc.lease_ttl {
        tunables.lease_ttl = positive(at("lease_ttl"), ttl.0)?;
    }
    if let Some(margin) = doc.lease_margin {
        tunables.lease_margin = margin.0;
    }
    if let Some(interval) = doc.min_processing_interval {
        tunables.min_processing_interval = interval.0;
    }
    if let Some(placement) = &doc.gang_placement {
        tunables.gang_placement = GangPlacement::parse(placement).map_err(|rule| (at("gang_placement"), rule))?;
    }
    if let Some(timeout) = doc.gang_unfit_timeout {
        tunables.gang_unfit_timeout = within_max(at("gang_unfit_timeout"), timeout.0)?;
    }
    if let Some(grace) = doc.node_return_grace {
        tunables.node_return_grace = Some(within_max(at("node_return_grace"), grace.0)?);
    }
    // The engine's own check of the operation pipeline's config, at the key it most likely comes from.
    let probe = GangWorkload {
        agents: 0,
        slots: 1,
        agent: AgentTunables::default(),
        controller: tunables.clone(),
        operations: Vec::new(),
        jobs: JobScript::uniform(Duration::ZERO),
        controls: Vec::new(),
    };
    if let Err(error) = probe.pipeline_config().validate() {
        let field = if error.to_string().contains("workers") { "workers" } else { "lease_ttl" };
        return Err((
            at(field),
            format!(
                "the engine refuses the operation pipeline: {error} (lease_ttl {:?}, lease_margin {:?})",
                tunables.lease_ttl, tunables.lease_margin
            ),
        ));
    }
    Ok(tunables)
}

/// Every task name of the operations' specs and of the specs their controls update to (each spec was checked at
/// its key already).
fn task_names(operations: &[Submission], controls: &[Control]) -> BTreeSet<String> {
    let updates = controls.iter().filter_map(|control| match &control.action {
        ControlAction::UpdateSpec { spec, format } => Some((spec, *format)),
        _ => None,
    });
    let specs = operations.iter().map(|operation| (&operation.spec, operation.format)).chain(updates);
    specs
        .filter_map(|(text, format)| OperationSpec::parse(text, format).ok())
        .flat_map(|spec| spec.tasks.into_keys())
        .collect()
}

fn job_script(doc: JobsDoc, tasks: &BTreeSet<String>) -> Result<JobScript, Broken> {
    let duration = match &doc.duration {
        Some(range) => {
            let range = ordered(key(&["jobs", "duration"]), range)?;
            (range.start, range.end)
        }
        None => JOB_DURATION_DEFAULT,
    };
    let default = Behaviour { duration, end: End::Exit(doc.exit_code.unwrap_or(0)) };
    let mut rules = Vec::new();
    for (index, rule) in doc.rule.iter().enumerate() {
        let at = |field: &str| item(&["jobs", "rule"], index, field);
        let duration = match &rule.duration {
            Some(range) => {
                let range = ordered(at("duration"), range)?;
                (range.start, range.end)
            }
            None => default.duration,
        };
        let ends = [
            ("exit_code", rule.exit_code.is_some()),
            ("hang", rule.hang.is_some()),
            ("start_failure", rule.start_failure.is_some()),
        ];
        let given: Vec<&str> = ends.iter().filter(|(_, set)| *set).map(|(field, _)| *field).collect();
        if given.len() > 1 {
            return Err((
                at(given[1]),
                format!("a rule ends one way: give one of exit_code, hang, start_failure, not {}", given.join(" and ")),
            ));
        }
        let end = match (rule.exit_code, rule.hang, &rule.start_failure) {
            (Some(code), _, _) => End::Exit(code),
            (_, Some(true), _) => End::Hang,
            (_, Some(false), _) => return Err((at("hang"), "false means nothing: leave `hang` out".into())),
            (_, _, Some(message)) => End::StartFailure(message.clone()),
            (None, None, None) => default.end.clone(),
        };
        if let Some(task) = &rule.task
            && task.is_empty()
        {
            return Err((at("task"), "must not be empty (leave it out to match every task)".into()));
        }
        if let Some(task) = &rule.task
            && !tasks.contains(task)
        {
            let known = tasks.iter().map(|task| format!("{task:?}")).collect::<Vec<_>>().join(", ");
            return Err((
                at("task"),
                format!("no operation has a task {task:?} (its tasks: {known}): the rule would never match"),
            ));
        }
        rules.push(Rule {
            task: rule.task.clone(),
            job_cookie: rule.cookie,
            attempt: rule.attempt,
            behaviour: Behaviour { duration, end },
        });
    }
    Ok(JobScript { seed: 0, default, rules })
}

/// `[[expect.operation]]` and `[[expect.trace]]` into `expect`, checked against the gang part (`None`: none) and
/// the topology (`replicas`, agents from `gang`).
pub(super) fn expectations(
    operations: &[ExpectOperationDoc],
    trace: &[ExpectTraceDoc],
    gang: Option<&GangWorkload>,
    replicas: usize,
) -> Result<Expectations, Broken> {
    let mut expect = Expectations::default();
    for (index, doc) in operations.iter().enumerate() {
        let at = |field: &str| item(&["expect", "operation"], index, field);
        let known = gang.is_some_and(|g| g.operations.iter().any(|s| s.name == doc.name));
        if !known {
            let names: Vec<&str> = gang.map_or(Vec::new(), |g| g.operations.iter().map(|s| s.name.as_str()).collect());
            return Err((at("name"), format!("no operation named {:?} (operations: {names:?})", doc.name)));
        }
        let state = match &doc.state {
            None => None,
            Some(state) => Some(OperationStatus::parse(state).filter(|s| s.is_terminal()).ok_or_else(|| {
                (at("state"), format!("unknown final state {state:?}: expected completed, failed or aborted"))
            })?),
        };
        let (min, max) = doc.incarnations.as_ref().map_or((None, None), |i| (i.min, i.max));
        if let (Some(min), Some(max)) = (min, max)
            && min > max
        {
            return Err((at("incarnations"), format!("min {min} is above max {max}")));
        }
        if min == Some(0) || max == Some(0) {
            return Err((
                at("incarnations"),
                "an operation that starts has at least 1 incarnation: 0 never holds".into(),
            ));
        }
        expect.operations.push(OperationExpectation {
            operation: doc.name.clone(),
            state,
            incarnations_min: min,
            incarnations_max: max,
            completed_within: doc.completes_within.map(|d| d.0),
        });
    }
    let agents = gang.map_or(0, |g| g.agents);
    for (index, doc) in trace.iter().enumerate() {
        let at = |field: &str| item(&["expect", "trace"], index, field);
        if crate::sim::trace::KINDS.binary_search(&doc.kind.as_str()).is_err() {
            // A kind no line has would make an `at_most` expectation pass whatever the run does.
            let hint = crate::gang::spec::closest(&doc.kind, crate::sim::trace::KINDS)
                .map_or(String::new(), |kind| format!("did you mean {kind:?}? "));
            return Err((
                at("kind"),
                format!(
                    "{:?} is not a kind of trace line; {hint}the kinds are: {}",
                    doc.kind,
                    crate::sim::trace::KINDS.join(", ")
                ),
            ));
        }
        if let Some(node) = &doc.node {
            check_node(node, replicas, agents).map_err(|rule| (at("node"), rule))?;
        }
        let at_least = doc.at_least.unwrap_or(if doc.at_most.is_some() { 0 } else { 1 });
        if let Some(max) = doc.at_most
            && at_least > max
        {
            return Err((at("at_most"), format!("{max} is below at_least {at_least}")));
        }
        if doc.contains.0.iter().any(String::is_empty) {
            return Err((at("contains"), "an empty text matches every line: leave it out".into()));
        }
        if let Some(field) = doc.fields.keys().find(|field| field.is_empty() || field.contains(['=', ' '])) {
            let mut path = at("fields");
            path.push(Seg::Key(field.clone()));
            return Err((path, "a field name is one word without `=`".into()));
        }
        expect.trace.push(TraceExpectation {
            kind: doc.kind.clone(),
            node: doc.node.clone(),
            fields: doc.fields.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            contains: doc.contains.0.clone(),
            at_least,
            at_most: doc.at_most,
        });
    }
    Ok(expect)
}

/// A trace node: `db`, `client`, `world`, `replica-N`, `agent-N` of the topology, or a prefix ending in `*`.
fn check_node(node: &str, replicas: usize, agents: usize) -> Result<(), String> {
    if matches!(node, "db" | "client" | "world") {
        return Ok(());
    }
    if let Some(prefix) = node.strip_suffix('*') {
        // A prefix must name some node, or an `at_most` expectation on it could never fail (a new user's trial).
        let nodes = ["db", "client", "world", "replica-", "agent-", "svc-"];
        return match nodes.iter().any(|name| name.starts_with(prefix) || prefix.starts_with(name)) {
            true => Ok(()),
            false => Err(format!(
                "{node:?} matches no node: a prefix of \"db\", \"client\", \"world\", \"replica-N\", \"agent-N\" or \
                 \"svc-NAME\" (a service's node), ending in '*'"
            )),
        };
    }
    let numbered = |prefix: &str| node.strip_prefix(prefix).and_then(|index| index.parse::<usize>().ok());
    match (numbered("replica-"), numbered("agent-")) {
        (Some(index), _) if index < replicas => Ok(()),
        (Some(index), _) => Err(format!("replica {index} does not exist: topology.replicas is {replicas}")),
        (_, Some(index)) if index < agents => Ok(()),
        (_, Some(index)) => Err(format!("{} does not exist: topology.agents is {agents}", agent_name(index))),
        _ => Err(format!(
            "{node:?} is not a node: expected \"db\", \"client\", \"world\", \"replica-N\", \"agent-N\" or a prefix \
             ending in '*'"
        )),
    }
}
