//! Transactions whose `BEGIN` can be given up safely. sqlx counts a transaction on a connection only once its
//! `BEGIN` is answered: a call dropped while its `BEGIN` is on its way (an agent's fence at its lease deadline,
//! [`PgOptions::call_timeout`](super::PgOptions::call_timeout), a `select!` another branch won) gives the
//! connection back to the pool with the server inside a transaction nobody will end. The next call on that
//! session then runs in it: its `now()` is the stale transaction's start (a heartbeat there writes an expiry
//! earlier than one already written) and its writes wait for a `COMMIT` that belongs to someone else. Found by
//! `lockstep chaos run` (tests/pg_faults.rs has the case). [`Session::begin`] closes such a session instead.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres, Transaction};

/// A pooled session for one transaction: closed, not given back, if dropped while its `BEGIN` was in flight.
pub(super) struct Session {
    connection: PoolConnection<Postgres>,
    /// A `BEGIN` was sent and not yet answered.
    beginning: bool,
}

impl Session {
    /// A session from `pool` (waits up to the pool's acquire time-out).
    pub(super) async fn acquire(pool: &PgPool) -> Result<Session, sqlx::Error> {
        Ok(Session { connection: pool.acquire().await?, beginning: false })
    }

    /// The session's connection, for a statement outside a transaction (after one ended).
    pub(super) fn connection(&mut self) -> &mut sqlx::PgConnection {
        &mut self.connection
    }

    /// Starts a transaction on this session; dropping it without a commit rolls it back, as sqlx's own do.
    pub(super) async fn begin(&mut self) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        let Session { connection, beginning } = self;
        *beginning = true;
        let transaction = connection.begin().await?;
        *beginning = false;
        Ok(transaction)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.beginning {
            // The server may be inside a transaction sqlx does not know of: end the session (the server rolls
            // back) rather than give it to the next call.
            self.connection.close_on_drop();
        }
    }
}
