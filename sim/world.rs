//! The simulated world (DESIGN §5): a database node serving MemStore over simulated RPC, N replica nodes
//! running the workload's pipelines (and the operation pipeline when the scenario has a gang part), M agent
//! nodes (`agent-0..`, gang scenarios only) each running a node [`Agent`](crate::agent::Agent) with the world's
//! one simulated executor, and a client node inserting the row workload and submitting the gang operations;
//! plus the handles through which faults and directed scenarios act on it:
//!
//! ```ignore
//! world.replica(1).pause(lease_ttl * 2).await;     // its leases expire while it sleeps
//! world.replica(0).kill_for(Duration::from_secs(5)).await;
//! world.net().partition(Target::Replica(2), Target::Db, Duration::from_secs(10)).await;
//! world.db().restart(Duration::from_secs(1)).await;
//! world.agent(3).kill_for(Duration::from_secs(5)).await;    // its processes die with it
//! world.agent(1).partition_from_db(Duration::from_secs(20)).await; // it must self-fence
//! ```
//!
//! Every handle traces what it does, holds the fault for its span and undoes it. Faults that would fight over
//! one thing do not overlap (a replica or an agent has one node slot for kill and pause, and one clock
//! slot; the network, the database, lost replies and buggify have one slot each): a fault whose slot is taken is
//! traced as `skipped`. [`World::heal`] undoes every fault still in force.
//!
//! Every simulated process writes its start, exit and kill to the world's [`ProcessLog`] (the gang checkers'
//! record) and to the trace.

use super::agents::{self, AgentContext};
use super::db::{self, Database};
pub use super::faults::Target;
use super::faults::{AgentCall, CallEffect};
use super::gang::{self, GangClient, SubmitOutcome};
use super::net_store::{NetStore, NetStoreOptions};
use super::replica::{self, ReplicaContext, Stop};
use super::scenario::Scenario;
use super::service::{self, Effect, Service};
use super::trace::{Fields, Trace};
use super::user::WorkloadClient;
use super::wire::Wire;
use super::workload::{Client, ClientReport, WorkloadSpec};
use crate::agent::{ProcessEvent, ProcessLog, SimulatedExecutor};
use crate::pipeline::LocalClock;
use crate::pipeline::clock::RATE_PPM_EXACT;
use crate::store::{Row, Timestamp};
use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};
use madsim::task::NodeId;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A thing at most one fault holds at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Replica(usize),
    Clock(usize),
    Agent(usize),
    AgentClock(usize),
    AgentCalls(usize, AgentCall),
    Hints(usize),
    Handlers(usize),
    StoreCalls(Target),
    Db,
    Network,
    Replies,
    Buggify,
}

/// Faults in force, so that [`World::heal`] can undo them.
#[derive(Default)]
struct FaultState {
    busy: BTreeSet<Slot>,
    killed: BTreeSet<usize>,
    paused: BTreeSet<usize>,
    killed_agents: BTreeSet<usize>,
    paused_agents: BTreeSet<usize>,
    db_down: bool,
    /// Clogged directed links and how many faults hold each.
    links: BTreeMap<(NodeId, NodeId), u32>,
    /// Isolated nodes and how many faults hold each.
    isolated: BTreeMap<NodeId, u32>,
}

struct ReplicaSlot {
    ctx: Arc<ReplicaContext>,
    node: NodeHandle,
}

struct AgentSlot {
    ctx: Arc<AgentContext>,
    node: NodeHandle,
}

/// What the gang client reported so far: each submission's outcome, in submission order.
type Submitted = Arc<Mutex<Vec<(String, SubmitOutcome)>>>;

struct Inner {
    seed: u64,
    scenario: Arc<Scenario>,
    handle: Handle,
    trace: Trace,
    name: Arc<str>,
    db: Arc<Database>,
    db_node: NodeHandle,
    client_node: NodeHandle,
    client_ip: IpAddr,
    replicas: Vec<ReplicaSlot>,
    agents: Vec<AgentSlot>,
    log: ProcessLog,
    submitted: Submitted,
    faults_on: Arc<AtomicBool>,
    stop: Arc<Stop>,
    services: Arc<Vec<Arc<Service>>>,
    /// The longest lease ttl a user's pipeline registered, in microseconds.
    lease_ttl_max: Arc<AtomicU64>,
    bursts: AtomicU64,
    state: Mutex<FaultState>,
}

/// The world of one run. Clones share it.
#[derive(Clone)]
pub struct World {
    inner: Arc<Inner>,
}

const DB_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// How often a pause under `[faults] pause_inside_pass` looks whether its replica is inside a pass (simulated
/// time; `lockstep chaos run` looks as often, in wall time).
pub const PASS_POLL: Duration = Duration::from_millis(10);

/// The address of agent `index`: 10.0.2.{index + 1}.
fn agent_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 2, index as u8 + 1))
}

