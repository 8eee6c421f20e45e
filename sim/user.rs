//! Your own pipelines in the simulated world: a [`PipelineSet`] says which pipelines every replica
//! runs (your [`PipelineConfig`]s and [`Handler`]s, built per replica by a closure), what the client inserts
//! (a closure run on the client node), which statuses end each kind's life, which simulated external services
//! your handlers call, and which invariants of your own to check. Put it in a [`Scenario`] with
//! [`Scenario::for_pipelines`] and the simulator runs it like its own scenarios: seeded faults (replica kills
//! and pauses, partitions, lost replies, database restarts, clock drift, buggify), the built-in checkers (lease
//! exclusivity, no row locked forever, no starved parent, liveness against your final statuses, drain,
//! exactly-once effects at your services), your checkers, and a replay command for every failing seed.
//!
//! ```ignore
//! use lockstep::pipeline::PipelineConfig;
//! use lockstep::sim::Scenario;
//! use lockstep::sim::user::{PipelineSet, Replay, ServiceOptions, check_seeds, seeds};
//! use lockstep::store::NewRow;
//! use std::time::Duration;
//!
//! fn orders() -> PipelineSet {
//!     PipelineSet::new("orders", |replica| {
//!         let payments = replica.service("payments");
//!         replica.register(PipelineConfig::new("lines", "line", &["new"]), Lines { payments })?;
//!         replica.register(PipelineConfig::new("orders", "order", &["open"]), Orders)
//!     })
//!     .final_statuses("order", &["done"])
//!     .final_statuses("line", &["done"])
//!     .service("payments", ServiceOptions::default())
//!     .workload(|client| async move {
//!         for i in 0..50 {
//!             client.sleep_until(Duration::from_secs(i)).await;
//!             client.insert(format!("order-{i}"), NewRow::new("order", "open", serde_json::json!({}))).await;
//!         }
//!     })
//! }
//!
//! #[test]
//! fn orders_hold_under_mixed_faults() {
//!     let scenario = Scenario::for_pipelines(orders());
//!     let replay = Replay { package: env!("CARGO_PKG_NAME"), test: "sim", name: "orders_hold_under_mixed_faults" };
//!     check_seeds(&scenario, &seeds(&(1..=50).collect::<Vec<_>>()), replay);
//! }
//! ```
//!
//! The example crate `examples/user-pipelines` is this, whole and tested; docs/user-pipelines.md says how to build it (the `madsim` cfg and the cargo aliases).
//!
//! Time in this module is simulated time: `Duration`s are spans of the simulated clock, which runs only when
//! every node waits.
//!
//! What runs a set ([`PipelineSet::new`], [`PipelineSet::workload`], [`ReplicaCx`], [`WorkloadClient`],
//! [`ServiceClient`], [`SimStore`], [`run`], [`run_seeds`], [`check_seeds`], [`check_seeds_in`]) exists only in the
//! simulator build (`--cfg madsim`); the plain build's `cargo doc` shows it all, and its code knows a set by its
//! name, final statuses, services and checkers ([`PipelineSet::named`]), as `lockstep chaos run` does.

#[cfg(any(madsim, doc))]
use super::net_store::NetStore;
use super::rng;
use super::scenario::Scenario;
use super::service::Service;
use super::trace::{Fields, Trace};
use super::workload;
use crate::pipeline::{ConfigError, Handler, PipelineConfig, PipelineManager};
use crate::store::{NewRow, Row, Store};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub use super::checkers::{CheckInput, Checker, Violation};
pub use super::run::{Replay, RunReport, seeds};
#[cfg(any(madsim, doc))]
pub use super::run::{check_seeds, check_seeds_in, run, run_seeds};
#[cfg(any(madsim, doc))]
pub use super::service::ServiceClient;
pub use super::service::{Effect, EffectReceipt, EffectRequest, ServiceError, ServiceOptions};

