//! The page the timeline's browser test opens (`tests/timeline_browser.rs`, normal build) is the simulator's:
//! this test runs the planted failure `tests/fixtures/timeline-planted.toml` under its first seed, renders its
//! timeline and compares it with `tests/fixtures/timeline-planted.html`, byte for byte (the page is a function of
//! the trace and the run: no wall time, no build id). When the engine, the scenario model or the page itself
//! changes, it fails naming the command that rewrites the file: `LOCKSTEP_UPDATE_FIXTURES=1` (or
//! `INSTA_UPDATE=always`, which regenerates the snapshots too), never under `CI=true`.
#![cfg(madsim)]

use lockstep::sim::{self, ScenarioFile, timeline};
use std::path::PathBuf;

const FIXTURE: &str = "tests/fixtures/timeline-planted";

fn update_requested() -> bool {
    let set = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v == value);
    (set("LOCKSTEP_UPDATE_FIXTURES", "1") || set("INSTA_UPDATE", "always")) && !set("CI", "true")
}

#[test]
fn the_browser_tests_page_is_the_simulators_page_of_the_planted_failure() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let file = ScenarioFile::load(&root.join(format!("{FIXTURE}.toml"))).unwrap_or_else(|error| panic!("{error}"));
    let seed = file.seeds[0];
    let report = sim::run(&file.scenario, seed);
    let failed: Vec<&str> = report.violations.iter().map(|violation| violation.checker).collect();
    assert_eq!(failed, ["gang_ranks_together"], "the planted failure moved: {:?}", report.violations);
    let title = format!("{FIXTURE}.toml ({}), seed {seed}", file.version_label());
    let page = timeline::html_of_run(&title, &file.scenario, &report);
    let path = root.join(format!("{FIXTURE}.html"));
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == page {
        return;
    }
    if update_requested() {
        std::fs::write(&path, &page).expect("write the fixture");
        return;
    }
    panic!(
        "{} is not the page the simulator writes today (the engine, the scenario model or the page changed): \
         rewrite it with `LOCKSTEP_UPDATE_FIXTURES=1 env -u RUSTFLAGS cargo sim-test --test all sim_timeline::`, \
         review the diff and run `cargo test --test all timeline_browser::`",
        path.display()
    );
}
