//! The operation spec of a Vanilla operation, read from YSON text, JSON or YAML (DESIGN §4; YTsaurus "Vanilla"
//! docs, "Параметры операции").
//!
//! Every format is read into one JSON tree and decoded from it by hand, so that a wrong type is reported like
//! any other broken rule: with the field's path, and all of them at once ([`SpecError::Invalid`]). Keys the
//! controller does not know (`stderr_table_path`, `title`, `memory_limit`, …) are kept as *unrecognized*, as
//! YTsaurus does with its `unrecognized_spec` alert, so the seed's examples parse as written.

use super::validate::{self, JOB_COUNT_MAX};
use super::yson;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// Default of `max_failed_job_count` (YTsaurus operation options: 10).
pub const MAX_FAILED_JOB_COUNT_DEFAULT: u32 = 10;

/// Default of `max_node_loss_restart_count` (lockstep's own key): as many restarts for lost nodes as
/// YTsaurus allows failed jobs ([`MAX_FAILED_JOB_COUNT_DEFAULT`]).
pub const MAX_NODE_LOSS_RESTART_COUNT_DEFAULT: u32 = 10;

/// The most bytes a spec file may hold (`lockstep submit`'s, and one a scenario file names): 16 MiB. The
/// specs in `scenarios/` and `docs/` hold under 2 KB, and the largest a spec may describe (100 tasks, 100 000
/// jobs) is still far below it; the cap is there so that a path that is not a spec (`/dev/zero`, a pipe that
/// never ends) is refused instead of read until memory runs out ([`crate::files::read_text`]).
pub const SPEC_FILE_BYTES_MAX: u64 = 16 * crate::files::MIB;

/// A Vanilla operation's spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationSpec {
    /// Tasks by name.
    pub tasks: BTreeMap<String, TaskSpec>,
    /// The operation fails once this many jobs failed. Default [`MAX_FAILED_JOB_COUNT_DEFAULT`].
    pub max_failed_job_count: u32,
    /// Fail the operation when a started job would be restarted (plain Vanilla only). Default false.
    pub fail_on_job_restart: bool,
    /// Rerun a job whose job completed, in every task (plain Vanilla only). Default false.
    pub restart_completed_jobs: bool,
    /// lockstep's own key, not YTsaurus's: how the controller places the ranked jobs of each incarnation of a gang
    /// operation ([`GangPlacement`]). `None` (left out): the replica's default (`lockstep serve --gang-placement`,
    /// itself [`GangPlacement::Incremental`], YTsaurus's behaviour, unless set). Only a gang operation may set it.
    #[serde(default)]
    pub gang_placement: Option<GangPlacement>,
    /// lockstep's own key, not YTsaurus's: a gang operation fails once this many of its gang restarts were caused
    /// by a lost node (a ranked job aborted "node lost", or missing at a revival): failures count toward
    /// `max_failed_job_count`, node losses toward this, so a gang on nodes that keep dying does not restart
    /// forever. `None` (left out): [`MAX_NODE_LOSS_RESTART_COUNT_DEFAULT`]. At least 1; only a gang operation may
    /// set it. See [`OperationSpec::node_loss_restarts_max`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_node_loss_restart_count: Option<u32>,
    /// Paths of keys the controller does not interpret, e.g. `stderr_table_path` (YTsaurus reports them in an
    /// `unrecognized_spec` alert rather than failing).
    #[serde(default)]
    pub unrecognized: Vec<String>,
}

/// One task: a kind of job and how many of them run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Jobs of this task that must complete (plain) or that run (gang: `size` ranked + the rest reserved).
    pub job_count: u32,
    /// Shell command the job runs (`sh -c COMMAND`).
    pub command: String,
    /// Files put in the job's sandbox.
    pub file_paths: Vec<FilePath>,
    /// Extra environment variables of the job.
    pub environment: BTreeMap<String, String>,
    /// Output tables (plain Vanilla only; the controller does not write them).
    pub output_table_paths: Vec<String>,
    /// Present on a gang task.
    pub gang_options: Option<GangOptions>,
    /// Task-level `fail_on_job_restart`; the task's effective value is this or the operation's.
    pub fail_on_job_restart: bool,
    /// Task-level `restart_completed_jobs` (YTsaurus keeps it on the task); effective value: this or the
    /// operation's.
    pub restart_completed_jobs: bool,
}

/// How a gang operation's ranked jobs get allocations (`gang_placement`, lockstep's own spec key;
/// docs/gang.md, "Placement").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GangPlacement {
    /// YTsaurus's behaviour: each pending job takes a free allocation as one appears, so a gang larger than the
    /// free slots starts in waves (its jobs must wait for their peers themselves).
    Incremental,
    /// Every ranked job of an incarnation is placed in one pass, or none is and the operation holds no allocation
    /// while it waits its turn in the gang queue (first come, first placed; [`crate::gang::placement`]).
    AllOrNothing,
}

