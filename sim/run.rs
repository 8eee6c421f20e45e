//! Running a scenario under a seed: a fresh madsim runtime on a fresh OS thread per run (one world per runtime;
//! a fresh thread keeps std `HashMap` seeding deterministic: shared/notes/madsim.md pitfalls 2 and 3), the
//! run's phases, the checkers, and what a failing run prints.
//!
//! Phases of a run:
//! 0. check the scenario ([`Scenario::check`]); a broken rule ends the run before it starts;
//! 1. build the world; the client inserts the workload and submits the gang operations while the faults run
//!    (and a directed script, if any);
//! 2. at the heal time (end of the fault window, of the workload or of the gang client's schedule, whichever is
//!    latest) the fault processes stop and the world heals everything they left;
//! 3. the harness waits until every workload row is final and every submitted operation ended, at most the
//!    liveness bound, and snapshots the rows;
//! 4. every replica drains; the longest lease ttl later the harness snapshots the rows, the operations and the
//!    process log;
//! 5. the checkers read the commit history, the events and both snapshots (the row checkers see the workload's
//!    rows: gang rows have their own checkers, and node rows stay leased by their live agents), and with a gang
//!    part the process log and the operations ([`checkers::gang`]).

use super::checkers::{self, CheckInput, RowModel, Violation};
use super::coverage::Coverage;
#[cfg(madsim)]
use super::faults::FaultRunner;
use super::faults::{Fault, FaultKind};
use super::gang::{self, OperationReport, SubmitOutcome};
use super::scenario::Scenario;
use super::service::Effect;
use super::trace::{self, Trace, TraceEvent};
use super::workload::{self, ClientReport};
#[cfg(madsim)]
use super::world::World;
use crate::agent::{ProcessEvent, ProcessLog};
use crate::gang::api::{self, OperationView};
use crate::gang::model::{JobId, KIND_NODE, KIND_OPERATION, OperationStatus};
use crate::store::{Commit, Event, Row, RowId, Timestamp};
#[cfg(madsim)]
use madsim::runtime::Runtime;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the harness checks whether every row is final, after the heal.
pub const CONVERGENCE_POLL: Duration = Duration::from_secs(1);
/// Lines of a failing run's trace printed with its failure (the whole trace goes to a file).
pub const FAILED_TRACE_TAIL: usize = 40;

#[cfg(madsim)]
/// A directed scenario's script: runs on the supervisor during the fault window, acting through the world's
/// handles (`world.replica(1).pause(d).await`). The heal waits for it to finish. Build one with [`script`].
pub type Script = Box<dyn FnOnce(World) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

#[cfg(madsim)]
/// A [`Script`] from an async closure: `script(|world| async move { world.db().restart(d).await })`.
pub fn script<F, Fut>(body: F) -> Script
where
    F: FnOnce(World) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    Box::new(move |world| Box::pin(body(world)))
}

/// What one run did and what the checkers found.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The run's seed.
    pub seed: u64,
    /// The scenario's name.
    pub scenario: String,
    /// The panic that ended the run early (an engine assertion, a hang past the time limit, a client that gave
    /// up), if any.
    pub panic: Option<String>,
    /// What the run outgrew, if it ended early because its scenario is too large for one run
    /// ([`trace::Outgrown`]: its trace reached its most events, or its wall-clock limit passed with simulated time
    /// still advancing, [`wall_limit`]). Such a run is neither passed nor judged, and
    /// says nothing of the system under test: `sim run` and `sim sweep` report it as bad input (exit 2).
    pub outgrown: Option<String>,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// The trace (empty after [`RunReport::slim`]).
    pub trace: Vec<TraceEvent>,
    /// Paths the run went through.
    pub coverage: Coverage,
    /// What the client inserted.
    pub client: ClientReport,
    /// Commits in the history.
    pub commits: usize,
    /// Rows in the database at the end.
    pub rows: usize,
    /// Distinct keys the clients inserted rows under (the workload and its contention bursts); equal to
    /// `rows` unless a retried insert duplicated a row. (With a gang part, operations and control messages are
    /// keyed too, while jobs, allocations and nodes are not, so the two differ by design.)
    pub keyed_rows: usize,
    /// Rows in the database at the end, counted by kind and then by status (`task` → `done` → 103).
    pub statuses: BTreeMap<String, BTreeMap<String, usize>>,
    /// Whether the scenario has a gang part (agents, operations).
    pub gang: bool,
    /// What became of each submitted gang operation, in submission order (empty without a gang part).
    pub operations: Vec<OperationReport>,
    /// The checkers that judged the run, in order, each name once ([`checkers::names`], `drain`, and with a gang
    /// part or expectations, [`checkers::gang::NAMES`] not yet listed); empty if the run ended before them.
    pub checkers: Vec<&'static str>,
    /// Simulated time the run took; for a run that panicked, the time of its last trace event (how far it got).
    pub simulated: Duration,
    /// Wall-clock time the run took.
    pub wall: std::time::Duration,
    /// Whether anything of the run's world outlived the run, after its teardown (`World::teardown`): a task
    /// still holding the trace every node writes to. Each such run leaks its world (a sweep's memory would grow
    /// with its seeds); [`check_seeds`] fails a test whose run leaked (`tests/sim_sweep.rs`: 200 seeds).
    /// False too for a run left behind past its wall-clock limit (its thread still runs; nothing is known).
    pub world_leaked: bool,
}

impl RunReport {
    /// Whether the run ended normally and every checker passed.
    pub fn passed(&self) -> bool {
        self.panic.is_none() && self.outgrown.is_none() && self.violations.is_empty()
    }

    /// Whether `checker` found a violation.
    pub fn violated(&self, checker: &str) -> bool {
        self.violations.iter().any(|violation| violation.checker == checker)
    }

    /// The trace as text.
    pub fn trace_text(&self) -> String {
        trace::render(&self.trace)
    }

    /// The report of a run of `scenario` under `seed` before anything is known: no panic, no violation, zero
    /// counts and times.
    pub fn empty(scenario: &Scenario, seed: u64) -> RunReport {
        RunReport {
            seed,
            scenario: scenario.name.clone(),
            panic: None,
            outgrown: None,
            violations: Vec::new(),
            trace: Vec::new(),
            coverage: Coverage::default(),
            client: ClientReport::default(),
            commits: 0,
            rows: 0,
            keyed_rows: 0,
            statuses: BTreeMap::new(),
            gang: scenario.gang.is_some(),
            operations: Vec::new(),
            checkers: Vec::new(),
            simulated: Duration::ZERO,
            wall: std::time::Duration::ZERO,
            world_leaked: false,
        }
    }

