//! Enqueue in the caller's transaction, a transactional outbox (river's `InsertTx`, graphile-worker's `add_job`
//! called in a transaction): rows inserted, and their fetch hints sent, on a connection the caller holds, so that
//! they commit with the caller's own writes or not at all (docs/real-mode.md, "Enqueue in your own transaction").
//!
//! The statements name the store's schema (`sql::CallerInserts`): the caller's `search_path` is its own. The hint is
//! a `NOTIFY` in the same transaction, which PostgreSQL delivers at commit and drops at rollback; its sender is no
//! store (`listen::CALLER_TRANSACTION`), so every store's listener forwards it, this one's too.

use super::{PgStore, error, listen, sql, write};
use crate::store::{
    InsertKeyedParams, KeyedInsert, NewHint, NewRow, RowId, StoreError, check_insert_keyed, check_new_row,
    parent_missing,
};
use sqlx::postgres::types::PgInterval;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};

impl PgStore {
    /// Inserts `rows` on the caller's connection `conn`, in the transaction it is in, and sends there the fetch
    /// hint of each kind of `rows` ([`NewHint::kinds_of`]); returns the new rows' ids in input order. Pass your
    /// open transaction (`&mut tx` for a `sqlx::Transaction<'_, Postgres>`): the rows exist, and the hints reach
    /// the fetchers of every replica, once it commits, and never if it rolls back. The rows are what
    /// [`Store::insert_many`](crate::store::Store::insert_many)`(rows, NewHint::kinds_of(&rows))` stores, with
    /// ids, `created_at` and `updated_at` from the same sequence and clock; they are fetched as soon as the commit's
    /// hint arrives (DESIGN §2, Eligibility: new rows do not wait `min_processing_interval`).
    ///
    /// Two statements on `conn`: one inserts every row (all or none), one sends the hints. Outside a transaction
    /// each commits on its own: the rows, then the hints. The names of the store's schema are written out in the
    /// statements, so `conn` may have any `search_path`; it must reach the store's database as a role that may
    /// insert into its tables. The caller's connection keeps its own time-outs: the store's `call_timeout` does not
    /// bound this call, and nothing is retried (a conflict aborts the caller's transaction, which the caller runs
    /// again). Until the transaction ends, its uncommitted rows are invisible to fetches; a transaction kept open
    /// long holds its rows back, not the store.
    ///
    /// Errors: `Invalid` for a row [`Store::insert`](crate::store::Store::insert) would refuse (naming
    /// `insert_in: rows[i]`), before any statement, with the caller's transaction untouched; otherwise the
    /// statement's error (`Conflict`, `Unavailable`, `Invalid` for a value only PostgreSQL judges, such as a jsonb
    /// string past its 256 MiB limit or a `parent_id` that names no row the transaction sees (a parent that another
    /// transaction deletes waits for it, and is missing if it commits: DESIGN §2, "Parents"), `Other`, which names the caller's own `lock_timeout` or `statement_timeout`
    /// when one of them ended the statement), after which the caller's transaction is aborted and must be rolled
    /// back. An empty `rows` sends nothing and returns no ids.
    ///
    /// `created_at` and `updated_at` are PostgreSQL's `now()` in the caller's transaction: the time it began, not
    /// the time of this call (as for every row a transaction writes).
    pub async fn insert_in(&self, conn: &mut PgConnection, rows: Vec<NewRow>) -> Result<Vec<RowId>, StoreError> {
        for (i, row) in rows.iter().enumerate() {
            check_new_row(&format!("insert_in: rows[{i}]"), row)?;
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let hints = NewHint::kinds_of(&rows);
        let parents: Vec<Option<RowId>> = rows.iter().map(|row| row.parent_id).collect();
        let statement = AssertSqlSafe(self.inner.caller_inserts.insert_many.as_str());
        let ids = write::insert_rows_with(conn, statement, self.offset(), rows).await.map_err(|e| {
            self.caller_inserting(e, |parent| format!("insert_in: rows[{}]", super::naming(&parents, parent)))
        })?;
        self.notify_in(conn, &hints).await?;
        Ok(ids)
    }

    /// [`Store::insert_keyed`](crate::store::Store::insert_keyed) on the caller's connection `conn`, as
    /// [`PgStore::insert_in`] is `insert_many`: inserts `params.row` unless a row was inserted under `params.key`
    /// before, the key with it, and sends the hint of the row's kind (whether or not this call inserted it, as a
    /// keyed submit hints after its insert); returns the row the key names and whether this call inserted it. The
    /// row and its key commit with the caller's transaction, or neither does.
    ///
    /// Runs in a savepoint of the caller's transaction (a transaction of its own on a connection outside one), so
    /// that a key another transaction committed first undoes this call's row alone and returns that
    /// transaction's row. A transaction inserting the same key and not yet ended makes this call wait for it, as
    /// two keyed inserts at once do. Under `REPEATABLE READ` or `SERIALIZABLE`, a key committed after the
    /// caller's transaction began is a `Conflict` (the caller runs its transaction again and finds the key).
    ///
    /// Errors: `Invalid` for a key or row `insert_keyed` would refuse, before any statement; otherwise as
    /// [`PgStore::insert_in`]'s.
    pub async fn insert_keyed_in(
        &self,
        conn: &mut PgConnection,
        params: InsertKeyedParams,
    ) -> Result<KeyedInsert, StoreError> {
        check_insert_keyed(&params)?;
        let hint = NewHint::from(params.row.kind.as_str());
        let done = insert_keyed_on(conn, &self.inner.caller_inserts, self.offset(), params)
            .await
            .map_err(|e| self.caller_inserting(e, |_| "insert_keyed_in".to_string()))?;
        self.notify_in(conn, &[hint]).await?;
        Ok(done)
    }

    /// The error of an insert on the caller's connection: a row that named a parent that does not exist is refused
    /// as MemStore refuses it (`label(parent)` names the call and the row), anything else as
    /// [`error::caller_error`] maps it.
    fn caller_inserting(&self, err: sqlx::Error, label: impl FnOnce(RowId) -> String) -> StoreError {
        match error::missing_parent(&err) {
            Some(parent) => parent_missing(&label(parent), parent),
            None => error::caller_error(err, self.inner.waits),
        }
    }

    /// Sends `hints` (their kinds; rows are not marked) by `NOTIFY` on `conn`, in its transaction.
    async fn notify_in(&self, conn: &mut PgConnection, hints: &[NewHint]) -> Result<(), StoreError> {
        let payloads: Vec<String> =
            hints.iter().map(|hint| listen::payload(listen::CALLER_TRANSACTION, &hint.kind)).collect();
        sqlx::query(sql::NOTIFY)
            .bind(&self.inner.channel)
            .bind(&payloads)
            .execute(conn)
            .await
            .map_err(|e| error::caller_error(e, self.inner.waits))?;
        Ok(())
    }
}

/// The keyed insert of [`PgStore::insert_keyed_in`], in a savepoint of `conn`'s transaction: as
/// `write::insert_keyed_in_transaction`, with the savepoint in place of the transaction.
async fn insert_keyed_on(
    conn: &mut PgConnection,
    statements: &sql::CallerInserts,
    offset: PgInterval,
    p: InsertKeyedParams,
) -> Result<KeyedInsert, sqlx::Error> {
    let keyed_row = || sqlx::query_scalar::<_, i64>(AssertSqlSafe(statements.keyed_row.as_str())).bind(p.key.clone());
    let mut savepoint = conn.begin().await?;
    if let Some(id) = keyed_row().fetch_optional(&mut *savepoint).await? {
        savepoint.commit().await?;
        return Ok(KeyedInsert { id: RowId(id), inserted: false });
    }
    let insert_many = AssertSqlSafe(statements.insert_many.as_str());
    let ids = write::insert_rows_with(&mut savepoint, insert_many, offset, vec![p.row.clone()]).await?;
    let id = *ids.first().expect("one row inserted, one id");
    let keyed: Option<i64> = sqlx::query_scalar(AssertSqlSafe(statements.insert_key.as_str()))
        .bind(offset)
        .bind(&p.key)
        .bind(id.0)
        .fetch_optional(&mut *savepoint)
        .await?;
    if keyed.is_none() {
        // Another transaction committed the key first (`ON CONFLICT` waited for it): undo this row, return theirs.
        savepoint.rollback().await?;
        let first = keyed_row().fetch_one(&mut *conn).await?;
        return Ok(KeyedInsert { id: RowId(first), inserted: false });
    }
    savepoint.commit().await?;
    Ok(KeyedInsert { id, inserted: true })
}
