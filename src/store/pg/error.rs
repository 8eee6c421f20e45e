//! The one conversion from sqlx's errors to [`StoreError`] (STYLE, Errors), and the scrubbing that keeps
//! connection URLs and passwords out of every message PgStore returns or logs.

use super::options::Waits;
use crate::store::{RowId, StoreError};
use sqlx::migrate::MigrateError;

/// SQLSTATE codes after which the transaction may simply be retried: serialization failure and deadlock.
const CONFLICT_CODES: [&str; 2] = ["40001", "40P01"];

/// SQLSTATE codes (or classes, by prefix) that mean the server went away or refuses connections: class 08
/// (connection exception), admin/crash shutdown, "cannot connect now", too many connections, and a session the
/// server ended for idling in a transaction (`idle_in_transaction_session_timeout`).
const UNAVAILABLE_CODES: [&str; 6] = ["08", "57P01", "57P02", "57P03", "53300", "25P03"];

/// SQLSTATE of a lock wait that ran past `lock_timeout` (lock_not_available).
const LOCK_TIMEOUT_CODE: &str = "55P03";

/// SQLSTATE of a statement cancelled by `statement_timeout` (query_canceled; also a cancel request).
const STATEMENT_TIMEOUT_CODE: &str = "57014";

/// SQLSTATE codes (or classes) of a connection the server refused for what the URL names: class 28 (invalid
/// authorization: no such role, a wrong password) and 3D000 (no such database). The caller's URL is wrong.
const REFUSED_URL_CODES: [&str; 2] = ["28", "3D000"];

/// SQLSTATE class 22 (data exception): a value PostgreSQL cannot store, e.g. a NUL character in `text` (22021)
/// or `\u0000` in `jsonb` (22P05). The call's arguments broke a rule of the store.
const INVALID_DATA_CLASS: &str = "22";

/// SQLSTATE 54000 (program limit exceeded): e.g. an index row larger than a btree page allows. The store refuses
/// such keys before SQL (`KEY_TEXT_BYTES_MAX`); this keeps one that slips past `Invalid` all the same.
const LIMIT_EXCEEDED: &str = "54000";

/// SQLSTATE 23503 (foreign_key_violation).
const FOREIGN_KEY_VIOLATION: &str = "23503";

/// The foreign key of `resources.parent_id` (`migrations/0008_parent_foreign_key.sql`).
const PARENT_FOREIGN_KEY: &str = "resources_parent_fk";

/// The parent that a row of the failed statement named and that does not exist: `err` is the violation of the
/// parent foreign key by an insert, whose detail PostgreSQL writes as `Key (parent_id)=(12) is not present in table
/// "resources".`. `None` for any other error, and for the violation by a delete (a parent still referenced:
/// [`is_parent_still_referenced`]).
pub(super) fn missing_parent(err: &sqlx::Error) -> Option<RowId> {
    parent_violation(err).and_then(missing_parent_in)
}

/// The parent named by the detail of the parent foreign key's violation by an insert (`Key (parent_id)=(12) is
/// not present in table "resources".`), if `detail` is one.
fn missing_parent_in(detail: &str) -> Option<RowId> {
    let id = detail.strip_prefix("Key (parent_id)=(")?.split(')').next()?;
    id.parse().ok().map(RowId)
}

/// Whether `err` is the parent foreign key refusing a delete of a row that a row names as its parent (detail `Key
/// (id)=(5) is still referenced from table "resources".`): a purge whose snapshot missed a child committed before it
/// locked the parent (DESIGN §2, "Parents"). Nothing was deleted; the purge runs again and its next snapshot sees
/// the child.
pub(super) fn is_parent_still_referenced(err: &sqlx::Error) -> bool {
    parent_violation(err).is_some_and(|detail| detail.starts_with(STILL_REFERENCED))
}

/// How PostgreSQL's detail of the parent foreign key's violation by a delete begins.
const STILL_REFERENCED: &str = "Key (id)=(";

/// PostgreSQL's detail of a violation of the parent foreign key, if `err` is one.
fn parent_violation(err: &sqlx::Error) -> Option<&str> {
    let db = err.as_database_error()?;
    if db.code().as_deref() != Some(FOREIGN_KEY_VIOLATION) || db.constraint() != Some(PARENT_FOREIGN_KEY) {
        return None;
    }
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?.detail()
}

