//! The whole system under the simulator (DESIGN §5): a database node serving MemStore over simulated RPC, three
//! replicas running the workload's pipelines, a client, faults, and the checkers of `sim/checkers`.
//!
//! Every test runs pinned seeds by default; `MADSIM_TEST_NUM=N` runs N seeds instead, and `MADSIM_TEST_SEED=S`
//! alone replays seed S. A failing seed prints its checker, the tail of its trace, the trace file and the exact
//! command that replays it. The checkers' planted-bug tests live next to each checker (`sim/checkers/*.rs`).
#![cfg(madsim)]

use lockstep::sim::coverage::Coverage;
use lockstep::sim::scenario::small_workload;
use lockstep::sim::{self, Fault, FaultEvent, Replay, RunReport, Scenario, Target};
use std::time::Duration;

/// Seeds every multi-seed test runs by default (pinned: shared/notes/madsim.md pitfall 4).
const DEFAULT_SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

fn replay(name: &'static str) -> Replay {
    Replay { package: env!("CARGO_PKG_NAME"), test: "sim_world", name }
}

/// Runs one directed run per seed and fails with the usual report if a checker fired.
fn check_directed(
    scenario: &Scenario,
    seeds: &[u64],
    name: &'static str,
    script: fn() -> sim::Script,
) -> Vec<RunReport> {
    seeds
        .iter()
        .map(|&seed| {
            let report = sim::run_with(scenario, seed, Some(script()));
            assert!(report.passed(), "{}", sim::run::failure_text(&report, replay(name)));
            report
        })
        .collect()
}

/// Trace lines of `node` whose kind is `kind` and whose fields start with `fields`.
fn trace_count(report: &RunReport, node: &str, kind: &str, fields: &str) -> usize {
    report
        .trace
        .iter()
        .filter(|event| &*event.node == node && event.kind == kind && event.fields.text().starts_with(fields))
        .count()
}

/// The mixed scenario with buggify on for the first 40 s, so that madsim's RNG is exercised too.
fn mixed_with_buggify() -> Scenario {
    let mut scenario = Scenario::mixed();
    scenario
        .faults
        .fixed
        .push(FaultEvent { at: Duration::ZERO, fault: Fault::Buggify { span: Duration::from_secs(40) } });
    scenario
}

#[test]
fn same_seed_gives_a_byte_identical_trace() {
    let scenario = mixed_with_buggify();
    for seed in sim::seeds(&[1]) {
        let first = sim::run(&scenario, seed);
        let second = sim::run(&scenario, seed);
        let (first, second) = (first.trace_text(), second.trace_text());
        assert!(first.lines().count() > 1_000, "seed {seed}: trace too short to mean anything:\n{first}");
        if first != second {
            let (index, (a, b)) = first
                .lines()
                .zip(second.lines())
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .unwrap_or((first.lines().count().min(second.lines().count()), ("<end>", "<end>")));
            panic!(
                "seed {seed}: traces diverge at line {index}:\n  first:  {a}\n  second: {b}\nreplay: {}",
                replay("same_seed_gives_a_byte_identical_trace").command(seed)
            );
        }
    }
}

#[test]
fn different_seeds_give_different_traces() {
    let scenario = Scenario::mixed();
    let one = sim::run(&scenario, 11).trace_text();
    let other = sim::run(&scenario, 12).trace_text();
    assert_ne!(one, other, "seeds 11 and 12 gave the same trace: the seed does not reach the world");
}

/// The paths the mixed scenario exists to reach; if a sweep never reaches one, its checkers hold vacuously.
const MIXED_PATHS: [&str; 20] = [
    "kill",
    "pause",
    "partition",
    "isolate",
    "degrade",
    "db-lost-replies",
    "db-kill",
    "clock-drift",
    "contention",
    "buggify",
    "call-timeout",
    "reply-dropped",
    "stale-apply",
    "takeover",
    "reset",
    "contended",
    "locked",
    "applied",
    "restart",
    "drained",
];

#[test]
fn mixed_faults_hold_every_invariant() {
    let scenario = Scenario::mixed();
    let reports = sim::check_seeds(&scenario, &sim::seeds(&DEFAULT_SEEDS), replay("mixed_faults_hold_every_invariant"));
    let mut coverage = Coverage::default();
    for report in &reports {
        coverage.add(&report.coverage);
        assert_eq!(report.rows, report.keyed_rows, "seed {}: rows lost or duplicated", report.seed);
    }
    if reports.len() >= DEFAULT_SEEDS.len() {
        let missing = coverage.missing(&MIXED_PATHS);
        assert!(missing.is_empty(), "no seed reached {missing:?}: {coverage}");
    }
}

/// The second steps of calls PgStore runs as two (docs/simulator.md, "Atomic units"): the expiry read of an empty
/// fetch and the hints after an apply, each a call of its own that exists only as that second step.
const SECOND_STEPS: [&str; 2] = ["next_expiry", "publish_hints"];