impl GangPlacement {
    /// Both placements, in the order the docs list them.
    pub const ALL: [GangPlacement; 2] = [GangPlacement::Incremental, GangPlacement::AllOrNothing];

    /// The spec's (and `serve --gang-placement`'s) spelling: `incremental`, `all_or_nothing`.
    pub fn as_str(self) -> &'static str {
        match self {
            GangPlacement::Incremental => "incremental",
            GangPlacement::AllOrNothing => "all_or_nothing",
        }
    }

    /// Parses the spec's spelling. Errors: the rule, naming the value and the accepted ones.
    pub fn parse(text: &str) -> Result<GangPlacement, String> {
        GangPlacement::ALL
            .into_iter()
            .find(|p| p.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not a gang placement: expected incremental or all_or_nothing"))
    }
}

impl fmt::Display for GangPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `gang_options` of a gang task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangOptions {
    /// Gang size; `None` means `job_count`. The other `job_count − size` jobs are reserved.
    pub size: Option<u32>,
}

/// A file of `file_paths`: a Cypress path, with the sandbox name from the `file_name` attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePath {
    /// The path, e.g. `//tmp/run_master.py`.
    pub path: String,
    /// The `file_name` attribute, if given; else the sandbox name is the path's last component.
    pub file_name: Option<String>,
}

impl FilePath {
    /// The file's name in the sandbox.
    pub fn sandbox_name(&self) -> &str {
        self.file_name.as_deref().unwrap_or_else(|| self.path.rsplit('/').next().unwrap_or(&self.path))
    }
}

impl TaskSpec {
    /// Whether this is a gang task (it has `gang_options`).
    pub fn is_gang(&self) -> bool {
        self.gang_options.is_some()
    }

    /// Gang size: `gang_options.size` or `job_count`; 0 for a plain task.
    pub fn gang_size(&self) -> u32 {
        self.gang_options.as_ref().map_or(0, |g| g.size.unwrap_or(self.job_count))
    }

    /// Reserved jobs: `job_count − size` in a gang task, none in a plain one.
    pub fn reserved_count(&self) -> u32 {
        if self.is_gang() { self.job_count.saturating_sub(self.gang_size()) } else { 0 }
    }
}

impl OperationSpec {
    /// Gang restarts caused by lost nodes after which the operation fails: `max_node_loss_restart_count`, else
    /// [`MAX_NODE_LOSS_RESTART_COUNT_DEFAULT`].
    pub fn node_loss_restarts_max(&self) -> u32 {
        self.max_node_loss_restart_count.unwrap_or(MAX_NODE_LOSS_RESTART_COUNT_DEFAULT)
    }

    /// The [unrecognized](OperationSpec::unrecognized) keys that are not [`IGNORED_KEYS`]: likely typos, which a
    /// scenario file refuses and `lockstep submit` warns about. Paths as in `unrecognized` (`tasks.t.gang_option`).
    pub fn unknown_keys(&self) -> Vec<&str> {
        self.unrecognized.iter().map(String::as_str).filter(|path| !IGNORED_KEYS.contains(path)).collect()
    }

    /// Whether any task is a gang task (DESIGN §4: then the operation is a gang operation).
    pub fn is_gang(&self) -> bool {
        self.tasks.values().any(TaskSpec::is_gang)
    }

    /// Jobs over all tasks.
    pub fn job_count(&self) -> u64 {
        self.tasks.values().map(|t| t.job_count as u64).sum()
    }

    /// The rank pool of `task` in this operation (DESIGN §4, job environment; YTsaurus `TGangTask`): in a gang
    /// operation every task is a gang task for ranks and sizes, so a task with `gang_options` has its gang size
    /// and a task without them has its `job_count` (all its jobs ranked, none reserved); in a plain operation no
    /// task has ranks (0).
    pub fn task_gang_size(&self, task: &TaskSpec) -> u32 {
        match (self.is_gang(), task.is_gang()) {
            (false, _) => 0,
            (true, true) => task.gang_size(),
            (true, false) => task.job_count,
        }
    }

    /// Gang sizes over all tasks ([`OperationSpec::task_gang_size`]: a task without `gang_options` of a gang
    /// operation counts its `job_count`); 0 for a plain operation. The `YT_GANG_SIZE` of every job.
    pub fn gang_size(&self) -> u64 {
        self.tasks.values().map(|t| self.task_gang_size(t) as u64).sum()
    }

    /// Effective `restart_completed_jobs` of `task`.
    pub fn restarts_completed(&self, task: &TaskSpec) -> bool {
        self.restart_completed_jobs || task.restart_completed_jobs
    }

    /// Effective `fail_on_job_restart` of `task`.
    pub fn fails_on_restart(&self, task: &TaskSpec) -> bool {
        self.fail_on_job_restart || task.fail_on_job_restart
    }

