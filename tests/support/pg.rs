//! Finding the test PostgreSQL and giving each test a schema of its own (STYLE, Tests: "Each Postgres test gets
//! its own database or schema, kept when the test fails").
//!
//! The database is `DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/test` when it is unset. A test that
//! cannot reach it fails, never skips: under `CI=true` with a message for CI, elsewhere with one saying how to
//! point `DATABASE_URL` at a server (shared/notes/madsim.md, pitfall 9).

use lockstep::store::conformance::Harness;
use lockstep::store::{PgOptions, PgStore, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The database used when `DATABASE_URL` is unset: the local server of these machines (trust auth).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string())
}

/// A schema name no other test, run or process uses: `t_<pid>_<counter>_<nanos>`.
pub fn unique_schema() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).expect("the wall clock is after 1970").as_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("t_{}_{n}_{nanos}", std::process::id())
}

/// `url` with any password replaced, for messages.
pub fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return "<unparsable url>".into();
    };
    match url[scheme_end..].find('@') {
        Some(at) => {
            let userinfo = &url[scheme_end..scheme_end + at];
            let user = userinfo.split(':').next().unwrap_or_default();
            let password = if userinfo.contains(':') { ":***" } else { "" };
            format!("{}{user}{password}{}", &url[..scheme_end], &url[scheme_end + at..])
        }
        None => url.to_string(),
    }
}

/// How long a connect waits, in tries a second apart, while the server has no session left ("too many clients",
/// SQLSTATE 53300): two test runs on one database (one in the pipeline benchmark's smoke run, the other in
/// `pg_replicas`) come within a few sessions of PostgreSQL's default 100.
const SERVER_FULL_TRIES_MAX: usize = 30;

/// Connects a store to a fresh schema with `configure` applied to the options. Panics (never skips) when the
/// database cannot be reached or the migrations fail; waits, within a bound, while the server is full.
pub async fn store_with(configure: impl FnOnce(&mut PgOptions)) -> PgStore {
    let url = database_url();
    let mut options = PgOptions::new(url.clone());
    options.schema = unique_schema();
    options.acquire_timeout = Duration::from_secs(10);
    configure(&mut options);
    for tries in 1.. {
        match PgStore::connect_with(options.clone()).await {
            Ok(store) => return store,
            Err(StoreError::Unavailable(message)) if message.contains("53300") && tries < SERVER_FULL_TRIES_MAX => {
                eprintln!("PostgreSQL has no session left (other test runs); connecting again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err @ (StoreError::Unavailable(_) | StoreError::Timeout(_))) => unreachable_db(&url, &err),
            Err(err) => panic!("PostgreSQL at {}: {err}", redacted(&url)),
        }
    }
    unreachable!("the loop returns or panics")
}

fn unreachable_db(url: &str, err: &StoreError) -> ! {
    let url = redacted(url);
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "CI=true and PostgreSQL is unreachable at {url}: {err}. CI must start PostgreSQL before the tests \
             (Postgres tests never skip)."
        );
    }
    panic!(
        "PostgreSQL is unreachable at {url}: {err}. Start PostgreSQL there, or set \
         DATABASE_URL=postgres://USER[:PASSWORD]@HOST:PORT/DATABASE to a server where the user may create \
         schemas. Postgres tests never skip."
    );
}

/// A store on a schema of its own. Dropping it drops the schema if the test passed, and keeps it (printing its
/// name) if the test is panicking.
pub struct PgHarness {
    store: PgStore,
    url: String,
}

impl PgHarness {
    /// A harness on a fresh schema with default options.
    pub async fn new() -> PgHarness {
        PgHarness::with(|_| {}).await
    }

    /// A harness on a fresh schema with `configure` applied to the options.
    pub async fn with(configure: impl FnOnce(&mut PgOptions)) -> PgHarness {
        PgHarness { store: store_with(configure).await, url: database_url() }
    }
}

/// A fresh harness (the conformance suite's `$make`).
pub async fn harness() -> PgHarness {
    PgHarness::new().await
}

impl Harness for PgHarness {
    type S = PgStore;

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn advance(&self, span: Duration) {
        self.store.advance_clock(span);
    }
}

impl Drop for PgHarness {
    fn drop(&mut self) {
        let schema = self.store.schema().to_string();
        if std::thread::panicking() {
            eprintln!("kept schema {schema} of the failed test in {}", redacted(&self.url));
            return;
        }
        // Drop runs inside the test's runtime, which cannot be blocked on; a thread with a runtime of its own
        // opens a connection of its own.
        let url = self.url.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test schema");
            runtime.block_on(PgStore::drop_schema(&url, &schema))
        })
        .join()
        .expect("the schema-dropping thread panicked");
        if let Err(err) = dropped {
            eprintln!("could not drop a test schema: {err}");
        }
    }
}

/// The next fetch hint `rx` hears within `wait`; panics naming `which` when none comes (or the channel broke).
pub async fn next_hint(
    rx: &mut tokio::sync::broadcast::Receiver<lockstep::store::Hint>,
    which: &str,
    wait: Duration,
) -> lockstep::store::Hint {
    match tokio::time::timeout(wait, rx.recv()).await {
        Ok(Ok(kind)) => kind,
        Ok(Err(e)) => panic!("{which}: {e}"),
        Err(_) => panic!("{which} got no hint within {wait:?}"),
    }
}
