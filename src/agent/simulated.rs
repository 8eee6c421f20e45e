//! A simulated executor: processes are tasks whose durations, exit codes, hangs and start failures come from a
//! [`JobScript`] (the scenario's), with every start, exit and kill written to a shared [`ProcessLog`] for checkers
//! (DESIGN §5: allocation exclusivity is checked from the executors' process log).
//!
//! Deterministic: a job's behaviour is a function of the script, its seed and the job (its id and how many times
//! its task's cookie started before), never of the order in which agents ask. Each job draws its duration from a
//! ChaCha stream of its own (DESIGN §5: one stream per purpose), so adding a fault reshuffles nothing.

use super::executor::Executor;
use super::executor::{ExecutorError, ExitStatus, ProcessHandle, StartRequest, process_pair};
use crate::gang::model::{AllocationRef, JobId};
use crate::store::RowId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How a simulated process ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Exits with this code after the duration.
    Exit(i32),
    /// Never exits; only a kill ends it.
    Hang,
    /// Fails to start (the executor returns an error).
    StartFailure(String),
}

/// A simulated job's behaviour: a duration drawn uniformly from `duration` and its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Behaviour {
    /// Inclusive bounds of the duration.
    pub duration: (Duration, Duration),
    /// How it ends.
    pub end: End,
}

impl Behaviour {
    /// Exits with `code` after exactly `duration`.
    pub fn exit_after(duration: Duration, code: i32) -> Behaviour {
        Behaviour { duration: (duration, duration), end: End::Exit(code) }
    }

    /// Hangs until killed.
    pub fn hang() -> Behaviour {
        Behaviour { duration: (Duration::ZERO, Duration::ZERO), end: End::Hang }
    }
}

/// A rule of a script: the behaviour of the jobs it matches. An absent field matches anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Task name.
    pub task: Option<String>,
    /// Job cookie.
    pub job_cookie: Option<u32>,
    /// Which start of the (operation, task, cookie), from 0.
    pub attempt: Option<u32>,
    /// The behaviour.
    pub behaviour: Behaviour,
}

/// The behaviours of a scenario's jobs: the first matching rule wins, else `default`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobScript {
    /// Seed of the duration draws.
    pub seed: u64,
    /// Behaviour of jobs no rule matches.
    pub default: Behaviour,
    /// Rules, in order.
    pub rules: Vec<Rule>,
}

impl JobScript {
    /// Every job exits 0 after `duration`.
    pub fn uniform(duration: Duration) -> JobScript {
        JobScript { seed: 0, default: Behaviour::exit_after(duration, 0), rules: Vec::new() }
    }

    /// The same script with a rule for `task`/`cookie`'s start number `attempt`.
    pub fn with(mut self, task: &str, cookie: u32, attempt: u32, behaviour: Behaviour) -> JobScript {
        let rule = Rule { task: Some(task.into()), job_cookie: Some(cookie), attempt: Some(attempt), behaviour };
        self.rules.push(rule);
        self
    }

    /// The behaviour of a job of `task`/`cookie` starting for the `attempt`-th time.
    pub fn behaviour(&self, task: &str, cookie: u32, attempt: u32) -> &Behaviour {
        let matches = |rule: &&Rule| {
            rule.task.as_deref().is_none_or(|t| t == task)
                && rule.job_cookie.is_none_or(|c| c == cookie)
                && rule.attempt.is_none_or(|a| a == attempt)
        };
        self.rules.iter().find(matches).map_or(&self.default, |rule| &rule.behaviour)
    }

    /// What job `job` of `task`/`cookie`, starting for the `attempt`-th time, does: its duration, drawn from the
    /// job's own ChaCha stream of this script's seed (uniform in its behaviour's bounds), and its end. The
    /// simulated executor and `lockstep chaos run`'s real jobs draw through this one function, so one seed gives
    /// both the same durations.
    pub fn draw(&self, job: JobId, task: &str, cookie: u32, attempt: u32) -> (Duration, End) {
        let behaviour = self.behaviour(task, cookie, attempt);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(job_stream(job));
        let (low, high) = behaviour.duration;
        let duration = if high > low { rng.random_range(low..=high) } else { low };
        (duration, behaviour.end.clone())
    }
}

/// What happened to a simulated process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// It started.
    Started,
    /// It could not start.
    StartFailed,
    /// It exited by itself with this code.
    Exited(i32),
    /// Its agent killed it.
    Killed,
    /// Its node was paused (simulator fault): it is frozen, holding its allocation, until resumed.
    Paused,
    /// Its node resumed: it runs again.
    Resumed,
}