    /// Runs the checkers of `scenario` on `outcome` and `self.trace` ([`check`]) and fills in what they found and
    /// what the run did (counts, statuses, operations): the simulator and `lockstep chaos run` both end here.
    pub fn judge(&mut self, scenario: &Scenario, outcome: Outcome) {
        self.violations = check(scenario, &outcome, &self.trace);
        self.checkers = checker_names(scenario);
        self.coverage = Coverage::of(&outcome.history, &self.trace);
        self.client = outcome.client;
        self.commits = outcome.history.len();
        self.rows = outcome.rows_final.len();
        self.keyed_rows = outcome.keyed_rows;
        for row in &outcome.rows_final {
            // New strings only for a kind or status not seen before (two per row before).
            if !self.statuses.contains_key(&row.kind) {
                self.statuses.insert(row.kind.clone(), BTreeMap::new());
            }
            let statuses = self.statuses.get_mut(&row.kind).expect("kind just added");
            match statuses.get_mut(&row.status) {
                Some(count) => *count += 1,
                None => {
                    statuses.insert(row.status.clone(), 1);
                }
            }
        }
        self.operations = outcome.gang.map(|gang| gang.reports).unwrap_or_default();
    }

    /// Drops the trace, keeping the counts (for sweeps of many seeds).
    pub fn slim(mut self) -> RunReport {
        self.trace = Vec::new();
        self
    }

    /// The report of the operation the scenario names `name`.
    pub fn operation(&self, name: &str) -> Option<&OperationReport> {
        self.operations.iter().find(|report| report.name == name)
    }

    /// Trace lines about operation `op` (those carrying the token `op=<op>`), as text.
    pub fn operation_trace(&self, op: RowId) -> String {
        let token = format!("op={op}");
        let lines: Vec<TraceEvent> = self
            .trace
            .iter()
            .filter(|e| super::explain::field_tokens(&e.fields.text()).contains(&token.as_str()))
            .cloned()
            .collect();
        trace::render(&lines)
    }
}

/// What the checkers judge of a run: what the simulated part of a run hands back, or what `lockstep chaos run`
/// read from PostgreSQL and its agents' logs (one checker code path for both, [`check`]).
pub struct Outcome {
    /// Every commit, in commit order: the database node's MemStore history, or PostgreSQL's `history` table.
    pub history: Vec<Commit>,
    /// Every event, in sequence order, read from the store at the end.
    pub events: Vec<Event>,
    /// Rows when the liveness wait ended: at least those not final then ([`CheckInput::rows_at_liveness`]).
    /// In a gang scenario the gang's own rows are left out (the gang checkers judge them).
    pub rows_at_liveness: Vec<Row>,
    /// Every row at the end, after the replicas drained and the longest lease ttl passed; in a gang scenario
    /// without the node rows, which their agents keep leased.
    pub rows_final: Vec<Row>,
    /// Store time when the faults stopped and the world healed.
    pub heal_at: Timestamp,
    /// Store time when the liveness wait ended (every row settled, or the scenario's `liveness_bound` passed).
    pub liveness_at: Timestamp,
    /// Store time when `rows_final` was read.
    pub final_at: Timestamp,
    /// What the workload client inserted.
    pub client: ClientReport,
    /// Rows inserted under a key: in the simulator, what the database node counted; in `lockstep chaos run`, what
    /// the harness inserted.
    pub keyed_rows: usize,
    /// The replicas' drain: `Err` names those that did not drain within the scenario's `drain_budget` (checker
    /// `drain`).
    pub drain: Result<(), String>,
    /// The gang part's outcome, in a scenario with one.
    pub gang: Option<GangOutcome>,
    /// Every request the simulated external services handled, service by service in order (empty in `lockstep
    /// chaos run`, which has none).
    pub effects: Vec<Effect>,
    /// [`CheckInput::retry_lateness_bound`]: [`RETRY_LATENESS_BOUND`] in the simulator, `None` in chaos runs.
    pub retry_lateness_bound: Option<Duration>,
}

/// How late after its retry falls due a workload row that failed after the heal may be fetched again, in
/// simulated time (checker `retries`, rule 4). A replica's fetcher wakes when a row it failed falls due
/// ([`crate::pipeline::queue::Shared::note_retry`]); without that it waited out its empty-fetch backoff, up to 6 s.
pub const RETRY_LATENESS_BOUND: Duration = Duration::from_millis(500);

/// What the simulated part of a gang run (or `lockstep chaos run`, from PostgreSQL and its agents' records) hands
/// back to the gang checkers ([`checkers::gang::GangCheckInput`]).
pub struct GangOutcome {
    /// One report per submission, in submission order (a refused one says why).
    pub reports: Vec<OperationReport>,
    /// Each submitted operation's status view ([`crate::gang::api::status`]) at the end, in submission order.
    pub views: Vec<OperationView>,
    /// Operations not ended when the liveness wait stopped, as `op=<id> <status>` ([`unfinished_operations`]).
    pub unfinished: Vec<String>,
    /// The process log's allocation-exclusivity violations, one sentence each naming both jobs.
    pub exclusivity: Vec<String>,
    /// The process log: every process start, pause, resume and end on the agents, in order.
    pub processes: Vec<ProcessEvent>,
    /// Processes still alive at the end, by allocation row (checker `process_outlived_operation`).
    pub live_at_end: BTreeMap<RowId, Vec<JobId>>,
}

#[cfg(any(madsim, doc))]
/// Runs `scenario` under `seed` and checks it: the report holds the violations (an empty list when every checker
/// passed), the counts and the trace; never panics on a failing run. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
pub fn run(scenario: &Scenario, seed: u64) -> RunReport {
    run_with(scenario, seed, None)
}

/// Marks the panics the workload plants on purpose (their message ends in "(planted)"; the engine catches them,
/// DESIGN §3) so that the panic hook prints nothing for them: a sweep would otherwise print a backtrace per
/// planted panic. Every other panic prints as before. Installed once per process; it changes no run.
pub const PLANTED_PANIC_MARK: &str = "(planted)";

fn quiet_planted_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied());
            if !text.is_some_and(|text| text.ends_with(PLANTED_PANIC_MARK)) {
                previous(info);
            }
        }));
    });
}

