//! The simulator's command line (simulator build only; the plain build's `cargo doc` shows it): `run | sweep |
//! swarm | merge | replay | explain | shrink` over scenario files: scenario files run under a seed, many seeds on
//! every core (or one shard of them per machine, merged from their result files: [`super::sweep`]), failing seeds
//! written as replay files and replayed exactly, one operation's or row's timeline read back from a trace (or a
//! run's as an HTML page), and a failure shrunk to a smaller scenario. lockstep's own binary (`lockstep sim …`)
//! and a user's own (a binary that registers its [`PipelineSet`]s and calls
//! [`main`]) are both a [`Registry`] handed to [`execute`]. The work is in the library ([`super::scenario_file`],
//! [`super::summary`], [`super::replay`], [`super::explain`]); this module parses arguments, prints and picks
//! the exit code.
//!
//! A user's binary, whole (`examples/user-pipelines/src/bin/orders-sim.rs`):
//!
//! ```ignore
//! fn main() -> std::process::ExitCode {
//!     let registry = lockstep::sim::cli::Registry::new("orders-sim")
//!         .with(user_pipelines::orders(user_pipelines::Idempotency::On));
//!     lockstep::sim::cli::main(registry)
//! }
//! ```
//!
//! Its scenario files name a set with `pipelines = "orders"` and run with `orders-sim run FILE`.

use super::explain;
use super::files;
use super::replay::{ReplayFile, ReplayScenario, trace_identity};
use super::run::summary;
use super::scenario_file::PipelineSets;
use super::shell;
use super::shrink;
use super::summary::render;
use super::swarm;
use super::sweep::{self, Failures, Line, SeedRecord, Seeds, Shard, Tally};
use super::timeline;
use super::user::PipelineSet;
use super::{RunReport, ScenarioFile};
use crate::sim;
use crate::text::count;
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// lockstep's build id, recorded in replay files (set by `build.rs` from a hash of the sources, the compiler, the
/// profile and the simulator cfg).
pub const BUILD_ID: &str = env!("LOCKSTEP_BUILD_ID");

/// What a binary's simulator commands know: its name in messages, its build id (replay files record it and
/// `replay` refuses another's), and the pipeline sets its scenario files may name.
#[derive(Clone, Debug)]
pub struct Registry {
    program: String,
    invocation: String,
    build_id: String,
    sets: PipelineSets,
}

impl Registry {
    /// lockstep's own: `lockstep sim`, lockstep's build id, no pipeline set (its scenarios run the built-in
    /// workload and gang controller).
    pub fn builtin() -> Registry {
        Registry {
            program: "lockstep sim".into(),
            invocation: "env -u RUSTFLAGS cargo sim".into(),
            build_id: BUILD_ID.into(),
            sets: PipelineSets::new(),
        }
    }

    /// A user's binary named `program` (in messages and the commands it prints), with no set yet. Its build id
    /// is lockstep's followed by `+{program}`: give one that changes with your code too
    /// ([`Registry::with_build_id`]), or a replay file may be replayed by a build of other handlers.
    pub fn new(program: impl Into<String>) -> Registry {
        let program = program.into();
        let build_id = format!("{BUILD_ID}+{program}");
        Registry { invocation: program.clone(), program, build_id, sets: PipelineSets::new() }
    }

    /// The same registry printing `invocation` where it tells how to run a command again (`{invocation} replay
    /// FILE`): how a user reaches this binary, e.g. `env -u RUSTFLAGS cargo sim` with the `sim` alias of
    /// `examples/user-pipelines/cargo-config.toml`. Default: the program's name.
    pub fn with_invocation(mut self, invocation: &str) -> Registry {
        self.invocation = invocation.to_string();
        self
    }

    /// The same registry with `set` (scenario files name it: `pipelines = "{set name}"`).
    ///
    /// Panics if a set of that name is registered already (two sets of one name are a bug of the binary).
    pub fn with(mut self, set: PipelineSet) -> Registry {
        let name = set.name().to_string();
        assert!(self.sets.insert(name.clone(), set).is_none(), "pipeline set {name} is registered twice");
        self
    }

    /// The same registry with build id `lockstep's + "+" + id`: give one that follows your sources, as
    /// `examples/user-pipelines/build.rs` makes (a build script of `std` only that hashes them into an environment
    /// variable the binary reads with `env!`). A replay file of another id is refused with the command that runs its
    /// scenario again; an id that stays the same while your handlers change lets `replay` run other code.
    pub fn with_build_id(mut self, id: &str) -> Registry {
        self.build_id = format!("{BUILD_ID}+{id}");
        self
    }

    /// The build id replay files record.
    pub fn build_id(&self) -> &str {
        &self.build_id
    }

    /// The registered pipeline sets, by name.
    pub fn sets(&self) -> &PipelineSets {
        &self.sets
    }

    /// The command a user pastes to run this binary's simulator command `args` ("replay it with: …"): the
    /// invocation ([`Registry::with_invocation`]), then `args`, quoted for the shell ([`shell::command`]).
    pub fn command<S: AsRef<str>>(&self, args: &[S]) -> String {
        shell::command(&self.invocation, args)
    }
}

/// The arguments of a simulator binary: `PROGRAM run | sweep | swarm | merge | replay | explain | shrink …`.
#[derive(clap::Parser)]
#[command(about = "Scenario files of this project's pipelines under lockstep's deterministic simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The simulator command `args` name (the program's name first), as [`main`] parses a binary's own arguments
/// and `lockstep sim` parses what follows `sim`. Errors: clap's, as it would print them. Tests check the commands
/// the binaries print ([`Registry::command`]) with it.
pub fn try_parse_from<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args).map(|cli| cli.command)
}

/// A user's simulator binary: parses the process's arguments as `PROGRAM run | sweep | swarm | merge | replay | explain |
/// shrink …`, runs the command with `registry`, and returns the exit code (0 passed, 1 a check failed, 2 bad
/// input, 3 a replay that did not reproduce, 4 a merged sweep with seeds missing, 130 an interrupted sweep).
pub fn main(registry: Registry) -> ExitCode {
    crate::interrupt::end_quietly_on_a_closed_pipe();
    let cli = Cli::parse();
    execute(cli.command, &registry)
}

/// Every check passed (and a replay matched its trace).
const PASSED: u8 = 0;
/// A check or expectation failed (a replay reproduced a failure), or `explain` found nothing.
const FAILED: u8 = 1;
/// Bad input: an invalid scenario or replay file, a replay file of another build or scenario version.
const BAD_INPUT: u8 = 2;
/// A replay ran but its trace hash differs from the recorded one.
const NOT_REPRODUCED: u8 = 3;
/// `merge`: no seed failed, but seeds of the sweep are missing (a shard missing, killed or interrupted).
const INCOMPLETE: u8 = 4;
/// A sweep stopped by Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention), after printing the table of the
/// seeds that finished.
const INTERRUPTED: u8 = 130;

/// Where sweeps' result files go unless `--results` says otherwise.
const RESULTS_DIR: &str = "lockstep-sweeps";

/// Where failing seeds' replay files go unless `--out` says otherwise.
const REPLAY_DIR: &str = "lockstep-replays";

/// The simulator commands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Run a scenario file under one seed and print what happened; exit 1 if a check failed (and write a
    /// replay file).
    Run(RunArgs),
    /// Run a scenario file under a range of seeds (or one shard of it) on every core, streaming each finished
    /// seed to a result file; exit 1 if any failed (each written as a replay file as it fails), 130 if
    /// interrupted (Ctrl-C: the table of what finished is printed).
    Sweep(SweepArgs),
    /// Run a swarm: each seed draws its own world (topology, pipelines' knobs, workload from idle to overload,
    /// operations, a random subset of fault kinds) within ranges, and every checker judges it; as `sweep` for a
    /// range of seeds (with the coverage of fault kinds and engine paths), as `run` for one `--seed`, and
    /// `--seed N --emit` prints the seed's world as a scenario file.
    Swarm(SwarmArgs),
    /// Print the table of a whole sweep from its shards' result files (`sweep --shard K/N`); exit 1 if a seed
    /// failed (its replay file is written from the result file), 2 if the files are not shards of one sweep, 4
    /// if seeds are missing.
    Merge(MergeArgs),
    /// Rerun a replay file's seed and check that the trace is byte for byte the same (same hash).
    Replay(ReplayArgs),
    /// Print the timeline of one operation (or row) from a trace file, or write the whole trace's timeline as an
    /// HTML page (`--html`).
    Explain(ExplainArgs),
    /// Search for a smaller scenario that fails the same checker as a replay file's (or a scenario file's seed),
    /// and write it with its replay file.
    Shrink(ShrinkArgs),
}

/// `sim run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The scenario file (TOML).
    scenario: PathBuf,
    /// The seed; default the first of the file's `seeds`.
    #[arg(long)]
    seed: Option<u64>,
    /// Write the whole trace to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write the run's timeline to this file: one self-contained HTML page (lanes per node, operation,
    /// allocation and row; faults, leases, jobs, processes, verdicts).
    #[arg(long)]
    html: Option<PathBuf>,
    /// Directory for the replay file of a failing run.
    #[arg(long, default_value = REPLAY_DIR)]
    out: PathBuf,
}