/// The store your handlers run on in the simulator: every call crosses the simulated network to the database
/// node. Write handlers generic over `S: Store` (as `examples/quickstart.rs` does) and they run here unchanged.
/// Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
#[cfg(any(madsim, doc))]
pub type SimStore = NetStore;

#[cfg(madsim)]
type Register = dyn Fn(&mut ReplicaCx<'_>) -> Result<(), ConfigError> + Send + Sync;
#[cfg(madsim)]
type Workload = dyn Fn(WorkloadClient) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

/// Statuses that end a row's life, by kind: the liveness checker requires every row of a listed kind to reach one
/// of its kind's statuses within the scenario's bound after the heal. Kinds not listed are not judged.
pub type FinalStatuses = BTreeMap<String, BTreeSet<String>>;

/// A named set of your pipelines with its workload, final statuses, services and checkers. Clones share the
/// closures. Build it with [`PipelineSet::new`] and the builder methods.
#[derive(Clone)]
pub struct PipelineSet {
    name: String,
    #[cfg(madsim)]
    register: Arc<Register>,
    #[cfg(madsim)]
    workload: Option<Arc<Workload>>,
    finals: FinalStatuses,
    services: Vec<(String, ServiceOptions)>,
    checkers: Vec<Arc<dyn Checker>>,
}

impl PipelineSet {
    /// A set named `name` (scenario files name it: `pipelines = "orders"`) whose pipelines `register` registers
    /// on one replica: called on every replica at every start (a restarted replica starts from scratch), on the
    /// replica's node, so handlers built there run there. Return the first [`ConfigError`] (the `?` of
    /// [`ReplicaCx::register`]); the run then fails naming it. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
    #[cfg(any(madsim, doc))]
    pub fn new<F>(name: impl Into<String>, register: F) -> PipelineSet
    where
        F: Fn(&mut ReplicaCx<'_>) -> Result<(), ConfigError> + Send + Sync + 'static,
    {
        PipelineSet {
            name: name.into(),
            register: Arc::new(register),
            workload: None,
            finals: FinalStatuses::new(),
            services: Vec::new(),
            checkers: Vec::new(),
        }
    }

    /// A set named `name` whose pipelines register nothing: in the normal build (`lockstep chaos`), where a
    /// set's handlers cannot run, this is how a set is known by its name, final statuses and checkers.
    pub fn named(name: impl Into<String>) -> PipelineSet {
        PipelineSet {
            name: name.into(),
            #[cfg(madsim)]
            register: Arc::new(|_| Ok(())),
            #[cfg(madsim)]
            workload: None,
            finals: FinalStatuses::new(),
            services: Vec::new(),
            checkers: Vec::new(),
        }
    }

    /// What the client inserts: `workload` runs once per run on the client node, from the world's start, and
    /// the faults stop no earlier than it returns (the heal waits for it). Without one the client inserts
    /// nothing. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
    #[cfg(any(madsim, doc))]
    pub fn workload<F, Fut>(mut self, workload: F) -> PipelineSet
    where
        F: Fn(WorkloadClient) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.workload = Some(Arc::new(move |client| Box::pin(workload(client))));
        self
    }

    /// Rows of `kind` end their life in one of `statuses` (liveness; see [`FinalStatuses`]). Call once per kind;
    /// a second call for a kind adds statuses. Rows of a kind never named here count as final in any status: the
    /// liveness checker does not judge them and the run does not wait for them after the heal (the other checkers
    /// still do).
    pub fn final_statuses(mut self, kind: &str, statuses: &[&str]) -> PipelineSet {
        self.finals.entry(kind.to_string()).or_default().extend(statuses.iter().map(|s| s.to_string()));
        self
    }

    /// A simulated external service named `name` (node `svc-{name}`) that handlers reach with
    /// [`ReplicaCx::service`]; the `external_exactly_once` checker judges its effects. Names are unique in a set.
    pub fn service(mut self, name: &str, options: ServiceOptions) -> PipelineSet {
        self.services.push((name.to_string(), options));
        self
    }

    /// An invariant of your own, checked on every run after the built-in checkers and reported like them
    /// (its [`Checker::name`] in failures and sweep tables).
    pub fn checker(mut self, checker: impl Checker) -> PipelineSet {
        self.checkers.push(Arc::new(checker));
        self
    }

    /// The set's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The final statuses by kind.
    pub fn finals(&self) -> &FinalStatuses {
        &self.finals
    }

    /// The services, in the order given.
    pub fn services(&self) -> &[(String, ServiceOptions)] {
        &self.services
    }

    /// The checkers of your own, in the order given.
    pub fn checkers(&self) -> &[Arc<dyn Checker>] {
        &self.checkers
    }

    /// Whether `row` reached one of its kind's final statuses (true for a kind with none listed).
    pub fn is_final(&self, row: &Row) -> bool {
        self.finals.get(&row.kind).is_none_or(|statuses| statuses.contains(&row.status))
    }

    /// Checks the set's own rules: a name of letters, digits, `-`, `_`; unique, well-formed services; checkers
    /// with distinct names. Errors name the rule.
    pub fn check(&self) -> Result<(), String> {
        let plain =
            |text: &str| !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
        if !plain(&self.name) {
            return Err(format!("pipeline set {:?}: the name must be letters, digits, - and _", self.name));
        }
        let mut names = BTreeSet::new();
        for (name, options) in &self.services {
            if !plain(name) {
                return Err(format!(
                    "pipeline set {}: service {name:?}: names are letters, digits, - and _",
                    self.name
                ));
            }
            if !names.insert(name.as_str()) {
                return Err(format!("pipeline set {}: service {name} is given twice", self.name));
            }
            options.check(name)?;
        }
        if self.services.len() > super::service::SERVICES_MAX {
            return Err(format!("pipeline set {}: at most {} services", self.name, super::service::SERVICES_MAX));
        }
        let mut checkers = BTreeSet::new();
        for checker in &self.checkers {
            let name = checker.name();
            if !checkers.insert(name) || super::checkers::names().any(|builtin| builtin == name) {
                return Err(format!("pipeline set {}: checker name {name} is taken", self.name));
            }
        }
        Ok(())
    }

    /// Registers the set's pipelines on a replica (the replica node's init function calls it).
    #[cfg(madsim)]
    pub(crate) fn register(&self, cx: &mut ReplicaCx<'_>) -> Result<(), ConfigError> {
        (self.register)(cx)
    }

    /// The client's run of the workload, if the set has one.
    #[cfg(madsim)]
    pub(crate) fn run_workload(&self, client: WorkloadClient) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.workload.as_ref().map(|workload| workload(client))
    }
}

