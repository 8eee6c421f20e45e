//! The run of one scenario file on real processes (see the module above): phases as the simulator's
//! (`sim::run`), on the wall clock.
//!
//! 0. load the scenario and map every fault of its schedule ([`crate::sim::faults::schedule`]) to its real form;
//!    a fault without one refuses the run (unless `skip_refused`, which lists what it left out);
//! 1. create the run's schema (history on), start the replicas, insert the workload while the faults run;
//! 2. at the heal time every paused replica continues and every killed one is started again;
//! 3. wait until every workload row is final, at most the liveness bound, and snapshot the rows;
//! 4. SIGTERM every replica (a drain) and wait for it; a lease ttl later snapshot the rows, the events and the
//!    history;
//! 5. run the simulator's checkers ([`RunReport::judge`]) and write the history and the fault log to the run's
//!    directory; drop the schema unless kept.
//!
//! Interrupted (the `interrupt` future of [`run`] resolves: Ctrl-C or SIGTERM in `lockstep chaos run`), at any
//! phase: no fault starts or goes on (the fault tasks are aborted, the links healed, no node starts again), every
//! node stops on the normal end's path ([`World::stop_all`]: SIGCONT and SIGTERM, a wait within the drain budget,
//! SIGKILL past it; an agent kills its jobs), the fault log and the trace are written, the history too if
//! PostgreSQL still reads it, and the schema is dropped unless kept: an [`Ended::Interrupted`], without checkers.

use super::gang;
use super::jobs::{self, AgentRecord, RecordLog, RecordedEnd};
use super::links::{Links, base_mode, links_of};
use super::{RealFault, real_fault};
use crate::gang::model::KIND_NODE;
use crate::sim::faults::schedule;
use crate::sim::gang::{agent_name, is_gang_row};
use crate::sim::run::{Outcome, unfinished_operations};
use crate::sim::trace::{Trace, TraceEvent};
use crate::sim::workload::{self, ClientReport, WorkloadSpec};
use crate::sim::{Fault, RunReport, Scenario, ScenarioFile, rng};
use crate::store::{Commit, Lease, NewRow, PgOptions, PgStore, Row, RowId, Store, StoreError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How often the harness reads the rows while it waits for them to become final.
const CONVERGENCE_POLL: Duration = Duration::from_millis(500);

/// Longest the harness waits for a SIGKILLed agent's job shells to die with it (the kernel's `PR_SET_PDEATHSIG`
/// acts at once; this only bounds a wait on a loaded machine).
const PROCESS_DEATH_WAIT_MAX: Duration = Duration::from_secs(2);

/// How long a paused agent runs before its jobs continue (`agent-pause`): time to fence, if its node lease ran
/// out while it slept, before its jobs could run beside their replacements.
const AGENT_WAKE_BEFORE_JOBS: Duration = Duration::from_millis(1000);

/// How often a drain looks whether its nodes exited.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How often a pause that waits for its replica to be inside a pass (`[faults] pause_inside_pass`) looks.
const PASS_POLL: Duration = Duration::from_millis(10);

/// How old a lease must be (from the start of its fetch's transaction) before a pause counts its replica as
/// working under it (`[faults] pause_inside_pass`), besides its related locks: time for the fetch's reply to come
/// back over a slow proxy link, a worker to take the row and its refetch by token to come back. Paused before
/// that, the replica drops the lease unused on waking (its local deadline passed, or the refetch finds the token
/// superseded: a read, recorded nowhere), writing nothing stale. 1 s was too short on a loaded machine with 50 ms
/// per chunk: in one run, two of three pauses made 1 s after their fetch left nothing stale.
const PASS_SETTLE: Duration = Duration::from_secs(2);

/// Attempts of one harness insert before the run fails (the harness's own session is never faulted, apart from
/// a server that really goes away).
const INSERT_ATTEMPTS_MAX: u32 = 20;

/// What `lockstep chaos run` was asked to do.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// The scenario file.
    pub scenario: PathBuf,
    /// The PostgreSQL URL (never printed).
    pub database_url: String,
    /// Where `database_url` came from, as messages about it name it: `--database-url`, `--database-url-file PATH`
    /// or `DATABASE_URL` (real mode's rule; a trial's error named "--database-url or DATABASE_URL").
    pub database_url_source: String,
    /// The seed of the workload and of random fault processes; default the file's first.
    pub seed: Option<u64>,
    /// Keep the run's schema (rows, events, history) instead of dropping it.
    pub keep: bool,
    /// Every scenario time (fault times, spans and downs, the workload span) is multiplied by this; the workload's
    /// rates are divided by it, so the rows stay as many. Lease ttls and processing times are not scaled.
    pub time_scale: f64,
    /// Leave out faults that have no real form (listed) instead of refusing the run.
    pub skip_refused: bool,
    /// The `lockstep` binary the run's nodes run (`lockstep chaos serve`, `lockstep chaos agent`).
    pub exe: PathBuf,
    /// Where the run's logs, history and fault log go; default a new directory in the system's temp dir.
    pub out: Option<PathBuf>,
    /// The planted bug: the replicas' guarded apply skips its token guard (mutation testing only).
    pub apply_guard_off: bool,
}

/// The end of a run: its report, its directory, and the faults it left out.
#[derive(Debug)]
pub struct ChaosRun {
    /// What the checkers found, counts, and the wall time (`simulated` is wall time here too).
    pub report: RunReport,
    /// The run's directory: `history.txt` (every recorded commit), `faults.txt`, the replicas' logs.
    pub dir: PathBuf,
    /// The schema of the run (dropped unless kept).
    pub schema: String,
    /// Faults left out (`skip_refused`), each with its reason.
    pub skipped: Vec<String>,
    /// Where each replica `pause` landed, with `[faults] pause_inside_pass` (empty without), in pause order.
    pub landings: Vec<PauseLanding>,
}

/// How a run ended: it ran to its checkers, or a signal stopped it first.
#[derive(Debug)]
pub enum Ended {
    /// The run ended and the checkers judged it.
    Ran(Box<ChaosRun>),
    /// The run's `interrupt` resolved before its end: it stopped without checkers.
    Interrupted(Interrupted),
}

/// What an interrupted run did on its way out (`lockstep chaos run` prints it).
#[derive(Debug)]
pub struct Interrupted {
    /// What interrupted it, as the `interrupt` future named it (`Ctrl-C`, `SIGTERM`).
    pub signal: &'static str,
    /// Wall time from the start of the run to the interrupt.
    pub at: Duration,
    /// How the nodes stopped: `Err` lists those that did not end cleanly on SIGTERM within the drain budget (each
    /// was SIGKILLed then) or ended with a failure.
    pub stopped: Result<(), String>,
    /// The run's directory: `faults.txt`, `trace.txt`, `history.txt` (when read) and the nodes' logs.
    pub dir: PathBuf,
    /// The commits written to `history.txt`, or why the history could not be read (then no `history.txt`).
    pub history: Result<usize, String>,
    /// The run's schema.
    pub schema: String,
    /// Whether the schema is gone: false when kept (`keep`) or when its drop failed (said on stderr).
    pub dropped: bool,
}