#[cfg(madsim)]
/// Runs `scenario` under `seed`, with a directed `script` if given, and checks it. Never panics on a failing
/// run: the panic and the violations are in the report. With `LOCKSTEP_SIM_TRACE_DIR` set, writes the trace to
/// `<dir>/<scenario>-seed-<seed>.trace`.
pub fn run_with(scenario: &Scenario, seed: u64, script: Option<Script>) -> RunReport {
    run_within(scenario, seed, script, wall_limit())
}

#[cfg(madsim)]
/// As [`run_with`], with `limit` as the run's wall-clock limit instead of [`wall_limit`]'s: past it the run's
/// thread is left behind, and the report's panic says the run is stuck if its simulated time stood still, else the
/// run outgrew one run ([`wait_within`]).
pub fn run_within(scenario: &Scenario, seed: u64, script: Option<Script>, limit: std::time::Duration) -> RunReport {
    quiet_planted_panics();
    share_one_malloc_arena();
    if let Err(error) = scenario.check() {
        return RunReport { panic: Some(error.to_string()), ..RunReport::empty(scenario, seed) };
    }
    let scenario = Arc::new(scenario.clone());
    let trace_len_max = trace::trace_len_max();
    let trace_slot: Arc<Mutex<Option<Trace>>> = Arc::default();
    let wall = std::time::Instant::now();
    let (done, finished) = std::sync::mpsc::channel();
    {
        let (scenario, trace_slot) = (scenario.clone(), trace_slot.clone());
        std::thread::spawn(move || {
            let mut runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
            runtime.set_time_limit(scenario.time_limit());
            let world_slot = WorldSlot::default();
            let simulate = async {
                let trace = Trace::with_len_max(trace_len_max);
                *trace_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(trace.clone());
                let world = simulate(scenario.clone(), seed, script, trace.clone(), world_slot.clone());
                // A run that outgrows its trace ends there (the teardown stops the world); `biased` polls the
                // world first, so a run within the bound never depends on the race.
                tokio::select! {
                    biased;
                    outcome = world => Ok((outcome, trace.elapsed())),
                    outgrown = trace.outgrown() => Err(outgrown),
                }
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(simulate)));
            let leaked = tear_down(runtime, &world_slot, &trace_slot);
            let result = match result {
                Ok(Ok((outcome, simulated))) => (Ok(outcome), simulated),
                Ok(Err(outgrown)) => (Err(Ended::Outgrown(outgrown.what)), Duration::ZERO),
                Err(panic) => (Err(Ended::Panic(panic_message(panic))), Duration::ZERO),
            };
            // The wall time of the simulation, as before judging moved here: the checkers' time is not in it.
            let wall = wall.elapsed();
            // Judged on this thread, which allocated the run's history and rows: freeing them here is
            // mimalloc's local free, where the caller's thread took its cross-thread path for every block (2 %
            // of a 10 000-row run's instructions).
            // A checker's panic is our own bug: it goes on in the caller's thread, as when judging was there.
            let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                report_of(&scenario, seed, result, take_trace(&trace_slot), leaked)
            }));
            // The receiver is gone only if the run passed its wall-clock limit; nobody waits for it then.
            let _ = done.send(report.map(|report| RunReport { wall, ..report }));
        });
    }
    let report = match wait_within(&finished, limit, &trace_slot) {
        Ok(Ok(report)) => report,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The run's thread is left behind: a thread cannot be stopped from outside. The process ends it.
        Err(ended) => {
            let ended = (Err(ended), Duration::ZERO);
            RunReport { wall: wall.elapsed(), ..report_of(&scenario, seed, ended, take_trace(&trace_slot), false) }
        }
    };
    if let Ok(dir) = std::env::var("LOCKSTEP_SIM_TRACE_DIR") {
        let path = std::path::Path::new(&dir).join(format!("{}-seed-{seed}.trace", report.scenario));
        std::fs::write(&path, report.trace_text()).expect("LOCKSTEP_SIM_TRACE_DIR must be a writable directory");
    }
    report
}

#[cfg(madsim)]
/// The report a run's thread sends: the judged run, or the panic of a checker (our own bug).
type Finished = std::thread::Result<RunReport>;

#[cfg(madsim)]
/// Waits for the report of the run whose trace is in `trace_slot`, at most its wall-clock `limit`; past it, how
/// the run ended: stuck ([`stuck`], a panic) if its simulated time stood still over the limit's second half, else
/// outgrown ([`outgrown_wall`]: a scenario too large to finish within the limit, as one whose trace reaches its
/// most events). Only the verdict reads the wall clock: the run's thread and its trace never see it, so the
/// run stays a function of scenario, seed and build up to where it was left.
fn wait_within(
    finished: &std::sync::mpsc::Receiver<Finished>,
    limit: std::time::Duration,
    trace_slot: &Mutex<Option<Trace>>,
) -> Result<Finished, Ended> {
    let half = limit / 2;
    if let Ok(report) = finished.recv_timeout(half) {
        return Ok(report);
    }
    let before = simulated_so_far(trace_slot);
    if let Ok(report) = finished.recv_timeout(limit - half) {
        return Ok(report);
    }
    let after = simulated_so_far(trace_slot);
    Err(judge_wall_limit(limit, before, after))
}

/// How a run still running at its wall-clock `limit` ended, from the simulated time its trace had reached at
/// half the limit (`before`) and at the limit (`after`): stuck if it stood still, else outgrown.
fn judge_wall_limit(limit: std::time::Duration, before: Duration, after: Duration) -> Ended {
    match after > before {
        true => Ended::Outgrown(outgrown_wall(limit, after)),
        false => Ended::Panic(stuck(limit)),
    }
}

#[cfg(madsim)]
/// The simulated time of the last event of the run's trace in `trace_slot` (zero if none yet): how far a run still
/// running got. Read from outside the run, under the trace's lock; the run never sees the read.
fn simulated_so_far(trace_slot: &Mutex<Option<Trace>>) -> Duration {
    let trace = trace_slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
    trace.and_then(|trace| trace.last_at()).unwrap_or(Duration::ZERO)
}

#[cfg(madsim)]
/// The events of the run's trace, taken out of `trace_slot` (none if it holds no trace).
fn take_trace(trace_slot: &Mutex<Option<Trace>>) -> Vec<TraceEvent> {
    let trace = trace_slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    trace.map(|trace| trace.take_events()).unwrap_or_default()
}

