//! The ranges a swarm draws its worlds from: every knob with its documented default, read from a ranges file
//! (TOML, every key optional) and narrowed by the command line's flags (`--max-replicas`, `--overload`,
//! `--kinds`, `--shapes`).

use crate::hash::fnv1a64;
use crate::sim::faults::FaultKind;
use serde::Deserialize;
use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

/// What a drawn world is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shape {
    /// The built-in row workload (tasks, the jobs that lock them, claims on shared counters) on replicas.
    Rows,
    /// Gang and plain operations on replicas and agents, no row workload.
    Gang,
    /// Both at once.
    Mixed,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 3] = [Shape::Rows, Shape::Gang, Shape::Mixed];

    /// The shape's name in ranges files, flags and world summaries.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Rows => "rows",
            Shape::Gang => "gang",
            Shape::Mixed => "mixed",
        }
    }

    /// Whether the shape runs the built-in row workload.
    pub fn rows(self) -> bool {
        self != Shape::Gang
    }

    /// Whether the shape has agents and operations.
    pub fn gang(self) -> bool {
        self != Shape::Rows
    }

    fn from_name(name: &str) -> Result<Shape, String> {
        Shape::ALL.into_iter().find(|shape| shape.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Shape::ALL.iter().map(|shape| shape.name()).collect();
            format!("unknown world shape \"{name}\": expected one of {}", names.join(", "))
        })
    }
}

/// The ranges of every drawn knob. A world draws each knob uniformly within its range unless its doc says
/// otherwise; [`Ranges::default`] is what `lockstep sim swarm` draws from without a ranges file.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranges {
    /// World shapes, one drawn uniformly per seed. Default: all three.
    pub shapes: Vec<Shape>,
    /// Replica nodes. Default 1..=4.
    pub replicas: RangeInclusive<usize>,
    /// Agent nodes of gang and mixed worlds. Default 1..=5.
    pub agents: RangeInclusive<usize>,
    /// Allocations (slots) per agent. Default 1..=3.
    pub slots: RangeInclusive<u32>,
    /// Workers per row pipeline per replica (each pipeline draws its own). Default 1..=6.
    pub workers: RangeInclusive<usize>,
    /// Lease ttl of the row pipelines, and (drawn apart) of the operation pipeline and the agents' node leases.
    /// Default 5 s..=15 s (the engine needs at least 4 s + 2 × the margin: two heartbeats before the margin).
    pub lease_ttl: RangeInclusive<Duration>,
    /// How long the client inserts rows and submits operations, in simulated time. Default 20 s..=90 s.
    pub span: RangeInclusive<Duration>,
    /// The highest arrival rate of the row workload, as a multiple of its workers' capacity (replicas × task
    /// workers ÷ mean task time). 0 keeps every world idle; default 3 (three times what the workers can take).
    pub overload: f64,
    /// Share of row worlds whose arrival rate is drawn above capacity, in `1..=overload` (the others draw it in
    /// `0..=0.9`). Default 0.25.
    pub overload_share: f64,
    /// Most rows a world's client inserts (the span shrinks to keep its rate under it). Default 2 000.
    pub rows_max: usize,
    /// Operations a gang or mixed world submits. Default 1..=6.
    pub operations: RangeInclusive<usize>,
    /// Fault kinds a world may switch on; each is on with chance [`Ranges::kind_chance`] (swarm testing: a
    /// world runs a random subset of kinds, not all at once). Kinds the world's shape cannot run (agent kinds
    /// without agents, contention without the row workload) are dropped from that world. Default: every kind but
    /// those [`FaultKind::off_by_default`] (`agent-clock-beyond-margin`, a known violation of rank exclusivity),
    /// which a file's `kinds` or `--kinds` turns on by naming it; such a kind is then on in a quarter of the
    /// worlds the others are.
    pub kinds: Vec<FaultKind>,
    /// Chance that each kind of [`Ranges::kinds`] is on in a world. Default 0.5.
    pub kind_chance: f64,
    /// Rate of each kind that is on, in faults per simulated minute. Default 0.3..=3.
    pub fault_rate: RangeInclusive<f64>,
    /// TEST ONLY: bugs planted in every world (`[mutation]` keys, [`crate::sim::Mutation::NAMES`]), to measure how
    /// soon a swarm finds each. With `agent_drift_beyond_margin`, every world with agents also drifts an agent's
    /// clock below the margin rule. Default none.
    pub mutations: Vec<String>,
}