impl World {
    /// Builds the world of `scenario` under `seed` on the current simulated runtime: the database node first
    /// (and waits until it serves), then the replicas, then the client node (idle until [`World::run_client`]),
    /// then the agents. Panics on a scenario that breaks [`Scenario::check`] (the run checks it first).
    pub async fn build(scenario: Arc<Scenario>, seed: u64, trace: Trace) -> World {
        assert!(scenario.replicas <= 200, "replica addresses are 10.0.1.1 to 10.0.1.200");
        assert!(scenario.agents() <= 200, "agent addresses are 10.0.2.1 to 10.0.2.200");
        let handle = Handle::current();
        let latency = scenario.net_latency.clone();
        NetSim::current().update_config(|config| {
            config.send_latency = latency;
            config.packet_loss_rate = 0.0;
        });
        let name: Arc<str> = Arc::from("world");
        trace.record(&name, "build", format!("scenario={} seed={seed} replicas={}", scenario.name, scenario.replicas));
        let wire = Arc::new(Wire::new(seed, scenario.net_latency.clone()));
        let db = Database::new(seed, IpAddr::V4(DB_IP), wire, trace.clone());
        if scenario.gang.is_some() {
            db.enable_gang_trace();
        }
        if scenario.mutation.apply_guard_disabled {
            db.store.disable_apply_guard_for_mutation_test();
            trace.record(&name, "mutation", "apply_guard_disabled");
        }
        if scenario.mutation.related_age_rule_disabled {
            db.store.disable_related_age_rule_for_mutation_test();
            trace.record(&name, "mutation", "related_age_rule_disabled");
        }
        let db_node = {
            let db = db.clone();
            handle.create_node().name("db").ip(IpAddr::V4(DB_IP)).init(move || db::serve(db.clone())).build()
        };
        db.set_node_id(db_node.id());
        tokio::time::sleep(db::STARTUP).await;
        let client_node = handle.create_node().name("client").ip(IpAddr::V4(CLIENT_IP)).build();
        let faults_on = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(Stop::default());
        let clients = Arc::new(AtomicU64::new(0));
        let spec = Arc::new(WorkloadSpec {
            waitlist_disabled: scenario.mutation.waitlist_disabled,
            retry_wake_disabled: scenario.mutation.retry_wake_disabled,
            contention_backoff_disabled: scenario.mutation.contention_backoff_disabled,
            park_wake_disabled: scenario.mutation.park_wake_disabled,
            ..scenario.workload.clone()
        });
        if scenario.mutation.waitlist_disabled {
            trace.record(&name, "mutation", "waitlist_disabled");
        }
        if scenario.mutation.retry_wake_disabled {
            trace.record(&name, "mutation", "retry_wake_disabled");
        }
        if scenario.mutation.contention_backoff_disabled {
            trace.record(&name, "mutation", "contention_backoff_disabled");
        }
        if scenario.mutation.park_wake_disabled {
            trace.record(&name, "mutation", "park_wake_disabled");
        }
        let operations = scenario.gang.as_ref().map(|gang| gang.pipeline_config());
        let services = Arc::new(Self::start_services(&handle, &scenario, seed, &trace, &faults_on));
        let lease_ttl_max = Arc::new(AtomicU64::new(0));
        let placement =
            scenario.gang.as_ref().map(|gang| gang.placement_settings(&scenario.mutation)).unwrap_or_default();
        if scenario.mutation.gang_gate_disabled {
            trace.record(&name, "mutation", "gang_gate_disabled");
        }
        if scenario.mutation.lingering_gate_disabled {
            trace.record(&name, "mutation", "lingering_gate_disabled");
        }
        if scenario.mutation.agent_drift_beyond_margin {
            trace.record(&name, "mutation", "agent_drift_beyond_margin");
        }
        let replicas = (0..scenario.replicas)
            .map(|index| {
                let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 1, index as u8 + 1));
                let ctx = Arc::new(ReplicaContext {
                    index,
                    name: Arc::from(format!("replica-{index}")),
                    ip,
                    db: db.clone(),
                    seed,
                    spec: spec.clone(),
                    operations: operations.clone(),
                    pipelines: scenario.pipelines.clone(),
                    services: services.clone(),
                    lease_ttl_max: lease_ttl_max.clone(),
                    placement: placement.clone(),
                    call_timeout: scenario.call_timeout,
                    clock: LocalClock::drifting().with_reader(db.time().reader()),
                    faults_on: faults_on.clone(),
                    hang: Arc::new(AtomicBool::new(false)),
                    stop: stop.clone(),
                    trace: trace.clone(),
                    clients: clients.clone(),
                    incarnations: AtomicU64::new(0),
                    reports: Mutex::new(Vec::new()),
                });
                let init = ctx.clone();
                let node = handle
                    .create_node()
                    .name(ctx.name.to_string())
                    .ip(ip)
                    .init(move || replica::run(init.clone()))
                    .build();
                ReplicaSlot { ctx, node }
            })
            .collect();
        let log = {
            let trace = trace.clone();
            ProcessLog::with_sink(Arc::new(move |event: &ProcessEvent| {
                let (kind, fields) = gang::process_line(event);
                trace.record(&Arc::from(event.node.as_str()), kind, fields);
            }))
        };
        let agents = match &scenario.gang {
            None => Vec::new(),
            Some(gang) => {
                let mut script = gang.jobs.clone();
                script.seed = seed;
                let executor = SimulatedExecutor::new(script, log.clone());
                (0..gang.agents)
                    .map(|index| {
                        let ctx = Arc::new(AgentContext {
                            index,
                            name: Arc::from(gang::agent_name(index)),
                            ip: agent_ip(index),
                            db: db.clone(),
                            config: gang.agent_config(index),
                            executor: executor.clone(),
                            call_timeout: scenario.call_timeout,
                            clock: LocalClock::drifting().with_reader(db.time().reader()),
                            trace: trace.clone(),
                            incarnations: AtomicU64::new(0),
                            calls: Arc::default(),
                        });
                        let init = ctx.clone();
                        let node = handle
                            .create_node()
                            .name(ctx.name.to_string())
                            .ip(ctx.ip)
                            .init(move || agents::run(init.clone()))
                            .build();
                        AgentSlot { ctx, node }
                    })
                    .collect()
            }
        };
        let inner = Inner {
            seed,
            scenario,
            handle,
            trace,
            name,
            db,
            db_node,
            client_node,
            client_ip: IpAddr::V4(CLIENT_IP),
            replicas,
            agents,
            log,
            submitted: Submitted::default(),
            faults_on,
            stop,
            services,
            lease_ttl_max,
            bursts: AtomicU64::new(0),
            state: Mutex::new(FaultState::default()),
        };
        World { inner: Arc::new(inner) }
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// The scenario.
    pub fn scenario(&self) -> &Scenario {
        &self.inner.scenario
    }

    /// Number of replicas.
    pub fn replicas(&self) -> usize {
        self.inner.replicas.len()
    }

    /// The run's trace.
    pub fn trace(&self) -> &Trace {
        &self.inner.trace
    }

    /// The database (outside its node: the checkers' view).
    pub fn database(&self) -> &Arc<Database> {
        &self.inner.db
    }

    /// The store's time now.
    pub fn store_now(&self) -> Timestamp {
        self.inner.db.now()
    }

    /// Agent nodes.
    pub fn agents(&self) -> usize {
        self.inner.agents.len()
    }

    /// Handle on agent `index`.
    pub fn agent(&self, index: usize) -> AgentHandle<'_> {
        assert!(index < self.agents(), "agent {index} of {}", self.agents());
        AgentHandle { world: self, index }
    }

    /// The process log every simulated executor of the world writes (the gang checkers' record).
    pub fn process_log(&self) -> &ProcessLog {
        &self.inner.log
    }

    /// What the gang client reported so far: each submission's name and outcome, in submission order.
    pub fn submitted(&self) -> Vec<(String, SubmitOutcome)> {
        self.inner.submitted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The row id of the operation the scenario names `name`, once the client submitted it.
    pub fn operation(&self, name: &str) -> Option<crate::store::RowId> {
        self.submitted().into_iter().find_map(|(n, outcome)| match outcome {
            SubmitOutcome::Submitted(id) if n == name => Some(id),
            _ => None,
        })
    }

    /// Runs the gang client on the client node until its last submission and control action are done (at once
    /// without a gang part).
    pub async fn run_gang_client(&self) {
        let Some(gang) = self.scenario().gang.clone() else { return };
        let store = Arc::new(self.connect_client().await);
        let client = GangClient {
            store,
            gang: Arc::new(gang),
            trace: self.inner.trace.clone(),
            outcomes: self.inner.submitted.clone(),
        };
        on_client(self.inner.client_node.spawn(client.run())).await
    }

    /// Handle on replica `index`.
    pub fn replica(&self, index: usize) -> ReplicaHandle<'_> {
        assert!(index < self.replicas(), "replica {index} of {}", self.replicas());
        ReplicaHandle { world: self, index }
    }

    /// Handle on the database node.
    pub fn db(&self) -> DbHandle<'_> {
        DbHandle { world: self }
    }

    /// Handle on the network.
    pub fn net(&self) -> NetHandle<'_> {
        NetHandle { world: self }
    }

    /// Handle on the workload client.
    pub fn client(&self) -> ClientHandle<'_> {
        ClientHandle { world: self }
    }

    /// The nodes of a user's services (none without a pipeline set), each started and serving.
    fn start_services(
        handle: &Handle,
        scenario: &Scenario,
        seed: u64,
        trace: &Trace,
        faults_on: &Arc<AtomicBool>,
    ) -> Vec<Arc<Service>> {
        let Some(set) = &scenario.pipelines else { return Vec::new() };
        let services: Vec<Arc<Service>> = set
            .services()
            .iter()
            .enumerate()
            .map(|(index, (name, options))| {
                Service::new(name, index, options.clone(), seed, trace.clone(), faults_on.clone())
            })
            .collect();
        for service in &services {
            let init = service.clone();
            handle
                .create_node()
                .name(service.node_name())
                .ip(service.ip())
                .init(move || service::serve(init.clone()))
                .build();
        }
        services
    }

    /// Every request the world's services handled, service by service, each in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.inner.services.iter().flat_map(|service| service.log()).collect()
    }

    /// The longest lease ttl a user's pipeline registered on any replica so far (zero without one).
    pub fn user_lease_ttl_max(&self) -> Duration {
        Duration::from_micros(self.inner.lease_ttl_max.load(Ordering::SeqCst))
    }

    /// Runs the workload on the client node until its span ends; returns what it inserted. With a user's
    /// pipeline set, runs the set's workload instead (and reports the rows it inserted as `user_rows`).
    pub async fn run_client(&self) -> ClientReport {
        let store = self.connect_client().await;
        if let Some(set) = self.scenario().pipelines.clone() {
            let client = WorkloadClient::new(store, self.seed(), self.inner.trace.clone(), Arc::from("client"));
            let counted = client.clone();
            if let Some(workload) = set.run_workload(client) {
                on_client(self.inner.client_node.spawn(workload)).await;
            }
            return ClientReport { user_rows: counted.inserted(), ..ClientReport::default() };
        }
        let spec = Arc::new(self.scenario().workload.clone());
        let client = Client::new(store, spec, self.seed(), self.inner.trace.clone(), Arc::from("client"));
        on_client(self.inner.client_node.spawn(client.run())).await
    }

    async fn connect_client(&self) -> NetStore {
        let options = NetStoreOptions {
            node: Arc::from("client"),
            ip: self.inner.client_ip,
            db: self.inner.db.clone(),
            call_timeout: self.scenario().call_timeout,
            hints: false,
        };
        let trace = self.inner.trace.clone();
        self.inner.client_node.spawn(NetStore::connect(options, trace)).await.expect("client connects")
    }

    /// The store calls of `node` (a replica or an agent) hang for `span` ([`super::db::Database::hang_calls`]):
    /// requests it sends are lost before the database, replies that reach it are lost after the database ran the
    /// call, and each call ends at its time-out. The trace says, on the node, `store-hang span=…`,
    /// `store-hang-lost call=… lost=request|reply` for each call it reaches, and `store-hang-end`.
    pub async fn hang_store(&self, node: Target, span: Duration) {
        if !self.acquire(Slot::StoreCalls(node), "store-hang") {
            return;
        }
        let name: Arc<str> = Arc::from(node.to_string());
        self.inner.trace.record(&name, "store-hang", format!("span={}", crate::duration::format(span)));
        let ip = self.ip(node);
        self.inner.db.hang_calls(ip);
        tokio::time::sleep(span).await;
        self.inner.db.unhang_calls(ip);
        self.inner.trace.record(&name, "store-hang-end", "");
        self.release(Slot::StoreCalls(node));
    }

    /// Turns madsim's `buggify` on for `span` (the engine's buggify points fire; madsim delays some packets).
    pub async fn buggify(&self, span: Duration) {
        if !self.acquire(Slot::Buggify, "buggify") {
            return;
        }
        self.record("buggify", format!("span={span:?}"));
        madsim::buggify::enable();
        tokio::time::sleep(span).await;
        madsim::buggify::disable();
        self.record("buggify-end", "");
        self.release(Slot::Buggify);
    }

    /// Ends the world after its run: kills every node (database, client, replicas, agents, services), so that
    /// their tasks' futures are dropped, and yields once for the executor to drop them. Without it, tasks still
    /// waiting when the run ends stay alive after the runtime is gone (madsim drops a task's future only when the
    /// task runs, ends, or its node is killed, and waiting tasks hold one another through channels and wakers):
    /// each run would leak its world, about 1.5 MB of a rows-mixed run, and a sweep would grow without bound
    ///. Records nothing in the trace; the harness calls it after the run, ended or panicked
    /// (`sim/run.rs`), on the run's runtime.
    pub async fn teardown(&self) {
        let inner = &self.inner;
        let mut nodes = vec![inner.db_node.id(), inner.client_node.id()];
        nodes.extend(inner.replicas.iter().map(|slot| slot.node.id()));
        nodes.extend(inner.agents.iter().map(|slot| slot.node.id()));
        inner.db.killed();
        for node in nodes {
            inner.handle.kill(node);
        }
        for service in inner.services.iter() {
            inner.handle.kill(service.node_name());
        }
        tokio::task::yield_now().await;
    }

    /// Undoes every fault in force (call after aborting the fault processes): restarts killed replicas and the
    /// database, resumes paused replicas, sets clocks back to rate 1, unclogs the network, restores its latency,
    /// stops dropping replies and turns buggify off. Also stops the handlers' planted failures.
    pub fn heal(&self) {
        let inner = &self.inner;
        let mut state = self.state();
        for index in std::mem::take(&mut state.killed) {
            inner.handle.restart(inner.replicas[index].node.id());
        }
        for index in std::mem::take(&mut state.paused) {
            inner.handle.resume(inner.replicas[index].node.id());
        }
        for index in std::mem::take(&mut state.killed_agents) {
            inner.handle.restart(inner.agents[index].node.id());
        }
        for index in std::mem::take(&mut state.paused_agents) {
            inner.handle.resume(inner.agents[index].node.id());
            inner.log.node_resumed(&inner.agents[index].ctx.name);
        }
        for replica in &inner.replicas {
            replica.ctx.hang.store(false, Ordering::SeqCst);
            if replica.ctx.clock.rate_ppm() != RATE_PPM_EXACT {
                replica.ctx.clock.set_rate_ppm(RATE_PPM_EXACT);
            }
        }
        for agent in &inner.agents {
            if agent.ctx.clock.rate_ppm() != RATE_PPM_EXACT {
                agent.ctx.clock.set_rate_ppm(RATE_PPM_EXACT);
            }
            agent.ctx.calls.clear_all();
        }
        inner.db.unmute_all_hints();
        inner.db.unhang_all_calls();
        if std::mem::take(&mut state.db_down) {
            inner.handle.restart(inner.db_node.id());
        }
        let net = NetSim::current();
        for (src, dst) in std::mem::take(&mut state.links).into_keys() {
            net.unclog_link(src, dst);
        }
        for node in std::mem::take(&mut state.isolated).into_keys() {
            net.unclog_node(node);
        }
        let latency = inner.scenario.net_latency.clone();
        inner.db.wire().heal(latency.clone());
        net.update_config(|config| {
            config.send_latency = latency;
            config.packet_loss_rate = 0.0;
        });
        inner.db.set_reply_loss(0.0);
        madsim::buggify::disable();
        state.busy.clear();
        inner.faults_on.store(false, Ordering::SeqCst);
        drop(state);
        self.record("heal", "");
    }

    /// Drains every replica (their managers shut down: queued leases are given back, started items finish)
    /// and waits for all of them, at most `budget`. Errors: the replicas that did not drain in time.
    pub async fn drain(&self, budget: Duration) -> Result<(), String> {
        self.record("drain", "");
        let before: Vec<usize> = self.inner.replicas.iter().map(|r| r.ctx.reports().len()).collect();
        self.inner.stop.stop();
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let pending: Vec<usize> = (0..self.replicas())
                .filter(|index| self.inner.replicas[*index].ctx.reports().len() == before[*index])
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("replicas {pending:?} did not drain within {}", crate::duration::format(budget)));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every row, read from the database directly (the checkers' view, not a store call).
    pub fn rows(&self) -> Vec<Row> {
        self.inner.db.store.rows()
    }

    fn record(&self, kind: &'static str, fields: impl Into<Fields>) {
        self.inner.trace.record(&self.inner.name, kind, fields);
    }

    fn state(&self) -> MutexGuard<'_, FaultState> {
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `slot` for a fault, or traces the fault as skipped if another holds it.
    fn acquire(&self, slot: Slot, fault: &str) -> bool {
        let taken = self.state().busy.insert(slot);
        if !taken {
            self.record("skipped", format!("{fault} ({slot:?} busy)"));
        }
        taken
    }

    fn release(&self, slot: Slot) {
        self.state().busy.remove(&slot);
    }

    /// The address of `target`'s node.
    fn ip(&self, target: Target) -> IpAddr {
        match target {
            Target::Db => self.inner.db.ip(),
            Target::Client => self.inner.client_ip,
            Target::Replica(index) => self.inner.replicas[index].ctx.ip,
            Target::Agent(index) => self.inner.agents[index].ctx.ip,
        }
    }

    fn node_id(&self, target: Target) -> NodeId {
        match target {
            Target::Db => self.inner.db_node.id(),
            Target::Client => self.inner.client_node.id(),
            Target::Replica(index) => self.inner.replicas[index].node.id(),
            Target::Agent(index) => self.inner.agents[index].node.id(),
        }
    }
}

