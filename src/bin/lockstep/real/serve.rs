//! `lockstep serve`: one controller replica. Runs until SIGTERM or SIGINT, then drains its pipeline manager: the
//! queue closes, the leases of queued operations no worker started go back to the store (so another replica takes
//! them at once rather than after the lease expires), and the passes in progress finish and apply. A second signal
//! during the drain stops at once (exit 1); the leases then expire on their own.

use super::{Database, Failure, duration, termination};
use lockstep::gang::replica::ReplicaConfig;
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
    /// another replica takes it over.
    #[arg(long, value_parser = duration::parse, default_value = "30s")]
    pub lease_ttl: Duration,
    /// A replica gives its lease up this long before the database lets it expire.
    #[arg(long, value_parser = duration::parse, default_value = "2s")]
    pub lease_margin: Duration,
    /// Heartbeat period of held leases (local clock).
    #[arg(long, value_parser = duration::parse, default_value = "1s")]
    pub heartbeat_interval: Duration,
    /// Least time between two passes over a running operation that no report or request woke (database clock):
    /// how soon a lost node is noticed.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    pub min_processing_interval: Duration,
    /// Pooled PostgreSQL sessions. Default: workers + 2 (workers, fetcher, heartbeater).
    #[arg(long)]
    pub max_connections: Option<u32>,
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
        }
    }
}

/// Runs the replica until a signal, then drains it.
pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    let config = args.replica_config();
    config.pipeline_config().validate().map_err(|error| {
        Failure::usage(format!(
            "{error} (set by --workers, --lease-ttl, --lease-margin, --heartbeat-interval, --min-processing-interval)"
        ))
    })?;
    let needed = config.connections_needed();
    let connections = args.max_connections.unwrap_or(u32::try_from(needed).unwrap_or(u32::MAX));
    if (connections as usize) < needed {
        let rule = format!("{connections} is fewer than the {needed} sessions --workers {} needs", args.workers);
        return Err(Failure::usage(format!("--max-connections: {rule}")));
    }
    let name = args.replica.clone().unwrap_or_else(|| format!("replica-{}", std::process::id()));
    let store = Arc::new(args.database.connect(&format!("lockstep serve {name}"), connections).await?);
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
        report = manager.shutdown() => {
            tracing::info!(
                replica = %name,
                released = report.released,
                release_errors = report.release_errors,
                "replica drained"
            );
            Ok(())
        }
        signal = termination() => {
            manager.abort();
            Err(Failure::runtime(format!("{signal} during the drain: stopped without draining")))
        }
    }
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
    fn serve_defaults_are_the_engines() {
        let cli = Cli::try_parse_from(["serve", "--database-url", "postgres://h/db"]).unwrap();
        let config = ReplicaConfig { seed: 0, ..cli.serve.replica_config() };
        assert_eq!(config, ReplicaConfig::default());
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
}
