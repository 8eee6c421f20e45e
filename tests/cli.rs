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
