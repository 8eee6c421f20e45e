//! Pipeline throughput benchmarks (BENCHMARKS.md): lockstep's items per second for a pipeline whose processing is
//! trivial, through the whole protocol, side by side in one run with the raw SQL limit on the same PostgreSQL, and
//! the same on MemStore; then throughput against workers, drawn as a PNG.
//!
//! ```text
//! cargo bench --bench pipeline                 # everything (about 12 minutes on the 2-core machines)
//! cargo bench --bench pipeline -- pg mem       # only the side-by-side tables (sections: pg, mem, sweep)
//! cargo bench --bench pipeline -- drain        # one drain of pre-filled rows, as benches/peers/run.sh runs it
//! ```
//!
//! Environment: `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`; each measurement makes a
//! schema of its own and drops it), `LOCKSTEP_BENCH_SECS` (window of each point, default 3),
//! `LOCKSTEP_BENCH_WARMUP_SECS` (default 1), `LOCKSTEP_BENCH_REPS` (repetitions of the tables, default 3),
//! `LOCKSTEP_BENCH_PG_ROWS`, `LOCKSTEP_BENCH_MEM_ROWS`, `LOCKSTEP_BENCH_OUT` (default `benches/results`);
//! for the drain `LOCKSTEP_BENCH_DRAIN_ROWS` (200 000), `LOCKSTEP_BENCH_DRAIN_REPLICAS` (1),
//! `LOCKSTEP_BENCH_DRAIN_MODE` (`batched` or `per_item`), `LOCKSTEP_BENCH_DRAIN_PROCESSING_MS` (0),
//! `LOCKSTEP_BENCH_DRAIN_FETCHERS`, `LOCKSTEP_BENCH_DRAIN_APPLIES_IN_FLIGHT`, `LOCKSTEP_BENCH_DRAIN_FETCH_LIMIT_MAX`
//! and `LOCKSTEP_BENCH_DRAIN_APPLY_BATCH_MAX` (overrides of the config),
//! `LOCKSTEP_BENCH_DRAIN_LABEL` (the `RESULT` line's label), `LOCKSTEP_BENCH_EXPLAIN=1` to print the fetch's
//! `EXPLAIN (ANALYZE, BUFFERS)` half-way and the index reads, and `LOCKSTEP_BENCH_SCHEMA_SQL` (a file of SQL run in
//! each schema after the migrations, before the rows are filled: experiments with the table's layout).
//!
//! Without `--bench`, which is how `cargo test --all-targets` runs a bench target, it is a smoke run of a few
//! seconds with tiny sizes that writes to a temporary directory: the code cannot rot, and the tests never pay for
//! the measurement. The simulator build has nothing to run here (PostgreSQL and real time only).

/// The allocator: mimalloc, as the `lockstep` binary uses (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: lockstep::alloc::Mimalloc = lockstep::alloc::Mimalloc;

#[cfg(not(madsim))]
mod measure;
#[cfg(not(madsim))]
mod mem;
#[cfg(not(madsim))]
mod pg;
#[cfg(not(madsim))]
mod plot;
#[cfg(not(madsim))]
mod raw_sql;
#[cfg(not(madsim))]
mod report;
#[cfg(not(madsim))]
mod run;
#[cfg(not(madsim))]
mod settings;

#[cfg(not(madsim))]
fn main() {
    let settings = settings::Settings::from_env();
    // Two runtime threads: the machines have two cores, shared with PostgreSQL.
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    runtime.block_on(run::run(settings));
}

#[cfg(madsim)]
fn main() {}