/// Faults fall between the two steps of a call as on PostgreSQL: under mixed faults, second steps time out after
/// their first step's reply came (an empty fetch's expiry read, an apply's hints), and every checker holds. Were
/// each call one request, a fault could only lose both steps or neither.
#[test]
fn faults_fall_between_the_steps_of_a_call_and_every_invariant_holds() {
    let scenario = Scenario::mixed();
    let name = "faults_fall_between_the_steps_of_a_call_and_every_invariant_holds";
    let seeds = sim::seeds(&DEFAULT_SEEDS);
    // Run one by one, not with `check_seeds`: its reports keep no trace.
    let reports: Vec<RunReport> = seeds
        .iter()
        .map(|&seed| {
            let report = sim::run(&scenario, seed);
            assert!(report.passed(), "{}", sim::run::failure_text(&report, replay(name)));
            report
        })
        .collect();
    let lost_between = |step: &str| -> usize {
        let replicas = ["replica-0", "replica-1", "replica-2"];
        let in_report = |report: &RunReport| -> usize {
            replicas.iter().map(|replica| trace_count(report, replica, "call-timeout", step)).sum()
        };
        reports.iter().map(in_report).sum()
    };
    if reports.len() >= DEFAULT_SEEDS.len() {
        for step in SECOND_STEPS {
            assert!(lost_between(step) > 0, "no fault fell before the second step {step} in seeds {DEFAULT_SEEDS:?}");
        }
    }
}

#[test]
fn without_the_apply_guard_the_lease_exclusivity_checker_fires() {
    let mut scenario = Scenario::mixed();
    scenario.mutation.apply_guard_disabled = true;
    let reports = sim::run_seeds(&scenario, &sim::seeds(&DEFAULT_SEEDS));
    let caught: Vec<u64> =
        reports.iter().filter(|report| report.violated("lease_exclusivity")).map(|report| report.seed).collect();
    assert!(
        !caught.is_empty(),
        "with the apply guard off, no seed of {:?} broke lease exclusivity: the checker does not bite",
        reports.iter().map(|report| report.seed).collect::<Vec<_>>()
    );
    let first = reports.iter().find(|report| report.violated("lease_exclusivity")).expect("caught");
    let violation = first.violations.iter().find(|v| v.checker == "lease_exclusivity").expect("violated");
    assert!(violation.message.contains("written with token"), "{violation}");
}

#[test]
fn a_quiet_world_processes_every_row_without_stale_work() {
    let reports = sim::check_seeds(
        &Scenario::quiet(),
        &sim::seeds(&[1, 2]),
        replay("a_quiet_world_processes_every_row_without_stale_work"),
    );
    for report in reports {
        assert!(report.client.rows() > 50, "seed {}: the workload inserted {:?}", report.seed, report.client);
        assert_eq!(report.coverage.get("stale-apply"), 0, "seed {}: {}", report.seed, report.coverage);
        assert_eq!(report.coverage.get("call-timeout"), 0, "seed {}: {}", report.seed, report.coverage);
    }
}

/// Two fetch loops per pipeline (`fetchers = 2`) under every random fault, with jobs of many short tasks, so that
/// the tasks' queues grow and the second loop's fetches overlap the first's (its reservations, wake-ups and
/// dropped older leases are unit-tested in `tests/batching.rs`): every checker holds on every seed.
#[test]
fn two_fetch_loops_hold_every_invariant_under_every_fault() {
    let workload = lockstep::sim::workload::WorkloadSpec {
        jobs_per_minute: 120.0,
        tasks_per_job: 4..=8,
        task_process: Duration::from_millis(5)..Duration::from_millis(50),
        fetchers: 2,
        ..small_workload()
    };
    let scenario = Scenario { name: "mixed-two-fetchers".into(), ..Scenario::mixed() }.with_workload(workload);
    let seeds = sim::seeds(&DEFAULT_SEEDS);
    let reports = sim::check_seeds(&scenario, &seeds, replay("two_fetch_loops_hold_every_invariant_under_every_fault"));
    for report in reports {
        assert!(report.client.rows() > 300, "seed {}: the workload inserted {:?}", report.seed, report.client);
    }
}

/// Three replicas, no random faults, jobs only, tasks that take 2–4 s: at any moment every worker is in the
/// middle of processing, so a fault lands on work in flight.
fn directed() -> Scenario {
    let workload = lockstep::sim::workload::WorkloadSpec {
        span: Duration::from_secs(40),
        jobs_per_minute: 90.0,
        claims_per_minute: 20.0,
        task_process: Duration::from_secs(2)..Duration::from_secs(4),
        task_slow_chance: 0.0,
        task_failure_chance: 0.0,
        ..small_workload()
    };
    Scenario { name: "directed".into(), replicas: 3, ..Scenario::quiet() }.with_workload(workload)
}