/// Where a replica's `pause` landed under the scenario's `[faults] pause_inside_pass`.
#[derive(Clone, Debug, PartialEq)]
pub struct PauseLanding {
    /// The paused replica (`replica-0`).
    pub node: String,
    /// When it was SIGSTOPped (or the pause gave up), wall time since the start of the run.
    pub at: Duration,
    /// How long the pause waited past its time for the replica to be inside a pass.
    pub waited: Duration,
    /// The lease the replica was working under when it stopped; `None`: it was not seen inside a pass (with
    /// another replica free to take its rows over) within the bound, and the pause was skipped.
    pub lease: Option<Lease>,
}

impl PauseLanding {
    /// The landing as trace fields: `inside-pass=5#123 waited=213ms`, or `inside-pass=none waited=10s`.
    pub fn fields(&self) -> String {
        let lease = self.lease.map_or_else(|| "none".to_string(), |lease| format!("{}#{}", lease.id, lease.token));
        format!("inside-pass={lease} waited={:?}", self.waited)
    }
}

/// Why a run did not happen or did not finish: exit code 2 (the input) or 1 (the world).
#[derive(Debug)]
pub struct ChaosError {
    /// 2: a scenario or flag the harness refuses; 1: the database or a process failed.
    pub code: u8,
    /// What went wrong.
    pub message: String,
}

fn usage(message: impl Into<String>) -> ChaosError {
    ChaosError { code: 2, message: message.into() }
}

fn runtime(message: impl Into<String>) -> ChaosError {
    ChaosError { code: 1, message: message.into() }
}

/// Runs the scenario file of `options` on real processes and PostgreSQL, and checks it; stops early, without
/// checkers, when `interrupt` resolves (with the name of what interrupted it) before the run's end (module docs).
///
/// Errors: a scenario the harness cannot run (gang parts, pipeline sets, faults without a real form), the
/// database or a replica process that cannot be started.
pub async fn run(
    mut options: ChaosOptions,
    interrupt: impl std::future::Future<Output = &'static str>,
) -> Result<Ended, ChaosError> {
    let file = ScenarioFile::load(&options.scenario).map_err(|error| usage(error.to_string()))?;
    let scenario = file.scenario.clone();
    if scenario.gang.is_some() && scenario.workload.rows_max > 0 {
        return Err(usage(format!(
            "{}: a gang scenario with a row workload is not run by `lockstep chaos run` yet: give it one or the other",
            options.scenario.display()
        )));
    }
    if scenario.pipelines.is_some() {
        return Err(usage("pipeline sets need their handlers, which only the simulator build links in"));
    }
    // A planted bug of the scenario file runs as in the simulator, or the run is refused: never ignored, or a
    // user would read a pass as the checkers missing it.
    let mutation = &scenario.mutation;
    if mutation.agent_drift_beyond_margin {
        return Err(usage(format!(
            "{}: [mutation] agent_drift_beyond_margin needs agent clock drift, which is not possible on real processes",
            options.scenario.display()
        )));
    }
    if mutation.lingering_gate_disabled {
        return Err(usage(format!(
            "{}: [mutation] lingering_gate_disabled is run only by the simulator: a chaos replica has no switch for it",
            options.scenario.display()
        )));
    }
    if mutation.related_age_rule_disabled {
        return Err(usage(format!(
            "{}: [mutation] related_age_rule_disabled is a MemStore switch; PostgreSQL's related locks always apply \
             the age rule",
            options.scenario.display()
        )));
    }
    if mutation.retry_wake_disabled {
        return Err(usage(format!(
            "{}: [mutation] retry_wake_disabled plants a late retry, which only the simulator judges (checker              retries, rule 4, in simulated time); a chaos run's wall time on a shared machine is not judged",
            options.scenario.display()
        )));
    }
    options.apply_guard_off |= mutation.apply_guard_disabled;
    if !(options.time_scale > 0.0 && options.time_scale <= 100.0) {
        return Err(usage(format!("--time-scale {}: must be in (0, 100]", options.time_scale)));
    }
    let seed = options.seed.unwrap_or(file.seeds[0]);
    let (faults, skipped) = plan(&scenario, seed, &options)?;
    let schema = format!("chaos_{}_{}", std::process::id(), rand::random::<u32>());
    let dir = match &options.out {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("lockstep-{schema}")),
    };
    std::fs::create_dir_all(&dir).map_err(|e| usage(format!("--out {}: {e}", dir.display())))?;
    // A run refused before it began leaves no directory behind (only an empty one is removed: `--out` may name a
    // directory of the user's).
    let refused = |failure: ChaosError| {
        let _ = std::fs::remove_dir(&dir);
        failure
    };
    // The proxies first: a URL they cannot serve is refused before the run's schema exists.
    let source = &options.database_url_source;
    let (upstream, rewrite) = proxied_url(&options.database_url, source).await.map_err(refused)?;
    let nodes = scenario.replicas + scenario.agents();
    let links = Links::start(nodes, upstream, seed, base_mode(&scenario.net_latency))
        .await
        .map_err(|e| refused(runtime(format!("the chaos proxies cannot listen: {e}"))))?;
    let urls = (0..nodes).map(|index| rewrite(links.proxy(index).local_addr())).collect();
    let mut store_options = PgOptions::new(options.database_url.clone());
    store_options.schema = schema.clone();
    store_options.application_name = format!("lockstep chaos {schema}");
    store_options.history = true;
    store_options.max_connections = 4;
    // In real mode's words (`lockstep serve`): a URL the server refuses is the flag's fault (exit 2), a server
    // that cannot be reached is "cannot connect" (exit 1).
    let store = PgStore::connect_with(store_options).await.map_err(|error| {
        refused(match error {
            StoreError::Invalid(message) => usage(format!("{source}: {message}")),
            error @ (StoreError::Unavailable(_) | StoreError::Timeout(_)) => {
                runtime(format!("cannot connect to PostgreSQL (URL from {source}): {error}"))
            }
            error => runtime(format!("cannot open schema {schema} on PostgreSQL: {error}")),
        })
    })?;
    let world = World {
        options: options.clone(),
        scenario: Arc::new(scenario.clone()),
        schema: schema.clone(),
        dir: dir.clone(),
        seed,
        nodes: Mutex::default(),
        links,
        urls,
        pause_inside_pass: file.scenario.faults.pause_inside_pass,
        landings: Mutex::default(),
        stopped: AtomicBool::new(false),
    };
    let world = Arc::new(world);
    let trace = Trace::new();
    // Interrupted, the run's future is dropped where it was: its fault and client tasks are aborted with it.
    let ended = tokio::select! {
        outcome = world.clone().run(&store, faults, trace.clone()) => Ok(outcome),
        signal = interrupt => Err(signal),
    };
    if let Err(signal) = ended {
        trace.record(&Arc::from("world"), "interrupted", signal);
    }
    let at = trace.elapsed();
    let stopped = world.stop_all().await;
    let outcome = match ended {
        Ok(outcome) => outcome,
        Err(signal) => {
            let history = store.history().await.map_err(|error| error.to_string());
            write_files(&dir, history.as_deref().ok(), &trace.events());
            let dropped = !options.keep && drop_schema(&options, &schema).await;
            let history = history.map(|history| history.len());
            return Ok(Ended::Interrupted(Interrupted { signal, at, stopped, dir, history, schema, dropped }));
        }
    };
    let (outcome, trace, wall) = match outcome {
        Ok(done) => done,
        Err(error) => {
            drop_schema(&options, &schema).await;
            return Err(error);
        }
    };
    write_files(&dir, Some(&outcome.history), &trace);
    let mut report = RunReport { wall, simulated: wall, trace, ..RunReport::empty(&scenario, seed) };
    report.judge(&scenario, outcome);
    if !options.keep {
        drop_schema(&options, &schema).await;
    }
    let landings = std::mem::take(&mut *world.landings.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Ended::Ran(Box::new(ChaosRun { report, dir, schema, skipped, landings })))
}

