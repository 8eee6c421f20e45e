//! Fault kinds the swarm draws besides those of the fault table's first rows: a hint channel that dies silently and
//! comes back (`hint-loss`), a replica that crashes each time it starts (`crash-loop`), and a replica whose
//! monotonic clock steps forwards or backwards (`clock-jump`), row handlers that never return (`handler-hang`), and
//! store calls that get no reply (`store-hang`). Each does what its row
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

/// Two replicas, tasks longer than the lease (each needs its lease renewed), and replica 0's clock stepping by `by`
/// at 15 s; `by` empty: no jump.
fn clock_jump(by: &str) -> String {
    let mut text = String::from(
        r#"
name = "clock-jump"
version = 1

[topology]
replicas = 2

[pipeline]
lease_ttl = "6s"
lease_margin = "1s"

[workload]
span = "40s"
jobs_per_minute = 30.0
claims_per_minute = 0.0
task_process = ["8s", "9s"]
task_slow_chance = 0.0
task_failure_chance = 0.0
"#,
    );
    if !by.is_empty() {
        text.push_str(&format!(
            "\n[faults]\nuntil = \"40s\"\n\n[[faults.at]]\nat = \"15s\"\nkind = \"clock-jump\"\nreplica = 0\nby = \"{by}\"\n"
        ));
    }
    text
}

/// Applies of replica-0 that the guarded apply turned away.
fn stale_applies(report: &RunReport) -> usize {
    report
        .trace
        .iter()
        .filter(|event| &*event.node == "replica-0" && event.kind == "commit")
        .filter(|event| event.fields.text().starts_with("apply ") && event.fields.text().contains(" stale"))
        .count()
}

/// A replica whose clock steps, either way, while it holds leases it must renew loses them: backwards, it believes
/// they run 20 s longer and renews none in time; forwards, it finds them past their local deadlines and gives them
/// up. The other replica takes the rows when the store's leases expire, and the stepped replica's late applies are
/// turned away (stale), where the same world without the jump has none; every checker holds either way. The seeds
/// are ones where a task replica-0 holds at the jump runs past its lease's expiry in the store (in others, the
/// run's timing has every such task end in time, and nothing is stale).
#[test]
fn a_replica_whose_clock_jumps_loses_its_leases_and_its_late_applies_are_stale() {
    for seed in sim::seeds(&[1, 4]) {
        let steady = run(&clock_jump(""), seed);
        assert!(steady.passed(), "seed {seed}: {}", sim::run::summary(&steady));
        assert_eq!(stale_applies(&steady), 0, "seed {seed}: stale applies without a jump");
        for by in ["-20s", "20s"] {
            let report = run(&clock_jump(by), seed);
            assert!(report.passed(), "seed {seed}, jump {by}: {}", sim::run::summary(&report));
            let jumps: Vec<String> = report
                .trace
                .iter()
                .filter(|event| event.kind == "clock-jump")
                .map(|event| format!("{} {}", event.node, event.fields.text()))
                .collect();
            assert_eq!(jumps, [format!("replica-0 by={by}")], "seed {seed}");
            assert!(stale_applies(&report) > 0, "seed {seed}, jump {by}: replica-0 kept its leases");
        }
    }
}

/// A clock jump is read from its `by`, forwards or backwards, and a zero or too long jump is refused naming the rule.
#[test]
fn a_clock_jump_is_read_with_its_direction_and_refused_when_zero_or_too_long() {
    use lockstep::sim::Fault;
    let fault = |by: &str| {
        ScenarioFile::parse(&clock_jump(by), "t.toml").map(|file| file.scenario.faults.fixed[0].fault.clone())
    };
    let back = Duration::from_secs(20);
    assert_eq!(fault("-20s").unwrap(), Fault::ClockJump { replica: 0, by: back, back: true });
    assert_eq!(fault("+20s").unwrap(), Fault::ClockJump { replica: 0, by: back, back: false });
    assert_eq!(fault("-20s").unwrap().to_string(), "clock-jump replica-0 (by -20s)");
    let error = fault("0s").unwrap_err().to_string();
    assert!(error.contains("faults.at[0].by") && error.contains("jumps nowhere"), "{error}");
    let error = fault("-11m").unwrap_err().to_string();
    assert!(error.contains("longer than 600s, the longest clock jump"), "{error}");
    let error = fault("soon").unwrap_err().to_string();
    assert!(error.contains("is not a clock jump"), "{error}");
}

const HANDLER_HANG: &str = r#"
name = "handler-hang"
version = 1

[topology]
replicas = 2

[pipeline]
lease_ttl = "6s"
lease_margin = "1s"
handler_timeout = "5s"

[workload]
span = "40s"
jobs_per_minute = 60.0
claims_per_minute = 30.0
task_process = ["1s", "2s"]
task_slow_chance = 0.0
task_failure_chance = 0.0

[faults]
until = "40s"

[[faults.at]]
at = "10s"
kind = "handler-hang"
replica = 0
span = "15s"
"#;

