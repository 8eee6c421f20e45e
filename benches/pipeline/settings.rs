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
                other => panic!("unknown section {other:?}: pg, mem or sweep"),
            })
            .collect();
        if sections.is_empty() {
            sections = vec![Section::Pg, Section::Mem, Section::Sweep];
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
        }
    }

    /// Whether `section` runs.
    pub fn runs(&self, section: Section) -> bool {
        self.sections.contains(&section)
    }
}
