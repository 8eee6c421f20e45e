//! Shrinking a failure (`lockstep sim shrink`): from a failing scenario and seed, a smaller scenario
//! that fails the same checker.
//!
//! The search is greedy. Each step builds the candidates of [`moves`] from the current scenario (drop, shorten
//! or move a fault; fewer operations, jobs, rows, replicas, agents; shorter spans; the family of the last step's
//! move first), runs them, each a normal run
//! of its scenario file under the current seed, on `jobs` threads, and keeps the first candidate in their order
//! that still fails the checker; when none does, it tries them under other seeds (`1..=other_seeds`; every
//! scenario's randomness comes from its seed) before it stops. "The first in order" makes the result
//! independent of how the threads interleave: a step waits for every candidate before the winner, and skips
//! those after it. A wall-clock bound stops the search between steps (the result is then the smallest found so
//! far, and says so); without it the search ends because every move makes one quantity strictly smaller.
//!
//! The scenario is edited as its TOML table (`toml::Table`, keys in the file's order), with its spec files
//! inlined, `seeds = [seed]` and the name `{name}-shrunk`; the result is written back as TOML under a header
//! saying what it was shrunk from, which checker it fails and each step ([`Shrunk::text`]).

pub mod moves;

use super::run::{self, RunReport};
use super::scenario_file::gang::SpecSource;
use super::scenario_file::{NAME_LEN_MAX, PipelineSets, ScenarioError, ScenarioFile};
use crate::text::count;
use moves::{Candidate, Current};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use toml::{Table, Value};

/// The search's wall-clock bound unless the caller gives one (`--time`): a soak scenario's runs take about a
/// second each in release on this project's 2-core machines, and a shrink of one takes a few hundred.
pub const TIME_BOUND_DEFAULT: Duration = Duration::from_secs(600);

/// Seeds tried (`1..=N`) for a step whose candidates all pass under the current seed.
pub const OTHER_SEEDS_DEFAULT: u64 = 4;

/// Steps one search takes at most (each makes the scenario strictly smaller; this only bounds a bug).
pub const STEPS_MAX: usize = 1_000;

/// What must keep failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// This checker reports a violation.
    Checker(String),
    /// The run panics (an engine assertion, a hang past the time limit).
    Panic,
}

impl Target {
    /// Whether `report` fails this way.
    pub fn hit(&self, report: &RunReport) -> bool {
        match self {
            Target::Checker(checker) => report.violated(checker),
            Target::Panic => report.panic.is_some(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Checker(checker) => write!(f, "checker {checker}"),
            Target::Panic => write!(f, "a panic"),
        }
    }
}

/// What to shrink.
pub struct Input<'a> {
    /// The scenario file's text.
    pub text: &'a str,
    /// The text of every spec file it reads, by the path it writes (a replay file's `spec_files`, or
    /// [`ScenarioFile::spec_files`]).
    pub spec_files: &'a BTreeMap<String, String>,
    /// Where it came from (a replay file's or scenario file's path), for the header and errors.
    pub origin: &'a str,
    /// The failing seed.
    pub seed: u64,
    /// The binary's pipeline sets (the scenario's `pipelines` key).
    pub sets: &'a PipelineSets,
    /// The checker to keep failing; default the first that failed (or the panic).
    pub checker: Option<&'a str>,
    /// How a user runs the binary's simulator commands (`env -u RUSTFLAGS cargo sim`,
    /// [`Registry::with_invocation`](super::cli::Registry::with_invocation)), for the command the header gives.
    pub invocation: &'a str,
    /// The directory the shrunk file is written to ([`file_path`]), for the command the header gives.
    pub out: &'a Path,
}

/// The name of scenario `name` shrunk: `{name}-shrunk`, cut to the longest name a scenario may have.
pub fn shrunk_name(name: &str) -> String {
    let mut shrunk = format!("{name}-shrunk");
    shrunk.truncate(NAME_LEN_MAX);
    shrunk
}

/// Where the shrunk scenario named `name` is written in directory `out`: `{out}/{name}.toml`.
pub fn file_path(out: &Path, name: &str) -> PathBuf {
    out.join(format!("{name}.toml"))
}

/// How to search.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Threads running candidates (at least 1).
    pub jobs: usize,
    /// Wall-clock bound of the search; steps stop once it passed.
    pub time_bound: Duration,
    /// Seeds tried when every candidate passes under the current seed ([`OTHER_SEEDS_DEFAULT`]).
    pub other_seeds: u64,
}