/// Handlers that never return hold their items only until the pipeline's `handler_timeout`: each hung item's
/// failure is recorded by its replica once the bound passed (the heartbeater renewed its lease until then), it is
/// retried, and every row still ends with every checker holding. Nothing else fails in this world: every recorded
/// failure is replica 0's, from the bound after the hang began to the bound after it ended.
#[test]
fn hung_handlers_are_cut_at_their_handler_timeout_and_their_items_retried() {
    for seed in sim::seeds(&[1, 2]) {
        let report = run(HANDLER_HANG, seed);
        assert!(report.passed(), "seed {seed}: {}", sim::run::summary(&report));
        let at = |kind: &str| {
            let event = report.trace.iter().find(|event| event.kind == kind);
            event.unwrap_or_else(|| panic!("seed {seed}: no {kind}")).at.as_secs_f64()
        };
        let (hang, end) = (at("handler-hang"), at("handler-hang-end"));
        let failures: Vec<(f64, String)> = report
            .trace
            .iter()
            .filter(|event| event.kind == "commit" && event.fields.text().starts_with("failure "))
            .map(|event| (event.at.as_secs_f64(), event.node.to_string()))
            .collect();
        assert!(failures.len() >= 3, "seed {seed}: only {} hung items failed", failures.len());
        for (at, node) in &failures {
            assert_eq!(node, "replica-0", "seed {seed}: a failure outside the hung replica at {at}");
            assert!(
                (hang + 5.0..end + 5.0 + 1.5).contains(at),
                "seed {seed}: a failure at {at:.3} s, outside the hang ({hang:.1}..{end:.1} s) plus its 5 s bound"
            );
        }
    }
}

const STORE_HANG: &str = r#"
name = "store-hang"
version = 1

[topology]
replicas = 2

[network]
latency = ["50ms", "150ms"]
call_timeout = "8s"

[pipeline]
lease_ttl = "6s"
lease_margin = "1s"

[workload]
span = "40s"
jobs_per_minute = 60.0
claims_per_minute = 30.0
task_process = ["1s", "2s"]
task_slow_chance = 0.0
task_failure_chance = 0.0

[faults]
until = "40s"

[[faults.at]]
at = "10s"
kind = "store-hang"
replica = 0
span = "15s"
"#;

/// A hung store (connections gone half-open) loses replica 0's requests before the database: from just after the
/// hang began (a request already on its way may still run, and its reply is lost) to its end the database commits
/// nothing of replica 0;
/// every call the hang reached ends at its 8 s bound with a `call-timeout`, the last ones after the span is over
/// (a call that hung stays hung until its bound); the other replica does replica 0's work once its leases expire
/// (the bound outlasts the 6 s lease, so no hung heartbeat keeps one), and every checker holds.
#[test]
fn a_hung_store_loses_requests_and_ends_every_call_at_its_bound() {
    let mut replies_lost = 0;
    for seed in sim::seeds(&[1, 2]) {
        let report = run(STORE_HANG, seed);
        assert!(report.passed(), "seed {seed}: {}", sim::run::summary(&report));
        let at = |kind: &str| {
            let event = report.trace.iter().find(|event| event.kind == kind);
            event.unwrap_or_else(|| panic!("seed {seed}: no {kind}")).at.as_secs_f64()
        };
        let (hang, end) = (at("store-hang"), at("store-hang-end"));
        let of = |kind: &'static str| {
            report.trace.iter().filter(move |event| event.kind == kind && &*event.node == "replica-0")
        };
        let lost: Vec<(f64, String)> =
            of("store-hang-lost").map(|event| (event.at.as_secs_f64(), event.fields.text().into_owned())).collect();
        assert!(lost.len() >= 10, "seed {seed}: only {} calls reached by the hang", lost.len());
        let commits = of("commit").filter(|event| (hang + 0.5..=end).contains(&event.at.as_secs_f64())).count();
        assert_eq!(commits, 0, "seed {seed}: replica 0 committed during the hang");
        let timeouts: Vec<(f64, String)> =
            of("call-timeout").map(|event| (event.at.as_secs_f64(), event.fields.text().into_owned())).collect();
        for (sent, text) in lost.iter().filter(|(_, text)| text.ends_with("lost=request")) {
            assert!((hang..=end).contains(sent), "seed {seed}: {text} at {sent:.3} s, outside the hang");
            let call = text.trim_start_matches("call=").trim_end_matches(" lost=request");
            let bound = sent + 8.0;
            assert!(
                timeouts.iter().any(|(at, name)| name == call && (at - bound).abs() < 0.002),
                "seed {seed}: {call} sent at {sent:.3} s did not end at its bound"
            );
        }
        replies_lost += lost.iter().filter(|(_, text)| text.ends_with("lost=reply")).count();
        assert!(timeouts.iter().any(|(at, _)| *at > end), "seed {seed}: no call hung past the span");
        let others = report
            .trace
            .iter()
            .filter(|event| event.kind == "commit" && &*event.node == "replica-1")
            .filter(|event| (hang + 6.0..=end).contains(&event.at.as_secs_f64()))
            .filter(|event| event.fields.text().starts_with("apply "))
            .count();
        assert!(others > 0, "seed {seed}: replica 1 applied nothing while replica 0 hung");
    }
    // Calls sent just before the hang (50 to 150 ms each way) ran, and their replies were lost.
    assert!(replies_lost > 0, "no reply was lost after its call ran");
}
