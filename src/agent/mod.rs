//! Node agents (DESIGN §4): an agent leases its node's row, runs the jobs the controller puts in its node's
//! allocations through an [`Executor`], reports their starts and ends to their operations' inboxes, kills the
//! processes the controller moved on from (older incarnations, ended jobs; each kill is reported too, so the
//! controller knows the process is gone; a job an allocation is marked with as possibly still running here, when it
//! runs none of it, is reported too: [`REASON_NOT_RUNNING`]), and kills every process when it cannot
//! renew its node lease (self-fencing), so that when the controller declares the node lost its processes are dead.
//!
//! The node lease is the engine's lease (DESIGN §2): the agent fetches its node row (kind `node`, status = the
//! node's name, owner `agent:{name}`) and heartbeats it; its lock token is the node's *session*. The controller
//! grants allocations under a session and treats them as lost once that session ends, so a restarted agent (a new
//! token) never runs, and never has to report on, the jobs of its previous life. The agent counts its lease lost at
//! (call sent) + ttl − margin on its local clock, before the store can let anyone see the node as lost.
//!
//! One [`Agent::run_once`] pass: fence if the local deadline passed; register the node and its allocation rows
//! (once); list the node's allocations; take the lease if it has none; heartbeat when due (only a pass whose
//! listing succeeded takes or renews the lease: the lease tells the controller that the agent sees its work); report
//! processes that exited; reconcile the allocations (kill what should not run, start what should); send the
//! reports. [`Agent::run`] loops over passes
//! and fences at the deadline even while a store call hangs; [`Agent::run_until`] does the same until a stop
//! signal and then stops gracefully ([`Agent::stop`]: interrupt and report the running jobs, give the node lease
//! back).
//!
//! A pass never waits for a job's preparation (its sandbox and `file_paths`, [`Executor::prepare`]): one that does
//! not finish at once runs in a task of its own while later passes heartbeat and watch the deadline, and the pass
//! after it finishes spawns the job, checking the lease's local deadline right before the spawn. Otherwise a large
//! copy would outlast the node lease with no heartbeat and no fence, and the job would start after the deadline.

pub mod executor;
#[cfg(not(madsim))]
pub mod job_tree;
#[cfg(not(madsim))]
pub mod process;
pub mod simulated;
#[cfg(not(madsim))]
pub mod work_dir;

pub use executor::{Executor, ExecutorError, ExitStatus, ProcessHandle, StartRequest};
pub use simulated::{
    Behaviour, End, JobScript, ProcessEvent, ProcessEventKind, ProcessLog, ProcessSink, Rule, SimulatedExecutor,
};

use crate::gang::decoded::KeptRows;
use crate::gang::model::{
    ALLOCATION_FREE, Allocation, AllocationData, AllocationRef, INBOX_NEW, JobId, JobLaunch, JobOutcome,
    KIND_ALLOCATION, KIND_INBOX, KIND_NODE, KIND_OPERATION, Message, NodeData, node_lease_owner,
};
use crate::pipeline::LocalClock;
use crate::store::{
    ApplyOutcome, ApplyParams, FetchParams, HINT_EVERY_KIND, HeartbeatParams, KEY_TEXT_BYTES_MAX, Lease, LockToken,
    NewHint, NewRow, Row, RowId, RowQuery, RowUpdate, Store, StoreError, WriteOutcome,
};
use futures_util::FutureExt;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, mpsc};
use tokio::time::{Duration, Instant};

/// Default node lease length (store clock). Shorter than the pipelines' 30 s: it bounds how long a dead node's
/// jobs look alive to the controller.
pub const NODE_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);
/// Default safety margin: the agent fences itself this long before the store-side expiry (DESIGN §2, Time).
pub const NODE_LEASE_MARGIN_DEFAULT: Duration = Duration::from_secs(2);
/// Default pause between passes, local clock; an `allocation` fetch hint ends it early.
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// The most allocations (slots) one node offers: each is a row every operation pass may read, and the agent
/// inserts them all before it takes its lease (a new user's `--slots 100000000` wrote 11 000 rows in 6 s and never
/// took it). Scenario files keep the same bound (`topology.slots`).
pub const SLOTS_MAX: u32 = 1024;
/// Most reports one pass sends; the rest wait for the next pass.
pub const REPORTS_PER_PASS_MAX: usize = 1000;

const _: () = assert!(
    POLL_INTERVAL_DEFAULT.as_millis() * 2 + NODE_LEASE_MARGIN_DEFAULT.as_millis()
        < NODE_LEASE_TTL_DEFAULT.as_millis() / 2
);
// PostgreSQL's defaults fit the node lease: a store call stuck on a row lock gives up (`lock_timeout`) well before
// the lease is due for its heartbeat (ttl / 2), and a frozen session's row locks are freed
// (`idle_in_transaction_timeout`) before a node heartbeat stuck behind them is due. Stated here, above the store,
// which names no layer above it; only the normal build has PostgreSQL.
#[cfg(not(madsim))]
const _: () = {
    use crate::store::PgOptions;
    assert!(PgOptions::LOCK_TIMEOUT_DEFAULT.as_millis() * 4 <= NODE_LEASE_TTL_DEFAULT.as_millis());
    assert!(PgOptions::IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT.as_millis() * 2 <= NODE_LEASE_TTL_DEFAULT.as_millis());
};

/// An agent's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// The node's name; unique among nodes. Default: none (required).
    pub name: String,
    /// Allocations (slots) the node offers. Default: none (required).
    pub slots: u32,
    /// Node lease length, store clock. Default [`NODE_LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// Local margin before the store-side expiry. Default [`NODE_LEASE_MARGIN_DEFAULT`].
    pub lease_margin: Duration,
    /// The lease is extended when its local deadline is this close. Default `lease_ttl / 2`.
    pub heartbeat_trigger: Duration,
    /// Pause between passes, local clock. Default [`POLL_INTERVAL_DEFAULT`].
    pub poll_interval: Duration,
}

