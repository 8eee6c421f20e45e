//! [`PgOptions`]: how a [`PgStore`](super::PgStore) reaches PostgreSQL, which schema it owns, and how long its
//! sessions may wait.

use crate::store::{PoolUser, StoreError};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::fmt;
use std::time::Duration;

/// PostgreSQL identifiers are at most 63 bytes.
const SCHEMA_LEN_MAX: usize = 63;

/// The longest time-out PostgreSQL takes: its time-out settings are `int` milliseconds.
const SESSION_TIMEOUT_MAX: Duration = Duration::from_millis(i32::MAX as u64);

/// PostgreSQL's default `deadlock_timeout`: a session waiting on a lock this long checks for a deadlock.
const DEADLOCK_TIMEOUT_SERVER_DEFAULT: Duration = Duration::from_secs(1);

// A lock wait must outlast the deadlock check, so that a deadlock is reported as one (and run again, see `retry`)
// rather than as a lock time-out.
const _: () = assert!(PgOptions::LOCK_TIMEOUT_DEFAULT.as_millis() > DEADLOCK_TIMEOUT_SERVER_DEFAULT.as_millis());
// How these time-outs relate to the leases above the store (a lock wait well under a pipeline's or a node's
// heartbeat) is asserted where those leases' defaults are: the store names no layer above it.
const _: () = assert!(PgOptions::LOCK_TIMEOUT_DEFAULT.as_millis() < PgOptions::STATEMENT_TIMEOUT_DEFAULT.as_millis());
// A routine lock wait is never a slow statement, and a statement is logged as slow before it is cancelled.
const _: () =
    assert!(PgOptions::LOCK_TIMEOUT_DEFAULT.as_millis() < PgOptions::SLOW_STATEMENT_THRESHOLD_DEFAULT.as_millis());
const _: () =
    assert!(PgOptions::SLOW_STATEMENT_THRESHOLD_DEFAULT.as_millis() < PgOptions::STATEMENT_TIMEOUT_DEFAULT.as_millis());
// The default call bound never cuts short a call the server still runs within its own time-outs.
const _: () = assert!(
    PgOptions::CALL_TIMEOUT_DEFAULT.as_millis()
        > PgOptions::ACQUIRE_TIMEOUT_DEFAULT.as_millis() + PgOptions::STATEMENT_TIMEOUT_DEFAULT.as_millis()
);

