//! Fetch hints between replicas: `NOTIFY` on a channel named after the schema, and a listener task that forwards
//! other stores' notifications into the local broadcast channel (DESIGN §2: hints cross replicas through
//! `LISTEN/NOTIFY`).
//!
//! A store delivers its own hints to its local subscribers directly, right after the hint commits, so they never
//! wait on (or depend on) the listener's connection; the listener skips notifications carrying its own store's
//! instance id.
//!
//! A listener's session can die without a word: behind a NAT, firewall or proxy that forgot the connection, no
//! FIN or RST ever arrives and `LISTEN` just hears nothing (half-open; pg-boss #850). TCP keepalive does not help
//! there (the middlebox's own socket answers the probes), so the listener checks its session itself: every
//! [`PgOptions::listen_check_interval`](super::PgOptions::listen_check_interval) it sends `LISTEN` on its
//! channel again (a no-op for PostgreSQL, and it keeps the session's `pg_stat_activity.query` naming the
//! channel) and waits [`PgOptions::listen_check_timeout`](super::PgOptions::listen_check_timeout) for the reply.
//! No reply, an error, or a dropped session: it opens a new session and, once that listens, sends the catch-up
//! hint [`HINT_EVERY_KIND`] locally, which wakes every fetcher, because hints sent while it was deaf are lost.

use super::error::scrub;
use crate::store::{HINT_EVERY_KIND, Hint};
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPoolOptions};
use sqlx::{AssertSqlSafe, Executor};
use std::time::Duration;
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;

/// First wait after a failed reconnect; doubles up to [`RECONNECT_BACKOFF_MAX`].
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnect attempts: hints are an optimisation, fetches go on without them.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long one attempt to (re)open the listener's connection and `LISTEN` may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// PostgreSQL truncates identifiers (channel names) to 63 bytes; `pg_notify` rejects longer ones.
const CHANNEL_LEN_MAX: usize = 63;
const CHANNEL_PREFIX: &str = "lockstep_hints_";

/// What the listener task needs: how to connect, what to listen on, and how to check its session.
pub(super) struct ListenerConfig {
    pub(super) connect: PgConnectOptions,
    pub(super) channel: String,
    /// This store's instance id: its own notifications are skipped.
    pub(super) instance: u64,
    /// Between session checks, local wall clock; zero turns the checks off.
    pub(super) check_interval: Duration,
    /// Longest wait for a check's reply before the session is given up.
    pub(super) check_timeout: Duration,
}

/// The `NOTIFY` channel of the stores sharing `schema`: stores of different schemas (test runs) never hear
/// each other. Long schema names are replaced by a stable hash to stay within 63 bytes.
pub(super) fn channel(schema: &str) -> String {
    let plain = format!("{CHANNEL_PREFIX}{schema}");
    if plain.len() <= CHANNEL_LEN_MAX {
        return plain;
    }
    let hash = crate::hash::fnv1a64(schema.as_bytes());
    format!("{CHANNEL_PREFIX}{hash:016x}")
}

/// The sender of the hints a caller's own transaction sends (`PgStore::insert_in`): no store's instance (see
/// [`instance`]), so every store's listener forwards them, the sending store's own included; its subscribers hear
/// them once the caller commits, not when the insert returns.
pub(super) const CALLER_TRANSACTION: u64 = 0;