impl Default for Ranges {
    fn default() -> Ranges {
        Ranges {
            shapes: Shape::ALL.to_vec(),
            replicas: 1..=4,
            agents: 1..=5,
            slots: 1..=3,
            workers: 1..=6,
            lease_ttl: Duration::from_secs(5)..=Duration::from_secs(15),
            span: Duration::from_secs(20)..=Duration::from_secs(90),
            overload: 3.0,
            overload_share: 0.25,
            rows_max: 2_000,
            operations: 1..=6,
            kinds: FaultKind::ALL.into_iter().filter(|kind| !kind.off_by_default()).collect(),
            kind_chance: 0.5,
            fault_rate: 0.3..=3.0,
            mutations: Vec::new(),
        }
    }
}

/// The most replicas a drawn world may have (each is woken by every hint: worlds stay cheap to run).
pub const REPLICAS_MAX: usize = 16;
/// The most agents a drawn world may have.
pub const AGENTS_MAX: usize = 32;
/// The most slots per agent.
pub const SLOTS_MAX: u32 = 16;
/// The most workers per row pipeline per replica.
pub const WORKERS_MAX: usize = 64;
/// The highest overload a world may draw.
pub const OVERLOAD_MAX: f64 = 20.0;
/// The most operations a world may submit.
pub const OPERATIONS_MAX: usize = 50;
/// The most rows a world may insert.
pub const ROWS_MAX: usize = 100_000;
/// The shortest and longest drawn lease ttl.
pub const LEASE_TTL_BOUNDS: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));
/// The shortest and longest drawn span.
pub const SPAN_BOUNDS: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(600));

/// A ranges file's shape: every key optional, each range a two-element list `[from, to]` (both included).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RangesDoc {
    shapes: Option<Vec<String>>,
    replicas: Option<[usize; 2]>,
    agents: Option<[usize; 2]>,
    slots: Option<[u32; 2]>,
    workers: Option<[usize; 2]>,
    lease_ttl: Option<[String; 2]>,
    span: Option<[String; 2]>,
    overload: Option<f64>,
    overload_share: Option<f64>,
    rows_max: Option<usize>,
    operations: Option<[usize; 2]>,
    kinds: Option<Vec<String>>,
    kind_chance: Option<f64>,
    fault_rate: Option<[f64; 2]>,
    mutations: Option<Vec<String>>,
}

