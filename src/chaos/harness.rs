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

use super::links::{Links, links_of};
use super::{RealFault, real_fault};
use crate::sim::faults::schedule;
use crate::sim::run::Outcome;
use crate::sim::trace::Trace;
use crate::sim::workload::{self, ClientReport, WorkloadSpec};
use crate::sim::{Fault, RunReport, Scenario, ScenarioFile, rng};
use crate::store::{NewRow, PgOptions, PgStore, Row, RowId, Store, StoreError};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How often the harness reads the rows while it waits for them to become final.
const CONVERGENCE_POLL: Duration = Duration::from_millis(500);

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
    /// The seed of the workload and of random fault processes; default the file's first.
    pub seed: Option<u64>,
    /// Keep the run's schema (rows, events, history) instead of dropping it.
    pub keep: bool,
    /// Every scenario time (fault times, spans and downs, the workload span) is multiplied by this; the workload's
    /// rates are divided by it, so the rows stay as many. Lease ttls and processing times are not scaled.
    pub time_scale: f64,
    /// Leave out faults that have no real form (listed) instead of refusing the run.
    pub skip_refused: bool,
    /// The `lockstep` binary the replicas run (`lockstep serve`).
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

/// Runs the scenario file of `options` on real processes and PostgreSQL, and checks it.
///
/// Errors: a scenario the harness cannot run (gang parts, pipeline sets, faults without a real form), the
/// database or a replica process that cannot be started.
pub async fn run(mut options: ChaosOptions) -> Result<ChaosRun, ChaosError> {
    let file = ScenarioFile::load(&options.scenario).map_err(|error| usage(error.to_string()))?;
    let scenario = file.scenario.clone();
    if scenario.gang.is_some() {
        return Err(usage(format!(
            "{}: gang scenarios (agents, operations) are not yet run by `lockstep chaos run`: row scenarios only",
            options.scenario.display()
        )));
    }
    if scenario.pipelines.is_some() {
        return Err(usage("pipeline sets need their handlers, which only the simulator build links in"));
    }
    // A planted bug of the scenario file runs as in the simulator, or the run is refused: never ignored, or a
    // user would read a pass as the checkers missing it.
    let mutation = &scenario.mutation;
    if mutation.gang_gate_disabled || mutation.agent_drift_beyond_margin {
        return Err(usage(format!(
            "{}: [mutation] gang_gate_disabled and agent_drift_beyond_margin need gang scenarios, which `lockstep \
             chaos run` does not run yet",
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
    // The proxies first: a URL they cannot serve is refused before the run's schema exists.
    let (upstream, rewrite) = proxied_url(&options.database_url).await?;
    let links = Links::start(scenario.replicas, upstream, seed)
        .await
        .map_err(|e| runtime(format!("the chaos proxies cannot listen: {e}")))?;
    let urls = (0..scenario.replicas).map(|index| rewrite(links.proxy(index).local_addr())).collect();
    let mut store_options = PgOptions::new(options.database_url.clone());
    store_options.schema = schema.clone();
    store_options.application_name = format!("lockstep chaos {schema}");
    store_options.history = true;
    store_options.max_connections = 4;
    // In real mode's words (`lockstep serve`): a URL the server refuses is the flag's fault (exit 2), a server
    // that cannot be reached is "cannot connect" (exit 1).
    let store = PgStore::connect_with(store_options).await.map_err(|error| match error {
        StoreError::Invalid(message) => usage(format!("--database-url: {message}")),
        error @ (StoreError::Unavailable(_) | StoreError::Timeout(_)) => {
            runtime(format!("cannot connect to PostgreSQL (--database-url or DATABASE_URL): {error}"))
        }
        error => runtime(format!("cannot open schema {schema} on PostgreSQL: {error}")),
    })?;
    let world = World {
        options: options.clone(),
        schema: schema.clone(),
        dir: dir.clone(),
        seed,
        replicas: Mutex::default(),
        links,
        urls,
    };
    let world = Arc::new(world);
    let outcome = world.clone().run(&scenario, &store, faults).await;
    world.stop_all().await;
    let (outcome, trace, wall) = match outcome {
        Ok(done) => done,
        Err(error) => {
            drop_schema(&options, &schema).await;
            return Err(error);
        }
    };
    write_history(&dir, &outcome, &trace);
    let mut report = RunReport { wall, simulated: wall, trace: trace.events(), ..RunReport::empty(&scenario, seed) };
    report.judge(&scenario, outcome);
    if !options.keep {
        drop_schema(&options, &schema).await;
    }
    Ok(ChaosRun { report, dir, schema, skipped })
}

async fn drop_schema(options: &ChaosOptions, schema: &str) {
    if let Err(error) = PgStore::drop_schema(&options.database_url, schema).await {
        eprintln!("lockstep chaos: the schema {schema} was not dropped: {error}");
    }
}

/// Faults at their wall-clock offsets from the start of the run.
type Planned = Vec<(Duration, RealFault)>;

/// The faults of the run in wall time (scaled), each mapped to its real form; the refused ones are an error, or
/// with `skip_refused` a list.
fn plan(scenario: &Scenario, seed: u64, options: &ChaosOptions) -> Result<(Planned, Vec<String>), ChaosError> {
    let mut faults = Vec::new();
    let mut refused = Vec::new();
    for event in schedule(&scenario.faults, seed, scenario.replicas, 0, 0) {
        let real = real_fault(&event.fault, true).and_then(|fault| match &fault {
            RealFault::Network(network) => links_of(network, scenario.replicas).map(|_| fault),
            _ => Ok(fault),
        });
        match real {
            Ok(fault) => faults.push((event.at.mul_f64(options.time_scale), scale(fault, options.time_scale))),
            Err(reason) => refused.push(format!("at {}: {reason}", crate::duration::format(event.at))),
        }
    }
    if !refused.is_empty() && !options.skip_refused {
        return Err(usage(format!(
            "{} faults have no real form here (--skip-refused runs the scenario without them): {}",
            refused.len(),
            refused.join("; ")
        )));
    }
    Ok((faults, refused))
}

fn scale(fault: RealFault, by: f64) -> RealFault {
    match fault {
        RealFault::Kill { replica, down } => RealFault::Kill { replica, down: down.mul_f64(by) },
        RealFault::Pause { replica, span } => RealFault::Pause { replica, span: span.mul_f64(by) },
        RealFault::Network(fault) => RealFault::Network(match fault {
            Fault::Partition { a, b, span } => Fault::Partition { a, b, span: span.mul_f64(by) },
            Fault::Isolate { node, span } => Fault::Isolate { node, span: span.mul_f64(by) },
            Fault::Degrade { latency, loss, span } => Fault::Degrade { latency, loss, span: span.mul_f64(by) },
            Fault::LostReplies { chance, span } => Fault::LostReplies { chance, span: span.mul_f64(by) },
            other => other,
        }),
        other => other,
    }
}

/// The address of the server `url` names (the proxies' upstream), and a function from a proxy's listener to
/// `url` with its host and port replaced by it (that proxy's replica's database URL; every other part kept).
///
/// Errors: a URL that does not parse or names no host (a Unix socket cannot be proxied), a host that does not
/// resolve.
async fn proxied_url(url: &str) -> Result<(SocketAddr, impl Fn(SocketAddr) -> String), ChaosError> {
    let parsed = url::Url::parse(url).map_err(|e| usage(format!("--database-url: not a URL: {e}")))?;
    let host = parsed
        .host_str()
        .filter(|host| !host.is_empty())
        .ok_or_else(|| usage("--database-url: names no host; the chaos proxy needs a TCP address"))?
        .trim_matches(['[', ']'])
        .to_string();
    let port = parsed.port().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| runtime(format!("--database-url: the host {host} does not resolve")))?;
    let rewrite = move |proxy: SocketAddr| {
        let mut url = parsed.clone();
        let _ = url.set_host(Some(&proxy.ip().to_string()));
        let _ = url.set_port(Some(proxy.port()));
        url.to_string()
    };
    Ok((upstream, rewrite))
}

/// One replica process and what a fault did to it.
#[derive(Default)]
struct Replica {
    child: Option<Child>,
    paused: bool,
    /// Processes started for this replica (the first and every restart).
    starts: u32,
}

struct World {
    options: ChaosOptions,
    schema: String,
    dir: PathBuf,
    seed: u64,
    replicas: Mutex<Vec<Replica>>,
    /// One chaos proxy per replica: its link to PostgreSQL.
    links: Links,
    /// Replica `i`'s database URL: its proxy's listener.
    urls: Vec<String>,
}

impl World {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Replica>> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn replica_name(&self, index: usize) -> String {
        format!("{}-replica-{index}", self.schema)
    }

    /// Starts a process for replica `index` (its log appended to `replica-{index}.log`).
    fn start(&self, index: usize) -> Result<(), ChaosError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("replica-{index}.log")))
            .map_err(|e| runtime(format!("replica log: {e}")))?;
        let err = log.try_clone().map_err(|e| runtime(format!("replica log: {e}")))?;
        let mut command = Command::new(&self.options.exe);
        command
            .arg("serve")
            .arg("--schema")
            .arg(&self.schema)
            .arg("--replica")
            .arg(self.replica_name(index))
            .arg("--chaos-rows")
            .arg(&self.options.scenario)
            .arg("--chaos-seed")
            .arg(self.seed.to_string())
            .arg("--chaos-history")
            .env("DATABASE_URL", &self.urls[index])
            .env("RUST_LOG", std::env::var("LOCKSTEP_CHAOS_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        if self.options.apply_guard_off {
            command.arg("--chaos-apply-guard-off");
        }
        // A replica must not outlive the harness (a harness ended by Ctrl-C or SIGKILL would leave it running on
        // the schema): the kernel SIGKILLs it when the harness's thread that started it ends.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child =
            command.spawn().map_err(|e| runtime(format!("cannot start {}: {e}", self.options.exe.display())))?;
        let mut replicas = self.lock();
        if replicas.len() <= index {
            replicas.resize_with(index + 1, Replica::default);
        }
        replicas[index].child = Some(child);
        replicas[index].paused = false;
        replicas[index].starts += 1;
        Ok(())
    }

    fn signal(&self, index: usize, signal: libc::c_int) -> bool {
        let replicas = self.lock();
        let Some(pid) = replicas.get(index).and_then(|r| r.child.as_ref()).and_then(Child::id) else { return false };
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

    async fn inject(self: Arc<Self>, fault: RealFault, store: PgStore, trace: Trace, client: Arc<Client>) {
        match fault {
            RealFault::Kill { replica, down } => {
                if self.lock().get(replica).is_none_or(|r| r.child.is_none() || r.paused) {
                    trace.record(&Arc::from(format!("replica-{replica}")), "skipped", "kill: busy");
                    return;
                }
                trace.record(&Arc::from(format!("replica-{replica}")), "kill", format!("down={down:?}"));
                self.kill(replica).await;
                tokio::time::sleep(down).await;
                trace.record(&Arc::from(format!("replica-{replica}")), "restart", "");
                if let Err(error) = self.start(replica) {
                    trace.record(&Arc::from(format!("replica-{replica}")), "restart-failed", error.message);
                }
            }
            RealFault::Pause { replica, span } => {
                if self.lock().get(replica).is_none_or(|r| r.child.is_none() || r.paused) {
                    trace.record(&Arc::from(format!("replica-{replica}")), "skipped", "pause: busy");
                    return;
                }
                trace.record(&Arc::from(format!("replica-{replica}")), "pause", format!("span={span:?}"));
                self.lock()[replica].paused = true;
                self.signal(replica, libc::SIGSTOP);
                tokio::time::sleep(span).await;
                self.signal(replica, libc::SIGCONT);
                self.lock()[replica].paused = false;
                trace.record(&Arc::from(format!("replica-{replica}")), "resume", "");
            }
            RealFault::DbRestart => {
                let mut ended = 0;
                let count = self.lock().len();
                for index in 0..count {
                    let name = format!("lockstep serve {}", self.replica_name(index));
                    ended += store.terminate_sessions(&name).await.unwrap_or(0);
                }
                trace.record(&Arc::from("db"), "kill", format!("sessions={ended}"));
            }
            RealFault::Contention { claims } => {
                trace.record(&Arc::from("client"), "contention", format!("claims={claims}"));
                client.burst(&store, claims).await;
            }
            RealFault::Network(fault) => {
                let Ok(plan) = links_of(&fault, self.urls.len()) else { return };
                let node: Arc<str> = match plan.replicas.as_slice() {
                    [one] => Arc::from(format!("replica-{one}")),
                    _ => Arc::from("world"),
                };
                let kind = match fault {
                    Fault::Partition { .. } => "partition",
                    Fault::Isolate { .. } => "isolate",
                    Fault::Degrade { .. } => "degrade",
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

    /// Heal: every paused replica continues, every killed one runs again.
    fn heal(&self, trace: &Trace) -> Result<(), ChaosError> {
        let count = self.lock().len();
        for index in 0..count {
            let (paused, dead) = {
                let replicas = self.lock();
                (replicas[index].paused, replicas[index].child.is_none())
            };
            if paused {
                self.signal(index, libc::SIGCONT);
                self.lock()[index].paused = false;
            }
            if dead {
                trace.record(&Arc::from(format!("replica-{index}")), "restart", "heal");
                self.start(index)?;
            }
        }
        Ok(())
    }

    /// SIGTERM every replica and waits for each to drain and exit, within `budget`.
    async fn drain(&self, budget: Duration) -> Result<(), String> {
        let count = self.lock().len();
        for index in 0..count {
            self.signal(index, libc::SIGCONT);
            self.signal(index, libc::SIGTERM);
        }
        let deadline = Instant::now() + budget;
        let mut broken = Vec::new();
        for index in 0..count {
            let child = self.lock()[index].child.take();
            let Some(mut child) = child else { continue };
            match tokio::time::timeout_at(deadline, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => broken.push(format!("replica-{index} ended with {status}")),
                Ok(Err(error)) => broken.push(format!("replica-{index}: {error}")),
                Err(_) => {
                    let _ = child.start_kill();
                    broken.push(format!("replica-{index} did not drain within {budget:?}"));
                }
            }
        }
        if broken.is_empty() { Ok(()) } else { Err(broken.join("; ")) }
    }

    async fn stop_all(&self) {
        let count = self.lock().len();
        for index in 0..count {
            self.signal(index, libc::SIGCONT);
            self.kill(index).await;
        }
    }

    /// Phases 1–4: returns what the checkers judge, the fault trace and the wall time.
    async fn run(
        self: Arc<Self>,
        scenario: &Scenario,
        store: &PgStore,
        faults: Vec<(Duration, RealFault)>,
    ) -> Result<(Outcome, Trace, Duration), ChaosError> {
        let started = Instant::now();
        let trace = Trace::new();
        for index in 0..scenario.replicas {
            self.start(index)?;
        }
        let spec = scaled(&scenario.workload, self.options.time_scale);
        let client = Arc::new(Client { spec, seed: self.seed, report: Mutex::default(), resources: Mutex::default() });
        let insert = tokio::spawn({
            let (client, store) = (client.clone(), store.clone());
            async move { client.run(&store).await }
        });
        let mut tasks = Vec::new();
        for (at, fault) in faults {
            let (world, store, trace, client) = (self.clone(), store.clone(), trace.clone(), client.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(started + at).await;
                world.inject(fault, store, trace, client).await;
            }));
        }
        let inserted = insert.await.map_err(|e| runtime(format!("the workload client failed: {e}")))??;
        let heal_at = scenario.faults.until.max(scenario.workload.span).mul_f64(self.options.time_scale);
        tokio::time::sleep_until(started + heal_at).await;
        for task in &tasks {
            task.abort();
        }
        self.links.heal();
        self.heal(&trace)?;
        trace.record(&Arc::from("world"), "heal", "");
        let now = |store: &PgStore| {
            let store = store.clone();
            async move { store.now().await.map_err(|e| runtime(format!("PostgreSQL: {e}"))) }
        };
        let heal_at = now(store).await?;
        let deadline = Instant::now() + scenario.liveness_bound;
        let rows_at_liveness = loop {
            let rows = rows(store).await?;
            if rows.iter().all(workload::is_terminal) || Instant::now() >= deadline {
                break rows;
            }
            tokio::time::sleep(CONVERGENCE_POLL).await;
        };
        let liveness_at = now(store).await?;
        let drain = self.drain(scenario.drain_budget).await;
        tokio::time::sleep(scenario.lease_ttl_max() + Duration::from_secs(1)).await;
        let rows_final = rows(store).await?;
        let history = store.history().await.map_err(|e| runtime(format!("history: {e}")))?;
        let events = store.all_events().await.map_err(|e| runtime(format!("events: {e}")))?;
        let outcome = Outcome {
            history,
            events,
            rows_at_liveness,
            rows_final,
            heal_at,
            liveness_at,
            final_at: now(store).await?,
            keyed_rows: inserted.rows(),
            client: inserted,
            drain,
            gang: None,
            effects: Vec::new(),
        };
        Ok((outcome, trace, started.elapsed()))
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
                let resource = self.pick_resource(&mut claims_rng);
                let pipeline = claims_rng.random_range(0..self.spec.claim_pipelines.max(1));
                self.insert_claim(store, pipeline, resource).await?;
                next_claim += workload::exponential(&mut claims_rng, self.spec.claims_per_minute);
            }
        }
        Ok(self.report().clone())
    }

    fn pick_resource(&self, rng: &mut ChaCha8Rng) -> RowId {
        let resources = self.resources.lock().unwrap_or_else(|p| p.into_inner());
        if rng.random_bool(self.spec.hot_share) {
            return resources[0];
        }
        resources[rng.random_range(0..resources.len())]
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

    async fn insert_claim(&self, store: &PgStore, pipeline: usize, resource: RowId) -> Result<(), ChaosError> {
        let kind = format!("claim-{pipeline}");
        insert(store, NewRow::new(kind.clone(), "ready", json!({ "resource": resource.0 }))).await?;
        self.report().claims += 1;
        let _ = store.hint(&kind, None).await;
        Ok(())
    }

    /// `claims` claims on resource 0 at once (the contention fault).
    async fn burst(&self, store: &PgStore, claims: usize) {
        let hot = self.resources.lock().unwrap_or_else(|p| p.into_inner()).first().copied();
        let Some(hot) = hot else { return };
        for index in 0..claims {
            let _ = self.insert_claim(store, index % self.spec.claim_pipelines.max(1), hot).await;
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

/// Writes the recorded history and the fault log to the run's directory (kept for reading after the schema is
/// dropped).
fn write_history(dir: &std::path::Path, outcome: &Outcome, trace: &Trace) {
    let history: String = outcome.history.iter().map(|commit| format!("{commit}\n")).collect();
    let faults: String = trace.events().iter().map(|event| format!("{event}\n")).collect();
    for (name, text) in [("history.txt", history), ("faults.txt", faults)] {
        if let Err(error) = std::fs::write(dir.join(name), text) {
            eprintln!("lockstep chaos: cannot write {}: {error}", dir.join(name).display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replica_url_names_its_proxy_and_keeps_the_rest_and_a_socket_url_is_refused() {
        let (upstream, rewrite) = proxied_url("postgres://u:pw@127.0.0.1:5433/test?sslmode=disable").await.unwrap();
        assert_eq!(upstream, SocketAddr::from(([127, 0, 0, 1], 5433)));
        let proxy = SocketAddr::from(([127, 0, 0, 1], 40001));
        assert_eq!(rewrite(proxy), "postgres://u:pw@127.0.0.1:40001/test?sslmode=disable");
        let (upstream, _) = proxied_url("postgres://localhost/test").await.unwrap();
        assert_eq!(upstream.port(), 5432);
        let Err(error) = proxied_url("postgres:///test?host=/var/run/postgresql").await else { panic!("accepted") };
        assert_eq!(error.code, 2);
        assert!(error.message.contains("--database-url: names no host"), "{}", error.message);
    }
}