#[cfg(madsim)]
/// The report of a run of `scenario` under `seed` that ended with `result` (its outcome and simulated time, or
/// why it ended early) and wrote `trace`: judged when it ended normally. Its wall time is left zero.
fn report_of(
    scenario: &Scenario,
    seed: u64,
    result: (Result<Outcome, Ended>, Duration),
    trace: Vec<TraceEvent>,
    world_leaked: bool,
) -> RunReport {
    let (result, simulated) = result;
    // A panicked run has no end time of its own: the last trace event is as far as it got (not zero).
    let simulated = match &result {
        Ok(_) => simulated,
        Err(_) => trace.last().map_or(Duration::ZERO, |event| event.at),
    };
    let mut report = RunReport { simulated, trace, world_leaked, ..RunReport::empty(scenario, seed) };
    match result {
        Err(Ended::Panic(panic)) => report.panic = Some(panic),
        Err(Ended::Outgrown(what)) => report.outgrown = Some(what),
        Ok(outcome) => report.judge(scenario, outcome),
    }
    report
}

/// The checkers that judge a run of `scenario`, in order, each name once.
pub fn checker_names(scenario: &Scenario) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = checkers::names().collect();
    if let Some(set) = &scenario.pipelines {
        names.extend(set.checkers().iter().map(|checker| checker.name()));
    }
    names.push("drain");
    if scenario.gang.is_some() || !scenario.expect.is_empty() {
        let more: Vec<&'static str> =
            checkers::gang::NAMES.into_iter().filter(|name| scenario.gang.is_some() || *name == "expect").collect();
        for name in more {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Runs every checker of `scenario` on `outcome` (and `trace`, for the `expect` checker's trace lines): the
/// built-in and the pipeline set's row checkers, the drain, and with a gang part the gang checkers. The one
/// checker path of both the simulator and `lockstep chaos run`.
pub fn check(scenario: &Scenario, outcome: &Outcome, trace: &[TraceEvent]) -> Vec<Violation> {
    let rows = match &scenario.pipelines {
        Some(set) => RowModel::User(set),
        None => RowModel::Builtin,
    };
    let capacity = capacity_of(scenario);
    let input = CheckInput {
        history: &outcome.history,
        events: &outcome.events,
        rows_at_liveness: &outcome.rows_at_liveness,
        rows_final: &outcome.rows_final,
        heal_at: outcome.heal_at,
        liveness_at: outcome.liveness_at,
        final_at: outcome.final_at,
        liveness_bound: scenario.liveness_bound,
        starvation_bound: scenario.starvation_bound,
        rows,
        effects: &outcome.effects,
        attempts_max: scenario.workload.attempts_max,
        retry_lateness_bound: outcome.retry_lateness_bound,
        capacity: &capacity,
    };
    let more = scenario.pipelines.as_ref().map_or(&[][..], |set| set.checkers());
    let mut violations = checkers::check_all(&input, more);
    if let Err(message) = &outcome.drain {
        violations.push(Violation { checker: "drain", message: message.clone() });
    }
    if let Some(gang) = &outcome.gang {
        violations.extend(checkers::gang::check_all(&checkers::gang::GangCheckInput {
            reports: &gang.reports,
            views: &gang.views,
            exclusivity: &gang.exclusivity,
            processes: &gang.processes,
            start_skew_max: scenario.gang.as_ref().map_or(Duration::ZERO, |g| g.start_skew_max()),
            live_at_end: &gang.live_at_end,
            unfinished: &gang.unfinished,
            expectations: &scenario.expect,
            trace,
        }));
    } else if !scenario.expect.is_empty() {
        // A scenario without a gang part may still state what its trace must show.
        let unmet = checkers::gang::expectations(&scenario.expect, &[], trace);
        if !unmet.is_empty() {
            let unmet_count = crate::text::count_as(unmet.len() as u64, "unmet expectation", "unmet expectations");
            let message = format!("{unmet_count}: {}", checkers::listed(&unmet));
            violations.push(Violation { checker: "expect", message });
        }
    }
    violations
}

#[cfg(madsim)]
/// Whether `row` is settled: a workload row (the built-in workload's or a user's set's) that is final (the rule of
/// the `liveness` checker, [`checkers::RowModel::is_final`]), a gang row other than an operation, or an operation
/// that ended.
fn settled(scenario: &Scenario, row: &Row) -> bool {
    match scenario.gang.is_some() && gang::is_gang_row(row) {
        false => match &scenario.pipelines {
            Some(set) => set.is_final(row),
            None => workload::is_terminal(row),
        },
        true => row.kind != KIND_OPERATION || OperationStatus::parse(&row.status).is_some_and(|s| s.is_terminal()),
    }
}

#[cfg(madsim)]
/// Whether every row is [`settled`].
fn converged(scenario: &Scenario, world: &World) -> bool {
    // Borrowed from the database: this runs every simulated second, and copying every row each time was a twentieth
    // of a 10 000-row run's CPU.
    world.database().store.rows_all(|row| settled(scenario, row))
}

#[cfg(madsim)]
/// Where a run leaves its world for the teardown after it (whether it ended or panicked).
type WorldSlot = Arc<Mutex<Option<World>>>;

#[cfg(madsim)]
/// Tears down the world of a run that ended (or panicked) on `runtime` ([`World::teardown`], on the same
/// runtime), then drops the runtime; returns whether the run's trace is still held by anything but `trace_slot`:
/// a task of the world that outlived it (a leak).
fn tear_down(runtime: Runtime, world_slot: &WorldSlot, trace_slot: &Mutex<Option<Trace>>) -> bool {
    let world = world_slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(world) = world {
        // A panicking teardown leaves what it could not drop behind; the leak check below reports it.
        let teardown = async move { world.teardown().await };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(teardown)));
    }
    drop(runtime);
    trace_slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|trace| trace.holders() > 1)
}