    /// Reads a spec from `text` in `format` and validates it. Errors: the text's syntax error, or every broken
    /// rule (types, required fields, DESIGN §4's invalid cases), each naming its field.
    pub fn parse(text: &str, format: SpecFormat) -> Result<OperationSpec, SpecError> {
        let tree = match format {
            SpecFormat::Yson => {
                yson_to_json(&yson::parse(text).map_err(|e| syntax(format, e.line, e.column, e.message))?)
                    .map_err(|violation| SpecError::Invalid { violations: vec![violation] })?
            }
            SpecFormat::Json => {
                serde_json::from_str::<UniqueKeys>(text)
                    .map_err(|e| syntax(format, e.line(), e.column(), strip_position(e.to_string())))?
                    .0
            }
            SpecFormat::Yaml => {
                serde_norway::from_str::<UniqueKeys>(text)
                    .map_err(|e| {
                        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
                        syntax(format, line, column, strip_position(e.to_string()))
                    })?
                    .0
            }
        };
        OperationSpec::from_json(&tree)
    }

    /// Decodes and validates a spec from a JSON tree (the form every format is read into). Errors: every
    /// broken rule.
    pub fn from_json(tree: &Value) -> Result<OperationSpec, SpecError> {
        let mut decoder = Decoder::default();
        let spec = decoder.spec(tree);
        let mut violations = decoder.violations;
        nul_violations(tree, "", &mut violations);
        if let Some(spec) = &spec {
            // One violation per field: a field the decoder refused (wrong type, negative count) was decoded to a
            // placeholder that validation must not report again.
            let refused: Vec<String> = violations.iter().map(|v| v.field.clone()).collect();
            violations.extend(validate::violations(spec).into_iter().filter(|v| !refused.contains(&v.field)));
        }
        match spec {
            Some(spec) if violations.is_empty() => Ok(spec),
            spec => {
                // Unknown keys are kept and only warned about in a valid spec; in a refused one, a key that is a
                // typo of a known key is most likely why a rule broke (`comand` for a required `command`).
                let typos = spec.iter().flat_map(|spec| spec.unrecognized.iter());
                violations.extend(typos.filter_map(|path| {
                    let known = did_you_mean(path)?;
                    Some(Violation {
                        field: path.clone(),
                        rule: format!("not a key lockstep knows: did you mean {known}?"),
                    })
                }));
                Err(SpecError::Invalid { violations })
            }
        }
    }
}

/// The text formats a spec is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecFormat {
    /// YSON text, as YTsaurus users write specs.
    Yson,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

impl fmt::Display for SpecFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecFormat::Yson => "YSON",
            SpecFormat::Json => "JSON",
            SpecFormat::Yaml => "YAML",
        })
    }
}

/// One broken rule: the field's path (`tasks.trainer.gang_options.size`) and the rule with the value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Dotted path of the field; a key that is not a plain identifier is quoted (`tasks."".job_count`).
    pub field: String,
    /// What is wrong, naming the value and the rule: `9 exceeds job_count 8`.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

/// Why a spec was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The text is not well-formed in its format. Line and column count from 1 (0 when the parser gave none).
    #[error("{format} syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// The format the text was read as.
        format: SpecFormat,
        /// Line of the error, from 1; 0 when the parser gave no position.
        line: usize,
        /// Column of the error, from 1; 0 when the parser gave no position.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The spec breaks rules: one violation per broken rule, in field order of discovery.
    #[error("{}", violations.iter().map(Violation::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// Every rule broken, one violation each (never empty).
        violations: Vec<Violation>,
    },
}

impl SpecError {
    /// The violations of an [`SpecError::Invalid`]; empty for a syntax error.
    pub fn violations(&self) -> &[Violation] {
        match self {
            SpecError::Invalid { violations } => violations,
            SpecError::Syntax { .. } => &[],
        }
    }
}

fn syntax(format: SpecFormat, line: usize, column: usize, message: String) -> SpecError {
    SpecError::Syntax { format, line, column, message }
}

/// serde's messages end with " at line L column C"; the error carries those as fields.
fn strip_position(message: String) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message,
    }
}

/// Every string of `tree` (a key or a value) under `path` that holds a NUL character, as a violation at its field:
/// a spec is stored as PostgreSQL jsonb, which cannot hold one (a trial's command with `\0` was refused only by
/// the store, exit 1 with "invalid store call", instead of as a bad spec, exit 2).
fn nul_violations(tree: &Value, path: &str, violations: &mut Vec<Violation>) {
    const RULE: &str =
        "contains a NUL character (\\u0000), which a spec may not hold (PostgreSQL jsonb cannot store it)";
    match tree {
        Value::String(text) if text.contains('\0') => {
            let field = if path.is_empty() { "(root)".to_string() } else { path.to_string() };
            violations.push(Violation { field, rule: RULE.to_string() });
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                nul_violations(item, &format!("{path}[{i}]"), violations);
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                let at = field(path, key);
                if key.contains('\0') {
                    violations.push(Violation { field: at.clone(), rule: format!("its key {RULE}") });
                }
                nul_violations(item, &at, violations);
            }
        }
        _ => {}
    }
}

