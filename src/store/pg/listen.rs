//! Fetch hints between replicas: `NOTIFY` on a channel named after the schema, and a listener task that forwards
//! other stores' notifications into the local broadcast channel (DESIGN §2: hints cross replicas through
//! `LISTEN/NOTIFY`).
//!
//! A store delivers its own hints to its local subscribers directly, right after the hint commits, so they never
//! wait on (or depend on) the listener's connection; the listener skips notifications carrying its own store's
//! instance id. If the listener's connection drops, hints sent meanwhile are lost; it reconnects with backoff and
//! the engine's empty-fetch backoff keeps fetching in the meantime (DESIGN §3).

use super::error::scrub;
use crate::store::Hint;
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPoolOptions};
use std::time::Duration;
use tokio::sync::{broadcast, oneshot};

/// First wait after a failed reconnect; doubles up to [`RECONNECT_BACKOFF_MAX`].
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnect attempts: hints are an optimisation, fetches go on without them.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long one attempt to (re)open the listener's connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// PostgreSQL truncates identifiers (channel names) to 63 bytes; `pg_notify` rejects longer ones.
const CHANNEL_LEN_MAX: usize = 63;
const CHANNEL_PREFIX: &str = "lockstep_hints_";

/// The `NOTIFY` channel of the stores sharing `schema`: stores of different schemas (test runs) never hear
/// each other. Long schema names are replaced by a stable hash to stay within 63 bytes.
pub(super) fn channel(schema: &str) -> String {
    let plain = format!("{CHANNEL_PREFIX}{schema}");
    if plain.len() <= CHANNEL_LEN_MAX {
        return plain;
    }
    let hash = super::options::stable_hash(schema);
    format!("{CHANNEL_PREFIX}{hash:016x}")
}

/// The `NOTIFY` payload of a hint for `kind` from the store `instance`.
pub(super) fn payload(instance: u64, kind: &str) -> String {
    format!("{instance:016x}:{kind}")
}

/// The hinted kind of a payload, unless it came from the store `instance` itself (already delivered locally)
/// or is not one of ours.
fn foreign_kind(instance: u64, payload: &str) -> Option<&str> {
    let (sender, kind) = payload.split_once(':')?;
    let sender = u64::from_str_radix(sender, 16).ok()?;
    (sender != instance).then_some(kind)
}

/// Opens the listener's own connection (outside the store's pool, so it never takes a worker's connection),
/// starts listening on `channel`, and spawns the task that forwards notifications to `hints` until `shutdown`
/// fires or is dropped. Returns once `LISTEN` has succeeded, so hints sent after it are heard.
///
/// Errors: the first connection or `LISTEN` failed (later failures are logged and retried).
pub(super) async fn start(
    connect: PgConnectOptions,
    channel: String,
    instance: u64,
    hints: broadcast::Sender<Hint>,
    shutdown: oneshot::Receiver<()>,
) -> Result<(), sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(connect);
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(&channel).await?;
    tokio::spawn(forward(listener, instance, hints, shutdown));
    Ok(())
}

/// The listener task. It never ends on its own: only `shutdown` (the store's last clone dropped) stops it.
/// After a lost connection or a failed reconnect it waits, doubling the wait up to [`RECONNECT_BACKOFF_MAX`]
/// until a notification arrives again, so a server that keeps dropping the session is not hammered
/// (notifications sent meanwhile to a live session wait in it and are read after the wait).
async fn forward(
    mut listener: PgListener,
    instance: u64,
    hints: broadcast::Sender<Hint>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    loop {
        let received = tokio::select! {
            _ = &mut shutdown => return,
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(notification)) => {
                backoff = RECONNECT_BACKOFF_MIN;
                deliver(&notification, instance, &hints);
                continue;
            }
            Ok(None) => tracing::warn!(
                retry_in_ms = backoff.as_millis() as u64,
                "fetch hint listener lost its connection and reconnected; hints sent meanwhile are lost"
            ),
            Err(err) => tracing::warn!(
                error = %scrub(&err.to_string()),
                retry_in_ms = backoff.as_millis() as u64,
                "fetch hint listener cannot reach PostgreSQL"
            ),
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
    }
}

fn deliver(notification: &PgNotification, instance: u64, hints: &broadcast::Sender<Hint>) {
    match foreign_kind(instance, notification.payload()) {
        // No subscriber is not an error.
        Some(kind) => drop(hints.send(kind.to_string())),
        None => tracing::trace!(payload = notification.payload(), "hint from this store or not ours"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_fits_postgres_identifiers() {
        assert_eq!(channel("t_1"), "lockstep_hints_t_1");
        let long = "s".repeat(63);
        let hashed = channel(&long);
        assert!(hashed.len() <= CHANNEL_LEN_MAX, "{hashed}");
        assert_eq!(hashed, channel(&long), "the hash is stable");
        assert_ne!(hashed, channel(&"t".repeat(63)));
    }

    #[test]
    fn payload_round_trips_and_own_hints_are_skipped() {
        let p = payload(7, "job:gang");
        assert_eq!(foreign_kind(8, &p), Some("job:gang"));
        assert_eq!(foreign_kind(7, &p), None);
        assert_eq!(foreign_kind(7, "not ours"), None);
    }
}