/// Maps a sqlx error to the store's error. `waits` are the store's bounds, reported by the `Timeout` of the one
/// that ran out: the pool's wait for a connection, a lock wait (`lock_timeout`) or a statement
/// (`statement_timeout`). Lost or refused connections are `Unavailable`, serialization failures and deadlocks
/// `Conflict`, a malformed URL, a role, password or database the server refuses, or a value PostgreSQL cannot
/// store (or an index key past its limit) `Invalid`, anything else `Other`. A database error's message is
/// PostgreSQL's own with its SQLSTATE (not sqlx's wrapping, which adds the line of the server's source that raised
/// it). Every message is [`scrub`]bed.
/// [`store_error`] for a statement on the caller's own connection (`PgStore::insert_in`): its time-outs are the
/// caller's, not the store's `waits`, so a lock or statement time-out says so without a span it cannot know.
pub(super) fn caller_error(err: sqlx::Error, waits: Waits) -> StoreError {
    if let sqlx::Error::Database(ref db) = err {
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        let setting = match code.as_str() {
            LOCK_TIMEOUT_CODE => Some("lock_timeout"),
            STATEMENT_TIMEOUT_CODE => Some("statement_timeout"),
            _ => None,
        };
        if let Some(setting) = setting {
            return StoreError::Other(scrub(&format!(
                "{} (SQLSTATE {code}): your connection's {setting} ended the statement; your transaction is aborted",
                db.message()
            )));
        }
    }
    store_error(err, waits)
}

pub(super) fn store_error(err: sqlx::Error, waits: Waits) -> StoreError {
    match err {
        sqlx::Error::PoolTimedOut => StoreError::Timeout(waits.acquire),
        sqlx::Error::Configuration(_) => {
            // sqlx wraps a URL option it refuses in a second configuration error: say "error with configuration" once.
            let text = err.to_string();
            const PREFIX: &str = "error with configuration: ";
            let once = text.strip_prefix(PREFIX).filter(|rest| rest.starts_with(PREFIX)).unwrap_or(&text);
            StoreError::Invalid(scrub(once))
        }
        // A certificate the URL's `sslmode` (`verify-ca`, `verify-full`) refuses is the URL's fault, and the same
        // on every try: not a server that cannot be reached.
        sqlx::Error::Io(ref io) if is_certificate_refused(io) => StoreError::Invalid(scrub(&format!(
            "{err} (the URL's sslmode checks the server's certificate: give sslrootcert=PATH of the CA that signed \
             it, or a host the certificate names)"
        ))),
        // sqlx reads the one-byte answer to its TLS request into a zeroed buffer: a connection closed before the
        // answer reads as the byte 0.
        sqlx::Error::Protocol(ref detail) if is_closed_at_tls_request(detail) => {
            StoreError::Unavailable(scrub(&format!("the server closed the connection before answering: {detail}")))
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            StoreError::Unavailable(scrub(&err.to_string()))
        }
        sqlx::Error::Database(ref db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = scrub(&format!("{} (SQLSTATE {code})", db.message()));
            if CONFLICT_CODES.contains(&code.as_str()) {
                StoreError::Conflict(message)
            } else if code == LOCK_TIMEOUT_CODE {
                StoreError::Timeout(waits.lock)
            } else if code == STATEMENT_TIMEOUT_CODE {
                StoreError::Timeout(waits.statement)
            } else if UNAVAILABLE_CODES.iter().any(|c| code.starts_with(c)) {
                StoreError::Unavailable(message)
            } else if code.starts_with(INVALID_DATA_CLASS)
                || code == LIMIT_EXCEEDED
                || REFUSED_URL_CODES.iter().any(|c| code.starts_with(c))
            {
                StoreError::Invalid(message)
            } else {
                StoreError::Other(message)
            }
        }
        sqlx::Error::Migrate(migrate) => match *migrate {
            MigrateError::Execute(inner) => store_error(inner, waits),
            // The schema holds a migration this build does not have: `migrate` cannot help, a newer build can.
            MigrateError::VersionMissing(version) => StoreError::Other(super::newer_schema(None, version)),
            other => StoreError::Other(scrub(&format!("migration: {other}"))),
        },
        other => StoreError::Other(scrub(&other.to_string())),
    }
}

/// How the store's first session with the server at `address` (`host:port`) failed, in words that name it: a
/// reply in another protocol (a MySQL, MariaDB or Redis server at the URL's port; sqlx says "unknown message
/// type") is `Invalid`, the URL's fault; a connection closed before any reply is `Unavailable`; anything else as
/// [`store_error`].
pub(super) fn greeting_error(err: sqlx::Error, address: &str, waits: Waits) -> StoreError {
    match err {
        sqlx::Error::Protocol(ref detail) if is_closed_at_tls_request(detail) => StoreError::Unavailable(scrub(
            &format!("the server at {address} closed the connection without answering as PostgreSQL does"),
        )),
        sqlx::Error::Protocol(detail) => {
            // sqlx ends the detail with the place in its source that raised it: ` (sqlx_postgres::message:173)`.
            let detail = match detail.rfind(" (sqlx_") {
                Some(at) if detail.ends_with(')') => &detail[..at],
                _ => &detail,
            };
            StoreError::Invalid(scrub(&format!(
                "the server at {address} did not answer as PostgreSQL does ({detail}): is the URL's host and port \
                 another server's, such as MySQL's (3306) or Redis's (6379)? PostgreSQL listens on 5432 by default"
            )))
        }
        sqlx::Error::Io(ref io) if io.kind() == std::io::ErrorKind::UnexpectedEof => StoreError::Unavailable(scrub(
            &format!("the server at {address} closed the connection without answering as PostgreSQL does"),
        )),
        other => store_error(other, waits),
    }
}