/// A field path: `tasks` + `trainer` → `tasks.trainer`; keys that are not identifiers are quoted.
pub fn field(parent: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if plain { key.to_string() } else { format!("{key:?}") };
    if parent.is_empty() { key } else { format!("{parent}.{key}") }
}

/// YSON → JSON in YTsaurus's JSON convention: a node with attributes becomes `{"$attributes": {...}, "$value":
/// v}`; uint64 and int64 become numbers; `#` becomes null. Errors: a non-finite double (JSON has none).
pub fn yson_to_json(node: &yson::Node) -> Result<Value, Violation> {
    convert(node, "")
}

fn convert(node: &yson::Node, path: &str) -> Result<Value, Violation> {
    let value = match &node.value {
        yson::Value::Entity => Value::Null,
        yson::Value::Bool(b) => Value::Bool(*b),
        yson::Value::Int64(v) => Value::from(*v),
        yson::Value::Uint64(v) => Value::from(*v),
        yson::Value::Double(v) => match serde_json::Number::from_f64(*v) {
            Some(n) => Value::Number(n),
            None => {
                let field = if path.is_empty() { "(root)".to_string() } else { path.to_string() };
                return Err(Violation { field, rule: format!("{v} is not a finite number") });
            }
        },
        yson::Value::String(s) => Value::String(s.clone()),
        yson::Value::List(items) => {
            let items = items.iter().enumerate().map(|(i, item)| convert(item, &format!("{path}[{i}]")));
            Value::Array(items.collect::<Result<_, _>>()?)
        }
        yson::Value::Map(items) => Value::Object(convert_map(items, path)?),
    };
    if node.attributes.is_empty() {
        return Ok(value);
    }
    let mut wrapped = Map::new();
    wrapped.insert("$attributes".into(), Value::Object(convert_map(&node.attributes, &format!("{path}.@"))?));
    wrapped.insert("$value".into(), value);
    Ok(Value::Object(wrapped))
}

fn convert_map(items: &BTreeMap<String, yson::Node>, path: &str) -> Result<Map<String, Value>, Violation> {
    items.iter().map(|(key, node)| Ok((key.clone(), convert(node, &field(path, key))?))).collect()
}

/// Decodes the JSON tree, collecting a violation per wrongly typed or missing field.
#[derive(Default)]
struct Decoder {
    violations: Vec<Violation>,
}

/// Operation keys of YTsaurus that the seed document shows (its master/slave example) and lockstep accepts but
/// does not interpret: there are no stderr tables here. Kept in [`OperationSpec::unrecognized`] like any other
/// unknown key, but not reported by [`OperationSpec::unknown_keys`].
pub const IGNORED_KEYS: [&str; 1] = ["stderr_table_path"];

/// A JSON value read as `serde_json::Value` is, but refusing a key given twice in one object: serde_json and
/// serde_norway keep the last one silently (a spec naming `job_count` twice ran the second, a new user's trial),
/// where YSON refuses it. The key is refused while it is read ([`UniqueKey`]), so the error carries the key and,
/// from serde_json or serde_norway, the line and column of the second one (serde_norway also names the map's path).
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<UniqueKeys, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    // serde_norway reads an integer past 64 bits as 128 bits; refused as `serde_json::Value` refuses it.
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        serde_json::Number::deserialize(serde::de::value::I128Deserializer::<E>::new(v)).map(Value::Number)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        serde_json::Number::deserialize(serde::de::value::U128Deserializer::<E>::new(v)).map(Value::Number)
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(UniqueKey { seen: &object })? {
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A map's key, refused if `seen` holds it already. The refusal comes from the key's own visitor, so the parser
/// positions the error at that key, not after the map's value or at the map's start.
struct UniqueKey<'a> {
    seen: &'a Map<String, Value>,
}

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKey<'_> {
    type Value = String;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKey<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<String, E> {
        if self.seen.contains_key(key) {
            return Err(E::custom(format!("duplicate key {key:?}")));
        }
        Ok(key.to_string())
    }
}

/// The key lockstep knows that an unrecognized key path (`tasks.t.gang_option`, `max_failed_jobs`) was most
/// likely meant to be: the known key of the same level (operation or task) within two edits of its last part,
/// the closest first. `None` if no key is that close.
pub fn did_you_mean(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    let known: &[&'static str] = if path.starts_with("tasks.") { &TASK_KEYS } else { &OPERATION_KEYS };
    closest(last, known)
}

/// The word of `known` within two edits of `word`, the closest first (the first of equals); `None` if none is that
/// close. What "did you mean" suggests for a misspelt key or name.
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|key| (edit_distance(word, key), *key))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, key)| key)
}

/// Levenshtein distance between `a` and `b`, by chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

