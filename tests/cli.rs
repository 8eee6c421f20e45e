//! The `lockstep` binary of the normal build: `lockstep sim …` needs the simulator build and says how to get it
//! (the simulator build's commands are tested in `tests/sim_cli.rs`).
#![cfg(not(madsim))]

use std::process::Command;

#[test]
fn sim_commands_in_the_normal_build_name_the_simulator_build_command_and_exit_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_lockstep"))
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
    let output = Command::new(env!("CARGO_BIN_EXE_lockstep"))
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
    let output = Command::new(env!("CARGO_BIN_EXE_lockstep"))
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
