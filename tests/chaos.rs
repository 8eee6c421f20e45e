//! `lockstep chaos run` on real PostgreSQL and real replica processes: a short row scenario with a
//! SIGKILLed and a SIGSTOPped replica passes every checker the simulator runs, on the history the replicas
//! recorded in PostgreSQL; the planted bug (the guarded apply without its token guard) makes a checker fire on
//! that history; a second scenario ends every session of the replicas twice and bursts contention on one row;
//! a third cuts a replica's link to PostgreSQL (its chaos proxy stalls) and loses replies after the server sent
//! them; faults without a real form are refused with their reason. Each run has a schema of its own,
//! dropped at the end, and its own out directory. Needs PostgreSQL (DATABASE_URL); never skips.
#![cfg(not(madsim))]

use crate::support;

use support::command::clean_command;

use std::path::{Path, PathBuf};
use std::process::Output;
use support::pg::database_url;

const KILL_PAUSE: &str = "tests/fixtures/chaos-rows-kill-pause.toml";

/// Runs `lockstep chaos run` with `args`, its output directory under the target dir (named after `name`).
fn chaos(name: &str, args: &[&str]) -> (Output, String) {
    chaos_with(name, args, &["--database-url", &database_url()])
}

/// [`chaos`] with the database given by `database` (`--database-url URL` or `--database-url-file PATH`).
fn chaos_with(name: &str, args: &[&str], database: &[&str]) -> (Output, String) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{name}-{}", std::process::id()));
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["chaos", "run"])
        .args(args)
        .args(database)
        .args(["--out", out.to_str().unwrap()])
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

/// Whether the summary's line of `checker` says `ok`.
fn ok(text: &str, checker: &str) -> bool {
    text.lines().any(|line| line.split_whitespace().collect::<Vec<_>>() == [checker, "ok"])
}

/// Whether the summary's line of `checker` says it failed.
fn fired(text: &str, checker: &str) -> bool {
    text.lines().any(|line| line.trim_start().starts_with(checker) && line.contains("FAIL"))
}

