//! The one conversion from sqlx's errors to [`StoreError`] (STYLE, Errors), and the scrubbing that keeps
//! connection URLs and passwords out of every message PgStore returns or logs.

use crate::store::StoreError;
use sqlx::migrate::MigrateError;
use std::time::Duration;

/// SQLSTATE codes after which the transaction may simply be retried: serialization failure and deadlock.
const CONFLICT_CODES: [&str; 2] = ["40001", "40P01"];

/// SQLSTATE codes (or classes, by prefix) that mean the server went away or refuses connections: class 08
/// (connection exception), admin/crash shutdown, "cannot connect now", too many connections.
const UNAVAILABLE_CODES: [&str; 5] = ["08", "57P01", "57P02", "57P03", "53300"];

/// SQLSTATE class 22 (data exception): a value PostgreSQL cannot store, e.g. a NUL character in `text` (22021)
/// or `\u0000` in `jsonb` (22P05). The call's arguments broke a rule of the store.
const INVALID_DATA_CLASS: &str = "22";

/// SQLSTATE 54000 (program limit exceeded): e.g. an index row larger than a btree page allows. The store refuses
/// such keys before SQL (`KEY_TEXT_BYTES_MAX`); this keeps one that slips past `Invalid` all the same.
const LIMIT_EXCEEDED: &str = "54000";

/// Maps a sqlx error to the store's error. `acquire_timeout` is the pool's, reported when no connection freed
/// up in time. Lost or refused connections are `Unavailable`, serialization failures and deadlocks `Conflict`,
/// a malformed URL or a value PostgreSQL cannot store `Invalid`, anything else `Other`. Every message is
/// [`scrub`]bed.
pub(super) fn store_error(err: sqlx::Error, acquire_timeout: Duration) -> StoreError {
    match err {
        sqlx::Error::PoolTimedOut => StoreError::Timeout(acquire_timeout),
        sqlx::Error::Configuration(_) => StoreError::Invalid(scrub(&err.to_string())),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            StoreError::Unavailable(scrub(&err.to_string()))
        }
        sqlx::Error::Database(ref db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = scrub(&err.to_string());
            if CONFLICT_CODES.contains(&code.as_str()) {
                StoreError::Conflict(message)
            } else if UNAVAILABLE_CODES.iter().any(|c| code.starts_with(c)) {
                StoreError::Unavailable(message)
            } else if code.starts_with(INVALID_DATA_CLASS) || code == LIMIT_EXCEEDED {
                StoreError::Invalid(format!("{message} (SQLSTATE {code})"))
            } else {
                StoreError::Other(format!("{message} (SQLSTATE {code})"))
            }
        }
        sqlx::Error::Migrate(migrate) => match *migrate {
            MigrateError::Execute(inner) => store_error(inner, acquire_timeout),
            other => StoreError::Other(scrub(&format!("migration: {other}"))),
        },
        other => StoreError::Other(scrub(&other.to_string())),
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
    fn pool_timeout_is_a_timeout_and_io_is_unavailable() {
        let timeout = Duration::from_secs(3);
        assert!(matches!(
            store_error(sqlx::Error::PoolTimedOut, timeout),
            StoreError::Timeout(t) if t == timeout
        ));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(matches!(store_error(sqlx::Error::Io(io), timeout), StoreError::Unavailable(_)));
    }
}