/// `sim sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// The scenario file (TOML).
    scenario: PathBuf,
    /// Seeds: `A..B` (B excluded) or `A..=B`; at most 1 000 000 of them.
    #[arg(long, value_parser = parse_seeds)]
    seeds: SeedRange,
    #[command(flatten)]
    options: SweepOptions,
}

/// What `sim sweep` and `sim swarm` share: threads, where failures and results go, the shard.
#[derive(clap::Args)]
pub struct SweepOptions {
    /// Threads (at least 1, at most 4 × the cores this process may use); default every core (or
    /// `LOCKSTEP_SIM_JOBS`).
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Directory for the failing seeds' replay files.
    #[arg(long, default_value = REPLAY_DIR)]
    out: PathBuf,
    /// Directory for a timeline page (HTML) of each failing seed, `{scenario}-seed-{seed}.html` (`swarm --seed N`:
    /// the file of that one run's page).
    #[arg(long)]
    html: Option<PathBuf>,
    /// Run only the K-th (from 0) of N disjoint slices of the seeds: those with (seed - A) % N == K. Default:
    /// from the engine's variables (JOB_COMPLETION_INDEX with LOCKSTEP_SHARD_COUNT; SLURM_ARRAY_TASK_ID with
    /// SLURM_ARRAY_TASK_COUNT; YT_JOB_COOKIE with YT_TASK_JOB_COUNT), else every seed.
    #[arg(long, value_parser = Shard::parse)]
    shard: Option<Shard>,
    /// Directory for the result file, `{scenario}-seeds-{A}-{B}[-shard-{K}-of-{N}].sweep.jsonl`: JSON lines, one
    /// per seed as it finishes (`sim merge` reads them). A file of that name is replaced.
    #[arg(long, default_value = RESULTS_DIR)]
    results: PathBuf,
}

/// `sim swarm`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").args(["seeds", "seed"])))]
pub struct SwarmArgs {
    /// Seeds to sweep: `A..B` (B excluded) or `A..=B`; default 1..=100.
    #[arg(long, value_parser = parse_seeds)]
    seeds: Option<SeedRange>,
    /// One seed: run its world and print what happened, as `run` does (or print the world with `--emit`).
    #[arg(long)]
    seed: Option<u64>,
    /// With `--seed`: print the seed's world as a scenario file (TOML) instead of running it.
    #[arg(long, requires = "seed", conflicts_with_all = ["trace", "html", "out", "results", "shard", "jobs"])]
    emit: bool,
    /// A ranges file (TOML, every key optional; docs/simulator.md lists them) in place of the default ranges.
    #[arg(long)]
    ranges: Option<PathBuf>,
    /// The most replicas a world may have (narrows the ranges' `replicas`).
    #[arg(long)]
    max_replicas: Option<usize>,
    /// The highest row arrival rate, as a multiple of the workers' capacity (0: every world idle).
    #[arg(long)]
    overload: Option<f64>,
    /// The fault kinds a world may switch on, comma-separated (`none`: no faults); `agent-clock-beyond-margin` (a
    /// known violation of rank exclusivity) is on only when named here.
    #[arg(long, value_delimiter = ',')]
    kinds: Option<Vec<String>>,
    /// The world shapes to draw, comma-separated: rows, gang, mixed.
    #[arg(long, value_delimiter = ',')]
    shapes: Option<Vec<String>>,
    /// A pipeline set this binary registers, run by the row worlds in place of the built-in rows.
    #[arg(long)]
    pipelines: Option<String>,
    /// TEST ONLY: plant these bugs (`[mutation]` keys, comma-separated) in every world, to see how soon the swarm
    /// finds them.
    #[arg(long, value_delimiter = ',')]
    mutation: Option<Vec<String>>,
    /// With `--seed`: write the whole trace to this file.
    #[arg(long, requires = "seed")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    options: SweepOptions,
}

/// `sim merge`.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// The shards' result files, or directories holding them (their `*.jsonl` files).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Directory for the failing seeds' replay files (each result file carries its failures' replay files).
    #[arg(long, default_value = REPLAY_DIR)]
    out: PathBuf,
}

/// `sim replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The replay file (JSON, written by `sim run` or `sim sweep`).
    file: PathBuf,
    /// Write the rerun's whole trace to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write the rerun's timeline to this file (HTML, as `run --html`).
    #[arg(long)]
    html: Option<PathBuf>,
}

/// `sim explain`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("subject").args(["operation", "row"])))]
#[command(group(clap::ArgGroup::new("what").args(["operation", "row", "html"]).required(true).multiple(true)))]
pub struct ExplainArgs {
    /// The trace file (`sim run --trace FILE`).
    trace: PathBuf,
    /// The operation's row id (a number): lines whose fields hold the token `op=ID`.
    #[arg(long, value_parser = parse_row_id)]
    operation: Option<String>,
    /// A row id (a number): lines whose fields hold `id=ID` or `row=ID`, and store commits naming the row or its
    /// lease.
    #[arg(long, value_parser = parse_row_id)]
    row: Option<String>,
    /// Write the trace's timeline to this file (HTML, as `run --html`, without verdicts); with `--operation` or
    /// `--row` it opens filtered to that operation or row.
    #[arg(long)]
    html: Option<PathBuf>,
}

/// `sim shrink`.
#[derive(clap::Args)]
pub struct ShrinkArgs {
    /// A replay file (JSON, from `sim run` or `sim sweep`), or a scenario file (TOML) with the failing `--seed`.
    file: PathBuf,
    /// For a scenario file: the failing seed (default the file's first).
    #[arg(long)]
    seed: Option<u64>,
    /// The checker that must keep failing (default the first that failed).
    #[arg(long)]
    checker: Option<String>,
    /// Threads running candidates (at least 1, at most 4 × the cores this process may use); default every core
    /// (or `LOCKSTEP_SIM_JOBS`).
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Wall-clock bound on the search (a duration: `90s`, `5m`); the smallest scenario found by then is written.
    #[arg(long, value_parser = crate::duration::parse, default_value = "10m")]
    time: std::time::Duration,
    /// When no candidate fails under the current seed, try them under seeds 1..=N too (0: never another seed).
    #[arg(long, default_value_t = shrink::OTHER_SEEDS_DEFAULT)]
    other_seeds: u64,
    /// Directory for the shrunk scenario file, `{name}-shrunk.toml`, and its replay file,
    /// `{name}-shrunk-seed-{seed}.replay.json`. If it holds either already (of any seed), shrink refuses before
    /// searching (exit 2), unless --force.
    #[arg(long, default_value = SHRUNK_DIR)]
    out: PathBuf,
    /// Replace the shrunk scenario file and its replay file if --out holds them already.
    #[arg(long)]
    force: bool,
}

/// Where `shrink` writes unless `--out` says otherwise.
const SHRUNK_DIR: &str = "lockstep-shrunk";

/// The most seeds one sweep runs: a larger range is refused at parse time (exit 2) instead of being listed in
/// memory (at about a second a seed, a million seeds is already days of work; split larger sweeps).
pub const MAX_SWEEP_SEEDS: u64 = 1_000_000;

/// A range of seeds, `first..=last` (both included; never more than [`MAX_SWEEP_SEEDS`] seeds).
#[derive(Clone, Debug)]
pub struct SeedRange {
    first: u64,
    last: u64,
}

impl SeedRange {
    /// The range as a sweep runs it.
    fn seeds(&self) -> Seeds {
        Seeds { first: self.first, last: self.last }
    }
}

fn parse_seeds(text: &str) -> Result<SeedRange, String> {
    let bad = || format!("\"{text}\" is not a seed range: write A..B (B excluded) or A..=B, e.g. 1..101");
    let (first, end, inclusive) = match text.split_once("..=") {
        Some((first, end)) => (first, end, true),
        None => text.split_once("..").map(|(first, end)| (first, end, false)).ok_or_else(bad)?,
    };
    let seed = |part: &str| -> Result<u64, String> {
        let part = part.trim();
        match part.parse::<u64>() {
            Ok(seed) => Ok(seed),
            Err(_) if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) => {
                Err(format!("\"{text}\": seed {part} overflows: seeds are 0..={}", u64::MAX))
            }
            Err(_) => Err(bad()),
        }
    };
    let (first, end) = (seed(first)?, seed(end)?);
    let last = if inclusive {
        end
    } else {
        end.checked_sub(1)
            .filter(|last| *last >= first)
            .ok_or_else(|| format!("\"{text}\" holds no seed: the end must be past the start"))?
    };
    if last < first {
        return Err(format!("\"{text}\" holds no seed: the end must not be before the start"));
    }
    let count = u128::from(last - first) + 1;
    if count > u128::from(MAX_SWEEP_SEEDS) {
        return Err(format!(
            "\"{text}\" holds {count} seeds; a sweep runs at most {MAX_SWEEP_SEEDS}: split it into several sweeps"
        ));
    }
    Ok(SeedRange { first, last })
}

