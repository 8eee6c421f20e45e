//! Real mode: the commands that run the controller and its agents on PostgreSQL and talk to them (normal build
//! only: sqlx and OS processes do not exist under the simulator). The logic lives in the library
//! (`lockstep::gang::replica`, `lockstep::agent`, `lockstep::gang::api`, `lockstep::gang::status`); this module
//! parses flags, connects, waits for signals and maps outcomes to exit codes.
//!
//! Exit codes: 0 success (`submit --wait`: the operation completed); 1 a runtime failure (database unreachable,
//! operation not found or already ended) or, with `submit --wait`, an operation that failed or was aborted; 2 bad
//! usage: an unknown flag, a bad value, a spec that does not parse or breaks a rule (the message names the field).

mod agent;
mod client;
use lockstep::duration;
mod serve;

use lockstep::store::{PgOptions, PgStore, StoreError};
use std::process::ExitCode;
use std::time::Duration;

/// The real-mode commands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Run a controller replica: the operation pipeline on PostgreSQL until SIGTERM or Ctrl-C, then drain.
    Serve(serve::ServeArgs),
    /// Run a node agent: lease the node, run the jobs placed on it as OS processes, until SIGTERM or Ctrl-C.
    Agent(agent::AgentArgs),
    /// Submit an operation spec (YSON, JSON or YAML); print its id.
    Submit(client::SubmitArgs),
    /// Show an operation: state, incarnation, and jobs by task with rank, cookie, state and node.
    Status(client::StatusArgs),
    /// Ask a running operation to abort.
    Abort(client::AbortArgs),
    /// Create the schema and apply the database migrations (idempotent).
    Migrate(client::MigrateArgs),
}

impl Command {
    /// Whether the command runs until stopped (`serve`, `agent`) rather than printing a result and exiting.
    pub fn is_long_running(&self) -> bool {
        matches!(self, Command::Serve(_) | Command::Agent(_))
    }
}

/// Where the database is. Every command takes these.
#[derive(clap::Args, Debug, Clone)]
pub struct Database {
    /// PostgreSQL connection URL, e.g. postgres://postgres@127.0.0.1:5432/lockstep.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Schema holding lockstep's tables. `migrate`, `serve` and `agent` create and migrate it if needed;
    /// `submit`, `status` and `abort` refuse a schema that is not migrated (exit 2) and change nothing. Replicas,
    /// agents and clients of one cluster use the same schema.
    #[arg(long, env = "LOCKSTEP_SCHEMA", default_value = PgOptions::SCHEMA_DEFAULT)]
    pub schema: String,
}

impl Database {
    /// Connects with `max_connections` pooled sessions, `application_name` = `name`, creating the schema if
    /// missing and applying the migrations not yet applied (`migrate`, `serve`, `agent`).
    pub async fn connect(&self, name: &str, max_connections: u32) -> Result<PgStore, Failure> {
        self.connect_with(name, max_connections, true).await
    }

    /// As [`Database::connect`] but runs no DDL (`submit`, `status`, `abort`): a schema that is missing or not
    /// fully migrated is a usage error (exit 2) naming the schema and the `migrate` command.
    pub async fn connect_migrated(&self, name: &str, max_connections: u32) -> Result<PgStore, Failure> {
        self.connect_with(name, max_connections, false).await
    }

    async fn connect_with(&self, name: &str, max_connections: u32, migrate: bool) -> Result<PgStore, Failure> {
        let mut options = PgOptions::new(self.database_url.clone());
        options.migrate = migrate;
        options.schema = self.schema.clone();
        options.application_name = name.to_string();
        options.max_connections = max_connections;
        PgStore::connect_with(options).await.map_err(|error| match error {
            StoreError::Invalid(message) if message.contains("is not migrated") => Failure::usage(message),
            StoreError::Invalid(message) => Failure::usage(format!("--schema / --database-url: {message}")),
            error => Failure::runtime(format!("cannot connect to PostgreSQL (schema {}): {error}", self.schema)),
        })
    }
}

/// Why a command ended unsuccessfully: its exit code and its message.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Exit code 1: the world failed (the database, an operation that is gone), or a waited-for operation did
    /// not complete.
    pub fn runtime(message: impl Into<String>) -> Failure {
        Failure { code: 1, message: message.into() }
    }

    /// Exit code 2: the user's input is wrong.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { code: 2, message: message.into() }
    }
}

/// Runs `command` on a runtime of its own and returns the process's exit code.
pub fn run(command: Command) -> ExitCode {
    init_logs();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lockstep: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async move {
        match command {
            Command::Serve(args) => serve::run(args).await,
            Command::Agent(args) => agent::run(args).await,
            Command::Submit(args) => client::submit(args).await,
            Command::Status(args) => client::status(args).await,
            Command::Abort(args) => client::abort(args).await,
            Command::Migrate(args) => client::migrate(args).await,
        }
    });
    // Job processes and in-flight store calls must not hold the exit up: the commands already drained what they
    // meant to.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("lockstep: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Logs to stderr through `tracing`, filtered by RUST_LOG (default: info, sqlx at warn); colours only on a terminal.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

/// Resolves at the first SIGTERM or SIGINT (Ctrl-C), naming it.
pub async fn termination() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install the SIGTERM/SIGINT handlers; stop this process with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[test]
    fn every_command_takes_the_database_flags() {
        for command in ["serve", "migrate"] {
            let cli = Cli::try_parse_from(["lockstep", command, "--database-url", "postgres://h/db", "--schema", "s1"]);
            assert!(cli.is_ok(), "{command}: {:?}", cli.err());
        }
        let cli = Cli::try_parse_from(["lockstep", "status", "7", "--database-url", "postgres://h/db"]).unwrap();
        let Command::Status(status) = cli.command else { panic!("not status") };
        assert_eq!(status.database.schema, PgOptions::SCHEMA_DEFAULT);
    }
}