const OPERATION_KEYS: [&str; 6] = [
    "tasks",
    "max_failed_job_count",
    "fail_on_job_restart",
    "restart_completed_jobs",
    "gang_placement",
    "max_node_loss_restart_count",
];
const TASK_KEYS: [&str; 8] = [
    "job_count",
    "command",
    "file_paths",
    "environment",
    "output_table_paths",
    "gang_options",
    "fail_on_job_restart",
    "restart_completed_jobs",
];

impl Decoder {
    fn fail(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.violations.push(Violation { field: field.into(), rule: rule.into() });
    }

    fn spec(&mut self, tree: &Value) -> Option<OperationSpec> {
        let root = self.map(tree, "(root)")?;
        let mut unrecognized = Vec::new();
        unknown_keys(root, "", &OPERATION_KEYS, &mut unrecognized);
        let tasks = match root.get("tasks") {
            None => {
                self.fail("tasks", "required");
                BTreeMap::new()
            }
            Some(value) => self.tasks(value, &mut unrecognized),
        };
        let max_failed = self.count(root.get("max_failed_job_count"), "max_failed_job_count", 0);
        Some(OperationSpec {
            tasks,
            max_failed_job_count: max_failed.unwrap_or(MAX_FAILED_JOB_COUNT_DEFAULT),
            fail_on_job_restart: self.flag(root.get("fail_on_job_restart"), "fail_on_job_restart"),
            restart_completed_jobs: self.flag(root.get("restart_completed_jobs"), "restart_completed_jobs"),
            gang_placement: self.placement(root.get("gang_placement"), "gang_placement"),
            max_node_loss_restart_count: self.count(
                root.get("max_node_loss_restart_count"),
                "max_node_loss_restart_count",
                1,
            ),
            unrecognized,
        })
    }

    fn tasks(&mut self, value: &Value, unrecognized: &mut Vec<String>) -> BTreeMap<String, TaskSpec> {
        let Some(map) = self.map(value, "tasks") else { return BTreeMap::new() };
        let mut tasks = BTreeMap::new();
        for (name, task) in map {
            let path = field("tasks", name);
            if let Some(task) = self.task(task, &path, unrecognized) {
                tasks.insert(name.clone(), task);
            }
        }
        tasks
    }

    fn task(&mut self, value: &Value, path: &str, unrecognized: &mut Vec<String>) -> Option<TaskSpec> {
        let map = self.map(value, path)?;
        unknown_keys(map, path, &TASK_KEYS, unrecognized);
        let at = |key: &str| field(path, key);
        let job_count = match map.get("job_count") {
            None => {
                self.fail(at("job_count"), "required");
                None
            }
            Some(value) => self.integer(value, &at("job_count")),
        };
        let command = match map.get("command") {
            None => {
                self.fail(at("command"), "required");
                String::new()
            }
            Some(value) => self.string(value, &at("command")).unwrap_or_default(),
        };
        let task = TaskSpec {
            // 0 is kept and reported by validation; a negative count cannot be kept and is reported below.
            // A count past u32 is reported below and kept at the limit, so that no message shows a clamped value.
            job_count: job_count.map_or(1, |n| u32::try_from(n.max(0)).unwrap_or(JOB_COUNT_MAX as u32)),
            command,
            file_paths: self.file_paths(map.get("file_paths"), &at("file_paths")),
            environment: self.environment(map.get("environment"), &at("environment")),
            output_table_paths: self.paths(map.get("output_table_paths"), &at("output_table_paths")),
            gang_options: self.gang_options(map.get("gang_options"), &at("gang_options"), unrecognized),
            fail_on_job_restart: self.flag(map.get("fail_on_job_restart"), &at("fail_on_job_restart")),
            restart_completed_jobs: self.flag(map.get("restart_completed_jobs"), &at("restart_completed_jobs")),
        };
        if let Some(n) = job_count.filter(|n| *n < 0) {
            self.fail(at("job_count"), format!("{n} is less than 1"));
        }
        if job_count.is_some_and(|n| n > 0 && u32::try_from(n).is_err()) {
            // The value as written (a count past i64 is read saturated).
            let written = map.get("job_count").map(Value::to_string).unwrap_or_default();
            self.fail(at("job_count"), format!("{written} exceeds the limit of {JOB_COUNT_MAX} jobs in all tasks"));
        }
        Some(task)
    }

    fn gang_options(
        &mut self,
        value: Option<&Value>,
        path: &str,
        unrecognized: &mut Vec<String>,
    ) -> Option<GangOptions> {
        let value = value?;
        if value.is_null() {
            return None;
        }
        let map = self.map(value, path)?;
        // `gang_options` has one field: a misspelt key would silently change the gang size, so it is an error
        // here, not an unrecognized key.
        let _ = unrecognized;
        let misspelt: Vec<String> = map.keys().filter(|key| key.as_str() != "size").cloned().collect();
        for key in misspelt {
            self.fail(field(path, &key), "is not a gang option (the only one is size)");
        }
        let size = match map.get("size") {
            None | Some(Value::Null) => None,
            Some(value) => match self.integer(value, &field(path, "size")) {
                Some(n) if n < 0 => {
                    self.fail(field(path, "size"), format!("{n} is less than 1"));
                    Some(0)
                }
                Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
                None => None,
            },
        };
        Some(GangOptions { size })
    }

