//! What a run measures and how long: from the command line and the environment (see the crate doc).

use std::path::PathBuf;
use std::time::Duration;

/// The database used when `DATABASE_URL` is unset: the local server of these machines (as the tests use).
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// Lockstep on PostgreSQL beside the raw SQL limit, 1 and 4 replicas × 8 workers.
    Pg,
    /// The same on MemStore, in process.
    Mem,
    /// Throughput against workers (the plot), on both stores, with trivial and 10 ms processing.
    Sweep,
    /// One drain of pre-filled rows on PostgreSQL by lockstep with its default config, timed from the replicas'
    /// start to the last apply, printed as one `RESULT` line for `benches/peers/run.sh` (peers in the same run).
    Drain,
}

/// The run's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A smoke run (no `--bench`): tiny sizes, results to a temporary directory.
    pub smoke: bool,
    pub sections: Vec<Section>,
    pub database_url: String,
    /// Time a point runs before its window opens.
    pub warmup: Duration,
    /// The measurement window of a point.
    pub window: Duration,
    /// Repetitions of the side-by-side tables (each point measured this many times, interleaved).
    pub reps: usize,
    /// Rows in each PostgreSQL schema (enough that none of the contenders runs out within warm-up + window).
    pub pg_rows: usize,
    /// Rows in each MemStore.
    pub mem_rows: usize,
    /// Where the results table and the plot go.
    pub out_dir: PathBuf,
    /// Rows the drain section fills and drains (`LOCKSTEP_BENCH_DRAIN_ROWS`, default 200 000).
    pub drain_rows: usize,
    /// Print `EXPLAIN (ANALYZE, BUFFERS)` of the fetch half-way through each lockstep point and the resource
    /// table's index reads after it (`LOCKSTEP_BENCH_EXPLAIN=1`; the smoke run does, so the code cannot rot).
    pub explain_fetch: bool,
    /// Replicas (× 8 workers) of the drain section (`LOCKSTEP_BENCH_DRAIN_REPLICAS`, default 1).
    pub drain_replicas: usize,
    /// The drain's pipeline mode (`LOCKSTEP_BENCH_DRAIN_MODE`): `batched` (the default config) or `per_item` (one
    /// row per fetch, apply and refetch batching off, a fetch loop per worker).
    pub drain_mode: DrainMode,
    /// Processing time of each drained item, a sleep (`LOCKSTEP_BENCH_DRAIN_PROCESSING_MS`, default 0: trivial).
    pub drain_processing: Duration,
    /// Overrides of the drain's config, for experiments: `fetchers` (`LOCKSTEP_BENCH_DRAIN_FETCHERS`),
    /// `apply_batches_in_flight` (`LOCKSTEP_BENCH_DRAIN_APPLIES_IN_FLIGHT`), `fetch_limit_max`
    /// (`LOCKSTEP_BENCH_DRAIN_FETCH_LIMIT_MAX`) and `apply_batch_max` (`LOCKSTEP_BENCH_DRAIN_APPLY_BATCH_MAX`); unset
    /// keeps the default.
    pub drain_fetchers: Option<usize>,
    pub drain_applies_in_flight: Option<usize>,
    pub drain_fetch_limit_max: Option<usize>,
    pub drain_apply_batch_max: Option<usize>,
    /// The drain's `RESULT` label (`LOCKSTEP_BENCH_DRAIN_LABEL`); default `lockstep_<replicas>x8` with `_per_item`
    /// and `_<ms>ms` for a mode and a processing time other than the defaults.
    pub drain_label: Option<String>,
    /// Sample where the first replica's pipeline waits ([`crate::measure::Waits`]); the drain section does.
    pub sample_waits: bool,
    /// SQL run in each PostgreSQL schema after lockstep's migrations and before the rows are filled
    /// (`LOCKSTEP_BENCH_SCHEMA_SQL`, a file's path; for experiments with the table's layout, e.g. a fillfactor).
    pub schema_sql: Option<String>,
}

/// How the drain's pipeline is configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainMode {
    /// The default config.
    Batched,
    /// One row per fetch, apply and refetch batching off, a fetch loop per worker: the per-item mode of small
    /// deployments.
    PerItem,
}

impl std::str::FromStr for DrainMode {
    type Err = String;
    fn from_str(s: &str) -> Result<DrainMode, String> {
        match s {
            "batched" => Ok(DrainMode::Batched),
            "per_item" => Ok(DrainMode::PerItem),
            other => Err(format!("{other:?}: batched or per_item")),
        }
    }
}