/// Faults on one agent node.
pub struct AgentHandle<'a> {
    world: &'a World,
    index: usize,
}

impl AgentHandle<'_> {
    fn slot(&self) -> &AgentSlot {
        &self.world.inner.agents[self.index]
    }

    fn record(&self, kind: &'static str, fields: impl Into<Fields>) {
        self.world.inner.trace.record(&self.slot().ctx.name, kind, fields);
    }

    /// Kills the agent (its processes die with it) and, after `down`, starts it again through its init function.
    pub async fn kill_for(&self, down: Duration) {
        if !self.world.acquire(Slot::Agent(self.index), "agent-kill") {
            return;
        }
        self.kill();
        tokio::time::sleep(down).await;
        self.start();
        self.world.release(Slot::Agent(self.index));
    }

    /// Kills the agent node now; the process log records the death of every process it ran.
    pub fn kill(&self) {
        self.record("kill", "");
        self.world.inner.handle.kill(self.slot().node.id());
        // A simulated node's tasks end without a word: say so in the log before the node can start anything again.
        self.world.inner.log.node_died(&self.slot().ctx.name);
        self.world.state().killed_agents.insert(self.index);
    }

    /// Starts a killed agent through its init function (a new node session).
    pub fn start(&self) {
        self.record("restart", "");
        self.world.inner.handle.restart(self.slot().node.id());
        self.world.state().killed_agents.remove(&self.index);
    }

    /// Pauses the agent node for `span` (it and its processes stop while time goes on: its node lease lapses),
    /// then resumes it: it finds its local deadline passed and fences itself.
    pub async fn pause(&self, span: Duration) {
        if !self.world.acquire(Slot::Agent(self.index), "agent-pause") {
            return;
        }
        self.record("pause", format!("span={span:?}"));
        self.world.inner.handle.pause(self.slot().node.id());
        // Its processes freeze with it: the process log says so (rank_exclusivity does not count a frozen one).
        self.world.inner.log.node_paused(&self.slot().ctx.name);
        self.world.state().paused_agents.insert(self.index);
        tokio::time::sleep(span).await;
        self.world.inner.handle.resume(self.slot().node.id());
        self.world.inner.log.node_resumed(&self.slot().ctx.name);
        self.world.state().paused_agents.remove(&self.index);
        self.record("resume", "");
        self.world.release(Slot::Agent(self.index));
    }

    /// Runs the agent's monotonic clock at `rate_ppm` parts per million of real time for `span` (it survives a
    /// restart of the agent: the clock is the machine's).
    pub async fn drift(&self, rate_ppm: u64, span: Duration) {
        self.drift_as("agent-clock-drift", rate_ppm, span).await
    }

    /// [`AgentHandle::drift`] at a rate below the margin rule's floor (fault `agent-clock-beyond-margin`): the
    /// trace's `clock-drift` line adds `beyond_margin=yes`.
    pub async fn drift_beyond_margin(&self, rate_ppm: u64, span: Duration) {
        self.drift_as("agent-clock-beyond-margin", rate_ppm, span).await
    }

    async fn drift_as(&self, kind: &'static str, rate_ppm: u64, span: Duration) {
        if !self.world.acquire(Slot::AgentClock(self.index), kind) {
            return;
        }
        let beyond = if kind == "agent-clock-beyond-margin" { " beyond_margin=yes" } else { "" };
        self.record("clock-drift", format!("rate_ppm={rate_ppm} span={span:?}{beyond}"));
        self.slot().ctx.clock.set_rate_ppm(rate_ppm);
        tokio::time::sleep(span).await;
        self.slot().ctx.clock.set_rate_ppm(RATE_PPM_EXACT);
        self.record("clock-exact", "");
        self.world.release(Slot::AgentClock(self.index));
    }

    /// Puts `effect` on the agent's store calls of kind `calls` for `span`, its other calls going through
    /// ([`super::agent_calls`]; it outlives a restart of the agent). The trace says `calls-fault calls=… effect=…
    /// span=…` and `calls-healed calls=…`, durations as scenario files write them.
    pub async fn calls(&self, calls: AgentCall, effect: CallEffect, span: Duration) {
        if !self.world.acquire(Slot::AgentCalls(self.index, calls), "agent-calls") {
            return;
        }
        let show = crate::duration::format;
        let effect_text = match effect {
            CallEffect::Fail => "fail".to_string(),
            CallEffect::Delay(delay) => format!("delay delay={}", show(delay)),
        };
        self.record("calls-fault", format!("calls={} effect={effect_text} span={}", calls.name(), show(span)));
        self.slot().ctx.calls.set(calls, effect);
        tokio::time::sleep(span).await;
        self.slot().ctx.calls.clear(calls);
        self.record("calls-healed", format!("calls={}", calls.name()));
        self.world.release(Slot::AgentCalls(self.index, calls));
    }

    /// Cuts the agent off from the database for `span`: it must fence itself before its node is declared lost.
    pub async fn partition_from_db(&self, span: Duration) {
        self.world.net().partition(Target::Agent(self.index), Target::Db, span).await;
    }

    /// How many times the agent started.
    pub fn incarnations(&self) -> u64 {
        self.slot().ctx.incarnations.load(Ordering::SeqCst)
    }
}

