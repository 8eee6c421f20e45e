//! `lockstep serve`: one controller replica. Runs until SIGTERM or SIGINT, then drains its pipeline manager: the
//! queue closes, the leases of queued operations no worker started go back to the store (so another replica takes
//! them at once rather than after the lease expires), and the passes in progress finish and apply. A second signal
//! during the drain stops at once (exit 1); the leases then expire on their own.

use super::{Database, Failure, duration, lease_ttl, termination};
use lockstep::gang::GangPlacement;
use lockstep::gang::replica::ReplicaConfig;
use lockstep::pipeline::{ConfigError, RetentionRule};
use std::sync::Arc;
use std::time::Duration;

/// Flags of `serve`. Defaults are the engine's (DESIGN §3); the tests shorten the lease times.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: Database,
    /// This replica's name in logs and in PostgreSQL's application_name. Default: replica-{pid}.
    #[arg(long)]
    pub replica: Option<String>,
    /// Workers of the operation pipeline: passes over different operations that run at once.
    #[arg(long, default_value_t = 20)]
    pub workers: usize,
    /// Lease length of an operation pass (database clock): how long a dead replica's operation waits before
    /// another replica takes it over. At most 1h.
    #[arg(long, allow_hyphen_values = true, value_parser = lease_ttl, default_value = "30s")]
    pub lease_ttl: Duration,
    /// A replica gives its lease up this long before the database lets it expire.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "2s")]
    pub lease_margin: Duration,
    /// Heartbeat period of held leases (local clock).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "1s")]
    pub heartbeat_interval: Duration,
    /// Least time between two passes over a running operation that no report or request woke (database clock):
    /// how soon a lost node is noticed.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "5s")]
    pub min_processing_interval: Duration,
    /// Pooled PostgreSQL sessions. Default, and the least accepted: workers + 5 (the workers, two fetch loops,
    /// the heartbeater, two apply batches in flight).
    #[arg(long)]
    pub max_connections: Option<u32>,
    /// Placement of gang operations whose spec has no `gang_placement` (lockstep's own spec key), fixed at each
    /// one's first pass: `incremental` (YTsaurus's: jobs take free slots as they appear) or `all_or_nothing`
    /// (every ranked job of an incarnation at once, or none while it waits its turn).
    #[arg(long, value_parser = GangPlacement::parse, default_value = "incremental")]
    pub gang_placement: GangPlacement,
    /// An all-or-nothing gang needing more slots than the live nodes offer fails once that has lasted this long
    /// (database clock).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "60s")]
    pub gang_unfit_timeout: Duration,
    /// Longest one PostgreSQL call may take (local clock), the wait for a pooled session included; past it the
    /// call fails and its session is dropped, so a connection gone half-open (the database host died, a NAT
    /// dropped the flow) cannot hold a worker, or the lease it renews, for ever. 0s: unbounded. The default is the
    /// least that never cuts short a statement the server still runs (`PgOptions::CALL_TIMEOUT_DEFAULT`).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = super::CALL_TIMEOUT_DEFAULT_TEXT)]
    pub call_timeout: Duration,
    /// Longest the drain after SIGTERM or Ctrl-C may take (local clock): past it the replica stops without draining
    /// (exit 1) and the leases it still holds expire on their own. A healthy drain takes milliseconds; this bounds it
    /// whatever the database does.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = DRAIN_TIMEOUT_DEFAULT_TEXT)]
    pub drain_timeout: Duration,
    /// A node whose lease expired less than this long ago (database clock) is expected back: its slots count
    /// toward what an all-or-nothing gang could ever get, so a gang that lost it waits (holding its place in the
    /// queue) instead of failing as one that can never be placed.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "5m")]
    pub node_return_grace: Duration,
    /// Deletes finished rows once this old (database clock), a pass a minute; repeat for several kinds. Off by
    /// default: every row stays. Kinds that may go: `operation` (completed, failed, aborted), `job` (completed,
    /// failed, aborted) and `inbox` (done, new), the last two only once their operation is final; never
    /// `allocation` or `node`. E.g. `--retain job:completed,failed,aborted:168h --retain inbox:done,new:168h
    /// --retain operation:completed,failed,aborted:720h`.
    #[arg(long = "retain", value_name = "KIND:STATUS[,STATUS...]:AGE", value_parser = retain_rule)]
    pub retain: Vec<RetentionRule>,
}

/// Parses one `--retain` rule and checks that the controller may run it ([`lockstep::gang::retention::rule`]); clap
/// names the flag and the value in front of the message.
fn retain_rule(text: &str) -> Result<RetentionRule, String> {
    RetentionRule::parse(text).and_then(lockstep::gang::retention::rule)
}

