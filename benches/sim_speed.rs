//! How fast the simulator runs the whole system (DESIGN §5): the 3-replica, 10 000-row mixed-fault world of
//! about 10 simulated minutes (`Scenario::mixed_large`), seed after seed on one thread, then the CI sweep's small
//! mixed world, then the gang world of `tests/sim_gang.rs` (`Scenario::gang_mixed`). Prints simulated seconds per
//! wall second and seeds per minute.
//!
//! Run (release, simulator build): `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`.
//! `LOCKSTEP_BENCH_SEEDS` sets how many large seeds run (default 5). `LOCKSTEP_BENCH_HASHES=1` also prints every
//! seed's trace identity (`sim::replay::trace_identity`: FNV-1a of the trace text, and its length in events), so
//! that binaries of two commits can be compared seed by seed: same hash, same trace. `LOCKSTEP_BENCH_WORLDS` (names
//! separated by commas, e.g. `mixed-large`) runs only those worlds (for a profiler).
//! Without `--bench` (as `cargo test --all-targets` runs every bench) and in the normal build it only says so.

/// The allocator: mimalloc, as the `lockstep` binary uses (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: lockstep::alloc::Mimalloc = lockstep::alloc::Mimalloc;

#[cfg(madsim)]
fn main() {
    use lockstep::sim::{self, RunReport, Scenario};

    if !std::env::args().any(|arg| arg == "--bench") {
        println!("sim_speed: a benchmark; run `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`");
        return;
    }
    let seeds: u64 = std::env::var("LOCKSTEP_BENCH_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(5);
    let hashes = std::env::var("LOCKSTEP_BENCH_HASHES").is_ok_and(|value| value == "1");
    let worlds = std::env::var("LOCKSTEP_BENCH_WORLDS").ok();
    let runs = |name: &str| worlds.as_deref().is_none_or(|worlds| worlds.split(',').any(|world| world == name));
    let measure = |scenario: &Scenario, what: &str, seeds: &[u64], verbose: bool| -> Vec<RunReport> {
        if !runs(&scenario.name) {
            return Vec::new();
        }
        println!("sim_speed: {} ({what}), one thread:", scenario.name);
        let reports: Vec<RunReport> = seeds
            .iter()
            .map(|&seed| {
                let report = sim::run(scenario, seed);
                assert!(report.passed(), "{}", sim::run::summary(&report));
                if hashes {
                    let identity = sim::replay::trace_identity(&report);
                    println!("  hash {} seed {seed}: {} events, {}", scenario.name, identity.events, identity.hash);
                }
                if verbose {
                    println!(
                        "  seed {seed}: {} rows, {} commits, {:.0} simulated s in {:.2} wall s ({:.0}x)",
                        report.rows,
                        report.commits,
                        report.simulated.as_secs_f64(),
                        report.wall.as_secs_f64(),
                        report.simulated.as_secs_f64() / report.wall.as_secs_f64()
                    );
                }
                report.slim()
            })
            .collect();
        let simulated: f64 = reports.iter().map(|r| r.simulated.as_secs_f64()).sum();
        let wall: f64 = reports.iter().map(|r| r.wall.as_secs_f64()).sum();
        println!(
            "  {}: {} seeds, {:.0} simulated s per wall s, {:.1} seeds/min on one thread",
            scenario.name,
            reports.len(),
            simulated / wall,
            reports.len() as f64 * 60.0 / wall
        );
        reports
    };
    let large = "3 replicas, 10 000 rows, every fault";
    measure(&Scenario::mixed_large(), large, &(1..=seeds).collect::<Vec<_>>(), true);
    measure(&Scenario::mixed(), "the CI sweep's world", &(1..=100).collect::<Vec<_>>(), false);
    let gang = "replicas, agents, gang operations, every fault incl. agent faults";
    measure(&Scenario::gang_mixed(), gang, &(1..=20).collect::<Vec<_>>(), false);
}

#[cfg(not(madsim))]
fn main() {
    println!("sim_speed measures the simulator build: run `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`");
}