/// Faults on one replica.
pub struct ReplicaHandle<'a> {
    world: &'a World,
    index: usize,
}

impl ReplicaHandle<'_> {
    fn ctx(&self) -> &ReplicaContext {
        &self.world.inner.replicas[self.index].ctx
    }

    fn node(&self) -> NodeId {
        self.world.inner.replicas[self.index].node.id()
    }

    fn record(&self, kind: &'static str, fields: impl Into<Fields>) {
        self.world.inner.trace.record(&self.ctx().name, kind, fields);
    }

    /// Kills the replica (every task dies at once; its leases are left to expire) and, after `down`, starts it
    /// again through its init function.
    pub async fn kill_for(&self, down: Duration) {
        if !self.world.acquire(Slot::Replica(self.index), "kill") {
            return;
        }
        self.kill();
        tokio::time::sleep(down).await;
        self.start();
        self.world.release(Slot::Replica(self.index));
    }

    /// The hint channel to the replica dies silently for `span` ([`super::db::Database::mute_hints`]): its fetchers
    /// find new rows by polling only. At the end its subscription ends and its renewal catches up. The trace says
    /// `hint-loss span=…` and `hint-loss-end`.
    pub async fn lose_hints(&self, span: Duration) {
        if !self.world.acquire(Slot::Hints(self.index), "hint-loss") {
            return;
        }
        self.record("hint-loss", format!("span={}", crate::duration::format(span)));
        let ip = self.ctx().ip;
        self.world.inner.db.mute_hints(ip);
        tokio::time::sleep(span).await;
        self.world.inner.db.unmute_hints(ip);
        self.record("hint-loss-end", "");
        self.world.release(Slot::Hints(self.index));
    }

    /// Every row handler's `process` that starts on the replica for `span` hangs ([`super::workload::Hanging`]):
    /// the pipelines' `handler_timeout` cuts it. The trace says `handler-hang span=…` and `handler-hang-end`.
    pub async fn hang_handlers(&self, span: Duration) {
        if !self.world.acquire(Slot::Handlers(self.index), "handler-hang") {
            return;
        }
        self.record("handler-hang", format!("span={}", crate::duration::format(span)));
        self.ctx().hang.store(true, Ordering::SeqCst);
        tokio::time::sleep(span).await;
        self.ctx().hang.store(false, Ordering::SeqCst);
        self.record("handler-hang-end", "");
        self.world.release(Slot::Handlers(self.index));
    }

    /// The replica crashes each time it starts, for `span`: killed now, then started and killed again after
    /// 0.05–0.5 s of running, 0.5–2 s apart (each draw from the stream `crash-loop` of the replica), until the span
    /// is over; then it starts and runs. The trace says `crash-loop span=…` at the start, `crash-loop-end`
    /// at the end (the crashes themselves write no `kill` line, so the shrinker writes the loop back whole).
    pub async fn crash_loop(&self, span: Duration) {
        if !self.world.acquire(Slot::Replica(self.index), "crash-loop") {
            return;
        }
        let mut rng = super::rng::keyed(self.world.inner.seed, "crash-loop", self.index as u64);
        let deadline = tokio::time::Instant::now() + span;
        self.record("crash-loop", format!("span={}", crate::duration::format(span)));
        self.world.inner.handle.kill(self.node());
        self.world.state().killed.insert(self.index);
        loop {
            let down = Duration::from_millis(rng.random_range(500..=2_000));
            if tokio::time::Instant::now() + down >= deadline {
                break;
            }
            tokio::time::sleep(down).await;
            self.world.inner.handle.restart(self.node());
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..=500))).await;
            self.world.inner.handle.kill(self.node());
        }
        tokio::time::sleep_until(deadline).await;
        self.world.inner.handle.restart(self.node());
        self.world.state().killed.remove(&self.index);
        self.record("crash-loop-end", "");
        self.world.release(Slot::Replica(self.index));
    }

    /// Kills the replica now.
    pub fn kill(&self) {
        self.record("kill", "");
        self.world.inner.handle.kill(self.node());
        self.world.state().killed.insert(self.index);
    }

    /// Starts a killed replica through its init function.
    pub fn start(&self) {
        self.record("restart", "");
        self.world.inner.handle.restart(self.node());
        self.world.state().killed.remove(&self.index);
    }

    /// Kills the replica and starts it again at once (a crash and an immediate restart).
    pub fn restart(&self) {
        self.kill();
        self.start();
    }

    /// Pauses the replica for `span` (a process stall: time goes on, its leases expire, its tasks do not run),
    /// then resumes it: its pending writes now carry stale tokens.
    pub async fn pause(&self, span: Duration) {
        if !self.world.acquire(Slot::Replica(self.index), "pause") {
            return;
        }
        self.record("pause", format!("span={span:?}"));
        self.paused_for(span).await;
    }

    /// `[faults] pause_inside_pass`: waits, at most `bound` (simulated), until the replica works inside a pass
    /// ([`MemStore::lease_in_pass`](crate::store::MemStore::lease_in_pass), looked at every
    /// [`PASS_POLL`]) while another replica runs to take its rows over, then pauses it for `span` as
    /// [`ReplicaHandle::pause`] does; its `pause` line says where it landed (`inside-pass=5#123 waited=212ms`).
    /// Not seen inside a pass within the bound, or its slot taken by another fault meanwhile: skipped, and traced
    /// so (`pause: not inside a pass inside-pass=none waited=10s`). The same rule as `lockstep chaos run`'s.
    pub async fn pause_inside_pass(&self, span: Duration, bound: Duration) {
        if self.world.state().busy.contains(&Slot::Replica(self.index)) {
            self.world.record("skipped", format!("pause ({:?} busy)", Slot::Replica(self.index)));
            return;
        }
        let start = tokio::time::Instant::now();
        let lease = loop {
            let others = {
                let state = self.world.state();
                (0..self.world.replicas()).any(|other| {
                    other != self.index && !state.killed.contains(&other) && !state.paused.contains(&other)
                })
            };
            let lease = others.then(|| self.world.inner.db.store.lease_in_pass(&self.ctx().name)).flatten();
            if lease.is_some() || start.elapsed() >= bound {
                break lease;
            }
            tokio::time::sleep(PASS_POLL).await;
        };
        let waited = start.elapsed();
        let Some(lease) = lease else {
            self.record("skipped", format!("pause: not inside a pass inside-pass=none waited={waited:?}"));
            return;
        };
        if !self.world.acquire(Slot::Replica(self.index), "pause") {
            return;
        }
        self.record("pause", format!("span={span:?} inside-pass={}#{} waited={waited:?}", lease.id, lease.token));
        self.paused_for(span).await;
    }

    /// Holds the paused replica's node for `span`, then resumes it and frees its slot (taken by the caller).
    async fn paused_for(&self, span: Duration) {
        self.world.inner.handle.pause(self.node());
        self.world.state().paused.insert(self.index);
        tokio::time::sleep(span).await;
        self.world.inner.handle.resume(self.node());
        self.world.state().paused.remove(&self.index);
        self.record("resume", "");
        self.world.release(Slot::Replica(self.index));
    }

    /// Jumps the replica's monotonic clock by `by`, forwards or (with `back`) backwards, at once; it runs on from
    /// there (the jump is not undone at the heal: a monotonic clock that stepped stays stepped, and only the
    /// deadlines computed before the step are off). The trace says `clock-jump by=…` (a backward jump with a
    /// minus), as scenario files write durations.
    pub fn jump(&self, by: Duration, back: bool) {
        let sign = if back { "-" } else { "" };
        self.record("clock-jump", format!("by={sign}{}", crate::duration::format(by)));
        self.ctx().clock.jump(by, back);
    }

    /// Runs the replica's monotonic clock at `rate_ppm` parts per million of real time for `span`.
    pub async fn drift(&self, rate_ppm: u64, span: Duration) {
        if !self.world.acquire(Slot::Clock(self.index), "clock-drift") {
            return;
        }
        self.record("clock-drift", format!("rate_ppm={rate_ppm} span={span:?}"));
        self.ctx().clock.set_rate_ppm(rate_ppm);
        tokio::time::sleep(span).await;
        self.ctx().clock.set_rate_ppm(RATE_PPM_EXACT);
        self.record("clock-exact", "");
        self.world.release(Slot::Clock(self.index));
    }

    /// Cuts the replica off from the database for `span`.
    pub async fn partition_from_db(&self, span: Duration) {
        self.world.net().partition(Target::Replica(self.index), Target::Db, span).await;
    }

    /// How many times the replica started.
    pub fn incarnations(&self) -> u64 {
        self.ctx().incarnations.load(Ordering::SeqCst)
    }
}