/// How big a scenario is, as the step lines print it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    /// Fixed faults plus random fault processes.
    pub faults: usize,
    /// Operations submitted.
    pub operations: usize,
    /// Rows in the database at the end of its run.
    pub rows: usize,
    /// Replica nodes.
    pub replicas: usize,
    /// Agent nodes.
    pub agents: usize,
    /// Simulated time of its run.
    pub simulated: Duration,
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {}, {}, {}, {}, {:.1} s simulated",
            count(self.faults as u64, "fault"),
            count(self.operations as u64, "operation"),
            count(self.rows as u64, "row"),
            count(self.replicas as u64, "replica"),
            count(self.agents as u64, "agent"),
            self.simulated.as_secs_f64()
        )
    }
}

/// One accepted step.
#[derive(Clone, Debug)]
pub struct Step {
    /// The family of moves it came from ([`moves::Candidate::kind`]).
    pub kind: &'static str,
    /// What it removed or shortened.
    pub what: String,
    /// The seed its run failed under.
    pub seed: u64,
    /// The scenario's size after it.
    pub size: Size,
}

/// What the search reports as it goes.
#[derive(Clone, Debug)]
pub enum Progress<'a> {
    /// A step's candidates are being run: `done` of `total` (a step retried under other seeds counts again).
    Candidates {
        /// Candidates run so far in this step.
        done: usize,
        /// Candidates in this step.
        total: usize,
    },
    /// A step was accepted (its number from 1).
    Accepted(usize, &'a Step),
}

/// A shrunk failure.
#[derive(Debug)]
pub struct Shrunk {
    /// The checker (or panic) it fails.
    pub target: Target,
    /// The failing seed.
    pub seed: u64,
    /// The scenario file's text: the header, then the table.
    pub text: String,
    /// The scenario file parsed from `text` (origin: the input's).
    pub file: ScenarioFile,
    /// Its run under `seed`, which fails `target`.
    pub report: RunReport,
    /// Each accepted step, in order.
    pub steps: Vec<Step>,
    /// The size of the input.
    pub original: Size,
    /// The size of the result.
    pub size: Size,
    /// Candidates run.
    pub runs: usize,
    /// Whether the search ended because no candidate failed (else the time bound stopped it).
    pub complete: bool,
}

/// Why a scenario cannot be shrunk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShrinkError {
    /// The scenario file is invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// It passes under the seed: there is no failure to keep.
    #[error(
        "scenario {name} passes under seed {seed} (every checker ok): there is no failure to shrink; give the \
         replay file of a failing run, or a --seed under which it fails (`sim sweep` finds one)"
    )]
    Passes {
        /// The scenario's name.
        name: String,
        /// The seed.
        seed: u64,
    },
    /// The run outgrew one run ([`RunReport::outgrown`]): nothing judged it, so there is no failure to keep.
    #[error("scenario {name} seed {seed} outgrew one run ({what}): there is no judged failure to shrink; {advice}",
        advice = super::run::OUTGROWN_ADVICE)]
    Outgrown {
        /// The scenario's name.
        name: String,
        /// The seed.
        seed: u64,
        /// What it outgrew.
        what: String,
    },
    /// `--checker` names no checker that judges this scenario.
    #[error("--checker {checker}: no checker of that name judges this scenario; its checkers are: {known}")]
    UnknownChecker {
        /// The name asked for.
        checker: String,
        /// The scenario's checkers, in the order they run.
        known: String,
    },
    /// `--checker` names a checker that did not fail.
    #[error("--checker {checker}: scenario {name} seed {seed} does not fail it; it fails: {failed}")]
    OtherChecker {
        /// The checker asked for.
        checker: String,
        /// The scenario's name.
        name: String,
        /// The seed.
        seed: u64,
        /// What did fail.
        failed: String,
    },
}