/// One entry of the process log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// Simulated (or runtime) time of the event.
    pub at: Instant,
    /// The node's name.
    pub node: String,
    /// The allocation.
    pub allocation: AllocationRef,
    /// The job.
    pub job: JobId,
    /// Incarnation id of the job.
    pub incarnation: String,
    /// The job's task.
    pub task: String,
    /// The job's gang rank, if ranked (the simulator's gang checkers follow ranks across incarnations).
    pub gang_rank: Option<u32>,
    /// What happened.
    pub kind: ProcessEventKind,
}

/// Most entries a process log keeps; a run that starts more processes is a runaway and fails loudly.
pub const PROCESS_LOG_LEN_MAX: usize = 10_000_000;

/// Called with every entry a [`ProcessLog`] records, after it is recorded (the simulator traces them).
pub type ProcessSink = Arc<dyn Fn(&ProcessEvent) + Send + Sync>;

/// The process log shared by every simulated executor of a world. Clones share one log.
#[derive(Clone, Default)]
pub struct ProcessLog {
    events: Arc<Mutex<Vec<ProcessEvent>>>,
    sink: Option<ProcessSink>,
}

impl std::fmt::Debug for ProcessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessLog").field("events", &lock(&self.events).len()).finish_non_exhaustive()
    }
}

impl ProcessLog {
    /// An empty log that hands every entry to `sink` as well.
    pub fn with_sink(sink: ProcessSink) -> ProcessLog {
        ProcessLog { events: Arc::default(), sink: Some(sink) }
    }

