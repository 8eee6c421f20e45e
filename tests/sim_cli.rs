//! `lockstep sim run | sweep | replay | explain | shrink`, through the simulator build's binary: exit codes,
//! replay files that reproduce a failure exactly, refusals of replay files from another build or scenario version,
//! timelines (text and HTML), shrunk failures, and scenario errors naming the key and the line.
#![cfg(madsim)]

use crate::support;

use support::command::clean_command;
use support::scratch::Scratch;

use lockstep::sim::replay::ReplayFile;
use lockstep::sim::summary::rows_named;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A seed of the planted scenario that breaks lease exclusivity (found by `lockstep sim sweep` over 1..9; the
/// test checks that it does, so a change of behaviour shows here instead of passing vacuously).
const PLANTED_SEED: &str = "5";

fn lockstep(args: &[&str], dir: &Path) -> Output {
    clean_command(env!("CARGO_BIN_EXE_lockstep")).args(args).current_dir(dir).output().expect("the binary runs")
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Runs `lockstep` with `args` in `dir`, which must be refused as bad input: exit 2, with `expected` in its
/// standard error. Returns its standard output and error.
fn refused(args: &[&str], dir: &Path, expected: &str) -> (String, String) {
    let output = lockstep(args, dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
    assert!(stderr.contains(expected), "{args:?}: {stderr}");
    (stdout, stderr)
}

/// A fresh directory for one test, removed when it passed.
fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("sim-cli-{name}"))
}

fn scenario(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name).display().to_string()
}

/// `scenarios/rows-mixed.toml` with the apply guard switched off (`[mutation]`, test only), as `planted.toml`.
fn planted(dir: &Path) -> PathBuf {
    let mixed = std::fs::read_to_string(scenario("rows-mixed.toml")).expect("rows-mixed.toml");
    let text =
        mixed.replace("name = \"rows-mixed\"", "name = \"planted\"") + "\n[mutation]\napply_guard_disabled = true\n";
    let path = dir.join("planted.toml");
    std::fs::write(&path, text).expect("write the planted scenario");
    path
}

#[test]
fn run_of_a_passing_scenario_prints_its_summary_and_exits_0() {
    let dir = temp_dir("pass");
    let output = lockstep(&["sim", "run", &scenario("rows-quiet.toml"), "--seed", "2"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("scenario rows-quiet seed 2: PASSED"), "{stdout}");
    assert!(checker_line(&stdout, "lease_exclusivity").starts_with("ok"), "{stdout}");
    assert!(stdout.contains("wall time: "), "{stdout}");
    assert!(!dir.join("lockstep-replays").exists(), "a passing run wrote a replay file");
}

/// What the summary says of `checker` (its line under `checkers:`, after the aligned name): `ok` or `FAILED: …`.
fn checker_line<'a>(stdout: &'a str, checker: &str) -> &'a str {
    let line = stdout.lines().find(|line| line.trim_start().starts_with(&format!("{checker} "))).unwrap_or("");
    line.trim_start()[checker.len()..].trim_start()
}

/// The command a line of `output` that starts with `prefix` (`replay it with: `) prints, as a user would paste it:
/// `env -u RUSTFLAGS cargo sim` (the alias of `.cargo/config.toml`, which runs `lockstep sim` with the arguments
/// that follow) and arguments that `lockstep sim`'s parser takes. Returns those arguments, `sim` first, to run
/// them with [`lockstep`].
fn printed_command(output: &str, prefix: &str) -> Vec<String> {
    let line =
        output.lines().find_map(|line| line.strip_prefix(prefix)).unwrap_or_else(|| panic!("{prefix}: {output}"));
    let words = lockstep::sim::shell::split(line).unwrap_or_else(|| panic!("an unclosed quote: {line}"));
    assert_eq!(words[..5], ["env", "-u", "RUSTFLAGS", "cargo", "sim"], "{line}");
    let config = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cargo/config.toml"))
        .expect("the repository's cargo config");
    let config: toml::Table = toml::from_str(&config).expect("the cargo config is TOML");
    let alias: Vec<&str> =
        config["alias"]["sim"].as_array().expect("a `sim` alias").iter().filter_map(|arg| arg.as_str()).collect();
    assert_eq!(alias[alias.len() - 4..], ["--bin", "lockstep", "--", "sim"], "cargo sim runs `lockstep sim`");
    let args = &words[5..];
    if let Err(error) =
        lockstep::sim::cli::try_parse_from(std::iter::once("lockstep sim").chain(args.iter().map(String::as_str)))
    {
        panic!("`{line}` does not parse: {error}");
    }
    std::iter::once("sim".to_string()).chain(args.iter().cloned()).collect()
}

/// [`lockstep`] with owned arguments.
fn lockstep_args(args: &[String], dir: &Path) -> Output {
    lockstep(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir)
}

/// The trace hash a run printed: `…; trace: N events, hash H`.
fn printed_hash(stdout: &str) -> String {
    let at = stdout.find("events, hash ").expect("the run prints its trace hash") + "events, hash ".len();
    stdout[at..at + 16].to_string()
}

#[test]
fn a_planted_failure_exits_1_writes_a_replay_file_and_the_replay_reproduces_it() {
    let dir = temp_dir("planted");
    let planted = planted(&dir);
    let run = lockstep(
        &["sim", "run", planted.to_str().unwrap(), "--seed", PLANTED_SEED, "--trace", "run.trace", "--out", "out"],
        &dir,
    );
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(1), "{stdout}{stderr}");
    assert!(checker_line(&stdout, "lease_exclusivity").starts_with("FAILED: commit"), "{stdout}");
    assert!(stdout.contains("trace events about row"), "the failed check shows no trace events:\n{stdout}");
    let replay_path = dir.join("out").join(format!("planted-seed-{PLANTED_SEED}.replay.json"));
    assert!(
        stdout.contains(&format!("replay file: {}", Path::new("out").join(replay_path.file_name().unwrap()).display()))
    );
    let hash = printed_hash(&stdout);
    let command = printed_command(&stdout, "replay it with: ");
    assert_eq!(command, ["sim", "replay", &format!("out/planted-seed-{PLANTED_SEED}.replay.json")]);

    let replay = lockstep_args(&command, &dir);
    let (replay_out, replay_err) = text(&replay);
    assert_eq!(replay.status.code(), Some(1), "the replay reproduces a failure:\n{replay_out}{replay_err}");
    assert!(replay_out.contains(&format!("reproduced: trace hash {hash}")), "{replay_out}{replay_err}");
    assert!(checker_line(&replay_out, "lease_exclusivity").starts_with("FAILED"), "{replay_out}");

    // The failure's row, followed through the trace the run wrote.
    let file: ReplayFile = serde_json::from_str(&std::fs::read_to_string(&replay_path).unwrap()).unwrap();
    let row = rows_named(&file.failure).into_iter().next().expect("the failure names a row");
    let explain = lockstep(&["sim", "explain", "run.trace", "--row", &row], &dir);
    let (explain_out, explain_err) = text(&explain);
    assert_eq!(explain.status.code(), Some(0), "{explain_err}");
    assert!(explain_out.starts_with(&format!("row {row}: ")), "{explain_out}");
    // The row's kind depends on which row the planted bug hits first (a task or a claim, as the seed's trace has it).
    assert!(explain_out.contains(&format!("insert {row} ")), "the timeline misses the insert:\n{explain_out}");
    assert!(explain_out.lines().count() > 3, "{explain_out}");
}

