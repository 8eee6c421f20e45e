//! The manager: registers pipelines, starts them, and drains them on shutdown, giving back the leases of queued
//! items no worker started (DESIGN §3, Manager; dstack PIPELINES, checklist 8).

use super::handler::Handler;
use super::hinter::Hinter;
use super::{ConfigError, LocalClock, MetricsSnapshot, Pipeline, PipelineConfig, Retention, worker};
use crate::store::{Lease, RowId, Store, StoreError};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinHandle;

/// Options of a [`PipelineManager`].
#[derive(Clone, Debug, Default)]
pub struct ManagerOptions {
    /// Seed of every random stream the engine draws (fetch jitter). Under the simulator it comes from the run's
    /// seed; a production replica can pass any value.
    pub seed: u64,
}

/// What a shutdown did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Leases of queued, unstarted items given back to the store, over all pipelines.
    pub released: usize,
    /// Release calls that failed; those leases expire on their own.
    pub release_errors: usize,
}

type Spawn<S> = Box<dyn FnOnce(Pipeline<S>) -> Vec<JoinHandle<()>> + Send>;

/// A task that runs beside the pipelines from start to stop ([`PipelineManager::run_beside`]).
type Beside = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

struct Registered<S: Store> {
    pipeline: Pipeline<S>,
    spawn_workers: Option<Spawn<S>>,
    fetcher: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    heartbeater: Option<JoinHandle<()>>,
}

/// Runs a replica's pipelines over one store.
pub struct PipelineManager<S: Store> {
    store: Arc<S>,
    options: ManagerOptions,
    pipelines: Vec<Registered<S>>,
    hinter: Option<JoinHandle<()>>,
    clock: LocalClock,
    /// Tasks to spawn at start: the retention, and what a caller added with [`PipelineManager::run_beside`].
    beside: Vec<Beside>,
    /// The tasks of `beside` once started, aborted at shutdown.
    beside_tasks: Vec<JoinHandle<()>>,
}

impl<S: Store> PipelineManager<S> {
    /// A manager over `store` with no pipelines.
    pub fn new(store: Arc<S>, options: ManagerOptions) -> PipelineManager<S> {
        PipelineManager {
            store,
            options,
            pipelines: Vec::new(),
            hinter: None,
            clock: LocalClock::exact(),
            beside: Vec::new(),
            beside_tasks: Vec::new(),
        }
    }

    /// The store the manager's pipelines lease from.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The same manager with every pipeline registered from now on running on the local clock `clock` (the
    /// simulator drifts it to model a replica's slow or fast monotonic clock).
    pub fn with_local_clock(mut self, clock: LocalClock) -> PipelineManager<S> {
        self.clock = clock;
        self
    }

    /// Adds a pipeline. Errors: a broken config rule, a duplicate name, or more connections needed in total
    /// than [`Store::connection_limit`] allows (DESIGN §3: the pool is sized for workers + fetchers + heartbeater
    /// + apply batches in flight, [`PipelineConfig::connections_needed`]).
    pub fn register<H: Handler<S>>(&mut self, config: PipelineConfig, handler: H) -> Result<(), ConfigError> {
        if self.pipelines.iter().any(|p| p.pipeline.config.name == config.name) {
            return Err(ConfigError::Duplicate(config.name));
        }
        if let Some(available) = self.store.connection_limit() {
            let registered: usize = self.pipelines.iter().map(|p| p.pipeline.config.connections_needed()).sum();
            let needed = registered + config.connections_needed();
            if needed > available {
                return Err(ConfigError::Connections { needed, available });
            }
        }
        let pipeline = Pipeline::new(self.store.clone(), config)?.with_local_clock(self.clock.clone());
        let handler = Arc::new(handler);
        let spawn_workers: Spawn<S> = Box::new(move |pipeline: Pipeline<S>| {
            let workers = pipeline.config.workers;
            (0..workers).map(|_| tokio::spawn(worker::run(pipeline.clone(), handler.clone()))).collect()
        });
        self.pipelines.push(Registered {
            pipeline,
            spawn_workers: Some(spawn_workers),
            fetcher: None,
            workers: Vec::new(),
            heartbeater: None,
        });
        Ok(())
    }

    /// Runs `retention` from [`PipelineManager::start`] on: a pass every `retention.every`, each deleting the
    /// finished rows its rules name ([`Retention::pass`]). Give it to one replica or to all: purges skip the rows
    /// another replica's purge holds. Errors: a rule the store would refuse ([`Retention::validate`]).
    pub fn retain(&mut self, retention: Retention) -> Result<(), ConfigError> {
        retention.validate().map_err(ConfigError::Retention)?;
        self.run_beside(retention.run(self.store.clone()));
        Ok(())
    }

    /// Runs `task` from [`PipelineManager::start`] until the manager stops (a shutdown or an abort aborts it):
    /// a companion of the pipelines that is not itself a pipeline, such as the retention or the gang controller's
    /// node watch. A task added after `start` never runs.
    pub fn run_beside(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.beside.push(Box::pin(task));
    }