#[test]
fn a_row_scenario_with_a_killed_and_a_paused_replica_passes_every_checker_on_postgres() {
    let (output, text) = chaos("kill-pause", &[KILL_PAUSE]);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-rows-kill-pause seed 1: PASSED"), "{text}");
    for checker in ["lease_exclusivity", "liveness", "locked_forever", "exactly_once", "drain"] {
        assert!(ok(&text, checker), "{checker} did not pass: {text}");
    }
    // The faults happened to real processes, and the history the checkers read is on disk.
    let path = history_path(&text);
    let history = std::fs::read_to_string(&path).expect("the history file");
    assert!(history.lines().any(|line| line.contains(" fetch ")), "no fetch recorded");
    assert!(history.lines().any(|line| line.contains(" applied ")), "no apply recorded");
    let faults = std::fs::read_to_string(path.with_file_name("faults.txt")).expect("the fault log");
    assert!(faults.contains("kill"), "{faults}");
    assert!(faults.contains("pause"), "{faults}");
    // The pause waited until replica 1 was inside a pass (`[faults] pause_inside_pass`): its write after SIGCONT
    // came back stale.
    assert!(text.contains("pauses inside a pass: 1 of 1"), "{text}");
    let replica_1 = |line: &&str| line.contains("-replica-1 ");
    assert!(
        history.lines().filter(replica_1).any(|line| line.contains(" stale") || line.contains(" Stale")),
        "{history}"
    );
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
        assert!(ok(&text, checker), "{checker} did not pass: {text}");
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

/// The simulator's `store-hang` on real processes: the chaos proxy black-holes replica 0's link, its calls end only
/// at its call bound, replica 1 takes its rows over, and every checker passes; the fault log names the kind and
/// the bytes the black hole swallowed.
#[test]
fn a_row_scenario_with_a_replica_whose_store_hangs_passes_every_checker_on_postgres() {
    let (output, text) = chaos("store-hang", &["tests/fixtures/chaos-rows-store-hang.toml"]);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-rows-store-hang seed 1: PASSED"), "{text}");
    assert!(text.contains("faults injected: store-hang 1"), "{text}");
    for checker in ["lease_exclusivity", "liveness", "locked_forever", "exactly_once", "drain"] {
        assert!(ok(&text, checker), "{checker} did not pass: {text}");
    }
    let faults = std::fs::read_to_string(history_path(&text).with_file_name("faults.txt")).expect("the fault log");
    let heal = faults.lines().find(|line| line.contains("link-heal") && line.contains("store-hang")).expect("healed");
    let lost: u64 = heal.split("lost=").nth(1).and_then(|rest| rest.split_whitespace().next()?.parse().ok()).unwrap();
    assert!(lost > 0, "the black hole swallowed nothing: {faults}");
}

/// The scenario file's `[mutation] apply_guard_disabled` is honoured, as in the simulator.
#[test]
fn the_apply_guard_off_fires_a_checker_on_postgres() {
    let (output, text) = chaos("planted", &["tests/fixtures/chaos-rows-kill-pause-planted.toml"]);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains(": FAILED"), "{text}");
    let fired = ["lease_exclusivity", "exactly_once"].iter().any(|checker| fired(&text, checker));
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
    // The URL file is read as real mode reads it: an empty one is refused, naming the flag.
    let empty = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-empty-url-{}", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let (output, text) = chaos_with("empty-url", &[KILL_PAUSE], &["--database-url-file", empty.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--database-url-file") && text.contains("the file is empty"), "{text}");
    // An agent's clock cannot be made to drift from outside either.
    let (output, text) = chaos("gang-drift", &["scenarios/gang-agent-clock-drift.toml"]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("agent-clock-drift agent-1") && text.contains("not possible on real processes"), "{text}");
    // A planted bug PostgreSQL cannot plant is refused, never ignored (a pass would read as a checker missing it).
    let planted = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-age-rule-{}.toml", std::process::id()));
    let text = std::fs::read_to_string("scenarios/rows-shared-pairs.toml").unwrap();
    std::fs::write(&planted, format!("{text}\n[mutation]\nrelated_age_rule_disabled = true\n")).unwrap();
    let (output, text) = chaos("age-rule", &[planted.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("[mutation] related_age_rule_disabled is a MemStore switch"), "{text}");
    let text = std::fs::read_to_string("scenarios/rows-retry-wake.toml").unwrap();
    std::fs::write(&planted, format!("{text}\n[mutation]\nretry_wake_disabled = true\n")).unwrap();
    let (output, text) = chaos("retry-wake", &[planted.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("[mutation] retry_wake_disabled plants a late retry, which only the simulator judges"),
        "{text}"
    );
}

/// A gang scenario on real processes: the seed's gang on three `lockstep agent` children, one of them SIGKILLed
/// and started again on its work dir; every gang checker passes on what PostgreSQL and the agents recorded, and
/// the jobs were real processes that saw their `YT_*` variables.
#[test]
fn a_gang_scenario_with_a_killed_agent_passes_every_gang_checker_on_postgres() {
    // The URL comes from a file, as `serve` and `agent` take it (it never shows in the process list).
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-gang-url-{}", std::process::id()));
    std::fs::write(&file, format!("{}\n", database_url())).unwrap();
    let database = ["--database-url-file", file.to_str().unwrap()];
    let (output, text) = chaos_with("gang-agent-kill", &["tests/fixtures/chaos-gang-agent-kill.toml"], &database);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("scenario chaos-gang-agent-kill seed 1: PASSED"), "{text}");
    assert!(text.contains("faults injected: agent-kill 1"), "{text}");
    assert!(text.contains("incarnation 1 at"), "no gang restart: {text}");
    for checker in lockstep::sim::checkers::gang::NAMES {
        assert!(ok(&text, checker), "{checker} did not pass: {text}");
    }
    let dir = history_path(&text).parent().unwrap().to_path_buf();
    // The killed agent's job ended with it (the harness recorded it, the dead agent could not), and the agent
    // that started again on its work dir took a new node lease.
    let records = std::fs::read_to_string(dir.join("agent-1.records")).expect("agent-1's record");
    assert!(records.contains("\"died-with-agent\""), "{records}");
    assert!(records.lines().filter(|line| line.contains("\"record\":\"session\"")).count() >= 2, "{records}");
    // Each job was a real process in a sandbox of its own that wrote the YT_* variables it saw.
    let mut ranks = Vec::new();
    for agent in 0..3 {
        for sandbox in std::fs::read_dir(dir.join(format!("agent-{agent}"))).expect("a work dir").flatten() {
            let Ok(env) = std::fs::read_to_string(sandbox.path().join("yt-env")) else { continue };
            let rank = env.lines().find_map(|line| line.strip_prefix("YT_GANG_RANK=")).expect("a rank").to_string();
            assert!(env.contains("YT_OPERATION_INCARNATION="), "{env}");
            ranks.push(rank);
        }
    }
    ranks.sort();
    assert_eq!(ranks, ["0", "0", "1", "1", "2", "2"], "two incarnations of three ranks");
}

