//! Chaos mode's commit history ([`PgOptions::history`](super::PgOptions::history)): every lease write of a store
//! call appends one row to the schema's `history` table *in the call's own transaction*, so a write that
//! committed has its record and a write that rolled back has none, whatever kills the process afterwards. The
//! rows are [`CommitOp`]s as JSON, the same record MemStore keeps for the simulator ([`MemStore::history`]),
//! and [`PgStore::history`] reads them back in `seq` order for the simulator's checkers.
//!
//! Order: a call appends its record after its statements locked every row it writes, so two calls writing one
//! row get `seq`s in the order they held that row's lock (the order the lease-exclusivity checker needs). A stale
//! apply (alone or in a batch) or a stale related lock writes nothing and rolls back; its record (`applied:
//! false`, outcome `Stale`) is appended afterwards on its own, as MemStore records it: for the summary's counts
//! and the trace's `commit` lines only.
//!
//! With the option off none of this runs: the calls in `mod.rs` take their usual single-statement paths.
//!
//! [`MemStore::history`]: crate::store::MemStore::history

use super::codec::{PgTime, interval};
use super::session::Session;
use super::write::lease_write;
use super::{PgStore, fetch_query, split_leases, sql, still_held};
use crate::store::{
    Commit, CommitOp, Event, FAILURE_ERRORS_KEPT, FailureOutcome, FailureParams, FetchParams, HeartbeatParams, Lease,
    Retry, Row, RowId, RowUpdate, StoreError, WriteOutcome, bounded_error,
};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, PgConnection, Row as _};
use std::sync::Arc;
use std::time::Duration;

/// The table, created by the store that turns history on (idempotent). `at` is the store's clock (with the
/// test clock offset), as every lease timestamp.
pub(super) const CREATE: &str = "CREATE TABLE IF NOT EXISTS history (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL,
    caller text NOT NULL,
    op jsonb NOT NULL
)";

const APPEND: &str = "INSERT INTO history (at, caller, op) VALUES (lockstep_now($1), $2, $3)";

const READ: &str = "SELECT at, caller, op FROM history ORDER BY seq";

/// A live lease that a fetch of the store named `$2` handed out at least `$3` ago (its history's `fetch` record
/// lists the row's id and current token) and under which related rows are locked (a row other than the leased
/// one carries its token), while no session named `$2` is inside a transaction (one that wrote or locked a row,
/// or any transaction between two statements): [`PgStore::lease_in_pass`].
const LEASE_IN_PASS: &str = "SELECT r.id, r.lock_token FROM resources r
WHERE r.lock_token IS NOT NULL AND r.lock_expires_at > lockstep_now($1)
  AND EXISTS (
      SELECT 1 FROM history h
      WHERE h.caller = $2 AND h.at <= lockstep_now($1) - $3
        AND h.op -> 'Fetch' -> 'leases' @> jsonb_build_array(jsonb_build_object('id', r.id, 'token', r.lock_token)))
  AND EXISTS (SELECT 1 FROM resources x WHERE x.related_token = r.lock_token AND x.id <> r.id)
  AND NOT EXISTS (
      SELECT 1 FROM pg_stat_activity a
      WHERE a.datname = current_database() AND a.application_name = $2 AND a.pid <> pg_backend_pid()
        AND (a.backend_xid IS NOT NULL OR a.state LIKE 'idle in transaction%'
             OR (a.state = 'active' AND a.xact_start < a.query_start)))
ORDER BY r.id
LIMIT 1";

const ALL_EVENTS: &str = "SELECT seq, row_id, kind, data, at FROM events ORDER BY seq";

/// Appends `op` to the history on `conn` (inside the caller's transaction).
pub(super) async fn append(store: &PgStore, conn: &mut PgConnection, op: &CommitOp) -> Result<(), sqlx::Error> {
    let caller = store.inner.history.as_deref().unwrap_or_default();
    let op = serde_json::to_value(op).expect("a commit op serializes");
    sqlx::query(APPEND).bind(store.offset()).bind(caller).bind(Json(op)).execute(conn).await?;
    Ok(())
}