#[cfg(madsim)]
/// The simulated part of a run (phases 1–4).
async fn simulate(
    scenario: Arc<Scenario>,
    seed: u64,
    script: Option<Script>,
    trace: Trace,
    slot: WorldSlot,
) -> Outcome {
    let world = World::build(scenario.clone(), seed, trace).await;
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(world.clone());
    let start = tokio::time::Instant::now();
    let client = {
        let world = world.clone();
        tokio::spawn(async move { world.run_client().await })
    };
    let gang_client = {
        let world = world.clone();
        scenario.gang.is_some().then(|| tokio::spawn(async move { world.run_gang_client().await }))
    };
    let faults = FaultRunner::start(&world, &scenario.faults);
    if let Some(script) = script {
        script(world.clone()).await;
    }
    let client = client.await.expect("the client task is never aborted");
    if let Some(gang_client) = gang_client {
        gang_client.await.expect("the gang client task is never aborted");
    }
    tokio::time::sleep_until(start + scenario.heal_at()).await;
    faults.stop();
    world.heal();
    let heal_at = world.store_now();
    let deadline = tokio::time::Instant::now() + scenario.liveness_bound;
    let rows_at_liveness = loop {
        if converged(&scenario, &world) || tokio::time::Instant::now() >= deadline {
            // Only the rows not settled: the settled ones are all that `liveness` and the unfinished operations
            // leave out (a 10 000-row run copied every row here).
            break world.database().store.rows_where(|row| !settled(&scenario, row));
        }
        tokio::time::sleep(CONVERGENCE_POLL).await;
    };
    let liveness_at = world.store_now();
    let unfinished = unfinished_operations(&rows_at_liveness);
    let drain = world.drain(scenario.drain_budget).await;
    let lease_ttl_max = scenario.lease_ttl_max().max(world.user_lease_ttl_max());
    tokio::time::sleep(lease_ttl_max + Duration::from_secs(1)).await;
    let store = &world.database().store;
    let gang = match scenario.gang.is_some() {
        true => Some(gang_outcome(&world, unfinished).await),
        false => None,
    };
    let rows_final = store.rows();
    // The row checkers judge the workload's rows; gang rows have the gang checkers, and node rows stay leased by
    // their agents, which never drain.
    let gang_part = scenario.gang.is_some();
    Outcome {
        // Moved, not copied: the run is over (about 10⁵ commits a 10 000-row run).
        history: store.take_history(),
        events: store.all_events(),
        rows_at_liveness: rows_at_liveness.into_iter().filter(|row| !(gang_part && gang::is_gang_row(row))).collect(),
        rows_final: rows_final.into_iter().filter(|row| !(gang_part && row.kind == KIND_NODE)).collect(),
        effects: world.effects(),
        heal_at,
        liveness_at,
        final_at: world.store_now(),
        client,
        keyed_rows: world.database().keyed_rows(),
        drain,
        gang,
        retry_lateness_bound: Some(RETRY_LATENESS_BOUND),
    }
}

/// What the built-in workload's pipelines hold at once in `scenario`: every replica runs `tasks`, `jobs` and each
/// `claims-{p}` with their workers. (A user's pipeline set is not listed: its waits are judged whole.)
pub fn capacity_of(scenario: &Scenario) -> checkers::capacity::Capacity {
    let spec = &scenario.workload;
    let mut workers = BTreeMap::new();
    let mut pipelines_of_kind = BTreeMap::new();
    if spec.rows_max > 0 {
        let mut add = |kind: &str, pipeline: String, count: usize| {
            workers.insert(pipeline.clone(), count);
            pipelines_of_kind.insert(kind.to_string(), vec![pipeline]);
        };
        add("task", "tasks".into(), spec.workers.tasks);
        add("job", "jobs".into(), spec.workers.jobs);
        for p in 0..spec.claim_pipelines {
            add(&format!("claim-{p}"), format!("claims-{p}"), spec.workers.claims);
        }
    }
    // Calls sent before the heal resolve within their time-out; a broken hint subscription is renewed within a
    // second (`net_store::HINT_RENEW_INTERVAL`, simulator build only). A fetch stall that buggify began before the
    // heal sleeps one lease ttl past it (`Point::FetchStall`).
    let buggify = scenario.faults.fixed.iter().any(|event| matches!(event.fault, Fault::Buggify { .. }))
        || scenario.faults.random.iter().any(|random| random.kind == FaultKind::Buggify);
    let stall = if buggify { spec.lease_ttl } else { Duration::ZERO };
    let settle = scenario.call_timeout + Duration::from_secs(1) + stall;
    checkers::capacity::Capacity {
        replicas: scenario.replicas,
        lease_ttl: spec.lease_ttl,
        workers,
        pipelines_of_kind,
        settle,
        fault_free: scenario.faults.fixed.is_empty() && scenario.faults.random.is_empty(),
    }
}

/// The operations not ended in `rows`, as `op=<id> <status>`.
pub fn unfinished_operations(rows: &[Row]) -> Vec<String> {
    let ended = |row: &&Row| OperationStatus::parse(&row.status).is_some_and(|s| s.is_terminal());
    rows.iter()
        .filter(|row| row.kind == KIND_OPERATION && gang::is_gang_row(row))
        .filter(|row| !ended(row))
        .map(|row| format!("op={} {}", row.id, row.status))
        .collect()
}

#[cfg(madsim)]
/// Reads every submitted operation from the database (directly: the checkers' view) and the process log.
async fn gang_outcome(world: &World, unfinished: Vec<String>) -> GangOutcome {
    let store = &world.database().store;
    let mut reports = Vec::new();
    let mut views = Vec::new();
    for (name, outcome) in world.submitted() {
        match outcome {
            SubmitOutcome::Refused(error) => reports.push(OperationReport::refused(&name, &error)),
            SubmitOutcome::Submitted(id) => {
                let view = api::status(store, id).await.expect("a submitted operation's rows decode");
                let created_at = store.row(id).expect("a submitted operation's row exists").created_at;
                reports.push(OperationReport::of(&name, &view, created_at, super::db::ORIGIN));
                views.push(view);
            }
        }
    }
    let log: &ProcessLog = world.process_log();
    GangOutcome {
        reports,
        views,
        unfinished,
        exclusivity: log.exclusivity_violations(),
        processes: log.events(),
        live_at_end: log.live(),
    }
}

/// How a run that did not reach its end ended: a panic (its message), or it outgrew one run ([`trace::Outgrown`],
/// or its wall-clock limit with simulated time advancing: [`outgrown_wall`]).
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Panic(String),
    Outgrown(String),
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => match panic.downcast::<&'static str>() {
            Ok(message) => message.to_string(),
            Err(_) => "a panic without a message".to_string(),
        },
    }
}

/// Default of [`wall_limit`]: 10 minutes of wall time per run. The longest run of the repository's tests and
/// benchmarks takes well under a minute in a debug build; a run that passes the limit is stuck (simulated time stood
/// still) or too large for one run (it still advanced), never judged either way.
pub const WALL_LIMIT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(600);

