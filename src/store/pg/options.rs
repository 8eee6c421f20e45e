//! [`PgOptions`]: how a [`PgStore`](super::PgStore) reaches PostgreSQL and which schema it owns.

use crate::store::StoreError;
use std::fmt;
use std::time::Duration;

/// PostgreSQL identifiers are at most 63 bytes.
const SCHEMA_LEN_MAX: usize = 63;

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
}

impl PgOptions {
    /// Default pool size: enough for a pipeline of 8 workers plus its fetcher and its heartbeater (DESIGN §3 sizes
    /// the pool for workers + fetchers + heartbeater; the manager refuses configs that need more).
    pub const MAX_CONNECTIONS_DEFAULT: u32 = 10;
    /// Default wait for a free pooled connection before a call fails with [`StoreError::Timeout`].
    pub const ACQUIRE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    /// Default `application_name`.
    pub const APPLICATION_NAME_DEFAULT: &str = "lockstep";
    /// Default schema.
    pub const SCHEMA_DEFAULT: &str = "public";
    /// Default of [`PgOptions::ping_before_use`]: off. sqlx 0.9 already pings every connection when a call
    /// returns it to the pool (in the background, not on the call's path), so a check before use only catches a
    /// connection that died while idle, and costs a second extra round trip on every call (BENCHMARKS.md). Without
    /// it such a connection fails its one call with `Unavailable`, which the engine handles as it handles any
    /// lost call: reads are retried, writes are left to lease expiry and the guarded apply.
    pub const PING_BEFORE_USE_DEFAULT: bool = false;
    /// Default of [`PgOptions::migrate`]: connecting migrates.
    pub const MIGRATE_DEFAULT: bool = true;

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
        }
    }
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
            .finish()
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
    fn options_debug_hides_the_url() {
        let options = PgOptions::new("postgres://u:hunter2@h/db");
        assert!(!format!("{options:?}").contains("hunter2"));
    }
}
