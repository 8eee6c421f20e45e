//! A test run's scope for the chaos proxy's tests: a schema of its own (with a small `marks` table), session names
//! that contain it, proxies in front of the test PostgreSQL, and waits on conditions.

use super::pg::{database_url, unique_schema};
use lockstep::chaos::proxy::{Proxy, ProxyOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

/// Longest wait for a condition that should come.
pub const CONDITION_WAIT: Duration = Duration::from_secs(20);
/// Between two looks at a condition in the database.
const CONDITION_POLL: Duration = Duration::from_millis(50);

/// One test's schema and session names. [`Scoped::finish`] drops the schema; a failed test keeps it.
pub struct Scoped {
    pub schema: String,
    pub url: String,
}

impl Scoped {
    /// A fresh schema holding `marks (n int)`.
    pub async fn new() -> Scoped {
        let scoped = Scoped { schema: unique_schema(), url: database_url() };
        let mut conn = scoped.direct().await;
        for statement in [
            format!("CREATE SCHEMA {}", scoped.schema),
            format!("CREATE TABLE {}.marks (n int PRIMARY KEY)", scoped.schema),
        ] {
            sqlx::query(AssertSqlSafe(statement)).execute(&mut conn).await.expect("create the test's schema");
        }
        scoped
    }

    /// The session name of this run's `who`: it contains the schema, so no other run's sessions match it.
    pub fn app(&self, who: &str) -> String {
        format!("{}_{who}", self.schema)
    }

    /// A proxy in front of the test PostgreSQL, listening on a free port.
    pub async fn proxy(&self, seed: u64) -> Proxy {
        let options = ProxyOptions { listen: "127.0.0.1:0".parse().unwrap(), upstream: self.upstream().await, seed };
        Proxy::start(options).await.expect("start the proxy")
    }

    /// The test database's URL with the proxy's port in place of the server's.
    pub fn url_through(&self, proxy: &Proxy) -> String {
        let mut url = url::Url::parse(&self.url).expect("DATABASE_URL parses");
        let addr = proxy.handle().local_addr();
        url.set_host(Some(&addr.ip().to_string())).expect("a host");
        url.set_port(Some(addr.port())).expect("a port");
        url.to_string()
    }

    /// A session through `proxy` named [`Scoped::app`]`(who)`.
    pub async fn connect_through(&self, proxy: &Proxy, who: &str) -> PgConnection {
        let options: sqlx::postgres::PgConnectOptions = self.url_through(proxy).parse().expect("the URL parses");
        // Plain text, as a chaos run's replicas connect: the proxy reads the startup message's application_name.
        let options = options.application_name(&self.app(who)).ssl_mode(sqlx::postgres::PgSslMode::Disable);
        PgConnection::connect_with(&options).await.expect("connect through the proxy")
    }

    /// A session straight to the server (checks and set-up).
    pub async fn direct(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.expect("connect to the test database")
    }

    async fn upstream(&self) -> SocketAddr {
        let url = url::Url::parse(&self.url).expect("DATABASE_URL parses");
        let host = url.host_str().expect("DATABASE_URL names a host").to_string();
        let port = url.port().unwrap_or(5432);
        tokio::net::lookup_host((host, port)).await.expect("resolve the database host").next().expect("an address")
    }

    /// True when the server has no session named `app(who)` (waits end on it).
    pub async fn sessions_named(&self, who: &str) -> bool {
        let mut conn = self.direct().await;
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(self.app(who))
            .fetch_one(&mut conn)
            .await
            .expect("count sessions");
        count == 0
    }

    /// Whether the server's session named `app(who)` is idle (it has no query in progress).
    pub async fn idle_session_named(&self, who: &str) -> bool {
        let mut conn = self.direct().await;
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE application_name = $1")
                .bind(self.app(who))
                .fetch_optional(&mut conn)
                .await
                .expect("read the session's state");
        state.as_deref() == Some("idle")
    }

    /// Ends, with `pg_terminate_backend`, the server sessions named `app(who)` that sit idle inside a transaction
    /// (waiting up to 5 s for each); returns how many.
    pub async fn terminate_idle_in_transaction(&self, who: &str) -> i64 {
        let mut conn = self.direct().await;
        sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity \
             WHERE application_name = $1 AND state = 'idle in transaction'",
        )
        .bind(self.app(who))
        .fetch_one(&mut conn)
        .await
        .expect("terminate sessions")
    }

    /// Whether `marks` holds `n`.
    pub async fn mark_exists(&self, n: i32) -> bool {
        let mut conn = self.direct().await;
        let statement = format!("SELECT count(*) FROM {}.marks WHERE n = $1", self.schema);
        let count: i64 =
            sqlx::query_scalar(AssertSqlSafe(statement)).bind(n).fetch_one(&mut conn).await.expect("count marks");
        count == 1
    }

    /// `BEGIN; INSERT INTO marks VALUES (n); COMMIT` on `conn`, as simple queries; the commit's result.
    pub async fn insert_in_transaction(&self, conn: &mut PgConnection, n: i32) -> Result<(), sqlx::Error> {
        let mut tx = conn.begin().await.expect("begin");
        let insert = format!("INSERT INTO {}.marks VALUES ({n})", self.schema);
        sqlx::query(AssertSqlSafe(insert)).execute(&mut *tx).await.expect("insert");
        tx.commit().await
    }

    /// Drops the schema (the test passed).
    pub async fn finish(self) {
        let mut conn = self.direct().await;
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.schema)))
            .execute(&mut conn)
            .await
            .expect("drop the test's schema");
    }
}

/// Waits until `holds` returns true, looking every 50 ms, for at most [`CONDITION_WAIT`]; panics naming `what`.
pub async fn wait_until<F: Future<Output = bool>>(what: &str, holds: impl Fn() -> F) {
    let waited = tokio::time::timeout(CONDITION_WAIT, async {
        while !holds().await {
            tokio::time::sleep(CONDITION_POLL).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: not within {CONDITION_WAIT:?}");
}