#[test]
fn a_paused_replica_cannot_apply_with_its_stale_tokens() {
    let scenario = directed();
    let reports = check_directed(
        &scenario,
        &sim::seeds(&[1, 2, 3]),
        "a_paused_replica_cannot_apply_with_its_stale_tokens",
        || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let lease_ttl = world.scenario().workload.lease_ttl;
                world.replica(0).pause(lease_ttl * 3).await;
            })
        },
    );
    let stale: usize = reports.iter().map(|report| trace_count(report, "replica-0", "commit", "apply")).sum();
    let stale_after_resume: usize = reports
        .iter()
        .map(|report| {
            let resumed =
                report.trace.iter().position(|e| &*e.node == "replica-0" && e.kind == "resume").expect("resumed");
            report.trace[resumed..]
                .iter()
                .filter(|e| {
                    &*e.node == "replica-0"
                        && e.kind == "commit"
                        && e.fields.text().starts_with("apply")
                        && e.fields.text().contains(" stale ")
                })
                .count()
        })
        .sum();
    assert!(stale > 0, "replica-0 never applied");
    assert!(
        stale_after_resume > 0,
        "no apply of the paused replica came back stale: the pause missed the work in flight"
    );
}

#[test]
fn a_killed_replica_restarts_through_its_init_function() {
    let reports = check_directed(
        &directed(),
        &sim::seeds(&[1, 2]),
        "a_killed_replica_restarts_through_its_init_function",
        || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                world.replica(1).kill_for(Duration::from_secs(8)).await;
                // The restart ran the node's init function again (it runs as the node's first task).
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert_eq!(world.replica(1).incarnations(), 2);
            })
        },
    );
    for report in reports {
        assert_eq!(trace_count(&report, "replica-1", "start", "incarnation=2"), 1, "seed {}", report.seed);
        assert!(
            report.coverage.get("takeover") > 0,
            "seed {}: nobody took over the dead replica's leases",
            report.seed
        );
    }
}

#[test]
fn a_database_restart_keeps_committed_rows_and_fails_calls_in_flight() {
    let reports = check_directed(
        &directed(),
        &sim::seeds(&[1, 2]),
        "a_database_restart_keeps_committed_rows_and_fails_calls_in_flight",
        || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let before = world.rows().len();
                world.db().restart(Duration::from_secs(2)).await;
                assert!(world.rows().len() >= before, "the restart lost rows");
            })
        },
    );
    for report in reports {
        assert_eq!(trace_count(&report, "db", "start", "incarnation=2"), 1, "seed {}", report.seed);
        assert!(report.coverage.get("call-timeout") > 0, "seed {}: no call failed across the restart", report.seed);
        assert_eq!(report.rows, report.keyed_rows, "seed {}: rows lost or duplicated", report.seed);
    }
}

#[test]
fn a_replica_cut_off_from_the_database_rejoins() {
    let reports =
        check_directed(&directed(), &sim::seeds(&[1, 2]), "a_replica_cut_off_from_the_database_rejoins", || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                world.replica(2).partition_from_db(Duration::from_secs(20)).await;
                world.net().isolate(Target::Replica(1), Duration::from_secs(8)).await;
            })
        });
    for report in reports {
        assert!(
            trace_count(&report, "replica-2", "call-timeout", "") > 0,
            "seed {}: the partition cut nothing",
            report.seed
        );
        let applied_late = report
            .trace
            .iter()
            .rev()
            .take_while(|e| e.kind != "partition-end")
            .any(|e| &*e.node == "replica-2" && e.fields.text().contains(" applied "));
        assert!(applied_late, "seed {}: replica-2 applied nothing after the partition healed", report.seed);
    }
}

#[test]
fn replies_lost_after_commit_leave_no_trace_in_the_data() {
    let reports = check_directed(
        &directed(),
        &sim::seeds(&[1, 2]),
        "replies_lost_after_commit_leave_no_trace_in_the_data",
        || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                world.db().drop_replies(0.3, Duration::from_secs(25)).await;
            })
        },
    );
    for report in reports {
        assert!(report.coverage.get("reply-dropped") > 20, "seed {}: {}", report.seed, report.coverage);
        assert_eq!(report.rows, report.keyed_rows, "seed {}: a retried insert duplicated a row", report.seed);
    }
}