/// Faults on the database node.
pub struct DbHandle<'a> {
    world: &'a World,
}

impl DbHandle<'_> {
    fn record(&self, kind: &'static str, fields: impl Into<Fields>) {
        self.world.inner.trace.record(&Arc::from("db"), kind, fields);
    }

    /// Kills the database node (calls in flight fail; committed data stays) and starts it after `down`.
    pub async fn restart(&self, down: Duration) {
        if !self.world.acquire(Slot::Db, "db-restart") {
            return;
        }
        self.record("kill", format!("down={down:?}"));
        self.world.inner.db.killed();
        self.world.inner.handle.kill(self.world.inner.db_node.id());
        self.world.state().db_down = true;
        tokio::time::sleep(down).await;
        self.world.inner.handle.restart(self.world.inner.db_node.id());
        self.world.state().db_down = false;
        self.world.release(Slot::Db);
    }

    /// Drops each reply after its call committed with `chance`, for `span`.
    pub async fn drop_replies(&self, chance: f64, span: Duration) {
        if !self.world.acquire(Slot::Replies, "lost-replies") {
            return;
        }
        self.record("lost-replies", format!("chance={chance:.3} span={span:?}"));
        self.world.inner.db.set_reply_loss(chance);
        tokio::time::sleep(span).await;
        self.world.inner.db.set_reply_loss(0.0);
        self.record("lost-replies-end", "");
        self.world.release(Slot::Replies);
    }
}