    /// Starts every registered pipeline's fetcher, workers and heartbeater, and the hinter. Call once.
    pub fn start(&mut self) {
        let routes =
            self.pipelines.iter().map(|p| (p.pipeline.config.kind.clone(), p.pipeline.shared.clone())).collect();
        let hinter = Hinter::new(self.store.subscribe_hints(), routes);
        self.hinter = Some(tokio::spawn(hinter.run()));
        self.beside_tasks.extend(self.beside.drain(..).map(tokio::spawn));
        for registered in &mut self.pipelines {
            let spawn = registered.spawn_workers.take().expect("PipelineManager::start called twice");
            let pipeline = &registered.pipeline;
            pipeline.seed_retry_jitter(self.options.seed);
            registered.workers = spawn(pipeline.clone());
            registered.fetcher = Some(tokio::spawn(pipeline.fetcher(self.options.seed).run()));
            registered.heartbeater = Some(tokio::spawn(pipeline.heartbeater().run()));
        }
    }

    /// Sends a fetch hint for `kind` (and marks `row` hinted) through the store, so every replica's fetchers of
    /// that kind wake. Call after the write that made the rows ready has committed.
    pub async fn hint_fetch(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        self.store.hint(kind, row).await
    }

    /// Metrics of the pipeline named `name`, if registered.
    pub fn metrics(&self, name: &str) -> Option<MetricsSnapshot> {
        self.pipelines.iter().find(|p| p.pipeline.config.name == name).map(|p| p.pipeline.metrics())
    }

    /// The parts of the pipeline named `name`, if registered.
    pub fn pipeline(&self, name: &str) -> Option<&Pipeline<S>> {
        self.pipelines.iter().find(|p| p.pipeline.config.name == name).map(|p| &p.pipeline)
    }

    /// Stops every task at once without draining or releasing anything, as a crashed replica would: its leases
    /// stay in the store until they expire and another replica takes the rows. For tests and for a hard stop.
    pub fn abort(&mut self) {
        for registered in &mut self.pipelines {
            registered.pipeline.shared.close();
            registered.pipeline.batcher.abort();
            registered.pipeline.refetcher.abort();
            let tasks = registered.fetcher.take().into_iter().chain(registered.heartbeater.take());
            for task in tasks.chain(registered.workers.drain(..)) {
                task.abort();
            }
        }
        if let Some(hinter) = self.hinter.take() {
            hinter.abort();
        }
        for task in self.beside_tasks.drain(..) {
            task.abort();
        }
    }

    /// [`PipelineManager::shutdown`] within `bound` (local clock): past it, every task still running is aborted, as
    /// [`PipelineManager::abort`] does, and `None` is returned; the leases not given back expire on their own. A
    /// drain waits for the passes its workers started, and a pass waits for its store calls, each bounded by the
    /// store (`PgOptions::call_timeout`) but several in a row; the bound makes the whole stop end in time whatever
    /// the database does.
    pub async fn shutdown_within(&mut self, bound: std::time::Duration) -> Option<ShutdownReport> {
        let report = tokio::time::timeout(bound, self.shutdown()).await.ok();
        if report.is_none() {
            self.abort();
        }
        report
    }

    /// Drains every pipeline:
    /// 1. the queue closes: workers take no new item, and the fetcher stops after its current pass;
    /// 2. the leases of items still queued (including any the fetcher's last pass added) go back to the store;
    /// 3. workers finish the items they started, with heartbeats still running;
    /// 4. heartbeaters and the hinter stop.
    pub async fn shutdown(&mut self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for registered in &mut self.pipelines {
            let pipeline = registered.pipeline.clone();
            let mut unstarted = pipeline.shared.close();
            // Each task's handle stays registered until the task ended, so that a drain cut short
            // (`shutdown_within`) still aborts it: a dropped handle would leave its task running, detached.
            if let Some(fetcher) = registered.fetcher.as_mut() {
                let _ = fetcher.await;
                registered.fetcher = None;
            }
            unstarted.extend(pipeline.shared.close());
            let leases: Vec<Lease> = unstarted.iter().map(|item| item.lease).collect();
            for lease in &leases {
                pipeline.shared.forget(*lease);
            }
            if !leases.is_empty() {
                match pipeline.store.release(leases).await {
                    Ok(released) => {
                        report.released += released;
                        pipeline.metrics.released.fetch_add(released as u64, Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::warn!(pipeline = %pipeline.config.name, %error, "release on shutdown failed");
                        report.release_errors += 1;
                    }
                }
            }
        }
        for registered in &mut self.pipelines {
            // In start order, as before (the order the drain polls them in is part of a simulated run).
            while let Some(worker) = registered.workers.first_mut() {
                let _ = worker.await;
                registered.workers.remove(0);
            }
            if let Some(heartbeater) = registered.heartbeater.take() {
                heartbeater.abort();
            }
        }
        if let Some(hinter) = self.hinter.take() {
            hinter.abort();
        }
        for task in self.beside_tasks.drain(..) {
            task.abort();
        }
        report
    }
}