/// Whether sqlx's protocol error `detail` is its TLS request (`sslmode` `prefer` or stricter) answered by a closed
/// connection: sqlx reads the answer's byte into a zeroed buffer, so an end of stream reads as 0x00, which no
/// server sends (PostgreSQL answers `S` or `N`).
fn is_closed_at_tls_request(detail: &str) -> bool {
    detail.starts_with("unexpected response from SSLRequest: 0x00")
}

/// Whether `io` is rustls refusing the server's certificate (`sslmode=verify-ca` or `verify-full`): rustls's
/// error, carried as the I/O error's source, says `invalid peer certificate`.
fn is_certificate_refused(io: &std::io::Error) -> bool {
    io.kind() == std::io::ErrorKind::InvalidData && io.to_string().contains("invalid peer certificate")
}

/// Whether `err` is a serialization failure or deadlock: PostgreSQL rolled the transaction back, so the call
/// wrote nothing and may run again whole (`retry`).
pub(super) fn is_conflict(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| CONFLICT_CODES.contains(&code.as_ref())),
        _ => false,
    }
}

/// `text` with every URL (`scheme://…`, up to white space or a quote) replaced by `<url>` and every
/// `password=…` value by `<redacted>`: sqlx's messages may quote the connection string.
pub(super) fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = next_secret(rest) {
        let (start, end, replacement) = found;
        out.push_str(&rest[..start]);
        out.push_str(replacement);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The first secret in `text`: its byte range and what replaces it.
fn next_secret(text: &str) -> Option<(usize, usize, &'static str)> {
    let url = text.find("://").map(|sep| {
        let start = text[..sep].rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c))).map_or(0, |i| i + 1);
        (start, token_end(text, sep), "<url>")
    });
    let lower = text.to_ascii_lowercase();
    let password = lower.find("password=").map(|at| {
        let value = at + "password=".len();
        (value, token_end(text, value), "<redacted>")
    });
    match (url, password) {
        (Some(u), Some(p)) => Some(if u.0 <= p.0 { u } else { p }),
        (u, p) => u.or(p),
    }
}

/// Where a token starting at or before `from` ends: the next white space, quote or `)`.
fn token_end(text: &str, from: usize) -> usize {
    text[from..].find(|c: char| c.is_whitespace() || "\"'`)".contains(c)).map_or(text.len(), |i| from + i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_parent_keys_violation_by_an_insert_names_the_parent_and_by_a_delete_none() {
        let insert = "Key (parent_id)=(12) is not present in table \"resources\".";
        assert_eq!(missing_parent_in(insert), Some(RowId(12)));
        let delete = "Key (id)=(5) is still referenced from table \"resources\".";
        assert_eq!(missing_parent_in(delete), None);
        assert!(delete.starts_with(STILL_REFERENCED) && !insert.starts_with(STILL_REFERENCED));
        assert_eq!(missing_parent_in("Key (parent_id)=(x) is not present"), None);
    }

    #[test]
    fn scrub_removes_urls_with_credentials() {
        let text = "error with configuration: postgres://user:hunter2@db:5432/x?sslmode=disable failed";
        let scrubbed = scrub(text);
        assert!(!scrubbed.contains("hunter2"), "{scrubbed}");
        assert_eq!(scrubbed, "error with configuration: <url> failed");
    }

    #[test]
    fn scrub_removes_password_options() {
        let scrubbed = scrub("host=db Password=hunter2 user=u, then postgresql://a:b@c");
        assert_eq!(scrubbed, "host=db Password=<redacted> user=u, then <url>");
    }

    #[test]
    fn scrub_keeps_plain_messages() {
        let text = "relation \"resources\" does not exist";
        assert_eq!(scrub(text), text);
    }

    #[test]
    fn a_refused_url_option_says_error_with_configuration_once() {
        let inner = sqlx::Error::Configuration("unknown value \"bogus\" for sslmode".into());
        let error = store_error(sqlx::Error::Configuration(Box::new(inner)), Waits::DEFAULT);
        let StoreError::Invalid(message) = error else { panic!("not Invalid: {error:?}") };
        assert_eq!(message, "error with configuration: unknown value \"bogus\" for sslmode");
        let plain = store_error(sqlx::Error::Configuration("no host".into()), Waits::DEFAULT);
        assert!(matches!(plain, StoreError::Invalid(m) if m == "error with configuration: no host"));
    }

    #[test]
    fn pool_timeout_is_a_timeout_and_io_is_unavailable() {
        let waits = Waits { acquire: Duration::from_secs(3), ..Waits::DEFAULT };
        assert!(matches!(
            store_error(sqlx::Error::PoolTimedOut, waits),
            StoreError::Timeout(t) if t == waits.acquire
        ));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(matches!(store_error(sqlx::Error::Io(io), waits), StoreError::Unavailable(_)));
    }
}