fn env_opt<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().map(|value| value.parse().unwrap_or_else(|_| panic!("{name}={value:?} does not parse")))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("{name}={value:?} does not parse")),
        Err(_) => default,
    }
}

impl Settings {
    /// From `std::env::args` and the `LOCKSTEP_BENCH_*` variables.
    pub fn from_env() -> Settings {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let smoke = !args.iter().any(|a| a == "--bench");
        let mut sections: Vec<Section> = args
            .iter()
            .filter(|a| !a.starts_with('-'))
            .map(|a| match a.as_str() {
                "pg" => Section::Pg,
                "mem" => Section::Mem,
                "sweep" => Section::Sweep,
                "drain" => Section::Drain,
                other => panic!("unknown section {other:?}: pg, mem, sweep or drain"),
            })
            .collect();
        if sections.is_empty() {
            sections = vec![Section::Pg, Section::Mem, Section::Sweep];
            // The drain is `benches/peers/run.sh`'s; the smoke run keeps it from rotting.
            if smoke {
                sections.push(Section::Drain);
            }
        }
        let database_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string());
        if smoke {
            return Settings {
                smoke,
                sections,
                database_url,
                // No warm-up: the raw clients may finish the smoke's few rows before one would end.
                warmup: Duration::ZERO,
                window: Duration::from_millis(300),
                reps: 1,
                pg_rows: 5_000,
                mem_rows: 20_000,
                drain_rows: 2_000,
                drain_replicas: 1,
                drain_mode: DrainMode::Batched,
                drain_processing: Duration::ZERO,
                drain_fetchers: None,
                drain_applies_in_flight: None,
                drain_fetch_limit_max: None,
                drain_apply_batch_max: None,
                drain_label: None,
                sample_waits: false,
                explain_fetch: true,
                schema_sql: None,
                out_dir: std::env::temp_dir().join(format!("lockstep-bench-smoke-{}", std::process::id())),
            };
        }
        let out_default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches").join("results");
        Settings {
            smoke,
            sections,
            database_url,
            warmup: Duration::from_secs_f64(env_or("LOCKSTEP_BENCH_WARMUP_SECS", 1.0)),
            window: Duration::from_secs_f64(env_or("LOCKSTEP_BENCH_SECS", 3.0)),
            reps: env_or("LOCKSTEP_BENCH_REPS", 3),
            pg_rows: env_or("LOCKSTEP_BENCH_PG_ROWS", 300_000),
            mem_rows: env_or("LOCKSTEP_BENCH_MEM_ROWS", 1_000_000),
            out_dir: std::env::var("LOCKSTEP_BENCH_OUT").map(PathBuf::from).unwrap_or(out_default),
            drain_rows: env_or("LOCKSTEP_BENCH_DRAIN_ROWS", 200_000),
            drain_replicas: env_or("LOCKSTEP_BENCH_DRAIN_REPLICAS", 1),
            drain_mode: env_or("LOCKSTEP_BENCH_DRAIN_MODE", DrainMode::Batched),
            drain_processing: Duration::from_millis(env_or("LOCKSTEP_BENCH_DRAIN_PROCESSING_MS", 0)),
            drain_fetchers: env_opt("LOCKSTEP_BENCH_DRAIN_FETCHERS"),
            drain_applies_in_flight: env_opt("LOCKSTEP_BENCH_DRAIN_APPLIES_IN_FLIGHT"),
            drain_fetch_limit_max: env_opt("LOCKSTEP_BENCH_DRAIN_FETCH_LIMIT_MAX"),
            drain_apply_batch_max: env_opt("LOCKSTEP_BENCH_DRAIN_APPLY_BATCH_MAX"),
            drain_label: std::env::var("LOCKSTEP_BENCH_DRAIN_LABEL").ok(),
            sample_waits: false,
            explain_fetch: env_or("LOCKSTEP_BENCH_EXPLAIN", 0) == 1,
            schema_sql: std::env::var("LOCKSTEP_BENCH_SCHEMA_SQL").ok().map(|path| {
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("LOCKSTEP_BENCH_SCHEMA_SQL {path}: {e}"))
            }),
        }
    }

    /// Whether `section` runs.
    pub fn runs(&self, section: Section) -> bool {
        self.sections.contains(&section)
    }
}
