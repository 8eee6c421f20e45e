//! The project's own simulator binary (`src/bin/orders-sim.rs`) as a command: how it behaves at its edges.
//!
//! Run with `env -u RUSTFLAGS cargo sim-test` (the simulator build; see `.cargo/config.toml`).
#![cfg(madsim)]

/// The project's own simulator binary ends quietly when its output pipe closes (`orders-sim run … | head -1`), as
/// `lockstep sim` does: the process ends by SIGPIPE, with no panic printed (a new user's trial found a panic
/// and a backtrace).
#[test]
fn a_closed_stdout_ends_the_project_binary_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/orders-mixed.toml");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orders-sim"))
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
