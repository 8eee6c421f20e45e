//! How fast the simulator runs the whole system (DESIGN §5): the 3-replica, 10 000-row mixed-fault world of
//! about 10 simulated minutes (`Scenario::mixed_large`), seed after seed on one thread, then the CI sweep's small
//! mixed world, then the gang world of `tests/sim_gang.rs` (`Scenario::gang_mixed`). Prints simulated seconds per
//! wall second and seeds per minute.
//!
//! Run (release, simulator build): `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`.
//! `LOCKSTEP_BENCH_SEEDS` sets how many large seeds run (default 5).
//! Without `--bench` (as `cargo test --all-targets` runs every bench) and in the normal build it only says so.

#[cfg(madsim)]
fn main() {
    use lockstep::sim::{self, RunReport, Scenario};

    if !std::env::args().any(|arg| arg == "--bench") {
        println!("sim_speed: a benchmark; run `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`");
        return;
    }
    let seeds: u64 = std::env::var("LOCKSTEP_BENCH_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(5);
    let measure = |scenario: &Scenario, seeds: &[u64], verbose: bool| -> Vec<RunReport> {
        let reports: Vec<RunReport> = seeds
            .iter()
            .map(|&seed| {
                let report = sim::run(scenario, seed);
                assert!(report.passed(), "{}", sim::run::summary(&report));
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
    println!("sim_speed: {} (3 replicas, 10 000 rows, every fault), one thread:", Scenario::mixed_large().name);
    measure(&Scenario::mixed_large(), &(1..=seeds).collect::<Vec<_>>(), true);
    println!("sim_speed: {} (the CI sweep's world), one thread:", Scenario::mixed().name);
    measure(&Scenario::mixed(), &(1..=100).collect::<Vec<_>>(), false);
    let gang = Scenario::gang_mixed();
    println!(
        "sim_speed: {} (replicas, agents, gang operations, every fault incl. agent faults), one thread:",
        gang.name
    );
    measure(&gang, &(1..=20).collect::<Vec<_>>(), false);
}

#[cfg(not(madsim))]
fn main() {
    println!("sim_speed measures the simulator build: run `env -u RUSTFLAGS cargo sim-bench --bench sim_speed`");
}
