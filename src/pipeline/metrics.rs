//! Counters and latencies of one pipeline: what dstack lacks (DESIGN §3, Manager). Lock-free, read as a
//! [`MetricsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Duration;

/// Count, sum and max of one latency, in microseconds of the local clock (simulated time under madsim).
#[derive(Debug, Default)]
pub struct Latency {
    count: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
}

/// A read of a [`Latency`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Samples recorded.
    pub count: u64,
    /// Sum of all samples.
    pub total: Duration,
    /// Largest sample.
    pub max: Duration,
}

impl LatencySnapshot {
    /// Mean of the samples; zero when there are none.
    pub fn mean(&self) -> Duration {
        if self.count == 0 { Duration::ZERO } else { self.total / self.count as u32 }
    }
}

impl Latency {
    /// Records one sample.
    pub fn record(&self, span: Duration) {
        let us = span.as_micros().min(u64::MAX as u128) as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            count: self.count.load(Ordering::Relaxed),
            total: Duration::from_micros(self.total_us.load(Ordering::Relaxed)),
            max: Duration::from_micros(self.max_us.load(Ordering::Relaxed)),
        }
    }
}

/// Live metrics of one pipeline.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Rows leased by fetches.
    pub fetched: AtomicU64,
    /// Fetches that leased nothing.
    pub empty_fetches: AtomicU64,
    /// Fetches the fetcher did not make, backing off instead, because a full queue's worth of items in a row were
    /// turned away by contended related locks (see [`super::queue::Shared::backs_off_for_contention`]).
    pub contention_backoffs: AtomicU64,
    /// Guarded applies that wrote.
    pub applied: AtomicU64,
    /// Store calls that carried applies: one per batch (DESIGN §3, Batching), one per apply when batching is off.
    /// `applied + stale` over this is the mean batch size.
    pub apply_calls: AtomicU64,
    /// Refetches by token the workers made (one per item that reached its load with refetch on).
    pub refetched: AtomicU64,
    /// Store calls that carried refetches: one per batch (DESIGN §3, Batching), one per refetch when batching is
    /// off.
    pub refetch_calls: AtomicU64,
    /// Items dropped as stale: lost before processing, refetch found another token, or apply found none.
    pub stale: AtomicU64,
    /// Reset-and-retry after related-lock contention.
    pub retries: AtomicU64,
    /// Items parked after related-lock contention (DESIGN §3, "Parked waiters"), their leases kept.
    pub parked: AtomicU64,
    /// Store errors (unavailable, timed out) that left a lease to expire, counting no attempt.
    pub errors: AtomicU64,
    /// Item failures recorded on their rows (handler failures, panics, values the store refused): each one attempt,
    /// retried after a backoff or given up (DESIGN §3, failures).
    pub failures: AtomicU64,
    /// Recorded failures that gave up: the row took its pipeline's failed status.
    pub gave_up: AtomicU64,
    /// Handler panics caught (each also counted as a failure or an error).
    pub panics: AtomicU64,
    /// Leases given back unprocessed: on shutdown, and by the heartbeater for items no worker started within their
    /// start window (see [`super::queue`]).
    pub released: AtomicU64,
    /// Leases the heartbeater extended.
    pub heartbeats: AtomicU64,
    /// Fetch call latency.
    pub fetch_latency: Latency,
    /// Handler `process` latency.
    pub process_latency: Latency,
    /// Guarded apply latency, including the wait for its batch.
    pub apply_latency: Latency,
}

/// A read of a pipeline's metrics plus its gauges at that moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// See [`Metrics::fetched`].
    pub fetched: u64,
    /// See [`Metrics::empty_fetches`].
    pub empty_fetches: u64,
    /// See [`Metrics::contention_backoffs`].
    pub contention_backoffs: u64,
    /// See [`Metrics::applied`].
    pub applied: u64,
    /// See [`Metrics::apply_calls`].
    pub apply_calls: u64,
    /// See [`Metrics::refetched`].
    pub refetched: u64,
    /// See [`Metrics::refetch_calls`].
    pub refetch_calls: u64,
    /// See [`Metrics::stale`].
    pub stale: u64,
    /// See [`Metrics::retries`].
    pub retries: u64,
    /// See [`Metrics::parked`].
    pub parked: u64,
    /// See [`Metrics::errors`].
    pub errors: u64,
    /// See [`Metrics::failures`].
    pub failures: u64,
    /// See [`Metrics::gave_up`].
    pub gave_up: u64,
    /// See [`Metrics::panics`].
    pub panics: u64,
    /// See [`Metrics::released`].
    pub released: u64,
    /// See [`Metrics::heartbeats`].
    pub heartbeats: u64,
    /// Items queued, waiting for a worker.
    pub queue_depth: usize,
    /// Leases held (queued and in processing).
    pub leases_held: usize,
    /// Age of the oldest lease held, local clock.
    pub lease_age_max: Duration,
    /// See [`Metrics::fetch_latency`].
    pub fetch_latency: LatencySnapshot,
    /// See [`Metrics::process_latency`].
    pub process_latency: LatencySnapshot,
    /// See [`Metrics::apply_latency`].
    pub apply_latency: LatencySnapshot,
}

impl Metrics {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the counters; the caller fills the gauges.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            fetched: read(&self.fetched),
            empty_fetches: read(&self.empty_fetches),
            contention_backoffs: read(&self.contention_backoffs),
            applied: read(&self.applied),
            apply_calls: read(&self.apply_calls),
            refetched: read(&self.refetched),
            refetch_calls: read(&self.refetch_calls),
            stale: read(&self.stale),
            retries: read(&self.retries),
            parked: read(&self.parked),
            errors: read(&self.errors),
            failures: read(&self.failures),
            gave_up: read(&self.gave_up),
            panics: read(&self.panics),
            released: read(&self.released),
            heartbeats: read(&self.heartbeats),
            fetch_latency: self.fetch_latency.snapshot(),
            process_latency: self.process_latency.snapshot(),
            apply_latency: self.apply_latency.snapshot(),
            ..MetricsSnapshot::default()
        }
    }
}