/// How to reach PostgreSQL and which part of it a [`PgStore`](super::PgStore) owns.
///
/// `Debug` never shows the URL (it may hold a password).
#[derive(Clone)]
pub struct PgOptions {
    /// Connection URL, e.g. `postgres://postgres@127.0.0.1:5432/test`.
    pub url: String,
    /// Schema holding the store's tables; created if missing, set as `search_path` on every connection.
    /// Lowercase ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes. Stores sharing a
    /// schema share rows and fetch hints; tests give each case its own. Default [`PgOptions::SCHEMA_DEFAULT`].
    pub schema: String,
    /// Pool size: the most store calls in flight at once. Default [`PgOptions::MAX_CONNECTIONS_DEFAULT`]. The
    /// hint listener holds one more session of its own, so a store opens at most `max_connections + 1`.
    pub max_connections: u32,
    /// Wait for a free connection before a call fails with [`StoreError::Timeout`]. Default
    /// [`PgOptions::ACQUIRE_TIMEOUT_DEFAULT`].
    pub acquire_timeout: Duration,
    /// Added to the database's `now()` in every statement: zero in production; tests move it with
    /// [`PgStore::advance_clock`](super::PgStore::advance_clock) to cross lease expiry without sleeping. Default zero.
    pub clock_offset: Duration,
    /// `application_name` of every session, as `pg_stat_activity` shows it. Default
    /// [`PgOptions::APPLICATION_NAME_DEFAULT`].
    pub application_name: String,
    /// Whether the pool checks an idle connection with a round trip (sqlx's `test_before_acquire`) before each
    /// store call uses it. Default [`PgOptions::PING_BEFORE_USE_DEFAULT`].
    pub ping_before_use: bool,
    /// Whether connecting creates the schema if missing and applies the migrations not yet applied (default
    /// [`PgOptions::MIGRATE_DEFAULT`], true). False for a client that must not run DDL: connecting then only
    /// checks that the schema exists and holds every migration of this build, and fails with
    /// [`StoreError::Invalid`] (`schema X is not migrated: …`) if not, changing nothing.
    pub migrate: bool,
    /// PostgreSQL's `statement_timeout` on every pooled session and the hint listener's: a statement running
    /// longer is cancelled and its call fails with [`StoreError::Timeout`] (nothing written). Zero turns it off.
    /// The migration session has none (an index build may take long). Default
    /// [`PgOptions::STATEMENT_TIMEOUT_DEFAULT`].
    pub statement_timeout: Duration,
    /// PostgreSQL's `lock_timeout`: a statement waiting longer for a row lock is cancelled and its call fails with
    /// [`StoreError::Timeout`] (nothing written). Zero turns it off. Keep it well under the lease ttl of the
    /// pipelines on the store, and above PostgreSQL's `deadlock_timeout` (1 s by default) so that a deadlock is
    /// reported, and run again, as one. Default [`PgOptions::LOCK_TIMEOUT_DEFAULT`].
    pub lock_timeout: Duration,
    /// PostgreSQL's `idle_in_transaction_session_timeout`: a session that holds a transaction open this long
    /// without sending its next statement (its process is frozen or starved) is ended by the server, releasing its
    /// row locks; its call fails with [`StoreError::Unavailable`]. Zero turns it off. Default
    /// [`PgOptions::IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT`].
    pub idle_in_transaction_timeout: Duration,
    /// How often, local wall clock, the fetch hint listener checks that its session still answers: it sends
    /// `LISTEN` on its channel again and waits up to [`PgOptions::listen_check_timeout`] for the reply. A session
    /// that does not answer (half-open: a NAT, firewall or proxy forgot the connection and nothing closed it;
    /// pg-boss #850) is given up, a new one opened, and every fetcher of the store woken for a catch-up fetch (the
    /// hints sent meanwhile are lost). A dead listener is so noticed within `listen_check_interval +
    /// listen_check_timeout`. Zero turns the checks off: a half-open listener then goes deaf until the process
    /// ends, and only the fetchers' empty-fetch backoff finds new rows. Default
    /// [`PgOptions::LISTEN_CHECK_INTERVAL_DEFAULT`].
    pub listen_check_interval: Duration,
    /// Longest wait, local wall clock, for the reply to the listener's session check (see
    /// [`PgOptions::listen_check_interval`]). More than zero while the checks are on, or connecting fails with
    /// [`StoreError::Invalid`]. Default [`PgOptions::LISTEN_CHECK_TIMEOUT_DEFAULT`].
    pub listen_check_timeout: Duration,
    /// Longest one store call may take, local wall clock, from its start (the wait for a pooled connection
    /// included) to its result; past it the call is abandoned and fails with [`StoreError::Timeout`], and the
    /// connection it used is checked (a ping within the same bound) before the pool takes it back, or closed.
    /// PostgreSQL's own time-outs cannot end a call whose connection is half-open (a NAT, firewall or proxy
    /// forgot it, with no FIN or RST): its statement never reaches the server, or its reply never comes back,
    /// and without this bound the call, and the worker waiting on it, hangs until the operating system gives the
    /// socket up (about 15 minutes of retransmissions on Linux, never if the peer still acknowledges). Keep it
    /// above `acquire_timeout` + `statement_timeout`, so that a call the server is still running is not cut
    /// short. Zero: unbounded. Default [`PgOptions::CALL_TIMEOUT_DEFAULT`]. One gap remains: a connection that
    /// goes half-open between the store's ping and sqlx's own (unbounded) one right after it keeps its slot. (TCP
    /// keepalive, which would end such a socket on the client's side, cannot be set: sqlx 0.9 opens the socket
    /// itself and takes no socket option, and ignores libpq's `keepalives*` URL parameters.)
    pub call_timeout: Duration,
    /// A statement running at least this long, local wall clock, is logged by sqlx (target `sqlx::query`) at
    /// INFO, with its SQL text; a faster one at DEBUG, as sqlx logs every statement. sqlx's own default is WARN
    /// past 1 s, which a routine wait on a row lock (up to `lock_timeout`) or a large spec's insert passes, and
    /// the warning carries the whole statement. Default [`PgOptions::SLOW_STATEMENT_THRESHOLD_DEFAULT`].
    pub slow_statement_threshold: Duration,
    /// Chaos mode (`lockstep chaos run`): every lease write (fetch, heartbeat, related lock, apply, failure, reset,
    /// release, write API update) also appends what it did to the schema's `history` table, in the same
    /// transaction, so the simulator's checkers can read a real run's commit history ([`PgStore::history`]). The
    /// store creates the table if missing. Off by default, and then nothing is recorded and no call changes.
    ///
    /// [`PgStore::history`]: super::PgStore::history
    pub history: bool,
    /// Mutation testing only (the chaos harness's planted bug): the guarded apply skips its token guard on the
    /// main row and writes as if every token were current, as
    /// [`MemStore::disable_apply_guard_for_mutation_test`](crate::store::MemStore::disable_apply_guard_for_mutation_test)
    /// does. Never set it elsewhere. Default false.
    #[doc(hidden)]
    pub apply_guard_disabled_for_mutation_test: bool,
}

