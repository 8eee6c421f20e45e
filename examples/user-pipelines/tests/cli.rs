//! The project's own simulator binary (`src/bin/orders-sim.rs`) as a command: how it behaves at its edges.
//!
//! Run with `env -u RUSTFLAGS cargo sim-test` (the simulator build; see `.cargo/config.toml`).
#![cfg(madsim)]

/// The project's simulator binary as a command, without the caller's `MADSIM_*` variables: they are the knobs of
/// this test binary (`MADSIM_TEST_NUM=5` runs each simulator test on 5 seeds), not of a program it runs.
fn orders_sim() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_orders-sim"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MADSIM_") {
            command.env_remove(name);
        }
    }
    command
}

/// The project's own simulator binary ends quietly when its output pipe closes (`orders-sim run … | head -1`), as
/// `lockstep sim` does: the process ends by SIGPIPE, with no panic printed (a new user's trial found a panic
/// and a backtrace).
#[test]
fn a_closed_stdout_ends_the_project_binary_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/orders-mixed.toml");
    let mut child = orders_sim()
        .arg("run")
        .arg(&scenario)
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("the run ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    const SIGPIPE: i32 = 13;
    assert_eq!(output.status.signal(), Some(SIGPIPE), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A failing run prints the command that replays it, and that command works as pasted: its words are the `sim-run`
/// alias that both lockstep's workspace and this project's `cargo-config.toml` define, then this binary's
/// arguments, which its own parser takes and which replay the failure exactly. (`cargo sim` in lockstep's
/// workspace runs `lockstep sim`, which refuses this binary's replay files: a new user's trial pasted it.)
#[test]
fn a_failing_run_prints_a_replay_command_that_works_as_pasted() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("orders-sim-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let orders_sim = |args: &[&str]| orders_sim().args(args).current_dir(&dir).output().expect("the binary runs");
    let scenario = root.join("scenarios/orders-without-keys.toml");
    let run = orders_sim(&["run", scenario.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    let line = stdout.lines().find_map(|line| line.strip_prefix("replay it with: ")).expect("a replay command");
    let words = lockstep::sim::shell::split(line).expect("quotes closed");
    let prefix = "env -u RUSTFLAGS cargo sim-run --release -p user-pipelines --bin orders-sim --";
    assert_eq!(words[..prefix.split(' ').count()], prefix.split(' ').collect::<Vec<_>>()[..], "{line}");
    for config in [root.join("../../.cargo/config.toml"), root.join("cargo-config.toml")] {
        let text = std::fs::read_to_string(&config).unwrap();
        let alias = text.lines().find(|line| line.starts_with("sim-run = "));
        let alias = alias.unwrap_or_else(|| panic!("{} defines no sim-run alias", config.display()));
        assert!(alias.starts_with("sim-run = [\"run\", ") && alias.contains("--cfg=madsim"), "{alias}");
    }
    let args: Vec<&str> = words[prefix.split(' ').count()..].iter().map(String::as_str).collect();
    assert_eq!(args, ["replay", "lockstep-replays/orders-without-keys-seed-1.replay.json"]);
    if let Err(error) = lockstep::sim::cli::try_parse_from(std::iter::once("orders-sim").chain(args.iter().copied())) {
        panic!("`{line}` does not parse: {error}");
    }
    let replay = orders_sim(&args);
    let replayed = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{replayed}{}", String::from_utf8_lossy(&replay.stderr));
    assert!(replayed.contains("reproduced: trace hash"), "{replayed}");
    // A replay file whose run this build does not reproduce, under the same build id (as when a handler changed
    // and the id did not follow it): the message names the edit as a cause before a determinism bug.
    let path = dir.join(args[1]);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut file: lockstep::sim::replay::ReplayFile = serde_json::from_str(&text).unwrap();
    file.trace.hash = "0000000000000000".into();
    std::fs::write(&path, file.sealed().to_json()).unwrap();
    let replay = orders_sim(&args);
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(replay.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("NOT reproduced") && stderr.contains("handlers changed since"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
