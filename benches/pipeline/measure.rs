//! How a point is measured: a counter of finished items sampled over a window of wall time after a warm-up, and
//! the cost of those items (CPU of this process and of PostgreSQL's processes, WAL written), plus the pipelines'
//! handlers.

use lockstep::pipeline::{Changes, Handler, LoadCx, MetricsSnapshot, WorkError};
use lockstep::store::{Row, Store};
use std::time::{Duration, Instant};

/// Linux's USER_HZ: `/proc/*/stat` counts CPU time in these ticks per second (fixed at 100 on every Linux ABI that
/// this bench runs on).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;
/// How often the counter is read while waiting for the window's end (to catch a run that finishes its rows early).
const POLL: Duration = Duration::from_millis(10);

/// What one measurement saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Items finished within the window.
    pub items: u64,
    /// The window's length, wall clock.
    pub secs: f64,
    /// CPU seconds PostgreSQL's processes used in the window (every session of the server, so another user's
    /// work counts too), or 0 when not measured.
    pub db_cpu_secs: f64,
    /// CPU seconds this process used in the window (every runtime thread: replicas, raw clients).
    pub client_cpu_secs: f64,
    /// WAL bytes written in the window, if measured.
    pub wal_bytes: Option<u64>,
    /// The rows ran out before the window's end, which then ended early (the rate is still over the window).
    pub ran_out: bool,
    /// Lockstep only, over the whole run: rows leased per fetch call, applies per apply store call, and refetches
    /// per refetch store call (0 when the pipeline made none).
    pub per_call: Option<(f64, f64, f64)>,
    /// PostgreSQL's counters of the drained table over the whole run, read after the clients ended: `(n_tup_upd,
    /// n_tup_hot_upd)` of `pg_stat_user_tables` (the drain section only).
    pub updates: Option<(i64, i64)>,
    /// Where a lockstep replica's pipeline waited, sampled through the run (the drain section only).
    pub waits: Option<Waits>,
}

/// Where a pipeline waited, from its gauges sampled every [`Waits::EVERY`] through a run: the shares of samples in
/// which a fetch was in flight (room reserved), every worker waited for an item (queue empty), and the applies
/// handed over and unanswered (leases held less items queued, as trivial processing holds none for long) filled
/// their slots; and the mean number of unanswered applies.
#[derive(Clone, Copy, Debug, Default)]
pub struct Waits {
    pub samples: u64,
    pub fetching: f64,
    pub all_idle: f64,
    pub slots_full: f64,
    pub unanswered_mean: f64,
}

impl Waits {
    /// Sampling period.
    pub const EVERY: Duration = Duration::from_millis(2);
}

impl Sample {
    /// Items per second.
    pub fn rate(&self) -> f64 {
        self.items as f64 / self.secs
    }

    /// CPU microseconds per item, database and client together.
    pub fn cpu_us_per_item(&self) -> f64 {
        (self.db_cpu_secs + self.client_cpu_secs) * 1e6 / self.items.max(1) as f64
    }

    /// Database CPU microseconds per item.
    pub fn db_cpu_us_per_item(&self) -> f64 {
        self.db_cpu_secs * 1e6 / self.items.max(1) as f64
    }

    /// WAL bytes per item.
    pub fn wal_per_item(&self) -> Option<f64> {
        self.wal_bytes.map(|bytes| bytes as f64 / self.items.max(1) as f64)
    }
}

/// Reads the cost counters: CPU ticks from `/proc`, WAL position from the database when there is one.
pub trait CostProbe {
    /// `(PostgreSQL CPU seconds, this process's CPU seconds, WAL bytes)` so far.
    fn read(&mut self) -> impl std::future::Future<Output = (f64, f64, Option<u64>)>;
}

/// No database: only this process's CPU.
pub struct ProcessProbe;

impl CostProbe for ProcessProbe {
    async fn read(&mut self) -> (f64, f64, Option<u64>) {
        (0.0, process_cpu_secs("self"), None)
    }
}

