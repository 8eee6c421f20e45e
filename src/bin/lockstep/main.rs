//! The `lockstep` command line (DESIGN §6). The normal build carries the real-mode commands (`serve`, `agent`,
//! `submit`, `status`, `abort`, `migrate`: controller replicas and node agents on PostgreSQL running real
//! processes); the simulator build (`--cfg madsim`) carries `lockstep sim run | sweep | swarm | merge | replay | explain | shrink`
//! (`sim.rs`), and in the normal build `lockstep sim …` says how to get that build.
//!
//! Exit codes: 0 success; 1 a failed check, expectation or operation (or nothing found); 2 bad input (clap's
//! usage errors too); 3 a replay that did not reproduce its trace; 4 a merged sweep with seeds missing; 130 a
//! sweep interrupted by Ctrl-C or SIGTERM (after printing the table of what finished), or a `chaos run` (after
//! stopping its processes and dropping its schema).

#[cfg(not(madsim))]
mod real;

/// The allocator: mimalloc, for both builds (glibc's malloc and free were a third of the controller's
/// and the simulator's instructions; see Cargo.toml), through its plain entry points where they give the alignment
/// asked for (`lockstep::alloc`). No run of the simulator depends on it: allocation addresses
/// never reach a trace.
#[global_allocator]
static ALLOCATOR: lockstep::alloc::Mimalloc = lockstep::alloc::Mimalloc;

use clap::Parser;
use std::process::ExitCode;

/// Leased-row pipelines, a YTsaurus-style gang controller, and a deterministic simulator to prove them.
#[derive(clap::Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Leased-row pipelines, a YTsaurus-style gang controller, its node agents, and their simulator",
    long_about = "Leased-row pipelines, a YTsaurus-style gang controller on them, its node agents, and their \
                  deterministic simulator.\n\n\
                  Real mode: controller replicas (`serve`) and node agents (`agent`) coordinate through one \
                  PostgreSQL database and run jobs as OS processes; `submit`, `list`, `status`, `abort` and \
                  `migrate` talk to the same database. Logs go to stderr, filtered by RUST_LOG (default: info,sqlx=warn).\n\n\
                  Simulator: `sim run | sweep | swarm | merge | replay | explain | shrink` run scenario files deterministically (the \
                  simulator build: `cargo sim …`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One value per process, parsed once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
enum Command {
    #[cfg(not(madsim))]
    #[command(flatten)]
    Real(real::Command),
    /// Scenario files under the deterministic simulator: run, sweep, swarm, merge, replay, explain, shrink.
    #[cfg(madsim)]
    #[command(subcommand)]
    Sim(lockstep::sim::cli::Command),
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
        let args =
            if self.args.is_empty() { vec!["run".into(), "scenarios/rows-quiet.toml".into()] } else { self.args };
        let command = lockstep::sim::shell::command("env -u RUSTFLAGS cargo sim", &args);
        eprintln!(
            "lockstep sim: the simulator commands need the simulator build (this crate compiled with --cfg madsim),\n\
             and this binary is the normal build. From the repository, run:\n\n    \
             {command}\n\n\
             (`cargo sim` is the alias in .cargo/config.toml that builds and runs target/sim/release/lockstep sim; \
             RUSTFLAGS must be unset, or it replaces the --cfg madsim flag)"
        );
        ExitCode::from(2)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    #[cfg(not(madsim))]
    let long_running = matches!(&cli.command, Command::Real(command) if command.is_long_running());
    #[cfg(madsim)]
    let long_running = false;
    if !long_running {
        lockstep::interrupt::end_quietly_on_a_closed_pipe();
    }
    match cli.command {
        #[cfg(not(madsim))]
        Command::Real(command) => real::run(command),
        #[cfg(madsim)]
        Command::Sim(command) => lockstep::sim::cli::execute(command, &lockstep::sim::cli::Registry::builtin()),
        #[cfg(not(madsim))]
        Command::Sim(needs) => needs.refuse(),
    }
}
