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