/// Shrinks `input`'s failure (see the module docs), calling `progress` as it goes (from the threads that run
/// the candidates, and the calling thread).
///
/// # Errors
/// [`ShrinkError`]: an invalid scenario, one that passes under the seed, or a `checker` it does not fail.
pub fn shrink(
    input: &Input<'_>,
    options: Options,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Shrunk, ShrinkError> {
    let started = Instant::now();
    let file = ScenarioFile::parse_in(input.text, input.origin, SpecSource::Files(input.spec_files), input.sets)?;
    let name = file.scenario.name.clone();
    if let Some(checker) = input.checker {
        let known = run::checker_names(&file.scenario);
        if !known.contains(&checker) {
            return Err(ShrinkError::UnknownChecker { checker: checker.to_string(), known: known.join(", ") });
        }
    }
    let report = run::run(&file.scenario, input.seed);
    let target = target(input, &report)?;
    let original = size_of(&file, &report);
    let mut table = normalized(input, &file)?;
    let mut best = Best { file, report, seed: input.seed };
    // The normalized table (renamed, specs inlined, one seed) is the same scenario; its run is the baseline.
    if let Some(run) = parse(&table, input) {
        let report = run::run(&run.scenario, input.seed);
        if target.hit(&report) {
            best = Best { file: run, report, seed: input.seed };
        }
    }
    let mut steps: Vec<Step> = Vec::new();
    let mut runs = 0;
    let deadline = started + options.time_bound;
    let mut complete = false;
    while steps.len() < STEPS_MAX && Instant::now() < deadline {
        let trace = best.report.trace_text();
        let current = Current {
            table: &table,
            trace: &trace,
            rows_inserted: best.report.client.rows(),
            replicas: best.file.scenario.replicas,
            agents: best.file.scenario.agents(),
            slots: best.file.scenario.gang.as_ref().map_or(1, |gang| gang.slots),
            keep_expectations: target == Target::Checker("expect".into()),
        };
        let candidates = moves::candidates(&current, steps.last().map_or("", |step| step.kind));
        let mut seeds = vec![best.seed];
        seeds.extend((1..=options.other_seeds).filter(|seed| *seed != best.seed));
        let mut accepted = None;
        let mut timed_out = false;
        for seed in seeds {
            let found = first_failing(&candidates, seed, input, &target, options.jobs, deadline, progress);
            runs += found.runs;
            timed_out = found.timed_out;
            if let Some(winner) = found.winner {
                accepted = Some((winner, seed));
                break;
            }
            if timed_out {
                break;
            }
        }
        let Some(((index, file, report), seed)) = accepted else {
            complete = !timed_out;
            break;
        };
        table = candidates[index].table.clone();
        best = Best { file, report, seed };
        let (kind, what) = (candidates[index].kind, candidates[index].what.clone());
        let step = Step { kind, what, seed, size: size_of(&best.file, &best.report) };
        progress(Progress::Accepted(steps.len() + 1, &step));
        steps.push(step);
    }
    table.insert("seeds".into(), Value::Array(vec![Value::Integer(best.seed as i64)]));
    let shrunk_name = table.get("name").and_then(Value::as_str).unwrap_or(&name);
    let path = file_path(input.out, shrunk_name).display().to_string();
    let run = super::shell::command(input.invocation, &["run", &path, "--seed", &best.seed.to_string()]);
    let rerun = format!("under seed {}: `{run}`", best.seed);
    let text = render(&table, &header(input, &name, &target, &rerun, &steps, &original, complete));
    let file = ScenarioFile::parse_in(&text, input.origin, SpecSource::Files(&BTreeMap::new()), input.sets)?;
    let size = size_of(&file, &best.report);
    Ok(Shrunk { target, seed: best.seed, text, file, report: best.report, steps, original, size, runs, complete })
}

/// The current smallest failing scenario.
struct Best {
    file: ScenarioFile,
    report: RunReport,
    seed: u64,
}

fn target(input: &Input<'_>, report: &RunReport) -> Result<Target, ShrinkError> {
    let failed = || {
        let mut names: Vec<String> = report.violations.iter().map(|v| v.checker.to_string()).collect();
        if report.panic.is_some() {
            names.push("a panic".into());
        }
        names.dedup();
        names.join(", ")
    };
    if report.passed() {
        return Err(ShrinkError::Passes { name: report.scenario.clone(), seed: input.seed });
    }
    if let Some(what) = &report.outgrown {
        return Err(ShrinkError::Outgrown { name: report.scenario.clone(), seed: input.seed, what: what.clone() });
    }
    match input.checker {
        Some(checker) if !report.violated(checker) => Err(ShrinkError::OtherChecker {
            checker: checker.to_string(),
            name: report.scenario.clone(),
            seed: input.seed,
            failed: failed(),
        }),
        Some(checker) => Ok(Target::Checker(checker.to_string())),
        None => Ok(report.violations.first().map_or(Target::Panic, |v| Target::Checker(v.checker.to_string()))),
    }
}

fn size_of(file: &ScenarioFile, report: &RunReport) -> Size {
    let scenario = &file.scenario;
    Size {
        faults: scenario.faults.fixed.len() + scenario.faults.random.len(),
        operations: scenario.gang.as_ref().map_or(0, |gang| gang.operations.len()),
        rows: report.rows,
        replicas: scenario.replicas,
        agents: scenario.agents(),
        simulated: report.simulated,
    }
}

/// The input's table, renamed `{name}-shrunk`, with `seeds = [seed]` and every `spec_file` inlined as `spec`
/// (with its `format` from the file's extension), so that the result stands alone.
fn normalized(input: &Input<'_>, file: &ScenarioFile) -> Result<Table, ShrinkError> {
    let mut table: Table = input.text.parse().map_err(|error: toml::de::Error| ScenarioError::Read {
        origin: input.origin.to_string(),
        message: error.to_string(),
    })?;
    table.insert("name".into(), Value::String(shrunk_name(&file.scenario.name)));
    table.insert("seeds".into(), Value::Array(vec![Value::Integer(input.seed as i64)]));
    for key in ["operations", "controls"] {
        let Some(list) = table.get_mut(key).and_then(Value::as_array_mut) else { continue };
        for entry in list.iter_mut().filter_map(Value::as_table_mut) {
            let Some(Value::String(path)) = entry.remove("spec_file") else { continue };
            let text = file.spec_files.get(&path).cloned().unwrap_or_default();
            if !entry.contains_key("format") {
                let format = match Path::new(&path).extension().and_then(|ext| ext.to_str()) {
                    Some("json") => Some("json"),
                    Some("yaml" | "yml") => Some("yaml"),
                    _ => None,
                };
                if let Some(format) = format {
                    entry.insert("format".into(), Value::String(format.into()));
                }
            }
            entry.insert("spec".into(), Value::String(text));
        }
    }
    Ok(table)
}

fn render(table: &Table, header: &str) -> String {
    let body = toml::to_string(table).expect("a scenario table serializes");
    format!("{header}{body}")
}

fn parse(table: &Table, input: &Input<'_>) -> Option<ScenarioFile> {
    let text = render(table, "");
    ScenarioFile::parse_in(&text, input.origin, SpecSource::Files(&BTreeMap::new()), input.sets).ok()
}

/// The outcome of one step's candidates under one seed.
struct Found {
    winner: Option<(usize, ScenarioFile, RunReport)>,
    runs: usize,
    timed_out: bool,
}

/// The first of `candidates` (in order) whose run under `seed` fails `target`. Runs them on `jobs` threads,
/// skipping those after a known failure; a winner counts only if every candidate before it ran (so that the
/// answer never depends on the threads' timing), so the deadline may leave none.
fn first_failing(
    candidates: &[Candidate],
    seed: u64,
    input: &Input<'_>,
    target: &Target,
    jobs: usize,
    deadline: Instant,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Found {
    let next = AtomicUsize::new(0);
    let first = AtomicUsize::new(usize::MAX);
    let done = AtomicUsize::new(0);
    let ran: Vec<AtomicBool> = candidates.iter().map(|_| AtomicBool::new(false)).collect();
    let winners: Mutex<BTreeMap<usize, (ScenarioFile, RunReport)>> = Mutex::default();
    let total = candidates.len();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(total.max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::SeqCst);
                    if index >= total || index > first.load(Ordering::SeqCst) || Instant::now() >= deadline {
                        break;
                    }
                    if let Some(file) = parse(&candidates[index].table, input) {
                        let report = run::run(&file.scenario, seed);
                        if target.hit(&report) {
                            first.fetch_min(index, Ordering::SeqCst);
                            winners.lock().unwrap_or_else(|p| p.into_inner()).insert(index, (file, report));
                        }
                    }
                    ran[index].store(true, Ordering::SeqCst);
                    let now = done.fetch_add(1, Ordering::SeqCst) + 1;
                    progress(Progress::Candidates { done: now, total });
                }
            });
        }
    });
    let runs = done.load(Ordering::SeqCst);
    let mut winners = winners.into_inner().unwrap_or_else(|p| p.into_inner());
    let winner = winners.pop_first().filter(|(index, _)| ran[..*index].iter().all(|r| r.load(Ordering::SeqCst)));
    let timed_out = Instant::now() >= deadline && winner.is_none();
    Found { winner: winner.map(|(index, (file, report))| (index, file, report)), runs, timed_out }
}