/// A role the server does not know is the URL's fault, said as real mode says it (exit 2), and the run leaves no
/// directory behind.
#[test]
fn a_database_url_the_server_refuses_is_bad_input() {
    let mut url = url::Url::parse(&database_url()).expect("DATABASE_URL parses");
    url.set_username("lockstep_no_such_role").unwrap();
    url.set_password(None).unwrap();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-role-{}", std::process::id()));
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["chaos", "run", KILL_PAUSE, "--database-url", url.as_str(), "--out", out.to_str().unwrap()])
        .output()
        .expect("the binary runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--database-url: ") && text.contains("lockstep_no_such_role"), "{text}");
    // Refused before it began, the run leaves no directory behind (a new user's trial found one per refusal in
    // /tmp).
    assert!(!out.exists(), "{} was left behind", out.display());
}

/// Runs the scenario file at `path` (whose `name` key is its file stem) with `args`; asserts the exit code and
/// the summary's verdict (`passed`: 0 and PASSED, else 1 and FAILED) and returns the output (also printed).
fn verdict(path: &str, args: &[&str], passed: bool) -> String {
    let name = Path::new(path).file_stem().and_then(|stem| stem.to_str()).expect("a file name");
    let mut all = vec![path];
    all.extend_from_slice(args);
    let (output, text) = chaos(name, &all);
    eprintln!("{text}");
    let (code, word) = if passed { (0, "PASSED") } else { (1, "FAILED") };
    assert_eq!(output.status.code(), Some(code), "{text}");
    assert!(text.contains(&format!("scenario {name} seed 1: {word}")), "{text}");
    text
}

