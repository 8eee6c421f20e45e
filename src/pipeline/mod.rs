//! The pipeline engine (DESIGN §3; dstack's `contributing/PIPELINES.md`).
//!
//! A pipeline is one [`Fetcher`] + N workers + one [`Heartbeater`] over a bounded in-memory queue:
//! - the fetcher leases ready rows (`lock_expires_at`, `lock_token`, `lock_owner`) into the queue while it is
//!   below its lower mark, backs off on empty fetches and wakes at once on a fetch hint; with `fetchers` > 1,
//!   more fetch loops overlap its fetches while the workers outrun it;
//! - each worker runs load (refetch by token unless the row is fresh from its fetch, related locks) → process
//!   (no store call) → guarded apply, and resets the lease for retry when a related lock is contended; the
//!   [`RefetchBatcher`] and [`ApplyBatcher`] group several workers' refetches, and their applies, into one store
//!   call each;
//! - the heartbeater extends leases that come close to expiry and forgets lost ones.
//!
//! [`PipelineManager`] registers pipelines, runs them, and drains them on shutdown. The engine is generic over
//! [`Store`] and never names a backend.

pub mod batcher;
pub mod clock;
pub mod config;
pub mod fetcher;
pub mod group_commit;
pub mod handler;
pub mod heartbeater;
pub mod hinter;
pub mod manager;
pub mod metrics;
pub mod queue;
pub mod retention;
pub mod waitlist;
pub mod worker;

pub use batcher::{ApplyBatcher, PendingApply, RefetchBatcher};
pub use clock::{LocalClock, RuntimeReader};
pub use config::{ConfigError, PipelineConfig, RetryPolicy};
pub use fetcher::{FetchPass, Fetcher};
pub use handler::{Changes, Failure, Handler, LoadCx, RetryDecision, WorkError};
pub use heartbeater::{HeartbeatPass, Heartbeater};
pub use hinter::Hinter;
pub use manager::{ManagerOptions, PipelineManager, ShutdownReport};
pub use metrics::{Metrics, MetricsSnapshot};
pub use retention::{Retention, RetentionRule};
pub use waitlist::Waitlist;
pub use worker::ItemOutcome;

use crate::store::Store;
use queue::Shared;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Mutex};
use tokio::time::Duration;

/// One pipeline's parts: its store, config, queue and ledger, and metrics. Clones share them. The manager builds
/// one per registered pipeline; tests build one to drive a service pass by pass.
pub struct Pipeline<S: Store> {
    /// The store it leases from.
    pub store: Arc<S>,
    /// Its configuration (validated).
    pub config: Arc<PipelineConfig>,
    /// Queue, ledger and wake-ups.
    pub shared: Arc<Shared>,
    /// Counters and latencies.
    pub metrics: Arc<Metrics>,
    /// The local clock of its deadlines, backoffs and heartbeat periods (exact unless the simulator drifts it).
    pub clock: LocalClock,
    /// Groups its workers' guarded applies into batches (DESIGN §3, Batching).
    pub batcher: Arc<ApplyBatcher<S>>,
    /// Groups its workers' refetches into batches (DESIGN §3, Batching).
    pub refetcher: Arc<RefetchBatcher<S>>,
    /// The turns of its items' related rows in this replica (see [`waitlist`]).
    pub waitlist: Arc<Waitlist>,
    /// The jitter of its workers' retry delays: a ChaCha stream of the pipeline's name, seeded by
    /// [`Pipeline::seed_retry_jitter`] (DESIGN §5: one stream per purpose, no OS randomness).
    pub(crate) retry_rng: Arc<Mutex<ChaCha8Rng>>,
}

pub(crate) type Core<S> = Pipeline<S>;

impl<S: Store> Clone for Pipeline<S> {
    fn clone(&self) -> Self {
        Pipeline {
            store: self.store.clone(),
            config: self.config.clone(),
            shared: self.shared.clone(),
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            batcher: self.batcher.clone(),
            refetcher: self.refetcher.clone(),
            waitlist: self.waitlist.clone(),
            retry_rng: self.retry_rng.clone(),
        }
    }
}