#[test]
fn a_replay_file_of_another_build_or_scenario_version_is_refused_with_exit_2() {
    let dir = temp_dir("refused");
    let planted = planted(&dir);
    let run = lockstep(&["sim", "run", planted.to_str().unwrap(), "--seed", PLANTED_SEED, "--out", "."], &dir);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run).0);
    let path = dir.join(format!("planted-seed-{PLANTED_SEED}.replay.json"));
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let build = original["build"].as_str().unwrap().to_string();
    // A replay file as another build or scenario version would have written it: edited, then sealed again (an
    // edited file that is not sealed is refused as edited, before any of these checks).
    let sealed = |value: serde_json::Value| {
        let file: lockstep::sim::replay::ReplayFile = serde_json::from_value(value).unwrap();
        file.sealed().to_json()
    };

    let mut other_build = original.clone();
    other_build["build"] = "0.1.0-sim-debug-0000000000000000".into();
    std::fs::write(dir.join("build.json"), sealed(other_build)).unwrap();
    let output = lockstep(&["sim", "replay", "build.json"], &dir);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("made by build 0.1.0-sim-debug-0000000000000000, but this is build {build}")),
        "{stderr}"
    );
    // The scenario runs on this build under the seed, with the command printed.
    let command = printed_command(&stderr, "run it with: ");
    assert_eq!(command, ["sim", "run", planted.to_str().unwrap(), "--seed", PLANTED_SEED]);
    let rerun = lockstep_args(&command, &dir);
    assert_eq!(rerun.status.code(), Some(1), "{}", text(&rerun).0);
    assert!(checker_line(&text(&rerun).0, "lease_exclusivity").starts_with("FAILED"), "{}", text(&rerun).0);

    // Written by a project's own simulator binary (build id `…+PROGRAM`): this binary may not have the pipelines
    // its scenario names, so the hint names that binary instead of a command of this one.
    let mut user_binary = original.clone();
    user_binary["build"] = format!("{build}+my-project-sim").into();
    std::fs::write(dir.join("user.json"), sealed(user_binary)).unwrap();
    let (_, stderr) =
        refused(&["sim", "replay", "user.json"], &dir, "written by another simulator binary, my-project-sim");
    assert!(!stderr.contains("run it with"), "{stderr}");

    let mut other_version = original.clone();
    let edited = original["scenario_text"].as_str().unwrap().replace("version = 1", "version = 2");
    other_version["scenario_text"] = edited.into();
    std::fs::write(dir.join("version.json"), sealed(other_version)).unwrap();
    let output = lockstep(&["sim", "replay", "version.json"], &dir);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let recorded = original["scenario"]["version"].as_str().unwrap();
    assert!(
        stderr.contains(&format!("made for scenario planted {recorded}, but the scenario it carries is planted v2-")),
        "{stderr}"
    );
}

#[test]
fn explain_prints_one_operations_timeline_aligned_and_says_when_there_is_none() {
    let dir = temp_dir("explain");
    let trace = "    1.000000 replica-0  submit         op=7 spec=a
    1.200000 replica-1  submit         op=17 spec=b
   12.500000 replica-10 incarnation    op=7 incarnation=2 reason=\"job failed\"
";
    std::fs::write(dir.join("t.trace"), trace).unwrap();
    let output = lockstep(&["sim", "explain", "t.trace", "--operation", "7"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "operation 7: 2 events from 1.000000 s to 12.500000 s (simulated), from t.trace\n \
         1.000000  replica-0   submit       op=7 spec=a\n\
         12.500000  replica-10  incarnation  op=7 incarnation=2 reason=\"job failed\"\n"
    );
    let output = lockstep(&["sim", "explain", "t.trace", "--operation", "1"], &dir);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("no line of t.trace (3 lines) is about operation 1 (none has a field `op=1`)"), "{stderr}");

    // Not a trace file, an empty one, or an id that is not a number: bad input (exit 2), said plainly.
    std::fs::write(dir.join("notes.txt"), "hello\n").unwrap();
    std::fs::write(dir.join("empty.trace"), "").unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["notes.txt", "--operation", "7"], "notes.txt is not a trace file: line 1 is not a trace line"),
        (&["empty.trace", "--row", "7"], "empty.trace is not a trace file: it is empty"),
        (&["t.trace", "--operation", "abc"], "\"abc\" is not a row id: ids are numbers"),
    ];
    for (args, expected) in cases {
        refused(&[&["sim", "explain"], args].concat(), &dir, expected);
    }
}

#[test]
fn a_bad_scenario_file_exits_2_naming_the_file_line_and_key() {
    let dir = temp_dir("bad");
    let bad = "name = \"bad\"\nversion = 1\n[topology]\nreplicas = 2\n\n[[faults.at]]\nat = \"5s\"\nkind = \"pause\"\n\
               replica = 3\nspan = \"1s\"\n";
    std::fs::write(dir.join("bad.toml"), bad).unwrap();
    let output = lockstep(&["sim", "run", "bad.toml"], &dir);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.toml:9:11: faults.at[0].replica: replica 3 does not exist: topology.replicas is 2"),
        "{stderr}"
    );
    std::fs::write(dir.join("typo.toml"), "name = \"typo\"\nversion = 1\n[workload]\nspan = \"10 parsecs\"\n").unwrap();
    let output = lockstep(&["sim", "sweep", "typo.toml", "--seeds", "1..3"], &dir);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("typo.toml:4:8: workload.span: invalid duration \"10 parsecs\""), "{stderr}");
}

/// A sweep refuses at parse time (exit 2, before anything runs or is listed in memory) a range of more than a
/// million seeds, a seed past u64, and `--jobs 0` or a `LOCKSTEP_SIM_JOBS` that is not a whole number ≥ 1, or
/// more than 4 threads per core (`--jobs 100000` started that many threads); the largest seed itself is a range
/// of one seed.
#[test]
fn sweep_refuses_huge_ranges_overflowing_seeds_and_zero_jobs_with_exit_2() {
    let dir = temp_dir("sweep-bounds");
    let quiet = scenario("rows-quiet.toml");
    let cases: [(&[&str], &str); 4] = [
        (&["--seeds", "1..=9007199254740993"], "holds 9007199254740993 seeds; a sweep runs at most 1000000"),
        (&["--seeds", "1..18446744073709551616"], "seed 18446744073709551616 overflows"),
        (&["--seeds", "1..3", "--jobs", "0"], "--jobs <JOBS>': 0 threads: give at least 1"),
        // It started 100000 threads on two cores.
        (&["--seeds", "1..3", "--jobs", "100000"], "--jobs <JOBS>': 100000 threads: at most "),
    ];
    for (args, expected) in cases {
        let (stdout, _) = refused(&[&["sim", "sweep", quiet.as_str()], args].concat(), &dir, expected);
        assert!(stdout.is_empty(), "{args:?} ran: {stdout}");
    }
    // `LOCKSTEP_SIM_JOBS` is refused as `--jobs` is (it was read as "the default" when it was not a number ≥ 1).
    let too_many = "LOCKSTEP_SIM_JOBS: 100000 threads: at most ";
    for (value, expected) in
        [("0", "LOCKSTEP_SIM_JOBS: 0 threads"), ("x", "LOCKSTEP_SIM_JOBS: \"x\" is not"), ("100000", too_many)]
    {
        let output = lockstep_with(&["sim", "sweep", &quiet, "--seeds", "1..3"], &dir, &[("LOCKSTEP_SIM_JOBS", value)]);
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{value}: {stdout}{stderr}");
        assert!(stderr.contains(expected), "{value}: {stderr}");
    }
    let max = "18446744073709551615";
    let output = lockstep(&["sim", "sweep", &quiet, "--seeds", &format!("{max}..={max}"), "--out", "q"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("seeds {max}..={max} (1)")), "{stdout}");
}