/// Faults on the network.
pub struct NetHandle<'a> {
    world: &'a World,
}

impl NetHandle<'_> {
    /// Every link gets latencies in `latency` and loses `loss` of its packets, for `span`.
    pub async fn degrade(&self, latency: Range<Duration>, loss: f64, span: Duration) {
        if !self.world.acquire(Slot::Network, "degrade") {
            return;
        }
        self.world.record("degrade", format!("latency={latency:?} loss={loss:.3} span={span:?}"));
        let net = NetSim::current();
        let wire = self.world.inner.db.wire();
        wire.set_conditions(latency.clone(), loss);
        net.update_config(|config| {
            config.send_latency = latency;
            config.packet_loss_rate = loss;
        });
        tokio::time::sleep(span).await;
        let baseline = self.world.scenario().net_latency.clone();
        wire.set_conditions(baseline.clone(), 0.0);
        net.update_config(|config| {
            config.send_latency = baseline;
            config.packet_loss_rate = 0.0;
        });
        self.world.record("degrade-end", "");
        self.world.release(Slot::Network);
    }

    /// Cuts the link between `a` and `b`, both ways, for `span`.
    pub async fn partition(&self, a: Target, b: Target, span: Duration) {
        let (a_id, b_id) = (self.world.node_id(a), self.world.node_id(b));
        let (a_ip, b_ip) = (self.world.ip(a), self.world.ip(b));
        self.world.record("partition", format!("{a:?}<->{b:?} span={span:?}"));
        self.clog((a_id, a_ip), (b_id, b_ip));
        self.clog((b_id, b_ip), (a_id, a_ip));
        tokio::time::sleep(span).await;
        self.unclog((a_id, a_ip), (b_id, b_ip));
        self.unclog((b_id, b_ip), (a_id, a_ip));
        self.world.record("partition-end", format!("{a:?}<->{b:?}"));
    }

    /// Cuts every link of `node` for `span`.
    pub async fn isolate(&self, node: Target, span: Duration) {
        let (id, ip) = (self.world.node_id(node), self.world.ip(node));
        self.world.record("isolate", format!("{node:?} span={span:?}"));
        let first = {
            let mut state = self.world.state();
            let count = state.isolated.entry(id).or_default();
            *count += 1;
            *count == 1
        };
        if first {
            NetSim::current().clog_node(id);
            self.world.inner.db.wire().isolate(ip);
        }
        tokio::time::sleep(span).await;
        let last = {
            let mut state = self.world.state();
            // Absent after a heal: nothing left to undo.
            let Some(count) = state.isolated.get_mut(&id) else { return };
            *count -= 1;
            *count == 0 && state.isolated.remove(&id).is_some()
        };
        if last {
            NetSim::current().unclog_node(id);
            self.world.inner.db.wire().rejoin(ip);
        }
        self.world.record("isolate-end", format!("{node:?}"));
    }

    /// Cuts the directed link from `src` to `dst` (each a node and its address), in madsim's network (the
    /// services' datagrams) and on the wire (store calls and hints).
    fn clog(&self, (src, src_ip): (NodeId, IpAddr), (dst, dst_ip): (NodeId, IpAddr)) {
        let mut state = self.world.state();
        let count = state.links.entry((src, dst)).or_default();
        *count += 1;
        if *count == 1 {
            NetSim::current().clog_link(src, dst);
            self.world.inner.db.wire().cut(src_ip, dst_ip);
        }
    }

    fn unclog(&self, (src, src_ip): (NodeId, IpAddr), (dst, dst_ip): (NodeId, IpAddr)) {
        let mut state = self.world.state();
        let Some(count) = state.links.get_mut(&(src, dst)) else { return };
        *count -= 1;
        if *count == 0 {
            state.links.remove(&(src, dst));
            NetSim::current().unclog_link(src, dst);
            self.world.inner.db.wire().join(src_ip, dst_ip);
        }
    }
}

