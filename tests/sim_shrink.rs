//! Shrinking a failure (`lockstep sim shrink`, `sim/shrink.rs`): planted failures shrink to a handful of faults
//! and rows that still fail the same checker, whatever the number of threads, and a passing scenario is
//! refused. (`tests/sim_cli.rs` shrinks a replay file through the binary.)
#![cfg(madsim)]

use lockstep::sim::scenario_file::PipelineSets;
use lockstep::sim::shrink::{self, Input, Options, ShrinkError, Shrunk, Target};
use lockstep::sim::{self, ScenarioFile};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `scenarios/rows-paused-replica.toml` with the apply guard off: the paused replica's late applies take effect
/// under superseded tokens (lease_exclusivity), beside a clock-drift fault that has nothing to do with it.
fn guard_off() -> String {
    let text = std::fs::read_to_string(root().join("scenarios/rows-paused-replica.toml")).unwrap();
    text.replace("name = \"rows-paused-replica\"", "name = \"guard-off\"")
        + "\n[mutation]\napply_guard_disabled = true\n"
}

fn shrunk(text: &str, seed: u64, jobs: usize) -> Result<Shrunk, ShrinkError> {
    let (specs, sets) = (BTreeMap::new(), PipelineSets::new());
    let input = Input {
        text,
        spec_files: &specs,
        origin: "planted.toml",
        seed,
        sets: &sets,
        checker: None,
        invocation: "env -u RUSTFLAGS cargo sim",
        out: Path::new("shrunk"),
    };
    let options = Options { jobs, time_bound: Duration::from_secs(600), other_seeds: 0 };
    shrink::shrink(&input, options, &|_| {})
}

/// The shrunk text, parsed and run again under its seed: it fails `checker`.
fn assert_fails(shrunk: &Shrunk, checker: &str) {
    let file = ScenarioFile::parse(&shrunk.text, "shrunk.toml").unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(file.seeds, [shrunk.seed], "the file's seed is the failing one");
    let report = sim::run(&file.scenario, shrunk.seed);
    assert!(report.violated(checker), "the shrunk scenario passes {checker}:\n{}", shrunk.text);
}

#[test]
fn the_apply_guard_off_shrinks_to_one_fault_and_a_handful_of_rows() {
    // A seed whose shrink drops replicas too. What a shrink keeps depends on the run's timing: seed 2 was the one
    // from the simulated network once, until the hints went into the applies (its shrink then kept 10
    // rows), seed 4 until the client inserted a job with its tasks in one call; seed 1 until the store calls
    // PgStore runs as two steps became two calls (its shrink then kept every replica); seed 2 is again.
    let seed = 2;
    let text = guard_off();
    let shrunk = shrunk(&text, seed, 2).unwrap();
    assert_eq!(shrunk.target, Target::Checker("lease_exclusivity".into()));
    assert!(shrunk.complete, "stopped by the time bound:\n{}", shrunk.text);
    assert_eq!((shrunk.original.faults, shrunk.size.faults), (2, 1), "{}", shrunk.text);
    assert!(shrunk.original.rows > 100 && shrunk.size.rows <= 8, "{:?} → {:?}", shrunk.original, shrunk.size);
    assert!(shrunk.size.replicas < shrunk.original.replicas, "{}", shrunk.text);
    assert!(shrunk.text.contains("kind = \"pause\""), "the pause is the cause:\n{}", shrunk.text);
    assert!(!shrunk.text.contains("clock-drift\""), "the drift is not:\n{}", shrunk.text);
    assert!(
        shrunk.text.starts_with(&format!(
            "# Shrunk by `env -u RUSTFLAGS cargo sim shrink` from planted.toml (scenario guard-off, seed {seed}), \
             which fails checker lease_exclusivity.\n\
             # This scenario fails checker lease_exclusivity too, under seed {seed}: `env -u RUSTFLAGS cargo sim run \
             shrunk/guard-off-shrunk.toml --seed {seed}`.\n"
        )),
        "{}",
        shrunk.text
    );
    assert!(shrunk.text.contains("name = \"guard-off-shrunk\""), "{}", shrunk.text);
    for (index, step) in shrunk.steps.iter().enumerate() {
        assert!(shrunk.text.contains(&format!("#  {}. {}\n", index + 1, step.what)), "{}", shrunk.text);
    }
    assert_fails(&shrunk, "lease_exclusivity");
}

#[test]
fn a_gang_mutation_sheds_every_fault_and_the_row_workload_whatever_the_threads() {
    let text = std::fs::read_to_string(root().join("tests/fixtures/timeline-planted.toml")).unwrap();
    let shrunk = shrunk(&text, 1, 2).unwrap();
    assert_eq!(shrunk.target, Target::Checker("gang_ranks_together".into()));
    assert!(shrunk.complete);
    assert_eq!((shrunk.original.faults, shrunk.size.faults), (3, 0), "{}", shrunk.text);
    assert!(!shrunk.text.contains("[workload]"), "{}", shrunk.text);
    assert!(shrunk.size.rows <= 20 && shrunk.size.rows < shrunk.original.rows, "{:?}", shrunk.size);
    assert!(shrunk.text.contains("gang_gate_disabled = true"), "{}", shrunk.text);
    assert_fails(&shrunk, "gang_ranks_together");
    // The same search on one thread: the same steps and file (a step takes the first failing candidate in
    // order, never the first to finish).
    let alone = self::shrunk(&text, 1, 1).unwrap();
    assert_eq!(alone.text, shrunk.text);
}