    fn file_paths(&mut self, value: Option<&Value>, path: &str) -> Vec<FilePath> {
        let Some(items) = value.and_then(|v| self.list(v, path)) else { return Vec::new() };
        let mut files = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            if let Some((attributes, target)) = self.rich_path(item, &at) {
                let file_name = match attributes.get("file_name") {
                    None => None,
                    Some(name) => self.string(name, &format!("{at}.@file_name")),
                };
                if let Some(broken) = unsafe_path_part(&target) {
                    self.fail(at.clone(), format!("{target:?}: {broken}"));
                } else if let Some(name) = file_name.as_deref().filter(|name| !sandbox_name_allowed(name)) {
                    let rule = "must be a plain file name (not empty, no '/', not . or .., not stdout or stderr)";
                    self.fail(format!("{at}.@file_name"), format!("{name:?} {rule}"));
                } else {
                    files.push(FilePath { path: target, file_name });
                }
            }
        }
        files
    }

    fn paths(&mut self, value: Option<&Value>, path: &str) -> Vec<String> {
        let Some(items) = value.and_then(|v| self.list(v, path)) else { return Vec::new() };
        let mut paths = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if let Some((_, target)) = self.rich_path(item, &format!("{path}[{i}]")) {
                paths.push(target);
            }
        }
        paths
    }

    /// A rich YPath: a string (`<file_name=x>//tmp/y` or `//tmp/y`) or a node with attributes in YTsaurus's
    /// JSON convention (`{"$attributes": {...}, "$value": "//tmp/y"}`, which is what YSON `<a=b>"//tmp/y"`
    /// becomes). Returns the attributes and the path.
    fn rich_path(&mut self, value: &Value, path: &str) -> Option<(Map<String, Value>, String)> {
        if let Some(wrapped) = value.as_object().filter(|m| m.contains_key("$value")) {
            let attributes = wrapped.get("$attributes").and_then(Value::as_object).cloned().unwrap_or_default();
            let target = self.string(&wrapped["$value"], path)?;
            return Some((attributes, target));
        }
        let text = self.string(value, path)?;
        match yson::parse_rich_path(&text) {
            Ok((attributes, target)) => {
                match yson_to_json(&yson::Node { attributes: BTreeMap::new(), value: yson::Value::Map(attributes) }) {
                    Ok(Value::Object(attributes)) => Some((attributes, target)),
                    Ok(_) => unreachable!("a map converts to an object"),
                    Err(violation) => {
                        self.fail(path, violation.rule);
                        None
                    }
                }
            }
            Err(error) => {
                self.fail(path, format!("bad rich path attributes at column {}: {}", error.column, error.message));
                None
            }
        }
    }

    fn environment(&mut self, value: Option<&Value>, path: &str) -> BTreeMap<String, String> {
        let Some(map) = value.and_then(|v| self.map(v, path)) else { return BTreeMap::new() };
        let mut environment = BTreeMap::new();
        for (name, value) in map {
            if let Some(value) = self.string(value, &field(path, name)) {
                environment.insert(name.clone(), value);
            }
        }
        environment
    }

    fn map<'v>(&mut self, value: &'v Value, path: &str) -> Option<&'v Map<String, Value>> {
        match value {
            Value::Object(map) if !map.contains_key("$value") => Some(map),
            other => {
                self.fail(path, format!("expected a map, found {}", describe(other)));
                None
            }
        }
    }

    fn list<'v>(&mut self, value: &'v Value, path: &str) -> Option<&'v Vec<Value>> {
        match value {
            Value::Array(items) => Some(items),
            other => {
                self.fail(path, format!("expected a list, found {}", describe(other)));
                None
            }
        }
    }

    fn string(&mut self, value: &Value, path: &str) -> Option<String> {
        match value {
            Value::String(s) => Some(s.clone()),
            other => {
                self.fail(path, format!("expected a string, found {}", describe(other)));
                None
            }
        }
    }

    fn integer(&mut self, value: &Value, path: &str) -> Option<i64> {
        match value.as_i64().or_else(|| value.as_u64().map(|v| i64::try_from(v).unwrap_or(i64::MAX))) {
            Some(n) => Some(n),
            None => {
                self.fail(path, format!("expected an integer, found {}", describe(value)));
                None
            }
        }
    }

    /// A non-negative count no larger than u32, or `None` (absent or broken).
    fn count(&mut self, value: Option<&Value>, path: &str, min: i64) -> Option<u32> {
        let n = self.integer(value?, path)?;
        if n < min {
            self.fail(path, format!("{n} is less than {min}"));
            return None;
        }
        Some(u32::try_from(n).unwrap_or(u32::MAX))
    }

    fn placement(&mut self, value: Option<&Value>, path: &str) -> Option<GangPlacement> {
        match value? {
            Value::Null => None,
            Value::String(text) => match GangPlacement::parse(text) {
                Ok(placement) => Some(placement),
                Err(rule) => {
                    self.fail(path, rule);
                    None
                }
            },
            other => {
                self.fail(
                    path,
                    format!("expected a string (incremental or all_or_nothing), found {}", describe(other)),
                );
                None
            }
        }
    }

    fn flag(&mut self, value: Option<&Value>, path: &str) -> bool {
        match value {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.fail(path, format!("expected a boolean (%true or %false), found {}", describe(other)));
                false
            }
        }
    }
}

