//! A replica's local monotonic clock: the clock of its lease deadlines, fetch backoffs and heartbeat periods
//! (DESIGN §2, Time). Store timestamps never come from it.
//!
//! By default it is the runtime's clock (`tokio::time::Instant`: simulated time under madsim). A *drifting* clock
//! runs at a rate other than 1 against it, which is how the simulator models a replica whose monotonic clock is
//! slow or fast (DESIGN §5, clock skew), and a drifting clock can also *jump*, forwards or backwards (a virtual
//! machine's clock stepped after a migration, a clock under libfaketime whose offset changes). An offset of the
//! wall clock needs no model: nothing in the engine reads one, and every lease timestamp is the store's.

use std::sync::{Arc, Mutex};
use tokio::time::{Duration, Instant};

/// Rate of an exact clock, in parts per million of the runtime's clock.
pub const RATE_PPM_EXACT: u64 = 1_000_000;
/// Slowest rate a drifting clock accepts: 0.5 (a clock that loses half of every second).
pub const RATE_PPM_MIN: u64 = 500_000;
/// Fastest rate a drifting clock accepts: 2.0.
pub const RATE_PPM_MAX: u64 = 2_000_000;

/// The engine's local clock. Clones share one clock.
#[derive(Clone, Default)]
pub struct LocalClock {
    drift: Option<Arc<Mutex<Drift>>>,
    reader: Option<RuntimeReader>,
}

/// A reader of the runtime's clock for [`LocalClock::with_reader`]: it must return what
/// `tokio::time::Instant::now()` returns, only more cheaply.
pub type RuntimeReader = Arc<dyn Fn() -> Instant + Send + Sync>;

impl std::fmt::Debug for LocalClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClock").field("drift", &self.drift).field("reader", &self.reader.is_some()).finish()
    }
}

/// A piecewise-linear map from the runtime's clock to the local one: local = `local_base` + (runtime −
/// `runtime_base`) × `rate_ppm` / 10⁶. Integer arithmetic, so a run stays a function of its seed.
#[derive(Debug)]
struct Drift {
    rate_ppm: u64,
    runtime_base: Instant,
    local_base: Instant,
}

impl Drift {
    fn now(&self, runtime_now: Instant) -> Instant {
        self.local_base + scale(runtime_now.duration_since(self.runtime_base), self.rate_ppm, RATE_PPM_EXACT)
    }
}

