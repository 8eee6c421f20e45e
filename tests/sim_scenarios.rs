//! The scenario files of `scenarios/` (DESIGN §5): every one parses, passes its first default seed, and has its
//! run summary pinned by an insta snapshot (`tests/snapshots/all__sim_scenarios__<name>.snap`), so that a change of
//! behaviour shows as a reviewed diff. The summary holds simulated time only (wall time is printed apart by
//! `lockstep sim run`), so it is a function of scenario, seed and build.
//!
//! A new or changed summary fails the test: locally insta writes a `.snap.new` next to the snapshot to review
//! (`cargo insta review`, or `INSTA_UPDATE=always` to accept); under `CI=true` it writes nothing.
#![cfg(madsim)]

use lockstep::sim::{self, RunReport, ScenarioFile, summary};
use std::path::PathBuf;

fn scenario_paths() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scenarios/ exists")
        .map(|entry| entry.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    paths.sort();
    paths
}

fn load_all() -> Vec<ScenarioFile> {
    scenario_paths().iter().map(|path| ScenarioFile::load(path).unwrap_or_else(|error| panic!("{error}"))).collect()
}

/// `scenarios/open/`: worlds the swarm drew that fail today, shrunk, each naming in its header the checker it fails
/// and the issue that owns the fix. They parse, are named after their files, and say how to run them; once one
/// passes, it moves to `scenarios/` and into this file's pinned runs. (Running them here would pin failures.)
#[test]
fn the_open_scenarios_parse_and_name_the_checker_they_fail() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/open");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios/open exists") {
        let path = entry.expect("a readable entry").path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue;
        }
        let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert_eq!(file.scenario.name, stem, "{}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        let header: String = text.lines().take_while(|line| line.starts_with('#')).collect::<Vec<_>>().join("\n");
        assert!(header.contains("Checker ") && header.contains("Fails today"), "{}: {header}", path.display());
        assert!(header.contains(&format!("scenarios/open/{stem}.toml")), "{}: no command", path.display());
        count += 1;
    }
    assert!(count >= 1, "scenarios/open holds no scenario");
}

#[test]
fn every_scenario_file_parses_and_is_named_after_its_file() {
    let paths = scenario_paths();
    assert!(paths.len() >= 12, "scenarios/ holds {} files", paths.len());
    let gang = load_all().into_iter().filter(|file| file.scenario.gang.is_some()).count();
    assert!(gang >= 8, "scenarios/ holds {gang} gang scenarios, at least 8 expected");
    for (path, file) in paths.iter().zip(load_all()) {
        let stem = path.file_stem().and_then(|stem| stem.to_str()).expect("a UTF-8 file name");
        assert_eq!(file.scenario.name, stem, "{}: `name` differs from the file name", path.display());
        assert!(file.text.starts_with("# "), "{}: no comment header saying what it exercises", path.display());
    }
}

#[test]
fn every_scenario_passes_its_first_default_seed_with_a_pinned_summary() {
    let files = load_all();
    // Every run on its own OS thread (sim::run starts one per run anyway), all at once.
    let reports: Vec<RunReport> = std::thread::scope(|scope| {
        let runs: Vec<_> = files.iter().map(|file| scope.spawn(|| sim::run(&file.scenario, file.seeds[0]))).collect();
        runs.into_iter().map(|run| run.join().expect("sim::run returns failures as values")).collect()
    });
    for (file, report) in files.iter().zip(&reports) {
        let text = summary::render(report);
        assert!(report.passed(), "{} seed {} failed:\n{text}", file.origin, report.seed);
        insta::assert_snapshot!(file.scenario.name.clone(), text);
    }
}

/// `[faults] pause_inside_pass` (docs/scenarios.md): in some seeds of `gang-paused-replica-stale-tokens` no pause
/// of a replica lands inside one of its passes at its time, so with pauses that land at their time none of the
/// replicas' writes comes back stale and the scenario's expectation fails; with the file as it is, in such a seed
/// each pause waits until replica 0 works inside a pass, says where it landed, and the pass's next guarded write
/// is refused for its superseded token. Which seeds miss every pass depends on the run's timing (seed 259, then
/// 57, 88 and 44 were the first until a change of the engine's or the simulator's timing moved them; about one
/// seed in twenty does), so the test takes the first of [`PAUSE_SEEDS_SEARCHED`] rather than pinning one.
#[test]
fn a_pause_inside_a_pass_waits_for_the_replica_to_hold_a_lease_past_its_related_locks() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/gang-paused-replica-stale-tokens.toml");
    let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
    assert!(file.scenario.faults.pause_inside_pass.is_some());
    let mut at_its_time = file.scenario.clone();
    at_its_time.faults.pause_inside_pass = None;
    let misses_every_pass = |seed: u64| {
        let report = sim::run(&at_its_time, seed);
        report.violations.iter().any(|violation| format!("{violation:?}").contains("held=false"))
    };
    let seed = (1..=PAUSE_SEEDS_SEARCHED).find(|seed| misses_every_pass(*seed)).unwrap_or_else(|| {
        panic!("pauses at their time land inside a pass in each of the first {PAUSE_SEEDS_SEARCHED} seeds")
    });
    let report = sim::run(&file.scenario, seed);
    let text = report.trace_text();
    assert!(report.passed(), "seed {seed}: {}", summary::render(&report));
    let pauses: Vec<&str> = text.lines().filter(|line| line.split_whitespace().nth(2) == Some("pause")).collect();
    assert!(!pauses.is_empty(), "seed {seed}: {text}");
    assert!(
        pauses.iter().all(|line| line.contains(" inside-pass=") && !line.contains("inside-pass=none")),
        "seed {seed}: {pauses:?}"
    );
}

