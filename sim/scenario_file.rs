//! Scenario files (DESIGN §5): a [`Scenario`] written in TOML, as `lockstep sim run` reads it from
//! `scenarios/*.toml`. docs/scenarios.md documents every key.
//!
//! Every table denies unknown keys, every value is checked, and every error is a [`ScenarioError`] that names
//! the file, the line and column, the key (`faults.at[1].replica`) and the rule it breaks. Keys left out take
//! the defaults of [`Scenario::mixed`] without its faults (3 replicas, the sweeps' workload of
//! [`small_workload`], 6 s leases). Durations are strings with a unit: `"500ms"`, `"90s"`, `"2m"`, `"1m30s"`.
//!
//! The gang part (`[topology] agents, slots`, `[agent]`, `[controller]`, `[[operations]]`, `[jobs]`,
//! `[[controls]]`, `[[expect.operation]]`, `[[expect.trace]]`) is in [`gang`]. A file with a gang part and no
//! `[workload]` table runs no row workload ([`no_rows`]).
//!
//! [`small_workload`]: super::scenario::small_workload
//! [`no_rows`]: super::scenario::no_rows

pub mod gang;

use super::faults::Target;
use super::faults::{AgentCall, CallEffect, Fault, FaultEvent, FaultKind, FaultPlan, RandomFault};
use super::scenario::{Mutation, Scenario, no_rows};
use super::user::PipelineSet;
use super::workload::JOB_STATUS;
use crate::hash::fnv1a64;
use crate::pipeline::ConfigError;
use gang::{ExpectOperationDoc, ExpectTraceDoc, GangDocs, SpecSource};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Most replicas a scenario may have: the world gives them the addresses 10.0.1.1 to 10.0.1.200.
pub const REPLICAS_MAX: usize = 200;
/// Longest scenario name: it becomes part of file names (replay files, traces).
pub const NAME_LEN_MAX: usize = 64;

/// A scenario file, parsed and checked: the [`Scenario`] it describes and what a run needs to cite it.
#[derive(Clone, Debug)]
pub struct ScenarioFile {
    /// The scenario, every key the file left out filled with its default.
    pub scenario: Scenario,
    /// The file's `version` key: its author bumps it when the scenario's meaning changes.
    pub version: u64,
    /// The file's default seeds (`seeds`; `[1]` when left out).
    pub seeds: Vec<u64>,
    /// The file's text, as read.
    pub text: String,
    /// The spec files its operations and controls read (`spec_file`), by the path the file writes, with their
    /// text as read when the file was parsed (a replay file carries them).
    pub spec_files: BTreeMap<String, String>,
    /// Where the text came from (a path, or a label such as `<replay file>`), in error messages.
    pub origin: String,
}

impl ScenarioFile {
    /// Reads and checks the scenario file at `path`; its `spec_file`s are read relative to its directory.
    ///
    /// # Errors
    /// [`ScenarioError::Read`] if the file cannot be read; else as [`ScenarioFile::parse`].
    pub fn load(path: &Path) -> Result<ScenarioFile, ScenarioError> {
        ScenarioFile::load_in(path, &PipelineSets::new())
    }

    /// As [`ScenarioFile::load`], resolving a `pipelines = "NAME"` key among `sets` (a user's binary registers
    /// its pipeline sets: `cli::Registry`, simulator build).
    ///
    /// # Errors
    /// As [`ScenarioFile::load`], and [`ScenarioError::Invalid`] at `pipelines` for a name not in `sets`.
    pub fn load_in(path: &Path, sets: &PipelineSets) -> Result<ScenarioFile, ScenarioError> {
        let origin = path.display().to_string();
        let text = crate::files::read_text(path, "scenario file", super::files::SCENARIO_FILE_BYTES_MAX)
            .map_err(|message| ScenarioError::Read { origin: origin.clone(), message })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        ScenarioFile::parse_in(&text, &origin, SpecSource::Dir(dir), sets)
    }

    /// Parses and checks a scenario file's `text`; `origin` names it in errors; `spec_file`s are read relative
    /// to the current directory.
    ///
    /// # Errors
    /// [`ScenarioError::Invalid`] for a TOML syntax error, an unknown key, a value of the wrong type or shape,
    /// or a value that breaks a rule (a replica or agent index out of range, a negative rate, an empty range, a
    /// fixed fault at or past the end of the fault window, a fault longer than the window, a span past
    /// [`SIMULATED_SPAN_MAX`], a pipeline config the engine refuses, a spec file that cannot be read, a spec that
    /// fails validation or has a key lockstep does not know, …).
    pub fn parse(text: &str, origin: &str) -> Result<ScenarioFile, ScenarioError> {
        ScenarioFile::parse_with(text, origin, SpecSource::Dir(Path::new("")))
    }

    /// As [`ScenarioFile::parse`], reading `spec_file`s from `specs`.
    ///
    /// # Errors
    /// As [`ScenarioFile::parse`].
    pub fn parse_with(text: &str, origin: &str, specs: SpecSource<'_>) -> Result<ScenarioFile, ScenarioError> {
        ScenarioFile::parse_in(text, origin, specs, &PipelineSets::new())
    }

    /// As [`ScenarioFile::parse_with`], resolving a `pipelines = "NAME"` key among `sets`.
    ///
    /// # Errors
    /// As [`ScenarioFile::parse`], and [`ScenarioError::Invalid`] at `pipelines` for a name not in `sets`.
    pub fn parse_in(
        text: &str,
        origin: &str,
        specs: SpecSource<'_>,
        sets: &PipelineSets,
    ) -> Result<ScenarioFile, ScenarioError> {
        let located = Located { text, origin };
        let tree = DeTable::parse(text).map_err(|error| located.toml_error(&error, None))?;
        let tree = tree.get_ref();
        let doc: FileDoc = toml::from_str(text).map_err(|error| located.toml_error(&error, Some(tree)))?;
        let file =
            doc.into_file(text, origin, specs, sets).map_err(|(path, rule)| located.at_path(tree, &path, rule))?;
        Ok(file)
    }

    /// A hash of the scenario's normalized content (every value after defaults, not the text's comments or
    /// layout) and its `version`: two files with the same hash describe the same runs.
    pub fn content_hash(&self) -> u64 {
        fnv1a64(format!("version={}\n{:?}", self.version, self.scenario).as_bytes())
    }

    /// The scenario version a replay file records: `v{version}-{content hash, 16 hex digits}`.
    pub fn version_label(&self) -> String {
        format!("v{}-{:016x}", self.version, self.content_hash())
    }
}

/// A scenario file that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{origin}: cannot read the scenario file: {message}")]
    Read {
        /// The path.
        origin: String,
        /// The operating system's error.
        message: String,
    },
    /// The text is not a valid scenario.
    #[error("{origin}:{line}:{column}: {}{rule}\n{line:>5} | {source_line}", if key.is_empty() { String::new() } else { format!("{key}: ") })]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// The key's full path, `faults.at[1].replica` (empty for a syntax error outside any key).
        key: String,
        /// The rule it breaks.
        rule: String,
        /// The text of that line.
        source_line: String,
    },
}

/// One step of a key path: a table key or an array index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A key path, `faults.at[1].replica`.
type KeyPath = Vec<Seg>;

fn render_path(path: &[Seg]) -> String {
    let mut text = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) if text.is_empty() => text.push_str(key),
            Seg::Key(key) => {
                text.push('.');
                text.push_str(key);
            }
            Seg::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    text
}

/// The text being parsed, for turning spans and key paths into [`ScenarioError::Invalid`].
struct Located<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Located<'_> {
    fn toml_error(&self, error: &toml::de::Error, tree: Option<&DeTable<'_>>) -> ScenarioError {
        let offset = error.span().map_or(0, |span| span.start);
        let message = error.message().trim().replace('\n', "; ");
        let path = tree.and_then(|tree| path_at(tree, offset).map(|path| (tree, path)));
        // serde points a missing field at its table (the first key found there): name the field instead.
        let missing = message.strip_prefix("missing field `").and_then(|rest| rest.split_once('`')).map(|(f, _)| f);
        // A field missing from the top level comes with an empty span at the start of the text (a nested table's
        // comes with its header's span): it is a top-level key, whatever table the text begins with.
        let top_level = error.span().is_some_and(|span| span.is_empty() && span.start == 0);
        let key = match (path, missing) {
            (_, Some(field)) if top_level => field.to_string(),
            (Some((tree, path)), Some(field)) => render_path(&missing_at(tree, &path, field)),
            (None, Some(field)) => field.to_string(),
            (Some((_, path)), None) => render_path(&path),
            (None, None) => String::new(),
        };
        // The syntax check's `duplicate key` points at the key: say which.
        let message = match (message.as_str(), error.span()) {
            ("duplicate key", Some(span)) => match self.text.get(span).map(str::trim) {
                Some(name) if !name.is_empty() => format!("duplicate key `{name}`: each key may be set once"),
                _ => message,
            },
            _ => message,
        };
        self.invalid(offset, key, message)
    }

    fn at_path(&self, tree: &DeTable<'_>, path: &[Seg], rule: String) -> ScenarioError {
        self.invalid(span_of(tree, path), render_path(path), rule)
    }

    fn invalid(&self, offset: usize, key: String, rule: String) -> ScenarioError {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |at| at + 1);
        let column = before[line_start..].chars().count() + 1;
        let source_line = self.text[line_start..].lines().next().unwrap_or("").to_string();
        ScenarioError::Invalid { origin: self.origin.to_string(), line, column, key, rule, source_line }
    }
}

/// The path of the key or value whose span holds `offset`, searching leaves (keys and scalar values, whose
/// spans are exact) depth first.
fn path_at(table: &DeTable<'_>, offset: usize) -> Option<KeyPath> {
    for (key, value) in table.iter() {
        let here = vec![Seg::Key(key.get_ref().to_string())];
        if key.span().contains(&offset) {
            return Some(here);
        }
        if let Some(mut rest) = value_path_at(value, offset) {
            let mut path = here;
            path.append(&mut rest);
            return Some(path);
        }
    }
    None
}

fn value_path_at(value: &Spanned<DeValue<'_>>, offset: usize) -> Option<KeyPath> {
    let inner = match value.get_ref() {
        DeValue::Table(table) => path_at(table, offset),
        DeValue::Array(array) => array.iter().enumerate().find_map(|(index, element)| {
            let mut rest = value_path_at(element, offset)?;
            rest.insert(0, Seg::Index(index));
            Some(rest)
        }),
        _ => None,
    };
    // An error about a whole array or inline table (its length, say) points at its start: the value itself.
    inner.or_else(|| value.span().contains(&offset).then(Vec::new))
}

/// The path of the field `field` that serde found missing, given the path serde pointed at (a key of the table
/// lacking it): the deepest table along `path` that lacks `field`, then `field`.
fn missing_at(tree: &DeTable<'_>, path: &[Seg], field: &str) -> KeyPath {
    let mut best: KeyPath = Vec::new();
    let mut table = Some(tree);
    let mut current: Option<&Spanned<DeValue<'_>>> = None;
    for (depth, seg) in path.iter().enumerate() {
        if table.is_some_and(|table| table.get(field).is_none()) {
            best = path[..depth].to_vec();
        }
        let next = match (seg, current.map(|value| value.get_ref())) {
            (Seg::Key(key), None) => tree.get(key.as_str()),
            (Seg::Key(key), Some(DeValue::Table(inner))) => inner.get(key.as_str()),
            (Seg::Index(index), Some(DeValue::Array(array))) => array.get(*index),
            _ => None,
        };
        let Some(next) = next else { break };
        table = match next.get_ref() {
            DeValue::Table(inner) => Some(inner),
            _ => None,
        };
        current = Some(next);
    }
    // The path may end at the table itself (an array-of-tables element pointed at by its header).
    if table.is_some_and(|table| table.get(field).is_none()) && path.len() > best.len() && current.is_some() {
        best = path.to_vec();
    }
    best.push(Seg::Key(field.to_string()));
    best
}

/// Where `path` is in the text: its value's start, or for a key the file left out, its table's first key.
fn span_of(table: &DeTable<'_>, path: &[Seg]) -> usize {
    let mut anchor = table_anchor(table, 0);
    let mut current: Option<&Spanned<DeValue<'_>>> = None;
    for seg in path {
        let next = match (seg, current.map(|value| value.get_ref())) {
            (Seg::Key(key), None) => table.get(key.as_str()),
            (Seg::Key(key), Some(DeValue::Table(inner))) => inner.get(key.as_str()),
            (Seg::Index(index), Some(DeValue::Array(array))) => array.get(*index),
            _ => None,
        };
        match next {
            Some(value) => {
                anchor = match value.get_ref() {
                    DeValue::Table(inner) => table_anchor(inner, value.span().start),
                    _ => value.span().start,
                };
                current = Some(value);
            }
            None => break,
        }
    }
    anchor
}

