//! The CI sweep (DESIGN §5): at least 200 seeds of the mixed-fault scenario (3 replicas, about 200 rows in 60 s,
//! every fault process at once), every checker on every seed. About 35 s on two idle cores in a debug build
//! (60–140 s measured while other builds ran).
//!
//! `MADSIM_TEST_NUM=N` sweeps N seeds instead (from `MADSIM_TEST_SEED`, or 1); a failing seed prints the command
//! that replays it alone.
#![cfg(madsim)]

use lockstep::sim::{self, Replay, Scenario};

/// Seeds of the CI sweep.
const SWEEP_SEEDS: u64 = 200;

#[test]
fn mixed_faults_hold_over_200_seeds() {
    let seeds = sim::seeds(&(1..=SWEEP_SEEDS).collect::<Vec<_>>());
    let started = std::time::Instant::now();
    let reports = sim::check_seeds(
        &Scenario::mixed(),
        &seeds,
        Replay { package: env!("CARGO_PKG_NAME"), test: "sim_sweep", name: "mixed_faults_hold_over_200_seeds" },
    );
    let wall = started.elapsed().as_secs_f64();
    let simulated: f64 = reports.iter().map(|report| report.simulated.as_secs_f64()).sum();
    let rows: usize = reports.iter().map(|report| report.rows).sum();
    eprintln!(
        "sweep: {} seeds, {rows} rows, {simulated:.0} simulated s in {wall:.1} wall s on {} threads ({:.0} seeds/min)",
        reports.len(),
        sim::run::jobs(),
        reports.len() as f64 * 60.0 / wall
    );
    assert_eq!(reports.len(), seeds.len());
}