/// The comment header of the shrunk file; `rerun` says under which seed it fails, with the command that runs it.
fn header(
    input: &Input<'_>,
    name: &str,
    target: &Target,
    rerun: &str,
    steps: &[Step],
    original: &Size,
    complete: bool,
) -> String {
    let mut text = format!(
        "# Shrunk by `{}` from {} (scenario {name}, seed {}), which fails {target}.\n\
         # This scenario fails {target} too, {rerun}.\n\
         # Before: {original}.\n",
        super::shell::command(input.invocation, &["shrink"]),
        input.origin,
        input.seed
    );
    match steps.len() {
        0 => text.push_str("# No smaller scenario failed the same way.\n"),
        steps => text.push_str(&format!("# {}:\n", count(steps as u64, "step"))),
    }
    for (index, step) in steps.iter().enumerate() {
        let seed = if step.seed == input.seed { String::new() } else { format!(" [seed {}]", step.seed) };
        text.push_str(&format!("#  {}. {}{seed}\n", index + 1, step.what));
    }
    if let Some(last) = steps.last() {
        text.push_str(&format!("# After: {}.\n", last.size));
    }
    if !complete {
        text.push_str("# The search's time bound stopped it: a smaller scenario may still fail the same way.\n");
    }
    text.push('\n');
    text
}