/// Drops the run's schema; false (said on stderr) when it could not.
async fn drop_schema(options: &ChaosOptions, schema: &str) -> bool {
    match PgStore::drop_schema(&options.database_url, schema).await {
        Ok(()) => true,
        Err(error) => {
            eprintln!("lockstep chaos: the schema {schema} was not dropped: {error}");
            false
        }
    }
}

/// Faults at their wall-clock offsets from the start of the run.
type Planned = Vec<(Duration, RealFault)>;

/// The faults of the run in wall time (scaled), each mapped to its real form; the refused ones are an error, or
/// with `skip_refused` a list.
fn plan(scenario: &Scenario, seed: u64, options: &ChaosOptions) -> Result<(Planned, Vec<String>), ChaosError> {
    let mut faults = Vec::new();
    let mut refused = Vec::new();
    let rate_min = scenario.gang.as_ref().map_or(0, |gang| gang.agent_rate_min_ppm());
    for event in schedule(&scenario.faults, seed, scenario.replicas, scenario.agents(), rate_min) {
        let real = real_fault(&event.fault, true).and_then(|fault| match &fault {
            RealFault::Network(network) => links_of(network, scenario.replicas, scenario.agents()).map(|_| fault),
            _ => Ok(fault),
        });
        match real {
            Ok(fault) => faults.push((event.at.mul_f64(options.time_scale), scale(fault, options.time_scale))),
            Err(reason) => refused.push(format!("at {}: {reason}", crate::duration::format(event.at))),
        }
    }
    if !refused.is_empty() && !options.skip_refused {
        return Err(usage(format!(
            "{} no real form here (--skip-refused runs the scenario without them): {}",
            crate::text::count_as(refused.len() as u64, "fault has", "faults have"),
            refused.join("; ")
        )));
    }
    Ok((faults, refused))
}

fn scale(fault: RealFault, by: f64) -> RealFault {
    match fault {
        RealFault::Kill { replica, down } => RealFault::Kill { replica, down: down.mul_f64(by) },
        RealFault::Pause { replica, span } => RealFault::Pause { replica, span: span.mul_f64(by) },
        RealFault::AgentKill { agent, down } => RealFault::AgentKill { agent, down: down.mul_f64(by) },
        RealFault::AgentPause { agent, span } => RealFault::AgentPause { agent, span: span.mul_f64(by) },
        RealFault::Network(fault) => RealFault::Network(match fault {
            Fault::Partition { a, b, span } => Fault::Partition { a, b, span: span.mul_f64(by) },
            Fault::Isolate { node, span } => Fault::Isolate { node, span: span.mul_f64(by) },
            Fault::Degrade { latency, loss, span } => Fault::Degrade { latency, loss, span: span.mul_f64(by) },
            Fault::LostReplies { chance, span } => Fault::LostReplies { chance, span: span.mul_f64(by) },
            Fault::StoreHang { node, span } => Fault::StoreHang { node, span: span.mul_f64(by) },
            other => other,
        }),
        other => other,
    }
}

/// The address of the server `url` names (the proxies' upstream), and a function from a proxy's listener to
/// `url` with its host and port replaced by it and `sslmode=disable` (that proxy's replica's database URL; every
/// other part kept).
///
/// Errors: a URL that does not parse or names no host (a Unix socket cannot be proxied), one whose `sslmode`
/// demands TLS (the proxies read the sessions' startup messages), a host that does not resolve.
async fn proxied_url(url: &str, source: &str) -> Result<(SocketAddr, impl Fn(SocketAddr) -> String), ChaosError> {
    let parsed = url::Url::parse(url).map_err(|e| usage(format!("{source}: not a URL: {e}")))?;
    let host = parsed
        .host_str()
        .filter(|host| !host.is_empty())
        .ok_or_else(|| usage(format!("{source}: names no host; the chaos proxy needs a TCP address")))?
        .trim_matches(['[', ']'])
        .to_string();
    // The proxies read each session's startup message (its application_name picks the faults' sessions), which
    // TLS would hide: a chaos run's links carry plain text, and a URL that demands TLS is refused.
    let tls = |key: &str| key == "sslmode" || key == "ssl-mode";
    if let Some((_, mode)) = parsed.query_pairs().find(|(key, _)| tls(key))
        && matches!(&*mode, "require" | "verify-ca" | "verify-full")
    {
        return Err(usage(format!(
            "{source}: sslmode={mode}: a chaos run's proxies read each session's startup message, which TLS would \
             hide; give a URL without it (its links carry plain text)"
        )));
    }
    let port = parsed.port().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| runtime(format!("{source}: the host {host} does not resolve")))?;
    let rewrite = move |proxy: SocketAddr| {
        let mut url = parsed.clone();
        let _ = url.set_host(Some(&proxy.ip().to_string()));
        let _ = url.set_port(Some(proxy.port()));
        let kept: Vec<(String, String)> =
            parsed.query_pairs().filter(|(key, _)| !tls(key)).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        url.query_pairs_mut().clear().extend_pairs(kept).append_pair("sslmode", "disable");
        url.to_string()
    };
    Ok((upstream, rewrite))
}

