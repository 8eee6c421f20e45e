//! `lockstep chaos run` on real PostgreSQL and real replica processes (issue 15): a short row scenario with a
//! SIGKILLed and a SIGSTOPped replica passes every checker the simulator runs, on the history the replicas
//! recorded in PostgreSQL; the planted bug (the guarded apply without its token guard) makes a checker fire on
//! that history; a second scenario ends every session of the replicas twice and bursts contention on one row;
//! a third cuts a replica's link to PostgreSQL (its chaos proxy stalls) and loses replies after the server sent
//! them; faults without a real form are refused with their reason. Each run has a schema of its own,
//! dropped at the end, and its own out directory. Needs PostgreSQL (DATABASE_URL); never skips.
#![cfg(not(madsim))]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::pg::database_url;

const KILL_PAUSE: &str = "tests/fixtures/chaos-rows-kill-pause.toml";

/// Runs `lockstep chaos run` with `args`, its output directory under the target dir (named after `name`).
fn chaos(name: &str, args: &[&str]) -> (Output, String) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{name}-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["chaos", "run"])
        .args(args)
        .args(["--database-url", &database_url(), "--out", out.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output, text)
}

/// The history file a run's output names (`history: PATH (N commits)`).
fn history_path(text: &str) -> PathBuf {
    let line = text.lines().find(|line| line.starts_with("history: ")).expect("the history's path");
    PathBuf::from(line.trim_start_matches("history: ").split(" (").next().unwrap())
}

#[test]
fn a_row_scenario_with_a_killed_and_a_paused_replica_passes_every_checker_on_postgres() {
    let (output, text) = chaos("kill-pause", &[KILL_PAUSE]);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-rows-kill-pause seed 1: PASSED"), "{text}");
    for checker in ["lease_exclusivity", "liveness", "locked_forever", "exactly_once", "drain"] {
        assert!(
            text.lines().any(|line| line.trim() == format!("{checker} ok") || {
                let words: Vec<&str> = line.split_whitespace().collect();
                words == [checker, "ok"]
            }),
            "{checker} did not pass: {text}"
        );
    }
    // The faults happened to real processes, and the history the checkers read is on disk.
    let path = history_path(&text);
    let history = std::fs::read_to_string(&path).expect("the history file");
    assert!(history.lines().any(|line| line.contains(" fetch ")), "no fetch recorded");
    assert!(history.lines().any(|line| line.contains(" applied ")), "no apply recorded");
    let faults = std::fs::read_to_string(path.with_file_name("faults.txt")).expect("the fault log");
    assert!(faults.contains("kill"), "{faults}");
    assert!(faults.contains("pause"), "{faults}");
    assert!(faults.contains("resume"), "{faults}");
}

#[test]
fn a_row_scenario_with_ended_sessions_and_a_contention_burst_passes_every_checker_on_postgres() {
    let (output, text) = chaos("db-restart", &["tests/fixtures/chaos-rows-db-restart.toml"]);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-rows-db-restart seed 1: PASSED"), "{text}");
    assert!(text.contains("faults injected: contention 1, db-restart 2"), "{text}");
    // The sessions were really ended: the fault log counts them.
    let faults = std::fs::read_to_string(history_path(&text).with_file_name("faults.txt")).expect("the fault log");
    let ended: Vec<u64> = faults
        .lines()
        .filter_map(|line| line.split("sessions=").nth(1))
        .map(|count| count.trim().parse().expect("a session count"))
        .collect();
    assert_eq!(ended.len(), 2, "{faults}");
    assert!(ended.iter().all(|count| *count > 0), "no session ended: {faults}");
}

#[test]
fn a_row_scenario_with_a_partitioned_replica_and_lost_replies_passes_every_checker_on_postgres() {
    let (output, text) = chaos("network", &["tests/fixtures/chaos-rows-network.toml"]);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-rows-network seed 1: PASSED"), "{text}");
    assert!(text.contains("faults injected: lost-replies 1, partition 1"), "{text}");
    for checker in ["lease_exclusivity", "liveness", "locked_forever", "exactly_once", "drain"] {
        assert!(
            text.lines().any(|line| line.split_whitespace().collect::<Vec<_>>() == [checker, "ok"]),
            "{checker} did not pass: {text}"
        );
    }
    // The proxies really did it: the partitioned replica's link held its bytes, and replies were lost after
    // the server sent them (each losing its connection).
    let faults = std::fs::read_to_string(history_path(&text).with_file_name("faults.txt")).expect("the fault log");
    let count = |kind: &str, field: &str| -> u64 {
        let line = faults.lines().find(|line| line.contains("link-heal") && line.contains(kind)).expect(kind);
        let value = line.split(&format!("{field}=")).nth(1).expect(field);
        value.split_whitespace().next().unwrap().parse().expect("a count")
    };
    assert!(count("partition", "held") > 0, "the partition held nothing: {faults}");
    assert!(count("lost-replies", "resets") > 0, "no reply was lost: {faults}");
}

/// The scenario file's `[mutation] apply_guard_disabled` is honoured, as in the simulator.
#[test]
fn the_apply_guard_off_fires_a_checker_on_postgres() {
    let (output, text) = chaos("planted", &["tests/fixtures/chaos-rows-kill-pause-planted.toml"]);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains(": FAILED"), "{text}");
    let fired = ["lease_exclusivity", "exactly_once"]
        .iter()
        .any(|checker| text.lines().any(|line| line.trim_start().starts_with(checker) && line.contains("FAIL")));
    assert!(fired, "neither lease_exclusivity nor exactly_once fired: {text}");
}

#[test]
fn faults_without_a_real_form_are_refused_with_their_reason() {
    let (output, text) = chaos("refused", &["scenarios/rows-paused-replica.toml"]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("not possible on real processes"), "{text}");
    assert!(text.contains("--skip-refused"), "{text}");
    let (output, text) = chaos("scale", &[KILL_PAUSE, "--time-scale", "0"]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--time-scale 0: must be in (0, 100]"), "{text}");
    let (output, text) = chaos("gang", &["scenarios/gang-seed-example.toml"]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("gang scenarios (agents, operations) are not yet run"), "{text}");
}

/// A role the server does not know is the URL's fault, said as real mode says it (exit 2).
#[test]
fn a_database_url_the_server_refuses_is_bad_input() {
    let mut url = url::Url::parse(&database_url()).expect("DATABASE_URL parses");
    url.set_username("lockstep_no_such_role").unwrap();
    url.set_password(None).unwrap();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-role-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["chaos", "run", KILL_PAUSE, "--database-url", url.as_str(), "--out", out.to_str().unwrap()])
        .output()
        .expect("the binary runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--database-url: ") && text.contains("lockstep_no_such_role"), "{text}");
}
