//! The production binary (`src/bin/orders.rs`) on real PostgreSQL, in a schema of its own: the order it enqueues is
//! charged and closed by its pipelines (its log says so), and SIGTERM drains it and ends it with status 0. A URL
//! that is empty or not PostgreSQL's is refused before anything connects (exit 2).
//!
//! The database is `DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/test` when it is unset; a test that cannot
//! reach it fails, never skips. Its schema is dropped when it passes and kept, named in the failure, when it fails.
#![cfg(not(madsim))]

use lockstep::store::{PgOptions, PgStore, Row, Store};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStderr;
use tokio::time::{Instant, timeout};

/// The longest wait for each step: the start (connect, migrate, enqueue), the order's close, the drain.
const STEP_WAIT_MAX: Duration = Duration::from_secs(60);

/// The binary's log, read as it comes, and every line read so far (printed when the test fails).
struct Log {
    lines: Lines<BufReader<ChildStderr>>,
    read: String,
}

impl Log {
    /// Returns at once when a line read so far contains `text`, else as [`Log::wait_for`]: for a line that may
    /// come before one waited for earlier.
    async fn seen_or_wait_for(&mut self, text: &str, context: &str) {
        if !self.read.contains(text) {
            self.wait_for(text, context).await;
        }
    }

    /// Reads lines until one contains `text`; panics, with the log, when the log ends first or `STEP_WAIT_MAX`
    /// passes.
    async fn wait_for(&mut self, text: &str, context: &str) {
        let deadline = Instant::now() + STEP_WAIT_MAX;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => line,
                Ok(Ok(None)) => panic!("{context}: the log ended before {text:?}:\n{}", self.read),
                Ok(Err(error)) => panic!("{context}: reading the log: {error}\n{}", self.read),
                Err(_) => panic!("{context}: no {text:?} within {STEP_WAIT_MAX:?}:\n{}", self.read),
            };
            self.read.push_str(&line);
            self.read.push('\n');
            if line.contains(text) {
                return;
            }
        }
    }
}

/// The production binary as a command, without the caller's `MADSIM_*` variables (this test binary's knobs, not
/// the program's, as in `tests/cli.rs`) and without its `DATABASE_URL` and `LOCKSTEP_SCHEMA`.
fn orders() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orders"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MADSIM_") {
            command.env_remove(name);
        }
    }
    command.env_remove("DATABASE_URL").env_remove("LOCKSTEP_SCHEMA");
    command
}

/// A URL that is empty or not PostgreSQL's exits 2 before anything connects, with the rule and the form to write,
/// naming the flag or the variable it came from and never the URL (it may hold a password). A new user's trial
/// read `invalid store call: relative URL without a base` for a URL without its scheme.
#[tokio::test]
async fn a_url_that_is_not_postgresqls_is_refused_naming_its_flag_or_variable() {
    let form = "write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE";
    let cases: [(&[&str], Option<&str>, String); 5] = [
        (&[], Some("app:secret@127.0.0.1/test"), format!("orders: DATABASE_URL: not a URL: {form}")),
        (&[], Some(""), format!("orders: DATABASE_URL: the URL is empty: {form}")),
        (
            &["--database-url", "mysql://root:secret@h/db"],
            None,
            format!("orders: --database-url: a mysql:// URL is not PostgreSQL's: {form}"),
        ),
        (&["--database-url", ""], None, format!("orders: --database-url: the URL is empty: {form}")),
        (
            &["--database-url", "secret-host:5432"],
            Some("postgres://h/db"),
            format!("orders: --database-url: not a URL: {form}"),
        ),
    ];
    for (args, variable, expected) in cases {
        let mut command = orders();
        if let Some(url) = variable {
            command.env("DATABASE_URL", url);
        }
        let output = command.args(args).output().await.expect("the binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?} {variable:?}: {stderr}");
        assert_eq!(stderr.trim_end(), expected, "{args:?} {variable:?}");
        assert!(!stderr.contains("secret"), "the message shows the URL: {stderr}");
    }
}

#[tokio::test]
async fn the_production_binary_closes_its_order_and_drains_on_sigterm() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let schema = format!("orders_{}_{nanos}", std::process::id());
    let context = format!("schema {schema} (kept)");
    let mut binary = orders()
        .env("DATABASE_URL", &url)
        .env("LOCKSTEP_SCHEMA", &schema)
        .env("RUST_LOG", "info,sqlx=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true) // a failing test leaves no process behind
        .spawn()
        .expect("the binary starts");
    let lines = BufReader::new(binary.stderr.take().expect("stderr is piped")).lines();
    let mut log = Log { lines, read: String::new() };
    log.wait_for("enqueued an order and its lines", &context).await;

    // The binary made and migrated the schema: a store that runs no DDL opens on it.
    let options = PgOptions { schema: schema.clone(), max_connections: 2, migrate: false, ..PgOptions::new(&url) };
    let store = PgStore::connect_with(options).await.unwrap_or_else(|error| panic!("{context}: {error}"));
    let deadline = Instant::now() + STEP_WAIT_MAX;
    let order = loop {
        let orders = store.list("order", None).await.unwrap();
        assert_eq!(orders.len(), 1, "{context}: one order enqueued: {orders:?}");
        if orders[0].status == "done" {
            break orders[0].clone();
        }
        assert!(Instant::now() < deadline, "{context}: order not done within {STEP_WAIT_MAX:?}:\n{}", log.read);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lines: Vec<Row> = store.list("line", None).await.unwrap();
    assert_eq!(order.data["total"], 25 + 40 + 10, "{context}: the order's total: {order:?}");
    assert_eq!(order.data["lines"], serde_json::json!(lines.iter().map(|line| line.id).collect::<Vec<_>>()));
    assert!(lines.iter().all(|line| line.status == "done"), "{context}: every line done: {lines:?}");
    assert!(lines.iter().all(|line| line.data["payment"].as_u64().is_some()), "{context}: charged: {lines:?}");
    // The log says the order closed, with its id and total (the line may come before "enqueued": the pipelines
    // can close the order before the binary logs its enqueue).
    log.seen_or_wait_for(&format!("order closed: every line charged order={} lines=3 total=75", order.id), &context)
        .await;

    let pid = binary.id().expect("the binary runs") as i32;
    // SAFETY: kill only sends a signal, to the child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "{context}: SIGTERM to {pid}");
    log.wait_for("SIGTERM: draining", &context).await;
    log.wait_for("drained", &context).await;
    let status = timeout(STEP_WAIT_MAX, binary.wait()).await;
    let status = status.unwrap_or_else(|_| panic!("{context}: no exit within {STEP_WAIT_MAX:?}")).unwrap();
    assert!(status.success(), "{context}: {status}:\n{}", log.read);

    store.close().await;
    PgStore::drop_schema(&url, &schema).await.unwrap();
}
