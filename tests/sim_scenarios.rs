//! The scenario files of `scenarios/` (DESIGN §5): every one parses, passes its first default seed, and has its
//! run summary pinned by an insta snapshot (`tests/snapshots/sim_scenarios__<name>.snap`), so that a change of
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

#[test]
fn every_scenario_file_parses_and_is_named_after_its_file() {
    let paths = scenario_paths();
    assert!(paths.len() >= 12, "scenarios/ holds {} files", paths.len());
    let gang = load_all().into_iter().filter(|file| file.scenario.gang.is_some()).count();
    assert!(gang >= 8, "scenarios/ holds {gang} gang scenarios, issue 6 asks for at least 8");
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