impl PipelineSet {
    /// Whether the set inserts rows of its own (the simulator build: its workload function).
    fn has_workload(&self) -> bool {
        #[cfg(madsim)]
        return self.workload.is_some();
        #[cfg(not(madsim))]
        false
    }
}

impl fmt::Debug for PipelineSet {
    /// Everything but the closures: the scenario's version hash (replay files) is made from this.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let checkers: Vec<&str> = self.checkers.iter().map(|checker| checker.name()).collect();
        f.debug_struct("PipelineSet")
            .field("name", &self.name)
            .field("workload", &self.has_workload())
            .field("finals", &self.finals)
            .field("services", &self.services)
            .field("checkers", &checkers)
            .finish()
    }
}

/// A replica's side of registration: what [`PipelineSet::new`]'s closure gets on each replica at each start.
/// Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
#[cfg(any(madsim, doc))]
pub struct ReplicaCx<'a> {
    pub(crate) manager: &'a mut PipelineManager<NetStore>,
    pub(crate) replica: usize,
    pub(crate) incarnation: u64,
    pub(crate) seed: u64,
    pub(crate) node: Arc<str>,
    pub(crate) ip: IpAddr,
    pub(crate) services: &'a [Arc<Service>],
    pub(crate) clients: &'a AtomicU64,
    pub(crate) faults_on: &'a Arc<AtomicBool>,
    pub(crate) hang: &'a Arc<AtomicBool>,
    pub(crate) lease_ttl_max: &'a AtomicU64,
}

