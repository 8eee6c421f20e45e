//! `lockstep agent`: one node agent running jobs as OS processes (`sh -c COMMAND` in `WORK_DIR/{job id}`, with the
//! job environment and nothing else of the agent's; `lockstep::agent::process`). At start it locks its work dir
//! and ends whatever process trees an earlier agent on it left (one killed with SIGKILL). Runs until SIGTERM or
//! SIGINT, then stops gracefully (`Agent::stop`): it takes no new job, kills the running ones (their whole process
//! trees) and reports them interrupted ("node stopping") so the controller restarts them elsewhere, and gives its
//! node lease back so the node counts as gone at once.

use super::{Database, Failure, duration, lease_ttl, termination};
use lockstep::agent::process::OsExecutor;
use lockstep::agent::{Agent, AgentConfig, Executor};
use lockstep::store::PgStore;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Pooled PostgreSQL sessions of an agent: its loop makes one store call at a time; one spare for the graceful
/// stop's release while a call is in flight.
const AGENT_CONNECTIONS: u32 = 2;

/// Flags of `agent`. Lease defaults are the library's (`lockstep::agent`); the tests shorten them.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub database: Database,
    /// The node's name, unique in the cluster. A restarted agent with the same name takes the node back.
    #[arg(long)]
    pub node: String,
    /// Allocations (job slots) the node offers, 1 to 1024.
    #[arg(long)]
    pub slots: u32,
    /// Directory of the job sandboxes (`WORK_DIR/{job id}`, holding the job's stdout and stderr); created (mode
    /// 0700) if missing. It must be owned by the agent's user and not writable by group or others (else exit 2);
    /// nothing under it is followed through a symbolic link. One agent per work dir (it is locked): a restarted
    /// agent given the same one ends the processes its predecessor's jobs left (those still carrying their job's
    /// marker).
    #[arg(long)]
    pub work_dir: PathBuf,
    /// Local directory standing for Cypress: `file_paths` entry `//tmp/x` is copied from `FILES_ROOT/tmp/x`. Without
    /// it, jobs with `file_paths` fail to start.
    #[arg(long)]
    pub files_root: Option<PathBuf>,
    /// Node lease length (database clock): how long a dead agent's jobs look alive to the controller. At most 1h.
    #[arg(long, allow_hyphen_values = true, value_parser = lease_ttl, default_value = "10s")]
    pub lease_ttl: Duration,
    /// The agent fences itself (kills its jobs) this long before the database lets its lease expire.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "2s")]
    pub lease_margin: Duration,
    /// Extend the node lease when its local deadline is this close. Default: lease-ttl / 2.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse)]
    pub heartbeat_trigger: Option<Duration>,
    /// Pause between passes when no new allocation wakes the agent (local clock).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "1s")]
    pub poll_interval: Duration,
    /// Longest one PostgreSQL call may take (local clock), the wait for a pooled session included; past it the
    /// call fails and its session is dropped, so a connection gone half-open cannot pin the agent's two pooled
    /// sessions for ever. 0s: unbounded. Default: as `serve --call-timeout`.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = super::CALL_TIMEOUT_DEFAULT_TEXT)]
    pub call_timeout: Duration,
}

/// What a chaos run's agent (`lockstep chaos agent`) changes in `agent`'s start: its sessions' name and the
/// history it records. Nothing for `agent` itself.
#[derive(Clone, Debug, Default)]
pub struct AgentHooks {
    /// PostgreSQL's application_name of the agent's sessions; default `lockstep agent {node}`.
    pub name: Option<String>,
    /// Record every lease write in the schema's history table (`PgOptions::history`).
    pub history: bool,
}

/// What [`start`] opened: the agent's checked settings, its executor (its work dir locked and cleaned) and its
/// store.
pub struct Started {
    /// The agent's settings, checked.
    pub config: AgentConfig,
    /// The OS-process executor on the agent's work dir.
    pub executor: OsExecutor,
    /// The store, connected and migrated.
    pub store: Arc<PgStore>,
}