/// A table's first key (a table written under a header has no span of its own worth showing).
fn table_anchor(table: &DeTable<'_>, fallback: usize) -> usize {
    table.iter().map(|(key, _)| key.span().start).min().unwrap_or(fallback)
}

/// A failed rule: the key's path and the rule.
type Broken = (KeyPath, String);

/// Pipeline sets by name, as a binary registers them (`pipelines = "NAME"` in a scenario file names one).
pub type PipelineSets = BTreeMap<String, PipelineSet>;

/// The rule a `pipelines` name not among `sets` breaks, naming the ones there are.
fn unknown_set(name: &str, sets: &PipelineSets) -> String {
    if sets.is_empty() {
        return format!(
            "no pipeline set {name:?} in this binary: it registers none (a project's own binary registers its sets \
             with lockstep::sim::cli::Registry)"
        );
    }
    let known: Vec<&str> = sets.keys().map(String::as_str).collect();
    format!("no pipeline set {name:?} in this binary (it registers {})", known.join(", "))
}

fn key(parts: &[&str]) -> KeyPath {
    parts.iter().map(|part| Seg::Key(part.to_string())).collect()
}

fn item(section: &[&str], index: usize, field: &str) -> KeyPath {
    let mut path = key(section);
    path.push(Seg::Index(index));
    path.push(Seg::Key(field.to_string()));
    path
}