/// How many seeds [`a_pause_inside_a_pass_waits_for_the_replica_to_hold_a_lease_past_its_related_locks`] tries.
const PAUSE_SEEDS_SEARCHED: u64 = 200;

/// `rows-hot-row` (every claim locks one shared counter) passes its seeds, and with the waitlist gone (`[mutation]
/// waitlist_disabled`: a replica's claims meet only in the store, as before it) each waiting claim is reset once
/// per turn and waits `retry_delay` each time: the starvation checker fires on the same seeds. The slowness a new
/// user's trial measured outside the simulator (60 claims of 20 ms in 40 s on four workers).
#[test]
fn hot_row_claims_starve_without_the_waitlist_and_pass_with_it() {
    let starves = ("starvation", "contended");
    passes_and_fails_when_mutated("scenarios/rows-hot-row.toml", "the waitlist", starves, |m| {
        m.waitlist_disabled = true
    });
}

/// `rows-shared-pairs` (claims of one pipeline that each lock two of four shared counters, in a random order)
/// passes its seeds, and with related locks' age rule gone (`[mutation] related_age_rule_disabled`: every other
/// owner's fresh intent mark holds a row off, as before the rule) its claims hold each other off in cycles of
/// marks: the starvation checker fires on the same seeds. The livelock a new user's trial found outside the
/// simulator, which no scenario could show while every claim locked one row.
/// `rows-shared-two-pipelines` does the same across two claim pipelines (the age rule orders items of any
/// pipeline, a second trial's finding).
#[test]
fn shared_pairs_livelock_without_the_age_rule_and_pass_with_it() {
    for file in ["scenarios/rows-shared-pairs.toml", "scenarios/rows-shared-two-pipelines.toml"] {
        let starves = ("starvation", "contended");
        passes_and_fails_when_mutated(file, "the age rule", starves, |m| m.related_age_rule_disabled = true);
    }
}

/// `rows-retry-wake` (claims that fail their first eight attempts and back off, in a quiet world) passes its
/// seeds, and with the retry wake gone (`[mutation] retry_wake_disabled`: a replica that records a failure leaves
/// the row to its fetcher's empty-fetch backoff, as before the wake) claims are fetched again past their retry:
/// the `retries` checker fires on the same seeds. The lateness a new user's trial measured outside the simulator
/// (a 1 s retry after a handler's panic waited 3.6 s).
#[test]
fn failed_rows_retry_late_without_the_retry_wake_and_pass_with_it() {
    let late = ("retries", "after its retry fell due");
    passes_and_fails_when_mutated("scenarios/rows-retry-wake.toml", "the retry wake", late, |m| {
        m.retry_wake_disabled = true
    });
}

/// `rows-hot-row-backlog` (a backlog of claims on one hot row, two replicas of one claim worker) passes its seeds
/// with a few contended locks, and with the contention backoff gone (`[mutation] contention_backoff_disabled`) the
/// replica that lost the row leases and resets claim after claim: thousands of contended locks, past the file's
/// trace expectation (checker `expect`). What the in-process drain of `tests/engine.rs` measured outside the
/// simulator (600 claims: 26.4 s and 8 406 resets on two replicas against 12.0 s on one).
#[test]
fn a_hot_row_backlog_churns_without_the_contention_backoff_and_passes_with_it() {
    let churn = ("expect", "Contended");
    passes_and_fails_when_mutated("scenarios/rows-hot-row-backlog.toml", "the contention backoff", churn, |m| {
        m.contention_backoff_disabled = true
    });
}

/// `rows-hot-row` with parked waiters (every claim locks one shared counter; a contended claim parks in its replica
/// with its lease) passes its seeds, and with the holder's wake gone (`[mutation] park_wake_disabled`: a parked
/// claim is woken only when the lock it met expires, as if the releasing write had not told it) each waiting claim
/// waits out the holder's lease at every hand-over: the starvation checker fires on the same seeds.
#[test]
fn parked_claims_starve_without_the_holders_wake_and_pass_with_it() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/rows-hot-row.toml");
    let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
    let mut parked = file.scenario.clone();
    parked.workload.park_waiters = true;
    let mut mutated = parked.clone();
    mutated.mutation.park_wake_disabled = true;
    for &seed in &file.seeds {
        let report = sim::run(&parked, seed);
        assert!(report.passed(), "seed {seed} failed:\n{}", summary::render(&report));
        let report = sim::run(&mutated, seed);
        let violation = report.violations.iter().find(|v| v.checker == "starvation");
        let violation = violation.unwrap_or_else(|| panic!("seed {seed}: checker starvation silent without the wake"));
        assert!(violation.message.contains("contended"), "{violation}");
    }
}

/// The scenario `file` passes its seeds, and with `mutate` applied to its mutation (`without` names what it takes
/// away) the checker `fires.0` fires on the same seeds, its message holding `fires.1`.
fn passes_and_fails_when_mutated(file: &str, without: &str, fires: (&str, &str), mutate: impl Fn(&mut sim::Mutation)) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    let file = ScenarioFile::load(&path).unwrap_or_else(|error| panic!("{error}"));
    let mut mutated = file.scenario.clone();
    mutate(&mut mutated.mutation);
    for &seed in &file.seeds {
        let report = sim::run(&file.scenario, seed);
        assert!(report.passed(), "seed {seed} failed:\n{}", summary::render(&report));
        let report = sim::run(&mutated, seed);
        let (checker, fragment) = fires;
        let violation = report.violations.iter().find(|v| v.checker == checker);
        let violation = violation.unwrap_or_else(|| panic!("seed {seed}: checker {checker} silent without {without}"));
        assert!(violation.message.contains(fragment), "{violation}");
    }
}