impl Ranges {
    /// Reads a ranges file's `text` (TOML; `origin` names it in errors) over the defaults.
    ///
    /// Errors: TOML that does not parse, an unknown key, or a value that breaks its rule ([`Ranges::check`]),
    /// naming the key.
    pub fn parse(text: &str, origin: &str) -> Result<Ranges, String> {
        let doc: RangesDoc = toml::from_str(text).map_err(|error| {
            // The line and column where the error is, and the line itself, as scenario files' errors show them.
            let at = error.span().map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
                let shown = text.lines().nth(line - 1).unwrap_or("");
                (format!(":{line}:{column}"), format!("\n{line:>5} | {shown}"))
            });
            let (at, shown) = at.unwrap_or_default();
            format!("{origin}{at}: {}{shown}", error.message())
        })?;
        let mut ranges = Ranges::default();
        // A value that breaks its rule is shown where it is written: the line and column of the key's value, and
        // the line itself (a rule between two keys names the first; a key the file leaves out has no place).
        let at = |key: &str, rule: String| {
            let place = text.lines().enumerate().find_map(|(index, line)| {
                let rest = line.trim_start().strip_prefix(key)?.trim_start().strip_prefix('=')?;
                let column = line.len() - rest.trim_start().len() + 1;
                Some(format!(":{}:{column}", index + 1))
            });
            match place {
                Some(place) => {
                    let line: usize = place[1..].split(':').next().and_then(|n| n.parse().ok()).unwrap_or(1);
                    let shown = text.lines().nth(line - 1).unwrap_or("");
                    format!("{origin}{place}: {key}: {rule}\n{line:>5} | {shown}")
                }
                None => format!("{origin}: {key}: {rule}"),
            }
        };
        if let Some(shapes) = doc.shapes {
            ranges.shapes = shapes
                .iter()
                .map(|name| Shape::from_name(name))
                .collect::<Result<_, _>>()
                .map_err(|rule| at("shapes", rule))?;
        }
        let pair = |[from, to]: [usize; 2]| from..=to;
        if let Some(value) = doc.replicas {
            ranges.replicas = pair(value);
        }
        if let Some(value) = doc.agents {
            ranges.agents = pair(value);
        }
        if let Some([from, to]) = doc.slots {
            ranges.slots = from..=to;
        }
        if let Some(value) = doc.workers {
            ranges.workers = pair(value);
        }
        if let Some(value) = doc.operations {
            ranges.operations = pair(value);
        }
        let durations = |key: &str, [from, to]: [String; 2]| -> Result<RangeInclusive<Duration>, String> {
            let parse = |text: &str| crate::duration::parse(text).map_err(|rule| at(key, rule));
            Ok(parse(&from)?..=parse(&to)?)
        };
        if let Some(value) = doc.lease_ttl {
            ranges.lease_ttl = durations("lease_ttl", value)?;
        }
        if let Some(value) = doc.span {
            ranges.span = durations("span", value)?;
        }
        if let Some(value) = doc.overload {
            ranges.overload = value;
        }
        if let Some(value) = doc.overload_share {
            ranges.overload_share = value;
        }
        if let Some(value) = doc.rows_max {
            ranges.rows_max = value;
        }
        if let Some(kinds) = doc.kinds {
            ranges.kinds = parse_kinds(&kinds).map_err(|rule| at("kinds", rule))?;
        }
        if let Some(value) = doc.kind_chance {
            ranges.kind_chance = value;
        }
        if let Some([from, to]) = doc.fault_rate {
            ranges.fault_rate = from..=to;
        }
        if let Some(mutations) = doc.mutations {
            for mutation in mutations {
                if !ranges.mutations.contains(&mutation) {
                    ranges.mutations.push(mutation);
                }
            }
        }
        ranges.check().map_err(|(key, rule)| at(key, rule))?;
        Ok(ranges)
    }

    /// Checks every range: non-empty, within its bound. Errors: the key and the rule it breaks.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        fn within<T: PartialOrd + fmt::Debug>(
            key: &'static str,
            range: &RangeInclusive<T>,
            low: T,
            high: T,
        ) -> Result<(), (&'static str, String)> {
            if range.start() > range.end() {
                return Err((key, format!("{:?} is empty: write [from, to] with from ≤ to", range)));
            }
            if *range.start() < low || *range.end() > high {
                return Err((key, format!("{:?} must be within {low:?}..={high:?}", range)));
            }
            Ok(())
        }
        if self.shapes.is_empty() {
            return Err(("shapes", "at least one shape: rows, gang or mixed".into()));
        }
        within("replicas", &self.replicas, 1, REPLICAS_MAX)?;
        within("agents", &self.agents, 1, AGENTS_MAX)?;
        within("slots", &self.slots, 1, SLOTS_MAX)?;
        within("workers", &self.workers, 1, WORKERS_MAX)?;
        within("operations", &self.operations, 1, OPERATIONS_MAX)?;
        within("lease_ttl", &self.lease_ttl, LEASE_TTL_BOUNDS.0, LEASE_TTL_BOUNDS.1)?;
        within("span", &self.span, SPAN_BOUNDS.0, SPAN_BOUNDS.1)?;
        within("fault_rate", &self.fault_rate, 0.0, crate::sim::scenario_file::FAULTS_PER_MINUTE_MAX)?;
        if !(0.0..=OVERLOAD_MAX).contains(&self.overload) {
            return Err(("overload", format!("{} must be within 0..={OVERLOAD_MAX}", self.overload)));
        }
        for (key, share) in [("overload_share", self.overload_share), ("kind_chance", self.kind_chance)] {
            if !(0.0..=1.0).contains(&share) {
                return Err((key, format!("{share} is not a chance: it must be within 0..=1")));
            }
        }
        if let Some(unknown) = self.mutations.iter().find(|name| !crate::sim::Mutation::NAMES.contains(&name.as_str()))
        {
            let names = crate::sim::Mutation::NAMES.join(", ");
            return Err(("mutations", format!("unknown mutation \"{unknown}\": expected some of {names}")));
        }
        if !(10..=ROWS_MAX).contains(&self.rows_max) {
            return Err(("rows_max", format!("{} must be within 10..={ROWS_MAX}", self.rows_max)));
        }
        Ok(())
    }

    /// The version label of these ranges, `swarm-v{DRAW_VERSION}-{hash}`: sweeps record it, and shards of one
    /// swarm must agree on it (every world is a function of the ranges, the seed and the drawing code).
    pub fn version_label(&self) -> String {
        let hash = fnv1a64(format!("{self:?}").as_bytes());
        format!("swarm-v{}-{hash:016x}", super::DRAW_VERSION)
    }
}