/// `--drain-timeout`'s default: 20 s. The drains measured in `tests/real_e2e.rs` (a replica caught mid-pass, on a
/// loaded machine) took 23–200 ms; 20 s is a hundred times that and stays under the 30 s a Kubernetes pod gets
/// between SIGTERM and SIGKILL (`terminationGracePeriodSeconds`' default), so the replica, not the kill, ends the
/// drain.
const DRAIN_TIMEOUT_DEFAULT_TEXT: &str = "20s";

/// What a chaos run's replica (`lockstep chaos serve`) changes in `serve`: the history it records and the bugs it
/// plants. All off for `serve` itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeHooks {
    /// Record every lease write in the schema's history table (`PgOptions::history`).
    pub history: bool,
    /// The planted bug: the guarded apply skips its token guard
    /// (`PgOptions::apply_guard_disabled_for_mutation_test`).
    pub apply_guard_off: bool,
    /// The planted bug: all-or-nothing gangs are placed incrementally
    /// (`ReplicaConfig::gang_gate_disabled_for_mutation_test`).
    pub gang_gate_off: bool,
}

impl ServeArgs {
    /// The replica's settings.
    pub fn replica_config(&self) -> ReplicaConfig {
        ReplicaConfig {
            workers: self.workers,
            lease_ttl: self.lease_ttl,
            lease_margin: self.lease_margin,
            heartbeat_interval: self.heartbeat_interval,
            min_processing_interval: self.min_processing_interval,
            seed: u64::from(std::process::id()),
            gang_placement: self.gang_placement,
            gang_unfit_timeout: self.gang_unfit_timeout,
            node_return_grace: self.node_return_grace,
            gang_gate_disabled_for_mutation_test: false,
            retention: self.retain.clone(),
        }
    }
}

// `--max-connections`'s help states the rule, `ReplicaConfig::connections_needed`, as workers + 5: one per worker,
// per fetch loop, the heartbeater and one per apply batch in flight (the replica's pipeline batches its applies).
const _: () = assert!(
    lockstep::pipeline::config::FETCHERS_DEFAULT + 1 + lockstep::pipeline::config::APPLY_BATCHES_IN_FLIGHT_DEFAULT == 5,
    "update --max-connections' help"
);

/// A pipeline-config rule that `serve`'s flags broke, said in terms of those flags (the pipeline's own field
/// names, such as `heartbeat_trigger`, are not flags of `serve`).
fn config_rule(args: &ServeArgs, error: &ConfigError) -> String {
    let flags = "--workers, --lease-ttl, --lease-margin, --heartbeat-interval, --min-processing-interval";
    let ConfigError::Field { field, rule, .. } = error else { return format!("{error} (set by {flags})") };
    let show = lockstep::duration::format;
    match *field {
        // serve extends a lease when half its ttl is left: that half must hold two heartbeats and the margin.
        "heartbeat_trigger" => {
            let least = args.lease_margin + args.heartbeat_interval * 2;
            format!(
                "--lease-ttl {}: too short for --lease-margin {} and --heartbeat-interval {}: a lease is extended \
                 when half its ttl ({}) is left, and that is shorter than 2 × --heartbeat-interval ({}) + \
                 --lease-margin ({}) = {}; use --lease-ttl {} or more, or a shorter --lease-margin or \
                 --heartbeat-interval",
                show(args.lease_ttl),
                show(args.lease_margin),
                show(args.heartbeat_interval),
                show(args.lease_ttl / 2),
                show(args.heartbeat_interval),
                show(args.lease_margin),
                show(least),
                show((least * 2).max(Duration::from_millis(1))),
            )
        }
        "workers" | "lease_ttl" | "lease_margin" | "heartbeat_interval" | "min_processing_interval" => {
            format!("--{}: {rule}", field.replace('_', "-"))
        }
        _ => format!("{error} (set by {flags})"),
    }
}

/// Runs the replica until a signal, then drains it.
pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    run_with(args, ServeHooks::default()).await
}