#[test]
fn sweep_tabulates_outcomes_and_writes_each_failing_seed_as_a_replay_file() {
    let dir = temp_dir("sweep");
    let planted = planted(&dir);
    let output =
        lockstep(&["sim", "sweep", planted.to_str().unwrap(), "--seeds", "5..=6", "--jobs", "2", "--out", "r"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("failed: lease_exclusivity"), "{stdout}");
    assert!(stdout.contains("seeds 5..=6 (2) on 2 threads"), "{stdout}");
    assert!(dir.join("r").join(format!("planted-seed-{PLANTED_SEED}.replay.json")).exists(), "{stdout}");
    let written = std::fs::read_dir(dir.join("r")).unwrap().count();
    let failed_lines = stdout
        .lines()
        .filter(|line| line.trim_start().starts_with("replay: env -u RUSTFLAGS cargo sim replay"))
        .count();
    assert_eq!(written, failed_lines, "{stdout}");
    let listed = stdout.lines().map(str::trim_start).collect::<Vec<_>>().join("\n");
    let command = printed_command(&listed, "replay: ");
    assert_eq!(command[..2], ["sim", "replay"]);
    assert!(dir.join(&command[2]).exists(), "{command:?} names no replay file the sweep wrote");

    let output = lockstep(&["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..3", "--out", "q"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.lines().any(|line| line.starts_with("passed") && line.ends_with(" 2")), "{stdout}");
    assert!(!dir.join("q").exists(), "a passing sweep wrote replay files");
}

/// A real gang run: `run --trace` on the agent-death scenario, then `explain --operation` on its operation. Every
/// line of the timeline is the operation's (`op=ID` as a field of its own), quoted values (`reason="incarnation
/// changed"`) stay whole, and the timeline holds both incarnations and the node-lost line.
#[test]
fn explain_follows_an_operation_of_a_real_gang_run_through_its_gang_restart() {
    let dir = temp_dir("explain-gang");
    let run = lockstep(&["sim", "run", &scenario("gang-restart-agent-death.toml"), "--trace", "gang.trace"], &dir);
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(0), "{stdout}{stderr}");
    let at = stdout.find("train (op=").expect("the summary names the operation") + "train (op=".len();
    let op = &stdout[at..at + stdout[at..].find(')').unwrap()];
    assert!(stdout.contains("incarnation 1 at "), "{stdout}");
    let explain = lockstep(&["sim", "explain", "gang.trace", "--operation", op], &dir);
    let (timeline, stderr) = text(&explain);
    assert_eq!(explain.status.code(), Some(0), "{stderr}");
    let token = format!("op={op}");
    let lines: Vec<&str> = timeline.lines().skip(1).collect();
    assert!(lines.len() > 20, "{timeline}");
    for line in &lines {
        assert!(line.split_whitespace().any(|word| word == token), "not about {token}: {line}");
    }
    assert!(timeline.contains(&format!("incarnation  {token} index=1")), "{timeline}");
    assert!(timeline.contains("node-lost") && timeline.contains("reason=\"node lost\""), "{timeline}");
    assert!(timeline.contains("reason=\"incarnation changed\""), "{timeline}");
    // Another operation id matches nothing in this single-operation run.
    let none = lockstep(&["sim", "explain", "gang.trace", "--operation", "99999"], &dir);
    assert_eq!(none.status.code(), Some(1));
}

/// `lockstep sim run … | head -1`: a reader that closes the pipe early ends the run quietly (SIGPIPE's default
/// action), not with a panic and exit 101.
#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = temp_dir("closed-pipe");
    let mut child = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["sim", "run", &scenario("rows-quiet.toml")])
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("the run ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--trace` to a path that cannot be written is refused before the simulation runs (exit 2), by `run` and by
/// `replay`, instead of after it with exit 0.
#[test]
fn an_unwritable_trace_path_is_refused_before_the_run() {
    let dir = temp_dir("bad-trace");
    let output = lockstep(&["sim", "run", &scenario("rows-quiet.toml"), "--trace", "/proc/nope/x"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("cannot create the trace file /proc/nope/x"), "{stderr}");
    assert!(!stdout.contains("scenario rows-quiet seed"), "the run ran: {stdout}");

    let planted = planted(&dir);
    let run = lockstep(&["sim", "run", planted.to_str().unwrap(), "--seed", PLANTED_SEED, "--out", "out"], &dir);
    assert_eq!(run.status.code(), Some(1), "{:?}", text(&run));
    let replay_file = format!("out/planted-seed-{PLANTED_SEED}.replay.json");
    let output = lockstep(&["sim", "replay", &replay_file, "--trace", "/proc/nope/x"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("cannot create the trace file /proc/nope/x"), "{stderr}");
    assert!(!stdout.contains("reproduced"), "the replay ran: {stdout}");
}

/// The data a timeline page carries (`<script id="timeline-data" type="application/json">`).
fn page_data(path: &Path) -> serde_json::Value {
    let page = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let marker = "type=\"application/json\">";
    let start = page.find(marker).expect("the page's data") + marker.len();
    serde_json::from_str(&page[start..start + page[start..].find("</script>").unwrap()]).expect("JSON data")
}

/// `--html` on `run`, `replay`, `sweep` and `explain`: a page with the run's verdicts (or, from a trace alone,
/// without), one per failing seed of a sweep, refused at once (exit 2) where it cannot be written.
#[test]
fn html_writes_a_timeline_page_from_run_replay_sweep_and_explain() {
    let dir = temp_dir("html");
    let planted = planted(&dir);
    let planted = planted.to_str().unwrap();
    let run = lockstep(
        &["sim", "run", planted, "--seed", PLANTED_SEED, "--trace", "t.trace", "--html", "run.html", "--out", "r"],
        &dir,
    );
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("timeline written to run.html"), "{stdout}");
    let data = page_data(&dir.join("run.html"));
    assert_eq!(data["verdict"], "failed");
    let failed = data["checkers"].as_array().unwrap().iter().find(|c| c["name"] == "lease_exclusivity").unwrap();
    assert_eq!(failed["ok"], false);
    assert!(failed["at"].as_u64().is_some(), "the violation has no moment: {failed}");
    assert_eq!(data["trace"].as_str(), Some(std::fs::read_to_string(dir.join("t.trace")).unwrap().as_str()));

    let replay_file = format!("r/planted-seed-{PLANTED_SEED}.replay.json");
    let replay = lockstep(&["sim", "replay", &replay_file, "--html", "replay.html"], &dir);
    assert_eq!(replay.status.code(), Some(1), "{:?}", text(&replay));
    assert_eq!(page_data(&dir.join("replay.html"))["trace"], data["trace"]);

    let explain = lockstep(&["sim", "explain", "t.trace", "--html", "explain.html", "--row", "3"], &dir);
    assert_eq!(explain.status.code(), Some(0), "{:?}", text(&explain));
    let explained = page_data(&dir.join("explain.html"));
    assert_eq!((explained["verdict"].is_null(), &explained["focus"]["rows"]), (true, &serde_json::json!([3])));
    let neither = lockstep(&["sim", "explain", "t.trace"], &dir);
    assert_eq!(neither.status.code(), Some(2), "explain needs --operation, --row or --html");
    let (_, stderr) = text(&neither);
    assert!(stderr.contains("--operation") && stderr.contains("--row") && stderr.contains("--html"), "{stderr}");

    let sweep = lockstep(&["sim", "sweep", planted, "--seeds", "5..=6", "--out", "s", "--html", "pages"], &dir);
    let (stdout, stderr) = text(&sweep);
    assert_eq!(sweep.status.code(), Some(1), "{stdout}{stderr}");
    let pages = std::fs::read_dir(dir.join("pages")).unwrap().count();
    assert_eq!(pages, std::fs::read_dir(dir.join("s")).unwrap().count(), "a page per failing seed: {stdout}");
    assert!(dir.join("pages").join(format!("planted-seed-{PLANTED_SEED}.html")).is_file(), "{stdout}");

    let output = lockstep(&["sim", "run", &scenario("rows-quiet.toml"), "--html", "/proc/nope/x.html"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("cannot create the timeline file /proc/nope/x.html"), "{stderr}");
    assert!(!stdout.contains("scenario rows-quiet seed"), "the run ran: {stdout}");
}

/// `sim shrink REPLAY`: the replay file of a planted gang failure shrinks to a scenario file and its replay file;
/// `sim run` on the scenario fails the same checker and `sim replay` reproduces it. A passing scenario is
/// refused (exit 2).
#[test]
fn shrink_writes_a_smaller_failing_scenario_and_its_replay_file() {
    let dir = temp_dir("shrink");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/timeline-planted.toml");
    let run = lockstep(&["sim", "run", fixture.to_str().unwrap(), "--out", "r"], &dir);
    assert_eq!(run.status.code(), Some(1), "{:?}", text(&run));
    let replay_file = "r/timeline-planted-seed-1.replay.json";
    let shrink = lockstep(&["sim", "shrink", replay_file, "--out", "s", "--other-seeds", "0"], &dir);
    let (stdout, stderr) = text(&shrink);
    assert_eq!(shrink.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with(&format!("shrinking {replay_file} (seed 1) on ")), "{stdout}");
    assert!(stdout.contains("step 1: dropped every fault (3 fixed, 0 random)\n    now 0 faults"), "{stdout}");
    assert!(stdout.contains("it fails checker gang_ranks_together under seed 1"), "{stdout}");
    assert!(stdout.contains("  before: 3 faults, 2 operations, "), "{stdout}");
    let shrunk = "s/timeline-planted-shrunk.toml";
    assert!(stdout.contains(&format!("scenario: {shrunk}\nreplay file: s/timeline-planted-shrunk-seed-1")), "{stdout}");
    let written = std::fs::read_to_string(dir.join(shrunk)).unwrap();
    assert!(
        written.starts_with(&format!("# Shrunk by `env -u RUSTFLAGS cargo sim shrink` from {replay_file}")),
        "{written}"
    );
    assert!(written.contains(&format!("`env -u RUSTFLAGS cargo sim run {shrunk} --seed 1`")), "{written}");
    let command = printed_command(&stdout, "run it with: ");
    assert_eq!(command, ["sim", "run", shrunk, "--seed", "1"]);

    let rerun = lockstep_args(&command, &dir);
    let (rerun_out, rerun_err) = text(&rerun);
    assert_eq!(rerun.status.code(), Some(1), "{rerun_out}{rerun_err}");
    assert!(checker_line(&rerun_out, "gang_ranks_together").starts_with("FAILED"), "{rerun_out}");
    let replay = lockstep(&["sim", "replay", "s/timeline-planted-shrunk-seed-1.replay.json"], &dir);
    let (replay_out, replay_err) = text(&replay);
    assert_eq!(replay.status.code(), Some(1), "{replay_out}{replay_err}");
    assert!(replay_out.contains("reproduced: trace hash"), "{replay_out}");

    // The same shrink again refuses, before searching, to replace what it wrote; --force replaces it.
    std::fs::write(dir.join(shrunk), "edited").unwrap();
    let again = lockstep(&["sim", "shrink", replay_file, "--out", "s", "--other-seeds", "0"], &dir);
    let (stdout, stderr) = text(&again);
    assert_eq!(again.status.code(), Some(2), "{stdout}{stderr}");
    assert_eq!(
        stderr,
        format!("lockstep sim shrink: refused: {shrunk} exists: give --force to replace it, or another --out\n")
    );
    assert!(stdout.is_empty(), "it searched: {stdout}");
    assert_eq!(std::fs::read_to_string(dir.join(shrunk)).unwrap(), "edited");
    std::fs::remove_file(dir.join(shrunk)).unwrap();
    let again = lockstep(&["sim", "shrink", replay_file, "--out", "s", "--other-seeds", "0"], &dir);
    let stderr = text(&again).1;
    assert_eq!(again.status.code(), Some(2), "a replay file of the shrunk scenario is refused too: {stderr}");
    assert!(stderr.contains("refused: s/timeline-planted-shrunk-seed-1.replay.json exists"), "{stderr}");
    let forced = lockstep(&["sim", "shrink", replay_file, "--out", "s", "--other-seeds", "0", "--force"], &dir);
    assert_eq!(forced.status.code(), Some(0), "{:?}", text(&forced));
    assert_eq!(std::fs::read_to_string(dir.join(shrunk)).unwrap(), written, "the same search, the same file");

    let passing = lockstep(&["sim", "shrink", &scenario("rows-quiet.toml"), "--out", "q"], &dir);
    let (stdout, stderr) = text(&passing);
    assert_eq!(passing.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("refused: scenario rows-quiet passes under seed 1 (every checker ok)"), "{stderr}");
    let command = printed_command(&stderr, "find a failing seed with: ");
    assert_eq!(command, ["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..101"]);
    assert!(!dir.join("q").exists());
}

/// The variables a sweep reads its shard from: cleared for every test run below (the test itself may run inside
/// a Slurm array or a Kubernetes Job), then set one engine at a time.
const SHARD_VARS: [&str; 8] = [
    "JOB_COMPLETION_INDEX",
    "LOCKSTEP_SHARD_COUNT",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_STEP",
    "SLURM_ARRAY_TASK_COUNT",
    "YT_JOB_COOKIE",
    "YT_TASK_JOB_COUNT",
];

/// A sweep's case: its flags, its shard variables, and what it must say.
type ShardCase<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

/// The binary with `vars` as its only shard variables.
fn lockstep_with(args: &[&str], dir: &Path, vars: &[(&str, &str)]) -> Output {
    let mut command = clean_command(env!("CARGO_BIN_EXE_lockstep"));
    for var in SHARD_VARS {
        command.env_remove(var);
    }
    command.args(args).envs(vars.iter().copied()).current_dir(dir).output().expect("the binary runs")
}

/// A sweep's table without its wall-time line: from `outcome` to `simulated time: …`.
fn table(stdout: &str) -> String {
    let start = stdout.find("outcome ").unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    let end = start + stdout[start..].find("simulated time: ").expect("a simulated time line");
    let end = end + stdout[end..].find('\n').unwrap() + 1;
    stdout[start..end].to_string()
}

/// Files in `dir`, by name.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Four shards of a sweep (one from `--shard`, one from each engine's variables) merge to the unsharded sweep's
/// table, with the same failing seeds' replay files; shards of one YTsaurus output table (one file) merge the
/// same; a missing shard is reported as incomplete (exit 4), a shard of another sweep or a shard twice refused
/// (exit 2).
#[test]
fn four_shards_merge_to_the_table_of_the_unsharded_sweep() {
    let dir = temp_dir("shards");
    let planted = planted(&dir);
    let planted = planted.to_str().unwrap();
    let sweep = |extra: &[&str], vars: &[(&str, &str)]| {
        let args = [&["sim", "sweep", planted, "--seeds", "1..=6", "--jobs", "2"], extra].concat();
        lockstep_with(&args, &dir, vars)
    };
    let whole = sweep(&["--results", "whole", "--out", "r-whole"], &[]);
    let (whole_out, whole_err) = text(&whole);
    assert_eq!(whole.status.code(), Some(1), "{whole_out}{whole_err}");
    assert!(whole_out.contains("failed: lease_exclusivity"), "{whole_out}");

    let shards: [ShardCase; 4] = [
        (&["--shard", "0/4"], &[], "shard 0/4: 2 seeds, those with (seed - 1) % 4 == 0"),
        (
            &[],
            &[("JOB_COMPLETION_INDEX", "1"), ("LOCKSTEP_SHARD_COUNT", "4")],
            "shard 1/4 (from JOB_COMPLETION_INDEX=1",
        ),
        (
            &[],
            &[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_MIN", "1"), ("SLURM_ARRAY_TASK_COUNT", "4")],
            "shard 2/4 (from SLURM_ARRAY_TASK_ID=3",
        ),
        (
            &[],
            &[("YT_JOB_COOKIE", "3"), ("YT_TASK_JOB_COUNT", "4")],
            "shard 3/4 (from YT_JOB_COOKIE=3, YT_TASK_JOB_COUNT=4): 1 seed, those with",
        ),
    ];
    for (flags, vars, says) in shards {
        let output = sweep(&[&["--results", "shards", "--out", "r-shards"], flags].concat(), vars);
        let (stdout, stderr) = text(&output);
        assert!(matches!(output.status.code(), Some(0 | 1)), "{vars:?}: {stdout}{stderr}");
        assert!(stdout.contains(says), "{vars:?}: {stdout}");
    }
    assert_eq!(names(&dir.join("shards")).len(), 4);

    let merged = lockstep_with(&["sim", "merge", "shards", "--out", "r-merged"], &dir, &[]);
    let (merged_out, merged_err) = text(&merged);
    assert_eq!(merged.status.code(), whole.status.code(), "{merged_out}{merged_err}");
    assert_eq!(table(&merged_out), table(&whole_out), "merged:\n{merged_out}\nunsharded:\n{whole_out}");
    assert!(merged_out.contains("seeds 1..=6 (6) in 4 shards (4 result files)"), "{merged_out}");
    assert!(!merged_out.contains("INCOMPLETE"), "{merged_out}");
    assert_eq!(names(&dir.join("r-merged")), names(&dir.join("r-whole")));
    assert_eq!(names(&dir.join("r-shards")), names(&dir.join("r-whole")));
    let replay = format!("r-merged/planted-seed-{PLANTED_SEED}.replay.json");
    assert_eq!(
        std::fs::read_to_string(dir.join(&replay)).unwrap(),
        std::fs::read_to_string(dir.join(format!("r-whole/planted-seed-{PLANTED_SEED}.replay.json"))).unwrap()
    );

    // All shards' lines in one file, as a YTsaurus output table read back: the same table.
    std::fs::create_dir_all(dir.join("table")).unwrap();
    let lines: String = names(&dir.join("shards"))
        .iter()
        .map(|name| std::fs::read_to_string(dir.join("shards").join(name)).unwrap())
        .collect();
    std::fs::write(dir.join("table/all.jsonl"), lines).unwrap();
    let one_file = lockstep_with(&["sim", "merge", "table/all.jsonl", "--out", "r-table"], &dir, &[]);
    assert_eq!(table(&text(&one_file).0), table(&whole_out), "{:?}", text(&one_file));

    // A missing shard: the table of what is there, and exit 4 when nothing failed (shard 1 holds seed 6's failure
    // in this sweep, so only shards 0, 2 and 3 are merged).
    std::fs::create_dir_all(dir.join("partial")).unwrap();
    for name in names(&dir.join("shards")).iter().filter(|name| !name.contains("shard-1-of-4")) {
        std::fs::copy(dir.join("shards").join(name), dir.join("partial").join(name)).unwrap();
    }
    let partial = lockstep_with(&["sim", "merge", "partial", "--out", "r-partial"], &dir, &[]);
    let (stdout, stderr) = text(&partial);
    assert!(stdout.contains("INCOMPLETE: 1 of the 4 shards missing: 1"), "{stdout}{stderr}");
    if !stdout.contains("failed: ") {
        assert_eq!(partial.status.code(), Some(4), "{stdout}{stderr}");
    }

    // A shard of another sweep (other seeds) and a shard twice are refused.
    let other = lockstep_with(
        &["sim", "sweep", planted, "--seeds", "1..=3", "--shard", "1/4", "--results", "partial", "--out", "r-other"],
        &dir,
        &[],
    );
    assert!(matches!(other.status.code(), Some(0 | 1)), "{:?}", text(&other));
    let refused = lockstep_with(&["sim", "merge", "partial"], &dir, &[]);
    let (stdout, stderr) = text(&refused);
    assert_eq!(refused.status.code(), Some(2), "{stdout}{stderr}");
    let seeds = ["seeds 1..=6 vs 1..=3", "seeds 1..=3 vs 1..=6"];
    assert!(seeds.iter().any(|seeds| stderr.contains(&format!("are not shards of one sweep: {seeds}"))), "{stderr}");
    let twice = lockstep_with(&["sim", "merge", "shards", "table"], &dir, &[]);
    let (stdout, stderr) = text(&twice);
    assert_eq!(twice.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("shard 0/4 appears twice"), "{stderr}");
    // Twice in one file (its lines appended to it again): the two places differ by their lines.
    let all = std::fs::read_to_string(dir.join("table/all.jsonl")).unwrap();
    std::fs::write(dir.join("table/all.jsonl"), all.repeat(2)).unwrap();
    let again = lockstep_with(&["sim", "merge", "table/all.jsonl"], &dir, &[]);
    let (stdout, stderr) = text(&again);
    assert_eq!(again.status.code(), Some(2), "{stdout}{stderr}");
    let second_line = all.lines().count() + 1;
    let shard_0 =
        all.lines().position(|line| line.contains("\"sweep\"") && line.contains("\"index\":0")).map(|i| i + 1);
    assert!(shard_0.is_some(), "a header of shard 0 in: {all}");
    let expected = format!(
        "appears twice: in table/all.jsonl:{} and in table/all.jsonl:{}",
        shard_0.unwrap(),
        shard_0.unwrap() + second_line - 1
    );
    assert!(stderr.contains(&expected), "{expected:?} in: {stderr}");
}

/// A shard from a variable that is not a number, a count variable missing (or `LOCKSTEP_SHARD_COUNT` without
/// its index), a Slurm step of 0, or a shard past the count: exit 2 naming the variables as set, before any seed
/// runs.
#[test]
fn bad_shard_variables_and_flags_exit_2_naming_them() {
    let dir = temp_dir("bad-shards");
    let quiet = scenario("rows-quiet.toml");
    let sweep = ["sim", "sweep", quiet.as_str(), "--seeds", "1..3"];
    let cases: [ShardCase; 7] = [
        (&[], &[("JOB_COMPLETION_INDEX", "1")], "JOB_COMPLETION_INDEX is set but LOCKSTEP_SHARD_COUNT is not"),
        // It ran every seed, in every pod.
        (&[], &[("LOCKSTEP_SHARD_COUNT", "4")], "LOCKSTEP_SHARD_COUNT=\"4\" is set but JOB_COMPLETION_INDEX is not"),
        // It was read as a step of 1, and named so.
        (
            &[],
            &[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_STEP", "0"), ("SLURM_ARRAY_TASK_COUNT", "4")],
            "SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_STEP=0, SLURM_ARRAY_TASK_COUNT=4: the step must be at least 1",
        ),
        (
            &[],
            &[("SLURM_ARRAY_TASK_ID", "x"), ("SLURM_ARRAY_TASK_COUNT", "4")],
            "SLURM_ARRAY_TASK_ID=\"x\" is not a shard index",
        ),
        (&[], &[("YT_JOB_COOKIE", "5"), ("YT_TASK_JOB_COUNT", "5")], "YT_JOB_COOKIE=5, YT_TASK_JOB_COUNT=5: shard 5"),
        (&["--shard", "4/4"], &[], "shard 4 does not exist: shards count from 0 and there are 4"),
        (&["--shard", "two"], &[], "is not a shard: write K/N"),
    ];
    for (flags, vars, expected) in cases {
        let output = lockstep_with(&[&sweep[..], flags].concat(), &dir, vars);
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{vars:?} {flags:?}: {stdout}{stderr}");
        assert!(stderr.contains(expected), "{vars:?} {flags:?}: {stderr}");
        assert!(!stdout.contains("seeds 1..=2"), "it ran: {stdout}");
    }
}

/// A shard that holds no seed (more shards than seeds) says so on stderr, and still passes with its result file.
#[test]
fn a_shard_without_seeds_says_so() {
    let dir = temp_dir("empty-shard");
    let quiet = scenario("rows-quiet.toml");
    let output = lockstep(&["sim", "sweep", quiet.as_str(), "--seeds", "1..3", "--shard", "3/4", "--jobs", "1"], &dir);
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("shard 3/4 holds no seed: more shards (4) than seeds (2)"), "{stderr}");
    assert!(stdout.contains("on 1 thread,"), "{stdout}");
}

/// Ctrl-C during a sweep: the runs under way finish, the table of every finished seed is printed (exit 130), the
/// result file holds each finished seed and ends with an interrupted end line, and every failure found so far
/// has its replay file.
#[test]
fn ctrl_c_prints_the_table_of_what_finished_and_keeps_the_failures_replay_files() {
    use std::io::BufRead;
    let dir = temp_dir("interrupt");
    let planted = planted(&dir);
    let mut child = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["sim", "sweep", planted.to_str().unwrap(), "--seeds", "1..100001", "--jobs", "2"])
        .args(["--results", "results", "--out", "replays"])
        .env_remove("JOB_COMPLETION_INDEX")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("YT_JOB_COOKIE")
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let results = dir.join("results/planted-seeds-1-100000.sweep.jsonl");
    let lines = || -> Vec<serde_json::Value> {
        let Ok(file) = std::fs::File::open(&results) else { return Vec::new() };
        std::io::BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect()
    };
    let failed = |line: &serde_json::Value| line["seed"]["outcome"] == "failed";
    // Wait (on the result file, not a clock) until a failure was found: the planted scenario fails within its
    // first seeds (seed 6 does); bounded so that a sweep that never fails ends the test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !lines().iter().any(failed) {
        assert!(std::time::Instant::now() < deadline, "no failure in the result file after 600 s: {:?}", lines());
        assert!(child.try_wait().unwrap().is_none(), "the sweep ended before it was interrupted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: sends SIGINT to our own child process, by its id.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let output = child.wait_with_output().expect("the sweep ends");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(130), "{stdout}{stderr}");
    assert!(stderr.contains("interrupted: finishing the runs under way"), "{stderr}");

    let lines = lines();
    let seeds: Vec<&serde_json::Value> = lines.iter().filter(|line| line.get("seed").is_some()).collect();
    let end = &lines.last().expect("lines")["end"];
    assert_eq!(end["interrupted"], true, "{end}");
    assert_eq!(end["seeds"].as_u64(), Some(seeds.len() as u64), "{end}");
    assert!(stdout.contains(&format!("interrupted (Ctrl-C): {} of 100000 seeds finished", seeds.len())), "{stdout}");
    let passed = seeds.iter().filter(|line| line["seed"]["outcome"] == "passed").count();
    assert!(stdout.lines().any(|line| line.starts_with("passed") && line.ends_with(&format!(" {passed}"))), "{stdout}");
    assert!(stdout.contains("failed: lease_exclusivity"), "{stdout}");
    let failures: Vec<u64> =
        seeds.iter().filter(|line| failed(line)).map(|l| l["seed"]["seed"].as_u64().unwrap()).collect();
    assert!(!failures.is_empty());
    for seed in &failures {
        let replay = dir.join(format!("replays/planted-seed-{seed}.replay.json"));
        assert!(replay.is_file(), "no replay file for failing seed {seed}: {stdout}");
        assert!(
            stdout.contains(&format!("replay {}", Path::new("replays").join(replay.file_name().unwrap()).display()))
        );
    }
}

/// A run that outgrows one run (its trace reaches its most events: here lowered by `LOCKSTEP_SIM_TRACE_LEN_MAX`
/// so the test is quick; in use, a scenario within each key's limit whose rates, span and replicas together make
/// millions of events) is bad input, not a failure: exit 2 naming the keys to change, no replay file, no panic
/// printed; a sweep of it stops at once, exit 2.
#[test]
fn a_run_that_outgrows_one_run_exits_2_naming_the_keys_and_writes_no_replay_file() {
    let dir = temp_dir("outgrown");
    let small = [("LOCKSTEP_SIM_TRACE_LEN_MAX", "300")];
    let run = lockstep_with(&["sim", "run", &scenario("rows-quiet.toml"), "--seed", "2"], &dir, &small);
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stdout.contains("scenario rows-quiet seed 2: NOT JUDGED"), "{stdout}");
    assert!(
        stdout.contains("the run outgrew one run before the checkers ran: its trace reached 300 events"),
        "{stdout}"
    );
    for key in ["workload.span", "workload.jobs_per_minute", "workload.rows_max", "topology.replicas"] {
        assert!(stderr.contains(key), "the error names no {key}: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "a panic was printed: {stderr}");
    assert!(!dir.join("lockstep-replays").exists(), "an outgrown run wrote a replay file");

    let sweep = lockstep_with(
        &["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..40", "--jobs", "2", "--results", "results"],
        &dir,
        &small,
    );
    let (stdout, stderr) = text(&sweep);
    assert_eq!(sweep.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("sweep: stopped after 0 seeds: seed "), "{stderr}");
    assert!(stderr.contains("the run outgrew one run") && stderr.contains("workload.span"), "{stderr}");
    assert!(!stderr.contains("panicked"), "a panic was printed: {stderr}");
    assert!(!dir.join("lockstep-replays").exists(), "an outgrown sweep wrote a replay file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run whose simulated time advances, only too slowly to finish within its wall-clock limit (a new user's trial:
/// 200 replicas at the highest rates), outgrew one run: exit 2, NOT JUDGED, naming the keys and the limit, no
/// replay file; never "simulated time stood still" (that is a stuck run, `tests/sim_user.rs`), which it was
/// reported as, with a replay file that did not reproduce. A sweep of it stops at once, exit 2.
#[test]
fn a_run_past_its_wall_limit_with_simulated_time_advancing_is_not_judged_and_writes_no_replay_file() {
    let dir = temp_dir("wall-outgrown");
    let big = "name = \"big\"\nversion = 1\n[topology]\nreplicas = 50\n[workload]\nspan = \"1h\"\n\
               jobs_per_minute = 6000.0\nclaims_per_minute = 6000.0\nrows_max = 1000000\n";
    std::fs::write(dir.join("big.toml"), big).expect("write big.toml");
    let short = [("LOCKSTEP_SIM_WALL_LIMIT_SECS", "1")];
    let run = lockstep_with(&["sim", "run", "big.toml", "--seed", "1"], &dir, &short);
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stdout.contains("scenario big seed 1: NOT JUDGED"), "{stdout}");
    assert!(stdout.contains("wall-clock limit of 1 s with simulated time still advancing"), "{stdout}");
    for key in ["workload.span", "workload.jobs_per_minute", "topology.replicas", "LOCKSTEP_SIM_WALL_LIMIT_SECS"] {
        assert!(stderr.contains(key), "the error names no {key}: {stderr}");
    }
    assert!(!stdout.contains("stood still") && !stderr.contains("panicked"), "{stdout}{stderr}");
    assert!(!dir.join("lockstep-replays").exists(), "a run past its wall limit wrote a replay file");

    let sweep = lockstep_with(&["sim", "sweep", "big.toml", "--seeds", "1..5", "--results", "results"], &dir, &short);
    let (stdout, stderr) = text(&sweep);
    assert_eq!(sweep.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("sweep: stopped after 0 seeds: seed "), "{stderr}");
    assert!(stderr.contains("with simulated time still advancing") && stderr.contains("workload.span"), "{stderr}");
    assert!(!dir.join("lockstep-replays").exists(), "a sweep past its wall limit wrote a replay file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A control action the controller refuses breaks no invariant, so the run passes; its summary counts and lists it
/// (a new user's trial saw it only in the trace, under PASSED and `(0 refused)`, which counts operations).
#[test]
fn a_refused_control_action_is_counted_and_listed_in_the_summary() {
    let dir = temp_dir("refused-control");
    let example = std::fs::read_to_string(scenario("gang-seed-example.toml")).expect("gang-seed-example.toml");
    let spec = scenario("specs/seed-gang.yson");
    let file = example.replace("spec_file = \"specs/seed-gang.yson\"", &format!("spec_file = {spec:?}"))
        + "\n[[controls]]\nat = \"50s\"\noperation = \"worker\"\naction = \"abort\"\nreason = \"late\"\n";
    std::fs::write(dir.join("late-abort.toml"), file).expect("write late-abort.toml");
    let run = lockstep(&["sim", "run", "late-abort.toml", "--seed", "1"], &dir);
    let (stdout, stderr) = text(&run);
    assert_eq!(run.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("1 control action refused:\n"), "{stdout}");
    let line = stdout.lines().find(|line| line.contains("control-refused")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("name=worker control=0 error="), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The variables every run reads are checked before any run (a new user's trial: each panicked, and in a sweep
/// left a result file without its end line): a bad value exits 2 naming the variable, for `run` and `sweep`.
#[test]
fn bad_simulator_variables_exit_2_naming_them_before_any_run() {
    let dir = temp_dir("bad-vars");
    let cases = [
        ("LOCKSTEP_SIM_TRACE_LEN_MAX", "abc"),
        ("LOCKSTEP_SIM_TRACE_LEN_MAX", "0"),
        ("LOCKSTEP_SIM_WALL_LIMIT_SECS", "abc"),
        ("LOCKSTEP_SIM_TRACE_DIR", "/nonexistent/lockstep-trace-dir"),
    ];
    for (name, value) in cases {
        for args in [
            vec!["sim", "run", &scenario("rows-quiet.toml")],
            vec!["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..3", "--results", "results"],
        ] {
            let output = lockstep_with(&args, &dir, &[(name, value)]);
            let (stdout, stderr) = text(&output);
            assert_eq!(output.status.code(), Some(2), "{name}={value} {args:?}: {stdout}{stderr}");
            assert!(stderr.contains(name) && !stderr.contains("panicked"), "{name}={value}: {stderr}");
            assert!(!dir.join("results").exists(), "{name}={value}: a sweep started");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sweep whose failures' directories (`--out`, `--html`) cannot be made is refused before any seed runs (it
/// found out at every failing seed, writing none of their files); a passing sweep leaves no empty directory.
#[test]
fn a_sweep_refuses_an_out_or_html_directory_it_cannot_make_before_any_seed() {
    let dir = temp_dir("sweep-out");
    std::fs::write(dir.join("a-file"), "").unwrap();
    for flag in ["--out", "--html"] {
        let bad = "a-file/replays";
        let args = ["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..3", flag, bad];
        let output = lockstep(&args, &dir);
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stdout}{stderr}");
        assert!(stderr.contains(&format!("{flag} {bad}: cannot create the directory")), "{stderr}");
        assert!(!stdout.contains("passed "), "{flag}: seeds ran: {stdout}");
    }
    let ok = ["sim", "sweep", &scenario("rows-quiet.toml"), "--seeds", "1..3", "--out", "r", "--html", "h"];
    let output = lockstep(&ok, &dir);
    assert_eq!(output.status.code(), Some(0), "{:?}", text(&output));
    assert!(!dir.join("r").exists() && !dir.join("h").exists(), "a passing sweep left its empty directories");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An output path that is an input of the command, or another output, is refused (exit 2, naming both) before
/// anything is written: `--html` or `--trace` on the scenario, replay or trace file, `--trace` and `--html` on one
/// file (spelled differently), and a sweep's result file on its scenario file. Each input is left as it was.
#[test]
fn an_output_on_an_input_or_another_output_is_refused_and_nothing_is_overwritten() {
    let dir = temp_dir("same-file");
    let quiet = std::fs::read_to_string(scenario("rows-quiet.toml")).unwrap();
    std::fs::write(dir.join("mine.toml"), &quiet).unwrap();
    std::fs::write(dir.join("pl.trace"), "a trace\n").unwrap();
    std::fs::write(dir.join("r.json"), "{}\n").unwrap();
    std::fs::create_dir_all(dir.join("res")).unwrap();
    let results = "res/rows-quiet-seeds-1-2.sweep.jsonl";
    std::fs::write(dir.join(results), &quiet).unwrap();
    let cases: [(&[&str], &str); 7] = [
        (
            &["run", "mine.toml", "--html", "mine.toml"],
            "--html mine.toml is the same file as the scenario file mine.toml",
        ),
        (&["run", "mine.toml", "--trace", "./mine.toml"], "--trace ./mine.toml is the same file as the scenario file"),
        (
            &["run", "mine.toml", "--trace", "same.out", "--html", "./same.out"],
            "--html ./same.out is the same file as --trace same.out",
        ),
        (
            &["explain", "pl.trace", "--operation", "9", "--html", "pl.trace"],
            "--html pl.trace is the same file as the trace file pl.trace",
        ),
        (&["replay", "r.json", "--html", "r.json"], "--html r.json is the same file as the replay file r.json"),
        (
            &["replay", "r.json", "--trace", "t.out", "--html", "t.out"],
            "--html t.out is the same file as --trace t.out",
        ),
        (
            &["sweep", results, "--seeds", "1..3", "--results", "res"],
            "is the same file as the scenario file res/rows-quiet",
        ),
    ];
    for (args, expected) in cases {
        let (_, stderr) = refused(&[&["sim"], args].concat(), &dir, expected);
        assert!(stderr.contains("an output must not overwrite a file the command reads or another output"), "{stderr}");
    }
    assert_eq!(std::fs::read_to_string(dir.join("mine.toml")).unwrap(), quiet);
    assert_eq!(std::fs::read_to_string(dir.join("pl.trace")).unwrap(), "a trace\n");
    assert_eq!(std::fs::read_to_string(dir.join("r.json")).unwrap(), "{}\n");
    assert_eq!(std::fs::read_to_string(dir.join(results)).unwrap(), quiet);
    assert!(!dir.join("same.out").exists() && !dir.join("t.out").exists(), "an output was created");
}

/// A scenario or replay file larger than its cap (here `/dev/zero`, which never ends: `run` read it until it held
/// gigabytes) is refused with exit 2, naming the file, the cap and why there is one.
#[test]
fn an_input_past_its_size_cap_is_refused_naming_the_file_and_the_cap() {
    let dir = temp_dir("size-cap");
    let cases: [(&[&str], &str); 2] = [
        (
            &["run", "/dev/zero"],
            "/dev/zero: cannot read the scenario file: it holds more than 16 MiB (16777216 bytes), the most a \
             scenario file may hold",
        ),
        (
            &["replay", "/dev/zero"],
            "cannot read /dev/zero: it holds more than 64 MiB (67108864 bytes), the most a replay file may hold",
        ),
    ];
    for (args, expected) in cases {
        refused(&[&["sim"], args].concat(), &dir, expected);
    }
}

/// An `--out` that is a file, not a directory, is refused before the run (exit 2): `run` writes into it only when
/// a seed fails and `shrink` only after its search, so each found out after the work was done (a new user's trial).
#[test]
fn an_out_that_is_a_file_is_refused_before_the_run() {
    let dir = temp_dir("out-file");
    std::fs::write(dir.join("taken"), "a file\n").unwrap();
    let planted = planted(&dir);
    let planted = planted.to_str().unwrap();
    let cases: [&[&str]; 3] = [
        &["run", planted, "--seed", PLANTED_SEED, "--out", "taken"],
        &["run", planted, "--seed", PLANTED_SEED, "--out", "taken/below"],
        &["shrink", planted, "--seed", PLANTED_SEED, "--out", "taken"],
    ];
    for args in cases {
        let (stdout, _) = refused(&[&["sim"], args].concat(), &dir, "cannot be a directory");
        assert!(stdout.is_empty(), "nothing ran: {stdout}");
    }
    assert_eq!(std::fs::read_to_string(dir.join("taken")).unwrap(), "a file\n");
}

/// A result file whose last line is cut off (a sweep killed or out of disk while writing it) is merged from its
/// complete lines, and its shard reported as killed (exit 4: no seed failed); a malformed line before the last
/// is still refused (exit 2).
#[test]
fn merge_uses_the_complete_lines_of_a_file_whose_last_line_is_cut_off() {
    let dir = temp_dir("cut-off");
    let quiet = scenario("rows-quiet.toml");
    let output = lockstep(&["sim", "sweep", &quiet, "--seeds", "1..5", "--jobs", "2", "--results", "whole"], &dir);
    assert_eq!(output.status.code(), Some(0), "{:?}", text(&output));
    let name = "rows-quiet-seeds-1-4.sweep.jsonl";
    let full = std::fs::read_to_string(dir.join("whole").join(name)).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    assert_eq!(lines.len(), 6, "a header, 4 seeds and an end: {full}");
    // The header, two seeds, and half of the third seed's line: the sweep was killed while writing it.
    let cut = lines[3];
    let text_cut = format!("{}\n{}\n{}\n{}", lines[0], lines[1], lines[2], &cut[..cut.len() / 2]);
    std::fs::create_dir_all(dir.join("cut")).unwrap();
    std::fs::write(dir.join("cut").join(name), &text_cut).unwrap();
    let merged = lockstep(&["sim", "merge", "cut"], &dir);
    let (stdout, stderr) = text(&merged);
    assert_eq!(merged.status.code(), Some(4), "{stdout}{stderr}");
    assert!(stdout.contains("passed  "), "{stdout}");
    assert!(stdout.contains("INCOMPLETE: "), "{stdout}");
    assert!(
        stdout.contains(&format!("cut/{name} ends in a cut-off line (killed while writing?), left out")),
        "{stdout}"
    );
    assert!(stdout.contains("shard 0/1 has no end line (killed?): 2 of 4 seeds"), "{stdout}");
    // A malformed line that is not the last is refused, as before.
    let text_middle = format!("{}\n{}\n{}\n{}\n", lines[0], lines[1], &cut[..cut.len() / 2], lines[4]);
    std::fs::write(dir.join("cut").join(name), text_middle).unwrap();
    let refused = lockstep(&["sim", "merge", "cut"], &dir);
    let (stdout, stderr) = text(&refused);
    assert_eq!(refused.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains(&format!("{name}:3: not a line of a lockstep sweep result file")), "{stderr}");
}
