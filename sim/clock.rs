//! The simulator's reads of madsim's clock, without the detour every `Instant::now()` takes.
//!
//! Inside the simulator `Instant::now()` (what `tokio::time::Instant` is under madsim) calls libc's
//! `clock_gettime`, which madsim overrides: a thread-local lookup of the runtime, two `Arc`s cloned and dropped,
//! the clock's lock and two conversions through a `timespec`, about 250 instructions a read, and a 10 000-row run
//! read the clock about 600 000 times. [`SimTime`] keeps the runtime's time handle and reads the same clock
//! through it directly: the same [`Instant`], byte for byte, for a lock and an addition.

use crate::pipeline::RuntimeReader;
use crate::store::{Clock, Timestamp};
use madsim::time::TimeHandle;
use std::sync::Arc;
use tokio::time::Instant;

/// The current runtime's clock. Build it inside the runtime whose clock it reads.
#[derive(Clone)]
pub struct SimTime {
    handle: TimeHandle,
}

impl SimTime {
    /// The clock of the runtime this runs in. Panics outside a madsim runtime.
    pub fn current() -> SimTime {
        SimTime { handle: TimeHandle::current() }
    }

    /// Now: what `Instant::now()` returns at this point of the run.
    pub fn now(&self) -> Instant {
        self.handle.now_instant()
    }

    /// A reader of this clock for [`LocalClock::with_reader`](crate::pipeline::LocalClock::with_reader).
    pub fn reader(&self) -> RuntimeReader {
        let time = self.clone();
        Arc::new(move || time.now())
    }
}

/// Store time from the simulated clock: `origin` plus the simulated time since construction, as
/// [`TokioClock`](crate::store::TokioClock) gives it, read through [`SimTime`].
#[derive(Clone)]
pub struct SimStoreClock {
    origin: Timestamp,
    start: Instant,
    time: SimTime,
}

impl SimStoreClock {
    /// A clock that reads `origin` now and advances with the simulated clock.
    pub fn new(origin: Timestamp) -> SimStoreClock {
        let time = SimTime::current();
        SimStoreClock { origin, start: time.now(), time }
    }

    /// The simulated clock it reads.
    pub fn time(&self) -> &SimTime {
        &self.time
    }
}

impl Clock for SimStoreClock {
    fn now(&self) -> Timestamp {
        self.origin.plus(self.time.now().saturating_duration_since(self.start))
    }
}