/// A row id as `explain` takes it: a whole number (operations and rows are numbered, e.g. `op=7` in a summary).
fn parse_row_id(text: &str) -> Result<String, String> {
    match text.parse::<i64>() {
        Ok(id) => Ok(id.to_string()),
        Err(_) => Err(format!("\"{text}\" is not a row id: ids are numbers, e.g. 7 for `op=7` in `sim run`'s summary")),
    }
}

/// How many threads per core `--jobs` may ask for ([`jobs_max`]).
pub const JOBS_PER_CORE_MAX: usize = 4;

/// The most threads a sweep or shrink runs: [`JOBS_PER_CORE_MAX`] × the cores this process may use
/// ([`std::thread::available_parallelism`], which respects CPU affinity and cgroup quotas). A run keeps one core
/// busy (the simulation is CPU-bound, with no I/O to wait on), so threads past the cores add memory (a simulated
/// world each) and no speed; four per core leaves room for a core count read too low (a quota rounded down) while
/// refusing a typo such as `--jobs 100000`, which started that many threads.
pub fn jobs_max() -> usize {
    JOBS_PER_CORE_MAX * std::thread::available_parallelism().map_or(1, |cores| cores.get())
}

/// A `--jobs` value: a whole number of threads, at least 1 and at most [`jobs_max`].
fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("0 threads: give at least 1".into()),
        Ok(jobs) if jobs > jobs_max() => Err(format!(
            "{jobs} threads: at most {}, {JOBS_PER_CORE_MAX} × the {} this process may use (a run keeps a core \
             busy: threads past the cores add memory, not speed)",
            jobs_max(),
            count((jobs_max() / JOBS_PER_CORE_MAX) as u64, "core")
        )),
        Ok(jobs) => Ok(jobs),
        Err(_) => Err(format!("\"{text}\" is not a number of threads: give a whole number, at least 1")),
    }
}

/// Threads of a sweep or shrink: `--jobs`, else `LOCKSTEP_SIM_JOBS` (refused as `--jobs` is when it is not a whole
/// number ≥ 1), else every core this process may use.
fn threads(jobs: Option<usize>) -> Result<usize, String> {
    match (jobs, std::env::var("LOCKSTEP_SIM_JOBS")) {
        (Some(jobs), _) => Ok(jobs),
        (None, Ok(text)) => parse_jobs(&text).map_err(|rule| format!("LOCKSTEP_SIM_JOBS: {rule}")),
        (None, Err(_)) => Ok(sim::run::jobs()),
    }
}

/// Runs one simulator command with `registry`; returns the exit code.
pub fn execute(command: Command, registry: &Registry) -> ExitCode {
    if let Err(rule) = sim::run::check_environment() {
        eprintln!("{}: {rule}", registry.program);
        return ExitCode::from(BAD_INPUT);
    }
    ExitCode::from(match command {
        Command::Run(args) => run(args, registry),
        Command::Sweep(args) => sweep(args, registry),
        Command::Swarm(args) => swarm_command(args, registry),
        Command::Merge(args) => merge(args, registry),
        Command::Replay(args) => replay(args, registry),
        Command::Explain(args) => explain(args, registry),
        Command::Shrink(args) => shrink_command(args, registry),
    })
}

fn load(path: &Path, registry: &Registry) -> Result<ScenarioFile, u8> {
    ScenarioFile::load_in(path, &registry.sets).map_err(|error| {
        eprintln!("{}: {error}", registry.program);
        BAD_INPUT
    })
}

fn run(args: RunArgs, registry: &Registry) -> u8 {
    let file = match load(&args.scenario, registry) {
        Ok(file) => file,
        Err(code) => return code,
    };
    // Before any output is created (creating one empties it): no output may be the scenario file, a spec file it
    // names, the replay file a failure writes into --out, or the other output.
    let outputs = trace_and_html(&args.trace, &args.html);
    let dir = args.scenario.parent().unwrap_or(Path::new(""));
    let specs: Vec<PathBuf> = file.spec_files.keys().map(|spec| dir.join(spec)).collect();
    let seed = args.seed.unwrap_or(file.seeds[0]);
    let replay = args.out.join(format!("{}-seed-{seed}.replay.json", file.scenario.name));
    let inputs: Vec<files::Named<'_>> = std::iter::once(("the scenario file", args.scenario.as_path()))
        .chain(specs.iter().map(|spec| ("the spec file", spec.as_path())))
        .chain(std::iter::once(("the replay file it writes on a failure (--out)", replay.as_path())))
        .collect();
    if let Err(code) = check_outputs(&inputs, &outputs, &registry.program) {
        return code;
    }
    if let Err(rule) = files::check_dir(&args.out) {
        eprintln!("{}: refused: --out {rule}", registry.program);
        return BAD_INPUT;
    }
    let trace = match create_trace(args.trace.as_deref(), &registry.program) {
        Ok(trace) => trace,
        Err(code) => return code,
    };
    let html = match create_output(args.html.as_deref(), "timeline", &registry.program) {
        Ok(html) => html,
        Err(code) => return code,
    };
    println!("{} ({}), seed {seed}, build {}", args.scenario.display(), file.version_label(), registry.build_id);
    let report = sim::run(&file.scenario, seed);
    print!("{}", render(&report));
    let title = format!("{} ({}), seed {seed}", args.scenario.display(), file.version_label());
    let page = write_html(html, || timeline::html_of_run(&title, &file.scenario, &report), &registry.program);
    let code = finish(&file, &report, trace, &args.out, registry);
    if code == PASSED { page.err().unwrap_or(PASSED) } else { code }
}

/// An output file (`--html`), created (empty) before the run so that an unwritable path is refused at once
/// (exit 2).
fn create_output(path: Option<&Path>, what: &str, program: &str) -> Result<Option<(PathBuf, std::fs::File)>, u8> {
    let Some(path) = path else { return Ok(None) };
    match std::fs::File::create(path) {
        Ok(file) => Ok(Some((path.to_path_buf(), file))),
        Err(error) => {
            eprintln!("{program}: cannot create the {what} file {}: {error}", path.display());
            Err(BAD_INPUT)
        }
    }
}

/// Writes the page `page` makes to the file [`create_output`] opened, and says where (or why not: exit 1).
fn write_html(
    output: Option<(PathBuf, std::fs::File)>,
    page: impl FnOnce() -> String,
    program: &str,
) -> Result<(), u8> {
    use std::io::Write;
    let Some((path, mut file)) = output else { return Ok(()) };
    match file.write_all(page().as_bytes()).and_then(|()| file.flush()) {
        Ok(()) => {
            println!("timeline written to {}", path.display());
            Ok(())
        }
        Err(error) => {
            eprintln!("{program}: cannot write the timeline to {}: {error}", path.display());
            Err(FAILED)
        }
    }
}

/// The `--trace` file, created (empty) before the run so that an unwritable path is refused at once (exit 2)
/// instead of after the whole simulation.
fn create_trace(path: Option<&Path>, program: &str) -> Result<Option<(PathBuf, std::fs::File)>, u8> {
    create_output(path, "trace", program)
}

/// Writes the run's trace to the file [`create_trace`] opened, and says where (or why not: exit 1).
fn write_trace(trace: Option<(PathBuf, std::fs::File)>, report: &RunReport, program: &str) -> Result<(), u8> {
    use std::io::Write;
    let Some((path, mut file)) = trace else { return Ok(()) };
    match file.write_all(report.trace_text().as_bytes()).and_then(|()| file.flush()) {
        Ok(()) => {
            println!("trace written to {}", path.display());
            Ok(())
        }
        Err(error) => {
            eprintln!("{program}: cannot write the trace to {}: {error}", path.display());
            Err(FAILED)
        }
    }
}

/// The end of `run`: wall time, trace identity, the trace file, and for a failure its replay file.
fn finish(
    file: &ScenarioFile,
    report: &RunReport,
    trace: Option<(PathBuf, std::fs::File)>,
    out: &Path,
    registry: &Registry,
) -> u8 {
    let identity = trace_identity(report);
    println!(
        "wall time: {:.2} s; trace: {} events, hash {}",
        report.wall.as_secs_f64(),
        identity.events,
        identity.hash
    );
    let written = write_trace(trace, report, &registry.program);
    if report.passed() {
        return written.err().unwrap_or(PASSED);
    }
    if report.outgrown.is_some() {
        // Not a failure to replay: the scenario is too large for one run (the summary above says which keys).
        eprintln!("{} run: {}", registry.program, summary(report));
        return BAD_INPUT;
    }
    match write_replay(file, report, out, registry) {
        Ok(path) => {
            let command = registry.command(&["replay", &path.display().to_string()]);
            println!("replay file: {}\nreplay it with: {command}", path.display())
        }
        Err(error) => eprintln!("{}: {error}", registry.program),
    }
    FAILED
}

fn write_replay(file: &ScenarioFile, report: &RunReport, out: &Path, registry: &Registry) -> Result<PathBuf, String> {
    write_replay_file(&ReplayFile::new(file, report, &registry.build_id), out)
}