/// One node process (a replica or an agent) and what a fault did to it.
#[derive(Default)]
struct Node {
    child: Option<Child>,
    paused: bool,
    /// SIGTERM was sent to the running process (a drain): another would end its drain at once.
    stopping: bool,
    /// Processes started for this node (the first and every restart).
    starts: u32,
}

struct World {
    options: ChaosOptions,
    scenario: Arc<Scenario>,
    schema: String,
    dir: PathBuf,
    seed: u64,
    /// Replicas first, then agents (agent `i` is node `replicas + i`).
    nodes: Mutex<Vec<Node>>,
    /// One chaos proxy per node: its link to PostgreSQL.
    links: Links,
    /// Node `i`'s database URL: its proxy's listener.
    urls: Vec<String>,
    /// The scenario file's `[faults] pause_inside_pass`.
    pause_inside_pass: Option<Duration>,
    /// Where each replica pause landed, with `pause_inside_pass` on.
    landings: Mutex<Vec<PauseLanding>>,
    /// The run is ending ([`World::stop_all`]): no node starts again, no fault begins.
    stopped: AtomicBool,
}

/// Tasks of a run that must not outlive it: aborted when dropped (an interrupted run's future is dropped where it
/// was, and a fault task would otherwise go on killing and starting nodes).
#[derive(Default)]
struct Tasks(Vec<tokio::task::AbortHandle>);

impl Tasks {
    fn add<T>(&mut self, task: &tokio::task::JoinHandle<T>) {
        self.0.push(task.abort_handle());
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::AbortHandle::abort);
    }
}

impl World {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Node>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn replicas(&self) -> usize {
        self.scenario.replicas
    }

    /// The node's name in traces: `replica-{i}` or `agent-{i}`.
    fn node_name(&self, index: usize) -> Arc<str> {
        match index.checked_sub(self.replicas()) {
            None => Arc::from(format!("replica-{index}")),
            Some(agent) => Arc::from(agent_name(agent)),
        }
    }

    fn replica_name(&self, index: usize) -> String {
        format!("{}-replica-{index}", self.schema)
    }

    /// The PostgreSQL application_name of node `index`'s sessions (scoped to the run's schema).
    fn application_name(&self, index: usize) -> String {
        match index.checked_sub(self.replicas()) {
            None => format!("lockstep serve {}", self.replica_name(index)),
            Some(agent) => format!("lockstep agent {}-agent-{agent}", self.schema),
        }
    }

    /// Agent `agent`'s record file.
    fn records_path(&self, agent: usize) -> PathBuf {
        self.dir.join(format!("agent-{agent}.records"))
    }

