//! `lockstep sim swarm`: every seed draws its own world within ranges, and every checker judges it. The drawn world
//! of a seed is a plain scenario file that runs as the swarm ran it; a sweep of worlds reports what it reached per
//! fault kind and engine path; a planted bug is found with no scenario file written for it; bad ranges and flags
//! are refused naming them. And `check_swarm`, the swarm as a `cargo test`.
#![cfg(madsim)]

use crate::support;

use lockstep::sim::swarm::{self, Ranges, Shape};
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use support::command::clean_command;

fn lockstep(args: &[&str], dir: &Path) -> Output {
    clean_command(env!("CARGO_BIN_EXE_lockstep")).args(args).current_dir(dir).output().expect("the binary runs")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The trace hash a run's summary ends with (`… hash 0123456789abcdef`).
fn trace_hash(output: &str) -> String {
    let line = output.lines().find(|line| line.starts_with("wall time: ")).unwrap_or_else(|| panic!("{output}"));
    line.rsplit(' ').next().expect("a hash").to_string()
}

/// Small worlds: a swarm test runs in the debug build, about ten times slower than `cargo sim`.
fn small() -> Ranges {
    Ranges { rows_max: 300, span: Duration::from_secs(15)..=Duration::from_secs(40), ..Ranges::default() }
}

#[test]
fn the_world_a_seed_emits_runs_as_the_swarm_ran_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let emitted = lockstep(&["sim", "swarm", "--seed", "11", "--emit"], dir.path());
    assert_eq!(emitted.status.code(), Some(0), "{}", text(&emitted));
    let world = String::from_utf8(emitted.stdout).expect("UTF-8");
    assert!(world.starts_with("# Drawn by `lockstep sim swarm`"), "{world}");
    assert!(world.contains("seeds = [11]"), "{world}");
    std::fs::write(dir.path().join("world.toml"), &world).expect("write the world");
    let swarm = lockstep(&["sim", "swarm", "--seed", "11"], dir.path());
    let run = lockstep(&["sim", "run", "world.toml"], dir.path());
    let (swarm, run) = (text(&swarm), text(&run));
    assert!(swarm.contains("\nworld (v1-"), "{swarm}");
    assert_eq!(trace_hash(&swarm), trace_hash(&run), "the swarm's run:\n{swarm}\nthe file's run:\n{run}");
    // The emitted world is the same with the same ranges, and another with other ranges.
    let again = lockstep(&["sim", "swarm", "--seed", "11", "--emit"], dir.path());
    assert_eq!(String::from_utf8_lossy(&again.stdout), world);
    let calm = lockstep(&["sim", "swarm", "--seed", "11", "--emit", "--kinds", "none"], dir.path());
    let calm = String::from_utf8_lossy(&calm.stdout).into_owned();
    assert!(!calm.contains("[[faults.random]]"), "--kinds none drew faults:\n{calm}");
}

#[test]
fn a_swarm_sweep_records_each_world_and_reports_coverage_per_fault_kind_and_path() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ranges = "rows_max = 200\nspan = [\"10s\", \"20s\"]\nshapes = [\"rows\", \"gang\"]\n";
    std::fs::write(dir.path().join("ranges.toml"), ranges).expect("write the ranges");
    let output = lockstep(&["sim", "swarm", "--seeds", "1..5", "--ranges", "ranges.toml", "--jobs", "2"], dir.path());
    let out = text(&output);
    assert!(matches!(output.status.code(), Some(0 | 1)), "{out}");
    assert!(out.contains("swarm of ranges.toml (swarm-v3-"), "{out}");
    assert!(out.contains("coverage over 4 worlds"), "{out}");
    for kind in ["kill", "agent-kill", "db-restart"] {
        assert!(out.lines().any(|line| line.trim_start().starts_with(kind)), "no row for {kind}:\n{out}");
    }
    assert!(out.lines().any(|line| line.trim_start().starts_with("stale-apply")), "{out}");
    let results = std::fs::read_to_string(dir.path().join("lockstep-sweeps/swarm-seeds-1-4.sweep.jsonl"))
        .expect("the result file");
    let worlds = results
        .lines()
        .filter(|line| line.contains("\"world\":\"rows world") || line.contains("\"world\":\"gang world"))
        .count();
    assert_eq!(worlds, 4, "each seed's line names its world:\n{results}");
    // Shards of a swarm merge to the same coverage.
    for shard in ["0/2", "1/2"] {
        let args =
            ["sim", "swarm", "--seeds", "1..5", "--ranges", "ranges.toml", "--shard", shard, "--results", "shards"];
        let output = lockstep(&args, dir.path());
        assert!(matches!(output.status.code(), Some(0 | 1)), "{}", text(&output));
    }
    let merged = text(&lockstep(&["sim", "merge", "shards"], dir.path()));
    let coverage = |text: &str| {
        text.lines().skip_while(|line| !line.starts_with("coverage over")).take(35).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(coverage(&merged), coverage(&out), "merged:\n{merged}\nunsharded:\n{out}");
}