/// The opt-in tests: each runs a scenario file that takes a minute or more (`cargo test --test all chaos:: --
/// --ignored`; the default command runs one gang scenario), asserts its verdict with [`verdict`] (`true`:
/// every checker passed), then the checks of its closure on the output.
macro_rules! opt_in {
    ($($(#[$doc:meta])* fn $test:ident($path:literal, $passed:literal) $checks:expr;)*) => {$(
        $(#[$doc])*
        #[test]
        #[ignore = "long: run with `cargo test --test all chaos:: -- --ignored`"]
        fn $test() {
            let checks: fn(&str) = $checks;
            checks(&verdict($path, &[], $passed));
        }
    )*};
}

opt_in! {
    /// The scenario file's `[mutation] gang_gate_disabled` is honoured on real processes: all-or-nothing gangs
    /// placed incrementally start their ranks a job apart, and `gang_ranks_together` fires on the agents' records
    /// (about 45 s).
    fn the_gang_gate_off_fires_gang_ranks_together_on_postgres("tests/fixtures/chaos-gang-gate-planted.toml", false)
        |text| assert!(fired(text, "gang_ranks_together"), "gang_ranks_together did not fire: {text}");

    /// The seed's gang completes in its first incarnation, three processes, three completions (about 40 s).
    fn the_seed_gang_example_passes_on_postgres("scenarios/gang-seed-example.toml", true) |_| {};

    /// An agent SIGKILLed under a rank; one gang restart, then completion (about 2 min).
    fn the_agent_death_gang_restart_passes_on_postgres("scenarios/gang-restart-agent-death.toml", true) |_| {};

    /// An agent cut off from PostgreSQL fences itself (kills its process) before the controller declares its node
    /// lost; one gang restart, then completion (about 2 min).
    fn the_partitioned_agent_fences_itself_on_postgres("scenarios/gang-partitioned-agent-self-fences.toml", true)
        |_| {};

    /// Replica-0 SIGSTOPped three times for twice the operations' lease (and random pauses of either replica)
    /// over slow links, each pause waiting until its replica is inside a pass (`[faults] pause_inside_pass`); a
    /// paused replica's writes come back stale, none applies with a superseded token, and all 120 jobs complete
    /// exactly once (about 3 min).
    fn the_paused_replica_with_stale_tokens_passes_on_postgres("scenarios/gang-paused-replica-stale-tokens.toml", true)
        |text| {
            let line = text.lines().find(|line| line.starts_with("pauses inside a pass: ")).expect("the pauses");
            let counts = line.trim_start_matches("pauses inside a pass: ");
            let (inside, all) = counts.split_once(" of ").expect("K of N");
            let (inside, all): (u32, u32) = (inside.parse().unwrap(), all.parse().unwrap());
            assert!(inside >= 1 && all >= 3, "{text}");
        };

    /// An all-or-nothing gang of three ranks on three agents of one slot loses an agent (SIGKILL) for 90 s, and a
    /// plain operation is submitted while the node is down: the restarting gang keeps the two slots it freed (the
    /// plain job starts after every rank of the gang's new incarnation, in the agents' own records), it is not
    /// failed as unfit while its node is coming back, and no two processes of one rank ever run at once
    /// (rank_exclusivity, from the agents' records) (about 4 min).
    fn a_restarting_gang_gets_its_slots_back_before_a_later_plain_job_on_postgres("scenarios/gang-node-returns.toml", true)
        |text| {
            assert!(text.contains("faults injected: agent-kill 1"), "{text}");
            assert!(ok(text, "rank_exclusivity"), "{text}");
            let dir = history_path(text).parent().unwrap().to_path_buf();
            let mut gang = Vec::new();
            let mut plain = Vec::new();
            for agent in 0..3 {
                let records = std::fs::read_to_string(dir.join(format!("agent-{agent}.records"))).expect("a record");
                for line in records.lines() {
                    let record: serde_json::Value = serde_json::from_str(line).expect("a JSON record");
                    if record["record"] != "start" {
                        continue;
                    }
                    let at = record["at_us"].as_u64().expect("a start time");
                    match record["task"].as_str() {
                        Some("g") if record["incarnation"].as_str().is_some_and(|i| i.ends_with("-i1")) => gang.push(at),
                        Some("p") => plain.push(at),
                        _ => {}
                    }
                }
            }
            assert_eq!((gang.len(), plain.len()), (3, 1), "three ranks restarted, one plain job: {gang:?} {plain:?}");
            let last_rank = gang.iter().max().unwrap();
            assert!(plain[0] > *last_rank, "the plain job started before the restarting gang got its slots back");
        };

    /// An agent and its job's process group frozen (SIGSTOP) for twice its node lease; the controller restarts
    /// the gang, and on SIGCONT the agent fences, killing the frozen job before it could run beside its rank's
    /// replacement (about 50 s).
    fn a_paused_agent_fences_on_waking_on_postgres("tests/fixtures/chaos-gang-agent-pause.toml", true) |text| {
        assert!(text.contains("faults injected: agent-pause 1"), "{text}");
        let trace = std::fs::read_to_string(history_path(text).with_file_name("trace.txt")).expect("the trace");
        assert!(trace.lines().any(|line| line.contains("agent-1") && line.contains("proc-pause")), "{trace}");
    };
}

/// A process as `/proc/PID/stat` shows it: its parent, its state letter, and when it started (clock ticks after
/// boot: with the pid, it tells the process from a later one that got its pid).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Proc {
    pid: i32,
    parent: i32,
    state: char,
    started: u64,
}

fn proc_of(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ppid … starttime …`: the fields after the command's closing parenthesis, from the state on.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Proc {
        pid,
        parent: fields[1].parse().ok()?,
        state: fields[0].chars().next()?,
        started: fields[19].parse().ok()?,
    })
}

/// Every live process under `root` (children, grandchildren, …).
fn descendants(root: i32) -> Vec<Proc> {
    let all: Vec<Proc> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter_map(proc_of)
        .filter(|proc| proc.state != 'Z')
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for proc in all.iter().filter(|proc| proc.parent == parent) {
            found.push(*proc);
            parents.push(proc.pid);
        }
    }
    found
}

/// Whether `proc` still runs (the same process: its pid and start time; a zombie does not).
fn still_running(proc: &Proc) -> bool {
    proc_of(proc.pid).is_some_and(|now| now.started == proc.started && now.state != 'Z')
}

/// Runs `query` (one text column) on the test database.
fn texts(query: &str, bind: &str) -> Vec<String> {
    use sqlx::Connection;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&database_url()).await.expect("connect to the test database");
        sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_string())).bind(bind).fetch_all(&mut conn).await.unwrap()
    })
}

/// The schemas of the `lockstep chaos run` process `pid` (`chaos_<pid>_<n>`).
fn schemas_of(pid: u32) -> Vec<String> {
    let prefix = format!("chaos_{pid}_");
    let all = texts("SELECT schema_name::text FROM information_schema.schemata WHERE schema_name LIKE $1", "chaos%");
    all.into_iter().filter(|schema| schema.starts_with(&prefix)).collect()
}

/// Waits until `ready` (looked at every 50 ms) is true, at most a minute.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "not within a minute: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts `lockstep chaos run` of `fixture` in a process group of its own (as a shell starts a command), waits
/// until `under_way` holds of its processes (given the harness's descendants, once its schema exists), sends
/// `signal` (to the group when `group`: Ctrl-C at a terminal), and returns its exit, its output, its pid, its
/// schema while it ran and the processes it had started.
fn interrupted(
    name: &str,
    fixture: &str,
    under_way: impl Fn(&[Proc]) -> bool,
    signal: libc::c_int,
    group: bool,
) -> (Output, String, u32, String, Vec<Proc>) {
    use std::os::unix::process::CommandExt;
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{name}-{}", std::process::id()));
    let child = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["chaos", "run", fixture, "--database-url", &database_url(), "--out", out.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("the binary runs");
    let pid = child.id();
    wait_for("the run's schema", || !schemas_of(pid).is_empty());
    let schema = schemas_of(pid).remove(0);
    let mut seen = Vec::new();
    wait_for("the run under way", || {
        let now = descendants(pid as i32);
        seen.extend(now.iter().filter(|proc| !seen.contains(*proc)).copied().collect::<Vec<_>>());
        under_way(&now)
    });
    let target = if group { -(pid as i32) } else { pid as i32 };
    // SAFETY: kill(2) of the child this test started (or its process group, which holds it alone).
    assert_eq!(unsafe { libc::kill(target, signal) }, 0);
    let output = child.wait_with_output().expect("the run ends");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output, text, pid, schema, seen)
}

/// Ctrl-C (SIGINT to the command's process group) while a replica is frozen: the run stops every replica (the
/// frozen one continued and drained), writes its fault log and history, drops its schema, says so, and exits
/// 130 as `sim sweep` does; no process of it is left. Before, it died at once: no output, no files but the
/// replicas' logs, its schema left behind.
#[test]
fn ctrl_c_stops_the_run_drops_its_schema_and_says_where_its_files_are() {
    // Under way: the killed replica started again and the paused one frozen (SIGSTOP, from 10 s on for 9 s).
    let (output, text, pid, schema, seen) =
        interrupted("ctrl-c", KILL_PAUSE, |now: &[Proc]| now.iter().any(|proc| proc.state == 'T'), libc::SIGINT, true);
    assert_eq!(output.status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted (Ctrl-C): the run stopped at "), "{text}");
    assert!(text.contains("every replica and agent stopped"), "{text}");
    assert!(text.contains(&format!("schema dropped: {schema}")), "{text}");
    assert!(schemas_of(pid).is_empty(), "the schema {schema} is left");
    let left: Vec<&Proc> = seen.iter().filter(|proc| still_running(proc)).collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    // The files are where the output says, with what the run did until then.
    let line = text.lines().find(|line| line.starts_with("files: ")).expect("the files' line");
    let dir = PathBuf::from(line.trim_start_matches("files: ").split(" (").next().unwrap());
    let faults = std::fs::read_to_string(dir.join("faults.txt")).expect("the fault log");
    assert!(faults.contains("kill") && faults.contains("pause"), "{faults}");
    let history = std::fs::read_to_string(dir.join("history.txt")).expect("the history");
    assert!(history.lines().any(|line| line.contains(" fetch ")), "no fetch recorded");
}

/// SIGTERM to the harness alone while the agents run their jobs: the agents stop on SIGTERM, killing their jobs'
/// process trees, and the run ends as after Ctrl-C (exit 130, its schema dropped, no process left).
#[test]
fn sigterm_stops_a_gang_run_with_its_agents_and_their_jobs() {
    let jobs = |now: &[Proc]| {
        let children: Vec<i32> = now.iter().map(|proc| proc.pid).collect();
        // A job runs: a process under an agent (replicas and agents are the harness's children).
        now.iter().any(|proc| children.contains(&proc.parent))
    };
    let (output, text, pid, schema, seen) =
        interrupted("sigterm", "tests/fixtures/chaos-gang-agent-kill.toml", jobs, libc::SIGTERM, false);
    assert_eq!(output.status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted (SIGTERM): the run stopped at "), "{text}");
    assert!(text.contains(&format!("schema dropped: {schema}")), "{text}");
    assert!(schemas_of(pid).is_empty(), "the schema {schema} is left");
    let left: Vec<&Proc> = seen.iter().filter(|proc| still_running(proc)).collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    assert!(seen.len() > 5, "no job seen: {seen:?}");
}
