//! The `lockstep` binary of the normal build: `lockstep sim …` needs the simulator build and says how to get it
//! (the simulator build's commands are tested in `tests/sim_cli.rs`).
#![cfg(not(madsim))]

use crate::support;

use std::path::Path;
use std::process::Command;
use support::command::{SIMULATOR_PREFIX, clean_command};

#[test]
fn sim_commands_in_the_normal_build_name_the_simulator_build_command_and_exit_2() {
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["sim", "run", "scenarios/rows-quiet.toml", "--seed", "3"])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the simulator commands need the simulator build"), "{stderr}");
    assert!(stderr.contains("env -u RUSTFLAGS cargo sim run scenarios/rows-quiet.toml --seed 3"), "{stderr}");
}

/// The command it prints pastes into a shell as the arguments it was given: a path with a space stays one word.
#[test]
fn the_simulator_build_command_quotes_what_the_shell_would_split() {
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["sim", "replay", "my runs/it's.replay.json"])
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(r"env -u RUSTFLAGS cargo sim replay 'my runs/it'\''s.replay.json'"), "{stderr}");
}

/// A spec with a NUL character is a bad spec (exit 2, naming the field) refused before any connection; a trial's
/// reached the store and exited 1 with "invalid store call".
#[test]
fn submit_of_a_spec_with_a_nul_character_exits_2_naming_the_field() {
    let path = std::env::temp_dir().join(format!("lockstep-cli-nul-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"tasks": {"t": {"job_count": 1, "command": "echo a\u0000b"}}}"#).expect("write the spec");
    let output = clean_command(env!("CARGO_BIN_EXE_lockstep"))
        .args(["submit", &path.display().to_string(), "--database-url", "postgres://nobody@127.0.0.1:1/x"])
        .env_remove("DATABASE_URL")
        .output()
        .expect("the binary runs");
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tasks.t.command: contains a NUL character"), "{stderr}");
    assert!(!stderr.contains("cannot connect") && !stderr.contains("invalid store call"), "{stderr}");
}

/// A program a test starts sees none of the caller's `MADSIM_*` variables (`MADSIM_TEST_NUM=5` ran the simulator
/// build's quick-start example five times under `tests/readme.rs`). This test runs itself again with
/// `MADSIM_TEST_NUM=5` set; the second run (the probe, told by `LOCKSTEP_TEST_PROBE`) starts `env` through the
/// tests' helper and prints what it saw.
#[test]
fn a_program_a_test_starts_sees_none_of_the_callers_madsim_variables() {
    const PROBE: &str = "LOCKSTEP_TEST_PROBE";
    let env_line = |line: &str| line.starts_with(SIMULATOR_PREFIX) || line.starts_with(PROBE);
    if std::env::var_os(PROBE).is_some() {
        let output = clean_command("env").output().expect("env runs");
        for line in String::from_utf8_lossy(&output.stdout).lines().filter(|line| env_line(line)) {
            // On a line of its own: libtest prints the test's name first, with no line end.
            println!("\nprobe saw {line}");
        }
        return;
    }
    // The test's libtest name: its path below the test crate (`cli::…`).
    let module = module_path!().split_once("::").map_or("", |(_crate, module)| module);
    let name = format!("{module}::a_program_a_test_starts_sees_none_of_the_callers_madsim_variables");
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads", "1"])
        .env(PROBE, "1")
        .env("MADSIM_TEST_NUM", "5")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let seen: Vec<&str> = stdout.lines().filter_map(|line| line.strip_prefix("probe saw ")).collect();
    assert!(seen.contains(&"LOCKSTEP_TEST_PROBE=1"), "the probe's child saw its own variable: {stdout}");
    assert!(seen.iter().all(|line| !line.starts_with(SIMULATOR_PREFIX)), "{seen:?}");
}

/// Every test file, and the example project's, starts programs through its helper (`tests/support/command.rs`,
/// and the example project's own `orders_sim` and production test), so none inherits the caller's `MADSIM_*` variables: the only
/// `Command::new` is the helpers' own.
#[test]
fn every_test_starts_its_programs_through_the_helper_that_clears_madsim_variables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = [
        ("tests/support/command.rs", 1),
        ("tests/cli.rs", 1),
        ("examples/user-pipelines/tests/cli.rs", 1),
        ("examples/user-pipelines/tests/production.rs", 1),
    ];
    let mut files = Vec::new();
    for dir in ["tests", "tests/support", "tests/gang_support", "examples/user-pipelines/tests"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap_or_else(|error| panic!("{dir}: {error}")) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 40, "the test files were found: {files:?}");
    for path in files {
        let relative = path.strip_prefix(root).unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        // Counted as written, so this line's own text is not one.
        let found = text.matches(concat!("Command", "::new(")).count();
        let allowed = allowed.iter().find(|(file, _)| *file == relative).map_or(0, |(_, count)| *count);
        assert_eq!(found, allowed, "{relative}: start programs with support::command::command");
    }
}