fn unknown_keys(map: &Map<String, Value>, path: &str, known: &[&str], out: &mut Vec<String>) {
    out.extend(map.keys().filter(|key| !known.contains(&key.as_str())).map(|key| field(path, key)));
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "an entity (#)".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(m) if m.contains_key("$value") => "a value with attributes".into(),
        Value::Object(_) => "a map".into(),
    }
}

/// Why a Cypress path of `file_paths` is refused, if it is: it must be absolute (`//…`) with no empty, `.` or `..`
/// part, so that an agent resolving it under its files root can never leave that root.
fn unsafe_path_part(path: &str) -> Option<&'static str> {
    let Some(rest) = path.strip_prefix("//") else { return Some("must start with //") };
    if rest.is_empty() || rest.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Some("must not have an empty, . or .. part");
    }
    None
}

/// Whether `name` may name a file in a job's sandbox: one plain component that is not the captured output.
pub fn sandbox_name_allowed(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name == "." || name == ".." || name == "stdout" || name == "stderr")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_character_in_any_string_or_key_is_a_violation_at_its_field() {
        let tree = serde_json::json!({
            "tasks": {"t": {"job_count": 1, "command": "echo a\u{0}b", "environment": {"K\u{0}": "v"}}},
            "annotations": ["ok", "x\u{0}"]
        });
        let error = OperationSpec::from_json(&tree).expect_err("a NUL is refused");
        let fields: Vec<&str> = error.violations().iter().map(|v| v.field.as_str()).collect();
        assert!(fields.contains(&"tasks.t.command"), "{error}");
        assert!(fields.contains(&"annotations[1]"), "{error}");
        assert!(fields.iter().any(|f| f.starts_with("tasks.t.environment.")), "{error}");
        let command = error.violations().iter().find(|v| v.field == "tasks.t.command").unwrap();
        assert!(command.rule.contains("contains a NUL character"), "{}", command.rule);
        assert_eq!(error.violations().iter().filter(|v| v.field == "tasks.t.command").count(), 1, "{error}");
    }

    #[test]
    fn unknown_keys_leave_out_ignored_ones_and_suggest_the_close_known_key() {
        let text = "{tasks={t={job_count=2; command=\"true\"; gang_option={size=1}; foo=bar}}; pool=x; \
                    stderr_table_path=\"//tmp/s\"; max_failed_jobs_count=1}";
        let spec = OperationSpec::parse(text, SpecFormat::Yson).unwrap();
        assert!(!spec.is_gang(), "the misspelt gang_option is not a gang option");
        assert_eq!(spec.unknown_keys(), ["max_failed_jobs_count", "pool", "tasks.t.foo", "tasks.t.gang_option"]);
        assert!(spec.unrecognized.contains(&"stderr_table_path".to_string()));
        assert_eq!(did_you_mean("tasks.t.gang_option"), Some("gang_options"));
        assert_eq!(did_you_mean("max_failed_jobs_count"), Some("max_failed_job_count"));
        assert_eq!(did_you_mean("tasks.t.comand"), Some("command"));
        assert_eq!(did_you_mean("comand"), None, "command is a task key, not an operation key");
        assert_eq!(did_you_mean("tasks.t.foo"), None);
        assert_eq!(did_you_mean("pool"), None);
    }

    #[test]
    fn a_refused_spec_names_the_typos_that_likely_broke_it() {
        let text = "{tasks={main={job_count=2; comand=\"echo hi\"; gang_option={size=2}; foo=1}}}";
        let error = OperationSpec::parse(text, SpecFormat::Yson).unwrap_err().to_string();
        assert!(error.contains("tasks.main.command: required"), "{error}");
        assert!(error.contains("tasks.main.comand: not a key lockstep knows: did you mean command?"), "{error}");
        assert!(
            error.contains("tasks.main.gang_option: not a key lockstep knows: did you mean gang_options?"),
            "{error}"
        );
        assert!(!error.contains("tasks.main.foo"), "a key close to no known one is kept quietly: {error}");
    }

    #[test]
    fn a_job_count_past_u32_is_named_as_written() {
        for (written, format) in [("100000000000", SpecFormat::Yson), ("18446744073709551615u", SpecFormat::Yson)] {
            let text = format!("{{tasks={{t={{job_count={written}; command=\"true\"}}}}}}");
            let error = OperationSpec::parse(&text, format).unwrap_err().to_string();
            let shown = written.trim_end_matches('u');
            assert!(error.contains(&format!("tasks.t.job_count: {shown} exceeds the limit of 100000")), "{error}");
            assert!(!error.contains("4294967295"), "a clamped value is shown: {error}");
        }
    }

    #[test]
    fn a_task_name_with_control_characters_is_refused_and_shown_escaped() {
        let text = "{tasks={\"w\\nstate       completed\\x1b[31m\"={job_count=1; command=\"true\"}}}";
        let error = OperationSpec::parse(text, SpecFormat::Yson).unwrap_err().to_string();
        assert!(error.contains("task name must not hold control characters"), "{error}");
        assert!(!error.contains('\n') && !error.contains('\x1b'), "the name is printed raw: {error:?}");
    }

    #[test]
    fn a_json_key_given_twice_is_refused_as_yson_refuses_it() {
        let text = "{\"tasks\": {\"w\": {\"job_count\": 2,\n \"job_count\": 3, \"command\": \"true\"}}}";
        let error = OperationSpec::parse(text, SpecFormat::Json).unwrap_err().to_string();
        assert!(error.contains("duplicate key \"job_count\""), "{error}");
        assert!(error.contains("line 2"), "the error names no line: {error}");
        let yson = OperationSpec::parse("{tasks={w={job_count=2;job_count=3;command=x}}}", SpecFormat::Yson);
        assert!(yson.unwrap_err().to_string().contains("duplicate key \"job_count\""));
        let fine = "{\"tasks\": {\"w\": {\"job_count\": 2, \"command\": \"true\", \"environment\": {\"A\": \"1.5\"}}}}";
        assert_eq!(OperationSpec::parse(fine, SpecFormat::Json).unwrap().tasks["w"].job_count, 2);
    }

    #[test]
    fn a_yaml_key_given_twice_at_the_top_is_refused_with_its_line_and_column() {
        let text =
            "tasks:\n  w:\n    job_count: 2\n    command: \"true\"\nmax_failed_job_count: 1\nmax_failed_job_count: 5\n";
        let error = OperationSpec::parse(text, SpecFormat::Yaml).unwrap_err();
        assert_eq!(
            error.to_string(),
            "YAML syntax error at line 6, column 1: duplicate key \"max_failed_job_count\"",
            "{error:?}"
        );
    }

    #[test]
    fn a_yaml_key_given_twice_in_a_nested_map_is_refused_with_its_path_line_and_column() {
        let text = "tasks:\n  w:\n    job_count: 2\n    command: \"true\"\n    job_count: 3\n";
        let error = OperationSpec::parse(text, SpecFormat::Yaml).unwrap_err();
        assert_eq!(
            error.to_string(),
            "YAML syntax error at line 5, column 5: tasks.w: duplicate key \"job_count\"",
            "{error:?}"
        );
        // Two tasks of one name would otherwise lose one without a word.
        let text = "tasks:\n  w: {job_count: 1, command: a}\n  w: {job_count: 2, command: b}\n";
        let error = OperationSpec::parse(text, SpecFormat::Yaml).unwrap_err();
        assert_eq!(error.to_string(), "YAML syntax error at line 3, column 3: tasks: duplicate key \"w\"");
        let huge = "tasks:\n  w: {job_count: 100000000000000000000000, command: a}\n";
        let error = OperationSpec::parse(huge, SpecFormat::Yaml).unwrap_err().to_string();
        assert!(error.starts_with("YAML syntax error at line 2, column 18: "), "{error}");
        let fine = "tasks:\n  w: {job_count: 2, command: \"true\", environment: {A: \"1\", B: \"1\"}}\n";
        assert_eq!(OperationSpec::parse(fine, SpecFormat::Yaml).unwrap().tasks["w"].job_count, 2);
    }

    #[test]
    fn field_paths_quote_keys_that_are_not_identifiers() {
        assert_eq!(field("tasks", "trainer"), "tasks.trainer");
        assert_eq!(field("tasks", ""), "tasks.\"\"");
        assert_eq!(field("tasks", "a b"), "tasks.\"a b\"");
        assert_eq!(field("", "tasks"), "tasks");
    }

    #[test]
    fn sandbox_name_defaults_to_the_last_path_component() {
        let file = FilePath { path: "//tmp/run.py".into(), file_name: None };
        assert_eq!(file.sandbox_name(), "run.py");
        let file = FilePath { path: "//tmp/duties_180124.dat".into(), file_name: Some("duties.dat".into()) };
        assert_eq!(file.sandbox_name(), "duties.dat");
    }
}