impl<S: Store> Pipeline<S> {
    /// The parts of a pipeline over `store`. Errors: the first rule `config` breaks.
    pub fn new(store: Arc<S>, config: PipelineConfig) -> Result<Pipeline<S>, ConfigError> {
        config.validate()?;
        let shared = Arc::new(Shared::new(&config));
        let clock = LocalClock::exact();
        let metrics = Arc::new(Metrics::default());
        let batcher = Arc::new(ApplyBatcher::new(store.clone(), &config, clock.clone(), metrics.clone()));
        let refetcher = Arc::new(RefetchBatcher::new(store.clone(), &config, clock.clone(), metrics.clone()));
        let retry_rng = Arc::new(Mutex::new(retry_stream(0, &config.name)));
        let waitlist = Arc::new(Waitlist::default());
        let config = Arc::new(config);
        Ok(Pipeline { store, config, shared, metrics, clock, batcher, refetcher, waitlist, retry_rng })
    }

    /// The same pipeline on the local clock `clock` (DESIGN §2: deadlines are local, timestamps the store's).
    pub fn with_local_clock(mut self, clock: LocalClock) -> Pipeline<S> {
        let (store, metrics) = (self.store.clone(), self.metrics.clone());
        self.batcher = Arc::new(ApplyBatcher::new(store.clone(), &self.config, clock.clone(), metrics.clone()));
        self.refetcher = Arc::new(RefetchBatcher::new(store, &self.config, clock.clone(), metrics));
        self.clock = clock;
        self
    }

    /// Its fetcher, with jitter drawn from a ChaCha stream seeded by `seed` and the pipeline's name (one stream
    /// per purpose, DESIGN §5).
    pub fn fetcher(&self, seed: u64) -> Fetcher<S> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(name_stream(&self.config.name));
        Fetcher::new(self.clone(), rng)
    }

    /// Seeds the jitter of its retry delays from `seed` and the pipeline's name (the manager passes its seed, as
    /// to the fetcher). Until then the stream is seeded with 0.
    pub fn seed_retry_jitter(&self, seed: u64) {
        *self.retry_rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = retry_stream(seed, &self.config.name);
    }

    /// A draw in [-1, 1] for the jitter of a retry delay.
    pub(crate) fn retry_draw(&self) -> f64 {
        use rand::Rng;
        self.retry_rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).random_range(-1.0..=1.0)
    }

    /// Gives back to the store the leases of items taken out of the queue unstarted: drops them from the ledger,
    /// releases them (each row fetchable at once by any replica) and counts them in `released`. Errors: the
    /// store's; the leases, out of the ledger already, are left to expire.
    pub(crate) async fn give_back(&self, leases: Vec<crate::store::Lease>) -> Result<(), crate::store::StoreError> {
        for lease in &leases {
            self.shared.forget(*lease);
        }
        let released = self.store.release(leases).await?;
        self.metrics.released.fetch_add(released as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Its heartbeater.
    pub fn heartbeater(&self) -> Heartbeater<S> {
        Heartbeater::new(self.clone())
    }

    /// Takes the next queued item, if any is queued now, and runs it through `handler` (one worker pass).
    pub async fn work_one<H: Handler<S>>(&self, handler: &H) -> Option<ItemOutcome> {
        if self.shared.queue_len() == 0 {
            return None;
        }
        let item = self.shared.pop(&self.clock).await?;
        Some(worker::work(self, handler, item).await)
    }

    /// Metrics with the gauges read now.
    pub fn metrics(&self) -> MetricsSnapshot {
        let now = self.clock.now();
        let leases = self.shared.leases();
        let lease_age_max = leases.values().map(|held| now.duration_since(held.leased_at)).max();
        MetricsSnapshot {
            queue_depth: self.shared.queue_len(),
            leases_held: leases.len(),
            lease_age_max: lease_age_max.unwrap_or(Duration::ZERO),
            ..self.metrics.snapshot()
        }
    }
}

/// The retry-jitter stream of pipeline `name`: its own ChaCha stream, apart from the fetcher's.
fn retry_stream(seed: u64, name: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(name_stream(name).wrapping_add(1));
    rng
}

/// A stable stream number for a pipeline name (FNV-1a), so adding a pipeline does not reshuffle another's jitter.
fn name_stream(name: &str) -> u64 {
    crate::hash::fnv1a64(name.as_bytes())
}