/// Writes `replay` into `out` (created if missing) under its file name; returns its path.
fn write_replay_file(replay: &ReplayFile, out: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|error| format!("cannot create {}: {error}", out.display()))?;
    let path = out.join(replay.file_name());
    std::fs::write(&path, replay.to_json()).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    Ok(path)
}

fn sweep(args: SweepArgs, registry: &Registry) -> u8 {
    let file = match load(&args.scenario, registry) {
        Ok(file) => file,
        Err(code) => return code,
    };
    let worlds = Worlds::File { path: args.scenario.clone(), file: Box::new(file) };
    sweep_worlds(&worlds, args.seeds.seeds(), &args.options, registry)
}

/// What a sweep runs under each seed: one scenario file, or (`sim swarm`) the world each seed draws.
pub(crate) enum Worlds {
    /// One scenario file, read from `path`.
    File {
        /// Where it was read from.
        path: PathBuf,
        /// The file.
        file: Box<ScenarioFile>,
    },
    /// A swarm: each seed draws its world within `ranges` ([`swarm::draw`]).
    Swarm {
        /// The ranges.
        ranges: Box<swarm::Ranges>,
        /// Where they were read from (`<default ranges>` without a ranges file), with the flags that narrowed
        /// them.
        origin: String,
        /// A user's pipeline set the row worlds run in place of the built-in rows.
        pipelines: Option<String>,
        /// The arguments that draw the same worlds again (`--ranges FILE` and the flags), after `swarm --seed N`.
        redraw: Vec<String>,
    },
}

impl Worlds {
    /// The name of the sweep (result files are named after it).
    fn name(&self) -> &str {
        match self {
            Worlds::File { file, .. } => &file.scenario.name,
            Worlds::Swarm { .. } => swarm::WORLD_NAME,
        }
    }

    /// What the result file's header records: the scenario (or the ranges) and its version label.
    fn identity(&self) -> ReplayScenario {
        match self {
            Worlds::File { file, .. } => ReplayFile::scenario_of(file),
            Worlds::Swarm { ranges, origin, pipelines, .. } => ReplayScenario {
                name: swarm::WORLD_NAME.into(),
                // The pipeline set is part of what is swept: shards of another set's swarm are another sweep.
                version: match pipelines {
                    None => ranges.version_label(),
                    Some(set) => format!("{}+{set}", ranges.version_label()),
                },
                path: origin.clone(),
            },
        }
    }

    /// How the sweep names what it runs: the scenario file's path, or the swarm's ranges.
    fn label(&self) -> String {
        match self {
            Worlds::File { path, .. } => path.display().to_string(),
            Worlds::Swarm { origin, .. } => format!("swarm of {origin}"),
        }
    }

    /// The world of `seed`: the file, or the world the seed draws (parsed) with what the result line says of it.
    /// Errors: a drawn world that is not a valid scenario file (a bug of the drawing code), with its text.
    fn at(
        &self,
        seed: u64,
        sets: &PipelineSets,
        program: &str,
    ) -> Result<(Cow<'_, ScenarioFile>, Option<swarm::World>), String> {
        match self {
            Worlds::File { file, .. } => Ok((Cow::Borrowed(file), None)),
            Worlds::Swarm { ranges, pipelines, redraw, .. } => {
                let mut world = swarm::draw(ranges, seed, pipelines.as_deref());
                // A comment line (no part of the version hash): the command that draws this world again.
                let again: Vec<String> = ["swarm", "--seed", &seed.to_string()]
                    .into_iter()
                    .map(str::to_string)
                    .chain(redraw.iter().cloned())
                    .chain(std::iter::once("--emit".to_string()))
                    .collect();
                let line = format!("# Draw it again: {}\n", shell::command(program, &again));
                let end = world.text.find('\n').map_or(0, |at| at + 1);
                world.text.insert_str(end, &line);
                match world.file(sets) {
                    Ok(mut file) => {
                        // Replay files name the world by the command that draws it again (without `--emit`).
                        file.origin = shell::command("swarm", &again[1..again.len() - 1]);
                        Ok((Cow::Owned(file), Some(world)))
                    }
                    Err(error) => Err(format!(
                        "seed {seed} drew a world that is not a valid scenario file (a bug of the swarm's drawing; \
                         report it): {error}\n{}",
                        world.text
                    )),
                }
            }
        }
    }
}

/// Runs `worlds` under `seeds` (`options.shard`'s slice), streaming each seed to the result file and writing each
/// failure's replay file as it fails; prints the table (and a swarm's coverage) and the failing seeds.
fn sweep_worlds(worlds: &Worlds, seeds: Seeds, options: &SweepOptions, registry: &Registry) -> u8 {
    let program = &registry.program;
    let command = match worlds {
        Worlds::File { .. } => "sweep",
        Worlds::Swarm { .. } => "swarm",
    };
    let (shard, origin) = match options.shard {
        Some(shard) => (shard, None),
        None => match Shard::from_env(|name| std::env::var(name).ok()) {
            Ok(Some((shard, origin))) => (shard, Some(origin)),
            Ok(None) => (Shard::WHOLE, None),
            Err(error) => {
                eprintln!("{program} {command}: {error}");
                return BAD_INPUT;
            }
        },
    };
    let jobs = match threads(options.jobs) {
        Ok(jobs) => jobs,
        Err(error) => {
            eprintln!("{program} {command}: {error}");
            return BAD_INPUT;
        }
    };
    let results_path = options.results.join(sweep::file_name(worlds.name(), seeds, shard));
    let outputs = [("the result file (--results)", results_path.as_path())];
    if let Worlds::File { path, .. } = worlds
        && let Err(code) = check_outputs(&[("the scenario file", path)], &outputs, &format!("{program} sweep"))
    {
        return code;
    }
    // The failures' directories are made now, so that one that cannot be is refused before any seed runs (not
    // found out at every failure); each made here and left empty is removed at the end.
    let mut made = Vec::new();
    for (dir, what) in std::iter::once((&options.out, "--out")).chain(options.html.iter().map(|dir| (dir, "--html"))) {
        if dir.is_dir() {
            continue;
        }
        if let Err(error) = std::fs::create_dir_all(dir) {
            eprintln!("{program} {command}: {what} {}: cannot create the directory: {error}", dir.display());
            return BAD_INPUT;
        }
        made.push(dir.clone());
    }
    let results = match std::fs::create_dir_all(&options.results).and_then(|()| std::fs::File::create(&results_path)) {
        Ok(results) => results,
        Err(error) => {
            eprintln!("{program} {command}: cannot create the result file {}: {error}", results_path.display());
            return BAD_INPUT;
        }
    };
    let slice_len = seeds.len(shard);
    let slice = match (shard == Shard::WHOLE, &origin) {
        (true, _) => String::new(),
        (false, origin) => format!(
            ", shard {shard}{}: {}, those with (seed - {}) % {} == {}",
            origin.as_ref().map(|origin| format!(" (from {origin})")).unwrap_or_default(),
            count(slice_len, "seed"),
            seeds.first,
            shard.count,
            shard.index
        ),
    };
    let identity = worlds.identity();
    let shown = match worlds {
        Worlds::File { path, .. } => path.display().to_string(),
        Worlds::Swarm { .. } => worlds.label(),
    };
    println!(
        "{shown} ({}), seeds {}..={} ({}){slice} on {}, build {}",
        identity.version,
        seeds.first,
        seeds.last,
        seeds.range_len(),
        count(jobs as u64, "thread"),
        registry.build_id
    );
    println!("results: {}", results_path.display());
    if slice_len == 0 {
        // Still a result file: `merge` counts this shard as present (and complete).
        eprintln!(
            "{program} {command}: shard {shard} holds no seed: more shards ({}) than seeds ({})",
            shard.count,
            seeds.range_len()
        );
    }
    let header = sweep::Header {
        format: sweep::SWEEP_FORMAT,
        build: registry.build_id.clone(),
        scenario: identity,
        seeds,
        shard,
        jobs,
    };
    let state = Mutex::new(SweepState {
        results,
        tally: Tally::default(),
        failures: Failures::default(),
        write_error: None,
        outgrown: None,
    });
    let header_written = state.lock().unwrap_or_else(|p| p.into_inner()).write(&Line::Sweep(header));
    if let Err(error) = header_written {
        eprintln!("{program} {command}: cannot write the result file {}: {error}", results_path.display());
        return BAD_INPUT;
    }
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(slice_len), target);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {msg} [{elapsed} < {eta}]")
        .expect("a valid progress template");
    bar.set_style(style);
    bar.set_message("0 failed");
    // Ctrl-C or SIGTERM stops new seeds from starting: the runs under way finish, the sweep prints the table of
    // what finished and ends its result file; a second signal ends the process (what finished is in that file).
    let stop =
        crate::interrupt::catch("\ninterrupted: finishing the runs under way (interrupt again to stop at once)\n");
    let started = std::time::Instant::now();
    let seed_at = |i: u64| seeds.nth(shard, i);
    sim::for_each(&seed_at, jobs, stop, &|seed| {
        let (file, world) = match worlds.at(seed, &registry.sets, &registry.invocation) {
            Ok(world) => world,
            Err(error) => {
                let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                state.write_error.get_or_insert(error);
                stop.store(true, Ordering::SeqCst);
                return;
            }
        };
        let report = sim::run(&file.scenario, seed);
        if report.outgrown.is_some() {
            // The scenario is too large for one run: no seed of it says anything, so the sweep stops (bad input).
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.outgrown.get_or_insert_with(|| summary(&report));
            stop.store(true, Ordering::SeqCst);
            return;
        }
        // The replay file and timeline are written as the failure is found (outside the lock), and the report,
        // with its trace, dropped: the sweep keeps counts and the lowest failures' lines only.
        let (replay, listing) = match report.passed() {
            true => (None, None),
            false => {
                let (replay, listing) = write_failure(&file, &report, &worlds.label(), options, registry);
                (Some(replay), Some(listing))
            }
        };
        let mut record = SeedRecord::of(&report, replay);
        record.swarm = world.map(|world| Box::new(swarm_seed(&world, &file, &report)));
        drop(report);
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(error) = state.write(&Line::Seed(record.clone())) {
            state.write_error.get_or_insert(error.to_string());
            stop.store(true, Ordering::SeqCst);
            return;
        }
        state.tally.add(&record);
        if let Some(listing) = listing {
            state.failures.add(record.seed, listing);
            bar.set_message(format!("{} failed", state.failures.count));
        }
        bar.inc(1);
    });
    let wall = started.elapsed();
    let interrupted = crate::interrupt::release();
    bar.finish_and_clear();
    let mut state = state.into_inner().unwrap_or_else(|p| p.into_inner());
    let finished = state.tally.seeds;
    if let Some(signal) = interrupted {
        let of = count(slice_len, "seed");
        println!("interrupted ({signal}): {finished} of {of} finished; the table counts them");
    }
    if let Some(outgrown) = &state.outgrown {
        eprintln!("{program} {command}: stopped after {}: {outgrown}", count(finished, "seed"));
    }
    print!("{}{}", state.tally.table(), sweep::wall_line(finished, wall));
    let end = sweep::End {
        shard,
        seeds: finished,
        interrupted: finished < slice_len,
        wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
    };
    let ended = state.write(&Line::End(end));
    if let Some(error) = state.write_error.clone().or(ended.err().map(|error| error.to_string())) {
        eprintln!(
            "{program} {command}: cannot write the result file {}: {error}; the sweep stopped after {}",
            results_path.display(),
            count(finished, "seed")
        );
    }
    print_failures(&state.failures, |listing| listing.lines(registry), &results_path);
    for dir in made {
        // Only if empty: a directory that now holds a failure's file stays.
        let _ = std::fs::remove_dir(dir);
    }
    match () {
        () if interrupted.is_some() => INTERRUPTED,
        () if state.write_error.is_some() || state.outgrown.is_some() => BAD_INPUT,
        () if state.failures.count > 0 => FAILED,
        () => PASSED,
    }
}