// ---- the file's shape (serde) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    name: String,
    version: u64,
    seeds: Option<Vec<u64>>,
    pipelines: Option<String>,
    #[serde(default)]
    topology: TopologyDoc,
    #[serde(default)]
    network: NetworkDoc,
    pipeline: Option<PipelineDoc>,
    workload: Option<WorkloadDoc>,
    #[serde(default)]
    faults: FaultsDoc,
    #[serde(default)]
    expect: ExpectDoc,
    #[serde(default)]
    mutation: MutationDoc,
    agent: Option<gang::AgentDoc>,
    controller: Option<gang::ControllerDoc>,
    #[serde(default)]
    operations: Vec<gang::OperationDoc>,
    jobs: Option<gang::JobsDoc>,
    #[serde(default)]
    controls: Vec<gang::ControlDoc>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyDoc {
    replicas: Option<usize>,
    agents: Option<usize>,
    slots: Option<u32>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkDoc {
    latency: Option<DurationRange>,
    call_timeout: Option<Dur>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineDoc {
    lease_ttl: Option<Dur>,
    lease_margin: Option<Dur>,
    min_processing_interval: Option<Dur>,
    fetchers: Option<usize>,
    handler_timeout: Option<Dur>,
    #[serde(default)]
    workers: WorkersDoc,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkersDoc {
    tasks: Option<usize>,
    jobs: Option<usize>,
    claims: Option<usize>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadDoc {
    span: Option<Dur>,
    jobs_per_minute: Option<f64>,
    tasks_per_job: Option<[u64; 2]>,
    claims_per_minute: Option<f64>,
    claim_pipelines: Option<usize>,
    resources: Option<usize>,
    hot_share: Option<f64>,
    claim_resources: Option<usize>,
    rows_max: Option<usize>,
    task_process: Option<DurationRange>,
    task_slow_chance: Option<f64>,
    task_slow: Option<DurationRange>,
    task_failure_chance: Option<f64>,
    task_fail_first_share: Option<f64>,
    claim_fail_first_share: Option<f64>,
    task_fail_first_attempts: Option<u32>,
    task_fail_always_share: Option<f64>,
    attempts_max: Option<u32>,
    job_process: Option<DurationRange>,
    claim_process: Option<DurationRange>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultsDoc {
    until: Option<Dur>,
    pause_inside_pass: Option<Dur>,
    #[serde(default)]
    at: Vec<FixedDoc>,
    #[serde(default)]
    random: Vec<RandomDoc>,
}

/// One `[[faults.at]]`: every field a kind may take; [`FixedDoc::fault`] checks which ones this kind takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixedDoc {
    at: Dur,
    kind: KindDoc,
    replica: Option<usize>,
    agent: Option<usize>,
    down: Option<Dur>,
    span: Option<Dur>,
    a: Option<String>,
    b: Option<String>,
    node: Option<String>,
    latency: Option<DurationRange>,
    loss: Option<f64>,
    chance: Option<f64>,
    rate_ppm: Option<u64>,
    claims: Option<usize>,
    calls: Option<String>,
    delay: Option<Dur>,
    by: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RandomDoc {
    kind: KindDoc,
    per_minute: f64,
    span: Option<DurationRange>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectDoc {
    liveness_within: Option<Dur>,
    starvation_within: Option<Dur>,
    drain_within: Option<Dur>,
    #[serde(default)]
    operation: Vec<ExpectOperationDoc>,
    #[serde(default)]
    trace: Vec<ExpectTraceDoc>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MutationDoc {
    apply_guard_disabled: Option<bool>,
    gang_gate_disabled: Option<bool>,
    lingering_gate_disabled: Option<bool>,
    agent_drift_beyond_margin: Option<bool>,
    related_age_rule_disabled: Option<bool>,
    waitlist_disabled: Option<bool>,
    retry_wake_disabled: Option<bool>,
    contention_backoff_disabled: Option<bool>,
    park_wake_disabled: Option<bool>,
}

// ---- values ----

/// A duration written as a string with units.
#[derive(Clone, Copy, Debug)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Dur, D::Error> {
        struct DurVisitor;
        impl Visitor<'_> for DurVisitor {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"500ms\", \"90s\" or \"2m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Dur, E> {
                parse_duration(text).map(Dur).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(DurVisitor)
    }
}

/// A range of durations: `["1s", "10s"]` (uniform in it) or one string (exactly that).
#[derive(Clone, Debug)]
struct DurationRange(Range<Duration>);

impl<'de> Deserialize<'de> for DurationRange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<DurationRange, D::Error> {
        struct RangeVisitor;
        impl<'de> Visitor<'de> for RangeVisitor {
            type Value = DurationRange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration range [\"from\", \"to\"] such as [\"1s\", \"10s\"], or one duration")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<DurationRange, E> {
                let at = parse_duration(text).map_err(E::custom)?;
                Ok(DurationRange(at..at))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DurationRange, A::Error> {
                let from: Dur = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let to: Dur = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<Dur>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(DurationRange(from.0..to.0))
            }
        }
        deserializer.deserialize_any(RangeVisitor)
    }
}

/// A fault kind, by its trace name (`kill`, `lost-replies`, …).
#[derive(Clone, Copy, Debug)]
struct KindDoc(FaultKind);

impl<'de> Deserialize<'de> for KindDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<KindDoc, D::Error> {
        let name = String::deserialize(deserializer)?;
        FaultKind::from_name(&name).map(KindDoc).ok_or_else(|| {
            let names: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.name()).collect();
            de::Error::custom(format!("unknown fault kind \"{name}\": expected one of {}", names.join(", ")))
        })
    }
}

/// Parses a duration in the files' form: [`crate::duration::parse`] (also the real-mode command line's).
pub use crate::duration::parse as parse_duration;

// ---- from the file's shape to a Scenario ----

impl FileDoc {
    fn into_file(
        mut self,
        text: &str,
        origin: &str,
        specs: SpecSource<'_>,
        sets: &PipelineSets,
    ) -> Result<ScenarioFile, Broken> {
        let mut scenario = Scenario::mixed();
        scenario.faults = FaultPlan::default();
        check_name(&self.name)?;
        scenario.name = self.name;
        if self.version == 0 {
            return Err((key(&["version"]), "0 must be at least 1".into()));
        }
        let seeds = self.seeds.unwrap_or_else(|| vec![1]);
        if seeds.is_empty() {
            return Err((key(&["seeds"]), "must list at least one seed (or be left out for [1])".into()));
        }
        if let Some(replicas) = self.topology.replicas {
            if !(1..=REPLICAS_MAX).contains(&replicas) {
                return Err((key(&["topology", "replicas"]), format!("{replicas} must be in 1..={REPLICAS_MAX}")));
            }
            scenario.replicas = replicas;
        }
        let gang_docs = GangDocs {
            agents: self.topology.agents,
            slots: self.topology.slots,
            agent: self.agent,
            controller: self.controller,
            operations: self.operations,
            jobs: self.jobs,
            controls: self.controls,
        };
        let mut spec_files = BTreeMap::new();
        if gang_docs.present() {
            let (gang, files) = gang_docs.workload(specs)?;
            scenario.gang = Some(gang);
            spec_files = files;
            if self.workload.is_none() {
                scenario.workload = no_rows();
            }
        }
        if let Some(name) = &self.pipelines {
            let set = sets.get(name).ok_or_else(|| (key(&["pipelines"]), unknown_set(name, sets)))?;
            if self.workload.is_some() {
                let rule = format!("the pipeline set {name} brings its own workload: remove [workload]");
                return Err((key(&["workload"]), rule));
            }
            if self.pipeline.is_some() {
                let rule = format!("the pipeline set {name} configures its own pipelines: remove [pipeline]");
                return Err((key(&["pipeline"]), rule));
            }
            scenario.workload = no_rows();
            scenario.pipelines = Some(set.clone());
        }
        self.network.apply(&mut scenario)?;
        self.pipeline.unwrap_or_default().apply(&mut scenario)?;
        if let Some(workload) = self.workload {
            workload.apply(&mut scenario)?;
        }
        check_pipelines(&scenario)?;
        let (operations, trace) = (std::mem::take(&mut self.expect.operation), std::mem::take(&mut self.expect.trace));
        self.expect.apply(&mut scenario)?;
        scenario.expect = gang::expectations(&operations, &trace, scenario.gang.as_ref(), scenario.replicas)?;
        scenario.mutation = Mutation {
            apply_guard_disabled: self.mutation.apply_guard_disabled.unwrap_or(false),
            gang_gate_disabled: self.mutation.gang_gate_disabled.unwrap_or(false),
            lingering_gate_disabled: self.mutation.lingering_gate_disabled.unwrap_or(false),
            agent_drift_beyond_margin: self.mutation.agent_drift_beyond_margin.unwrap_or(false),
            related_age_rule_disabled: self.mutation.related_age_rule_disabled.unwrap_or(false),
            waitlist_disabled: self.mutation.waitlist_disabled.unwrap_or(false),
            retry_wake_disabled: self.mutation.retry_wake_disabled.unwrap_or(false),
            contention_backoff_disabled: self.mutation.contention_backoff_disabled.unwrap_or(false),
            park_wake_disabled: self.mutation.park_wake_disabled.unwrap_or(false),
        };
        self.faults.apply(&mut scenario)?;
        // Every rule above is checked at its key; the scenario's own check is the last word (a rule only it knows
        // is reported at the key its message names).
        scenario.check().map_err(|error| check_error(&error.to_string()))?;
        Ok(ScenarioFile {
            scenario,
            version: self.version,
            seeds,
            text: text.to_string(),
            spec_files,
            origin: origin.to_string(),
        })
    }
}

/// A [`Scenario::check`] message (`invalid scenario: gang.operations[2].name: …`) as a broken rule at the file's
/// key for the field it names (`operations[2].name`).
fn check_error(message: &str) -> Broken {
    let message = message.strip_prefix("invalid scenario: ").unwrap_or(message);
    let end = message.find([':', ' ']).unwrap_or(message.len());
    let (field, rule) = (&message[..end], message[end..].trim_start_matches([':', ' ']));
    let renames = [
        ("gang.agents", "topology.agents"),
        ("gang.slots", "topology.slots"),
        ("gang.agent", "agent"),
        ("gang.controller", "controller"),
        ("gang.operations", "operations"),
        ("gang.controls", "controls"),
        ("expect.operations", "expect.operation"),
        ("faults.fixed", "faults.at"),
        ("replicas", "topology.replicas"),
    ];
    let field = renames
        .iter()
        .find_map(|(from, to)| field.strip_prefix(from).map(|rest| format!("{to}{rest}")))
        .unwrap_or_else(|| field.to_string());
    // An expectation's `operation` field is its `name` key in the file.
    let field = match field.strip_prefix("expect.operation[").and_then(|rest| rest.strip_suffix("].operation")) {
        Some(index) => format!("expect.operation[{index}].name"),
        None => field,
    };
    let mut path = KeyPath::new();
    for part in field.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((name, index)) => (name, index.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        path.push(Seg::Key(name.to_string()));
        path.extend(index.map(Seg::Index));
    }
    (path, rule.to_string())
}

fn check_name(name: &str) -> Result<(), Broken> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > NAME_LEN_MAX || !name.chars().all(allowed) || name.starts_with('.') {
        return Err((
            key(&["name"]),
            format!(
                "\"{name}\" must be 1 to {NAME_LEN_MAX} ASCII letters, digits, '-', '_' or '.', not starting \
                 with '.' (it names replay and trace files)"
            ),
        ));
    }
    Ok(())
}

fn positive(path: KeyPath, value: Duration) -> Result<Duration, Broken> {
    if value.is_zero() {
        return Err((path, "must be longer than 0".into()));
    }
    Ok(value)
}

/// The longest simulated span a scenario file may give a workload, a fault window, a submission or control time,
/// or an expectation bound: one simulated hour. Longer runs cannot finish within the trace's
/// [`TRACE_LEN_MAX`](crate::sim::trace::TRACE_LEN_MAX) events (and would take hours of wall time); refused at load.
pub const SIMULATED_SPAN_MAX: Duration = Duration::from_secs(3600);

/// `value` if it is at most [`SIMULATED_SPAN_MAX`]; else the broken rule at `path`.
fn within_max(path: KeyPath, value: Duration) -> Result<Duration, Broken> {
    if value > SIMULATED_SPAN_MAX {
        return Err((path, format!("{value:?} is longer than {SIMULATED_SPAN_MAX:?}, the most a scenario simulates")));
    }
    Ok(value)
}

/// A scenario file's fault window: its end (`faults.until`, else its default) and the keys that set it, as its
/// errors name them.
#[derive(Clone, Copy)]
struct Window {
    /// The end of the window, in simulated time since the run's start.
    until: Duration,
    /// The keys that set `until`: a file with a pipeline set takes no `[workload]` table, so for it only
    /// `faults.until` (a trial: its errors named workload.span, which the file may not set).
    set_by: &'static str,
}

impl Window {
    /// `faults.until` if given, else the default of `scenario` (which already holds its workload and gang part).
    fn of(until: Option<Duration>, scenario: &Scenario) -> Window {
        let gang_span = scenario.gang.as_ref().map_or(Duration::ZERO, |gang| gang.span());
        let set_by = match (until.is_some(), scenario.pipelines.is_some()) {
            (true, _) => "faults.until",
            (false, true) => "faults.until, unset: the pipeline set brings its own workload, so set faults.until",
            (false, false) => "faults.until or else workload.span or the last operation's submission",
        };
        Window { until: until.unwrap_or(scenario.workload.span.max(gang_span)), set_by }
    }
}

/// A fault's `down` or `span` (a random process's longest) if it fits in the fault `window`, so that every fault
/// ends well within the run's time limit (three fault windows and more); else the broken rule.
fn within_window(path: KeyPath, value: Duration, window: Window) -> Result<Duration, Broken> {
    if value > window.until {
        return Err((
            path,
            format!(
                "{value:?} is longer than the fault window ({:?}, {}): a fault may last at most the window; \
                 lengthen faults.until",
                window.until, window.set_by
            ),
        ));
    }
    Ok(value)
}

fn ordered(path: KeyPath, range: &DurationRange) -> Result<Range<Duration>, Broken> {
    let range = range.0.clone();
    if range.start > range.end {
        return Err((
            path,
            format!("the range {:?}..{:?} is empty: its start is past its end", range.start, range.end),
        ));
    }
    Ok(range)
}

/// A range madsim draws from with `gen_range`, which needs it non-empty (start < end).
fn strict(path: KeyPath, range: &DurationRange) -> Result<Range<Duration>, Broken> {
    let range = ordered(path.clone(), range)?;
    if range.start == range.end {
        return Err((
            path,
            format!(
                "the range {:?}..{:?} is empty: its end must be past its start (this key takes [\"from\", \"to\"] \
                 with from < to, not one duration)",
                range.start, range.end
            ),
        ));
    }
    Ok(range)
}

/// The highest rate of a workload's arrivals (`jobs_per_minute`, `claims_per_minute`): 1 000 per simulated second.
pub const WORKLOAD_PER_MINUTE_MAX: f64 = 60_000.0;

/// The highest rate of a random fault process (`[[faults.random]] per_minute`): 10 per simulated second. Faults
/// hold their node or link for a span, so more would mostly be skipped as busy; a contention process at a million a
/// minute grew to gigabytes before this bound.
pub const FAULTS_PER_MINUTE_MAX: f64 = 600.0;

/// The most claims one `contention` fault inserts at once (`[[faults.at]] claims`): a simulated second of claims
/// at the highest workload rate ([`WORKLOAD_PER_MINUTE_MAX`] / 60). Unbounded, a trial's burst of 100 000 was
/// accepted; random bursts take 5 to 24.
pub const CONTENTION_CLAIMS_MAX: usize = (WORKLOAD_PER_MINUTE_MAX / 60.0) as usize;

/// The most rows a row workload inserts (`rows_max`); the largest built-in world (mixed-large) inserts 10 000.
pub const ROWS_MAX_MAX: usize = 1_000_000;

/// The most claim pipelines a workload runs (`claim_pipelines`), each with its own fetcher and workers.
pub const CLAIM_PIPELINES_MAX: usize = 64;

fn rate(path: KeyPath, value: f64, max: f64) -> Result<f64, Broken> {
    if !value.is_finite() || value < 0.0 {
        return Err((path, format!("{value} must be a finite rate ≥ 0 (events per simulated minute)")));
    }
    if value > max {
        return Err((path, format!("{value} is more than {max}, the highest rate (events per simulated minute)")));
    }
    Ok(value)
}

fn chance(path: KeyPath, value: f64) -> Result<f64, Broken> {
    if !(0.0..=1.0).contains(&value) {
        return Err((path, format!("{value} must be a probability in [0, 1]")));
    }
    Ok(value)
}

fn at_least_one(path: KeyPath, value: usize) -> Result<usize, Broken> {
    if value == 0 {
        return Err((path, "0 must be at least 1".into()));
    }
    Ok(value)
}

impl NetworkDoc {
    fn apply(self, scenario: &mut Scenario) -> Result<(), Broken> {
        if let Some(latency) = &self.latency {
            scenario.net_latency = strict(key(&["network", "latency"]), latency)?;
        }
        if let Some(timeout) = self.call_timeout {
            scenario.call_timeout = positive(key(&["network", "call_timeout"]), timeout.0)?;
        }
        Ok(())
    }
}

impl PipelineDoc {
    fn apply(self, scenario: &mut Scenario) -> Result<(), Broken> {
        let spec = &mut scenario.workload;
        if let Some(ttl) = self.lease_ttl {
            spec.lease_ttl = positive(key(&["pipeline", "lease_ttl"]), ttl.0)?;
        }
        if let Some(margin) = self.lease_margin {
            spec.lease_margin = margin.0;
        }
        if let Some(interval) = self.min_processing_interval {
            spec.min_processing_interval = interval.0;
        }
        if let Some(fetchers) = self.fetchers {
            spec.fetchers = at_least_one(key(&["pipeline", "fetchers"]), fetchers)?;
        }
        if let Some(timeout) = self.handler_timeout {
            spec.handler_timeout = Some(positive(key(&["pipeline", "handler_timeout"]), timeout.0)?);
        }
        let workers = |name: &str, value: Option<usize>, default: usize| match value {
            Some(value) => at_least_one(key(&["pipeline", "workers", name]), value),
            None => Ok(default),
        };
        spec.workers.tasks = workers("tasks", self.workers.tasks, spec.workers.tasks)?;
        spec.workers.jobs = workers("jobs", self.workers.jobs, spec.workers.jobs)?;
        spec.workers.claims = workers("claims", self.workers.claims, spec.workers.claims)?;
        Ok(())
    }
}

/// `word` after its indefinite article, for the fault kinds' names: `a kill`, `an agent-kill`, `an isolate`.
fn article(word: &str) -> String {
    let vowel = word.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {word}", if vowel { "an" } else { "a" })
}

/// Every pipeline's config passes the engine's own validation (`PipelineConfig::validate`), reported at the
/// `[pipeline]` key it comes from.
fn check_pipelines(scenario: &Scenario) -> Result<(), Broken> {
    let spec = &scenario.workload;
    let w = &spec.workers;
    let mut configs =
        vec![spec.config("tasks", "task", "ready", w.tasks), spec.config("jobs", "job", JOB_STATUS, w.jobs)];
    configs.extend((0..spec.claim_pipelines).map(|p| spec.config(&format!("claims-{p}"), "claim", "ready", w.claims)));
    for config in configs {
        if let Err(ConfigError::Field { pipeline, field, rule }) = config.validate() {
            let at = match field {
                "apply_batch_window" | "refetch_batch_window" => key(&["pipeline", "lease_margin"]),
                "workers" => key(&["pipeline", "workers"]),
                _ => key(&["pipeline", "lease_ttl"]),
            };
            // heartbeat_trigger is no scenario key: the engine derives it from lease_ttl.
            let derived = if field == "heartbeat_trigger" {
                "; heartbeat_trigger is half of lease_ttl: raise lease_ttl or lower lease_margin"
            } else {
                ""
            };
            let rule = format!(
                "the engine refuses pipeline `{pipeline}`: its {field}: {rule} (lease_ttl {}, lease_margin {}){derived}",
                crate::duration::format(spec.lease_ttl),
                crate::duration::format(spec.lease_margin)
            );
            return Err((at, rule));
        }
    }
    Ok(())
}

impl WorkloadDoc {
    fn apply(self, scenario: &mut Scenario) -> Result<(), Broken> {
        let spec = &mut scenario.workload;
        let at = |field: &str| key(&["workload", field]);
        if let Some(span) = self.span {
            spec.span = within_max(at("span"), span.0)?;
        }
        if let Some(value) = self.jobs_per_minute {
            spec.jobs_per_minute = rate(at("jobs_per_minute"), value, WORKLOAD_PER_MINUTE_MAX)?;
        }
        if let Some([from, to]) = self.tasks_per_job {
            if from == 0 || from > to {
                return Err((at("tasks_per_job"), format!("[{from}, {to}] must be [from, to] with 1 ≤ from ≤ to")));
            }
            spec.tasks_per_job = from..=to;
        }
        if let Some(value) = self.claims_per_minute {
            spec.claims_per_minute = rate(at("claims_per_minute"), value, WORKLOAD_PER_MINUTE_MAX)?;
        }
        if let Some(value) = self.claim_pipelines {
            spec.claim_pipelines = at_least_one(at("claim_pipelines"), value)?;
            if value > CLAIM_PIPELINES_MAX {
                return Err((at("claim_pipelines"), format!("{value} must be at most {CLAIM_PIPELINES_MAX}")));
            }
        }
        if let Some(value) = self.resources {
            spec.resources = at_least_one(at("resources"), value)?;
        }
        if let Some(value) = self.hot_share {
            spec.hot_share = chance(at("hot_share"), value)?;
        }
        if let Some(value) = self.claim_resources {
            spec.claim_resources = at_least_one(at("claim_resources"), value)?;
            if value > spec.resources {
                let rule = format!("{value} must be at most resources ({})", spec.resources);
                return Err((at("claim_resources"), rule));
            }
        }
        if let Some(value) = self.rows_max {
            if value > ROWS_MAX_MAX {
                return Err((at("rows_max"), format!("{value} must be at most {ROWS_MAX_MAX}")));
            }
            spec.rows_max = value;
        }
        if let Some(value) = self.task_slow_chance {
            spec.task_slow_chance = chance(at("task_slow_chance"), value)?;
        }
        if let Some(value) = self.task_failure_chance {
            spec.task_failure_chance = chance(at("task_failure_chance"), value)?;
        }
        if let Some(value) = self.task_fail_first_share {
            spec.task_fail_first_share = chance(at("task_fail_first_share"), value)?;
        }
        if let Some(value) = self.task_fail_always_share {
            spec.task_fail_always_share = chance(at("task_fail_always_share"), value)?;
        }
        if let Some(value) = self.claim_fail_first_share {
            spec.claim_fail_first_share = chance(at("claim_fail_first_share"), value)?;
        }
        let shares = spec.task_fail_first_share + spec.task_fail_always_share;
        if shares > 1.0 {
            let rule = format!("{shares} with task_fail_first_share must be at most 1 (they are shares of the tasks)");
            return Err((at("task_fail_always_share"), rule));
        }
        if let Some(value) = self.task_fail_first_attempts {
            spec.task_fail_first_attempts = at_least_one(at("task_fail_first_attempts"), value as usize)? as u32;
        }
        if let Some(value) = self.attempts_max {
            spec.attempts_max = at_least_one(at("attempts_max"), value as usize)? as u32;
        }
        let ranges = [
            ("task_process", &self.task_process, &mut spec.task_process),
            ("task_slow", &self.task_slow, &mut spec.task_slow),
            ("job_process", &self.job_process, &mut spec.job_process),
            ("claim_process", &self.claim_process, &mut spec.claim_process),
        ];
        for (field, value, target) in ranges {
            if let Some(value) = value {
                *target = ordered(at(field), value)?;
            }
        }
        Ok(())
    }
}

impl ExpectDoc {
    fn apply(self, scenario: &mut Scenario) -> Result<(), Broken> {
        if let Some(bound) = self.liveness_within {
            scenario.liveness_bound = within_max(
                key(&["expect", "liveness_within"]),
                positive(key(&["expect", "liveness_within"]), bound.0)?,
            )?;
        }
        if let Some(bound) = self.starvation_within {
            scenario.starvation_bound = within_max(
                key(&["expect", "starvation_within"]),
                positive(key(&["expect", "starvation_within"]), bound.0)?,
            )?;
        }
        if let Some(bound) = self.drain_within {
            scenario.drain_budget =
                within_max(key(&["expect", "drain_within"]), positive(key(&["expect", "drain_within"]), bound.0)?)?;
        }
        Ok(())
    }
}

impl FaultsDoc {
    fn apply(self, scenario: &mut Scenario) -> Result<(), Broken> {
        let until = match self.until {
            Some(until) => Some(within_max(key(&["faults", "until"]), until.0)?),
            None => None,
        };
        let window = Window::of(until, scenario);
        let until = window.until;
        let pause_inside_pass = match self.pause_inside_pass {
            None => None,
            Some(Dur(bound)) => {
                let path = || key(&["faults", "pause_inside_pass"]);
                Some(within_max(path(), positive(path(), bound)?)?)
            }
        };
        let mut plan = FaultPlan { fixed: Vec::new(), random: Vec::new(), until, pause_inside_pass };
        for (index, fixed) in self.at.iter().enumerate() {
            // The fault's own keys first: a node it names that does not exist is the first thing to fix (a trial:
            // the window's error hid `agent = 5` in a world without agents).
            let fault = fixed.fault(index, scenario.replicas, scenario.agents(), window)?;
            let at = fixed.at.0;
            if at >= until {
                return Err((
                    item(&["faults", "at"], index, "at"),
                    format!(
                        "{at:?} is at or past the end of the fault window ({until:?}, {}): the fault would never \
                         start",
                        window.set_by
                    ),
                ));
            }
            plan.fixed.push(FaultEvent { at, fault });
        }
        for (index, random) in self.random.iter().enumerate() {
            plan.random.push(random.process(index, scenario.agents(), window)?);
        }
        scenario.faults = plan;
        Ok(())
    }
}

/// The longest clock jump a scenario file takes.
const CLOCK_JUMP_MAX: Duration = Duration::from_secs(600);

/// A clock jump's `by`: a duration, forwards, or backwards with a leading `-` (`"5s"`, `"+5s"`, `"-90s"`), not zero
/// and at most [`CLOCK_JUMP_MAX`]. Returns the size and whether it goes backwards.
fn clock_jump(text: &str) -> Result<(Duration, bool), String> {
    let trimmed = text.trim();
    let (back, size) = match trimmed.strip_prefix('-') {
        Some(size) => (true, size),
        None => (false, trimmed.strip_prefix('+').unwrap_or(trimmed)),
    };
    let by = parse_duration(size.trim()).map_err(|error| {
        format!("\"{text}\" is not a clock jump (a duration such as \"5s\", or \"-5s\" backwards): {error}")
    })?;
    if by.is_zero() {
        return Err(format!("\"{text}\" jumps nowhere: a clock jump is not zero"));
    }
    if by > CLOCK_JUMP_MAX {
        return Err(format!(
            "\"{text}\" is longer than {}, the longest clock jump",
            crate::duration::format(CLOCK_JUMP_MAX)
        ));
    }
    Ok((by, back))
}

/// The fields each fault kind takes at a fixed time (besides `at` and `kind`).
fn fixed_fields(kind: FaultKind) -> &'static [&'static str] {
    match kind {
        FaultKind::Kill => &["replica", "down"],
        FaultKind::Pause => &["replica", "span"],
        FaultKind::Partition => &["a", "b", "span"],
        FaultKind::Isolate => &["node", "span"],
        FaultKind::Degrade => &["latency", "loss", "span"],
        FaultKind::LostReplies => &["chance", "span"],
        FaultKind::DbRestart => &["down"],
        FaultKind::ClockDrift => &["replica", "rate_ppm", "span"],
        FaultKind::Contention => &["claims"],
        FaultKind::Buggify => &["span"],
        FaultKind::AgentKill => &["agent", "down"],
        FaultKind::AgentPause => &["agent", "span"],
        FaultKind::AgentClockDrift | FaultKind::AgentClockBeyondMargin => &["agent", "rate_ppm", "span"],
        FaultKind::AgentCalls => &["agent", "calls", "delay", "span"],
        FaultKind::HintLoss | FaultKind::CrashLoop | FaultKind::HandlerHang => &["replica", "span"],
        FaultKind::StoreHang => &["replica", "agent", "span"],
        FaultKind::ClockJump => &["replica", "by"],
        // Random-only kinds: at a fixed time, a partition, an isolate or a store hang names the agent as its node.
        FaultKind::AgentPartition | FaultKind::AgentIsolate | FaultKind::AgentStoreHang => &[],
    }
}

impl FixedDoc {
    /// The fields this entry sets, by name.
    fn present(&self) -> Vec<&'static str> {
        let set = [
            ("replica", self.replica.is_some()),
            ("agent", self.agent.is_some()),
            ("down", self.down.is_some()),
            ("span", self.span.is_some()),
            ("a", self.a.is_some()),
            ("b", self.b.is_some()),
            ("node", self.node.is_some()),
            ("latency", self.latency.is_some()),
            ("loss", self.loss.is_some()),
            ("chance", self.chance.is_some()),
            ("rate_ppm", self.rate_ppm.is_some()),
            ("claims", self.claims.is_some()),
            ("calls", self.calls.is_some()),
            ("delay", self.delay.is_some()),
            ("by", self.by.is_some()),
        ];
        set.iter().filter(|(_, present)| *present).map(|(name, _)| *name).collect()
    }

    fn fault(&self, index: usize, replicas: usize, agents: usize, window: Window) -> Result<Fault, Broken> {
        let kind = self.kind.0;
        let at = |field: &str| item(&["faults", "at"], index, field);
        let node_form = match kind {
            FaultKind::AgentPartition => Some("kind = \"partition\", a = \"agent-N\", b = \"db\""),
            FaultKind::AgentIsolate => Some("kind = \"isolate\", node = \"agent-N\""),
            FaultKind::AgentStoreHang => Some("kind = \"store-hang\", agent = N"),
            _ => None,
        };
        if let Some(form) = node_form {
            return Err((
                at("kind"),
                format!("{} is a random process kind; at a fixed time write {form}", kind.name()),
            ));
        }
        let fields = fixed_fields(kind);
        if let Some(extra) = self.present().into_iter().find(|field| !fields.contains(field)) {
            return Err((
                at(extra),
                format!("{} fault takes no `{extra}` (its fields: {})", article(kind.name()), fields.join(", ")),
            ));
        }
        let need = |field: &str| {
            (at(field), format!("{} fault needs `{field}` (its fields: {})", article(kind.name()), fields.join(", ")))
        };
        let replica = || -> Result<usize, Broken> {
            let replica = self.replica.ok_or_else(|| need("replica"))?;
            if replica >= replicas {
                return Err((
                    at("replica"),
                    format!("replica {replica} does not exist: topology.replicas is {replicas} (0..={})", replicas - 1),
                ));
            }
            Ok(replica)
        };
        let agent = || -> Result<usize, Broken> {
            let agent = self.agent.ok_or_else(|| need("agent"))?;
            if agent >= agents {
                return Err((at("agent"), no_agent(agent, agents)));
            }
            Ok(agent)
        };
        let span = || within_window(at("span"), self.span.ok_or_else(|| need("span"))?.0, window);
        let down = || within_window(at("down"), self.down.ok_or_else(|| need("down"))?.0, window);
        let target = |field: &str, value: &Option<String>| -> Result<Target, Broken> {
            let value = value.as_deref().ok_or_else(|| need(field))?;
            parse_target(value, replicas, agents).map_err(|rule| (at(field), rule))
        };
        Ok(match kind {
            FaultKind::Kill => Fault::Kill { replica: replica()?, down: down()? },
            FaultKind::Pause => Fault::Pause { replica: replica()?, span: span()? },
            FaultKind::Partition => {
                let (a, b) = (target("a", &self.a)?, target("b", &self.b)?);
                if a == b {
                    let name = self.b.as_deref().unwrap_or_default();
                    return Err((at("b"), format!("a partition needs two different nodes, not \"{name}\" twice")));
                }
                Fault::Partition { a, b, span: span()? }
            }
            FaultKind::Isolate => Fault::Isolate { node: target("node", &self.node)?, span: span()? },
            FaultKind::Degrade => {
                let latency = strict(at("latency"), self.latency.as_ref().ok_or_else(|| need("latency"))?)?;
                let loss = chance(at("loss"), self.loss.ok_or_else(|| need("loss"))?)?;
                Fault::Degrade { latency, loss, span: span()? }
            }
            FaultKind::LostReplies => Fault::LostReplies {
                chance: chance(at("chance"), self.chance.ok_or_else(|| need("chance"))?)?,
                span: span()?,
            },
            FaultKind::DbRestart => Fault::DbRestart { down: down()? },
            FaultKind::ClockDrift => {
                let rate_ppm = clock_rate(at("rate_ppm"), self.rate_ppm.ok_or_else(|| need("rate_ppm"))?)?;
                Fault::ClockDrift { replica: replica()?, rate_ppm, span: span()? }
            }
            FaultKind::Contention => {
                let claims = at_least_one(at("claims"), self.claims.ok_or_else(|| need("claims"))?)?;
                if claims > CONTENTION_CLAIMS_MAX {
                    return Err((
                        at("claims"),
                        format!(
                            "{claims} is more than {CONTENTION_CLAIMS_MAX}, the most claims one burst inserts (a \
                             simulated second of claims at the highest rate, workload.claims_per_minute ≤ \
                             {WORKLOAD_PER_MINUTE_MAX})"
                        ),
                    ));
                }
                Fault::Contention { claims }
            }
            FaultKind::Buggify => Fault::Buggify { span: span()? },
            FaultKind::AgentKill => Fault::AgentKill { agent: agent()?, down: down()? },
            FaultKind::AgentPause => Fault::AgentPause { agent: agent()?, span: span()? },
            FaultKind::AgentClockDrift => {
                let rate_ppm = clock_rate(at("rate_ppm"), self.rate_ppm.ok_or_else(|| need("rate_ppm"))?)?;
                Fault::AgentClockDrift { agent: agent()?, rate_ppm, span: span()? }
            }
            FaultKind::AgentClockBeyondMargin => {
                let rate_ppm = clock_rate(at("rate_ppm"), self.rate_ppm.ok_or_else(|| need("rate_ppm"))?)?;
                Fault::AgentClockBeyondMargin { agent: agent()?, rate_ppm, span: span()? }
            }
            FaultKind::AgentCalls => {
                let name = self.calls.as_deref().ok_or_else(|| need("calls"))?;
                let calls = AgentCall::parse(name).ok_or_else(|| {
                    let names: Vec<&str> = AgentCall::ALL.iter().map(|call| call.name()).collect();
                    (at("calls"), format!("\"{name}\" is not a kind of agent call: {}", names.join(", ")))
                })?;
                // Without a delay the calls fail at once.
                let effect = match self.delay {
                    None => CallEffect::Fail,
                    Some(Dur(delay)) if delay.is_zero() => {
                        return Err((
                            at("delay"),
                            "0s delays nothing: leave `delay` out to make the calls fail".into(),
                        ));
                    }
                    Some(Dur(delay)) => CallEffect::Delay(within_window(at("delay"), delay, window)?),
                };
                Fault::AgentCalls { agent: agent()?, calls, effect, span: span()? }
            }
            FaultKind::HintLoss => Fault::HintLoss { replica: replica()?, span: span()? },
            FaultKind::CrashLoop => Fault::CrashLoop { replica: replica()?, span: span()? },
            FaultKind::HandlerHang => Fault::HandlerHang { replica: replica()?, span: span()? },
            FaultKind::StoreHang => {
                let node = match (self.replica, self.agent) {
                    (Some(_), Some(_)) => {
                        return Err((at("agent"), "a store hang takes `replica` or `agent`, not both".into()));
                    }
                    (None, Some(_)) => Target::Agent(agent()?),
                    _ => Target::Replica(replica()?),
                };
                Fault::StoreHang { node, span: span()? }
            }
            FaultKind::ClockJump => {
                let text = self.by.as_deref().ok_or_else(|| need("by"))?;
                let (by, back) = clock_jump(text).map_err(|rule| (at("by"), rule))?;
                Fault::ClockJump { replica: replica()?, by, back }
            }
            FaultKind::AgentPartition | FaultKind::AgentIsolate | FaultKind::AgentStoreHang => {
                unreachable!("refused above")
            }
        })
    }
}