#[test]
fn a_drifting_clock_creates_no_second_writer() {
    let reports =
        check_directed(&directed(), &sim::seeds(&[1, 2]), "a_drifting_clock_creates_no_second_writer", || {
            sim::script(|world| async move {
                // Replica 0's clock runs slow, so it believes in its leases longer than the store keeps them (0.7 ×
                // the 6 s ttl minus the 1 s margin is past the ttl), and replica 1's runs fast. A pause in the middle
                // lets replica 0's leases expire under its workers: only the token guard stops their writes.
                let (slow, fast) = (world.replica(0), world.replica(1));
                let slow_drift = slow.drift(700_000, Duration::from_secs(30));
                let fast_drift = fast.drift(1_300_000, Duration::from_secs(30));
                let stall = async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    slow.pause(Duration::from_secs(9)).await;
                };
                tokio::join!(slow_drift, fast_drift, stall);
            })
        });
    let stale: usize = reports
        .iter()
        .map(|report| {
            let events = report.trace.iter().filter(|e| &*e.node == "replica-0" && e.kind == "commit");
            events.filter(|e| e.fields.text().starts_with("apply") && e.fields.text().contains(" stale ")).count()
        })
        .sum();
    assert!(stale > 0, "the drifting replica never needed the token guard: the scenario missed its point");
}

#[test]
fn buggify_points_fire_in_the_engine_and_every_repeated_apply_is_stale() {
    let reports = check_directed(
        &directed(),
        &sim::seeds(&[1, 2, 3]),
        "buggify_points_fire_in_the_engine_and_every_repeated_apply_is_stale",
        || sim::script(|world| async move { world.buggify(Duration::from_secs(40)).await }),
    );
    let repeated: u64 = reports.iter().map(|report| report.coverage.get("repeated-apply")).sum();
    assert!(repeated > 0, "the apply-repeat buggify point never fired");
}

#[test]
fn a_contention_burst_on_one_row_is_applied_exactly_once_per_claim() {
    let reports = check_directed(
        &directed(),
        &sim::seeds(&[1, 2]),
        "a_contention_burst_on_one_row_is_applied_exactly_once_per_claim",
        || {
            sim::script(|world| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                world.client().burst(40).await;
            })
        },
    );
    for report in reports {
        assert!(report.coverage.get("contended") > 20, "seed {}: {}", report.seed, report.coverage);
    }
}

#[test]
fn fetch_hints_cross_the_network_and_wake_fetchers_at_once() {
    // Without hints a fetcher sleeps its backoff (0.5–5 s) between empty fetches; with them, a claim inserted
    // and hinted by the client is fetched by some replica within a few network round trips.
    let seed = sim::seeds(&[1])[0];
    let report = sim::run(&Scenario::quiet(), seed);
    let name = "fetch_hints_cross_the_network_and_wake_fetchers_at_once";
    assert!(report.passed(), "{}", sim::run::failure_text(&report, replay(name)));
    let mut inserted = std::collections::BTreeMap::new();
    let mut delays = Vec::new();
    for event in report.trace.iter().filter(|event| event.kind == "commit") {
        let fields = event.fields.text();
        let words: Vec<&str> = fields.split_whitespace().collect();
        match words.as_slice() {
            ["insert", id, kind] if kind.starts_with("claim-") => {
                inserted.insert(id.to_string(), event.at);
            }
            ["fetch", pipeline, leases] if pipeline.starts_with("claims-") => {
                for lease in leases.trim_matches(|c| c == '[' || c == ']').split(',').filter(|l| !l.is_empty()) {
                    let id = lease.split('#').next().expect("id#token");
                    if let Some(at) = inserted.remove(id) {
                        delays.push(event.at - at);
                    }
                }
            }
            _ => {}
        }
    }
    assert!(delays.len() >= 10, "too few claims to judge: {delays:?}");
    delays.sort();
    let median = delays[delays.len() / 2];
    assert!(median < Duration::from_millis(200), "median insert-to-fetch {median:?}: hints do not wake fetchers");
}

/// A run that panics mid-way (7 s after the world is built) reports how far it got in simulated time (its last
/// trace event), not zero, and its
/// summary says the client and database counts are not known instead of printing zeros.
#[test]
fn a_run_that_panics_reports_the_simulated_time_it_reached() {
    let script = sim::script(|_world| async move {
        tokio::time::sleep(Duration::from_secs(7)).await;
        panic!("a planted panic at 7 s");
    });
    let report = sim::run_with(&Scenario::quiet(), 1, Some(script));
    assert_eq!(report.panic.as_deref(), Some("a planted panic at 7 s"));
    let last = report.trace.last().expect("the quiet workload traced events before 7 s").at;
    assert_eq!(report.simulated, last);
    assert!(
        report.simulated > Duration::from_secs(5) && report.simulated < Duration::from_secs(9),
        "{:?}",
        report.simulated
    );
    let text = sim::summary::render(&report);
    let seconds = format!("simulated time: {}.{:03} s (its last trace event", last.as_secs(), last.subsec_millis());
    assert!(text.contains(&seconds), "{text}");
    assert!(text.contains("client, rows and commits: not known"), "{text}");
    assert!(!text.contains("0 commits") && !text.contains("engine paths"), "{text}");
}
