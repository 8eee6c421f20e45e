//! The `lockstep` command line (DESIGN §6). The normal build carries the real-mode commands (`serve`, `agent`,
//! `submit`, `status`, `abort`, `migrate`: controller replicas and node agents on PostgreSQL running real
//! processes); the simulator build carries the simulator's commands.

#[cfg(not(madsim))]
mod real;

use clap::Parser;
use std::process::ExitCode;

/// The command line.
#[derive(clap::Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Leased-row pipelines, a YTsaurus-style gang controller on them, and its node agents",
    long_about = "Leased-row pipelines, a YTsaurus-style gang controller on them, and its node agents.\n\n\
                  Real mode: controller replicas (`serve`) and node agents (`agent`) coordinate through one \
                  PostgreSQL database and run jobs as OS processes; `submit`, `status` and `abort` talk to the \
                  same database. Logs go to stderr, filtered by RUST_LOG (default: info)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    #[cfg(not(madsim))]
    #[command(flatten)]
    Real(real::Command),
    /// Simulator commands (placeholder until they land in this build).
    #[cfg(madsim)]
    Sim,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(not(madsim))]
        Command::Real(command) => real::run(command),
        #[cfg(madsim)]
        Command::Sim => {
            eprintln!("lockstep: the simulator commands are not in this build yet");
            ExitCode::from(2)
        }
    }
}
