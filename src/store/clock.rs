//! The store's clock. MemStore takes one at construction; PostgreSQL uses `now()`.

use super::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A source of store time. Implementations must be monotonic (never go back).
pub trait Clock: Send + Sync + 'static {
    /// The current store time.
    fn now(&self) -> Timestamp;
}

/// Store time from the runtime's clock: `origin` plus the time elapsed on `tokio::time::Instant` since
/// construction. Under the simulator this is simulated time, so a MemStore built on it is deterministic; in a
/// normal build it is the process's monotonic clock.
#[derive(Clone, Debug)]
pub struct TokioClock {
    origin: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `origin` now and advances with the runtime's clock.
    pub fn new(origin: Timestamp) -> TokioClock {
        TokioClock { origin, start: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.origin.plus(self.start.elapsed())
    }
}

/// A clock that moves only when told to: for tests that drive leases across expiry without sleeping.
/// Clones share one time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    micros: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock { micros: Arc::new(AtomicI64::new(start.as_micros())) }
    }

    /// Moves the clock forward by `span`.
    pub fn advance(&self, span: Duration) {
        self.micros.fetch_add(super::types::duration_micros(span), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.micros.load(Ordering::SeqCst))
    }
}