#[test]
fn a_passing_scenario_or_another_checker_is_refused() {
    let text = std::fs::read_to_string(root().join("scenarios/rows-quiet.toml")).unwrap();
    let error = shrunk(&text, 1, 2).unwrap_err().to_string();
    assert!(
        error.starts_with("scenario rows-quiet passes under seed 1 (every checker ok): there is no failure to shrink"),
        "{error}"
    );
    let (specs, sets) = (BTreeMap::new(), PipelineSets::new());
    let text = guard_off();
    let input = Input {
        text: &text,
        spec_files: &specs,
        origin: "g.toml",
        seed: 1,
        sets: &sets,
        checker: Some("starvation"),
        invocation: "lockstep sim",
        out: Path::new("."),
    };
    let options = Options { jobs: 1, time_bound: Duration::from_secs(60), other_seeds: 0 };
    let error = shrink::shrink(&input, options, &|_| {}).unwrap_err().to_string();
    assert!(
        error.starts_with("--checker starvation: scenario guard-off seed 1 does not fail it; it fails: "),
        "{error}"
    );
    assert!(error.contains("lease_exclusivity"), "{error}");
    // A name no checker has is said to be unknown, with the scenario's checkers, before anything runs.
    let input = Input { checker: Some("nosuch"), ..input };
    let error = shrink::shrink(&input, options, &|_| {}).unwrap_err().to_string();
    assert!(error.starts_with("--checker nosuch: no checker of that name judges this scenario"), "{error}");
    assert!(error.contains("lease_exclusivity, liveness"), "{error}");
}

#[test]
fn counts_in_a_spec_are_halved_in_any_format() {
    assert_eq!(
        shrink::moves::halve_counts("{tasks={w={job_count=4;command=a;gang_options={size=4}}}}").as_deref(),
        Some("{tasks={w={job_count=2;command=a;gang_options={size=2}}}}")
    );
    assert_eq!(shrink::moves::halve_counts(r#"{"job_count": 3}"#).as_deref(), Some(r#"{"job_count": 1}"#));
    assert_eq!(shrink::moves::halve_counts("job_count: 1\n"), None);
    assert_eq!(shrink::moves::format_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(shrink::moves::format_duration(Duration::from_millis(250)), "250ms");
    assert_eq!(shrink::moves::format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(shrink::moves::format_duration(Duration::from_micros(12)), "12us");
}

/// A step says what it sets and the count it compares with, plainly, and counts of one are singular: the rows a
/// step allows beside what the failing run inserted (it said "at most 2 rows (the run inserted 3)"), "1 replica"
/// (it said "1 replicas").
#[test]
fn steps_name_the_limit_they_set_and_the_count_and_say_one_in_the_singular() {
    let table: toml::Table = "[workload]\nrows_max = 10\n[topology]\nreplicas = 2\nagents = 2\n".parse().unwrap();
    let current = shrink::moves::Current {
        table: &table,
        trace: "",
        rows_inserted: 3,
        replicas: 2,
        agents: 2,
        slots: 2,
        keep_expectations: false,
    };
    let steps: Vec<String> = shrink::moves::candidates(&current, "").into_iter().map(|c| c.what).collect();
    for step in [
        "workload.rows_max 1: at most 1 row (the failing run inserted 3)",
        "workload.rows_max 2: at most 2 rows (the failing run inserted 3)",
        "1 replica (was 2)",
        "1 agent (was 2)",
        "1 slot per agent (was 2)",
    ] {
        assert!(steps.iter().any(|s| s == step), "{step:?} not among {steps:#?}");
    }
    let size = shrink::Size { faults: 1, operations: 0, rows: 1, replicas: 1, agents: 2, simulated: Duration::ZERO };
    assert_eq!(size.to_string(), "1 fault, 0 operations, 1 row, 1 replica, 2 agents, 0.0 s simulated");
}

/// Rows are cut by finer fractions before one at a time (a shrink that needed most of 90 rows took a one-row step
/// after another), and no step changes what the run does not use: tasks per job where no jobs are made.
#[test]
fn rows_are_cut_by_eighths_and_sixteenths_and_no_step_touches_tasks_without_jobs() {
    let table: toml::Table = "[workload]\njobs_per_minute = 0\n".parse().unwrap();
    let current = shrink::moves::Current {
        table: &table,
        trace: "",
        rows_inserted: 96,
        replicas: 1,
        agents: 0,
        slots: 1,
        keep_expectations: false,
    };
    let steps: Vec<String> = shrink::moves::candidates(&current, "").into_iter().map(|c| c.what).collect();
    let rows: Vec<&str> = steps.iter().filter(|s| s.starts_with("workload.rows_max")).map(String::as_str).collect();
    let limits: Vec<&str> = rows.iter().map(|s| s.split(':').next().unwrap()).collect();
    let expected = ["rows_max 48", "rows_max 72", "rows_max 84", "rows_max 90", "rows_max 95"];
    assert_eq!(limits, expected.map(|limit| format!("workload.{limit}")), "{steps:#?}");
    assert!(!steps.iter().any(|s| s == "one task per job"), "{steps:#?}");
    let table: toml::Table = "[workload]\njobs_per_minute = 10\n".parse().unwrap();
    let steps: Vec<String> = shrink::moves::candidates(&shrink::moves::Current { table: &table, ..current }, "")
        .into_iter()
        .map(|c| c.what)
        .collect();
    assert!(steps.iter().any(|s| s == "one task per job"), "{steps:#?}");
}