impl AgentArgs {
    /// The agent's settings.
    pub fn agent_config(&self) -> AgentConfig {
        AgentConfig {
            lease_ttl: self.lease_ttl,
            lease_margin: self.lease_margin,
            heartbeat_trigger: self.heartbeat_trigger.unwrap_or(self.lease_ttl / 2),
            poll_interval: self.poll_interval,
            ..AgentConfig::new(self.node.clone(), self.slots)
        }
    }
}

/// An agent config error in the words of the command line: the flag that sets the field, its value and the rule
/// with the other settings it names said as flags (`--heartbeat-trigger: 1.5s is shorter than 2 × --poll-interval
/// (1s) = 2s …`); a trigger derived from `--lease-ttl` (not given) says so.
fn flag_error(error: &lockstep::agent::AgentConfigError) -> String {
    let flag = match error.field {
        "name" => "--node",
        "slots" => "--slots",
        "lease_margin" => "--lease-margin",
        "poll_interval" => "--poll-interval",
        "heartbeat_trigger" => "--heartbeat-trigger",
        "lease_ttl" => "--lease-ttl",
        other => other,
    };
    let hint = match error.field {
        "heartbeat_trigger" => " (when not given it is half of --lease-ttl: give a longer --lease-ttl or set it)",
        "lease_margin" => " (give a longer --lease-ttl or a shorter --lease-margin)",
        _ => "",
    };
    let settings = ["lease_ttl", "lease_margin", "poll_interval", "heartbeat_trigger"];
    let rule = settings
        .iter()
        .fold(error.rule.clone(), |rule, name| rule.replace(name, &format!("--{}", name.replace('_', "-"))));
    format!("{flag}: {rule}{hint}")
}

/// Runs the agent until a signal, then stops it gracefully.
pub async fn run(args: AgentArgs) -> Result<(), Failure> {
    let Started { config, executor, store } = start(&args, &AgentHooks::default()).await?;
    let node = config.name.clone();
    drive(Agent::new(store, executor, config), node).await
}

/// Checks the flags, opens the work dir (ending what an earlier agent on it left running) and connects: everything
/// of [`run`] before the agent runs.
///
/// # Errors
/// Usage (exit 2): a broken config rule, a files root that is not a directory, a work dir refused; and the
/// database's failures to connect.
pub async fn start(args: &AgentArgs, hooks: &AgentHooks) -> Result<Started, Failure> {
    let config = args.agent_config();
    config.validate().map_err(|error| Failure::usage(flag_error(&error)))?;
    if let Some(root) = &args.files_root
        && !root.is_dir()
    {
        return Err(Failure::usage(format!("--files-root {}: not a directory", root.display())));
    }
    // Before the database: what an earlier agent on this work dir left running ends now, reachable store or not.
    let executor = OsExecutor::open(&args.work_dir, args.files_root.clone())
        .await
        .map_err(|error| Failure::usage(format!("--work-dir: {error}")))?;
    let name = hooks.name.clone().unwrap_or_else(|| format!("lockstep agent {}", args.node));
    let history = hooks.history;
    let store = Arc::new(
        args.database
            .connect_tuned(&name, AGENT_CONNECTIONS, true, Some(args.lease_ttl), |options| {
                options.history = history;
                options.call_timeout = args.call_timeout;
            })
            .await?,
    );
    tracing::info!(
        node = %config.name,
        slots = config.slots,
        work_dir = %args.work_dir.display(),
        lease_ttl = ?config.lease_ttl,
        "agent started"
    );
    Ok(Started { config, executor, store })
}