impl AgentConfig {
    /// A node `name` with `slots` slots and every other field at its default.
    pub fn new(name: impl Into<String>, slots: u32) -> AgentConfig {
        AgentConfig {
            name: name.into(),
            slots,
            lease_ttl: NODE_LEASE_TTL_DEFAULT,
            lease_margin: NODE_LEASE_MARGIN_DEFAULT,
            heartbeat_trigger: NODE_LEASE_TTL_DEFAULT / 2,
            poll_interval: POLL_INTERVAL_DEFAULT,
        }
    }
}

/// An agent configuration that breaks a rule; the message names the node, the field, the value and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("agent {node}: {field}: {rule}")]
pub struct AgentConfigError {
    /// The node's name.
    pub node: String,
    /// The field.
    pub field: &'static str,
    /// The value and the rule it breaks.
    pub rule: String,
}

impl AgentConfig {
    /// Checks the rules; the first broken one is returned:
    /// - `name` is not empty, holds no NUL character and at most
    ///   [`KEY_TEXT_BYTES_MAX`] (1024) bytes (it is the node row's
    ///   status, a key of the fetch index), and `slots` is in 1..=[`SLOTS_MAX`];
    /// - `lease_margin` is shorter than `lease_ttl` (the agent must hold its lease a while on its own clock);
    /// - `poll_interval` is not zero;
    /// - `heartbeat_trigger` leaves at least two passes (`2 × poll_interval`) to extend the lease before its local
    ///   deadline, and is shorter than the local lease (`lease_ttl − lease_margin`), or every pass would
    ///   heartbeat.
    pub fn validate(&self) -> Result<(), AgentConfigError> {
        let fail = |field, rule: String| Err(AgentConfigError { node: self.name.clone(), field, rule });
        let show = crate::duration::format;
        if self.name.is_empty() {
            return fail("name", "must not be empty".into());
        }
        // The name is the node row's status, a key of the fetch index: the store would refuse it on every
        // registration, and the agent would retry forever instead of saying so at start.
        if self.name.contains('\0') {
            return fail("name", "holds a NUL character, which PostgreSQL text cannot hold".into());
        }
        if self.name.len() > KEY_TEXT_BYTES_MAX {
            let rule = format!(
                "a name of {} bytes is longer than the {KEY_TEXT_BYTES_MAX} a node name may hold (it is the node \
                 row's status, a key of the fetch index)",
                self.name.len()
            );
            return fail("name", rule);
        }
        if self.slots == 0 {
            return fail("slots", "0 must be at least 1".into());
        }
        if self.slots > SLOTS_MAX {
            return fail("slots", format!("{} must be at most {SLOTS_MAX}", self.slots));
        }
        if self.lease_margin >= self.lease_ttl {
            return fail(
                "lease_margin",
                format!("{} must be shorter than lease_ttl {}", show(self.lease_margin), show(self.lease_ttl)),
            );
        }
        if self.poll_interval.is_zero() {
            return fail("poll_interval", "must not be zero".into());
        }
        if self.heartbeat_trigger < self.poll_interval * 2 {
            let rule = format!(
                "{} is shorter than 2 × poll_interval ({}) = {}: a lease due for extension must hold two passes",
                show(self.heartbeat_trigger),
                show(self.poll_interval),
                show(self.poll_interval * 2)
            );
            return fail("heartbeat_trigger", rule);
        }
        let local = self.lease_ttl - self.lease_margin;
        if self.heartbeat_trigger >= local {
            let rule = format!(
                "{} must be shorter than lease_ttl ({}) − lease_margin ({}) = {}",
                show(self.heartbeat_trigger),
                show(self.lease_ttl),
                show(self.lease_margin),
                show(local)
            );
            return fail("heartbeat_trigger", rule);
        }
        Ok(())
    }
}

/// The agent's node lease.
#[derive(Clone, Copy, Debug)]
struct Session {
    lease: Lease,
    /// Local time at which the lease counts as lost: (call sent) + ttl − margin.
    deadline: Instant,
}

#[derive(Debug)]
struct Running {
    job: JobId,
    allocation: AllocationRef,
    handle: ProcessHandle,
}

/// A job whose start is being prepared ([`Executor::prepare`]) in a task of its own.
struct Preparing<P> {
    job: JobId,
    allocation: AllocationRef,
    /// The preparation's result once its task sent it.
    result: Option<Result<P, ExecutorError>>,
}

/// What a preparation task sends back: the allocation row, the job, the result.
type PreparedMessage<P> = (RowId, JobId, Result<P, ExecutorError>);

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentPass {
    /// The pass took a new node lease (a new session).
    pub leased: bool,
    /// The agent fenced itself (killed every process and dropped its session), with the reason.
    pub fenced: Option<String>,
    /// Jobs started.
    pub started: Vec<JobId>,
    /// Jobs killed because the controller moved on.
    pub killed: Vec<JobId>,
    /// Jobs whose processes ended by themselves, with their exit.
    pub exited: Vec<(JobId, ExitStatus)>,
    /// Jobs an allocation was marked with as possibly still running here, whose end the pass reported because no
    /// process of theirs runs here ([`REASON_NOT_RUNNING`]).
    pub answered: Vec<JobId>,
    /// Reports inserted into inboxes.
    pub reported: usize,
    /// Jobs whose processes the fence killed (empty unless `fenced`).
    pub fence_killed: Vec<JobId>,
    /// Jobs placed in an allocation whose slot this agent does not offer (`slot ≥ slots`), reported interrupted
    /// instead of started.
    pub unserved: Vec<JobId>,
    /// Jobs whose preparation had finished but which the pass did not spawn, because the node lease's local
    /// deadline had passed by then (the next pass fences).
    pub late: Vec<JobId>,
    /// The session (node lease token) the agent holds at the end of the pass.
    pub session: Option<LockToken>,
}