#[cfg(any(madsim, doc))]
impl ReplicaCx<'_> {
    /// Registers a pipeline on this replica (as [`PipelineManager::register`]); under a `handler-hang` fault its
    /// handler's `process` calls hang as the built-in pipelines' do. Errors: the first rule `config` breaks, a
    /// name registered twice, or more connections than the store offers.
    pub fn register<H: Handler<NetStore>>(&mut self, config: PipelineConfig, handler: H) -> Result<(), ConfigError> {
        let ttl = u64::try_from(config.lease_ttl.as_micros()).unwrap_or(u64::MAX);
        self.manager.register(config, super::workload::Hanging::new(handler, self.hang.clone()))?;
        self.lease_ttl_max.fetch_max(ttl, Ordering::SeqCst);
        Ok(())
    }

    /// Runs `retention` on this replica (as [`PipelineManager::retain`]): its passes delete finished rows through
    /// the simulated network, so a run shows what a user's pipelines do when their rows go. Errors: a rule the
    /// store would refuse.
    pub fn retain(&mut self, retention: crate::pipeline::Retention) -> Result<(), ConfigError> {
        self.manager.retain(retention)
    }

    /// This replica's index in the world (node `replica-{index}`).
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// Which start of the replica this is, from 1 (a killed replica starts again from scratch).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A random stream for `purpose` of this replica's incarnation, from the run's seed (all randomness of a
    /// handler must come from such streams, or from the lease's token, for a seed to replay).
    pub fn rng(&self, purpose: &str) -> ChaCha8Rng {
        rng::keyed(self.seed, purpose, (self.replica as u64) << 32 | self.incarnation)
    }

    /// A client of the set's service `name`, calling from this replica's node.
    ///
    /// Panics (a bug in the set, failing the run with this message) if the set has no service `name`.
    pub fn service(&self, name: &str) -> ServiceClient {
        let Some(service) = self.services.iter().find(|service| service.name() == name) else {
            let known: Vec<&str> = self.services.iter().map(|service| service.name()).collect();
            panic!("{}: no service {name:?} in the pipeline set (it has {known:?})", self.node);
        };
        ServiceClient::new(service, self.node.clone(), self.ip, super::net_store::tag_base(self.clients))
    }

    /// Whether the scenario's faults are on now (until the heal): a handler may misbehave more while they are.
    pub fn faults_on(&self) -> FaultsOn {
        FaultsOn(self.faults_on.clone())
    }
}

/// Whether the scenario's faults are on (they stop at the heal). Clones share it. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
#[cfg(any(madsim, doc))]
#[derive(Clone, Debug)]
pub struct FaultsOn(Arc<AtomicBool>);

#[cfg(any(madsim, doc))]
impl FaultsOn {
    /// True until the world heals.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The client node's side of a workload: keyed inserts that survive lost replies, hints, simulated time and
/// seeded randomness. Clones share it. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
#[cfg(any(madsim, doc))]
#[derive(Clone)]
pub struct WorkloadClient {
    inner: Arc<ClientInner>,
}

#[cfg(any(madsim, doc))]
struct ClientInner {
    store: NetStore,
    seed: u64,
    start: tokio::time::Instant,
    trace: Trace,
    node: Arc<str>,
    inserted: AtomicUsize,
}

#[cfg(any(madsim, doc))]
impl WorkloadClient {
    pub(crate) fn new(store: NetStore, seed: u64, trace: Trace, node: Arc<str>) -> WorkloadClient {
        let start = tokio::time::Instant::now();
        WorkloadClient {
            inner: Arc::new(ClientInner { store, seed, start, trace, node, inserted: AtomicUsize::new(0) }),
        }
    }

