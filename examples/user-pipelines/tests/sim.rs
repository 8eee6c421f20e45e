//! The orders pipelines under the simulator: 50 seeds of mixed faults hold every invariant, and the planted bug
//! (charges without an idempotency key) is caught by the exactly-once checker on a seed that replays exactly.
//!
//! Run with `env -u RUSTFLAGS cargo sim-test` (the simulator build; see `.cargo/config.toml`).
//! `MADSIM_TEST_NUM=N` runs N seeds; a failing seed prints the command that replays it.
#![cfg(madsim)]

use lockstep::sim::Scenario;
use lockstep::sim::user::{Replay, check_seeds, check_seeds_in, run, run_seeds, seeds};
use user_pipelines::Idempotency;
use user_pipelines::sim::orders;

/// Where a failing seed of test `name` is replayed from (the command it prints names this package and file).
fn replay(name: &'static str) -> Replay {
    Replay { package: env!("CARGO_PKG_NAME"), test: "sim", name }
}

/// 50 seeds, pinned: the default `cargo sim-test` runs exactly these.
fn pinned() -> Vec<u64> {
    (1..=50).collect()
}

#[test]
fn orders_hold_every_invariant_under_mixed_faults() {
    let scenario = Scenario::for_pipelines(orders(Idempotency::On));
    let replay = replay("orders_hold_every_invariant_under_mixed_faults");
    let reports = check_seeds(&scenario, &seeds(&pinned()), replay);
    // The faults did happen: some seed lost a payment reply and retried the line under its key.
    assert!(reports.iter().all(|report| report.client.user_rows > 0), "every seed inserted its orders");
}

/// The same test with the bug planted (charges without their idempotency key): it must fail, naming the
/// exactly-once checker, and print each failing seed with the command that replays it; that command reruns this
/// test on the one seed, which fails the same way. The failing seeds' traces go to a directory of the test's own,
/// removed as the expected panic unwinds.
#[test]
#[should_panic(expected = "external_exactly_once")]
fn orders_without_idempotency_keys_charge_twice() {
    let scenario = Scenario::for_pipelines(orders(Idempotency::Off));
    let replay = replay("orders_without_idempotency_keys_charge_twice");
    let traces = tempfile::tempdir().expect("a temp dir for the traces");
    check_seeds_in(&scenario, &seeds(&pinned()[..20]), replay, traces.path());
}

#[test]
fn a_charge_without_its_idempotency_key_is_caught_and_its_seed_replays_exactly() {
    let scenario = Scenario::for_pipelines(orders(Idempotency::Off));
    let reports = run_seeds(&scenario, &pinned()[..20]);
    let failed = reports.iter().find(|report| !report.passed()).expect("some seed charges a line twice");
    assert!(
        failed.violated("external_exactly_once"),
        "seed {} failed, but not by the exactly-once checker: {:?}",
        failed.seed,
        failed.violations
    );
    // What a failing seed prints: the command that reruns it.
    let replay = replay("orders_without_idempotency_keys_charge_twice");
    let command = replay.command(failed.seed);
    let expected =
        "cargo sim-test -p user-pipelines --test sim -- orders_without_idempotency_keys_charge_twice --exact";
    assert_eq!(command, format!("env -u RUSTFLAGS MADSIM_TEST_SEED={} {expected}", failed.seed));
    // The command runs that seed again (`seeds` returns exactly it): the run is the same, byte for byte.
    let again = run(&scenario, failed.seed);
    assert_eq!(again.violations, failed.violations, "seed {}: another failure on replay", failed.seed);
    assert_eq!(again.trace_text(), failed.trace_text(), "seed {}: the replay's trace differs", failed.seed);
}

/// A fault plan from a scenario file: the one `orders-sim run` takes, with the sets this project registers.
#[test]
fn the_scenario_file_holds_on_its_default_seeds() {
    use lockstep::sim::ScenarioFile;
    use lockstep::sim::scenario_file::PipelineSets;
    let sets = PipelineSets::from([("orders".to_string(), orders(Idempotency::On))]);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/orders-mixed.toml");
    let file = ScenarioFile::load_in(&path, &sets).unwrap_or_else(|error| panic!("{error}"));
    let replay = replay("the_scenario_file_holds_on_its_default_seeds");
    check_seeds(&file.scenario, &seeds(&file.seeds), replay);
}
