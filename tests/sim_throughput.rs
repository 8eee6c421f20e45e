//! The performance model under the simulator (DESIGN §3, seed "Performance analysis"): a saturated pipeline's
//! throughput is workers / processing time. Checked within 10% for processing times of 10 ms and 100 ms and
//! 1 to 64 workers, on MemStore in simulated time, so the machine's load cannot move the numbers; with the
//! default config (apply batching on), with workers that finish together and with processing times spread
//! ±20% (where a batch must not wait for workers that are still processing).
//!
//! Each run inserts `ROUNDS × workers` ready rows, starts one replica, and measures simulated time from the
//! start to the last apply. Replay a failing case with the seed its message prints.
#![cfg(madsim)]

use lockstep::pipeline::{Changes, Handler, LoadCx, ManagerOptions, PipelineConfig, PipelineManager, WorkError};
use lockstep::store::{Lease, MemStore, NewRow, Row, Store, Timestamp, TokioClock};
use madsim::runtime::Runtime;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Items each worker processes in a run: enough that the start (the first fetch) and the end (the last items,
/// when fewer are left than workers) weigh under 2% of the run.
const ROUNDS: usize = 60;
/// How far the measured throughput may be from workers / processing time.
const TOLERANCE: f64 = 0.10;
/// Worker counts checked.
const WORKERS: [usize; 4] = [1, 4, 16, 64];
/// Processing times checked (the 10 ms and 100 ms).
const PROCESSING: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(100)];
/// Relative spread of processing times in the jittered runs: each item takes the nominal time × (1 ± this),
/// drawn per lease, so the mean stays the nominal time.
const JITTER: f64 = 0.2;
/// Simulated time limit of a run: a hang fails loudly instead of spinning.
const SIM_TIME_LIMIT: Duration = Duration::from_secs(3600);
/// The run's seed (the model must hold for any; one is pinned).
const SEED: u64 = 7;

/// Sleeps the processing time (exact, or jittered per lease), then marks the row done.
struct Sleeps {
    processing: Duration,
    jitter: f64,
}

impl Handler<MemStore> for Sleeps {
    type Context = Lease;

    async fn load(&self, _row: &Row, cx: &LoadCx<'_, MemStore>) -> Result<Lease, WorkError> {
        Ok(cx.lease())
    }

    async fn process(&self, _row: Row, lease: Lease) -> Result<Changes, WorkError> {
        let factor = if self.jitter > 0.0 {
            let mut rng = ChaCha8Rng::seed_from_u64(SEED ^ (lease.id.0 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            rng.random_range(1.0 - self.jitter..=1.0 + self.jitter)
        } else {
            1.0
        };
        tokio::time::sleep(self.processing.mul_f64(factor)).await;
        Ok(Changes::status("done"))
    }
}

/// Items per second (simulated) of one replica with `workers` workers and `handler`, over its whole run.
async fn throughput(workers: usize, handler: Sleeps) -> f64 {
    let store = Arc::new(MemStore::new(TokioClock::new(Timestamp(1_700_000_000_000_000))));
    let rows = ROUNDS * workers;
    for i in 0..rows {
        store.insert(NewRow::new("item", "ready", json!({ "n": i }))).await.expect("insert");
    }
    let mut manager = PipelineManager::new(store.clone(), ManagerOptions { seed: SEED });
    let config = PipelineConfig { workers, ..PipelineConfig::new("items", "item", &["ready"]) };
    manager.register(config, handler).expect("config");
    let started = tokio::time::Instant::now();
    manager.start();
    // Polling costs simulated events, not time: a 1 ms poll sees the last apply within 1 ms, under 0.2% of the
    // shortest run (60 × 10 ms).
    while (manager.metrics("items").expect("registered").applied as usize) < rows {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let finished = tokio::time::Instant::now();
    manager.shutdown().await;
    rows as f64 / finished.duration_since(started).as_secs_f64()
}

/// Runs `f` in a fresh simulated runtime on a fresh thread (one world per runtime, shared/notes/madsim.md).
fn simulate<F: std::future::Future<Output = f64> + 'static>(f: impl FnOnce() -> F + Send + 'static) -> f64 {
    std::thread::spawn(move || {
        let mut runtime = Runtime::with_seed_and_config(SEED, madsim::Config::default());
        runtime.set_time_limit(SIM_TIME_LIMIT);
        runtime.block_on(f())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Checks every (processing, workers) pair with `jitter` and returns the table of results.
fn check_model(jitter: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for processing in PROCESSING {
        for workers in WORKERS {
            let measured = simulate(move || throughput(workers, Sleeps { processing, jitter }));
            let expected = workers as f64 / processing.as_secs_f64();
            let error = measured / expected - 1.0;
            let line = format!(
                "processing {processing:?} ±{:.0}%, {workers:>2} workers: {measured:>8.1} items/s, model \
                 {expected:>7.1} ({:+.1}%)",
                jitter * 100.0,
                error * 100.0
            );
            if error.abs() > TOLERANCE {
                failures.push(line.clone());
            }
            lines.push(line);
        }
    }
    println!("{}", lines.join("\n"));
    assert!(failures.is_empty(), "throughput off workers / processing time by more than 10% (seed {SEED}):\n{}", {
        failures.join("\n")
    });
    lines
}

#[test]
fn throughput_is_workers_over_processing_time_when_workers_finish_together() {
    check_model(0.0);
}

#[test]
fn throughput_is_workers_over_processing_time_when_processing_times_spread() {
    check_model(JITTER);
}