impl PgOptions {
    /// Default pool size: 25, enough for one pipeline of the default config, its 20 workers, 2 fetchers, its
    /// heartbeater and its 2 apply batches in flight (DESIGN §3 sizes the pool for workers + fetchers + heartbeater +
    /// apply batches in flight, a [`PoolUser`]'s `connections_needed`; the manager refuses configs that need more;
    /// the pipeline's defaults are checked against this number where they are defined). It was 11, sized for 8
    /// workers, so a default pipeline could not be registered on a default store (a new user's trial); then 23,
    /// without the batches, whose connections a slow database left the workers waiting for. Sessions open only as
    /// calls need them.
    pub const MAX_CONNECTIONS_DEFAULT: u32 = 25;
    /// Default wait for a free pooled connection before a call fails with [`StoreError::Timeout`].
    pub const ACQUIRE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    /// Default `application_name`.
    pub const APPLICATION_NAME_DEFAULT: &str = "lockstep";
    /// Default schema.
    /// Not `public`: lockstep's tables (`resources`, `events`, `_sqlx_migrations`) would meet an application's own
    /// there (a table `events`, another tool's sqlx migrations), and the migration would fail half-way.
    pub const SCHEMA_DEFAULT: &str = "lockstep";
    /// Default of [`PgOptions::ping_before_use`]: off. sqlx 0.9 already pings every connection when a call
    /// returns it to the pool (in the background, not on the call's path), so a check before use only catches a
    /// connection that died while idle, and costs a second extra round trip on every call
    /// (docs/benchmarks-history.md, "What made it faster"). Without
    /// it such a connection fails its one call with `Unavailable`, which the engine handles as it handles any
    /// lost call: reads are retried, writes are left to lease expiry and the guarded apply.
    pub const PING_BEFORE_USE_DEFAULT: bool = false;
    /// Default of [`PgOptions::migrate`]: connecting migrates.
    pub const MIGRATE_DEFAULT: bool = true;
    /// Default of [`PgOptions::statement_timeout`]: 30 s. Every statement of a store call finds its rows by
    /// primary key, token or the fetch index and takes milliseconds (docs/benchmarks-history.md, "First round:
    /// measured first"); the longest is the insert of
    /// a whole spec's jobs by the operation's first pass (100 000 jobs, the spec's limit: 4.0 s measured here, and
    /// 2.0 s for their events). A statement past 30 s is a runaway, and 30 s is the default lease ttl.
    pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
    /// Default of [`PgOptions::lock_timeout`]: 2 s. Every transaction of lockstep is one store call that holds its
    /// row locks for milliseconds, so a wait of seconds means the holder is stuck (a frozen replica, a person's open
    /// transaction). 2 s is above PostgreSQL's 1 s `deadlock_timeout` and at most a quarter of the default lease
    /// ttls (30 s for operations, 10 s for nodes), so a heartbeat stuck behind such a holder fails in time to be
    /// tried again before its lease is lost.
    pub const LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
    /// Default of [`PgOptions::idle_in_transaction_timeout`]: 5 s. lockstep keeps a transaction open only across
    /// the round trips of one store call (well under a millisecond each); after seconds idle its process is
    /// frozen, and its locks make every other process's calls on those rows time out until the server ends it.
    /// 5 s is half the default node lease ttl (10 s), so an agent's node heartbeat stuck behind a frozen session
    /// goes through again before the agent would fence itself.
    pub const IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    /// Default of [`PgOptions::listen_check_interval`]: 5 s, the longest step of the default empty-fetch backoff
    /// (DESIGN §3), so that a deaf listener costs a pipeline about as much as one backoff. One round trip of well
    /// under a millisecond per store every 5 s.
    pub const LISTEN_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
    /// Default of [`PgOptions::call_timeout`]: 36 s, the acquire and statement time-outs (5 s + 30 s) plus 1 s, the
    /// least bound that never cuts short a call the server itself still runs within its own time-outs (the rule of
    /// [`PgOptions::call_timeout`]). The longest call measured here, the first pass of a 100 000-job spec (4.0 s of
    /// job inserts and 2.0 s of events, see [`PgOptions::STATEMENT_TIMEOUT_DEFAULT`]), is a sixth of it. Without a
    /// bound, a worker whose connection went half-open (the database host died, a NAT dropped the flow) waited for
    /// ever, and its item's lease was renewed for the life of the process. The bound's cost is a bounded ping of
    /// each connection a call gives back, before sqlx's own, off the call's path (docs/benchmarks-history.md,
    /// "A bound on every store call": estimated from the analogous ping-before-use row; the bench's "store calls
    /// unbounded" contender measures it).
    pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(
        PgOptions::ACQUIRE_TIMEOUT_DEFAULT.as_secs() + PgOptions::STATEMENT_TIMEOUT_DEFAULT.as_secs() + 1,
    );
    /// Default of [`PgOptions::slow_statement_threshold`]: 5 s, past the waits lockstep's statements have in a
    /// healthy run: a row lock wait ends at [`PgOptions::LOCK_TIMEOUT_DEFAULT`] (2 s, then the call fails with a
    /// time-out the engine logs), and the longest statement measured, a 100 000-job spec's insert, took 4.0 s
    /// (see [`PgOptions::STATEMENT_TIMEOUT_DEFAULT`]).
    pub const SLOW_STATEMENT_THRESHOLD_DEFAULT: Duration = Duration::from_secs(5);
    /// Default of [`PgOptions::listen_check_timeout`]: 5 s. `LISTEN` answers in well under a millisecond; a reply
    /// seconds late means the session is dead or the server stalled, and either way a new session is the cure.
    /// With the default interval a half-open listener is noticed within 10 s.
    pub const LISTEN_CHECK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