/// A new store's instance id: random, and never [`CALLER_TRANSACTION`].
pub(super) fn instance() -> u64 {
    rand::random::<u64>().max(CALLER_TRANSACTION + 1)
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

/// The statement that starts listening, and checks the session: PostgreSQL treats a second `LISTEN` on the same
/// channel as a no-op.
fn listen_statement(channel: &str) -> String {
    format!("LISTEN \"{channel}\"")
}

/// Opens the listener's own connection (outside the store's pool, so it never takes a worker's connection),
/// starts listening on the channel, and spawns the task that forwards notifications to `hints` until `shutdown`
/// fires or is dropped. Returns once `LISTEN` has succeeded, so hints sent after it are heard.
///
/// Errors: the first connection or `LISTEN` failed (later failures are logged and retried).
pub(super) async fn start(
    config: ListenerConfig,
    hints: broadcast::Sender<Hint>,
    shutdown: oneshot::Receiver<()>,
) -> Result<(), sqlx::Error> {
    let listener = open(&config).await?;
    tokio::spawn(forward(config, listener, hints, shutdown));
    Ok(())
}

/// A new session listening on the channel, within [`CONNECT_TIMEOUT`]. Each session gets a pool of its own: a
/// given-up session may hang in the old pool's hands (sqlx pings a connection it takes back, with no time-out),
/// and must not keep the new one from opening.
async fn open(config: &ListenerConfig) -> Result<PgListener, sqlx::Error> {
    let opening = async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(config.connect.clone());
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.listen(&config.channel).await?;
        Ok(listener)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, opening).await.unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

/// What woke the listener task.
enum Wake {
    Received(Result<Option<PgNotification>, sqlx::Error>),
    Check,
}

/// The listener task. It never ends on its own: only `shutdown` (the store's last clone dropped) stops it.
/// After a lost session it sends the catch-up hint once a new one listens. A server that keeps dropping the
/// session is not hammered: after each loss, and between failed reconnects, it waits, doubling the wait up to
/// [`RECONNECT_BACKOFF_MAX`] until a notification or a passed check shows a working session again
/// (notifications sent meanwhile to a live session wait in it and are read after the wait).
async fn forward(
    config: ListenerConfig,
    listener: PgListener,
    hints: broadcast::Sender<Hint>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let checking = !config.check_interval.is_zero();
    let mut listener = Some(listener);
    let mut backoff = RECONNECT_BACKOFF_MIN;
    let mut next_check = Instant::now() + config.check_interval;
    loop {
        let Some(session) = listener.as_mut() else {
            match reopen(&config, &mut backoff, &mut shutdown).await {
                Some(session) => {
                    listener = Some(session);
                    catch_up(&hints);
                    next_check = Instant::now() + config.check_interval;
                    continue;
                }
                None => return,
            }
        };
        let wake = tokio::select! {
            _ = &mut shutdown => return,
            received = session.try_recv() => Wake::Received(received),
            _ = tokio::time::sleep_until(next_check), if checking => Wake::Check,
        };
        match wake {
            Wake::Received(Ok(Some(notification))) => {
                backoff = RECONNECT_BACKOFF_MIN;
                deliver(&notification, config.instance, &hints);
            }
            Wake::Received(Ok(None)) => {
                // sqlx opened a new session and listens again: hints sent in between are lost.
                tracing::warn!(
                    retry_in_ms = backoff.as_millis() as u64,
                    "fetch hint listener lost its connection and reconnected; waking every fetcher to catch up"
                );
                catch_up(&hints);
                if wait(backoff, &mut shutdown).await.is_none() {
                    return;
                }
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
            Wake::Received(Err(err)) => {
                tracing::warn!(error = %scrub(&err.to_string()), "fetch hint listener cannot reach PostgreSQL");
                listener = None;
            }
            Wake::Check => {
                let check = session.execute(AssertSqlSafe(listen_statement(&config.channel)));
                match tokio::time::timeout(config.check_timeout, check).await {
                    Ok(Ok(_)) => {
                        backoff = RECONNECT_BACKOFF_MIN;
                        next_check = Instant::now() + config.check_interval;
                    }
                    Ok(Err(err)) => {
                        tracing::warn!(error = %scrub(&err.to_string()), "fetch hint listener's session check failed");
                        listener = None;
                    }
                    Err(_) => {
                        tracing::warn!(
                            timeout_ms = config.check_timeout.as_millis() as u64,
                            "fetch hint listener's session did not answer its check (half-open?); reconnecting"
                        );
                        listener = None;
                    }
                }
            }
        }
    }
}

/// Opens a new session, at once and then after each failure with a doubling wait. `None`: shutdown.
async fn reopen(
    config: &ListenerConfig,
    backoff: &mut Duration,
    shutdown: &mut oneshot::Receiver<()>,
) -> Option<PgListener> {
    loop {
        let opened = tokio::select! {
            _ = &mut *shutdown => return None,
            opened = open(config) => opened,
        };
        match opened {
            Ok(listener) => return Some(listener),
            Err(err) => tracing::warn!(
                error = %scrub(&err.to_string()),
                retry_in_ms = backoff.as_millis() as u64,
                "fetch hint listener cannot reconnect"
            ),
        }
        wait(*backoff, shutdown).await?;
        *backoff = (*backoff * 2).min(RECONNECT_BACKOFF_MAX);
    }
}

/// Waits `span` unless `shutdown` fires first (`None`).
async fn wait(span: Duration, shutdown: &mut oneshot::Receiver<()>) -> Option<()> {
    tokio::select! {
        _ = shutdown => None,
        _ = tokio::time::sleep(span) => Some(()),
    }
}

/// Wakes every fetcher of this store's subscribers: the listener missed hints while it had no working session.
fn catch_up(hints: &broadcast::Sender<Hint>) {
    // No subscriber is not an error.
    drop(hints.send(HINT_EVERY_KIND.to_string()));
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

    #[test]
    fn every_store_forwards_a_callers_transaction_hints() {
        let p = payload(CALLER_TRANSACTION, "email");
        for _ in 0..1000 {
            assert_eq!(foreign_kind(instance(), &p), Some("email"));
        }
        assert_eq!(foreign_kind(u64::MAX, &p), Some("email"));
    }
}