impl PgStore {
    /// Chaos mode: the commit history, oldest first (empty when no store on the schema turned
    /// [`PgOptions::history`](super::PgOptions::history) on). Each commit's `caller` is the recording store's
    /// `application_name`.
    ///
    /// Errors: the store's usual ones; `Other` when the table is missing or a record does not decode.
    pub async fn history(&self) -> Result<Vec<Commit>, StoreError> {
        let rows = sqlx::query(READ).fetch_all(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        rows.iter()
            .map(|row| {
                let at: PgTime = row.try_get("at").map_err(|e| self.fail(e))?;
                let caller: String = row.try_get("caller").map_err(|e| self.fail(e))?;
                let Json(op): Json<CommitOp> = row.try_get("op").map_err(|e| self.fail(e))?;
                Ok(Commit { at: at.0, caller: Some(Arc::from(caller)), op })
            })
            .collect()
    }

    /// Chaos mode: a lease the store whose `application_name` (its history's `caller`) is `caller` holds now
    /// and is working under, past its related locks, if any: a live lease on a row that one of its own fetches
    /// handed out at least `settled` ago (store clock, from the start of the fetch's transaction), under which
    /// related rows are locked (the pass took its `lock_related`: its worker has the row, its reads are done, and
    /// its next guarded write is a related lock or the apply), while none of its sessions is inside a transaction
    /// (one that wrote or locked a row, or an explicit one between or during its statements). `lockstep chaos
    /// run` waits for one before it SIGSTOPs a replica (`[faults] pause_inside_pass`), so that the pause lands
    /// inside a pass whose next writes carry a token the others supersede meanwhile: not before its worker took
    /// the row (it would drop the lease unused on waking), not inside a transaction whose row locks would keep
    /// the others off the row, nor one the server would end for idling while the replica sleeps. Seeing other
    /// sessions' `backend_xid` and `state` needs the same role or `pg_read_all_stats`.
    ///
    /// Errors: the store's usual ones; `Other` when the history table is missing (no store of the schema turned
    /// [`PgOptions::history`](super::PgOptions::history) on).
    pub async fn lease_in_pass(&self, caller: &str, settled: Duration) -> Result<Option<Lease>, StoreError> {
        let found: Option<(i64, i64)> = sqlx::query_as(LEASE_IN_PASS)
            .bind(self.offset())
            .bind(caller)
            .bind(interval(settled))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(found.map(|(id, token)| Lease { id: RowId(id), token: crate::store::LockToken(token) }))
    }

    /// Every event of the schema, in sequence order (a snapshot for checkers).
    pub async fn all_events(&self) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(ALL_EVENTS).fetch_all(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        rows.iter().map(super::codec::event).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    /// Every row of the schema, by id (a snapshot for checkers).
    pub async fn all_rows(&self) -> Result<Vec<Row>, StoreError> {
        let rows = sqlx::query(sql::ALL_ROWS).fetch_all(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        rows.iter().map(super::codec::row).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    pub(super) async fn fetch_recorded(&self, p: FetchParams) -> Result<Vec<Row>, StoreError> {
        let sql = PgStore::fetch_sql(&p);
        let rows = self
            .run_again_on_conflict("fetch", || async {
                let mut session = Session::acquire(&self.inner.pool).await?;
                let mut tx = session.begin().await?;
                let rows =
                    fetch_query(sqlx::query(AssertSqlSafe(sql.clone())), self.offset(), &p).fetch_all(&mut *tx).await?;
                let rows: Vec<Row> = rows.iter().map(super::codec::row).collect::<Result<_, _>>()?;
                let leases: Vec<Lease> =
                    rows.iter().filter_map(|row| row.lock_token.map(|token| Lease { id: row.id, token })).collect();
                if !leases.is_empty() {
                    append(self, &mut tx, &CommitOp::Fetch { pipeline: p.pipeline.clone(), leases }).await?;
                }
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        let mut rows = rows;
        rows.sort_unstable_by_key(|row| (row.last_processed_at, row.id));
        Ok(rows)
    }

    pub(super) async fn heartbeat_recorded(&self, p: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        let (ids, tokens) = split_leases(&p.leases);
        self.run_again_on_conflict("heartbeat", || async {
            let mut session = Session::acquire(&self.inner.pool).await?;
            let mut tx = session.begin().await?;
            let extended: Vec<(i64, i64)> = sqlx::query_as(sql::HEARTBEAT)
                .bind(self.offset())
                .bind(ids.clone())
                .bind(tokens.clone())
                .bind(interval(p.lease_ttl))
                .fetch_all(&mut *tx)
                .await?;
            let held = still_held(p.leases.clone(), &extended);
            if !held.is_empty() {
                append(self, &mut tx, &CommitOp::Heartbeat { held: held.clone() }).await?;
            }
            tx.commit().await?;
            Ok(held)
        })
        .await
    }

    pub(super) async fn record_failure_recorded(&self, p: FailureParams) -> Result<FailureOutcome, StoreError> {
        let (delay, status) = match &p.retry {
            Retry::After(delay) => (*delay, None),
            Retry::GiveUp { status } => (Duration::ZERO, Some(status.clone())),
        };
        let gave_up = status.is_some();
        let error = bounded_error(&p.error);
        let attempts: Option<i32> = self
            .run_again_on_conflict("record_failure", || async {
                let mut session = Session::acquire(&self.inner.pool).await?;
                let mut tx = session.begin().await?;
                let query = |statement| {
                    sqlx::query_scalar(statement)
                        .bind(self.offset())
                        .bind(p.lease.id.0)
                        .bind(p.lease.token.0)
                        .bind(error.as_str())
                        .bind(interval(delay))
                        .bind(status.as_deref())
                        .bind(FAILURE_ERRORS_KEPT as i32)
                };
                let attempts: Option<i32> = lease_write(&mut tx, &sql::RECORD_FAILURE, query).await?;
                if let Some(count) = attempts {
                    let op = CommitOp::Failure {
                        lease: p.lease,
                        attempts: Some(u32::try_from(count).unwrap_or(0)),
                        gave_up,
                    };
                    append(self, &mut tx, &op).await?;
                }
                tx.commit().await?;
                Ok(attempts)
            })
            .await?;
        Ok(match attempts {
            Some(attempts) => {
                FailureOutcome::Recorded { attempts: super::codec::attempts(attempts).map_err(|e| self.fail(e))? }
            }
            None => FailureOutcome::Stale,
        })
    }

    pub(super) async fn reset_recorded(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        self.run_again_on_conflict("reset_for_retry", || async {
            let mut session = Session::acquire(&self.inner.pool).await?;
            let mut tx = session.begin().await?;
            let query = |statement| {
                sqlx::query_scalar(statement)
                    .bind(self.offset())
                    .bind(lease.id.0)
                    .bind(lease.token.0)
                    .bind(interval(delay))
            };
            let reset: Option<i64> = lease_write(&mut tx, &sql::RESET_FOR_RETRY, query).await?;
            // A refused reset (its token superseded) is recorded too, as MemStore records it: a paused pass's
            // superseded write is often its reset-and-retry.
            append(self, &mut tx, &CommitOp::Reset { lease, held: reset.is_some() }).await?;
            tx.commit().await?;
            Ok(reset.is_some())
        })
        .await
    }

    pub(super) async fn release_recorded(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        let (ids, tokens) = split_leases(&leases);
        self.run_again_on_conflict("release", || async {
            let mut session = Session::acquire(&self.inner.pool).await?;
            let mut tx = session.begin().await?;
            let held: Vec<(i64, i64)> =
                sqlx::query_as(sql::RELEASE).bind(ids.clone()).bind(tokens.clone()).fetch_all(&mut *tx).await?;
            let released = still_held(leases.clone(), &held);
            if !released.is_empty() {
                append(self, &mut tx, &CommitOp::Release { released: released.clone() }).await?;
            }
            tx.commit().await?;
            Ok(released.len())
        })
        .await
    }

    pub(super) async fn update_unleased_recorded(
        &self,
        id: RowId,
        update: RowUpdate,
    ) -> Result<WriteOutcome, StoreError> {
        self.run_again_on_conflict("update_unleased", || async {
            let mut session = Session::acquire(&self.inner.pool).await?;
            let mut tx = session.begin().await?;
            let busy: Option<bool> = sqlx::query_scalar(sql::UPDATE_UNLEASED)
                .bind(self.offset())
                .bind(id.0)
                .bind(update.status.clone())
                .bind(update.data.clone().map(Json))
                .fetch_optional(&mut *tx)
                .await?;
            let outcome = match busy {
                None => WriteOutcome::Missing,
                Some(true) => WriteOutcome::Busy,
                Some(false) => WriteOutcome::Written,
            };
            if outcome == WriteOutcome::Written {
                append(self, &mut tx, &CommitOp::UpdateUnleased { id, outcome }).await?;
            }
            tx.commit().await?;
            Ok(outcome)
        })
        .await
    }

    /// Appends the record of a guarded write refused for its superseded token (a stale apply, a stale related
    /// lock: nothing was written and the call's transaction rolled back) on its own, as MemStore records it.
    /// Best effort: a record lost here only drops a refusal from the summary's counts and the trace's `commit`
    /// lines (a scenario's `[[expect.trace]]` on them), never a write.
    pub(super) async fn record_stale(&self, op: CommitOp) {
        if let Ok(mut conn) = self.inner.pool.acquire().await
            && let Err(error) = append(self, &mut conn, &op).await
        {
            tracing::debug!(%error, %op, "the record of a stale write was not written");
        }
    }

    /// [`PgStore::record_stale`] of a stale apply of `lease`.
    pub(super) async fn record_stale_apply(&self, lease: Lease) {
        let op = CommitOp::Apply { lease, applied: false, related: Vec::new(), inserted: Vec::new() };
        self.record_stale(op).await;
    }
}