impl RandomDoc {
    fn process(&self, index: usize, agents: usize, window: Window) -> Result<RandomFault, Broken> {
        let kind = self.kind.0;
        let at = |field: &str| item(&["faults", "random"], index, field);
        if kind.targets_agents() && agents == 0 {
            return Err((at("kind"), format!("{} process needs agents: topology.agents is 0", article(kind.name()))));
        }
        let per_minute = rate(at("per_minute"), self.per_minute, FAULTS_PER_MINUTE_MAX)?;
        let span = match (&self.span, kind) {
            (Some(_), FaultKind::Contention) => {
                return Err((at("span"), "a contention process takes no `span` (a burst has none)".into()));
            }
            (None, FaultKind::Contention) => Duration::ZERO..Duration::ZERO,
            (Some(span), _) => {
                let span = ordered(at("span"), span)?;
                within_window(at("span"), span.end, window)?;
                span
            }
            (None, _) => {
                return Err((
                    at("span"),
                    format!("{} process needs `span` (each fault's span or down time)", article(kind.name())),
                ));
            }
        };
        Ok(RandomFault { kind, per_minute, span })
    }
}

/// A clock rate in parts per million the simulated clocks accept: 500 000 (half speed) to 2 000 000.
fn clock_rate(key: KeyPath, rate_ppm: u64) -> Result<u64, Broken> {
    use crate::pipeline::clock::{RATE_PPM_MAX, RATE_PPM_MIN};
    if !(RATE_PPM_MIN..=RATE_PPM_MAX).contains(&rate_ppm) {
        return Err((key, format!("{rate_ppm} is not in {RATE_PPM_MIN}..={RATE_PPM_MAX} (1000000 is an exact clock)")));
    }
    Ok(rate_ppm)
}

