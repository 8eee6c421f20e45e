//! Real mode: the commands that run the controller and its agents on PostgreSQL and talk to them (normal build
//! only: sqlx and OS processes do not exist under the simulator). The logic lives in the library
//! (`lockstep::gang::replica`, `lockstep::agent`, `lockstep::gang::api`, `lockstep::gang::status`); this module
//! parses flags, connects, waits for signals and maps outcomes to exit codes.
//!
//! Exit codes: 0 success (`submit --wait`: the operation completed; `abort`: the abort was requested, or the
//! operation had already ended, which the message says); 1 a runtime failure (database unreachable, operation not
//! found) or, with `submit --wait`, an operation that failed or was aborted; 2 bad usage: an unknown flag, a bad
//! value, a spec that does not parse or breaks a rule (the message names the field).

mod agent;
mod chaos;
mod chaos_nodes;
mod client;
use lockstep::duration;
use lockstep::files;
mod serve;

use lockstep::store::{PgOptions, PgStore, StoreError};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The longest `--lease-ttl` of `serve` and `agent`: 1 h. The ttl is how long a dead replica's operations (or a dead
/// agent's jobs) wait before another process takes them over; past an hour that is an outage rather than a lease,
/// and a slip of the unit (`30h` for `30s`) must not make one silently.
pub const LEASE_TTL_MAX: Duration = Duration::from_secs(3600);

/// `--call-timeout`'s default as the flag writes it: [`PgOptions::CALL_TIMEOUT_DEFAULT`] (a test checks they agree).
const CALL_TIMEOUT_DEFAULT_TEXT: &str = "36s";

/// The environment variable holding the connection URL when neither `--database-url` nor `--database-url-file`
/// is given.
const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// The most bytes `--database-url-file` may hold: 64 KiB, far past any URL (PostgreSQL's own limits on names and
/// passwords keep one to a few hundred bytes); the cap keeps a path that is not a URL file (`/dev/zero`, a pipe
/// that never ends) from being read until memory runs out.
const DATABASE_URL_FILE_BYTES_MAX: u64 = 64 * 1024;

/// The form of a connection URL, for messages.
const URL_FORM: &str = PgOptions::URL_FORM;

/// Parses a `--lease-ttl`: a duration ([`duration::parse`]) longer than zero and at most [`LEASE_TTL_MAX`].
///
/// # Errors
/// A message naming the value and the rule (clap adds the flag).
pub fn lease_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration::parse(text)?;
    if ttl.is_zero() {
        return Err(format!("{text}: a lease ttl must be longer than zero"));
    }
    if ttl > LEASE_TTL_MAX {
        return Err(format!(
            "{text} exceeds the longest lease ttl, {}: a dead process's work would wait that long before it is \
             taken over",
            humantime(LEASE_TTL_MAX)
        ));
    }
    Ok(ttl)
}