#[test]
fn a_planted_bug_is_found_by_the_swarm_and_its_world_replays() {
    let dir = tempfile::tempdir().expect("a temp dir");
    // The apply guard off: a paused replica's stale apply takes effect (lease_exclusivity).
    let args = [
        "sim",
        "swarm",
        "--seeds",
        "1..11",
        "--jobs",
        "2",
        "--mutation",
        "apply_guard_disabled",
        "--shapes",
        "rows",
        "--kinds",
        "pause,kill,lost-replies",
    ];
    let output = lockstep(&args, dir.path());
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "the swarm missed the planted bug:\n{out}");
    assert!(out.contains("failed: lease_exclusivity") || out.contains("failed: exactly_once"), "{out}");
    let replay = out
        .lines()
        .find_map(|line| line.trim().strip_prefix("replay: env -u RUSTFLAGS cargo sim replay "))
        .unwrap_or_else(|| panic!("no replay command:\n{out}"));
    let replayed = lockstep(&["sim", "replay", replay], dir.path());
    assert!(text(&replayed).contains("reproduced: trace hash"), "{}", text(&replayed));
}

#[test]
fn bad_ranges_and_flags_are_refused_naming_them() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let refused = |args: &[&str], expected: &str| {
        let output = lockstep(args, dir.path());
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", text(&output));
        assert!(text(&output).contains(expected), "{args:?}: {}", text(&output));
    };
    refused(&["sim", "swarm", "--seed", "1", "--kinds", "kil"], "--kinds: unknown fault kind \"kil\"");
    refused(&["sim", "swarm", "--seed", "1", "--shapes", "trees"], "--shapes: unknown world shape \"trees\"");
    refused(&["sim", "swarm", "--seed", "1", "--max-replicas", "0"], "replicas: 0..=0 must be within 1..=16");
    refused(&["sim", "swarm", "--seed", "1", "--mutation", "guard"], "unknown mutation \"guard\"");
    refused(
        &["sim", "swarm", "--seed", "1", "--pipelines", "orders"],
        "--pipelines orders: this binary registers no such",
    );
    refused(&["sim", "swarm", "--emit"], "--seed");
    refused(&["sim", "swarm", "--seeds", "1..3", "--trace", "t"], "--trace is for one world");
    refused(&["sim", "swarm", "--seed", "1", "--shard", "0/2"], "--shard is for a sweep of seeds");
    refused(&["sim", "swarm", "--seed", "1", "--emit", "--out", "d"], "cannot be used with");
    std::fs::write(dir.path().join("rows.toml"), "shapes = [\"rows\"]\nreplicas = [1, 2]\n").expect("write");
    refused(
        &["sim", "swarm", "--seed", "1", "--ranges", "rows.toml", "--shapes", "gang"],
        "allows none of these shapes",
    );
    refused(
        &["sim", "swarm", "--seed", "1", "--ranges", "rows.toml", "--trace", "rows.toml"],
        "the same file as the ranges file",
    );
    // The flags narrow the file's ranges, never widen them.
    let narrowed = lockstep(
        &["sim", "swarm", "--seed", "1", "--ranges", "rows.toml", "--max-replicas", "10", "--emit"],
        dir.path(),
    );
    let world = String::from_utf8_lossy(&narrowed.stdout).into_owned();
    assert!(world.contains("replicas = 1\n") || world.contains("replicas = 2\n"), "{world}");
    assert!(world.contains("--ranges rows.toml --max-replicas 10 --emit"), "the header draws it again: {world}");
    std::fs::write(dir.path().join("bad.toml"), "replicas = [1, 2]\nspan = [\"1h\", \"1s\"]\n").expect("write");
    refused(&["sim", "swarm", "--seed", "1", "--ranges", "bad.toml"], "bad.toml:2:8: span: ");
    refused(&["sim", "swarm", "--seed", "1", "--ranges", "missing.toml"], "missing.toml");
}

/// The swarm as a test: worlds of every shape, small, every fault kind. (Kinds that the related-lock queue
/// fixes still fail on some row worlds under overload; these worlds stay under capacity.)
#[test]
fn check_swarm_runs_every_world_and_every_checker_judges_it() {
    let ranges = Ranges { overload: 0.8, ..small() };
    let seeds: Vec<u64> = (1..=12).collect();
    let reports = swarm::check_swarm(&ranges, &seeds, None);
    assert_eq!(reports.len(), seeds.len());
    assert!(reports.iter().all(|report| !report.checkers.is_empty()), "every world was judged");
    let shapes: Vec<Shape> = seeds.iter().map(|&seed| swarm::draw(&ranges, seed, None).shape).collect();
    for shape in Shape::ALL {
        assert!(shapes.contains(&shape), "no {} world among the seeds", shape.name());
    }
}