/// The fault kinds named in `names` (the kinds' trace names, `none` for no kind at all).
///
/// Errors: a name that is no kind, listing the kinds.
pub fn parse_kinds<S: AsRef<str>>(names: &[S]) -> Result<Vec<FaultKind>, String> {
    let mut kinds = Vec::new();
    for name in names {
        let name = name.as_ref().trim();
        if name == "none" {
            continue;
        }
        let kind = FaultKind::from_name(name).ok_or_else(|| {
            let all: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.name()).collect();
            format!("unknown fault kind \"{name}\": expected none or some of {}", all.join(", "))
        })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

/// The shapes named in `names` (`rows`, `gang`, `mixed`).
///
/// Errors: a name that is no shape.
pub fn parse_shapes<S: AsRef<str>>(names: &[S]) -> Result<Vec<Shape>, String> {
    let mut shapes = Vec::new();
    for name in names {
        let shape = Shape::from_name(name.as_ref().trim())?;
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    }
    Ok(shapes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_ranges_file_is_the_default() {
        assert_eq!(Ranges::parse("", "r.toml").unwrap(), Ranges::default());
        assert!(Ranges::default().check().is_ok());
    }

    #[test]
    fn a_ranges_file_sets_what_it_names() {
        let text = "replicas = [2, 2]\nshapes = [\"gang\"]\nkinds = [\"agent-kill\", \"pause\"]\noverload = 5.0\n\
                    lease_ttl = [\"5s\", \"6s\"]\n";
        let ranges = Ranges::parse(text, "r.toml").unwrap();
        assert_eq!(ranges.replicas, 2..=2);
        assert_eq!(ranges.shapes, vec![Shape::Gang]);
        assert_eq!(ranges.kinds, vec![FaultKind::AgentKill, FaultKind::Pause]);
        assert_eq!(ranges.overload, 5.0);
        assert_eq!(ranges.lease_ttl, Duration::from_secs(5)..=Duration::from_secs(6));
        assert_ne!(ranges.version_label(), Ranges::default().version_label(), "other ranges, another label");
    }

    #[test]
    fn a_bad_ranges_file_names_the_key_and_the_rule() {
        let error = Ranges::parse("replicas = [3, 1]\n", "r.toml").unwrap_err();
        assert!(error.starts_with("r.toml:1:12: replicas: "), "{error}");
        assert!(error.contains("empty"), "{error}");
        let error = Ranges::parse("kinds = [\"kil\"]\n", "r.toml").unwrap_err();
        assert!(error.contains("kinds: unknown fault kind \"kil\""), "{error}");
        let error = Ranges::parse("replica = [1, 2]\n", "r.toml").unwrap_err();
        assert!(error.contains("unknown field `replica`"), "{error}");
        assert!(error.starts_with("r.toml:1:1: "), "{error}");
        let error = Ranges::parse("shapes = [\"rows\"]\nreplicas = [1]\n", "r.toml").unwrap_err();
        assert!(error.starts_with("r.toml:2:12: "), "the line and column of the value: {error}");
        assert!(error.contains("replicas = [1]"), "the line itself: {error}");
        // A value that parses but breaks its rule is shown where it is written too.
        let error = Ranges::parse("# ranges\nreplicas = [4, 1]\n", "r.toml").unwrap_err();
        assert!(error.starts_with("r.toml:2:12: replicas: "), "the line and column of the value: {error}");
        assert!(error.contains("    2 | replicas = [4, 1]"), "the line itself: {error}");
        let twice = Ranges::parse("mutations = [\"waitlist_disabled\", \"waitlist_disabled\"]\n", "r.toml").unwrap();
        assert_eq!(twice.mutations, ["waitlist_disabled"], "a mutation named twice is planted once");
        let error = Ranges::parse("overload = 99.0\n", "r.toml").unwrap_err();
        assert!(error.contains("overload: 99 must be within 0..=20"), "{error}");
    }
}