/// The seeds a swarm sweeps when neither `--seeds` nor `--seed` is given.
const SWARM_SEEDS_DEFAULT: SeedRange = SeedRange { first: 1, last: 100 };

fn swarm_command(args: SwarmArgs, registry: &Registry) -> u8 {
    let program = &registry.program;
    let (ranges, origin, redraw) = match swarm_ranges(&args) {
        Ok(ranges) => ranges,
        Err(error) => {
            eprintln!("{program} swarm: {error}");
            return BAD_INPUT;
        }
    };
    if let Some(set) = &args.pipelines
        && !registry.sets.contains_key(set)
    {
        let known: Vec<&str> = registry.sets.keys().map(String::as_str).collect();
        let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
        eprintln!("{program} swarm: --pipelines {set}: this binary registers no such pipeline set (it has: {known})");
        return BAD_INPUT;
    }
    let worlds = Worlds::Swarm { ranges: Box::new(ranges), origin, pipelines: args.pipelines.clone(), redraw };
    if args.seed.is_none() && args.trace.is_some() {
        eprintln!("{program} swarm: --trace is for one world (--seed N); a sweep of seeds writes none");
        return BAD_INPUT;
    }
    if args.seed.is_some() {
        let sweep_only = [
            ("--shard", args.options.shard.is_some()),
            ("--results", args.options.results != Path::new(RESULTS_DIR)),
            ("--jobs", args.options.jobs.is_some()),
        ];
        if let Some((flag, _)) = sweep_only.iter().find(|(_, given)| *given) {
            eprintln!(
                "{program} swarm: {flag} is for a sweep of seeds (--seeds A..B); with --seed it would do nothing"
            );
            return BAD_INPUT;
        }
    }
    let Some(seed) = args.seed else {
        let seeds = args.seeds.clone().unwrap_or(SWARM_SEEDS_DEFAULT).seeds();
        return sweep_worlds(&worlds, seeds, &args.options, registry);
    };
    let (file, world) = match worlds.at(seed, &registry.sets, &registry.invocation) {
        Ok(world) => world,
        Err(error) => {
            eprintln!("{program} swarm: {error}");
            return BAD_INPUT;
        }
    };
    let world = world.expect("a swarm draws a world");
    if args.emit {
        print!("{}", world.text);
        return PASSED;
    }
    // One world, run as `sim run` runs a file: the summary, the trace, the timeline, a replay file on failure. No
    // output may be the ranges file, the replay file a failure writes, or the other output.
    let outputs = trace_and_html(&args.trace, &args.options.html);
    let replay = args.options.out.join(format!("{}-seed-{seed}.replay.json", file.scenario.name));
    let inputs: Vec<files::Named<'_>> = args
        .ranges
        .iter()
        .map(|path| ("the ranges file", path.as_path()))
        .chain(std::iter::once(("the replay file it writes on a failure (--out)", replay.as_path())))
        .collect();
    if let Err(code) = check_outputs(&inputs, &outputs, program) {
        return code;
    }
    if let Err(rule) = files::check_dir(&args.options.out) {
        eprintln!("{program}: refused: --out {rule}");
        return BAD_INPUT;
    }
    let trace = match create_trace(args.trace.as_deref(), program) {
        Ok(trace) => trace,
        Err(code) => return code,
    };
    let html = match create_output(args.options.html.as_deref(), "timeline", program) {
        Ok(html) => html,
        Err(code) => return code,
    };
    let swarm_version = worlds.identity().version;
    println!("{} ({swarm_version}), seed {seed}, build {}", worlds.label(), registry.build_id);
    println!("world ({}): {}", file.version_label(), world.summary);
    let report = sim::run(&file.scenario, seed);
    print!("{}", render(&report));
    let title = format!("{} ({}), seed {seed}", worlds.label(), file.version_label());
    let page = write_html(html, || timeline::html_of_run(&title, &file.scenario, &report), program);
    let code = finish(&file, &report, trace, &args.options.out, registry);
    if code == PASSED { page.err().unwrap_or(PASSED) } else { code }
}

/// The ranges `args` give: the ranges file's (or the defaults), narrowed by the flags; how to name them; and the
/// arguments that give them again (after `swarm --seed N`).
///
/// The flags narrow, never widen: `--max-replicas` caps both ends of `replicas`, `--overload` caps `overload`,
/// `--kinds` and `--shapes` keep only the kinds and shapes the file also allows (an empty intersection of shapes is
/// refused; of kinds, it is no faults), but `--kinds` turns on a kind off by default that it names
/// ([`FaultKind::off_by_default`](crate::sim::faults::FaultKind::off_by_default)). `--mutation` adds planted bugs,
/// each once.
fn swarm_ranges(args: &SwarmArgs) -> Result<(swarm::Ranges, String, Vec<String>), String> {
    let mut redraw = Vec::new();
    let (mut ranges, mut origin) = match &args.ranges {
        None => (swarm::Ranges::default(), "the default ranges".to_string()),
        Some(path) => {
            let text = crate::files::read_text(path, "ranges file", files::SCENARIO_FILE_BYTES_MAX)
                .map_err(|error| format!("{}: {error}", path.display()))?;
            redraw.extend(["--ranges".to_string(), path.display().to_string()]);
            (swarm::Ranges::parse(&text, &path.display().to_string())?, path.display().to_string())
        }
    };
    let mut flags: Vec<(String, String)> = Vec::new();
    if let Some(max) = args.max_replicas {
        ranges.replicas = (*ranges.replicas.start()).min(max)..=(*ranges.replicas.end()).min(max);
        flags.push(("--max-replicas".into(), max.to_string()));
    }
    if let Some(overload) = args.overload {
        ranges.overload = ranges.overload.min(overload);
        flags.push(("--overload".into(), overload.to_string()));
    }
    if let Some(kinds) = &args.kinds {
        let named = swarm::ranges::parse_kinds(kinds).map_err(|rule| format!("--kinds: {rule}"))?;
        ranges.kinds.retain(|kind| named.contains(kind));
        // A kind off by default widens the ranges when named: it is a known violation, asked for by name.
        for kind in named.into_iter().filter(|kind| kind.off_by_default()) {
            if !ranges.kinds.contains(&kind) {
                ranges.kinds.push(kind);
            }
        }
        flags.push(("--kinds".into(), kinds.join(",")));
    }
    if let Some(shapes) = &args.shapes {
        let named = swarm::ranges::parse_shapes(shapes).map_err(|rule| format!("--shapes: {rule}"))?;
        ranges.shapes.retain(|shape| named.contains(shape));
        if ranges.shapes.is_empty() {
            return Err(format!("--shapes {}: {origin} allows none of these shapes", shapes.join(",")));
        }
        flags.push(("--shapes".into(), shapes.join(",")));
    }
    if let Some(mutations) = &args.mutation {
        for mutation in mutations {
            if !ranges.mutations.contains(mutation) {
                ranges.mutations.push(mutation.clone());
            }
        }
        flags.push(("--mutation".into(), mutations.join(",")));
    }
    if let Some(set) = &args.pipelines {
        flags.push(("--pipelines".into(), set.clone()));
    }
    let named: Vec<String> = flags.iter().map(|(flag, value)| format!("{flag} {value}")).collect();
    ranges.check().map_err(|(key, rule)| match named.is_empty() {
        true => format!("{origin}: {key}: {rule}"),
        false => format!("{origin} with {}: {key}: {rule}", named.join(" ")),
    })?;
    if !named.is_empty() {
        origin = format!("{origin} with {}", named.join(" "));
    }
    redraw.extend(flags.into_iter().flat_map(|(flag, value)| [flag, value]));
    Ok((ranges, origin, redraw))
}