    /// The form of a connection URL, for messages: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`.
    pub const URL_FORM: &str = "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE";

    /// Checks that `url` is a PostgreSQL connection URL: not empty, and of the scheme `postgres://` or
    /// `postgresql://` (in any case). sqlx would read a URL of any other scheme as PostgreSQL's, and fails on one
    /// without a scheme with the URL parser's words (`relative URL without a base`). [`PgStore::connect_with`]
    /// checks it; a program that takes the URL from a flag or a variable checks it first, to name that flag or
    /// variable in its message, as `lockstep` does (`--database-url: a mysql:// URL is not PostgreSQL's: write
    /// postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`).
    ///
    /// ```
    /// # use lockstep::PgOptions;
    /// assert!(PgOptions::check_url("postgres://app@db.internal:5432/orders").is_ok());
    /// let rule = PgOptions::check_url("db.internal/orders").unwrap_err();
    /// assert_eq!(rule, "not a URL: write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE");
    /// ```
    ///
    /// # Errors
    /// The rule broken, with the form to write ([`PgOptions::URL_FORM`]). The message never holds the URL, which
    /// may hold a password: only its scheme, when that is short and plain.
    ///
    /// [`PgStore::connect_with`]: super::PgStore::connect_with
    pub fn check_url(url: &str) -> Result<(), String> {
        let form = PgOptions::URL_FORM;
        if url.trim().is_empty() {
            return Err(format!("the URL is empty: write {form}"));
        }
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(format!("not a URL: write {form}"));
        };
        if scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql") {
            return Ok(());
        }
        let plain = scheme.len() <= 16 && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        let shown = if plain { format!("a {scheme}:// URL") } else { "a URL of another scheme".to_string() };
        Err(format!("{shown} is not PostgreSQL's: write {form}"))
    }

    /// Options for `url` with every default.
    pub fn new(url: impl Into<String>) -> PgOptions {
        PgOptions {
            url: url.into(),
            schema: PgOptions::SCHEMA_DEFAULT.to_string(),
            max_connections: PgOptions::MAX_CONNECTIONS_DEFAULT,
            acquire_timeout: PgOptions::ACQUIRE_TIMEOUT_DEFAULT,
            clock_offset: Duration::ZERO,
            application_name: PgOptions::APPLICATION_NAME_DEFAULT.to_string(),
            ping_before_use: PgOptions::PING_BEFORE_USE_DEFAULT,
            migrate: PgOptions::MIGRATE_DEFAULT,
            statement_timeout: PgOptions::STATEMENT_TIMEOUT_DEFAULT,
            lock_timeout: PgOptions::LOCK_TIMEOUT_DEFAULT,
            idle_in_transaction_timeout: PgOptions::IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
            listen_check_interval: PgOptions::LISTEN_CHECK_INTERVAL_DEFAULT,
            listen_check_timeout: PgOptions::LISTEN_CHECK_TIMEOUT_DEFAULT,
            call_timeout: PgOptions::CALL_TIMEOUT_DEFAULT,
            slow_statement_threshold: PgOptions::SLOW_STATEMENT_THRESHOLD_DEFAULT,
            history: false,
            apply_guard_disabled_for_mutation_test: false,
        }
    }

    /// The same options with a pool sized for `configs`, the pipelines that will be registered on the store (any
    /// [`PoolUser`]; a pipeline's config is one): the sum of their `connections_needed`
    /// ([`PipelineConfig::connections_needed`](crate::pipeline::PipelineConfig::connections_needed)), at least 1,
    /// saturating at `u32::MAX`. That is the sum
    /// [`PipelineManager::register`](crate::pipeline::PipelineManager::register) checks against
    /// [`PgOptions::max_connections`] (DESIGN §3), so registering exactly `configs` never fails with
    /// [`ConfigError::Connections`](crate::pipeline::ConfigError::Connections), whatever their worker counts: two
    /// pipelines of the default config need 50, twice the default pool
    /// ([`PgOptions::MAX_CONNECTIONS_DEFAULT`]). Store calls of your own beside the pipelines (`get`, `list`,
    /// `insert`) share the pool: add a connection or two for them. `insert_in` runs on your connection, not the
    /// pool's.
    ///
    /// ```
    /// # use lockstep::{PgOptions, PipelineConfig};
    /// let lines = PipelineConfig::new("lines", "line", &["new"]);
    /// let orders = PipelineConfig { workers: 2, ..PipelineConfig::new("orders", "order", &["open"]) };
    /// let options = PgOptions::new("postgres://127.0.0.1/app").with_pool_for([&lines, &orders]);
    /// assert_eq!(options.max_connections as usize, lines.connections_needed() + orders.connections_needed());
    /// ```
    pub fn with_pool_for<'a, U: PoolUser + ?Sized + 'a>(
        mut self,
        configs: impl IntoIterator<Item = &'a U>,
    ) -> PgOptions {
        let needed: usize = configs.into_iter().map(PoolUser::connections_needed).sum();
        self.max_connections = u32::try_from(needed.max(1)).unwrap_or(u32::MAX);
        self
    }

    /// Checks the listener's session-check options (see [`PgOptions::listen_check_interval`]).
    ///
    /// Errors: `Invalid` naming `listen_check_timeout` when it is zero while the checks are on.
    pub(super) fn check_listen(&self) -> Result<(), StoreError> {
        if !self.listen_check_interval.is_zero() && self.listen_check_timeout.is_zero() {
            return Err(StoreError::Invalid(format!(
                "listen_check_timeout: 0s must be more than zero while listen_check_interval ({:?}) is on",
                self.listen_check_interval
            )));
        }
        Ok(())
    }

    /// The bounds a [`StoreError::Timeout`] of a store with these options reports.
    pub(super) fn waits(&self) -> Waits {
        Waits { acquire: self.acquire_timeout, lock: self.lock_timeout, statement: self.statement_timeout }
    }

    /// The settings every session of the store starts with (as startup options, like `search_path`: no round
    /// trip per connection, and they survive `RESET ALL`), the time-outs in milliseconds. `migration`: for the
    /// session that migrates, which has neither a statement nor a lock time-out (a migration may build an index
    /// on a large table, and waits for another process's migration of the schema however long it takes).
    ///
    /// Errors: `Invalid` naming the option when a time-out exceeds PostgreSQL's largest (about 24.8 days).
    pub(super) fn session_settings(&self, migration: bool) -> Result<Vec<(&'static str, String)>, StoreError> {
        let (statement, lock) =
            if migration { (Duration::ZERO, Duration::ZERO) } else { (self.statement_timeout, self.lock_timeout) };
        Ok(vec![
            ("search_path", self.schema.clone()),
            // The channel of the wake hints the trigger of migration 0009 sends (DESIGN §3, "Parked waiters").
            ("lockstep.wake_channel", super::listen::channel(&self.schema)),
            ("statement_timeout", timeout_millis("statement_timeout", statement)?),
            ("lock_timeout", timeout_millis("lock_timeout", lock)?),
            (
                "idle_in_transaction_session_timeout",
                timeout_millis("idle_in_transaction_timeout", self.idle_in_transaction_timeout)?,
            ),
        ])
    }
}