    /// Starts a process for node `index` (its log appended to `replica-{i}.log` or `agent-{i}.log`), in a process
    /// group of its own: a Ctrl-C at the terminal reaches the harness alone, which stops the nodes in order.
    ///
    /// Errors: the run is ending ([`World::stop_all`]), the log or the process cannot be started.
    fn start(&self, index: usize) -> Result<(), ChaosError> {
        let name = self.node_name(index);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .map_err(|e| runtime(format!("{name} log: {e}")))?;
        let err = log.try_clone().map_err(|e| runtime(format!("{name} log: {e}")))?;
        let mut command = Command::new(&self.options.exe);
        match index.checked_sub(self.replicas()) {
            None => self.replica_command(&mut command, index),
            Some(agent) => self.agent_command(&mut command, agent),
        }
        command
            .arg("--schema")
            .arg(&self.schema)
            .env("DATABASE_URL", &self.urls[index])
            .env("RUST_LOG", std::env::var("LOCKSTEP_CHAOS_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        // A node must not outlive the harness (a harness ended by Ctrl-C or SIGKILL would leave it running on
        // the schema): the kernel SIGKILLs it when the harness's thread that started it ends.
        // SAFETY: setpgid and prctl are async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setpgid(0, 0) != 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Started under the lock that `stop_all` takes after raising `stopped`: a fault's restart either sees the
        // flag or gives `stop_all` its process to stop.
        let mut nodes = self.lock();
        if self.stopped.load(Ordering::SeqCst) {
            return Err(runtime(format!("{name} not started: the run is ending")));
        }
        let child =
            command.spawn().map_err(|e| runtime(format!("cannot start {}: {e}", self.options.exe.display())))?;
        if nodes.len() <= index {
            nodes.resize_with(index + 1, Node::default);
        }
        nodes[index] = Node { child: Some(child), paused: false, stopping: false, starts: nodes[index].starts + 1 };
        Ok(())
    }

    /// `lockstep chaos serve` (hidden; `serve` with the run's history and planted bugs): the row workload's
    /// pipelines, or the gang controller with the scenario's `[controller]` settings.
    fn replica_command(&self, command: &mut Command, index: usize) {
        command.args(["chaos", "serve"]).arg("--replica").arg(self.replica_name(index)).arg("--chaos-history");
        match &self.scenario.gang {
            None => {
                command.arg("--chaos-rows").arg(&self.options.scenario).arg("--chaos-seed").arg(self.seed.to_string());
            }
            Some(gang) => {
                let c = &gang.controller;
                let ms = |d: Duration| format!("{}ms", d.as_millis());
                command
                    .args(["--workers", &c.workers.to_string(), "--lease-ttl", &ms(c.lease_ttl)])
                    .args(["--lease-margin", &ms(c.lease_margin)])
                    .args(["--min-processing-interval", &ms(c.min_processing_interval)])
                    .args(["--gang-placement", c.gang_placement.as_str()])
                    .args(["--gang-unfit-timeout", &ms(c.gang_unfit_timeout)]);
            }
        }
        if self.options.apply_guard_off {
            command.arg("--chaos-apply-guard-off");
        }
        if self.scenario.gang.is_some() && self.scenario.mutation.gang_gate_disabled {
            command.arg("--chaos-gang-gate-off");
        }
    }

    /// `lockstep chaos agent` (hidden; `agent` running the scenario's `[jobs]` rules) on its own work dir (`agent-{i}/` in the run's directory; the same after a restart, so
    /// the restarted agent ends what its predecessor's jobs left), with the scenario's `[agent]` settings and
    /// jobs.
    fn agent_command(&self, command: &mut Command, agent: usize) {
        let gang = self.scenario.gang.as_ref().expect("agents run only in gang scenarios");
        let a = &gang.agent;
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        command
            .args(["chaos", "agent"])
            .args(["--node", &agent_name(agent), "--slots", &gang.slots.to_string()])
            .arg("--work-dir")
            .arg(self.dir.join(agent_name(agent)))
            .args(["--lease-ttl", &ms(a.lease_ttl), "--lease-margin", &ms(a.lease_margin)])
            .args(["--heartbeat-trigger", &ms(a.heartbeat_trigger), "--poll-interval", &ms(a.poll_interval)])
            .arg("--chaos-jobs")
            .arg(&self.options.scenario)
            .args(["--chaos-seed", &self.seed.to_string()])
            .arg("--chaos-records")
            .arg(self.records_path(agent))
            .arg("--chaos-attempts")
            .arg(self.dir.join("attempts"))
            .args(["--chaos-time-scale", &self.options.time_scale.to_string()])
            .args(["--chaos-name", &self.application_name(self.replicas() + agent)])
            .arg("--chaos-history");
    }

    fn signal(&self, index: usize, signal: libc::c_int) -> bool {
        let nodes = self.lock();
        let Some(pid) = nodes.get(index).and_then(|r| r.child.as_ref()).and_then(Child::id) else { return false };
        // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
        unsafe { libc::kill(pid as libc::pid_t, signal) == 0 }
    }

    async fn kill(&self, index: usize) {
        let child = self.lock().get_mut(index).and_then(|r| r.child.take());
        if let Some(mut child) = child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Whether node `index` runs and is not paused (a kill or a pause may act on it).
    fn free(&self, index: usize) -> bool {
        self.lock().get(index).is_some_and(|r| r.child.is_some() && !r.paused)
    }

    /// Marks node `index` paused if it is [`World::free`], in one step: false when another fault holds it.
    fn claim_pause(&self, index: usize) -> bool {
        let mut nodes = self.lock();
        let Some(node) = nodes.get_mut(index).filter(|node| node.child.is_some() && !node.paused) else {
            return false;
        };
        node.paused = true;
        true
    }

    /// `[faults] pause_inside_pass`: waits, at most `bound`, until replica `index` is inside a pass
    /// ([`PgStore::lease_in_pass`] of its sessions, leases at least [`PASS_SETTLE`] old, read on the harness's
    /// own session every [`PASS_POLL`]) while another replica runs unpaused to take its rows over: the lease it
    /// works under, or `None` past the bound (or once the replica is no longer free to pause), and how long it
    /// waited.
    async fn wait_inside_pass(&self, index: usize, bound: Duration, store: &PgStore) -> (Option<Lease>, Duration) {
        let caller = self.application_name(index);
        let start = Instant::now();
        loop {
            let others = (0..self.replicas()).any(|other| other != index && self.free(other));
            // An error of the harness's own session is a server hiccup: look again. The proxy is looked at after
            // PostgreSQL: a message the replica sent after the server's snapshot is still on its way up then.
            if (others || self.replicas() == 1)
                && let Ok(Some(lease)) = store.lease_in_pass(&caller, PASS_SETTLE).await
                && self.links.proxy(index).requests_in_flight() == 0
            {
                return (Some(lease), start.elapsed());
            }
            if start.elapsed() >= bound || !self.free(index) {
                return (None, start.elapsed());
            }
            tokio::time::sleep(PASS_POLL).await;
        }
    }

    async fn inject(self: Arc<Self>, fault: RealFault, store: PgStore, trace: Trace, client: Arc<Client>) {
        if self.stopped.load(Ordering::SeqCst) {
            return;
        }
        match fault {
            RealFault::Kill { replica: index, down } | RealFault::AgentKill { agent: index, down } => {
                let index = if matches!(fault, RealFault::AgentKill { .. }) { self.replicas() + index } else { index };
                let node = self.node_name(index);
                if !self.free(index) {
                    trace.record(&node, "skipped", "kill: busy");
                    return;
                }
                trace.record(&node, "kill", format!("down={down:?}"));
                self.kill(index).await;
                if let Some(agent) = index.checked_sub(self.replicas()) {
                    self.jobs_died_with(agent, &trace).await;
                }
                tokio::time::sleep(down).await;
                trace.record(&node, "restart", "");
                if let Err(error) = self.start(index) {
                    trace.record(&node, "restart-failed", error.message);
                }
            }
            RealFault::Pause { replica: index, span } | RealFault::AgentPause { agent: index, span } => {
                let agent = matches!(fault, RealFault::AgentPause { .. });
                let index = if agent { self.replicas() + index } else { index };
                let node = self.node_name(index);
                if !self.free(index) {
                    trace.record(&node, "skipped", "pause: busy");
                    return;
                }
                let found = match self.pause_inside_pass {
                    Some(bound) if !agent => Some(self.wait_inside_pass(index, bound, &store).await),
                    _ => None,
                };
                // Another fault may have taken the node while the pause waited: skipped, as at its time.
                if !self.free(index) {
                    trace.record(&node, "skipped", "pause: busy");
                    return;
                }
                let landing = found.map(|(lease, waited)| PauseLanding {
                    node: node.to_string(),
                    at: trace.elapsed(),
                    waited,
                    lease,
                });
                let land = |landing: &PauseLanding| {
                    self.landings.lock().unwrap_or_else(|p| p.into_inner()).push(landing.clone());
                };
                // Not seen inside a pass within the bound: skipped, and the summary says so.
                if let Some(landing @ PauseLanding { lease: None, .. }) = &landing {
                    land(landing);
                    trace.record(&node, "skipped", format!("pause: not inside a pass {}", landing.fields()));
                    return;
                }
                if !self.claim_pause(index) {
                    trace.record(&node, "skipped", "pause: busy");
                    return;
                }
                self.signal(index, libc::SIGSTOP);
                let fields = match &landing {
                    None => format!("span={span:?}"),
                    Some(landing) => {
                        land(landing);
                        format!("span={span:?} {}", landing.fields())
                    }
                };
                trace.record(&node, "pause", fields);
                if let Some(agent) = index.checked_sub(self.replicas()) {
                    self.pause_jobs(agent);
                }
                tokio::time::sleep(span).await;
                self.resume(index).await;
                trace.record(&node, "resume", "");
            }
            RealFault::DbRestart => {
                let mut ended = 0;
                let count = self.lock().len();
                for index in 0..count {
                    ended += store.terminate_sessions(&self.application_name(index)).await.unwrap_or(0);
                }
                trace.record(&Arc::from("db"), "kill", format!("sessions={ended}"));
            }
            RealFault::Contention { claims } => {
                trace.record(&Arc::from("client"), "contention", format!("claims={claims}"));
                client.burst(&store, claims).await;
            }
            RealFault::Network(fault) => {
                let agents = self.urls.len() - self.replicas();
                let Ok(plan) = links_of(&fault, self.replicas(), agents) else { return };
                let node: Arc<str> = match plan.replicas.as_slice() {
                    [one] => self.node_name(*one),
                    _ => Arc::from("world"),
                };
                let kind = match fault {
                    Fault::Partition { .. } => "partition",
                    Fault::Isolate { .. } => "isolate",
                    Fault::Degrade { .. } => "degrade",
                    Fault::StoreHang { .. } => "store-hang",
                    _ => "lost-replies",
                };
                let before = self.links.counts(&plan.replicas);
                if !self.links.begin(&plan) {
                    trace.record(&node, "skipped", format!("{kind}: link busy"));
                    return;
                }
                trace.record(&node, kind, format!("{fault:?} as {:?}", plan.mode));
                tokio::time::sleep(plan.span).await;
                let after = self.links.counts(&plan.replicas);
                self.links.end(&plan);
                let (resets, lost, held) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
                trace.record(&node, "link-heal", format!("{kind} resets={resets} lost={lost} held={held}"));
            }
        }
    }

    /// After agent `agent` was SIGKILLed: its job shells die with it (`PR_SET_PDEATHSIG`). Waits (a bounded while)
    /// until each process its record lists as running is gone, and records its end, since the dead agent cannot.
    /// A process still alive past the bound gets no end: the gang checkers then see it run on.
    async fn jobs_died_with(&self, agent: usize, trace: &Trace) {
        let path = self.records_path(agent);
        let records = match RecordLog::read(&path) {
            Ok(records) => records,
            Err(error) => {
                trace.record(&self.node_name(self.replicas() + agent), "records-unreadable", error);
                return;
            }
        };
        let Ok(log) = RecordLog::open(&path) else { return };
        for (job, pid) in jobs::unended(&records) {
            let deadline = Instant::now() + PROCESS_DEATH_WAIT_MAX;
            let gone = loop {
                let gone = pid.is_none_or(|pid| !process_alive(pid));
                if gone || Instant::now() >= deadline {
                    break gone;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            if gone {
                log.append(&AgentRecord::End { at_us: jobs::wall_now_us(), job, end: RecordedEnd::DiedWithAgent });
            }
        }
    }

    /// Freezes the process groups of agent `agent`'s running jobs (each job shell leads its own session and
    /// group) and records their pause: the machine of a paused agent stops as a whole.
    fn pause_jobs(&self, agent: usize) {
        let path = self.records_path(agent);
        let (Ok(records), Ok(log)) = (RecordLog::read(&path), RecordLog::open(&path)) else { return };
        for (job, pid) in jobs::unended(&records) {
            let Some(pid) = pid else { continue };
            // SAFETY: kill(2) of a process group, the job shell's (it called setsid).
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGSTOP) };
            log.append(&AgentRecord::Pause { at_us: jobs::wall_now_us(), job });
        }
    }

    /// SIGCONT node `index`; for an agent, a moment later its jobs too (those it did not kill on waking: an agent
    /// whose node lease ran out while it slept fences first, killing them frozen).
    async fn resume(&self, index: usize) {
        self.signal(index, libc::SIGCONT);
        if let Some(agent) = index.checked_sub(self.replicas()) {
            tokio::time::sleep(AGENT_WAKE_BEFORE_JOBS).await;
            let path = self.records_path(agent);
            if let (Ok(records), Ok(log)) = (RecordLog::read(&path), RecordLog::open(&path)) {
                for (job, pid) in jobs::unended(&records) {
                    let Some(pid) = pid else { continue };
                    log.append(&AgentRecord::Resume { at_us: jobs::wall_now_us(), job });
                    // SAFETY: kill(2) of the job shell's process group.
                    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGCONT) };
                }
            }
        }
        if let Some(node) = self.lock().get_mut(index) {
            node.paused = false;
        }
    }

    /// Heal: every paused node continues, every killed one runs again.
    async fn heal(&self, trace: &Trace) -> Result<(), ChaosError> {
        let count = self.lock().len();
        for index in 0..count {
            let (paused, dead) = {
                let nodes = self.lock();
                (nodes[index].paused, nodes[index].child.is_none())
            };
            if paused {
                self.resume(index).await;
            }
            if dead {
                trace.record(&self.node_name(index), "restart", "heal");
                self.start(index)?;
            }
        }
        Ok(())
    }

    /// SIGTERM nodes `indexes` (each once: a second SIGTERM would end a replica's drain at once) and waits for
    /// each to stop and exit, within `budget`; SIGKILLs the ones still running past it. The processes stay in
    /// their nodes until they exited, so a drain cut short (an interrupted run) leaves them to [`World::stop_all`].
    async fn drain(&self, indexes: std::ops::Range<usize>, budget: Duration) -> Result<(), String> {
        for index in indexes.clone() {
            self.signal(index, libc::SIGCONT);
            let first = match self.lock().get_mut(index) {
                Some(node) if node.child.is_some() => !std::mem::replace(&mut node.stopping, true),
                _ => false,
            };
            if first {
                self.signal(index, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + budget;
        let mut broken = Vec::new();
        for index in indexes {
            let node = self.node_name(index);
            let ended = loop {
                let ended = {
                    let mut nodes = self.lock();
                    let Some(child) = nodes.get_mut(index).and_then(|node| node.child.as_mut()) else { break None };
                    match child.try_wait() {
                        Ok(None) if Instant::now() < deadline => None,
                        Ok(None) => {
                            let _ = child.start_kill();
                            Some(Err(format!("{node} did not drain within {budget:?}")))
                        }
                        Ok(Some(status)) if status.success() => Some(Ok(())),
                        Ok(Some(status)) => Some(Err(format!("{node} ended with {status}"))),
                        Err(error) => Some(Err(format!("{node}: {error}"))),
                    }
                };
                if ended.is_some() {
                    break ended;
                }
                tokio::time::sleep(DRAIN_POLL).await;
            };
            if let Some(ended) = ended {
                let child = self.lock().get_mut(index).and_then(|node| node.child.take());
                if let Some(mut child) = child {
                    let _ = child.wait().await;
                }
                broken.extend(ended.err());
            }
        }
        if broken.is_empty() { Ok(()) } else { Err(broken.join("; ")) }
    }

    /// The end of every run, normal, failed or interrupted: no node starts again and no fault begins, the links
    /// pass, and every node still running drains ([`World::drain`]: SIGCONT, SIGTERM, SIGKILL past the drain
    /// budget; an agent kills its jobs' process trees on SIGTERM). Returns how those nodes stopped.
    async fn stop_all(&self) -> Result<(), String> {
        let count = {
            let nodes = self.lock();
            self.stopped.store(true, Ordering::SeqCst);
            nodes.len()
        };
        self.links.heal();
        self.drain(0..count, self.scenario.drain_budget).await
    }

    /// Phases 1–4: returns what the checkers judge, the trace and the wall time.
    async fn run(
        self: Arc<Self>,
        store: &PgStore,
        faults: Vec<(Duration, RealFault)>,
        trace: Trace,
    ) -> Result<(Outcome, Vec<TraceEvent>, Duration), ChaosError> {
        let scenario = self.scenario.clone();
        let now = |store: &PgStore| {
            let store = store.clone();
            async move { store.now().await.map_err(|e| runtime(format!("PostgreSQL: {e}"))) }
        };
        let origin = gang::Origin { local: Instant::now(), wall_us: jobs::wall_now_us(), db: now(store).await? };
        let started = origin.local;
        let mut aborted = Tasks::default();
        for index in 0..self.urls.len() {
            self.start(index)?;
        }
        let spec = scaled(&scenario.workload, self.options.time_scale);
        let client = Arc::new(Client { spec, seed: self.seed, report: Mutex::default(), resources: Mutex::default() });
        let insert = tokio::spawn({
            let (client, store) = (client.clone(), store.clone());
            async move { client.run(&store).await }
        });
        aborted.add(&insert);
        let gang_client = scenario.gang.clone().map(|gang| {
            let client = gang::GangClient::new(gang, self.options.time_scale, trace.clone());
            let store = store.clone();
            tokio::spawn(async move { client.run(&store, started).await })
        });
        if let Some(task) = &gang_client {
            aborted.add(task);
        }
        let mut tasks = Vec::new();
        for (at, fault) in faults {
            let (world, store, trace, client) = (self.clone(), store.clone(), trace.clone(), client.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(started + at).await;
                world.inject(fault, store, trace, client).await;
            }));
            aborted.add(tasks.last().expect("just pushed"));
        }
        let inserted = insert.await.map_err(|e| runtime(format!("the workload client failed: {e}")))??;
        let submitted = match gang_client {
            Some(task) => task.await.map_err(|e| runtime(format!("the gang client failed: {e}")))??,
            None => Vec::new(),
        };
        let heal_at = scenario.heal_at().mul_f64(self.options.time_scale);
        tokio::time::sleep_until(started + heal_at).await;
        for task in &tasks {
            task.abort();
        }
        self.links.heal();
        self.heal(&trace).await?;
        trace.record(&Arc::from("world"), "heal", "");
        let heal_at = now(store).await?;
        let deadline = Instant::now() + scenario.liveness_bound;
        let rows_at_liveness = loop {
            let rows = rows(store).await?;
            if gang::converged(&rows) || Instant::now() >= deadline {
                break rows;
            }
            tokio::time::sleep(CONVERGENCE_POLL).await;
        };
        let liveness_at = now(store).await?;
        let unfinished = unfinished_operations(&rows_at_liveness);
        let drain = self.drain(0..self.replicas(), scenario.drain_budget).await;
        tokio::time::sleep(scenario.lease_ttl_max() + Duration::from_secs(1)).await;
        let rows_final = rows(store).await?;
        let history = store.history().await.map_err(|e| runtime(format!("history: {e}")))?;
        let events = store.all_events().await.map_err(|e| runtime(format!("events: {e}")))?;
        let final_at = now(store).await?;
        let is_gang = scenario.gang.is_some();
        let (gang, gang_lines) = match is_gang {
            false => (None, Vec::new()),
            true => {
                let records: Vec<Vec<AgentRecord>> = (0..self.urls.len() - self.replicas())
                    .map(|agent| RecordLog::read(&self.records_path(agent)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| runtime(format!("an agent's record: {e}")))?;
                let outcome = gang::outcome(store, &submitted, unfinished, &records, &origin).await?;
                let names = (0..self.urls.len()).map(|index| (self.application_name(index), self.node_name(index)));
                let mut names: std::collections::BTreeMap<String, Arc<str>> = names.collect();
                names.insert(format!("lockstep chaos {}", self.schema), Arc::from("client"));
                let lines = gang::trace_lines(&history, &events, &rows_final, &records, &origin, names);
                (Some(outcome), lines)
            }
        };
        // Agents never drain in the simulator; here they stop (SIGTERM: their jobs, if any, are killed) once
        // everything is read.
        let agents = self.replicas()..self.urls.len();
        let _ = self.drain(agents, scenario.drain_budget).await;
        let mut lines = trace.events();
        lines.extend(gang_lines);
        lines.sort_by_key(|line| line.at);
        let outcome = Outcome {
            history,
            events,
            rows_at_liveness: rows_at_liveness.into_iter().filter(|row| !(is_gang && is_gang_row(row))).collect(),
            rows_final: rows_final.into_iter().filter(|row| !(is_gang && row.kind == KIND_NODE)).collect(),
            heal_at,
            liveness_at,
            final_at,
            keyed_rows: inserted.rows(),
            client: inserted,
            drain,
            gang,
            effects: Vec::new(),
            retry_lateness_bound: None,
        };
        Ok((outcome, lines, started.elapsed()))
    }
}

/// Whether process `pid` still runs (a zombie does not: it only waits to be reaped).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state follows the command's closing parenthesis: `pid (comm) S …`.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
    }
}

async fn rows(store: &PgStore) -> Result<Vec<Row>, ChaosError> {
    store.all_rows().await.map_err(|e| runtime(format!("PostgreSQL: {e}")))
}

/// The workload with its span scaled and its rates divided by `by` (as many rows, in scaled time).
fn scaled(spec: &WorkloadSpec, by: f64) -> WorkloadSpec {
    WorkloadSpec {
        span: spec.span.mul_f64(by),
        jobs_per_minute: spec.jobs_per_minute / by,
        claims_per_minute: spec.claims_per_minute / by,
        ..spec.clone()
    }
}

/// The harness as the workload client: the simulator client's schedule and rows (its streams and draws), with
/// plain inserts on the harness's own session.
struct Client {
    spec: WorkloadSpec,
    seed: u64,
    report: Mutex<ClientReport>,
    resources: Mutex<Vec<RowId>>,
}

impl Client {
    fn report(&self) -> std::sync::MutexGuard<'_, ClientReport> {
        self.report.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn run(&self, store: &PgStore) -> Result<ClientReport, ChaosError> {
        if self.spec.rows_max == 0 {
            return Ok(ClientReport::default());
        }
        for _ in 0..self.spec.resources {
            let row = insert(store, NewRow::new("resource", "free", json!({ "count": 0 }))).await?;
            self.resources.lock().unwrap_or_else(|p| p.into_inner()).push(row.id);
            self.report().resources += 1;
        }
        let mut jobs_rng = rng::stream(self.seed, "workload-jobs");
        let mut claims_rng = rng::stream(self.seed, "workload-claims");
        let start = Instant::now();
        let mut next_job = workload::exponential(&mut jobs_rng, self.spec.jobs_per_minute);
        let mut next_claim = workload::exponential(&mut claims_rng, self.spec.claims_per_minute);
        loop {
            let (at, is_job) = if next_job <= next_claim { (next_job, true) } else { (next_claim, false) };
            if at >= self.spec.span || self.report().rows() >= self.spec.rows_max {
                break;
            }
            tokio::time::sleep_until(start + at).await;
            if is_job {
                self.insert_job(store, &mut jobs_rng).await?;
                next_job += workload::exponential(&mut jobs_rng, self.spec.jobs_per_minute);
            } else {
                let resources = {
                    let resources = self.resources.lock().unwrap_or_else(|p| p.into_inner());
                    workload::pick_resources(&self.spec, &resources, &mut claims_rng)
                };
                let pipeline = claims_rng.random_range(0..self.spec.claim_pipelines.max(1));
                self.insert_claim(store, pipeline, &resources).await?;
                next_claim += workload::exponential(&mut claims_rng, self.spec.claims_per_minute);
            }
        }
        Ok(self.report().clone())
    }