/// What a swarm's result line says of `world`, whose `file` ran as `report`.
fn swarm_seed(world: &swarm::World, file: &ScenarioFile, report: &RunReport) -> sweep::SwarmSeed {
    let on = world.kinds.iter().map(|kind| kind.name().to_string()).collect();
    let reached = swarm::coverage::Reached::of(report, on);
    sweep::SwarmSeed {
        world: world.summary.clone(),
        rows: file.scenario.workload.rows_max > 0 || file.scenario.pipelines.is_some(),
        gang: file.scenario.gang.is_some(),
        builtin: file.scenario.workload.rows_max > 0,
        on: reached.on,
        injected: reached.injected,
        paths: reached.paths,
    }
}

/// What a running sweep shares between its threads: the result file, the counts, the lowest failures.
struct SweepState {
    results: std::fs::File,
    tally: Tally,
    failures: Failures<FailureListing>,
    write_error: Option<String>,
    /// The first seed that outgrew one run ([`RunReport::outgrown`]), as [`summary`] words it.
    outgrown: Option<String>,
}

impl SweepState {
    /// Appends `line` to the result file in one write (a killed sweep's file ends at the end of a line).
    fn write(&mut self, line: &Line) -> std::io::Result<()> {
        use std::io::Write;
        self.results.write_all(line.to_json_line().as_bytes())
    }
}

/// A failing seed as a sweep lists it: its summary, where its replay file (and timeline page) went or why not.
struct FailureListing {
    summary: String,
    replay: Result<PathBuf, String>,
    timeline: Option<Result<PathBuf, String>>,
}

impl FailureListing {
    fn lines(&self, registry: &Registry) -> String {
        let mut text = format!("  {}\n", self.summary);
        match &self.replay {
            Ok(path) => {
                let command = registry.command(&["replay", &path.display().to_string()]);
                text.push_str(&format!("    replay: {command}\n"))
            }
            Err(error) => text.push_str(&format!("    {error}\n")),
        }
        match &self.timeline {
            Some(Ok(path)) => text.push_str(&format!("    timeline: {}\n", path.display())),
            Some(Err(error)) => text.push_str(&format!("    {error}\n")),
            None => {}
        }
        text
    }
}

/// Writes a failing seed's replay file (and with `--html` its timeline page); returns the replay file and how
/// the seed is listed.
fn write_failure(
    file: &ScenarioFile,
    report: &RunReport,
    label: &str,
    options: &SweepOptions,
    registry: &Registry,
) -> (ReplayFile, FailureListing) {
    let replay = ReplayFile::new(file, report, &registry.build_id);
    let written = write_replay_file(&replay, &options.out);
    let timeline = options.html.as_ref().map(|dir| {
        let title = format!("{label} ({}), seed {}", file.version_label(), report.seed);
        let path = dir.join(format!("{}-seed-{}.html", report.scenario, report.seed));
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&path, timeline::html_of_run(&title, &file.scenario, report)))
            .map(|()| path.clone())
            .map_err(|error| format!("cannot write the timeline {}: {error}", path.display()))
    });
    (replay, FailureListing { summary: summary(report), replay: written, timeline })
}

/// Prints the listed failures under `failing seeds:` (each as `lines` makes it), and how many more there are.
fn print_failures<T>(failures: &Failures<T>, lines: impl Fn(&T) -> String, results: &Path) {
    if failures.count == 0 {
        return;
    }
    println!("failing seeds:");
    for (_, item) in failures.listed() {
        print!("{}", lines(item));
    }
    if failures.unlisted() > 0 {
        println!(
            "  and {} more (the lowest {} are listed): each is a line of {}, its replay file inside",
            count(failures.unlisted(), "failing seed"),
            sweep::FAILURES_LISTED_MAX,
            results.display()
        );
    }
}

fn merge(args: MergeArgs, registry: &Registry) -> u8 {
    let program = &registry.program;
    let merged = sweep::result_files(&args.paths).and_then(|files| sweep::merge(&files).map(|merged| (files, merged)));
    let (files, merged) = match merged {
        Ok(merged) => merged,
        Err(error) => {
            eprintln!("{program} merge: refused: {error}");
            return BAD_INPUT;
        }
    };
    let header = &merged.header;
    println!(
        "{} ({}), seeds {}..={} ({}) in {} ({}), build {}",
        header.scenario.path,
        header.scenario.version,
        header.seeds.first,
        header.seeds.last,
        header.seeds.range_len(),
        count(header.shard.count, "shard"),
        count(files.len() as u64, "result file"),
        header.build
    );
    print!("{}", merged.tally.table());
    let (longest, all) = merged.wall();
    println!(
        "wall time: {:.2} s for the longest shard, {:.2} s for all shards",
        longest.as_secs_f64(),
        all.as_secs_f64()
    );
    let gaps = merged.gaps();
    if !gaps.is_empty() {
        println!("INCOMPLETE: {}", gaps.join("; "));
    }
    let lines = |(summary, replay): &(String, Option<ReplayFile>)| {
        let written = match replay {
            Some(replay) => match write_replay_file(replay, &args.out) {
                Ok(path) => format!("replay: {}", registry.command(&["replay", &path.display().to_string()])),
                Err(error) => error,
            },
            None => "no replay file in the result file".to_string(),
        };
        format!("  {summary}\n    {written}\n")
    };
    let results = args.paths.first().cloned().unwrap_or_default();
    print_failures(&merged.failures, lines, &results);
    match () {
        () if merged.tally.failed() > 0 => FAILED,
        () if !gaps.is_empty() => INCOMPLETE,
        () => PASSED,
    }
}

/// The text of an input file of `command` (e.g. `lockstep sim replay`), `what` it is in messages (`replay file`),
/// read through its size cap `limit` ([`crate::files::read_text`]); or `None` after saying why it cannot be read
/// (the caller exits 2).
fn read_input(path: &Path, what: &str, limit: u64, command: &str) -> Option<String> {
    match crate::files::read_text(path, what, limit) {
        Ok(text) => Some(text),
        Err(reason) => {
            eprintln!("{command}: cannot read {}: {reason}", path.display());
            None
        }
    }
}

/// Refuses (exit 2, saying why) outputs that are the same file as an input or as each other
/// ([`files::check_distinct`]); called before any output is created.
fn check_outputs(inputs: &[files::Named<'_>], outputs: &[files::Named<'_>], command: &str) -> Result<(), u8> {
    files::check_distinct(inputs, outputs).map_err(|rule| {
        eprintln!("{command}: refused: {rule}");
        BAD_INPUT
    })
}

/// The outputs a command names with `--trace` and `--html`, for [`check_outputs`].
fn trace_and_html<'a>(trace: &'a Option<PathBuf>, html: &'a Option<PathBuf>) -> Vec<files::Named<'a>> {
    let trace = trace.as_deref().map(|path| ("--trace", path));
    trace.into_iter().chain(html.as_deref().map(|path| ("--html", path))).collect()
}

