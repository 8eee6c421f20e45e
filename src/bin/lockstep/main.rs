//! The `lockstep` command line (DESIGN §6). The simulator build (`--cfg madsim`) carries `lockstep sim run |
//! sweep | replay | explain` (`sim.rs`); in the normal build `lockstep sim …` says how to get that build.
//!
//! Exit codes: 0 success; 1 a failed check or expectation (or nothing found); 2 bad input (clap's usage
//! errors too); 3 a replay that did not reproduce its trace.

#[cfg(madsim)]
mod sim;

use clap::Parser;
use std::process::ExitCode;

/// Leased-row pipelines, a YTsaurus-style gang controller, and a deterministic simulator to prove them.
#[derive(clap::Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Leased-row pipelines, a gang controller, and their deterministic simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Scenario files under the deterministic simulator: run, sweep, replay, explain.
    #[cfg(madsim)]
    #[command(subcommand)]
    Sim(sim::Command),
    /// Scenario files under the deterministic simulator (needs the simulator build: `cargo sim …`).
    #[cfg(not(madsim))]
    Sim(NeedsSimBuild),
}

/// `lockstep sim …` in the normal build: whatever follows `sim`, kept to print the command that runs it.
#[cfg(not(madsim))]
#[derive(clap::Args)]
struct NeedsSimBuild {
    /// The simulator command and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
}

#[cfg(not(madsim))]
impl NeedsSimBuild {
    /// Explains that the simulator commands live in the simulator build, with the exact command; exit 2.
    fn refuse(self) -> ExitCode {
        let args = if self.args.is_empty() { "run scenarios/rows-quiet.toml".to_string() } else { self.args.join(" ") };
        eprintln!(
            "lockstep sim: the simulator commands need the simulator build (this crate compiled with --cfg madsim),\n\
             and this binary is the normal build. From the repository, run:\n\n    \
             env -u RUSTFLAGS cargo sim {args}\n\n\
             (`cargo sim` is the alias in .cargo/config.toml that builds and runs target/sim/release/lockstep sim; \
             RUSTFLAGS must be unset, or it replaces the --cfg madsim flag)"
        );
        ExitCode::from(2)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(madsim)]
        Command::Sim(command) => sim::main(command),
        #[cfg(not(madsim))]
        Command::Sim(needs) => needs.refuse(),
    }
}