    async fn insert_job(&self, store: &PgStore, rng: &mut ChaCha8Rng) -> Result<(), ChaosError> {
        let key = format!("job-{}", self.report().jobs);
        let count = rng.random_range(self.spec.tasks_per_job.clone());
        let mut tasks = Vec::new();
        for index in 0..count {
            let task = insert(store, NewRow::new("task", "ready", json!({ "index": index, "job": key }))).await?;
            tasks.push(task.id.0);
        }
        let job = insert(store, NewRow::new("job", workload::JOB_STATUS, json!({ "tasks": tasks }))).await?;
        {
            let mut report = self.report();
            report.jobs += 1;
            report.tasks += tasks.len();
        }
        let _ = store.hint("task", None).await;
        let _ = store.hint("job", Some(job.id)).await;
        Ok(())
    }

    async fn insert_claim(&self, store: &PgStore, pipeline: usize, resources: &[RowId]) -> Result<(), ChaosError> {
        let claim = workload::claim_row(pipeline, resources);
        let kind = claim.kind.clone();
        insert(store, claim).await?;
        self.report().claims += 1;
        let _ = store.hint(&kind, None).await;
        Ok(())
    }

    /// `claims` claims on resource 0 at once (the contention fault).
    async fn burst(&self, store: &PgStore, claims: usize) {
        let hot = self.resources.lock().unwrap_or_else(|p| p.into_inner()).first().copied();
        let Some(hot) = hot else { return };
        for index in 0..claims {
            let _ = self.insert_claim(store, index % self.spec.claim_pipelines.max(1), &[hot]).await;
        }
    }
}

/// Inserts `row`, trying again after an error (the harness's session is not faulted: an error is a server
/// hiccup, and the insert did not commit or its retry would be a duplicate the checkers report).
async fn insert(store: &PgStore, row: NewRow) -> Result<Row, ChaosError> {
    let mut last: Option<StoreError> = None;
    for _ in 0..INSERT_ATTEMPTS_MAX {
        match store.insert(row.clone()).await {
            Ok(row) => return Ok(row),
            Err(error) => {
                last = Some(error);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Err(runtime(format!("the workload client could not insert a {} row: {last:?}", row.kind)))
}

/// Writes the recorded history (unless `None`: not read), the fault log and the trace to the run's directory (kept
/// for reading after the schema is dropped).
fn write_files(dir: &std::path::Path, history: Option<&[Commit]>, trace: &[TraceEvent]) {
    let history = history.map(|history| history.iter().map(|commit| format!("{commit}\n")).collect::<String>());
    let faults: String =
        trace.iter().filter(|event| !gang::RECORDED_KINDS.contains(&event.kind)).map(|e| format!("{e}\n")).collect();
    let whole: String = trace.iter().map(|event| format!("{event}\n")).collect();
    let files = [("history.txt", history), ("faults.txt", Some(faults)), ("trace.txt", Some(whole))];
    for (name, text) in files.into_iter().filter_map(|(name, text)| Some((name, text?))) {
        if let Err(error) = std::fs::write(dir.join(name), text) {
            eprintln!("lockstep chaos: cannot write {}: {error}", dir.join(name).display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trial read "1 faults have no real form here".
    #[test]
    fn faults_without_a_real_form_are_counted_in_the_singular_and_the_plural() {
        let options = ChaosOptions {
            scenario: PathBuf::from("t.toml"),
            database_url: "postgres://u@127.0.0.1/test".into(),
            database_url_source: "--database-url".into(),
            seed: None,
            keep: false,
            time_scale: 1.0,
            skip_refused: false,
            exe: PathBuf::from("lockstep"),
            out: None,
            apply_guard_off: false,
        };
        let mut scenario = Scenario::quiet();
        let buggify = |secs| crate::sim::faults::FaultEvent {
            at: Duration::from_secs(secs),
            fault: Fault::Buggify { span: Duration::from_secs(1) },
        };
        scenario.faults.until = Duration::from_secs(30);
        scenario.faults.fixed = vec![buggify(1)];
        let Err(error) = plan(&scenario, 1, &options) else { panic!("buggify has a real form") };
        assert!(error.message.starts_with("1 fault has no real form here"), "{}", error.message);
        scenario.faults.fixed.push(buggify(2));
        let Err(error) = plan(&scenario, 1, &options) else { panic!("buggify has a real form") };
        assert!(error.message.starts_with("2 faults have no real form here"), "{}", error.message);
    }

    #[tokio::test]
    async fn a_replica_url_names_its_proxy_and_keeps_the_rest_and_a_socket_url_is_refused() {
        let (upstream, rewrite) =
            proxied_url("postgres://u:pw@127.0.0.1:5433/test?sslmode=disable", "--database-url").await.unwrap();
        assert_eq!(upstream, SocketAddr::from(([127, 0, 0, 1], 5433)));
        let proxy = SocketAddr::from(([127, 0, 0, 1], 40001));
        assert_eq!(rewrite(proxy), "postgres://u:pw@127.0.0.1:40001/test?sslmode=disable");
        let (upstream, rewrite) =
            proxied_url("postgres://localhost/test?sslmode=prefer&connect_timeout=3", "DATABASE_URL").await.unwrap();
        assert_eq!(upstream.port(), 5432);
        assert_eq!(rewrite(proxy), "postgres://127.0.0.1:40001/test?connect_timeout=3&sslmode=disable", "plain text");
        let Err(error) = proxied_url("postgres://localhost/test?sslmode=verify-full", "--database-url").await else {
            panic!("accepted a URL demanding TLS")
        };
        assert_eq!(error.code, 2);
        assert!(
            error.message.starts_with("--database-url: sslmode=verify-full: a chaos run's proxies"),
            "{}",
            error.message
        );
        let Err(error) = proxied_url("postgres:///test?host=/var/run/postgresql", "--database-url").await else {
            panic!("accepted")
        };
        assert_eq!(error.code, 2);
        assert!(error.message.contains("--database-url: names no host"), "{}", error.message);
    }
}