    /// A log holding `events`, in their order: a process log recorded elsewhere (`lockstep chaos run` builds one
    /// from its real agents' records) for the same checks.
    pub fn from_events(events: Vec<ProcessEvent>) -> ProcessLog {
        assert!(events.len() <= PROCESS_LOG_LEN_MAX, "process log passed {PROCESS_LOG_LEN_MAX} entries");
        ProcessLog { events: Arc::new(Mutex::new(events)), sink: None }
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<ProcessEvent> {
        lock(&self.events).clone()
    }

    fn push(&self, event: ProcessEvent) {
        {
            let mut events = lock(&self.events);
            assert!(events.len() < PROCESS_LOG_LEN_MAX, "process log passed {PROCESS_LOG_LEN_MAX} entries");
            events.push(event.clone());
        }
        if let Some(sink) = &self.sink {
            sink(&event);
        }
    }

    /// Records that `node` died with its agent: its live processes die with it (a simulated node's tasks end
    /// without a word, so the harness that kills the node says so here, before the node could start anything
    /// again).
    pub fn node_died(&self, node: &str) {
        for started in self.live_on(node, |_| true) {
            self.push(ProcessEvent { at: Instant::now(), kind: ProcessEventKind::Killed, ..started });
        }
    }

    /// Records that `node` was paused with its agent (a simulator fault): its live processes are frozen until
    /// [`ProcessLog::node_resumed`]. They still hold their allocations.
    pub fn node_paused(&self, node: &str) {
        for started in self.live_on(node, |paused| !paused) {
            self.push(ProcessEvent { at: Instant::now(), kind: ProcessEventKind::Paused, ..started });
        }
    }

    /// Records that `node` resumed: its frozen processes run again.
    pub fn node_resumed(&self, node: &str) {
        for started in self.live_on(node, |paused| paused) {
            self.push(ProcessEvent { at: Instant::now(), kind: ProcessEventKind::Resumed, ..started });
        }
    }

    /// The processes on `node` started and not ended, whose paused state `keep` accepts, by job.
    fn live_on(&self, node: &str, keep: impl Fn(bool) -> bool) -> Vec<ProcessEvent> {
        let mut live: BTreeMap<JobId, (ProcessEvent, bool)> = BTreeMap::new();
        for event in lock(&self.events).iter().filter(|e| e.node == node) {
            match event.kind {
                ProcessEventKind::Started => {
                    live.insert(event.job, (event.clone(), false));
                }
                ProcessEventKind::Paused | ProcessEventKind::Resumed => {
                    if let Some((_, paused)) = live.get_mut(&event.job) {
                        *paused = event.kind == ProcessEventKind::Paused;
                    }
                }
                _ => {
                    live.remove(&event.job);
                }
            }
        }
        live.into_values().filter(|(_, paused)| keep(*paused)).map(|(started, _)| started).collect()
    }

    /// Allocation exclusivity (DESIGN §5): every point of the log where an allocation row gets a second live
    /// process, as a sentence naming both jobs. A process is live from its `Started` to its `Exited` or `Killed`
    /// (a paused one too: it still holds its allocation).
    pub fn exclusivity_violations(&self) -> Vec<String> {
        let mut live: BTreeMap<RowId, Vec<ProcessEvent>> = BTreeMap::new();
        let mut violations = Vec::new();
        for event in lock(&self.events).iter() {
            let processes = live.entry(event.allocation.row).or_default();
            match event.kind {
                ProcessEventKind::Started => {
                    if let Some(other) = processes.first() {
                        violations.push(format!(
                            "allocation {} starts job {} while job {} (allocation {}) still runs",
                            event.allocation, event.job, other.job, other.allocation
                        ));
                    }
                    processes.push(event.clone());
                }
                ProcessEventKind::Paused | ProcessEventKind::Resumed => {}
                _ => processes.retain(|p| p.job != event.job),
            }
        }
        violations
    }

    /// Processes alive now, by allocation row: started and not yet exited, failed or killed.
    pub fn live(&self) -> BTreeMap<RowId, Vec<JobId>> {
        let mut live: BTreeMap<RowId, Vec<JobId>> = BTreeMap::new();
        for event in lock(&self.events).iter() {
            let jobs = live.entry(event.allocation.row).or_default();
            match event.kind {
                ProcessEventKind::Started => jobs.push(event.job),
                ProcessEventKind::Paused | ProcessEventKind::Resumed => {}
                _ => jobs.retain(|job| *job != event.job),
            }
        }
        live.retain(|_, jobs| !jobs.is_empty());
        live
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A job cookie of an operation's task: (operation, task, job cookie).
type CookieKey = (RowId, String, u32);

/// The simulated executor. Clones share the script, the attempt counts and the log: give one clone to each agent
/// of a world.
#[derive(Clone, Debug)]
pub struct SimulatedExecutor {
    script: Arc<JobScript>,
    attempts: Arc<Mutex<BTreeMap<CookieKey, u32>>>,
    log: ProcessLog,
    /// How long a process takes to die once its kill is requested.
    kill_delay: Duration,
}

impl SimulatedExecutor {
    /// An executor playing `script`, logging to `log`.
    pub fn new(script: JobScript, log: ProcessLog) -> SimulatedExecutor {
        SimulatedExecutor { script: Arc::new(script), attempts: Arc::default(), log, kill_delay: Duration::ZERO }
    }

    /// The same executor whose processes die `delay` after their kill is requested (a process tree that takes a
    /// while to end), instead of at once. Default zero.
    pub fn with_kill_delay(mut self, delay: Duration) -> SimulatedExecutor {
        self.kill_delay = delay;
        self
    }

    /// Its process log.
    pub fn log(&self) -> &ProcessLog {
        &self.log
    }
}

/// A stable stream number for a job (FNV-1a of its id), so each job's draw is its own.
fn job_stream(job: JobId) -> u64 {
    crate::hash::fnv1a64(job.to_string().as_bytes())
}

impl Executor for SimulatedExecutor {
    /// A simulated start needs no preparation: everything happens in [`Executor::spawn`].
    type Prepared = StartRequest;

    fn prepare(
        &self,
        request: StartRequest,
    ) -> impl Future<Output = Result<StartRequest, ExecutorError>> + Send + 'static {
        std::future::ready(Ok(request))
    }

    fn spawn(&self, request: StartRequest) -> Result<ProcessHandle, ExecutorError> {
        let launch = &request.launch;
        let attempt = {
            let mut attempts = lock(&self.attempts);
            let count = attempts.entry((launch.job.operation, launch.task.clone(), launch.job_cookie)).or_default();
            *count += 1;
            *count - 1
        };
        let (duration, end) = self.script.draw(launch.job, &launch.task, launch.job_cookie, attempt);
        let event = |kind| ProcessEvent {
            at: Instant::now(),
            node: request.node.clone(),
            allocation: request.allocation,
            job: launch.job,
            incarnation: launch.incarnation.clone(),
            task: launch.task.clone(),
            gang_rank: launch.gang_rank,
            kind,
        };
        if let End::StartFailure(message) = &end {
            self.log.push(event(ProcessEventKind::StartFailed));
            return Err(ExecutorError(message.clone()));
        }
        self.log.push(event(ProcessEventKind::Started));
        let (handle, mut control) = process_pair();
        let log = self.log.clone();
        let exited = event(ProcessEventKind::Killed);
        let kill_delay = self.kill_delay;
        tokio::spawn(async move {
            let run = async {
                match end {
                    End::Exit(code) => {
                        tokio::time::sleep(duration).await;
                        code
                    }
                    _ => std::future::pending().await,
                }
            };
            // `biased`: a kill and an exit due at the same instant resolve the same way in every run.
            let status = tokio::select! {
                biased;
                _ = control.kill_requested() => {
                    if !kill_delay.is_zero() {
                        tokio::time::sleep(kill_delay).await;
                    }
                    ExitStatus::Killed
                }
                code = run => ExitStatus::Exited(code),
            };
            let kind = match status {
                ExitStatus::Exited(code) => ProcessEventKind::Exited(code),
                _ => ProcessEventKind::Killed,
            };
            log.push(ProcessEvent { at: Instant::now(), kind, ..exited });
            control.exited(status);
        });
        Ok(handle)
    }
}
