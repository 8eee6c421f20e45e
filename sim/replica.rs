//! A replica node: a [`PipelineManager`] running the workload's pipelines (unless the row workload is empty),
//! a user's [`PipelineSet`] if the scenario has one, and, in a gang scenario, the gang controller's operation pipeline ([`OperationHandler`]), over a [`NetStore`]
//! (DESIGN §5).
//!
//! [`run`] is the node's init function, so a restart runs it again from scratch: the replica keeps no state of
//! its own between incarnations, only what the database holds. Its local clock belongs to the machine and
//! survives restarts, so a drift fault outlives a crash.

use super::db::Database;
use super::net_store::{NetStore, NetStoreOptions};
use super::service::Service;
use super::trace::Trace;
use super::user::{PipelineSet, ReplicaCx};
use super::workload::{self, WorkloadSpec};
use crate::gang::pipeline::OperationHandler;
use crate::gang::placement::PlacementSettings;
use crate::gang::replica::register_controller;
use crate::pipeline::{LocalClock, ManagerOptions, PipelineConfig, PipelineManager, ShutdownReport};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The world's signal to drain every replica. (Not `tokio::sync::watch`: its waiters register on one of several
/// `Notify`s picked by tokio's own thread-local RNG, which madsim does not seed, so the replicas would wake in a
/// different order from run to run and the trace would differ for one seed. A lone `Notify` wakes in order.)
#[derive(Default)]
pub struct Stop {
    stopped: AtomicBool,
    notify: Notify,
}

impl Stop {
    /// Signals every waiter, now and later.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Returns once [`Stop::stop`] was called.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.stopped.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// What every incarnation of one replica shares: its identity, its machine's clock, and the world's signals.
pub struct ReplicaContext {
    /// Index in the world.
    pub index: usize,
    /// Node name, `replica-{index}`.
    pub name: Arc<str>,
    /// Node address.
    pub ip: IpAddr,
    /// The database node's call address.
    pub db: Arc<Database>,
    /// The run's seed.
    pub seed: u64,
    /// The workload.
    pub spec: Arc<WorkloadSpec>,
    /// The operation pipeline's config, in a gang scenario.
    pub operations: Option<PipelineConfig>,
    /// A user's pipelines, registered at every start.
    pub pipelines: Option<PipelineSet>,
    /// The world's simulated external services (a user's pipelines call them).
    pub services: Arc<Vec<Arc<Service>>>,
    /// The longest lease ttl a user's pipeline registered, in microseconds (the run waits it out at the end).
    pub lease_ttl_max: Arc<AtomicU64>,
    /// The controller's placement settings (default placement, unfit timeout, the gate mutation).
    pub placement: PlacementSettings,
    /// Time-out of each store call.
    pub call_timeout: Duration,
    /// The machine's monotonic clock (drifting under a clock fault).
    pub clock: LocalClock,
    /// Set while faults are on (handlers fail now and then).
    pub faults_on: Arc<AtomicBool>,
    /// Set while the replica's row handlers hang (a `handler-hang` fault): each `process` that starts then never
    /// returns ([`super::workload::Hanging`]). The machine's, so it outlives a restart.
    pub hang: Arc<AtomicBool>,
    /// Set when the world drains every replica.
    pub stop: Arc<Stop>,
    /// The run's trace.
    pub trace: Trace,
    /// The world's allocator of reply-tag ranges, one per client of a service.
    pub clients: Arc<AtomicU64>,
    /// Incarnations started so far.
    pub incarnations: AtomicU64,
    /// Drain reports, one per incarnation that drained.
    pub reports: Mutex<Vec<ShutdownReport>>,
}

impl ReplicaContext {
    /// Drain reports so far.
    pub fn reports(&self) -> Vec<ShutdownReport> {
        self.reports.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// One incarnation of the replica, from start until the world drains it. The node's init function.
pub async fn run(ctx: Arc<ReplicaContext>) {
    let incarnation = ctx.incarnations.fetch_add(1, Ordering::SeqCst) + 1;
    ctx.trace.record(&ctx.name, "start", format!("incarnation={incarnation} clock_ppm={}", ctx.clock.rate_ppm()));
    let options = NetStoreOptions {
        node: ctx.name.clone(),
        ip: ctx.ip,
        db: ctx.db.clone(),
        call_timeout: ctx.call_timeout,
        hints: true,
    };
    let store = NetStore::connect(options, ctx.trace.clone()).await;
    // Every incarnation draws fresh engine jitter: a restarted process does not replay its predecessor.
    let seed = ctx.seed ^ (ctx.index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ incarnation;
    let mut manager =
        PipelineManager::new(Arc::new(store), ManagerOptions { seed }).with_local_clock(ctx.clock.clone());
    if ctx.spec.rows_max > 0 {
        workload::register(&mut manager, &ctx.spec, ctx.seed, &ctx.faults_on, &ctx.hang);
    }
    if let Some(set) = &ctx.pipelines {
        let mut cx = ReplicaCx {
            manager: &mut manager,
            replica: ctx.index,
            incarnation,
            seed: ctx.seed,
            node: ctx.name.clone(),
            ip: ctx.ip,
            services: &ctx.services,
            clients: &ctx.clients,
            faults_on: &ctx.faults_on,
            hang: &ctx.hang,
            lease_ttl_max: &ctx.lease_ttl_max,
        };
        if let Err(error) = set.register(&mut cx) {
            panic!("{}: pipeline set {}: {error}", ctx.name, set.name());
        }
    }
    if let Some(config) = &ctx.operations {
        let handler = OperationHandler::new(config.name.clone()).with_settings(ctx.placement.clone());
        register_controller(&mut manager, config.clone(), handler)
            .expect("the operation pipeline's config was checked");
    }
    manager.start();
    ctx.stop.wait().await;
    let report = manager.shutdown().await;
    ctx.trace.record(
        &ctx.name,
        "drained",
        format!("released={} release_errors={}", report.released, report.release_errors),
    );
    ctx.reports.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(report);
}