    /// Inserts `row` under `key` (unique in the run) and returns it as stored. A call whose reply was lost is
    /// retried with backoff until it succeeds, and the key makes the retry insert nothing twice: one key, one
    /// row. Panics (failing the run) after [`workload::CLIENT_ATTEMPTS_MAX`] failed attempts in a row.
    pub async fn insert(&self, key: impl Into<String>, row: NewRow) -> Row {
        let key = key.into();
        let store = &self.inner.store;
        let row = workload::retry_call("insert", || store.insert_keyed(key.clone(), row.clone())).await;
        self.inner.inserted.fetch_add(1, Ordering::SeqCst);
        row
    }

    /// Inserts `rows` together under `key` (unique in the run) and returns them as stored, in input order: the
    /// simulator's model of an enqueue in your own transaction (`PgStore::insert_in` in production;
    /// docs/real-mode.md, "Enqueue in your own transaction"). Your own rows, as rows of their own kind, and their
    /// work items go in one call: all or none, and each kind's fetchers hinted once it committed. Retried as
    /// [`WorkloadClient::insert`] is, and the key makes a retry insert nothing twice. Panics (failing the run)
    /// after [`workload::CLIENT_ATTEMPTS_MAX`] failed attempts in a row, or for a row the store refuses.
    pub async fn insert_many(&self, key: impl Into<String>, rows: Vec<NewRow>) -> Vec<Row> {
        let key = key.into();
        let store = &self.inner.store;
        for (i, row) in rows.iter().enumerate() {
            if let Err(error) = crate::store::check_new_row(&format!("insert_many {key}: rows[{i}]"), row) {
                panic!("client: {error}");
            }
        }
        let rows = workload::retry_call("insert_many", || store.insert_many_keyed(key.clone(), rows.clone())).await;
        self.inner.inserted.fetch_add(rows.len(), Ordering::SeqCst);
        rows
    }

    /// A fetch hint for `kind` (best effort: a lost hint costs a fetcher its backoff).
    pub async fn hint(&self, kind: &str) {
        let _ = self.inner.store.hint(kind, None).await;
    }

    /// Waits until `at` after the workload started (simulated time); returns at once if that is past.
    pub async fn sleep_until(&self, at: Duration) {
        tokio::time::sleep_until(self.inner.start + at).await;
    }

    /// Simulated time since the workload started.
    pub fn elapsed(&self) -> Duration {
        self.inner.start.elapsed()
    }

    /// A random stream for `purpose`, from the run's seed.
    pub fn rng(&self, purpose: &str) -> ChaCha8Rng {
        rng::stream(self.inner.seed, &format!("user-workload-{purpose}"))
    }

    /// The store, for reads (a read may fail while faults are on: its error says so).
    pub fn store(&self) -> &SimStore {
        &self.inner.store
    }

    /// Rows inserted so far.
    pub fn inserted(&self) -> usize {
        self.inner.inserted.load(Ordering::SeqCst)
    }

    /// Writes a `note` line to the run's trace from the client node.
    pub fn note(&self, text: impl Into<String>) {
        self.inner.trace.record(&self.inner.node, "note", Fields::Text(text.into()));
    }
}

impl Scenario {
    /// A scenario that runs `set`: three replicas, every random fault of the sweeps' mixed scenario at one fault
    /// of each kind per simulated minute during the first minute (except lock contention, which needs the
    /// built-in rows), then a heal; the built-in row workload off; the liveness and starvation bounds of the
    /// mixed scenario (2 min, 1 min after the heal). Change any field before running it.
    pub fn for_pipelines(set: PipelineSet) -> Scenario {
        let mut scenario = Scenario::mixed();
        scenario.name = set.name().to_string();
        scenario.workload = super::scenario::no_rows();
        scenario.faults.random.retain(|process| process.kind != super::faults::FaultKind::Contention);
        scenario.pipelines = Some(set);
        scenario
    }
}