/// The wall-clock time one run may take: `LOCKSTEP_SIM_WALL_LIMIT_SECS`, else [`WALL_LIMIT_DEFAULT`]. Simulated
/// time advances only when every task waits, so code that never yields (a busy loop, a blocking call in a handler)
/// stops the clock for good: the run's own time limit (simulated) never comes, and without this guard the test
/// would hang with no message (shared/notes/madsim.md, pitfall 5). A run past the limit whose simulated time
/// still advances is not stuck but too large (a trial: 200 replicas at the highest rates): it ends unjudged, as a
/// run whose trace reaches its most events ([`RunReport::outgrown`]), and writes no replay file.
///
/// Panics if the variable is set to something other than a whole number of seconds, at least 1 (the simulator's
/// commands refuse that first, exit 2: [`check_environment`]).
pub fn wall_limit() -> std::time::Duration {
    try_wall_limit().unwrap_or_else(|rule| panic!("{rule}"))
}

fn try_wall_limit() -> Result<std::time::Duration, String> {
    match std::env::var("LOCKSTEP_SIM_WALL_LIMIT_SECS") {
        Err(_) => Ok(WALL_LIMIT_DEFAULT),
        Ok(text) => match text.parse::<u64>() {
            Ok(secs) if secs > 0 => Ok(std::time::Duration::from_secs(secs)),
            _ => Err(format!("LOCKSTEP_SIM_WALL_LIMIT_SECS={text:?} must be a whole number of seconds, at least 1")),
        },
    }
}