/// `span` × `numerator` / `denominator`, in whole nanoseconds.
fn scale(span: Duration, numerator: u64, denominator: u64) -> Duration {
    let nanos = span.as_nanos() * numerator as u128 / denominator as u128;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

impl LocalClock {
    /// The runtime's clock itself (the default).
    pub fn exact() -> LocalClock {
        LocalClock::default()
    }

    /// A clock whose rate can be changed with [`LocalClock::set_rate_ppm`]; it starts at rate 1.
    pub fn drifting() -> LocalClock {
        let now = Instant::now();
        let drift = Drift { rate_ppm: RATE_PPM_EXACT, runtime_base: now, local_base: now };
        LocalClock { drift: Some(Arc::new(Mutex::new(drift))), reader: None }
    }

    /// The same clock, reading the runtime's clock through `reader` instead of `tokio::time::Instant::now()`.
    /// The simulator reads madsim's clock directly this way: through `Instant::now()` every read crossed libc's
    /// `clock_gettime`, which madsim overrides, at about 250 instructions a read, and a 10 000-row run's replicas
    /// read their clocks about 230 000 times. Set it before the clock is shared.
    pub fn with_reader(mut self, reader: RuntimeReader) -> LocalClock {
        self.reader = Some(reader);
        self
    }

    /// The runtime's clock now, through the reader if there is one.
    fn runtime_now(&self) -> Instant {
        match &self.reader {
            Some(reader) => reader(),
            None => Instant::now(),
        }
    }

    /// Sets the rate, in parts per million of the runtime's clock, from now on (local time stays continuous).
    ///
    /// Panics on an exact clock, or on a rate outside [`RATE_PPM_MIN`]..=[`RATE_PPM_MAX`].
    pub fn set_rate_ppm(&self, rate_ppm: u64) {
        assert!((RATE_PPM_MIN..=RATE_PPM_MAX).contains(&rate_ppm), "clock rate {rate_ppm} ppm out of range");
        let drift = self.drift.as_ref().expect("set_rate_ppm on an exact LocalClock; build it with drifting()");
        let runtime_now = self.runtime_now();
        let mut drift = lock(drift);
        let local_now = drift.now(runtime_now);
        *drift = Drift { rate_ppm, runtime_base: runtime_now, local_base: local_now };
    }

    /// Moves the local time by `by` at once, forwards or (with `back`) backwards, keeping the rate: every local
    /// deadline computed before the jump is that much nearer (forwards) or farther (backwards). A backward jump
    /// past the runtime's first instant stops there.
    ///
    /// Panics on an exact clock.
    pub fn jump(&self, by: Duration, back: bool) {
        let drift = self.drift.as_ref().expect("jump on an exact LocalClock; build it with drifting()");
        let runtime_now = self.runtime_now();
        let mut drift = lock(drift);
        let local_now = drift.now(runtime_now);
        let local_after =
            if back { local_now.checked_sub(by).unwrap_or(drift.runtime_base.min(local_now)) } else { local_now + by };
        *drift = Drift { rate_ppm: drift.rate_ppm, runtime_base: runtime_now, local_base: local_after };
    }

    /// The current rate in parts per million ([`RATE_PPM_EXACT`] for an exact clock).
    pub fn rate_ppm(&self) -> u64 {
        self.drift.as_ref().map_or(RATE_PPM_EXACT, |drift| lock(drift).rate_ppm)
    }

    /// The local time now.
    pub fn now(&self) -> Instant {
        let runtime_now = self.runtime_now();
        match &self.drift {
            None => runtime_now,
            Some(drift) => lock(drift).now(runtime_now),
        }
    }

    /// Sleeps `span` of local time: `span` / rate of the runtime's clock.
    pub async fn sleep(&self, span: Duration) {
        let rate_ppm = self.rate_ppm();
        let runtime_span = if rate_ppm == RATE_PPM_EXACT { span } else { scale(span, RATE_PPM_EXACT, rate_ppm) };
        tokio::time::sleep(runtime_span).await;
    }

    /// Sleeps until the local time `deadline` (returns at once if it passed).
    pub async fn sleep_until(&self, deadline: Instant) {
        self.sleep(deadline.saturating_duration_since(self.now())).await;
    }
}

fn lock(drift: &Mutex<Drift>) -> std::sync::MutexGuard<'_, Drift> {
    drift.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_clock_counts_less_time_and_sleeps_longer() {
        let clock = LocalClock::drifting();
        let start_local = clock.now();
        let start = Instant::now();
        clock.set_rate_ppm(800_000);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(clock.now().duration_since(start_local), Duration::from_secs(8));
        clock.sleep(Duration::from_secs(4)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(15));
        clock.set_rate_ppm(RATE_PPM_EXACT);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(clock.now().duration_since(start_local), Duration::from_secs(13));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_with_a_reader_reads_the_runtime_clock_through_it() {
        let base = Instant::now();
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = reads.clone();
        // A reader whose runtime clock stands still at `base` + 1 h, counting its reads.
        let reader: RuntimeReader = Arc::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            base + Duration::from_secs(3600)
        });
        assert_eq!(LocalClock::exact().with_reader(reader.clone()).now(), base + Duration::from_secs(3600));
        let drifting = LocalClock::drifting().with_reader(reader);
        drifting.set_rate_ppm(500_000);
        // Built at `base`, the drifting clock ran at rate 1 until the reader's time, where the new rate took
        // effect; the reader's time has not moved since, so local time is that time.
        assert_eq!(drifting.now(), base + Duration::from_secs(3600));
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 3, "every read of the runtime's clock");
    }

    #[tokio::test(start_paused = true)]
    async fn a_jump_moves_local_time_at_once_and_keeps_the_rate() {
        let clock = LocalClock::drifting();
        let start = clock.now();
        clock.set_rate_ppm(500_000);
        tokio::time::sleep(Duration::from_secs(4)).await;
        clock.jump(Duration::from_secs(10), false);
        assert_eq!(clock.now().duration_since(start), Duration::from_secs(12));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(clock.now().duration_since(start), Duration::from_secs(13), "still at half rate");
        clock.jump(Duration::from_secs(5), true);
        assert_eq!(clock.now().duration_since(start), Duration::from_secs(8));
        let deadline = start + Duration::from_secs(9);
        let before = Instant::now();
        clock.sleep_until(deadline).await;
        assert_eq!(before.elapsed(), Duration::from_secs(2), "one local second at half rate");
    }

    #[tokio::test(start_paused = true)]
    async fn an_exact_clock_is_the_runtime_clock() {
        let clock = LocalClock::exact();
        let start = Instant::now();
        clock.sleep(Duration::from_millis(1500)).await;
        assert_eq!(clock.now().duration_since(start), Duration::from_millis(1500));
        assert_eq!(clock.rate_ppm(), RATE_PPM_EXACT);
    }
}