/// Runs `agent` (of node `node`) until a signal, then stops it gracefully (interrupting and reporting its running
/// jobs, giving its node lease back).
pub async fn drive<E: Executor>(agent: Agent<PgStore, E>, node: String) -> Result<(), Failure> {
    let until = async {
        let signal = termination().await;
        tracing::info!(%node, signal, "stopping: no new jobs; running jobs are interrupted and reported");
    };
    let stop = agent.run_until(until).await;
    if stop.unreported > 0 {
        tracing::warn!(unreported = stop.unreported, "some reports were not sent; the node lease expiry covers them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    #[test]
    fn agent_defaults_are_the_librarys() {
        let args = ["agent", "--database-url", "postgres://h/db", "--node", "n1", "--slots", "2", "--work-dir", "/w"];
        let config = Cli::try_parse_from(args).unwrap().agent.agent_config();
        assert_eq!(config, AgentConfig::new("n1", 2));
        config.validate().unwrap();
    }

    #[test]
    fn slots_past_the_bound_are_refused_naming_the_flag() {
        let base = ["agent", "--database-url", "postgres://h/db", "--node", "n1", "--work-dir", "/w", "--slots"];
        let config = |slots: &str| {
            let args: Vec<&str> = base.iter().copied().chain([slots]).collect();
            Cli::try_parse_from(args).unwrap().agent.agent_config()
        };
        config("1024").validate().unwrap();
        let error = config("100000000").validate().unwrap_err();
        assert_eq!(flag_error(&error), "--slots: 100000000 must be at most 1024");
    }

    /// The node's name is its row's status, a key of the fetch index: a name the store would refuse is refused at
    /// start, naming the flag, instead of failing every registration while the agent retries forever (a new user's
    /// trial: `--node` of 2 000 bytes).
    #[test]
    fn a_node_name_the_store_cannot_key_is_refused_naming_the_flag() {
        let config = |node: &str| {
            let args =
                ["agent", "--database-url", "postgres://h/db", "--slots", "1", "--work-dir", "/w", "--node", node];
            Cli::try_parse_from(args).unwrap().agent.agent_config()
        };
        config(&"n".repeat(1024)).validate().unwrap();
        let error = config(&"n".repeat(2000)).validate().unwrap_err();
        assert_eq!(
            flag_error(&error),
            "--node: a name of 2000 bytes is longer than the 1024 a node name may hold (it is the node row's status, \
             a key of the fetch index)"
        );
        let error = config("n\0").validate().unwrap_err();
        assert_eq!(flag_error(&error), "--node: holds a NUL character, which PostgreSQL text cannot hold");
    }

    #[test]
    fn agent_lease_flags_are_checked_by_the_librarys_rules() {
        let args = [
            "agent",
            "--database-url",
            "postgres://h/db",
            "--node",
            "n1",
            "--slots",
            "2",
            "--work-dir",
            "/w",
            "--lease-ttl",
            "2s",
            "--lease-margin",
            "3s",
        ];
        let error = Cli::try_parse_from(args).unwrap().agent.agent_config().validate().unwrap_err();
        assert_eq!(error.field, "lease_margin", "{error}");
        let shown = flag_error(&error);
        assert!(shown.starts_with("--lease-margin: 3s must be shorter than --lease-ttl"), "{shown}");
    }

    #[test]
    fn a_short_lease_ttl_names_the_heartbeat_trigger_flag_it_derives() {
        let args = ["agent", "--database-url", "postgres://h/db", "--node", "n1", "--slots", "1", "--work-dir", "/w"];
        let mut config = Cli::try_parse_from(args).unwrap().agent.agent_config();
        config.lease_ttl = std::time::Duration::from_secs(3);
        config.lease_margin = std::time::Duration::from_secs(1);
        config.heartbeat_trigger = std::time::Duration::from_millis(1500);
        let shown = flag_error(&config.validate().unwrap_err());
        assert_eq!(
            shown,
            "--heartbeat-trigger: 1.5s is shorter than 2 × --poll-interval (1s) = 2s: a lease due for extension \
             must hold two passes (when not given it is half of --lease-ttl: give a longer --lease-ttl or set it)"
        );
    }
}