/// Called with every pass an [`Agent::run`] loop finishes (including a fence at the local deadline while a store
/// call hung, reported as a pass with only `fenced` and `fence_killed` set); not called for a pass that failed
/// with a store error. The simulator traces fences, sessions and kills through it.
pub type PassObserver = Arc<dyn Fn(&AgentPass) + Send + Sync>;

/// The reason an agent reports for a process it killed because the controller moved on from its job (the job
/// ended, or its allocation now names another job or none).
pub const REASON_MOVED_ON: &str = "process killed: the controller moved on";

/// The reason an agent reports for a job the controller marked as possibly still running in one of its
/// allocations ([`AllocationData::lingering`]) when it runs no process of it: it never started it, or the process
/// ended (and that end was reported too). The report is the evidence the controller waits for before it places the
/// job's rank in another allocation (`gang::model::Lingering`).
pub const REASON_NOT_RUNNING: &str = "no process of the job runs here: the controller moved on from it";

/// The reason of the jobs a stopping agent interrupts ([`Agent::stop`]).
pub const REASON_NODE_STOPPING: &str = "node stopping";

/// What a graceful stop did ([`Agent::stop`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStop {
    /// Jobs whose processes had ended by themselves (before or during the stop); their exits were reported.
    pub exited: Vec<JobId>,
    /// Jobs whose processes were killed and reported interrupted.
    pub interrupted: Vec<JobId>,
    /// Reports inserted into inboxes.
    pub reported: usize,
    /// Reports that could not be inserted (store unreachable); those jobs are aborted as "node lost" once the
    /// node's lease expires.
    pub unreported: usize,
    /// Whether the node lease was given back (false: there was none, or the store did not answer in time).
    pub lease_released: bool,
}

/// A node agent over store `S` running processes through `E`.
pub struct Agent<S: Store, E: Executor> {
    store: Arc<S>,
    executor: E,
    config: AgentConfig,
    clock: LocalClock,
    node: Option<RowId>,
    session: Option<Session>,
    processes: BTreeMap<RowId, Running>,
    /// Starts being prepared off the loop, by allocation row.
    preparing: BTreeMap<RowId, Preparing<E::Prepared>>,
    /// Where preparation tasks send their results, and the receiving end a pass drains.
    prepared_tx: mpsc::UnboundedSender<PreparedMessage<E::Prepared>>,
    prepared_rx: mpsc::UnboundedReceiver<PreparedMessage<E::Prepared>>,
    /// Woken by a preparation task when it finishes, so [`Agent::run`] starts its next pass at once.
    prepared_wake: Arc<Notify>,
    /// Jobs whose processes ran and ended here, so a pass never starts one twice while the controller has not yet
    /// consumed its report. Pruned to the jobs its allocations still name.
    finished: BTreeSet<JobId>,
    /// Reports not yet inserted: (operation, message), in order.
    outbox: VecDeque<(RowId, Message)>,
    /// Jobs marked lingering in its allocations ([`AllocationData::lingering`]) whose end this session reported
    /// (a kill, or [`REASON_NOT_RUNNING`]), so it is reported once. Pruned to the marks its allocations still carry.
    answered: BTreeSet<JobId>,
    observer: Option<PassObserver>,
    /// Jobs a fence killed and has not reported yet (a fence abandoned at the deadline leaves them to the next).
    fence_killed: Vec<JobId>,
    /// The session's deadline as the last heartbeat extended it, shared with [`Agent::run`]'s deadline watch: a
    /// pass that extends the lease and then hangs on a later call must be abandoned at the *new* deadline, not at
    /// the one the pass started with (else the agent fences itself while its lease is still held).
    extended: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Whether the agent already warned that the node lease is held by another session (once per wait: reset when
    /// the agent gets a session).
    warned_held: bool,
    /// Its node's allocation rows as the last pass decoded them, by row, with the version they were decoded at: a
    /// pass decodes only the rows written since (decoding every allocation, job launch and environment
    /// included, at every pass of every agent was most of a quiet gang world's CPU).
    decoded: KeptRows<Allocation>,
}

impl<S: Store, E: Executor> Agent<S, E> {
    /// An agent for `config`'s node over `store`, running processes with `executor`, on the runtime's clock.
    pub fn new(store: Arc<S>, executor: E, config: AgentConfig) -> Agent<S, E> {
        let (prepared_tx, prepared_rx) = mpsc::unbounded_channel();
        Agent {
            store,
            executor,
            config,
            clock: LocalClock::exact(),
            node: None,
            session: None,
            processes: BTreeMap::new(),
            preparing: BTreeMap::new(),
            prepared_tx,
            prepared_rx,
            prepared_wake: Arc::default(),
            finished: BTreeSet::new(),
            outbox: VecDeque::new(),
            answered: BTreeSet::new(),
            observer: None,
            fence_killed: Vec::new(),
            extended: Arc::default(),
            warned_held: false,
            decoded: KeptRows::default(),
        }
    }

    /// The same agent reporting every pass of [`Agent::run`] to `observer`.
    pub fn with_observer(mut self, observer: PassObserver) -> Agent<S, E> {
        self.observer = Some(observer);
        self
    }

    /// The same agent on the local clock `clock` (the simulator drifts it).
    pub fn with_local_clock(mut self, clock: LocalClock) -> Agent<S, E> {
        self.clock = clock;
        self
    }

    /// The node's row, once registered.
    pub fn node(&self) -> Option<RowId> {
        self.node
    }

    /// The current session (node lease token), if the agent holds its lease.
    pub fn session(&self) -> Option<LockToken> {
        self.session.map(|s| s.lease.token)
    }

    /// Jobs running now, by allocation row.
    pub fn running(&self) -> BTreeMap<RowId, JobId> {
        self.processes.iter().map(|(row, p)| (*row, p.job)).collect()
    }

    /// Jobs whose start is being prepared (not spawned yet), by allocation row.
    pub fn preparing(&self) -> BTreeMap<RowId, JobId> {
        self.preparing.iter().map(|(row, p)| (*row, p.job)).collect()
    }

