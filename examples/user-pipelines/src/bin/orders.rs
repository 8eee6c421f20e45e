//! This project in production: the `lines` and `orders` pipelines on PostgreSQL, beside the code that enqueues the
//! orders. It connects a `PgStore` (creating its schema and applying lockstep's migrations), registers the pipelines
//! the simulator binary (`orders-sim`) registers, enqueues one order and its lines in a transaction of its own, and
//! runs until SIGTERM or Ctrl-C, then drains and exits 0. Normal build only: `PgStore` and sqlx do not exist under
//! the simulator. Run it from anywhere in lockstep's workspace (docs/user-pipelines.md, "Run them on PostgreSQL"):
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p user-pipelines --bin orders`.

#[cfg(not(madsim))]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
    let matches = production::Args::command().get_matches();
    let args = production::Args::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // The URL checked before anything connects, as `lockstep` checks its `--database-url`: a URL that is empty or
    // not PostgreSQL's exits 2 with the rule, naming where the URL came from (never the URL: it may hold a
    // password), instead of the URL parser's words from inside the connect.
    if let Err(rule) = lockstep::store::PgOptions::check_url(&args.database_url) {
        let source = match matches.value_source("database_url") {
            Some(ValueSource::EnvVariable) => "DATABASE_URL",
            _ => "--database-url",
        };
        eprintln!("orders: {source}: {rule}");
        return std::process::ExitCode::from(2);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    match production::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("orders: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    eprintln!("orders runs on PostgreSQL, in the normal build: cargo run -p user-pipelines --bin orders");
    std::process::ExitCode::from(2)
}

#[cfg(not(madsim))]
mod production {
    use lockstep::pipeline::{ManagerOptions, PipelineManager};
    use lockstep::store::{NewRow, PgOptions, PgStore};
    use serde_json::json;
    use sqlx::{Connection, PgConnection};
    use std::process;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    use tokio::signal::unix::{SignalKind, signal};
    use user_pipelines::{Idempotency, Lines, Orders, Payments, lines_config, orders_config};

    type Error = Box<dyn std::error::Error>;

    /// The longest drain after SIGTERM, as `lockstep serve --drain-timeout`'s default: under the 30 s Kubernetes
    /// gives a pod between SIGTERM and SIGKILL, so the drain, not the kill, ends the process.
    const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

    /// The `lines` and `orders` pipelines on PostgreSQL, with one order enqueued at start: runs until SIGTERM or
    /// Ctrl-C, then drains.
    #[derive(clap::Parser)]
    pub struct Args {
        /// PostgreSQL's URL (15+). Give one with a password through the variable, not the flag: a flag shows in the
        /// process list.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        pub database_url: String,
        /// The schema of lockstep's tables: created if missing, migrated at start.
        #[arg(long, env = "LOCKSTEP_SCHEMA", default_value = PgOptions::SCHEMA_DEFAULT)]
        schema: String,
    }

    /// A stand-in for your payment provider's client, which takes its place in your project: every charge succeeds
    /// at once, numbered in order. A real one sends the idempotency key with the charge (an `Idempotency-Key`
    /// header), so that the provider charges a retried line once.
    struct StandInPayments {
        charged: AtomicU64,
    }

    impl Payments for StandInPayments {
        async fn charge(&self, subject: String, idempotency_key: Option<String>) -> Result<u64, String> {
            let payment = self.charged.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(subject, ?idempotency_key, payment, "charged by the stand-in provider");
            Ok(payment)
        }
    }

    /// Runs the pipelines until SIGTERM or Ctrl-C, then drains them.
    pub async fn run(args: Args) -> Result<(), Error> {
        // Listen for the signals first: one that came while connecting would otherwise end the process undrained.
        let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        let (lines, orders) = (lines_config(), orders_config());
        // Two pipelines of the default config need 50 connections, twice the default pool: size it for both.
        let mut options = PgOptions::new(&args.database_url).with_pool_for([&lines, &orders]);
        options.schema = args.schema;
        // Connecting creates the schema if missing and applies the migrations not yet applied, under the schema's
        // lock, so that replicas started together on a new schema all come up.
        let store = PgStore::connect_with(options).await?;
        let mut manager = PipelineManager::new(Arc::new(store.clone()), ManagerOptions { seed: process::id().into() });
        let payments = StandInPayments { charged: AtomicU64::new(0) };
        manager.register(lines, Lines { payments, idempotency: Idempotency::On })?;
        manager.register(orders, Orders)?;
        manager.start();

        // Your application's own connection (from its own pool in a real one). The order's lines and the order
        // naming them commit together or not at all; your own writes (the order in your tables) go in the same
        // transaction, and the fetch hints that wake `lines` and `orders` go out at the commit.
        let mut conn = PgConnection::connect(&args.database_url).await?;
        let mut tx = conn.begin().await?;
        let new_lines = [25, 40, 10].map(|amount| NewRow::new("line", "new", json!({ "amount": amount })));
        let line_ids = store.insert_in(&mut tx, new_lines.into()).await?;
        let order = NewRow::new("order", "open", json!({ "lines": line_ids }));
        let order_id = store.insert_in(&mut tx, vec![order]).await?[0];
        tx.commit().await?;
        conn.close().await?;
        tracing::info!(order = %order_id, lines = line_ids.len(), "enqueued an order and its lines");

        let signal = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{signal}: draining");
        let report = manager.shutdown_within(DRAIN_TIMEOUT).await;
        store.close().await;
        let report = report.ok_or_else(|| {
            format!("the drain did not end within {DRAIN_TIMEOUT:?}; the leases still held expire on their own")
        })?;
        tracing::info!(leases_given_back = report.released, "drained");
        Ok(())
    }
}