/// Checks the variables every run reads: `LOCKSTEP_SIM_WALL_LIMIT_SECS` ([`wall_limit`]),
/// `LOCKSTEP_SIM_TRACE_LEN_MAX` ([`trace::trace_len_max`]) and `LOCKSTEP_SIM_TRACE_DIR` (an existing directory,
/// where every run writes its trace). The simulator's commands call it before any run: a bad value is bad input
/// (exit 2) naming the variable, not a panic in the middle of a sweep.
pub fn check_environment() -> Result<(), String> {
    try_wall_limit()?;
    trace::try_trace_len_max()?;
    if let Some(dir) = std::env::var_os("LOCKSTEP_SIM_TRACE_DIR") {
        let path = std::path::Path::new(&dir);
        if !path.is_dir() {
            return Err(format!(
                "LOCKSTEP_SIM_TRACE_DIR={}: not a directory (every run writes its trace there)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// What a run that passed its wall-clock limit with its simulated time still advancing outgrew
/// ([`RunReport::outgrown`]), `reached` being the simulated time of its last trace event then.
fn outgrown_wall(limit: std::time::Duration, reached: Duration) -> String {
    format!(
        "it passed its wall-clock limit of {} s with simulated time still advancing (at {:.1} s of simulated time; \
         LOCKSTEP_SIM_WALL_LIMIT_SECS sets the limit)",
        limit.as_secs(),
        reached.as_secs_f64()
    )
}

/// What a run that passed its wall-clock limit with its simulated time standing still reports as its panic.
fn stuck(limit: std::time::Duration) -> String {
    format!(
        "the run passed its wall-clock limit of {} s while simulated time stood still: some code never yields (a \
         busy loop or a blocking call in a handler, or `std::thread::sleep`), so the simulated clock cannot advance; \
         the trace's last lines show where it stopped (LOCKSTEP_SIM_WALL_LIMIT_SECS sets the limit)",
        limit.as_secs()
    )
}

/// Where a test's failing seed is replayed from: its package, test file and test name.
#[derive(Clone, Copy, Debug)]
pub struct Replay {
    /// The package the test belongs to: `env!("CARGO_PKG_NAME")` in the test file, so the command runs from
    /// anywhere in a workspace.
    pub package: &'static str,
    /// The test file's stem, e.g. `sim_world`.
    pub test: &'static str,
    /// The test function, e.g. `mixed_faults_hold_every_invariant`.
    pub name: &'static str,
}

impl Replay {
    /// The exact command that replays `seed` (with the `sim-test` alias of lockstep's `.cargo/config.toml`).
    pub fn command(&self, seed: u64) -> String {
        format!(
            "env -u RUSTFLAGS MADSIM_TEST_SEED={seed} cargo sim-test -p {} --test {} -- {} --exact",
            self.package, self.test, self.name
        )
    }
}

/// The seeds a simulator test runs (DESIGN §5; shared/notes/madsim.md pitfall 4):
/// - `MADSIM_TEST_NUM=N`: N seeds from `MADSIM_TEST_SEED` (or the first default seed) on;
/// - `MADSIM_TEST_SEED=S` alone: seed S only (a replay);
/// - neither: the test's pinned `default` seeds.
///
/// Panics (failing the test, never running zero seeds quietly) on a value that is not a u64, on
/// `MADSIM_TEST_NUM=0`, on a range that runs past `u64::MAX`, and on empty `default` seeds.
pub fn seeds(default: &[u64]) -> Vec<u64> {
    seeds_from(default, std::env::var("MADSIM_TEST_SEED").ok(), std::env::var("MADSIM_TEST_NUM").ok())
}

fn seeds_from(default: &[u64], seed: Option<String>, num: Option<String>) -> Vec<u64> {
    let parse = |name: &str, value: Option<String>| {
        value.map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}={v:?} must be a whole number (a u64)")))
    };
    let seeds = match (parse("MADSIM_TEST_SEED", seed), parse("MADSIM_TEST_NUM", num)) {
        (_, Some(0)) => panic!("MADSIM_TEST_NUM=0 runs no seed: give at least 1"),
        (first, Some(count)) => {
            let first = first.or(default.first().copied()).unwrap_or(1);
            let last = first.checked_add(count - 1).unwrap_or_else(|| {
                panic!("MADSIM_TEST_SEED={first} with MADSIM_TEST_NUM={count} runs past the last seed {}", u64::MAX)
            });
            (first..=last).collect()
        }
        (Some(seed), None) => vec![seed],
        (None, None) => default.to_vec(),
    };
    assert!(!seeds.is_empty(), "the test pins no seed (its default seeds are empty)");
    seeds
}

/// Threads a sweep runs seeds on: `LOCKSTEP_SIM_JOBS`, else the machine's parallelism.
pub fn jobs() -> usize {
    std::env::var("LOCKSTEP_SIM_JOBS")
        .ok()
        .and_then(|jobs| jobs.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

#[cfg(any(madsim, doc))]
/// Runs every seed of `seeds` (on [`jobs`] threads), and fails the test if any run failed: prints each failing
/// seed's checker, message, trace tail, trace file and replay command, then panics naming the seeds. Fails it
/// too if a run's world outlived it ([`RunReport::world_leaked`]). Returns
/// the reports (slimmed: no traces), by seed. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
pub fn check_seeds(scenario: &Scenario, seeds: &[u64], replay: Replay) -> Vec<RunReport> {
    check_seeds_in(scenario, seeds, replay, &failure_trace_dir())
}

#[cfg(any(madsim, doc))]
/// As [`check_seeds`], with each failing seed's whole trace written in `trace_dir` rather than in
/// `LOCKSTEP_SIM_TRACE_DIR` or the system's temp dir: a test that expects seeds to fail (a planted bug, under
/// `#[should_panic]`) gives it a directory of its own and removes it, so its runs leave nothing behind. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
pub fn check_seeds_in(
    scenario: &Scenario,
    seeds: &[u64],
    replay: Replay,
    trace_dir: &std::path::Path,
) -> Vec<RunReport> {
    let reports = run_seeds(scenario, seeds);
    let failed: Vec<&RunReport> = reports.iter().filter(|report| !report.passed()).collect();
    for report in &failed {
        eprintln!("{}", failure_text_in(report, replay, trace_dir));
    }
    let leaked: Vec<u64> = reports.iter().filter(|report| report.world_leaked).map(|report| report.seed).collect();
    assert!(
        leaked.is_empty(),
        "scenario {}: the worlds of seeds {leaked:?} outlived their runs (a task still holds the trace after the \
         teardown): each such run leaks its world, and a sweep's memory grows with its seeds",
        scenario.name
    );
    if let Some(first) = failed.first() {
        let seeds: Vec<u64> = failed.iter().map(|report| report.seed).collect();
        panic!(
            "scenario {}: {} of {} seeds failed: {seeds:?}\nfirst failure: {}\nreplay: {}",
            scenario.name,
            failed.len(),
            reports.len(),
            summary(first),
            replay.command(first.seed)
        );
    }
    reports.into_iter().map(RunReport::slim).collect()
}

#[cfg(any(madsim, doc))]
/// Runs every seed of `seeds` on [`jobs`] threads; returns the reports by seed, traces kept only for failures.
/// Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
pub fn run_seeds(scenario: &Scenario, seeds: &[u64]) -> Vec<RunReport> {
    run_seeds_with(scenario, seeds, jobs(), &|_| {})
}

#[cfg(madsim)]
/// Runs every seed of `seeds` on `jobs` threads (at least one), calling `done` with each report as its run
/// ends (from the thread that ran it, in completion order: a sweep's progress bar); returns the reports by
/// seed, traces kept only for failures.
pub fn run_seeds_with(
    scenario: &Scenario,
    seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn(&RunReport) + Sync),
) -> Vec<RunReport> {
    let reports = Mutex::new(Vec::with_capacity(seeds.len()));
    let seed_at = |i: u64| usize::try_from(i).ok().and_then(|i| seeds.get(i)).copied();
    let never = std::sync::atomic::AtomicBool::new(false);
    for_each_seed(scenario, &seed_at, jobs, &never, &|report| {
        let report = if report.passed() { report.slim() } else { report };
        done(&report);
        reports.lock().unwrap_or_else(|p| p.into_inner()).push(report);
    });
    let mut reports = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    reports.sort_by_key(|report| report.seed);
    reports
}

#[cfg(madsim)]
/// Runs the seeds `seed_at(0)`, `seed_at(1)`, … up to the first `None`, on `jobs` threads (at least one), and
/// hands each report to `done` as its run ends (from the thread that ran it, in completion order), keeping
/// nothing: what a sweep keeps is up to `done` (a sweep of a million seeds keeps counts, not reports). Once
/// `stop` is set no seed starts; the runs under way finish and are handed over, then this returns.
pub fn for_each_seed(
    scenario: &Scenario,
    seed_at: &(dyn Fn(u64) -> Option<u64> + Sync),
    jobs: usize,
    stop: &std::sync::atomic::AtomicBool,
    done: &(dyn Fn(RunReport) + Sync),
) {
    for_each(seed_at, jobs, stop, &|seed| done(run(scenario, seed)));
}

#[cfg(madsim)]
/// Calls `each` with the seeds `seed_at(0)`, `seed_at(1)`, … up to the first `None`, on `jobs` threads (at least
/// one); once `stop` is set no call starts, the calls under way finish, then this returns. What a seed runs is up
/// to `each`: [`for_each_seed`] runs one scenario under every seed, a swarm draws each seed's own world first.
pub fn for_each(
    seed_at: &(dyn Fn(u64) -> Option<u64> + Sync),
    jobs: usize,
    stop: &std::sync::atomic::AtomicBool,
    each: &(dyn Fn(u64) + Sync),
) {
    use std::sync::atomic::Ordering;
    share_one_malloc_arena();
    let next = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let Some(seed) = seed_at(next.fetch_add(1, Ordering::SeqCst)) else { break };
                    each(seed);
                }
            });
        }
    });
}

/// Makes glibc's malloc serve every thread from one arena, once per process (a no-op elsewhere). Every simulator
/// run calls it ([`run_within`], [`for_each_seed`]), and so do harnesses that build a runtime of their own
/// (`benches/controller_scale.rs`), so that every world allocates as the simulator's runs do.
///
/// Each run has a fresh OS thread (see the module docs), and glibc gives threads arenas of their own, up to eight
/// per core: a sweep's threads end up spread over many arenas, each keeping its own freed but fragmented pages,
/// and the peak resident set grew with the number of seeds, not with the largest world (docs/benchmarks-history.md,
/// "(5) Sweep memory": rows-mixed at `--jobs 2` peaked at 26.9 MB for 1 000 seeds and 34.6 MB for 30 000). With one
/// arena the same sweeps peak at 16.1 MB for 1 000 seeds and 17.9 MB for 5 000, at the same speed: a run spends
/// its time in the simulation, not in the allocator's lock. A thread's own arena also grows its heap by a system
/// call per page past its peak, with none of the main arena's padding: a third of a 10 000-job gang restart's CPU
/// in `benches/controller_scale.rs` (docs/benchmarks-history.md, "Passes that read only what changed"). Changes
/// no run: allocation addresses never
/// reach a trace. The `lockstep` binary and the benches allocate with mimalloc instead (Cargo.toml), for which
/// this does nothing; it still serves the tests and a user's own simulator binary on glibc's allocator.
#[cfg(madsim)]
pub fn share_one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets a parameter of glibc's allocator; M_ARENA_MAX bounds the arenas it creates
        // from now on and is safe to set while other threads allocate (glibc reads it under its arena lock).
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        });
    }
}