/// Why agent `agent` is not in a world of `agents`.
fn no_agent(agent: usize, agents: usize) -> String {
    match agents {
        0 => format!("agent {agent} does not exist: topology.agents is 0 (no agents)"),
        _ => format!("agent {agent} does not exist: topology.agents is {agents} (0..={})", agents - 1),
    }
}

/// A network target: `db`, `client`, `replica-N` with N below `replicas`, or `agent-N` with N below `agents`.
fn parse_target(text: &str, replicas: usize, agents: usize) -> Result<Target, String> {
    match text {
        "db" => Ok(Target::Db),
        "client" => Ok(Target::Client),
        _ => {
            if let Some(agent) = text.strip_prefix("agent-").and_then(|index| index.parse::<usize>().ok()) {
                if agent >= agents {
                    return Err(format!("\"{text}\": {}", no_agent(agent, agents)));
                }
                return Ok(Target::Agent(agent));
            }
            let index =
                text.strip_prefix("replica-").and_then(|index| index.parse::<usize>().ok()).ok_or_else(|| {
                    format!("\"{text}\" is not a node: expected \"db\", \"client\", \"replica-N\" or \"agent-N\"")
                })?;
            if index >= replicas {
                return Err(format!(
                    "\"{text}\": replica {index} does not exist: topology.replicas is {replicas} (0..={})",
                    replicas - 1
                ));
            }
            Ok(Target::Replica(index))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "name = \"t\"\nversion = 1\n";

    fn parse(text: &str) -> Result<ScenarioFile, ScenarioError> {
        ScenarioFile::parse(text, "t.toml")
    }

    /// The error's (line, key, rule) for `text`.
    fn error(text: &str) -> (usize, String, String) {
        match parse(text).expect_err("the text is invalid") {
            ScenarioError::Invalid { line, key, rule, .. } => (line, key, rule),
            other => panic!("not an Invalid error: {other}"),
        }
    }

    fn sets() -> PipelineSets {
        let set = PipelineSet::named("orders").final_statuses("order", &["done"]);
        PipelineSets::from([("orders".to_string(), set)])
    }

    fn error_in(text: &str, sets: &PipelineSets) -> (usize, String, String) {
        match ScenarioFile::parse_in(text, "t.toml", SpecSource::Dir(Path::new("")), sets) {
            Err(ScenarioError::Invalid { line, key, rule, .. }) => (line, key, rule),
            other => panic!("not an Invalid error: {other:?}"),
        }
    }

    #[test]
    fn a_file_naming_a_registered_pipeline_set_runs_it_without_the_built_in_rows() {
        let text = format!("{MINIMAL}pipelines = \"orders\"\n");
        let file = ScenarioFile::parse_in(&text, "t.toml", SpecSource::Dir(Path::new("")), &sets()).unwrap();
        let set = file.scenario.pipelines.as_ref().expect("the set is attached");
        assert_eq!(set.name(), "orders");
        assert_eq!(file.scenario.workload.rows_max, 0, "the built-in rows are off");
        // The set is part of the version hash: the same file naming another set is another scenario.
        let plain = ScenarioFile::parse(MINIMAL, "t.toml").unwrap();
        assert_ne!(file.version_label(), plain.version_label());
    }

    #[test]
    fn an_unknown_pipeline_set_or_a_built_in_table_beside_one_is_refused_at_its_key() {
        let text = format!("{MINIMAL}pipelines = \"billing\"\n");
        let (line, key, rule) = error_in(&text, &sets());
        assert_eq!((line, key.as_str()), (3, "pipelines"));
        assert!(rule.contains("no pipeline set \"billing\" in this binary (it registers orders)"), "{rule}");
        let (_, _, rule) = error_in(&text, &PipelineSets::new());
        assert!(rule.contains("it registers none"), "{rule}");

        let text = format!("{MINIMAL}pipelines = \"orders\"\n[workload]\nspan = \"10s\"\n");
        let (_, key, rule) = error_in(&text, &sets());
        assert_eq!(key, "workload");
        assert!(rule.contains("brings its own workload"), "{rule}");
        let text = format!("{MINIMAL}pipelines = \"orders\"\n[pipeline]\nfetchers = 2\n");
        let (_, key, rule) = error_in(&text, &sets());
        assert_eq!(key, "pipeline");
        assert!(rule.contains("configures its own pipelines"), "{rule}");
    }

    /// A new user's trial: with a pipeline set, the fault window's errors named workload.span (which such a file
    /// may not set) and hid a nonexistent agent, and a contention fault printed its debug form.
    #[test]
    fn a_pipeline_sets_fault_errors_name_faults_until_the_missing_node_and_the_contention_rule() {
        let head = format!("{MINIMAL}pipelines = \"orders\"\n");
        let agent = format!("{head}[[faults.at]]\nat = \"1s\"\nkind = \"agent-kill\"\nagent = 5\ndown = \"1s\"\n");
        let (_, key, rule) = error_in(&agent, &sets());
        assert_eq!(key, "faults.at[0].agent", "{rule}");
        let down = format!("{head}[[faults.at]]\nat = \"1s\"\nkind = \"db-restart\"\ndown = \"1s\"\n");
        let (_, key, rule) = error_in(&down, &sets());
        assert_eq!(key, "faults.at[0].down", "{rule}");
        assert!(rule.contains("set faults.until") && !rule.contains("workload.span"), "{rule}");
        let contention = format!("{head}[[faults.at]]\nat = \"1s\"\nkind = \"contention\"\nclaims = 5\n");
        let (_, key, rule) = error_in(&contention, &sets());
        assert_eq!(key, "faults.at[0].at", "{rule}");
        assert!(rule.contains("set faults.until") && !rule.contains("workload.span"), "{rule}");
        let until = contention.replace("[[faults.at]]", "[faults]\nuntil = \"10s\"\n[[faults.at]]");
        let (_, key, rule) = error_in(&until, &sets());
        assert_eq!(key, "faults.at[0]", "{rule}");
        assert!(
            rule.contains("a contention fault bursts the built-in row workload's claims, and the pipeline set orders"),
            "{rule}"
        );
        assert!(!rule.contains("Contention {") && !rule.contains("lacks"), "{rule}");
    }

    #[test]
    fn a_contention_burst_larger_than_a_second_of_claims_at_the_highest_rate_is_refused() {
        let burst = |claims: usize| {
            format!(
                "{MINIMAL}[workload]\nspan = \"30s\"\n[[faults.at]]\nat = \"1s\"\nkind = \"contention\"\nclaims = {claims}\n"
            )
        };
        parse(&burst(CONTENTION_CLAIMS_MAX)).unwrap();
        let (_, key, rule) = error(&burst(100_000));
        assert_eq!(key, "faults.at[0].claims");
        assert!(rule.contains("100000 is more than 1000, the most claims one burst inserts"), "{rule}");
    }

    #[test]
    fn a_minimal_file_takes_the_mixed_scenarios_defaults_without_faults() {
        let file = parse(MINIMAL).unwrap();
        let mixed = Scenario::mixed();
        assert_eq!(file.scenario.replicas, mixed.replicas);
        assert_eq!(file.scenario.workload.span, mixed.workload.span);
        assert!(file.scenario.faults.fixed.is_empty() && file.scenario.faults.random.is_empty());
        assert_eq!(file.seeds, vec![1]);
        assert_eq!(file.version, 1);
    }

    #[test]
    fn every_section_maps_to_the_scenario() {
        let text = r#"
name = "full"
version = 3
seeds = [4, 5]
[topology]
replicas = 2
[network]
latency = ["2ms", "5ms"]
call_timeout = "3s"
[pipeline]
lease_ttl = "8s"
lease_margin = "2s"
min_processing_interval = "500ms"
workers = { tasks = 4, jobs = 1, claims = 2 }
[workload]
span = "40s"
jobs_per_minute = 10.0
tasks_per_job = [2, 3]
claims_per_minute = 0.0
claim_pipelines = 1
resources = 2
hot_share = 0.2
claim_resources = 2
rows_max = 100
task_process = ["10ms", "20ms"]
task_slow_chance = 0.0
task_slow = "9s"
task_failure_chance = 0.5
job_process = ["1ms", "2ms"]
claim_process = ["1ms", "2ms"]
[faults]
until = "30s"
[[faults.at]]
at = "10s"
kind = "pause"
replica = 1
span = "7s"
[[faults.at]]
at = "12s"
kind = "partition"
a = "replica-0"
b = "db"
span = "3s"
[[faults.random]]
kind = "kill"
per_minute = 0.5
span = ["1s", "4s"]
[[faults.random]]
kind = "contention"
per_minute = 1.0
[expect]
liveness_within = "2m"
starvation_within = "50s"
drain_within = "40s"
[mutation]
apply_guard_disabled = true
"#;
        let file = parse(text).unwrap();
        let s = &file.scenario;
        assert_eq!((s.name.as_str(), file.version, file.seeds.clone()), ("full", 3, vec![4, 5]));
        assert_eq!(s.replicas, 2);
        assert_eq!(s.net_latency, Duration::from_millis(2)..Duration::from_millis(5));
        assert_eq!(s.call_timeout, Duration::from_secs(3));
        assert_eq!(s.workload.lease_ttl, Duration::from_secs(8));
        assert_eq!(s.workload.workers.tasks, 4);
        assert_eq!(s.workload.tasks_per_job, 2..=3);
        assert_eq!(s.workload.claim_resources, 2);
        assert_eq!(s.workload.task_slow, Duration::from_secs(9)..Duration::from_secs(9));
        assert_eq!(s.faults.until, Duration::from_secs(30));
        assert_eq!(
            s.faults.fixed[1],
            FaultEvent {
                at: Duration::from_secs(12),
                fault: Fault::Partition { a: Target::Replica(0), b: Target::Db, span: Duration::from_secs(3) }
            }
        );
        assert_eq!(s.faults.random[1].kind, FaultKind::Contention);
        assert_eq!(s.liveness_bound, Duration::from_secs(120));
        assert!(s.mutation.apply_guard_disabled);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let (line, key, rule) = error("name = \"t\"\nversion = 1\n[workload]\nspan = \"10s\"\njobs_per_hour = 3.0\n");
        assert_eq!((line, key.as_str()), (5, "workload.jobs_per_hour"));
        assert!(rule.contains("unknown field `jobs_per_hour`"), "{rule}");
        let (line, key, _) = error("name = \"t\"\nversion = 1\ncolour = 1\n");
        assert_eq!((line, key.as_str()), (3, "colour"));
    }

    #[test]
    fn a_bad_duration_names_the_key_and_the_form() {
        let (line, key, rule) = error("name = \"t\"\nversion = 1\n\n[network]\ncall_timeout = \"2 parsecs\"\n");
        assert_eq!((line, key.as_str()), (5, "network.call_timeout"));
        assert!(rule.contains("invalid duration \"2 parsecs\"") && rule.contains("unknown unit"), "{rule}");
        let (_, key, rule) = error("name = \"t\"\nversion = 1\n[network]\ncall_timeout = 5\n");
        assert_eq!(key, "network.call_timeout");
        assert!(rule.contains("a duration string"), "{rule}");
    }

    #[test]
    fn a_bad_rate_names_the_process() {
        let text = "name = \"t\"\nversion = 1\n[[faults.random]]\nkind = \"kill\"\nper_minute = -1.0\nspan = \"1s\"\n";
        let (line, key, rule) = error(text);
        assert_eq!((line, key.as_str()), (5, "faults.random[0].per_minute"));
        assert!(rule.contains("must be a finite rate ≥ 0"), "{rule}");
        let (_, key, _) = error("name = \"t\"\nversion = 1\n[workload]\njobs_per_minute = nan\n");
        assert_eq!(key, "workload.jobs_per_minute");
    }

    /// Values that would run out of time or memory are refused at their key, each with its bound (found by a new
    /// user: a contention process at a million a minute grew to gigabytes, a billion slots never started).
    #[test]
    fn values_past_their_bound_are_refused_at_their_key() {
        let head = "name = \"t\"\nversion = 1\n";
        let faults = format!("{head}[[faults.random]]\nkind = \"contention\"\nper_minute = 1e6\n");
        let (_, key, rule) = error(&faults);
        assert_eq!(key, "faults.random[0].per_minute");
        assert!(rule.contains("more than 600"), "{rule}");
        assert!(parse(&faults.replace("1e6", "600.0")).is_ok());
        for (field, value, bound) in [
            ("jobs_per_minute", "1e9", "more than 60000"),
            ("claims_per_minute", "60001.0", "more than 60000"),
            ("claim_pipelines", "1000000", "at most 64"),
            ("rows_max", "10000000", "at most 1000000"),
        ] {
            let (_, key, rule) = error(&format!("{head}[workload]\n{field} = {value}\n"));
            assert_eq!(key, format!("workload.{field}"));
            assert!(rule.contains(bound), "{field}: {rule}");
        }
        let (_, key, rule) = error(&GANG.replace("slots = 2", "slots = 1000000000"));
        assert_eq!(key, "topology.slots");
        assert!(rule.contains("1..=1024"), "{rule}");
    }

    /// A job rule naming a task no operation has would never match: refused at its key with the tasks there are.
    #[test]
    fn a_job_rule_for_a_task_no_operation_has_is_refused() {
        let (_, key, rule) = error(&format!("{GANG}[[jobs.rule]]\ntask = \"nosuchtask\"\nexit_code = 1\n"));
        assert_eq!(key, "jobs.rule[0].task");
        assert!(rule.contains("no operation has a task \"nosuchtask\" (its tasks: \"w\")"), "{rule}");
        assert!(parse(&format!("{GANG}[[jobs.rule]]\ntask = \"w\"\nexit_code = 1\n")).is_ok());
    }

    #[test]
    fn a_replica_out_of_range_is_refused() {
        let text = "name = \"t\"\nversion = 1\n[topology]\nreplicas = 2\n[[faults.at]]\nat = \"1s\"\nkind = \"kill\"\n\
                    replica = 2\ndown = \"1s\"\n";
        let (line, key, rule) = error(text);
        assert_eq!((line, key.as_str()), (8, "faults.at[0].replica"));
        assert!(rule.contains("replica 2 does not exist: topology.replicas is 2"), "{rule}");
        let text = "name = \"t\"\nversion = 1\n[topology]\nreplicas = 2\n[[faults.at]]\nat = \"1s\"\nkind = \"isolate\"\n\
                    node = \"replica-7\"\nspan = \"1s\"\n";
        assert_eq!(error(text).1, "faults.at[0].node");
        assert_eq!(error("name = \"t\"\nversion = 1\n[topology]\nreplicas = 0\n").1, "topology.replicas");
    }

    #[test]
    fn a_fault_past_the_end_of_the_window_is_refused() {
        let text = "name = \"t\"\nversion = 1\n[workload]\nspan = \"30s\"\n[[faults.at]]\nat = \"30s\"\n\
                    kind = \"db-restart\"\ndown = \"1s\"\n";
        let (line, key, rule) = error(text);
        assert_eq!((line, key.as_str()), (6, "faults.at[0].at"));
        assert!(rule.contains("at or past the end of the fault window"), "{rule}");
    }

    #[test]
    fn a_fault_longer_than_the_window_or_a_span_past_an_hour_is_refused_at_its_key() {
        let head = "name = \"t\"\nversion = 1\n[workload]\nspan = \"30s\"\n";
        let (line, key, rule) =
            error(&format!("{head}[[faults.at]]\nkind = \"db-restart\"\nat = \"1s\"\ndown = \"10h\"\n"));
        assert_eq!((line, key.as_str()), (8, "faults.at[0].down"));
        assert!(rule.contains("36000s is longer than the fault window (30s"), "{rule}");
        let text = format!("{head}[[faults.at]]\nkind = \"pause\"\nat = \"1s\"\nreplica = 0\nspan = \"31s\"\n");
        assert_eq!(error(&text).1, "faults.at[0].span");
        let text = format!("{head}[[faults.random]]\nkind = \"kill\"\nper_minute = 1.0\nspan = [\"1s\", \"40s\"]\n");
        assert_eq!(error(&text).1, "faults.random[0].span");
        // Exactly the window is allowed.
        parse(&format!("{head}[[faults.at]]\nkind = \"db-restart\"\nat = \"1s\"\ndown = \"30s\"\n")).unwrap();

        let (line, key, rule) = error(&format!("{head}[faults]\nuntil = \"1000h\"\n"));
        assert_eq!((line, key.as_str()), (6, "faults.until"));
        assert!(rule.contains("3600000s is longer than 3600s, the most a scenario simulates"), "{rule}");
        assert_eq!(error("name = \"t\"\nversion = 1\n[workload]\nspan = \"61m\"\n").1, "workload.span");
        assert_eq!(error(&format!("{head}[expect]\nliveness_within = \"2h\"\n")).1, "expect.liveness_within");
        parse(&format!("{head}[faults]\nuntil = \"1h\"\n")).unwrap();
    }

    #[test]
    fn a_fault_with_a_field_of_another_kind_or_without_its_own_is_refused() {
        let head = "name = \"t\"\nversion = 1\n[[faults.at]]\nat = \"1s\"\n";
        let (line, key, rule) = error(&format!("{head}kind = \"pause\"\nreplica = 0\nspan = \"1s\"\nloss = 0.1\n"));
        assert_eq!((line, key.as_str()), (8, "faults.at[0].loss"));
        assert!(rule.contains("a pause fault takes no `loss`"), "{rule}");
        let (line, key, rule) = error(&format!("{head}kind = \"pause\"\nreplica = 0\n"));
        assert_eq!((line, key.as_str()), (4, "faults.at[0].span"));
        assert!(rule.contains("needs `span`"), "{rule}");
        let (_, key, rule) = error(&format!("{head}kind = \"meteor\"\n"));
        assert_eq!(key, "faults.at[0].kind");
        assert!(rule.contains("unknown fault kind \"meteor\"") && rule.contains("lost-replies"), "{rule}");
    }

    #[test]
    fn empty_ranges_bad_chances_and_engine_rules_are_refused() {
        let head = "name = \"t\"\nversion = 1\n";
        let (_, key, rule) = error(&format!("{head}[workload]\ntask_process = [\"2s\", \"1s\"]\n"));
        assert_eq!(key, "workload.task_process");
        assert!(rule.contains("is empty"), "{rule}");
        assert_eq!(error(&format!("{head}[network]\nlatency = [\"1ms\", \"1ms\"]\n")).1, "network.latency");
        assert_eq!(error(&format!("{head}[workload]\nhot_share = 1.5\n")).1, "workload.hot_share");
        let (_, key, rule) = error(&format!("{head}[workload]\nresources = 2\nclaim_resources = 3\n"));
        assert_eq!((key.as_str(), rule.as_str()), ("workload.claim_resources", "3 must be at most resources (2)"));
        assert_eq!(error(&format!("{head}[workload]\ntasks_per_job = [3, 1]\n")).1, "workload.tasks_per_job");
        assert_eq!(error(&format!("{head}[pipeline.workers]\ntasks = 0\n")).1, "pipeline.workers.tasks");
        assert_eq!(
            error(&format!("{head}[pipeline]\nfetchers = 0\n")),
            (4, "pipeline.fetchers".into(), "0 must be at least 1".into())
        );
        let two = parse(&format!("{head}[pipeline]\nfetchers = 2\n")).unwrap();
        assert_eq!(two.scenario.workload.config("tasks", "task", "ready", 3).fetchers, 2);
        let (_, key, rule) = error(&format!("{head}[pipeline]\nlease_ttl = \"2s\"\nlease_margin = \"1s\"\n"));
        assert_eq!(key, "pipeline.lease_ttl");
        assert_eq!(
            rule,
            "the engine refuses pipeline `tasks`: its heartbeat_trigger: 1s is shorter than 2 × heartbeat_interval \
             (1s) + lease_margin (1s) = 3s: a lease due for extension must hold two heartbeats before its margin \
             (lease_ttl 2s, lease_margin 1s); heartbeat_trigger is half of lease_ttl: raise lease_ttl or lower \
             lease_margin"
        );
        assert_eq!(error(&format!("{head}seeds = []\n")).1, "seeds");
        assert_eq!(error("name = \"a b\"\nversion = 1\n").1, "name");
        assert_eq!(error("name = \"t\"\nversion = 0\n").1, "version");
    }

    #[test]
    fn a_syntax_error_and_a_missing_key_give_a_line() {
        let (line, _, rule) = error("name = \"t\"\nversion = = 1\n");
        assert_eq!(line, 2, "{rule}");
        let (_, _, rule) = error("version = 1\n");
        assert!(rule.contains("missing field `name`"), "{rule}");
    }

    #[test]
    fn a_missing_field_a_duplicate_key_and_a_bad_array_name_their_own_key() {
        let (_, key, rule) = error("name = \"t\"\n");
        assert_eq!((key.as_str(), rule.as_str()), ("version", "missing field `version`"));
        let (_, key, _) = error("version = 1\n");
        assert_eq!(key, "name");
        // A file that begins with a table: `name` is still a top-level key, not the table's.
        let (line, key, rule) = error("[topology]\nreplicas = 2\n");
        assert_eq!((line, key.as_str(), rule.as_str()), (1, "name", "missing field `name`"));
        let (_, key, _) = error(
            "# a header\n\n[topology]\nreplicas = 2\n[[faults.at]]\nat = \"1s\"\nkind = \"db-restart\"\ndown = \"1s\"\n",
        );
        assert_eq!(key, "name");
        let head = "name = \"t\"\nversion = 1\n[workload]\nspan = \"10s\"\n";
        let fault = "[[faults.at]]\nkind = \"db-restart\"\ndown = \"1s\"\n";
        let (line, key, _) =
            error(&format!("{head}[[faults.at]]\nkind = \"db-restart\"\nat = \"1s\"\ndown = \"1s\"\n{fault}"));
        assert_eq!((line, key.as_str()), (9, "faults.at[1].at"));
        let (line, key, rule) = error("name = \"t\"\nversion = 1\n[topology]\nreplicas = 2\nreplicas = 3\n");
        assert_eq!(line, 5);
        assert!(rule.starts_with("duplicate key `replicas`"), "{key}: {rule}");
        let (line, key, rule) = error("name = \"t\"\nversion = 1\n[network]\nlatency = [\"1ms\", \"2ms\", \"3ms\"]\n");
        assert_eq!((line, key.as_str()), (4, "network.latency"));
        assert!(rule.contains("invalid length 3"), "{rule}");
    }

    #[test]
    fn a_negative_duration_and_a_partition_of_one_node_say_so_in_the_files_terms() {
        let (_, key, rule) = error("name = \"t\"\nversion = 1\n[network]\ncall_timeout = \"-2s\"\n");
        assert_eq!(key, "network.call_timeout");
        assert!(rule.contains("invalid duration \"-2s\": a duration cannot be negative"), "{rule}");
        assert!(parse_duration("?2s").unwrap_err().contains("unexpected '?'"));
        let text = "name = \"t\"\nversion = 1\n[[faults.at]]\nat = \"1s\"\nkind = \"partition\"\na = \"db\"\n\
                    b = \"db\"\nspan = \"1s\"\n";
        let (_, key, rule) = error(text);
        assert_eq!(key, "faults.at[0].b");
        assert_eq!(rule, "a partition needs two different nodes, not \"db\" twice");
    }

    #[test]
    fn the_error_text_shows_path_line_key_rule_and_source() {
        let text = "name = \"t\"\nversion = 1\n[topology]\nreplicas = 500\n";
        let shown = ScenarioFile::parse(text, "scenarios/x.toml").unwrap_err().to_string();
        assert!(shown.starts_with("scenarios/x.toml:4:12: topology.replicas: 500 must be in 1..=200\n"), "{shown}");
        assert!(shown.ends_with("    4 | replicas = 500"), "{shown}");
    }

    #[test]
    fn the_content_hash_ignores_layout_and_follows_values_and_version() {
        let a = parse("name = \"t\"\nversion = 1\n[topology]\nreplicas = 2\n").unwrap();
        let b = parse("# a comment\nversion = 1\nname = \"t\"\ntopology = { replicas = 2 }\n").unwrap();
        let c = parse("name = \"t\"\nversion = 1\n[topology]\nreplicas = 3\n").unwrap();
        let d = parse("name = \"t\"\nversion = 2\n[topology]\nreplicas = 2\n").unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        assert_ne!(a.content_hash(), c.content_hash());
        assert_ne!(a.content_hash(), d.content_hash());
        assert!(a.version_label().starts_with("v1-"));
    }

    /// `[faults] pause_inside_pass` is read and checked, and is part of the scenario the simulator runs (its
    /// pauses wait for a pass): a file with it hashes apart, a file without it hashes as before the key existed
    /// (its plan prints no such field).
    #[test]
    fn pause_inside_pass_is_read_checked_and_hashed_only_where_given() {
        let head = "name = \"t\"\nversion = 1\n[workload]\nspan = \"60s\"\n";
        let plain = parse(head).unwrap();
        let aligned = parse(&format!("{head}[faults]\npause_inside_pass = \"10s\"\n")).unwrap();
        assert_eq!(plain.scenario.faults.pause_inside_pass, None);
        assert!(!format!("{:?}", plain.scenario.faults).contains("pause_inside_pass"));
        assert_eq!(aligned.scenario.faults.pause_inside_pass, Some(Duration::from_secs(10)));
        assert_ne!(plain.content_hash(), aligned.content_hash());
        let (line, key, rule) = error(&format!("{head}[faults]\npause_inside_pass = \"0s\"\n"));
        assert_eq!((line, key.as_str(), rule.as_str()), (6, "faults.pause_inside_pass", "must be longer than 0"));
        let (_, key, _) = error(&format!("{head}[faults]\npause_inside_pass = \"2h\"\n"));
        assert_eq!(key, "faults.pause_inside_pass");
        let (_, key, _) = error(&format!("{head}[chaos]\npause_inside_pass = \"10s\"\n"));
        assert_eq!(key, "chaos");
    }
    const GANG: &str = "name = \"g\"\nversion = 1\n[topology]\nagents = 3\nslots = 2\n[[operations]]\nname = \"train\"\n\
                        at = \"1s\"\nspec = \"{tasks={w={job_count=3;command=w;gang_options={}}}}\"\n";

    #[test]
    fn the_gang_part_maps_to_the_scenario() {
        let text = format!(
            "{GANG}{}",
            r#"
[agent]
lease_ttl = "8s"
lease_margin = "1s"
heartbeat_trigger = "3s"
poll_interval = "500ms"
[controller]
workers = 3
lease_ttl = "12s"
min_processing_interval = "1s"
[jobs]
duration = ["2s", "4s"]
exit_code = 0
[[jobs.rule]]
task = "w"
cookie = 1
attempt = 0
duration = "1s"
exit_code = 3
[[jobs.rule]]
task = "w"
hang = true
[[controls]]
at = "30s"
operation = "train"
action = "abort"
reason = "enough"
[[expect.operation]]
name = "train"
state = "aborted"
incarnations = { min = 1, max = 2 }
completes_within = "1m"
[[expect.trace]]
kind = "fence"
node = "agent-1"
fields = { killed = "1" }
at_least = 1
at_most = 2
[faults]
until = "40s"
[[faults.at]]
at = "10s"
kind = "agent-kill"
agent = 2
down = "5s"
[[faults.at]]
at = "12s"
kind = "partition"
a = "agent-1"
b = "db"
span = "20s"
[[faults.random]]
kind = "agent-pause"
per_minute = 0.5
span = ["5s", "10s"]
"#
        );
        let file = parse(&text).unwrap();
        let s = &file.scenario;
        let gang = s.gang.as_ref().expect("a gang part");
        assert_eq!((gang.agents, gang.slots), (3, 2));
        assert_eq!(gang.agent.heartbeat_trigger, Duration::from_secs(3));
        assert_eq!(gang.agent.poll_interval, Duration::from_millis(500));
        assert_eq!((gang.controller.workers, gang.controller.lease_ttl), (3, Duration::from_secs(12)));
        assert_eq!(gang.operations[0].at, Duration::from_secs(1));
        assert_eq!(gang.jobs.default.duration, (Duration::from_secs(2), Duration::from_secs(4)));
        assert_eq!(gang.jobs.rules[0].behaviour, crate::agent::Behaviour::exit_after(Duration::from_secs(1), 3));
        assert_eq!(gang.jobs.rules[1].behaviour.end, crate::agent::End::Hang);
        assert_eq!(gang.jobs.rules[1].job_cookie, None);
        assert_eq!(gang.controls[0].action, super::super::gang::ControlAction::Abort { reason: "enough".into() });
        let expect = &s.expect.operations[0];
        assert_eq!(expect.state, Some(crate::gang::model::OperationStatus::Aborted));
        assert_eq!((expect.incarnations_min, expect.incarnations_max), (Some(1), Some(2)));
        assert_eq!(s.expect.trace[0].fields, [("killed".to_string(), "1".to_string())]);
        assert_eq!(s.faults.fixed[0].fault, Fault::AgentKill { agent: 2, down: Duration::from_secs(5) });
        let partition = &s.faults.fixed[1].fault;
        assert!(matches!(partition, Fault::Partition { a: Target::Agent(1), b: Target::Db, .. }), "{partition:?}");
        assert_eq!(s.faults.random[0].kind, FaultKind::AgentPause);
        assert_eq!(s.workload.rows_max, 0, "a gang file without [workload] runs no rows");
    }

    #[test]
    fn a_spec_with_a_key_lockstep_does_not_know_is_refused_naming_the_operation_and_the_key() {
        let text = "name = \"g\"\nversion = 1\n[topology]\nagents = 1\n[[operations]]\nname = \"typo\"\nat = \"1s\"\n\
                    spec = \"{tasks={t={job_count=2;command=c;gang_option={size=1}}}}\"\n";
        let (line, key, rule) = error(text);
        assert_eq!((line, key.as_str()), (8, "operations[0].spec"));
        assert!(
            rule.contains(
                "operation \"typo\": its spec has key tasks.t.gang_option, which lockstep does not know (did \
                           you mean gang_options?)"
            ),
            "{rule}"
        );
        // A YTsaurus key lockstep knowingly ignores (the seed's master/slave example has it) is accepted.
        let text = "name = \"g\"\nversion = 1\n[topology]\nagents = 1\n[[operations]]\nname = \"ok\"\nat = \"1s\"\n\
                    spec = \"{tasks={t={job_count=2;command=c}};stderr_table_path=s}\"\n";
        parse(text).unwrap();
    }

    #[test]
    fn a_spec_file_is_read_from_the_scenarios_directory_with_its_format_from_the_extension() {
        let dir = std::env::temp_dir().join(format!("lockstep-scenario-specs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("specs")).unwrap();
        std::fs::write(dir.join("specs/g.json"), r#"{"tasks": {"w": {"job_count": 2, "command": "w"}}}"#).unwrap();
        std::fs::write(dir.join("specs/g.txt"), "{}").unwrap();
        let with = |field: &str| {
            format!(
                "name = \"g\"\nversion = 1\n[topology]\nagents = 1\n[[operations]]\nname = \"a\"\nat = \"1s\"\n{field}\n"
            )
        };
        let load = |text: &str| {
            std::fs::write(dir.join("s.toml"), text).unwrap();
            ScenarioFile::load(&dir.join("s.toml"))
        };
        let file = load(&with("spec_file = \"specs/g.json\"")).unwrap();
        let operation = &file.scenario.gang.as_ref().unwrap().operations[0];
        assert_eq!(operation.format, crate::gang::SpecFormat::Json);
        assert_eq!(file.spec_files["specs/g.json"], operation.spec);
        let invalid = |result: Result<ScenarioFile, ScenarioError>| match result.expect_err("invalid") {
            ScenarioError::Invalid { line, key, rule, .. } => (line, key, rule),
            other => panic!("{other}"),
        };
        let (line, key, rule) = invalid(load(&with("spec_file = \"specs/g.txt\"")));
        assert_eq!((line, key.as_str()), (8, "operations[0].spec_file"));
        assert!(rule.contains("cannot tell the spec's format") && rule.contains("add `format`"), "{rule}");
        let (_, key, rule) = invalid(load(&with("spec_file = \"specs/none.yson\"")));
        assert_eq!(key, "operations[0].spec_file");
        assert!(rule.contains("cannot read") && rule.contains("none.yson"), "{rule}");
        let (_, key, _) = invalid(load(&with("spec_file = \"specs/g.json\"\nspec = \"{}\"")));
        assert_eq!(key, "operations[0].spec_file");
        let (_, key, rule) = invalid(load(&with("")));
        assert_eq!(key, "operations[0].spec");
        assert!(rule.contains("needs `spec`"), "{rule}");
        let (_, _, rule) = invalid(load(&with("spec_file = \"specs/g.txt\"\nformat = \"toml\"")));
        assert!(rule.contains("unknown spec format \"toml\""), "{rule}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_invalid_spec_names_the_operation_and_the_specs_field() {
        let text = GANG.replace("job_count=3", "job_count=0");
        let (line, key, rule) = error(&text);
        assert_eq!((line, key.as_str()), (9, "operations[0].spec"));
        assert!(rule.contains("operation \"train\"") && rule.contains("tasks.w.job_count"), "{rule}");
    }

    #[test]
    fn operations_and_controls_are_checked_by_name_and_time() {
        let second = "[[operations]]\nname = \"train\"\nat = \"2s\"\nspec = \"{tasks={w={job_count=1;command=w}}}\"\n";
        let (line, key, rule) = error(&format!("{GANG}{second}"));
        assert_eq!((line, key.as_str()), (11, "operations[1].name"));
        assert!(rule.contains("already names operations[0]"), "{rule}");
        let control = |body: &str| format!("{GANG}[[controls]]\n{body}\n");
        let (_, key, rule) = error(&control("at = \"5s\"\noperation = \"nope\"\naction = \"abort\""));
        assert_eq!(key, "controls[0].operation");
        assert!(rule.contains("no operation named \"nope\""), "{rule}");
        let (_, key, rule) = error(&control("at = \"500ms\"\noperation = \"train\"\naction = \"abort\""));
        assert_eq!(key, "controls[0].at");
        assert!(rule.contains("before operation \"train\" is submitted"), "{rule}");
        let (_, key, rule) = error(&control("at = \"5s\"\noperation = \"train\"\naction = \"pause\""));
        assert_eq!(key, "controls[0].action");
        assert!(rule.contains("expected abort or update-spec"), "{rule}");
        let (_, key, _) = error(&control("at = \"5s\"\noperation = \"train\"\naction = \"abort\"\nspec = \"{}\""));
        assert_eq!(key, "controls[0].spec");
        let (_, key, rule) = error(&control("at = \"5s\"\noperation = \"train\"\naction = \"update-spec\""));
        assert_eq!(key, "controls[0].spec");
        assert!(rule.contains("needs `spec`"), "{rule}");
        let no_agents = GANG.replace("agents = 3\n", "");
        let (_, key, rule) = error(&no_agents);
        assert_eq!(key, "topology.agents");
        assert!(rule.contains("at least one agent"), "{rule}");
    }

    #[test]
    fn agent_faults_are_checked_against_the_topology() {
        let fault = |body: &str| format!("{GANG}[faults]\nuntil = \"30s\"\n[[faults.at]]\nat = \"5s\"\n{body}\n");
        let (line, key, rule) = error(&fault("kind = \"agent-kill\"\nagent = 3\ndown = \"1s\""));
        assert_eq!((line, key.as_str()), (15, "faults.at[0].agent"));
        assert!(rule.contains("agent 3 does not exist: topology.agents is 3 (0..=2)"), "{rule}");
        let (_, key, rule) = error(&fault("kind = \"partition\"\na = \"agent-7\"\nb = \"db\"\nspan = \"1s\""));
        assert_eq!(key, "faults.at[0].a");
        assert!(rule.contains("agent 7 does not exist"), "{rule}");
        let (_, key, rule) = error(&fault("kind = \"agent-pause\"\nreplica = 0\nspan = \"1s\""));
        assert_eq!(key, "faults.at[0].replica");
        assert!(rule.contains("an agent-pause fault takes no `replica`"), "{rule}");
        let (_, key, rule) = error(&fault("kind = \"agent-partition\"\nspan = \"1s\""));
        assert_eq!(key, "faults.at[0].kind");
        assert!(rule.contains("random process kind") && rule.contains("a = \"agent-N\""), "{rule}");
        let random =
            "name = \"t\"\nversion = 1\n[[faults.random]]\nkind = \"agent-kill\"\nper_minute = 1.0\nspan = \"1s\"\n";
        let (line, key, rule) = error(random);
        assert_eq!((line, key.as_str()), (4, "faults.random[0].kind"));
        assert!(rule.contains("needs agents: topology.agents is 0"), "{rule}");
    }

    #[test]
    fn expectations_are_checked_at_their_keys() {
        let expect = |body: &str| format!("{GANG}[[expect.operation]]\n{body}\n");
        let (line, key, rule) = error(&expect("name = \"other\""));
        assert_eq!((line, key.as_str()), (11, "expect.operation[0].name"));
        assert!(rule.contains("no operation named \"other\""), "{rule}");
        let (_, key, rule) = error(&expect("name = \"train\"\nstate = \"running\""));
        assert_eq!(key, "expect.operation[0].state");
        assert!(rule.contains("expected completed, failed or aborted"), "{rule}");
        let (_, key, rule) = error(&expect("name = \"train\"\nincarnations = { min = 3, max = 2 }"));
        assert_eq!(key, "expect.operation[0].incarnations");
        assert!(rule.contains("min 3 is above max 2"), "{rule}");
        let (_, key, _) = error(&expect("name = \"train\"\nincarnations = { least = 3 }"));
        assert_eq!(key, "expect.operation[0].incarnations.least");
        let trace = |body: &str| format!("{GANG}[[expect.trace]]\n{body}\n");
        let (_, key, rule) = error(&trace("kind = \"fence\"\nnode = \"agent-3\""));
        assert_eq!(key, "expect.trace[0].node");
        assert!(rule.contains("agent-3 does not exist: topology.agents is 3"), "{rule}");
        let (_, key, rule) = error(&trace("kind = \"fence\"\nat_least = 2\nat_most = 1"));
        assert_eq!(key, "expect.trace[0].at_most");
        assert!(rule.contains("below at_least 2"), "{rule}");
        let (_, key, _) = error(&trace("kind = \"two words\""));
        assert_eq!(key, "expect.trace[0].kind");
        // A misspelt kind or node prefix would make `at_most` pass whatever happens (a new user's trial).
        let (_, key, rule) = error(&trace("kind = \"fnce\"\nat_most = 0"));
        assert_eq!(key, "expect.trace[0].kind");
        assert!(rule.contains("\"fnce\" is not a kind of trace line; did you mean \"fence\"?"), "{rule}");
        let (_, key, rule) = error(&trace("kind = \"fence\"\nnode = \"agnt-*\"\nat_most = 0"));
        assert_eq!(key, "expect.trace[0].node");
        assert!(rule.contains("\"agnt-*\" matches no node"), "{rule}");
        parse(&trace("kind = \"proc-start\"\nnode = \"a*\"")).unwrap();
        let file = parse(&trace("kind = \"fence\"\nnode = \"agent-*\"")).unwrap();
        assert_eq!(file.scenario.expect.trace[0].at_least, 1, "at_least defaults to 1");
    }

    #[test]
    fn job_rules_and_tunables_are_checked_at_their_keys() {
        let rule = |body: &str| format!("{GANG}[[jobs.rule]]\n{body}\n");
        let (_, key, message) = error(&rule("task = \"w\"\nexit_code = 1\nhang = true"));
        assert_eq!(key, "jobs.rule[0].hang");
        assert!(message.contains("give one of exit_code, hang, start_failure"), "{message}");
        assert_eq!(error(&rule("hang = false")).1, "jobs.rule[0].hang");
        assert_eq!(error(&rule("duration = [\"2s\", \"1s\"]")).1, "jobs.rule[0].duration");
        let (_, key, message) = error(&format!("{GANG}[agent]\nlease_ttl = \"4s\"\nheartbeat_trigger = \"3s\"\n"));
        assert_eq!(key, "agent.heartbeat_trigger");
        assert!(message.contains("must be below lease_ttl - lease_margin"), "{message}");
        assert_eq!(error(&format!("{GANG}[controller]\nworkers = 0\n")).1, "controller.workers");
        assert_eq!(error(&format!("{GANG}[controller]\nlease_ttl = \"1s\"\n")).1, "controller.lease_ttl");
        assert_eq!(error(&GANG.replace("slots = 2", "slots = 0")).1, "topology.slots");
        assert_eq!(error(&GANG.replace("agents = 3", "agents = 201")).1, "topology.agents");
    }

    #[test]
    fn agent_calls_faults_are_read_and_checked_at_their_keys() {
        use crate::sim::faults::{AgentCall, CallEffect};
        let fault = |fields: &str| {
            format!(
                "{GANG}[faults]\nuntil = \"30s\"\n[[faults.at]]\nat = \"5s\"\nkind = \"agent-calls\"\nagent = 1\n{fields}"
            )
        };
        let file = parse(&fault("calls = \"allocations\"\ndelay = \"2s\"\nspan = \"10s\"\n")).unwrap();
        let (delay, span) = (Duration::from_secs(2), Duration::from_secs(10));
        let expected =
            Fault::AgentCalls { agent: 1, calls: AgentCall::Allocations, effect: CallEffect::Delay(delay), span };
        assert_eq!(file.scenario.faults.fixed[0].fault, expected);
        let file = parse(&fault("calls = \"reports\"\nspan = \"10s\"\n")).unwrap();
        let expected = Fault::AgentCalls { agent: 1, calls: AgentCall::Reports, effect: CallEffect::Fail, span };
        assert_eq!(file.scenario.faults.fixed[0].fault, expected, "without a delay the calls fail");
        let (_, key, rule) = error(&fault("calls = \"listings\"\nspan = \"10s\"\n"));
        assert_eq!(key, "faults.at[0].calls");
        assert!(rule.contains("reports, allocations, heartbeats"), "{rule}");
        let (_, key, rule) = error(&fault("calls = \"heartbeats\"\ndelay = \"0s\"\nspan = \"10s\"\n"));
        assert_eq!(key, "faults.at[0].delay");
        assert!(rule.contains("leave `delay` out"), "{rule}");
        let (_, key, _) = error(&fault("span = \"10s\"\n"));
        assert_eq!(key, "faults.at[0].calls");
        let random = format!(
            "{GANG}[faults]\nuntil = \"30s\"\n[[faults.random]]\nkind = \"agent-calls\"\nper_minute = 2.0\nspan = [\"1s\", \"5s\"]\n"
        );
        assert_eq!(parse(&random).unwrap().scenario.faults.random[0].kind, FaultKind::AgentCalls);
    }

    #[test]
    fn a_store_hang_names_a_replica_or_an_agent_and_an_agent_clock_beyond_the_margin_keeps_below_it() {
        let hang = |node: &str| {
            format!(
                "{GANG}[faults]\nuntil = \"30s\"\n[[faults.at]]\nat = \"5s\"\nkind = \"store-hang\"\n{node}span = \"10s\"\n"
            )
        };
        let span = Duration::from_secs(10);
        let fault = |text: &str| parse(text).unwrap().scenario.faults.fixed[0].fault.clone();
        assert_eq!(fault(&hang("replica = 0\n")), Fault::StoreHang { node: Target::Replica(0), span });
        assert_eq!(fault(&hang("agent = 1\n")), Fault::StoreHang { node: Target::Agent(1), span });
        assert_eq!(fault(&hang("agent = 1\n")).to_string(), "store-hang agent-1 (span 10s)");
        let (_, key, rule) = error(&hang("replica = 0\nagent = 1\n"));
        assert_eq!(key, "faults.at[0].agent");
        assert!(rule.contains("`replica` or `agent`, not both"), "{rule}");
        let (_, key, rule) = error(&hang(""));
        assert_eq!(key, "faults.at[0].replica");
        assert!(rule.contains("needs `replica`"), "{rule}");
        let random_only = hang("agent = 1\n").replace("kind = \"store-hang\"", "kind = \"agent-store-hang\"");
        let (_, key, rule) = error(&random_only);
        assert_eq!(key, "faults.at[0].kind");
        assert!(rule.contains("at a fixed time write kind = \"store-hang\", agent = N"), "{rule}");
        let beyond = |rate: u64| {
            format!(
                "{GANG}[faults]\nuntil = \"30s\"\n[[faults.at]]\nat = \"5s\"\nkind = \"agent-clock-beyond-margin\"\n\
                 agent = 1\nrate_ppm = {rate}\nspan = \"10s\"\n"
            )
        };
        assert_eq!(
            fault(&beyond(700_000)),
            Fault::AgentClockBeyondMargin { agent: 1, rate_ppm: 700_000, span: Duration::from_secs(10) }
        );
        // The agents' defaults: 1 - 2 s / 10 s = 0.8, which this kind must stay below.
        let (_, key, rule) = error(&beyond(850_000));
        assert_eq!(key, "faults.at[0].rate_ppm");
        assert!(rule.contains("850000 keeps the margin rule") && rule.contains("agent-clock-drift"), "{rule}");
    }

    #[test]
    fn gang_placement_agent_clock_drift_and_their_mutations_are_read_and_checked_at_their_keys() {
        let file = parse(&format!(
            "{GANG}[controller]\ngang_placement = \"all_or_nothing\"\ngang_unfit_timeout = \"20s\"\n\
             [mutation]\ngang_gate_disabled = true\nlingering_gate_disabled = true\n"
        ))
        .unwrap();
        let gang = file.scenario.gang.as_ref().unwrap();
        assert_eq!(gang.controller.gang_placement, crate::gang::GangPlacement::AllOrNothing);
        assert_eq!(gang.controller.gang_unfit_timeout, Duration::from_secs(20));
        assert!(file.scenario.mutation.gang_gate_disabled);
        assert!(file.scenario.mutation.lingering_gate_disabled);
        let (_, key, rule) = error(&format!("{GANG}[controller]\ngang_placement = \"gang\"\n"));
        assert_eq!(key, "controller.gang_placement");
        assert!(rule.contains("expected incremental or all_or_nothing"), "{rule}");
        let drift = |rate: u64, mutation: &str| {
            format!(
                "{GANG}[faults]\nuntil = \"30s\"\n[[faults.at]]\nat = \"5s\"\nkind = \"agent-clock-drift\"\n\
                 agent = 1\nrate_ppm = {rate}\nspan = \"10s\"\n{mutation}"
            )
        };
        let file = parse(&drift(850_000, "")).unwrap();
        assert_eq!(
            file.scenario.faults.fixed[0].fault,
            Fault::AgentClockDrift { agent: 1, rate_ppm: 850_000, span: Duration::from_secs(10) }
        );
        // The agents' defaults: 1 - 2 s / 10 s = 0.8.
        let (_, key, rule) = error(&drift(700_000, ""));
        assert_eq!(key, "faults.at[0].rate_ppm");
        assert!(rule.contains("700000 breaks the margin rule of DESIGN §2") && rule.contains("800000"), "{rule}");
        let file = parse(&drift(700_000, "[mutation]\nagent_drift_beyond_margin = true\n")).unwrap();
        assert!(file.scenario.mutation.agent_drift_beyond_margin);
        let (_, key, rule) = error(&drift(400_000, "[mutation]\nagent_drift_beyond_margin = true\n"));
        assert_eq!(key, "faults.at[0].rate_ppm");
        assert!(rule.contains("is not in 500000..=2000000"), "{rule}");
    }

    #[test]
    fn the_scenarios_own_check_is_reported_at_the_files_key() {
        let (key, rule) = check_error("invalid scenario: gang.operations[2].spec (train): tasks: empty");
        assert_eq!(render_path(&key), "operations[2].spec");
        assert_eq!(rule, "(train): tasks: empty");
        let (key, _) = check_error("invalid scenario: expect.operations[1].operation: no operation named \"x\"");
        assert_eq!(render_path(&key), "expect.operation[1].name");
        let (key, rule) = check_error("invalid scenario: faults.random[0]: contention needs the row workload");
        assert_eq!(
            (render_path(&key).as_str(), rule.as_str()),
            ("faults.random[0]", "contention needs the row workload")
        );
        let gang_contention =
            format!("{GANG}[faults]\nuntil = \"9s\"\n[[faults.random]]\nkind = \"contention\"\nper_minute = 1.0\n");
        let (_, key, rule) = error(&gang_contention);
        assert_eq!(key, "faults.random[0]");
        assert!(rule.contains("a contention fault bursts the built-in row workload's claims"), "{rule}");
    }
}
