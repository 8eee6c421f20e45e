//! Fault kinds the swarm draws besides those of the fault table's first rows: a hint channel that dies silently and
//! comes back (`hint-loss`), and a replica that crashes each time it starts (`crash-loop`). Each does what its row
//! in docs/scenarios.md says, the checkers hold, and the shrinker can write it back.
#![cfg(madsim)]

use lockstep::sim::{self, RunReport, ScenarioFile};
use std::time::Duration;

fn run(text: &str, seed: u64) -> RunReport {
    let file = ScenarioFile::parse(text, "t.toml").unwrap_or_else(|error| panic!("{error}"));
    sim::run(&file.scenario, seed)
}

/// Fetches of the claims pipeline by replica-0 that commit within 50 ms after a hint of a claim, and hints, in
/// `window` (simulated seconds).
fn hinted_fetches(report: &RunReport, window: std::ops::Range<f64>) -> (usize, usize) {
    let commits: Vec<(f64, String)> = report
        .trace
        .iter()
        .filter(|event| event.kind == "commit" && window.contains(&event.at.as_secs_f64()))
        .map(|event| (event.at.as_secs_f64(), format!("{} {}", event.node, event.fields.text())))
        .collect();
    let hints: Vec<f64> = commits.iter().filter(|(_, text)| text.contains("hint claim-0")).map(|(at, _)| *at).collect();
    let answered = hints
        .iter()
        .filter(|&&hint| {
            commits.iter().any(|(at, text)| {
                *at >= hint && *at < hint + 0.05 && text.starts_with("replica-0") && text.contains("fetch claims-0")
            })
        })
        .count();
    (answered, hints.len())
}

const HINT_LOSS: &str = r#"
name = "hint-loss"
version = 1

[topology]
replicas = 1

[workload]
span = "60s"
jobs_per_minute = 0.0
claims_per_minute = 60.0
claim_pipelines = 1

[faults]
until = "60s"

[[faults.at]]
at = "20s"
kind = "hint-loss"
replica = 0
span = "30s"
"#;

/// While the hint channel is dead the replica's fetcher hears no hint: a claim inserted then waits for a poll, where
/// before and after the loss its fetch follows the insert's hint within 50 ms. Every row still ends (polling), and
/// the trace names the loss and its end.
#[test]
fn a_dead_hint_channel_leaves_fetchers_to_their_polls_and_comes_back() {
    for seed in sim::seeds(&[1, 2, 3]) {
        let report = run(HINT_LOSS, seed);
        assert!(report.passed(), "seed {seed}: {}", sim::run::summary(&report));
        let (during, hints_during) = hinted_fetches(&report, 21.0..49.0);
        let (outside, hints_outside) = hinted_fetches(&report, 1.0..19.0);
        assert!(
            hints_during >= 5 && hints_outside >= 5,
            "seed {seed}: too few claims ({hints_during}, {hints_outside})"
        );
        assert!(
            outside * 10 >= hints_outside * 8,
            "seed {seed}: before the loss only {outside} of {hints_outside} hints were answered at once"
        );
        assert!(
            during * 10 <= hints_during * 3,
            "seed {seed}: during the loss {during} of {hints_during} hints were answered at once: the channel lived"
        );
        let kinds: Vec<&str> = report.trace.iter().map(|event| event.kind).collect();
        assert!(kinds.contains(&"hint-loss") && kinds.contains(&"hint-loss-end"), "seed {seed}: no loss traced");
        let (after, hints_after) = hinted_fetches(&report, 52.0..60.0);
        assert!(hints_after == 0 || after * 10 >= hints_after * 8, "seed {seed}: the channel did not come back");
    }
}

const CRASH_LOOP: &str = r#"
name = "crash-loop"
version = 1

[topology]
replicas = 2

[workload]
span = "60s"

[faults]
until = "60s"

[[faults.at]]
at = "10s"
kind = "crash-loop"
replica = 0
span = "25s"
"#;

/// A replica in a crash loop starts again and again and holds nothing for long: the other replica does the work,
/// every checker holds, and the replica runs for good once the loop ends.
#[test]
fn a_replica_in_a_crash_loop_restarts_again_and_again_and_the_other_does_the_work() {
    for seed in sim::seeds(&[1, 2]) {
        let report = run(CRASH_LOOP, seed);
        assert!(report.passed(), "seed {seed}: {}", sim::run::summary(&report));
        let starts = report
            .trace
            .iter()
            .filter(|event| &*event.node == "replica-0" && event.kind == "start")
            .filter(|event| (10.0..35.0).contains(&event.at.as_secs_f64()))
            .count();
        assert!(starts >= 5, "seed {seed}: replica-0 started {starts} times in the loop");
        let end = report.trace.iter().find(|event| event.kind == "crash-loop-end").expect("the loop ends");
        assert!(end.at >= Duration::from_secs(35), "seed {seed}: the loop ended at {:?}", end.at);
        let after = report
            .trace
            .iter()
            .filter(|event| &*event.node == "replica-0" && event.kind == "commit" && event.at > end.at)
            .count();
        assert!(after > 0, "seed {seed}: replica-0 did nothing after the loop");
    }
}

/// The faults' rows in a scenario file are read at their keys, and a kind's field it does not take is refused.
#[test]
fn hint_loss_and_crash_loop_are_read_at_their_keys() {
    use lockstep::sim::Fault;
    let file = ScenarioFile::parse(HINT_LOSS, "t.toml").unwrap();
    assert_eq!(file.scenario.faults.fixed[0].fault, Fault::HintLoss { replica: 0, span: Duration::from_secs(30) });
    let file = ScenarioFile::parse(CRASH_LOOP, "t.toml").unwrap();
    assert_eq!(file.scenario.faults.fixed[0].fault, Fault::CrashLoop { replica: 0, span: Duration::from_secs(25) });
    let wrong = CRASH_LOOP.replace("replica = 0", "replica = 2");
    let error = ScenarioFile::parse(&wrong, "t.toml").unwrap_err().to_string();
    assert!(error.contains("faults.at[0].replica: replica 2 does not exist"), "{error}");
    let extra = HINT_LOSS.replace("span = \"30s\"", "span = \"30s\"\nagent = 1");
    let error = ScenarioFile::parse(&extra, "t.toml").unwrap_err().to_string();
    assert!(error.contains("takes no `agent`"), "{error}");
}