/// Which wait ran out, for [`StoreError::Timeout`]: the pool's wait for a connection, PostgreSQL's
/// `lock_timeout` or its `statement_timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Waits {
    pub(super) acquire: Duration,
    pub(super) lock: Duration,
    pub(super) statement: Duration,
}

impl Waits {
    /// The defaults of [`PgOptions`] (sessions opened outside a store, e.g. to drop a schema).
    pub(super) const DEFAULT: Waits = Waits {
        acquire: PgOptions::ACQUIRE_TIMEOUT_DEFAULT,
        lock: PgOptions::LOCK_TIMEOUT_DEFAULT,
        statement: PgOptions::STATEMENT_TIMEOUT_DEFAULT,
    };
}

/// `span` as a PostgreSQL time-out setting: whole milliseconds, rounded up so that a nonzero span stays on.
fn timeout_millis(option: &str, span: Duration) -> Result<String, StoreError> {
    if span > SESSION_TIMEOUT_MAX {
        return Err(StoreError::Invalid(format!(
            "{option}: {} exceeds PostgreSQL's largest time-out, {}",
            crate::duration::format(span),
            crate::duration::format(SESSION_TIMEOUT_MAX)
        )));
    }
    Ok(span.as_nanos().div_ceil(1_000_000).to_string())
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &"<redacted>")
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("clock_offset", &self.clock_offset)
            .field("application_name", &self.application_name)
            .field("ping_before_use", &self.ping_before_use)
            .field("migrate", &self.migrate)
            .field("statement_timeout", &self.statement_timeout)
            .field("lock_timeout", &self.lock_timeout)
            .field("idle_in_transaction_timeout", &self.idle_in_transaction_timeout)
            .field("listen_check_interval", &self.listen_check_interval)
            .field("listen_check_timeout", &self.listen_check_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("slow_statement_threshold", &self.slow_statement_threshold)
            .field("history", &self.history)
            .finish_non_exhaustive()
    }
}