/// The workload client, for contention bursts.
pub struct ClientHandle<'a> {
    world: &'a World,
}

impl ClientHandle<'_> {
    /// Inserts `claims` claims on resource 0 at once, from the client node, and waits until they are in.
    pub async fn burst(&self, claims: usize) {
        let world = self.world;
        let burst = world.inner.bursts.fetch_add(1, Ordering::SeqCst);
        world.record("contention", format!("burst={burst} claims={claims}"));
        let store = world.connect_client().await;
        let spec = Arc::new(world.scenario().workload.clone());
        let client = Client::new(store, spec, world.seed(), world.inner.trace.clone(), Arc::from("client"));
        // Aborting this fault (at heal) leaves the burst running on the client node, which is what a client does.
        let _ = world.inner.client_node.spawn(client.burst(burst, claims)).await;
    }
}

/// Awaits `task`, spawned on the client node. Only the world's teardown kills that node, and by then nobody needs
/// what the task returns: a join that fails waits forever (the teardown drops the waiter) instead of panicking,
/// which would bury what ended the run (a panic of its own, or a run that outgrew one run) under a second panic.
async fn on_client<T, E>(task: impl std::future::Future<Output = Result<T, E>>) -> T {
    match task.await {
        Ok(value) => value,
        Err(_) => std::future::pending().await,
    }
}