    /// The agent's loop, forever (see [`Agent::run_until`]).
    pub async fn run(self) {
        self.run_until(std::future::pending::<()>()).await;
    }

    /// The agent's loop until `stop` resolves: a pass, then a pause of `poll_interval` that an `allocation` fetch
    /// hint (or the catch-up hint [`HINT_EVERY_KIND`]), or the end of a job's preparation, cuts short. If a pass is still running (a store call hanging) at
    /// the lease's local deadline, it is abandoned and the agent fences itself: self-fencing never waits for the
    /// store. `stop` is looked at between passes only (a pass is never cut in the middle; a hung one ends at the
    /// lease's deadline), and then the agent stops gracefully ([`Agent::stop`]) and returns what the stop did.
    pub async fn run_until(mut self, stop: impl Future<Output = ()>) -> AgentStop {
        let mut hints = self.store.subscribe_hints();
        let clock = self.clock.clone();
        let prepared = self.prepared_wake.clone();
        tokio::pin!(stop);
        loop {
            let deadline = self.session.map(|s| s.deadline);
            let pass = match deadline {
                // A deadline already passed: the pass fences at its start, and nothing may cut that fence short.
                Some(deadline) if clock.now() < deadline => {
                    let extended = self.extended.clone();
                    // The deadline moves on when the pass's own heartbeat extends the lease.
                    let watch = async {
                        let mut deadline = deadline;
                        loop {
                            clock.sleep_until(deadline).await;
                            let latest = *extended.lock().unwrap_or_else(|p| p.into_inner());
                            match latest {
                                Some(later) if later > deadline => deadline = later,
                                _ => break,
                            }
                        }
                    };
                    tokio::select! {
                        biased;
                        pass = self.run_once() => Some(pass),
                        _ = watch => None,
                    }
                }
                _ => Some(self.run_once().await),
            };
            let pass = match pass {
                None => {
                    let reason = "node lease expired locally while a store call had not answered (the store unreachable or slow)";
                    let fence_killed = self.fence(reason).await;
                    Some(AgentPass { fenced: Some(reason.into()), fence_killed, ..AgentPass::default() })
                }
                Some(Err(error)) => {
                    tracing::warn!(node = %self.config.name, %error, "agent pass failed");
                    None
                }
                Some(Ok(pass)) => Some(pass),
            };
            if let (Some(observer), Some(pass)) = (&self.observer, &pass) {
                observer(pass);
            }
            let wake = self.session.map_or(self.config.poll_interval, |s| {
                s.deadline.saturating_duration_since(clock.now()).min(self.config.poll_interval)
            });
            let sleep = clock.sleep(wake);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stop => return self.stop().await,
                    _ = &mut sleep => break,
                    _ = prepared.notified() => break,
                    hint = hints.recv() => match hint {
                        Ok(kind) if kind == KIND_ALLOCATION || kind == HINT_EVERY_KIND => break,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            (&mut sleep).await;
                            break;
                        }
                    },
                }
            }
        }
    }

    /// Graceful stop (a node taken out of service, `lockstep agent` on SIGTERM): the agent takes no new job; it
    /// collects the exits of processes that already ended, kills the ones still running and reports each of
    /// their jobs as interrupted ([`REASON_NODE_STOPPING`]), as well as the jobs whose start it was still
    /// preparing (they never run), so that the controller restarts them elsewhere at once (a ranked job of a gang
    /// task restarts its gang, DESIGN §4); and it gives its node lease back, so the controller sees the node gone
    /// at once instead of when the lease expires.
    ///
    /// The reports and the lease's release are one guarded apply on the node lease (inserts, then unlock, in one
    /// transaction), then a fetch hint per operation. A controller pass reads the inbox before the nodes, so it
    /// sees the reports only with the node gone: the pass that handles them reuses none of the node's allocations
    /// for the next incarnation (reusing one would place a job on a node that never starts it, and cost a second
    /// gang restart). A pass whose two reads straddle the apply sees the node gone without the reports and aborts
    /// its jobs as "node lost"; the reports that follow are then ignored. Either way the jobs restart once, on
    /// other nodes, without waiting for the lease to expire. If the lease was already lost (stale) or the apply
    /// fails, the reports are inserted plainly (a duplicate of a report that did commit is ignored). Each store
    /// call is bounded by `lease_margin`: a stopping agent cut off from the store still ends, and the controller
    /// then learns of the node's loss when its lease expires.
    pub async fn stop(mut self) -> AgentStop {
        let mut stop = AgentStop::default();
        let mut pass = AgentPass::default();
        self.collect_exits(&mut pass);
        stop.exited = pass.exited.into_iter().map(|(job, _)| job).collect();
        for (_, running) in std::mem::take(&mut self.processes) {
            // A process that ended between the exit check and the kill reports how it ended.
            let outcome = match running.handle.kill().await {
                ExitStatus::Killed => {
                    stop.interrupted.push(running.job);
                    JobOutcome::Interrupted { reason: REASON_NODE_STOPPING.into() }
                }
                status => {
                    stop.exited.push(running.job);
                    exit_outcome(status)
                }
            };
            let message = Message::JobEnded { job: running.job, allocation: running.allocation, outcome };
            self.outbox.push_back((running.job.operation, message));
        }
        for (_, preparing) in std::mem::take(&mut self.preparing) {
            stop.interrupted.push(preparing.job);
            let outcome = JobOutcome::Interrupted { reason: REASON_NODE_STOPPING.into() };
            let message = Message::JobEnded { job: preparing.job, allocation: preparing.allocation, outcome };
            self.outbox.push_back((preparing.job.operation, message));
        }
        if let Some(session) = self.session.take() {
            match tokio::time::timeout(self.config.lease_margin, self.report_and_release(session.lease)).await {
                Ok(Ok(released)) => {
                    stop.lease_released = released;
                    if released {
                        stop.reported = std::mem::take(&mut self.outbox).len();
                    }
                }
                Ok(Err(error)) => tracing::warn!(node = %self.config.name, %error, "release on stop failed"),
                Err(_) => tracing::warn!(node = %self.config.name, "release on stop timed out"),
            }
        }
        if !self.outbox.is_empty() {
            match tokio::time::timeout(self.config.lease_margin, self.send_reports()).await {
                Ok(Ok(sent)) => stop.reported += sent,
                Ok(Err(error)) => tracing::warn!(node = %self.config.name, %error, "reports on stop failed"),
                Err(_) => tracing::warn!(node = %self.config.name, "reports on stop timed out"),
            }
        }
        stop.unreported = self.outbox.len();
        tracing::info!(
            node = %self.config.name,
            interrupted = stop.interrupted.len(),
            reported = stop.reported,
            unreported = stop.unreported,
            lease_released = stop.lease_released,
            "agent stopped"
        );
        stop
    }

    /// Inserts every queued report, gives the node lease back and hints the operations reported to, in one
    /// guarded apply (its hints are published once it commits: [`ApplyParams::hints`]). Returns whether it applied
    /// (false: the lease was already lost, nothing written). A refused apply whose reports named operations that
    /// are gone is made again without them ([`Agent::drop_reports_to_gone_operations`]).
    async fn report_and_release(&mut self, lease: Lease) -> Result<bool, StoreError> {
        match self.apply_reports_and_release(lease).await {
            Err(StoreError::Invalid(error)) => match self.drop_reports_to_gone_operations().await? {
                0 => Err(StoreError::Invalid(error)),
                _ => self.apply_reports_and_release(lease).await,
            },
            outcome => outcome,
        }
    }

    /// The guarded apply of [`Agent::report_and_release`].
    async fn apply_reports_and_release(&self, lease: Lease) -> Result<bool, StoreError> {
        let inserts = self
            .outbox
            .iter()
            .map(|(operation, message)| NewRow::new(KIND_INBOX, INBOX_NEW, message.to_json()).with_parent(*operation))
            .collect();
        let operations: BTreeSet<RowId> = self.outbox.iter().map(|(operation, _)| *operation).collect();
        let hints = operations.into_iter().map(|operation| NewHint::row(KIND_OPERATION, operation)).collect();
        let params = ApplyParams { inserts, hints, ..ApplyParams::new(lease, RowUpdate::default()) };
        Ok(self.store.apply(params).await? != ApplyOutcome::Stale)
    }

    /// One pass (see the module docs). Errors: the store's; state stays consistent and the next pass retries.
    pub async fn run_once(&mut self) -> Result<AgentPass, StoreError> {
        let mut pass = AgentPass::default();
        // A fence ends the pass: the next one starts a new session.
        if self.session.is_some_and(|s| self.clock.now() >= s.deadline) {
            let reason = "node lease expired locally";
            pass.fence_killed = self.fence(reason).await;
            pass.fenced = Some(reason.into());
            return Ok(pass);
        }
        if self.node.is_none() {
            self.register().await?;
        }
        // Listed before the lease is taken or renewed: a pass whose listing fails does neither.
        let allocations = self.list_allocations().await?;
        if self.session.is_none() {
            pass.leased = self.acquire().await?;
        }
        if let Some((reason, killed)) = self.heartbeat_if_due().await? {
            pass.fenced = Some(reason);
            pass.fence_killed = killed;
            return Ok(pass);
        }
        self.collect_exits(&mut pass);
        if let Some(session) = self.session {
            self.reconcile(session, &allocations, &mut pass).await;
        }
        pass.reported = self.send_reports().await?;
        pass.session = self.session();
        Ok(pass)
    }

    /// The node's allocation rows. Listed before the pass takes or renews its node lease, so that the agent holds
    /// the lease only while its passes see its allocations (DESIGN §4, Agents): an agent that can reach the store
    /// but not list them (a failing or hanging query) neither starts what the controller places in its node nor
    /// kills what it moved on from, so it must not tell the controller that it serves the node; its lease's local
    /// deadline passes, it fences, and it takes no new session until a listing succeeds. So a job placed in a
    /// node whose session lives on starts within the local lease (`lease_ttl − lease_margin`) plus a pass, or the
    /// node's session ends.
    async fn list_allocations(&mut self) -> Result<Vec<Allocation>, StoreError> {
        let node = self.node.expect("registered before listing");
        // Decoded where they are read, never copied whole, and only if written since the last pass.
        self.decoded.begin();
        let decoded = &self.decoded;
        let read = |r: &Row| (r.id, decoded.read(r, Allocation::from_row));
        let rows = self.store.list_map(KIND_ALLOCATION, Some(node), read).await?;
        let mut allocations = Vec::with_capacity(rows.len());
        for (id, row) in rows {
            match self.decoded.keep(id, row) {
                Ok(allocation) => allocations.push(allocation),
                Err(error) => tracing::warn!(node = %self.config.name, %error, "allocation row skipped"),
            }
        }
        self.decoded.end();
        Ok(allocations)
    }

    /// Finds or creates the node's row and its allocation rows.
    async fn register(&mut self) -> Result<(), StoreError> {
        let name = &self.config.name;
        let data = NodeData { name: name.clone(), slots: self.config.slots };
        let data_json = serde_json::to_value(&data).expect("node data serializes");
        let existing = self.store.list(KIND_NODE, None).await?.into_iter().find(|row| row.status == *name);
        // An existing row's data (slots) is brought up to date by `acquire`, before each new session.
        let node = match existing {
            Some(row) => row.id,
            None => self.store.insert(NewRow::new(KIND_NODE, name.clone(), data_json)).await?.id,
        };
        let slots: BTreeSet<u32> = self
            .store
            .list(KIND_ALLOCATION, Some(node))
            .await?
            .iter()
            .filter_map(|row| Allocation::from_row(row).ok().map(|a| a.data.slot))
            .collect();
        for slot in (0..self.config.slots).filter(|slot| !slots.contains(slot)) {
            let data = AllocationData::free(node, name.clone(), slot);
            let row = NewRow::new(KIND_ALLOCATION, ALLOCATION_FREE, serde_json::to_value(&data).expect("serializes"));
            self.store.insert(row.with_parent(node)).await?;
        }
        self.node = Some(node);
        Ok(())
    }

    /// Takes the node lease if it is free: a new session. Returns whether it got one.
    ///
    /// First the node row must carry this agent's data (its slots): a row written by an earlier agent for the node
    /// (say with more `--slots`) is updated while no session holds it, so a session never starts with a slot count
    /// the agent will not serve, and the controller, which reads a node's slots with its session, never places a
    /// job in a slot that does not exist. While an earlier session still holds the lease the update is
    /// busy and the agent waits, as it must for the lease anyway.
    async fn acquire(&mut self) -> Result<bool, StoreError> {
        let node = self.node.expect("registered before acquiring");
        let data = NodeData { name: self.config.name.clone(), slots: self.config.slots };
        let data = serde_json::to_value(&data).expect("node data serializes");
        let current = self.store.get(node).await?.map(|row| row.data);
        if current.as_ref() != Some(&data) {
            let update = RowUpdate { status: None, data: Some(data) };
            if self.store.update_unleased(node, update).await? == WriteOutcome::Busy {
                self.warn_held();
                return Ok(false);
            }
        }
        let sent = self.clock.now();
        let params = FetchParams {
            pipeline: node_lease_owner(&self.config.name),
            kind: KIND_NODE.into(),
            statuses: vec![self.config.name.clone()],
            limit: 1,
            lease_ttl: self.config.lease_ttl,
            min_processing_interval: Duration::ZERO,
            retry_delay: Duration::ZERO,
        };
        let Some(row) = self.store.fetch(params).await?.into_iter().next() else {
            self.warn_held();
            return Ok(false);
        };
        self.warned_held = false;
        let token = row.lock_token.expect("a fetched row carries its lease token");
        self.node = Some(row.id);
        self.finished.clear();
        self.answered.clear();
        let deadline = sent + self.config.lease_ttl - self.config.lease_margin;
        self.session = Some(Session { lease: Lease { id: row.id, token }, deadline });
        tracing::info!(node = %self.config.name, %token, "node session started");
        Ok(true)
    }

    /// Another session holds the node lease (a second agent for this node, or this agent's own earlier session
    /// until its lease expires): say so once per wait, not every pass.
    fn warn_held(&mut self) {
        if !self.warned_held {
            self.warned_held = true;
            tracing::warn!(
                node = %self.config.name,
                "node {} is held by another agent session; waiting for its lease",
                self.config.name
            );
        }
    }

    /// Extends the lease when its local deadline is within `heartbeat_trigger`. Returns the fence reason if the
    /// store says the lease is gone, with the jobs the fence killed. A store error leaves the deadline running: the
    /// fence comes at the deadline.
    async fn heartbeat_if_due(&mut self) -> Result<Option<(String, Vec<JobId>)>, StoreError> {
        let Some(session) = self.session else { return Ok(None) };
        let sent = self.clock.now();
        // A deadline that passed while the pass listed its allocations is not extended: the next pass fences (and
        // this one spawns nothing, `spawn_prepared`).
        if !self.heartbeat_due(session, sent) || sent >= session.deadline {
            return Ok(None);
        }
        let params = HeartbeatParams { leases: vec![session.lease], lease_ttl: self.config.lease_ttl };
        let held = self.store.heartbeat(params).await?;
        if held.contains(&session.lease) && self.clock.now() < session.deadline {
            let deadline = sent + self.config.lease_ttl - self.config.lease_margin;
            self.session = Some(Session { deadline, ..session });
            *self.extended.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
            Ok(None)
        } else {
            let reason = "node lease lost".to_string();
            let killed = self.fence(&reason).await;
            Ok(Some((reason, killed)))
        }
    }

    /// Whether `session`'s lease needs its heartbeat at local time `now`: its deadline is within
    /// `heartbeat_trigger`.
    fn heartbeat_due(&self, session: Session, now: Instant) -> bool {
        session.deadline.saturating_duration_since(now) <= self.config.heartbeat_trigger
    }

    /// Self-fencing: kills every process, then ends the session (giving the lease back if the store answers, so
    /// the controller sees the node lost at once). The next pass starts a new session.
    async fn fence(&mut self, reason: &str) -> Vec<JobId> {
        tracing::warn!(node = %self.config.name, reason, processes = self.processes.len(), "self-fencing");
        // Cancel-safe (`run` abandons a pass at the lease's local deadline, possibly in the middle of this fence):
        // the processes stay listed until every one has ended, so the fence that follows waits for them too and
        // reports them.
        for running in self.processes.values_mut() {
            running.handle.request_kill();
        }
        for running in self.processes.values_mut() {
            running.handle.ended().await;
        }
        let killed = std::mem::take(&mut self.processes).into_values().map(|running| running.job);
        self.fence_killed.extend(killed);
        // Starts still being prepared are given up: the session they were placed under ends here.
        self.preparing.clear();
        // Bounded: a fenced agent is often cut off from the store, and the lease expires on its own anyway.
        if let Some(session) = self.session.take() {
            let release = self.store.release(vec![session.lease]);
            match tokio::time::timeout(self.config.lease_margin, release).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(node = %self.config.name, %error, "lease release after fencing failed")
                }
                Err(_) => tracing::warn!(node = %self.config.name, "lease release after fencing timed out"),
            }
        }
        std::mem::take(&mut self.fence_killed)
    }

    fn collect_exits(&mut self, pass: &mut AgentPass) {
        let ended: Vec<RowId> =
            self.processes.iter().filter(|(_, p)| p.handle.exit_status().is_some()).map(|(row, _)| *row).collect();
        for row in ended {
            let running = self.processes.remove(&row).expect("listed");
            let status = running.handle.exit_status().expect("ended");
            let outcome = exit_outcome(status);
            self.finished.insert(running.job);
            let message = Message::JobEnded { job: running.job, allocation: running.allocation, outcome };
            self.outbox.push_back((running.job.operation, message));
            pass.exited.push((running.job, status));
        }
    }

    /// Kills the processes the controller moved on from, then starts the jobs it placed here under this session:
    /// each start is prepared off the loop ([`Agent::prepare`]) and spawned by the first pass that finds it
    /// prepared, unless the lease's local deadline has passed by then.
    async fn reconcile(&mut self, session: Session, allocations: &[Allocation], pass: &mut AgentPass) {
        let mut wanted: BTreeMap<RowId, (AllocationRef, &JobLaunch)> = BTreeMap::new();
        for allocation in allocations {
            let ours = allocation.allocated && allocation.data.node_session == Some(session.lease.token);
            let Some(launch) = allocation.data.job.as_ref().filter(|_| ours) else { continue };
            if allocation.data.slot < self.config.slots {
                wanted.insert(allocation.row, (allocation.current(), launch));
            } else if self.finished.insert(launch.job) {
                // A slot this agent does not offer: the job is reported interrupted once, so the controller puts
                // it elsewhere instead of waiting for a start that never comes.
                let reason = format!(
                    "allocation slot {} is not served: node {} has {} slots",
                    allocation.data.slot, self.config.name, self.config.slots
                );
                let outcome = JobOutcome::Interrupted { reason };
                let message = Message::JobEnded { job: launch.job, allocation: allocation.current(), outcome };
                self.outbox.push_back((launch.job.operation, message));
                pass.unserved.push(launch.job);
            }
        }
        let is_stale = |row: &RowId, allocation: AllocationRef, job: JobId| {
            wanted.get(row).is_none_or(|(a, l)| *a != allocation || l.job != job)
        };
        let stale: Vec<RowId> =
            self.processes.iter().filter(|(row, p)| is_stale(row, p.allocation, p.job)).map(|(row, _)| *row).collect();
        for row in stale {
            // Listed until it has ended: a fence that abandons this pass at the lease's local deadline, in the middle
            // of the kill, then waits for it too before it gives the lease back.
            let handle = &mut self.processes.get_mut(&row).expect("listed").handle;
            handle.request_kill();
            handle.ended().await;
            let running = self.processes.remove(&row).expect("listed");
            // The controller ignores a report on a job it ended, but learns from it that the process is gone: a
            // gang restart places the job's rank elsewhere only then (gang::model::Lingering).
            let outcome = JobOutcome::Aborted { reason: REASON_MOVED_ON.into() };
            let message = Message::JobEnded { job: running.job, allocation: running.allocation, outcome };
            self.outbox.push_back((running.job.operation, message));
            self.answered.insert(running.job);
            pass.killed.push(running.job);
        }
        self.preparing.retain(|row, p| !is_stale(row, p.allocation, p.job));
        self.answer_lingering(session, allocations, pass);
        while let Ok((row, job, result)) = self.prepared_rx.try_recv() {
            if let Some(preparing) = self.preparing.get_mut(&row).filter(|p| p.job == job) {
                preparing.result = Some(result);
            }
        }
        for (row, (allocation, launch)) in &wanted {
            if self.processes.contains_key(row) || self.finished.contains(&launch.job) {
                continue;
            }
            let result = match self.preparing.get_mut(row) {
                Some(preparing) => match preparing.result.take() {
                    // The stale ones were dropped above.
                    _ if preparing.job != launch.job => {
                        panic!("allocation {row}: preparing job {} but job {} is placed", preparing.job, launch.job)
                    }
                    Some(result) => result,
                    None => continue,
                },
                None => {
                    let request = StartRequest {
                        node: self.config.name.clone(),
                        allocation: *allocation,
                        launch: (*launch).clone(),
                    };
                    match self.prepare(*row, request) {
                        Some(result) => result,
                        None => continue,
                    }
                }
            };
            let preparing = Preparing { job: launch.job, allocation: *allocation, result: Some(result) };
            self.spawn_prepared(*row, preparing, session.deadline, pass);
        }
        let named: BTreeSet<JobId> = allocations
            .iter()
            .filter(|allocation| allocation.allocated && allocation.data.node_session == Some(session.lease.token))
            .filter_map(|allocation| allocation.data.job.as_ref().map(|launch| launch.job))
            .collect();
        self.finished.retain(|job| named.contains(job));
    }

    /// Reports, once per session, the end of each job its allocations are marked with as possibly still running
    /// ([`AllocationData::lingering`]) when it runs no process of it (it never started it, or the process ended): the
    /// controller places the job's rank in another allocation only on such evidence. A process of the job that
    /// still runs here was killed and reported by [`Agent::reconcile`] first: the allocation no longer names it.
    fn answer_lingering(&mut self, session: Session, allocations: &[Allocation], pass: &mut AgentPass) {
        let mut marked = BTreeSet::new();
        for allocation in allocations {
            let ours = allocation.allocated && allocation.data.node_session == Some(session.lease.token);
            let Some(job) = allocation.data.lingering.filter(|_| ours) else { continue };
            marked.insert(job);
            let runs = self.processes.values().any(|p| p.job == job) || self.preparing.values().any(|p| p.job == job);
            if runs || self.answered.contains(&job) {
                continue;
            }
            self.answered.insert(job);
            let outcome = JobOutcome::Aborted { reason: REASON_NOT_RUNNING.into() };
            let message = Message::JobEnded { job, allocation: allocation.current(), outcome };
            self.outbox.push_back((job.operation, message));
            pass.answered.push(job);
        }
        self.answered.retain(|job| marked.contains(job));
    }

    /// Spawns the prepared job of allocation row `row` and queues its report (started, or failed to start), unless
    /// the lease's local `deadline` has passed: the spawn is the side effect the lease guards, so it must not happen
    /// once the lease may be lost, however long the kills before it or the preparation took. A late start stays
    /// listed in `preparing` for the fence of the next pass to give up.
    fn spawn_prepared(
        &mut self,
        row: RowId,
        mut preparing: Preparing<E::Prepared>,
        deadline: Instant,
        pass: &mut AgentPass,
    ) {
        let (job, allocation) = (preparing.job, preparing.allocation);
        if self.clock.now() >= deadline {
            tracing::warn!(node = %self.config.name, %job, "not started: node lease expired locally");
            self.preparing.insert(row, preparing);
            pass.late.push(job);
            return;
        }
        self.preparing.remove(&row);
        let result = preparing.result.take().expect("spawned once prepared");
        match result.and_then(|prepared| self.executor.spawn(prepared)) {
            Ok(handle) => {
                self.processes.insert(row, Running { job, allocation, handle });
                self.outbox.push_back((job.operation, Message::JobStarted { job, allocation }));
                pass.started.push(job);
            }
            Err(error) => {
                self.finished.insert(job);
                let outcome = JobOutcome::StartFailed { message: error.to_string() };
                self.outbox.push_back((job.operation, Message::JobEnded { job, allocation, outcome }));
            }
        }
    }

    /// Begins preparing `request` for allocation row `row`. A preparation that finishes at its first poll (the
    /// simulated executor's always does) is returned at once, so the job spawns in this pass; otherwise it moves
    /// to a task of its own, listed in `preparing`, which sends its result and wakes [`Agent::run`] when done.
    fn prepare(&mut self, row: RowId, request: StartRequest) -> Option<Result<E::Prepared, ExecutorError>> {
        let (job, allocation) = (request.launch.job, request.allocation);
        let mut preparation = Box::pin(self.executor.prepare(request));
        if let Some(result) = (&mut preparation).now_or_never() {
            return Some(result);
        }
        let (sender, wake) = (self.prepared_tx.clone(), self.prepared_wake.clone());
        tokio::spawn(async move {
            let result = preparation.await;
            // The agent may be gone (and its receiver with it): then so is the interest in the result.
            let _ = sender.send((row, job, result));
            wake.notify_one();
        });
        self.preparing.insert(row, Preparing { job, allocation, result: None });
        None
    }

    /// Inserts the queued reports, at most [`REPORTS_PER_PASS_MAX`] of them in order, and hints each operation
    /// reported to, in one store call ([`Store::insert_many`]): a thousand starts of one gang are one round trip,
    /// not a thousand (a thousand round trips outlasted the node lease, and the agent fenced itself and
    /// killed the gang in every incarnation: a new user's trial, `tests/sim_gang.rs`). A report leaves the queue
    /// only once inserted, so a failed or abandoned pass loses none (a report sent twice is ignored by the
    /// controller). A pass whose lease's heartbeat fell due (the local deadline within `heartbeat_trigger`) sends
    /// nothing, leaving the reports to the next pass, which heartbeats first.
    ///
    /// Reports to an operation that is gone (deleted by retention once it ended: `lockstep serve --retain`) are
    /// dropped when the store refuses them ([`Agent::drop_reports_to_gone_operations`]), and the rest sent at once.
    async fn send_reports(&mut self) -> Result<usize, StoreError> {
        if self.outbox.is_empty() || self.session.is_some_and(|session| self.heartbeat_due(session, self.clock.now())) {
            return Ok(0);
        }
        match self.insert_reports().await {
            Err(StoreError::Invalid(error)) => match self.drop_reports_to_gone_operations().await? {
                0 => Err(StoreError::Invalid(error)),
                _ => self.insert_reports().await,
            },
            outcome => outcome,
        }
    }

    /// The insert of [`Agent::send_reports`]: at most [`REPORTS_PER_PASS_MAX`] queued reports, in order.
    async fn insert_reports(&mut self) -> Result<usize, StoreError> {
        if self.outbox.is_empty() {
            return Ok(0);
        }
        let count = self.outbox.len().min(REPORTS_PER_PASS_MAX);
        let reports = self.outbox.iter().take(count);
        let rows = reports
            .clone()
            .map(|(operation, message)| NewRow::new(KIND_INBOX, INBOX_NEW, message.to_json()).with_parent(*operation))
            .collect();
        let operations: BTreeSet<RowId> = reports.map(|(operation, _)| *operation).collect();
        let hints = operations.into_iter().map(|operation| NewHint::row(KIND_OPERATION, operation)).collect();
        self.store.insert_many(rows, hints).await?;
        self.outbox.drain(..count);
        Ok(count)
    }

    /// Drops the queued reports to operations that no longer exist, and returns how many. Retention deletes an
    /// operation some time after it ended, and the store refuses a row under a parent that is gone (DESIGN §2,
    /// "Parents"), so one such report would hold back, at every pass, every report queued behind it; the
    /// controller has no use for it, as the operation ended.
    async fn drop_reports_to_gone_operations(&mut self) -> Result<usize, StoreError> {
        let operations: BTreeSet<RowId> = self.outbox.iter().map(|(operation, _)| *operation).collect();
        let query = RowQuery { ids: Some(operations.into_iter().collect()), ..RowQuery::new(KIND_OPERATION) };
        let answers = self.store.query_map(vec![query], |row| row.id).await?;
        let live: BTreeSet<RowId> = answers.into_iter().flatten().collect();
        let before = self.outbox.len();
        self.outbox.retain(|(operation, _)| live.contains(operation));
        let dropped = before - self.outbox.len();
        if dropped > 0 {
            tracing::warn!(node = %self.config.name, dropped, "reports to operations that no longer exist dropped");
        }
        Ok(dropped)
    }
}

/// How the controller hears of a process's exit: a signal the agent did not send counts as exit code 128 + signal,
/// as a shell reports it.
fn exit_outcome(status: ExitStatus) -> JobOutcome {
    match status {
        ExitStatus::Exited(code) => JobOutcome::Exited { code },
        ExitStatus::Signaled(signal) => JobOutcome::Exited { code: 128 + signal },
        ExitStatus::Killed => JobOutcome::Aborted { reason: "process killed".into() },
    }
}