/// As [`run`], with a chaos run's `hooks`.
pub async fn run_with(args: ServeArgs, hooks: ServeHooks) -> Result<(), Failure> {
    let config = ReplicaConfig { gang_gate_disabled_for_mutation_test: hooks.gang_gate_off, ..args.replica_config() };
    config.pipeline_config().validate().map_err(|error| Failure::usage(config_rule(&args, &error)))?;
    let needed = config.connections_needed();
    let connections = args.max_connections.unwrap_or(u32::try_from(needed).unwrap_or(u32::MAX));
    if (connections as usize) < needed {
        let rule = format!("{connections} is fewer than the {needed} sessions --workers {} needs", args.workers);
        return Err(Failure::usage(format!("--max-connections: {rule}")));
    }
    let name = args.replica.clone().unwrap_or_else(|| format!("replica-{}", std::process::id()));
    let (history, guard_off) = (hooks.history, hooks.apply_guard_off);
    let store = Arc::new(
        args.database
            .connect_tuned(&format!("lockstep serve {name}"), connections, true, Some(config.lease_ttl), |options| {
                options.history = history;
                options.apply_guard_disabled_for_mutation_test = guard_off;
                options.call_timeout = args.call_timeout;
            })
            .await?,
    );
    let mut manager = config.start(store).map_err(|error| Failure::usage(error.to_string()))?;
    tracing::info!(
        replica = %name,
        schema = %args.database.schema,
        workers = config.workers,
        lease_ttl = ?config.lease_ttl,
        "replica started"
    );
    let signal = termination().await;
    tracing::info!(replica = %name, signal, "draining: no new passes; unstarted leases go back");
    tokio::select! {
        biased;
        report = manager.shutdown_within(args.drain_timeout) => match report {
            Some(report) => {
                tracing::info!(
                    replica = %name,
                    released = report.released,
                    release_errors = report.release_errors,
                    "replica drained"
                );
                Ok(())
            }
            None => Err(drain_cut(args.drain_timeout)),
        },
        signal = termination() => {
            manager.abort();
            Err(Failure::runtime(format!("{signal} during the drain: stopped without draining")))
        }
    }
}

