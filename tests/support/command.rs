//! Child processes of the tests. Every test that starts a program (the `lockstep` binary, cargo, a shell, a
//! browser driver) starts it through [`clean_command`], never `Command::new`, so that the child does not inherit the
//! caller's `MADSIM_*` variables: they are the simulator's knobs for the test binary that reads them
//! (`MADSIM_TEST_NUM=5` runs each simulator test on 5 seeds), not for a program it runs; the simulator build's
//! quick-start example, run through cargo with `MADSIM_TEST_NUM=5` set, printed its line five times and
//! `tests/readme.rs` failed. `tests/cli.rs` checks the rule and that no test file starts a program another way.

use std::ffi::OsStr;
use std::process::Command;

/// The prefix of the simulator's variables (madsim's `MADSIM_TEST_SEED`, `MADSIM_TEST_NUM`, ...).
pub const SIMULATOR_PREFIX: &str = "MADSIM_";

/// A new `Command` for `program` with every `MADSIM_*` variable of this process's environment removed from the child's.
pub fn clean_command(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with(SIMULATOR_PREFIX) {
            command.env_remove(name);
        }
    }
    command
}

/// The variables (by prefix) cargo sets for a test process about the test's own package (`CARGO_PKG_NAME`,
/// `CARGO_MANIFEST_DIR`, `OUT_DIR`, ...). A cargo started by a test must not inherit them: some dependencies' builds
/// read `CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR` or `OUT_DIR`, so a child cargo that sees them finds those crates
/// stale and rebuilds them and lockstep, and the next cargo outside the test rebuilds them again (9 crates, 25 to
/// 75 s each time, measured).
const SET_BY_CARGO_TEST: [&str; 7] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];

/// [`clean_command`] for cargo itself (`env!("CARGO")`), also without the variables cargo set for this test
/// process, so that the child builds what a shell's cargo builds and reuses its artifacts.
pub fn cargo_command() -> Command {
    let mut command = clean_command(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if SET_BY_CARGO_TEST.iter().any(|prefix| name_text.starts_with(prefix)) {
            command.env_remove(name);
        }
    }
    command
}