/// The rule of [`PgOptions::schema`]; the name is also spliced into `CREATE SCHEMA` and the channel name, so
/// nothing else may pass.
pub(super) fn check_schema(schema: &str) -> Result<(), StoreError> {
    let mut chars = schema.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && schema.len() <= SCHEMA_LEN_MAX {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "schema: {schema:?} must be 1 to {SCHEMA_LEN_MAX} of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

/// The connect options of `url`, with TLS as the URL asks: its `sslmode` (`disable`, `allow`, `prefer`, `require`,
/// `verify-ca`, `verify-full`, as libpq takes them; or `PGSSLMODE`, which sqlx reads as libpq does). A URL that
/// names no mode connects without TLS, as lockstep did before it had TLS: libpq's default, `prefer`, would first
/// ask every server for TLS, which protects against no one on the path (it falls back to plain text) and makes a
/// connection closed at that request read as a protocol error. Give `sslmode=require` or stricter for TLS.
///
/// Errors: sqlx's, for a URL it cannot read (the caller maps them).
pub(super) fn connect_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    let named = url::Url::parse(url)
        .is_ok_and(|url| url.query_pairs().any(|(key, _)| key == "sslmode" || key == "ssl-mode"))
        || std::env::var_os("PGSSLMODE").is_some();
    Ok(if named { options } else { options.ssl_mode(PgSslMode::Disable) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(check_schema("t_1_2_3").is_ok());
        assert!(check_schema("_x").is_ok());
        for bad in ["", "1t", "T", "a-b", "a\"b", "a b", &"s".repeat(64)] {
            assert!(check_schema(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn time_outs_are_whole_milliseconds_rounded_up_within_postgres_bounds() {
        let mut options = PgOptions::new("postgres://h/db");
        options.lock_timeout = Duration::from_micros(1500);
        options.statement_timeout = Duration::ZERO;
        let settings = options.session_settings(false).unwrap();
        assert!(settings.contains(&("lock_timeout", "2".to_string())), "{settings:?}");
        assert!(settings.contains(&("statement_timeout", "0".to_string())), "{settings:?}");
        assert!(settings.contains(&("idle_in_transaction_session_timeout", "5000".to_string())), "{settings:?}");
        let migration = options.session_settings(true).unwrap();
        assert!(migration.contains(&("lock_timeout", "0".to_string())), "{migration:?}");
        options.idle_in_transaction_timeout = Duration::from_secs(30 * 24 * 3600);
        let error = options.session_settings(false).unwrap_err().to_string();
        assert!(error.contains("idle_in_transaction_timeout: 2592000s exceeds"), "{error}");
    }

    #[test]
    fn listener_checks_need_a_time_out_while_on() {
        let mut options = PgOptions::new("postgres://h/db");
        assert!(options.check_listen().is_ok());
        options.listen_check_timeout = Duration::ZERO;
        let error = options.check_listen().unwrap_err().to_string();
        assert!(error.contains("listen_check_timeout: 0s must be more than zero"), "{error}");
        options.listen_check_interval = Duration::ZERO;
        assert!(options.check_listen().is_ok(), "checks off: no time-out needed");
    }

    /// A pool user that needs a fixed number of connections.
    struct Needs(usize);

    impl PoolUser for Needs {
        fn connections_needed(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn a_pool_sized_for_its_users_holds_them_all_and_is_never_empty() {
        let (lines, orders) = (Needs(25), Needs(25));
        let options = PgOptions::new("postgres://h/db").with_pool_for([&lines, &orders]);
        assert_eq!(options.max_connections, 50, "twice the default pool");
        let options = PgOptions::new("postgres://h/db").with_pool_for([&Needs(5)]);
        assert_eq!(options.max_connections, 5, "smaller than the default pool when that is enough");
        let options = PgOptions::new("postgres://h/db").with_pool_for::<Needs>([]);
        assert_eq!(options.max_connections, 1, "a pool is never empty");
        let options = PgOptions::new("postgres://h/db").with_pool_for([&Needs(usize::MAX), &Needs(0)]);
        assert_eq!(options.max_connections, u32::MAX, "saturates");
    }

    #[test]
    fn a_url_must_be_postgresql_and_the_rule_never_shows_it() {
        for url in ["postgres://u:p@h:5432/db", "POSTGRESQL://h/db", "postgres:///db?host=/run/postgresql"] {
            assert_eq!(PgOptions::check_url(url), Ok(()), "{url}");
        }
        let form = PgOptions::URL_FORM;
        assert_eq!(PgOptions::check_url(""), Err(format!("the URL is empty: write {form}")));
        assert_eq!(PgOptions::check_url("  "), Err(format!("the URL is empty: write {form}")));
        assert_eq!(PgOptions::check_url("u:secret@h/db"), Err(format!("not a URL: write {form}")));
        let mysql = PgOptions::check_url("mysql://root:secret@h/db").unwrap_err();
        assert_eq!(mysql, format!("a mysql:// URL is not PostgreSQL's: write {form}"));
        let odd = PgOptions::check_url("x y:secret://h").unwrap_err();
        assert_eq!(odd, format!("a URL of another scheme is not PostgreSQL's: write {form}"));
    }

    #[test]
    fn options_debug_hides_the_url() {
        let options = PgOptions::new("postgres://u:hunter2@h/db");
        assert!(!format!("{options:?}").contains("hunter2"));
    }
}