fn replay(args: ReplayArgs, registry: &Registry) -> u8 {
    let program = &registry.program;
    let path = args.file.display().to_string();
    let command = format!("{program} replay");
    let outputs = trace_and_html(&args.trace, &args.html);
    if let Err(code) = check_outputs(&[("the replay file", &args.file)], &outputs, &command) {
        return code;
    }
    let Some(text) = read_input(&args.file, "replay file", files::REPLAY_FILE_BYTES_MAX, &command) else {
        return BAD_INPUT;
    };
    let (replay, file) = match ReplayFile::check_in(&text, &path, &registry.build_id, &registry.sets) {
        Ok(checked) => checked,
        Err(error) => {
            eprintln!("{program} replay: refused: {}", with_rerun(&error, registry));
            return BAD_INPUT;
        }
    };
    let trace = match create_trace(args.trace.as_deref(), &registry.program) {
        Ok(trace) => trace,
        Err(code) => return code,
    };
    let html = match create_output(args.html.as_deref(), "timeline", &registry.program) {
        Ok(html) => html,
        Err(code) => return code,
    };
    note_changed_scenario(&replay, registry);
    println!(
        "{path}: scenario {} ({}), seed {}, build {}",
        replay.scenario.name, replay.scenario.version, replay.seed, registry.build_id
    );
    let report = sim::run(&file.scenario, replay.seed);
    print!("{}", render(&report));
    let identity = trace_identity(&report);
    let written = write_trace(trace, &report, program);
    let title =
        format!("{path}: scenario {} ({}), seed {}", replay.scenario.name, replay.scenario.version, replay.seed);
    let written = written.and(write_html(html, || timeline::html_of_run(&title, &file.scenario, &report), program));
    if report.outgrown.is_some() {
        // Stopped where it outgrew one run (at its wall-clock limit, a point the wall clock chose): its trace is
        // cut short, so comparing its hash would say nothing of determinism.
        eprintln!("{program} replay: not compared: {}", summary(&report));
        return BAD_INPUT;
    }
    if identity != replay.trace {
        // A user's binary (build id `lockstep's+theirs`) may keep one id across edits of its handlers.
        let cause = if registry.build_id.contains('+') {
            format!(
                "The same scenario, seed and build id {} gave another run: if this binary's handlers changed since \
                 the replay file was written, that change is the cause (give `Registry::with_build_id` an id that \
                 follows your sources, as examples/user-pipelines/build.rs makes one); if not, a determinism bug: \
                 keep the replay file and report it.",
                registry.build_id
            )
        } else {
            "The same scenario, seed and build gave another run: a determinism bug; keep the replay file and report \
             it."
            .to_string()
        };
        eprintln!(
            "{program} replay: NOT reproduced: this run's trace has hash {} ({} events), the replay file recorded \
             {} ({} events). {cause}",
            identity.hash, identity.events, replay.trace.hash, replay.trace.events
        );
        return NOT_REPRODUCED;
    }
    println!("reproduced: trace hash {} ({} events) matches the replay file", identity.hash, identity.events);
    if report.passed() { written.err().unwrap_or(PASSED) } else { FAILED }
}

/// `error`, followed for a replay file of another build or an edited one by the command that runs its scenario
/// file under its seed ([`ReplayError::rerun`](super::replay::ReplayError::rerun)).
///
/// A replay file written by another simulator binary (lockstep's own, or a project's, whose build id ends in
/// `+PROGRAM`: [`Registry::new`]) names its scenario's pipelines in that binary's terms, which this one may not
/// have: the hint then names the binary that wrote it instead of a command of this one that could not run it.
fn with_rerun(error: &super::replay::ReplayError, registry: &Registry) -> String {
    let program_of = |build: &str| build.split_once('+').map(|(_, program)| program.to_string());
    if let Some(writer) = error.writer()
        && program_of(writer) != program_of(&registry.build_id)
    {
        let name = program_of(writer).unwrap_or_else(|| Registry::builtin().program);
        return format!(
            "{error}\nit was written by another simulator binary, {name}: replay it with that binary, which has the \
             pipelines its scenario names"
        );
    }
    match error.rerun() {
        // A drawn world's origin is the command that draws it again (`swarm --seed N …`).
        Some((scenario, _)) if scenario.starts_with("swarm --seed ") => {
            let words = shell::split(scenario).unwrap_or_default();
            format!("{error}\ndraw it again with: {}", registry.command(&words))
        }
        Some((scenario, seed)) => {
            format!("{error}\nrun it with: {}", registry.command(&["run", scenario, "--seed", &seed.to_string()]))
        }
        None => error.to_string(),
    }
}

/// Says so when the scenario file a replay came from has changed since (the replay uses the text it carries).
fn note_changed_scenario(replay: &ReplayFile, registry: &Registry) {
    let Ok(current) = ScenarioFile::load_in(Path::new(&replay.scenario.path), &registry.sets) else { return };
    if current.version_label() != replay.scenario.version {
        eprintln!(
            "note: {} is now version {}; replaying version {}, the text the replay file carries",
            replay.scenario.path,
            current.version_label(),
            replay.scenario.version
        );
    }
}

fn explain(args: ExplainArgs, registry: &Registry) -> u8 {
    let program = &registry.program;
    let path = args.trace.display().to_string();
    let command = format!("{program} explain");
    let outputs: Vec<files::Named<'_>> = args.html.as_deref().map(|path| ("--html", path)).into_iter().collect();
    if let Err(code) = check_outputs(&[("the trace file", &args.trace)], &outputs, &command) {
        return code;
    }
    let Some(text) = read_input(&args.trace, "trace file", files::TRACE_FILE_BYTES_MAX, &command) else {
        return BAD_INPUT;
    };
    if let Err((line, text)) = explain::check_trace(&text) {
        let why = match line {
            0 => "it is empty".to_string(),
            line => format!("line {line} is not a trace line (`seconds node kind fields`): {text:?}"),
        };
        eprintln!("{program} explain: {path} is not a trace file: {why}; write one with `run --trace FILE`");
        return BAD_INPUT;
    }
    if let Some(path) = &args.html {
        return explain_html(&text, path, &args, program);
    }
    let (subject, how, lines) = match (&args.operation, &args.row) {
        (Some(operation), _) => (
            format!("operation {operation}"),
            format!("a field `op={operation}`"),
            explain::operation_lines(&text, operation),
        ),
        (None, Some(row)) => (
            format!("row {row}"),
            format!("`id={row}`, `row={row}`, or a store commit naming row {row}"),
            explain::row_lines(&text, row),
        ),
        (None, None) => unreachable!("clap requires --operation, --row or --html"),
    };
    if lines.is_empty() {
        eprintln!(
            "{program} explain: no line of {path} ({}) is about {subject} (none has {how})",
            count(text.lines().count() as u64, "line")
        );
        return FAILED;
    }
    let (first, last) = (lines[0].at, lines[lines.len() - 1].at);
    println!("{subject}: {} from {first} s to {last} s (simulated), from {path}", count(lines.len() as u64, "event"));
    print!("{}", explain::render_timeline(&lines));
    PASSED
}

/// What `shrink` starts from: the scenario's text and spec files, and the failing seed.
struct ShrinkSource {
    text: String,
    spec_files: BTreeMap<String, String>,
    seed: u64,
    /// The scenario's name (the shrunk files are named after it).
    name: String,
    /// Read from a replay file (else from a scenario file).
    from_replay: bool,
}

fn shrink_source(args: &ShrinkArgs, registry: &Registry) -> Result<ShrinkSource, String> {
    let path = args.file.display().to_string();
    // The larger cap of the two kinds: a scenario file is read again through its own ([`ScenarioFile::load_in`]).
    let text = crate::files::read_text(&args.file, "replay or scenario file", files::REPLAY_FILE_BYTES_MAX)
        .map_err(|reason| format!("cannot read {path}: {reason}"))?;
    if text.trim_start().starts_with('{') {
        if args.seed.is_some() {
            return Err(format!("--seed is for a scenario file; {path} is a replay file, which names its seed"));
        }
        let (replay, _) = ReplayFile::check_in(&text, &path, &registry.build_id, &registry.sets)
            .map_err(|error| with_rerun(&error, registry))?;
        let (text, spec_files, seed, name) =
            (replay.scenario_text, replay.spec_files, replay.seed, replay.scenario.name);
        return Ok(ShrinkSource { text, spec_files, seed, name, from_replay: true });
    }
    let file = ScenarioFile::load_in(&args.file, &registry.sets).map_err(|error| error.to_string())?;
    let seed = args.seed.unwrap_or(file.seeds[0]);
    let name = file.scenario.name.clone();
    Ok(ShrinkSource { text: file.text, spec_files: file.spec_files, seed, name, from_replay: false })
}