/// What a run that outgrew one run ([`RunReport::outgrown`]) tells its user to change: the scenario's keys that
/// make a run large.
pub const OUTGROWN_ADVICE: &str = "the scenario is too large for one run (not a failure of the system under test): \
     shorten workload.span, lower workload.jobs_per_minute, workload.claims_per_minute or workload.rows_max, or \
     run fewer topology.replicas (every hint wakes every replica's fetchers)";

/// One line: what failed in `report`.
pub fn summary(report: &RunReport) -> String {
    if let Some(what) = &report.outgrown {
        return format!("seed {}: the run outgrew one run: {what}; {OUTGROWN_ADVICE}", report.seed);
    }
    match &report.panic {
        Some(panic) => format!("seed {}: the run panicked: {panic}", report.seed),
        None => {
            let violations: Vec<String> = report.violations.iter().map(Violation::to_string).collect();
            format!("seed {}: {}", report.seed, violations.join(" | "))
        }
    }
}

/// Everything a failing run prints: what failed, the trace tail, the trace file, the replay command.
///
/// The whole trace goes to a file of its own in `LOCKSTEP_SIM_TRACE_DIR`, else the system's temp dir, named after
/// the scenario, the seed and this process (`lockstep-sim-{scenario}-seed-{seed}-{pid}[-n].trace`), created anew
/// (never overwriting or following a file already there: another run's, or a link someone planted).
pub fn failure_text(report: &RunReport, replay: Replay) -> String {
    failure_text_in(report, replay, &failure_trace_dir())
}

/// Where [`failure_text`] writes a failing run's trace: `LOCKSTEP_SIM_TRACE_DIR`, else the system's temp dir.
fn failure_trace_dir() -> std::path::PathBuf {
    std::env::var_os("LOCKSTEP_SIM_TRACE_DIR").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

/// As [`failure_text`], with the trace file written in `dir`.
pub fn failure_text_in(report: &RunReport, replay: Replay, dir: &std::path::Path) -> String {
    let stem = format!("lockstep-sim-{}-seed-{}-{}", report.scenario, report.seed, std::process::id());
    let written = match write_new(dir, &stem, report.trace_text().as_bytes()) {
        Ok(path) => format!("{} (written)", path.display()),
        Err(error) => format!("not written: {error}"),
    };
    let tail = trace::render(&report.trace[report.trace.len().saturating_sub(FAILED_TRACE_TAIL)..]);
    format!(
        "==== scenario {} {}\n---- last {FAILED_TRACE_TAIL} trace events:\n{tail}---- whole trace: {written}\n---- replay: {}\n",
        report.scenario,
        summary(report),
        replay.command(report.seed)
    )
}

/// Most names [`write_new`] tries before it gives up.
const NEW_FILE_TRIES_MAX: usize = 100;

/// Writes `bytes` to a file that did not exist, `dir/{stem}.trace` or else `dir/{stem}-{n}.trace`; returns its path.
fn write_new(dir: &std::path::Path, stem: &str, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    for n in 0..NEW_FILE_TRIES_MAX {
        let name = if n == 0 { format!("{stem}.trace") } else { format!("{stem}-{n}.trace") };
        let path = dir.join(name);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut file) => return file.write_all(bytes).map(|()| path),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(std::io::Error::other(format!("{NEW_FILE_TRIES_MAX} files named {stem}*.trace exist in {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> Option<String> {
        Some(value.to_string())
    }

    #[test]
    fn seeds_are_the_pinned_ones_a_replayed_one_or_a_counted_range() {
        assert_eq!(seeds_from(&[4, 9], None, None), vec![4, 9]);
        assert_eq!(seeds_from(&[4, 9], text("17"), None), vec![17]);
        assert_eq!(seeds_from(&[4, 9], None, text("3")), vec![4, 5, 6]);
        assert_eq!(seeds_from(&[4, 9], text("10"), text("2")), vec![10, 11]);
        assert_eq!(seeds_from(&[], text(&u64::MAX.to_string()), text("1")), vec![u64::MAX]);
    }

    #[test]
    fn a_run_at_its_wall_limit_is_stuck_if_simulated_time_stood_still_else_outgrown() {
        let limit = std::time::Duration::from_secs(4);
        let still = judge_wall_limit(limit, Duration::from_secs(7), Duration::from_secs(7));
        assert_eq!(still, Ended::Panic(stuck(limit)));
        let advancing = judge_wall_limit(limit, Duration::from_secs(7), Duration::from_millis(7_500));
        let Ended::Outgrown(what) = advancing else { panic!("an advancing run is stuck: {advancing:?}") };
        assert!(what.contains("wall-clock limit of 4 s with simulated time still advancing"), "{what}");
        assert!(what.contains("at 7.5 s of simulated time") && what.contains("LOCKSTEP_SIM_WALL_LIMIT_SECS"), "{what}");
    }

    #[test]
    fn a_failure_trace_never_overwrites_a_file_already_there() {
        let dir = std::env::temp_dir().join(format!("lockstep-write-new-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.trace"), "someone else's").unwrap();
        let path = write_new(&dir, "t", b"ours").unwrap();
        assert_eq!(path, dir.join("t-1.trace"));
        assert_eq!(std::fs::read_to_string(dir.join("t.trace")).unwrap(), "someone else's");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ours");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[should_panic(expected = "MADSIM_TEST_NUM=0 runs no seed")]
    fn zero_seeds_are_refused() {
        seeds_from(&[1], None, text("0"));
    }

    #[test]
    #[should_panic(expected = "runs past the last seed")]
    fn a_range_past_the_last_seed_is_refused() {
        seeds_from(&[1], text(&u64::MAX.to_string()), text("2"));
    }

    #[test]
    #[should_panic(expected = "must be a whole number")]
    fn a_seed_that_is_not_a_number_is_refused() {
        seeds_from(&[1], text("seven"), None);
    }
}