/// `span` as the flags write it, for messages (`1h`, `90s`, `500ms`).
fn humantime(span: Duration) -> String {
    match span.as_millis() {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

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
    /// List operations, newest first: id, state, submission time and age, incarnation, tasks, result; filtered by
    /// state and age.
    List(client::ListArgs),
    /// Ask a running operation to abort (exit 0 also when it had already ended: the message says how).
    Abort(client::AbortArgs),
    /// Create the schema and apply the database migrations (idempotent).
    Migrate(client::MigrateArgs),
    /// Scenario files on real PostgreSQL and real processes, with real faults and the simulator's checkers.
    #[command(subcommand)]
    Chaos(chaos::ChaosCommand),
}

impl Command {
    /// Whether the command runs until stopped (`serve`, `agent`, a chaos run's nodes) rather than printing a result
    /// and exiting.
    pub fn is_long_running(&self) -> bool {
        match self {
            Command::Serve(_) | Command::Agent(_) => true,
            Command::Chaos(command) => command.is_long_running(),
            _ => false,
        }
    }
}

/// Where the database is. Every command takes these. The URL comes from `--database-url-file` or
/// `--database-url` (one or the other: clap refuses the two together, exit 2), else the `DATABASE_URL`
/// environment variable.
#[derive(clap::Args, Debug, Clone)]
pub struct Database {
    /// PostgreSQL connection URL, postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE. Every local user can read it in
    /// the process list while the command runs: for a URL with a password, use --database-url-file or the
    /// DATABASE_URL environment variable instead. Without either flag, the URL is DATABASE_URL's.
    #[arg(long, value_name = "URL", conflicts_with = "database_url_file")]
    pub database_url: Option<String>,
    /// A file holding the connection URL (white space around it is ignored), read at start: the URL does not show
    /// in the process list. Keep the file readable by its owner only.
    #[arg(long, value_name = "PATH")]
    pub database_url_file: Option<PathBuf>,
    /// Schema holding lockstep's tables. `migrate`, `serve` and `agent` create and migrate it if needed;
    /// `submit`, `status`, `list` and `abort` refuse a schema that is not migrated (exit 2) and change nothing. Replicas,
    /// agents and clients of one cluster use the same schema.
    #[arg(long, env = "LOCKSTEP_SCHEMA", default_value = PgOptions::SCHEMA_DEFAULT)]
    pub schema: String,
}

impl Database {
    /// Connects with `max_connections` pooled sessions, `application_name` = `name`, creating the schema if
    /// missing and applying the migrations not yet applied (`migrate`, `serve`, `agent`). `lease_ttl`: the
    /// shortest lease the process holds, if any; a store call waits at most a quarter of it for a row lock
    /// (PostgreSQL's `lock_timeout`, at most [`PgOptions::LOCK_TIMEOUT_DEFAULT`]), so one stuck behind a frozen
    /// session fails in time for the heartbeat to try again.
    pub async fn connect(
        &self,
        name: &str,
        max_connections: u32,
        lease_ttl: Option<Duration>,
    ) -> Result<PgStore, Failure> {
        self.connect_with(name, max_connections, true, lease_ttl).await
    }

    /// As [`Database::connect`] but runs no DDL (`submit`, `status`, `list`, `abort`): a schema that is missing or not
    /// fully migrated is a usage error (exit 2) naming the schema and the `migrate` command.
    pub async fn connect_migrated(&self, name: &str, max_connections: u32) -> Result<PgStore, Failure> {
        self.connect_with(name, max_connections, false, None).await
    }

    async fn connect_with(
        &self,
        name: &str,
        max_connections: u32,
        migrate: bool,
        lease_ttl: Option<Duration>,
    ) -> Result<PgStore, Failure> {
        self.connect_tuned(name, max_connections, migrate, lease_ttl, |_| {}).await
    }

    /// As [`Database::connect`], with `tune` changing the store's options last (chaos mode's history and planted
    /// bug).
    pub async fn connect_tuned(
        &self,
        name: &str,
        max_connections: u32,
        migrate: bool,
        lease_ttl: Option<Duration>,
        tune: impl FnOnce(&mut PgOptions),
    ) -> Result<PgStore, Failure> {
        let (url, source) = self.url(std::env::var(DATABASE_URL_VAR).ok())?;
        let mut options = PgOptions::new(url);
        options.migrate = migrate;
        options.schema = self.schema.clone();
        options.application_name = name.to_string();
        options.max_connections = max_connections;
        if let Some(ttl) = lease_ttl {
            options.lock_timeout = options.lock_timeout.min(ttl / 4);
        }
        tune(&mut options);
        PgStore::connect_with(options).await.map_err(|error| self.connect_failure(error, &source))
    }

    /// The connection URL and where it came from (the flag or variable that messages name), from
    /// `--database-url-file`, `--database-url` or `env_url` (`DATABASE_URL`), in that order; checked to be a
    /// PostgreSQL URL.
    ///
    /// Errors (usage): no URL anywhere, a file that cannot be read, is past [`DATABASE_URL_FILE_BYTES_MAX`] or holds
    /// no URL, a URL of another scheme.
    /// No message contains the URL.
    fn url(&self, env_url: Option<String>) -> Result<(String, String), Failure> {
        let (url, source) = match (&self.database_url_file, &self.database_url, env_url) {
            (Some(path), _, _) => {
                let source = format!("--database-url-file {}", path.display());
                let text = files::read_text(path, "database URL file", DATABASE_URL_FILE_BYTES_MAX)
                    .map_err(|error| Failure::usage(format!("{source}: cannot read it: {error}")))?;
                let url = text.trim();
                if url.is_empty() || url.contains(char::is_whitespace) {
                    let what = if url.is_empty() { "is empty" } else { "holds more than a URL" };
                    return Err(Failure::usage(format!("{source}: the file {what}; write one URL, {URL_FORM}")));
                }
                (url.to_string(), source)
            }
            (None, Some(url), _) => (url.clone(), "--database-url".to_string()),
            (None, None, Some(url)) if !url.is_empty() => (url, DATABASE_URL_VAR.to_string()),
            (None, None, _) => {
                return Err(Failure::usage(format!(
                    "no database URL: give --database-url-file PATH, set {DATABASE_URL_VAR}, or give --database-url \
                     URL ({URL_FORM})"
                )));
            }
        };
        PgOptions::check_url(&url).map_err(|rule| Failure::usage(format!("{source}: {rule}")))?;
        Ok((url, source))
    }

    /// The failure of a connect, in the user's terms: a URL or schema the store refused is the flag's fault (exit
    /// 2); a server that cannot be reached is "cannot connect" (exit 1); anything else (a migration that fails, a
    /// permission the role lacks) names the schema it could not open (exit 1).
    fn connect_failure(&self, error: StoreError, source: &str) -> Failure {
        match error {
            StoreError::Invalid(message) if message.contains("is not migrated") => Failure::usage(message),
            StoreError::Invalid(message) => match message.strip_prefix("schema: ") {
                Some(rule) => Failure::usage(format!("--schema {rule}")),
                None => Failure::usage(format!("{source}: {message}")),
            },
            error @ (StoreError::Unavailable(_) | StoreError::Timeout(_)) => {
                Failure::runtime(format!("cannot connect to PostgreSQL (URL from {source}): {error}"))
            }
            error => Failure::runtime(format!("cannot open schema {} on PostgreSQL: {error}", self.schema)),
        }
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
            Command::List(args) => client::list(args).await,
            Command::Abort(args) => client::abort(args).await,
            Command::Migrate(args) => client::migrate(args).await,
            Command::Chaos(command) => match chaos::execute(command).await {
                Ok(0) => Ok(()),
                // The run said what it did on stdout.
                Ok(code @ chaos::INTERRUPTED) => Err(Failure { code, message: String::new() }),
                Ok(code) => Err(Failure { code, message: "a checker failed (see the summary)".into() }),
                Err(failure) => Err(failure),
            },
        }
    });
    // Job processes and in-flight store calls must not hold the exit up: the commands already drained what they
    // meant to.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("lockstep: {}", failure.message);
            }
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

    /// `serve` and `agent` bound every store call by default, with the library's default bound; `0s` turns the
    /// bound off and a value is taken as given.
    #[test]
    fn serve_and_agent_bound_every_store_call_by_default() {
        assert_eq!(duration::parse(CALL_TIMEOUT_DEFAULT_TEXT), Ok(PgOptions::CALL_TIMEOUT_DEFAULT));
        assert!(!PgOptions::CALL_TIMEOUT_DEFAULT.is_zero());
        let url = ["--database-url", "postgres://h/db"];
        let serve = |extra: &[&str]| {
            let argv: Vec<&str> = ["lockstep", "serve"].iter().chain(&url).chain(extra).copied().collect();
            let Command::Serve(serve) = Cli::try_parse_from(argv).unwrap().command else { panic!("not serve") };
            serve.call_timeout
        };
        let agent = |extra: &[&str]| {
            let base = ["lockstep", "agent", "--node", "n", "--slots", "1", "--work-dir", "/w"];
            let argv: Vec<&str> = base.iter().chain(&url).chain(extra).copied().collect();
            let Command::Agent(agent) = Cli::try_parse_from(argv).unwrap().command else { panic!("not agent") };
            agent.call_timeout
        };
        assert_eq!((serve(&[]), agent(&[])), (PgOptions::CALL_TIMEOUT_DEFAULT, PgOptions::CALL_TIMEOUT_DEFAULT));
        assert_eq!(serve(&["--call-timeout", "10s"]), Duration::from_secs(10));
        assert_eq!(agent(&["--call-timeout", "0s"]), Duration::ZERO);
    }

    fn database(args: &[&str]) -> Database {
        let mut argv = vec!["lockstep", "status", "7"];
        argv.extend(args);
        let Command::Status(status) = Cli::try_parse_from(argv).unwrap().command else { panic!("not status") };
        status.database
    }

    #[test]
    fn the_url_comes_from_the_file_then_the_flag_then_the_environment() {
        let dir = std::env::temp_dir().join(format!("lockstep-url-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("url");
        std::fs::write(&file, "  postgres://u:secret@h/db\n").unwrap();
        let env = Some("postgres://env@h/db".to_string());
        let from_file = database(&["--database-url-file", file.to_str().unwrap()]);
        let (url, source) = from_file.url(env.clone()).unwrap();
        assert_eq!(url, "postgres://u:secret@h/db");
        assert_eq!(source, format!("--database-url-file {}", file.display()));
        let (url, source) = database(&["--database-url", "postgresql://flag@h/db"]).url(env.clone()).unwrap();
        assert_eq!((url.as_str(), source.as_str()), ("postgresql://flag@h/db", "--database-url"));
        let (url, source) = database(&[]).url(env).unwrap();
        assert_eq!((url.as_str(), source.as_str()), ("postgres://env@h/db", "DATABASE_URL"));
        let none = database(&[]).url(None).unwrap_err();
        assert_eq!(none.code, 2);
        assert!(none.message.contains("--database-url-file PATH"), "{}", none.message);
        std::fs::write(&file, "\n").unwrap();
        let empty = from_file.url(None).unwrap_err();
        assert!(
            empty
                .message
                .ends_with("the file is empty; write one URL, postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        );
        let missing = database(&["--database-url-file", "/nonexistent/lockstep-url"]).url(None).unwrap_err();
        assert!(missing.message.starts_with("--database-url-file /nonexistent/lockstep-url: cannot read it: "));
        std::fs::remove_dir_all(&dir).unwrap();
        let both = ["lockstep", "status", "7", "--database-url", "postgres://h/d", "--database-url-file", "/f"];
        assert!(Cli::try_parse_from(both).is_err(), "the two flags together are refused");
    }

    #[test]
    fn submit_refuses_a_zero_poll_interval() {
        let args =
            ["lockstep", "submit", "spec.yson", "--wait", "--poll-interval", "0s", "--database-url", "postgres://h/d"];
        let Err(error) = Cli::try_parse_from(args) else { panic!("a zero --poll-interval was accepted") };
        let error = error.to_string();
        assert!(error.contains("--poll-interval") && error.contains("must not be zero"), "{error}");
    }

    #[test]
    fn a_url_of_another_scheme_is_refused_without_showing_it() {
        let error = database(&["--database-url", "mysql://root:secret@h/db"]).url(None).unwrap_err();
        assert_eq!(error.code, 2);
        assert_eq!(
            error.message,
            "--database-url: a mysql:// URL is not PostgreSQL's: write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        );
        let error = database(&[]).url(Some("root:secret@h/db".into())).unwrap_err();
        assert_eq!(error.message, "DATABASE_URL: not a URL: write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE");
        assert!(database(&["--database-url", "POSTGRES://h/db"]).url(None).is_ok());
    }

    #[test]
    fn a_lease_ttl_is_longer_than_zero_and_at_most_an_hour() {
        assert_eq!(lease_ttl("1h"), Ok(LEASE_TTL_MAX));
        assert_eq!(lease_ttl("30s"), Ok(Duration::from_secs(30)));
        let error = lease_ttl("99999999999h").unwrap_err();
        assert!(error.starts_with("99999999999h exceeds the longest lease ttl, 1h"), "{error}");
        assert!(lease_ttl("0s").unwrap_err().contains("longer than zero"));
        assert!(lease_ttl("3x").unwrap_err().contains("write a number and a unit"));
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