fn shrink_command(args: ShrinkArgs, registry: &Registry) -> u8 {
    let program = &registry.program;
    let source = match shrink_source(&args, registry) {
        Ok(source) => source,
        Err(error) => {
            eprintln!("{program} shrink: refused: {error}");
            return BAD_INPUT;
        }
    };
    // Not even with --force may the shrunk files replace the file shrunk (checked before the search).
    let shrunk_name = shrink::shrunk_name(&source.name);
    let shrunk_scenario = shrink::file_path(&args.out, &shrunk_name);
    let shrunk_replay = args.out.join(format!("{shrunk_name}-seed-{}.replay.json", source.seed));
    let outputs =
        [("the shrunk scenario file (--out)", shrunk_scenario.as_path()), ("its replay file", shrunk_replay.as_path())];
    if let Err(code) = check_outputs(&[("the file shrunk", &args.file)], &outputs, &format!("{program} shrink")) {
        return code;
    }
    if let Err(rule) = files::check_dir(&args.out) {
        eprintln!("{program} shrink: refused: --out {rule}");
        return BAD_INPUT;
    }
    if !args.force {
        // Before the search, not after it: a refusal then would throw away minutes of runs.
        let existing = shrunk_files(&args.out, &shrink::shrunk_name(&source.name));
        if let Some(path) = existing.first() {
            eprintln!(
                "{program} shrink: refused: {} exists: give --force to replace it, or another --out",
                path.display()
            );
            return BAD_INPUT;
        }
    }
    let origin = args.file.display().to_string();
    let jobs = match threads(args.jobs) {
        Ok(jobs) => jobs,
        Err(error) => {
            eprintln!("{program} shrink: {error}");
            return BAD_INPUT;
        }
    };
    println!(
        "shrinking {origin} (seed {}) on {} for at most {}, build {}",
        source.seed,
        count(jobs as u64, "thread"),
        shrink::moves::format_duration(args.time),
        registry.build_id
    );
    let input = shrink::Input {
        text: &source.text,
        spec_files: &source.spec_files,
        origin: &origin,
        seed: source.seed,
        sets: &registry.sets,
        checker: args.checker.as_deref(),
        invocation: &registry.invocation,
        out: &args.out,
    };
    let options = shrink::Options { jobs, time_bound: args.time, other_seeds: args.other_seeds };
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(1), target);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} candidates of this step [{elapsed}]")
        .expect("a valid progress template");
    bar.set_style(style);
    let started = std::time::Instant::now();
    let shrunk = shrink::shrink(&input, options, &|progress| match progress {
        shrink::Progress::Candidates { done, total } => {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
        shrink::Progress::Accepted(number, step) => {
            let seed = if step.seed == source.seed { String::new() } else { format!(" [seed {}]", step.seed) };
            bar.suspend(|| println!("step {number}: {}{seed}\n    now {}", step.what, step.size));
        }
    });
    bar.finish_and_clear();
    let shrunk = match shrunk {
        Ok(shrunk) => shrunk,
        Err(error) => {
            eprintln!("{program} shrink: refused: {error}");
            if matches!(error, shrink::ShrinkError::Passes { .. }) && !source.from_replay {
                eprintln!("find a failing seed with: {}", registry.command(&["sweep", &origin, "--seeds", "1..101"]));
            }
            return BAD_INPUT;
        }
    };
    match write_shrunk(&shrunk, &args.out, args.force, registry) {
        Ok((scenario, replay)) => {
            println!(
                "shrunk in {} ({}, {:.1} s){}: it fails {} under seed {}",
                count(shrunk.steps.len() as u64, "step"),
                count(shrunk.runs as u64, "run"),
                started.elapsed().as_secs_f64(),
                if shrunk.complete { "" } else { ", stopped by the time bound" },
                shrunk.target,
                shrunk.seed
            );
            println!("  before: {}\n  after:  {}", shrunk.original, shrunk.size);
            println!("scenario: {}\nreplay file: {}", scenario.display(), replay.display());
            let command =
                registry.command(&["run", &scenario.display().to_string(), "--seed", &shrunk.seed.to_string()]);
            println!("run it with: {command}");
            PASSED
        }
        Err(error) => {
            eprintln!("{program} shrink: {error}");
            FAILED
        }
    }
}

/// The files of the shrunk scenario `name` that `out` holds: its scenario file and its replay files of any seed
/// (`shrink` names them so and refuses to replace them without `--force`).
fn shrunk_files(out: &Path, name: &str) -> Vec<PathBuf> {
    let scenario = shrink::file_path(out, name);
    let replay_prefix = format!("{name}-seed-");
    let mut replays: Vec<PathBuf> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let file_name = entry.ok()?.file_name().into_string().ok()?;
            let ours = file_name.starts_with(&replay_prefix) && file_name.ends_with(".replay.json");
            ours.then(|| out.join(file_name))
        })
        .collect();
    replays.sort();
    scenario.exists().then_some(scenario).into_iter().chain(replays).collect()
}

/// Writes the shrunk scenario file and its replay file into `out`; returns their paths. Without `force`, refuses
/// (writing neither) if either exists: one made while the search ran.
fn write_shrunk(
    shrunk: &shrink::Shrunk,
    out: &Path,
    force: bool,
    registry: &Registry,
) -> Result<(PathBuf, PathBuf), String> {
    std::fs::create_dir_all(out).map_err(|error| format!("cannot create {}: {error}", out.display()))?;
    let path = shrink::file_path(out, &shrunk.file.scenario.name);
    let file = ScenarioFile::parse_in(
        &shrunk.text,
        &path.display().to_string(),
        super::scenario_file::gang::SpecSource::Files(&BTreeMap::new()),
        &registry.sets,
    )
    .map_err(|error| error.to_string())?;
    let replay = ReplayFile::new(&file, &shrunk.report, &registry.build_id);
    let replay_path = out.join(replay.file_name());
    let files = [(&path, shrunk.text.clone()), (&replay_path, replay.to_json())];
    if !force && let Some((taken, _)) = files.iter().find(|(path, _)| path.exists()) {
        return Err(format!(
            "{} appeared while the search ran and is not replaced (give --force to replace it); the shrunk \
             scenario:\n{}",
            taken.display(),
            shrunk.text
        ));
    }
    for (path, text) in files {
        std::fs::write(path, text).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    }
    Ok((path, replay_path))
}

/// `explain TRACE --html OUT`: the trace's whole timeline, opened filtered to `--operation` or `--row` if given.
fn explain_html(text: &str, out: &Path, args: &ExplainArgs, program: &str) -> u8 {
    let parse = |id: &Option<String>| id.as_deref().and_then(|id| id.parse::<u64>().ok());
    let context = timeline::Context {
        operation: parse(&args.operation),
        rows: parse(&args.row).into_iter().collect(),
        ..timeline::Context::of_trace(args.trace.display().to_string())
    };
    match std::fs::write(out, timeline::html(text, &context)) {
        Ok(()) => {
            println!("timeline of {} written to {}", args.trace.display(), out.display());
            PASSED
        }
        Err(error) => {
            eprintln!("{program} explain: cannot write the timeline to {}: {error}", out.display());
            BAD_INPUT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_narrow_the_ranges_but_turn_on_a_kind_off_by_default_they_name() {
        use crate::sim::faults::FaultKind;
        let ranges = |kinds: &str| {
            let Ok(Command::Swarm(args)) = try_parse_from(["lockstep", "swarm", "--kinds", kinds]) else {
                panic!("--kinds {kinds} parses as a swarm");
            };
            swarm_ranges(&args).unwrap_or_else(|error| panic!("{error}")).0.kinds
        };
        let beyond = FaultKind::AgentClockBeyondMargin;
        assert!(!swarm::Ranges::default().kinds.contains(&beyond), "off by default");
        assert_eq!(ranges("pause,agent-partition"), vec![FaultKind::Pause, FaultKind::AgentPartition]);
        assert_eq!(ranges("agent-partition,agent-clock-beyond-margin"), vec![FaultKind::AgentPartition, beyond]);
    }

    #[test]
    fn seed_ranges_exclude_or_include_their_end() {
        let range = parse_seeds("1..4").unwrap();
        assert_eq!((range.first, range.last, range.seeds().range_len()), (1, 3, 3));
        let range = parse_seeds("1..=4").unwrap();
        assert_eq!((range.first, range.last, range.seeds().range_len()), (1, 4, 4));
        assert!(parse_seeds("4..4").unwrap_err().contains("holds no seed"));
        assert!(parse_seeds("0..0").unwrap_err().contains("holds no seed"));
        assert!(parse_seeds("5..=4").unwrap_err().contains("holds no seed"));
        assert!(parse_seeds("a..b").unwrap_err().contains("not a seed range"));
        assert!(parse_seeds("7").unwrap_err().contains("not a seed range"));
    }

    #[test]
    fn the_largest_seed_is_a_seed_range_and_a_larger_one_overflows() {
        let max = u64::MAX;
        let range = parse_seeds(&format!("{max}..={max}")).unwrap();
        assert_eq!((range.first, range.last, range.seeds().range_len()), (max, max, 1));
        let range = parse_seeds(&format!("{}..{max}", max - 2)).unwrap();
        assert_eq!((range.first, range.last), (max - 2, max - 1));
        let error = parse_seeds("1..18446744073709551616").unwrap_err();
        assert!(error.contains("seed 18446744073709551616 overflows"), "{error}");
    }

    #[test]
    fn a_sweep_runs_at_most_a_million_seeds() {
        assert_eq!(parse_seeds("1..=1000000").unwrap().seeds().range_len(), MAX_SWEEP_SEEDS);
        let error = parse_seeds("1..=1000001").unwrap_err();
        assert!(error.contains("holds 1000001 seeds; a sweep runs at most 1000000"), "{error}");
        let error = parse_seeds("0..=18446744073709551615").unwrap_err();
        assert!(error.contains("holds 18446744073709551616 seeds"), "{error}");
    }
}