/// The failure of a drain that did not end within `--drain-timeout`.
pub fn drain_cut(bound: Duration) -> Failure {
    Failure::runtime(format!(
        "the drain did not end within --drain-timeout {}: stopped without draining; the leases still held expire on \
         their own",
        lockstep::duration::format(bound)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn retain_rules_reach_the_replica_and_a_rule_that_is_not_safe_is_refused_naming_the_flag() {
        let base = ["serve", "--database-url", "postgres://h/db"];
        let parse = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Cli::try_parse_from(args).map(|cli| cli.serve.replica_config().retention)
        };
        assert_eq!(parse(&[]).unwrap(), Vec::<RetentionRule>::new(), "off by default");
        let rules = parse(&["--retain", "job:completed,failed:168h", "--retain", "operation:completed:720h"]).unwrap();
        let week = Duration::from_secs(7 * 86_400);
        let job = RetentionRule::new("job", &["completed", "failed"], week);
        assert_eq!(rules[0], job.with_parent_statuses(&["completed", "failed", "aborted"]));
        assert_eq!(rules[1], RetentionRule::new("operation", &["completed"], week * 30 / 7));
        // docs/real-mode.md, "Retention", quotes this error whole.
        let error = parse(&["--retain", "allocation:free:24h"]).unwrap_err().to_string();
        let first = error.lines().next().expect("a line");
        assert!(first.starts_with("error: invalid value 'allocation:free:24h' for '--retain <KIND:"), "{error}");
        assert!(include_str!("../../../../docs/real-mode.md").contains(first), "the page does not quote: {first}");
        let error = parse(&["--retain", "job:running:1h"]).unwrap_err().to_string();
        assert!(error.contains("--retain") && error.contains("running is not a status a job row may go in"), "{error}");
        let error = parse(&["--retain", "job:completed"]).unwrap_err().to_string();
        assert!(error.contains("--retain") && error.contains("expected KIND:STATUS"), "{error}");
        // The message's example is a rule `--retain` takes.
        let example = error.lines().next().and_then(|line| line.rsplit("e.g. ").next()).expect("an example");
        assert_eq!(example, "job:completed,failed:168h", "{error}");
        assert!(parse(&["--retain", example]).is_ok(), "the example {example} is refused");
    }

    /// The page's example rules start a replica: the rules `--retain` checked are checked again by the replica
    /// (a trial found every `job` and `inbox` rule refused there, after connecting, with exit 2).
    #[tokio::test]
    async fn the_pages_retention_rules_start_a_replica() {
        use lockstep::store::{MemStore, Timestamp, TokioClock};
        let args = [
            "serve",
            "--database-url",
            "postgres://h/db",
            "--retain",
            "job:completed,failed,aborted:168h",
            "--retain",
            "inbox:done,new:168h",
            "--retain",
            "operation:completed,failed,aborted:720h",
        ];
        let config = Cli::try_parse_from(args).unwrap().serve.replica_config();
        let store = std::sync::Arc::new(MemStore::new(TokioClock::new(Timestamp::EPOCH)));
        let mut manager = config.start(store).expect("the replica starts with the page's rules");
        manager.abort();
    }

    #[test]
    fn serve_defaults_are_the_engines() {
        let cli = Cli::try_parse_from(["serve", "--database-url", "postgres://h/db"]).unwrap();
        let config = ReplicaConfig { seed: 0, ..cli.serve.replica_config() };
        assert_eq!(config, ReplicaConfig::default());
    }

    /// The drain is bounded by default (`--drain-timeout`), and the flag sets the bound.
    #[test]
    fn the_drain_is_bounded_by_default() {
        let parse = |extra: &[&str]| {
            let args: Vec<&str> = ["serve", "--database-url", "postgres://h/db"].iter().chain(extra).copied().collect();
            Cli::try_parse_from(args).unwrap().serve.drain_timeout
        };
        assert_eq!(parse(&[]), Duration::from_secs(20));
        assert_eq!(parse(&["--drain-timeout", "3s"]), Duration::from_secs(3));
    }

    #[test]
    fn zero_poll_intervals_are_refused_naming_the_flag() {
        let args = ["serve", "--database-url", "postgres://h/db", "--heartbeat-interval", "0s"];
        let cli = Cli::try_parse_from(args).unwrap();
        let error = cli.serve.replica_config().pipeline_config().validate().unwrap_err();
        assert_eq!(config_rule(&cli.serve, &error), "--heartbeat-interval: must not be zero");
    }

    #[test]
    fn a_lease_too_short_is_said_in_serves_flags() {
        let cli = Cli::try_parse_from(["serve", "--database-url", "postgres://h/db", "--lease-ttl", "1s"]).unwrap();
        let error = cli.serve.replica_config().pipeline_config().validate().unwrap_err();
        let message = config_rule(&cli.serve, &error);
        assert_eq!(
            message,
            "--lease-ttl 1s: too short for --lease-margin 2s and --heartbeat-interval 1s: a lease is extended when \
             half its ttl (500ms) is left, and that is shorter than 2 × --heartbeat-interval (1s) + --lease-margin \
             (2s) = 4s; use --lease-ttl 8s or more, or a shorter --lease-margin or --heartbeat-interval"
        );
        assert!(!message.contains("heartbeat_trigger"), "{message}");
        // The floor it names is enough.
        let args = ["serve", "--database-url", "postgres://h/db", "--lease-ttl", "8s"];
        Cli::try_parse_from(args).unwrap().serve.replica_config().pipeline_config().validate().unwrap();
    }

    #[test]
    fn serve_tunables_reach_the_pipeline_config() {
        let args = [
            "serve",
            "--database-url",
            "postgres://h/db",
            "--workers",
            "3",
            "--lease-ttl",
            "4s",
            "--lease-margin",
            "500ms",
            "--heartbeat-interval",
            "250ms",
            "--min-processing-interval",
            "1s",
        ];
        let config = Cli::try_parse_from(args).unwrap().serve.replica_config().pipeline_config();
        assert_eq!(config.workers, 3);
        assert_eq!(config.lease_ttl, Duration::from_secs(4));
        assert_eq!(config.heartbeat_trigger, Duration::from_secs(2));
        assert_eq!(config.lease_margin, Duration::from_millis(500));
        assert_eq!(config.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(config.min_processing_interval, Duration::from_secs(1));
        config.validate().unwrap();
    }

    #[test]
    fn gang_placement_flags_reach_the_placement_settings_and_bad_values_name_the_rule() {
        let base = ["serve", "--database-url", "postgres://h/db"];
        let settings = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Cli::try_parse_from(args).map(|cli| cli.serve.replica_config().placement_settings())
        };
        let defaults = settings(&[]).unwrap();
        assert_eq!(defaults.default, GangPlacement::Incremental);
        assert_eq!(defaults.unfit_timeout, Duration::from_secs(60));
        let set = settings(&["--gang-placement", "all_or_nothing", "--gang-unfit-timeout", "2m"]).unwrap();
        assert_eq!(set.default, GangPlacement::AllOrNothing);
        assert_eq!(set.unfit_timeout, Duration::from_secs(120));
        let error = settings(&["--gang-placement", "all-at-once"]).unwrap_err().to_string();
        assert!(
            error.contains("\"all-at-once\" is not a gang placement: expected incremental or all_or_nothing"),
            "{error}"
        );
    }
}