/// CPU seconds (user + system) of process `pid` ("self" for this one) so far; 0 if it is gone.
pub fn process_cpu_secs(pid: &str) -> f64 {
    cpu_secs(pid, false)
}

/// CPU seconds of process `pid`, and with `reaped` also of its ended children it waited for (`cutime` and
/// `cstime`: the postmaster's count the backends that ended).
fn cpu_secs(pid: &str, reaped: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may hold spaces, and ends at the last ')'): state is field 3, utime
    // and stime fields 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let children = if reaped { ticks(16) + ticks(17) } else { 0 };
    (ticks(14) + ticks(15) + children) as f64 / CLOCK_TICKS_PER_SECOND
}

/// CPU seconds of every process whose command name is `postgres` (the server and all its backends, those that
/// ended included: a session that closes within the window, such as a pool's, still counts).
pub fn postgres_cpu_secs() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres"))
        .map(|pid| cpu_secs(&pid, true))
        .sum()
}

/// Waits `warmup`, then measures `finished` (a monotonic count of items done) over `window`, ending early if it
/// reaches `total` (every row done).
pub async fn measure(
    finished: impl Fn() -> u64,
    total: u64,
    probe: &mut impl CostProbe,
    warmup: Duration,
    window: Duration,
) -> Sample {
    let warm_until = Instant::now() + warmup;
    while Instant::now() < warm_until {
        tokio::time::sleep(POLL).await;
        assert!(finished() < total, "every one of the {total} rows was done during the warm-up: add rows");
    }
    let (db0, client0, wal0) = probe.read().await;
    let (start, count0) = (Instant::now(), finished());
    let mut ran_out = false;
    while start.elapsed() < window {
        tokio::time::sleep(POLL).await;
        if finished() >= total {
            ran_out = true;
            break;
        }
    }
    let (count1, secs) = (finished(), start.elapsed().as_secs_f64());
    let (db1, client1, wal1) = probe.read().await;
    Sample {
        items: count1 - count0,
        secs,
        db_cpu_secs: db1 - db0,
        client_cpu_secs: client1 - client0,
        wal_bytes: wal0.zip(wal1).map(|(a, b)| b.saturating_sub(a)),
        ran_out,
        per_call: None,
        updates: None,
        waits: None,
    }
}

/// The pipeline whose processing is trivial: marks the row done. Load, process and apply are the protocol alone.
#[derive(Clone, Copy)]
pub struct Trivial;

impl<S: Store> Handler<S> for Trivial {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
        Ok(Changes::status("done"))
    }
}

/// A pipeline whose processing takes a fixed time outside the store (a sleep), then marks the row done.
#[derive(Clone, Copy)]
pub struct Sleeps(pub Duration);

impl<S: Store> Handler<S> for Sleeps {
    type Context = ();

    async fn load(&self, _row: &Row, _cx: &LoadCx<'_, S>) -> Result<(), WorkError> {
        Ok(())
    }

    async fn process(&self, _row: Row, _: ()) -> Result<Changes, WorkError> {
        tokio::time::sleep(self.0).await;
        Ok(Changes::status("done"))
    }
}

/// Rows per fetch call, applies per apply call and refetches per refetch call over a pipeline's whole run, summed
/// over replicas.
pub fn per_call(snapshots: &[MetricsSnapshot]) -> (f64, f64, f64) {
    let sum = |f: fn(&MetricsSnapshot) -> u64| snapshots.iter().map(f).sum::<u64>() as f64;
    let fetch_calls = sum(|m| m.fetch_latency.count).max(1.0);
    let apply_calls = sum(|m| m.apply_calls).max(1.0);
    let refetch_calls = sum(|m| m.refetch_calls).max(1.0);
    (
        sum(|m| m.fetched) / fetch_calls,
        (sum(|m| m.applied) + sum(|m| m.stale)) / apply_calls,
        sum(|m| m.refetched) / refetch_calls,
    )
}
