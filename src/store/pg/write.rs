//! The calls that need a transaction of several statements: the guarded apply (related writes, main write,
//! inserts, events) and the all-or-nothing related lock. Each rolls back explicitly when a guard fails, so no row
//! lock outlives the call.

use super::codec::{PgTime, interval};
use super::session::Session;
use super::sql;
use crate::store::{
    ApplyOutcome, ApplyParams, CommitOp, InsertKeyedParams, KeyedInsert, Lease, LockOutcome, LockRelatedParams,
    LockToken, NewEvent, NewRow, RelatedUpdate, Row, RowId, RowUpdate, StoreError, Timestamp, held_by_own_pipeline,
    related_available,
};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::query::QueryScalar;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, Postgres, Row as _, SqlSafeStr};
use std::collections::BTreeMap;
use std::time::Duration;

/// The general apply: one transaction of related writes, the guarded main write, inserts and events.
/// Rolls back and returns `Stale` as soon as a guard fails. The rollback is awaited, not left to the
/// transaction's drop, so no row lock outlives the call. The first statement locks every row carrying the token
/// in id order (DESIGN §2, one lock order), so the related rows are not locked before the main row when the main
/// row's id is lower.
///
/// `record`: the store whose history (chaos mode) gets the applied write, in this transaction. `guarded`: false
/// only for the planted bug of `apply_guard_disabled_for_mutation_test`.
pub(super) async fn apply_in_transaction(
    pool: &PgPool,
    offset: PgInterval,
    p: ApplyParams,
    record: Option<&super::PgStore>,
    guarded: bool,
) -> Result<ApplyOutcome, sqlx::Error> {
    let token = p.lease.token.0;
    let mut session = Session::acquire(pool).await?;
    let mut tx = session.begin().await?;
    let related_ids: Vec<RowId> = merge_related(p.related.clone()).into_keys().collect();
    // Every related row the item locked must still carry the token (`ApplyParams::locked`): the rows it updates are
    // counted by `APPLY_RELATED` below, the others here, in one more statement only when there are any.
    let mut unwritten: Vec<i64> =
        p.locked.iter().filter(|id| related_ids.binary_search(id).is_err()).map(|id| id.0).collect();
    unwritten.sort_unstable();
    unwritten.dedup();
    if guarded && !unwritten.is_empty() {
        let held: i64 = sqlx::query_scalar(sql::APPLY_LOCKED_HELD)
            .bind(&unwritten)
            .bind(token)
            .bind(p.lease.id.0)
            .fetch_one(&mut *tx)
            .await?;
        if held != unwritten.len() as i64 {
            tx.rollback().await?;
            return Ok(ApplyOutcome::Stale);
        }
    }
    if !p.related.is_empty() {
        let related = merge_related(p.related);
        let (ids, statuses, data) = related_columns(&related);
        let written = sqlx::query(sql::APPLY_RELATED)
            .bind(offset)
            .bind(ids)
            .bind(statuses)
            .bind(data)
            .bind(token)
            .bind(p.lease.id.0)
            .execute(&mut *tx)
            .await?;
        if written.rows_affected() != related.len() as u64 {
            tx.rollback().await?;
            return Ok(ApplyOutcome::Stale);
        }
    }
    let Some(now) = apply_main(&mut tx, offset, p.lease, p.update, guarded).await? else {
        tx.rollback().await?;
        return Ok(ApplyOutcome::Stale);
    };
    let inserted = insert_rows(&mut tx, offset, p.inserts).await?;
    insert_events(&mut tx, offset, p.events).await?;
    if let Some(store) = record {
        let op = CommitOp::Apply { lease: p.lease, applied: true, related: related_ids, inserted: inserted.clone() };
        super::history::append(store, &mut tx, &op).await?;
    }
    tx.commit().await?;
    Ok(ApplyOutcome::Applied { inserted, now })
}

/// The keyed insert ([`Store::insert_keyed`](crate::store::Store::insert_keyed)): one transaction that reads the row
/// the key names ([`sql::KEYED_ROW`]), or inserts the row ([`sql::INSERT`]) and the key ([`sql::INSERT_KEY`]). An
/// insert whose key a concurrent insert committed first is rolled back, and that insert's row returned (nothing
/// inserted).
pub(super) async fn insert_keyed_in_transaction(
    pool: &PgPool,
    offset: PgInterval,
    p: InsertKeyedParams,
) -> Result<KeyedInsert, sqlx::Error> {
    let mut session = Session::acquire(pool).await?;
    let mut tx = session.begin().await?;
    let existing: Option<i64> = sqlx::query_scalar(sql::KEYED_ROW).bind(&p.key).fetch_optional(&mut *tx).await?;
    let done = match existing {
        Some(id) => KeyedInsert { id: RowId(id), inserted: false },
        None => {
            let new = p.row;
            let row = sqlx::query(sql::INSERT)
                .bind(offset)
                .bind(new.kind)
                .bind(new.parent_id.map(|id| id.0))
                .bind(new.status)
                .bind(Json(new.data))
                .fetch_one(&mut *tx)
                .await?;
            let id: i64 = row.try_get("id")?;
            let keyed: Option<i64> =
                sqlx::query_scalar(sql::INSERT_KEY).bind(offset).bind(&p.key).bind(id).fetch_optional(&mut *tx).await?;
            if keyed.is_none() {
                tx.rollback().await?;
                // On this session: a client's pool may hold this one connection only.
                let first: i64 =
                    sqlx::query_scalar(sql::KEYED_ROW).bind(&p.key).fetch_one(session.connection()).await?;
                return Ok(KeyedInsert { id: RowId(first), inserted: false });
            }
            KeyedInsert { id: RowId(id), inserted: true }
        }
    };
    tx.commit().await?;
    Ok(done)
}

/// The related lock: one transaction that locks the holder and the related rows in id order, reads their
/// availability, and writes the locks (or, on contention, the intent marks). The inner `Err` is the call's own
/// `Invalid` error (a related row does not exist); the outer one a database failure.
///
/// `record`: the store whose history (chaos mode) gets the lock or contention, in this transaction. With `read`,
/// a lock that is taken also reads the related rows in the transaction, before it commits ([`sql::ROWS_BY_ID`]:
/// by id, each once); otherwise, and on any other outcome, the rows returned are none.
/// A row as [`sql::LOCK_RELATED_READ`] reads it: id, token, owner, whether its lock or mark is live, and the
/// microseconds until it expires (`None`: no expiry).
type LockRelatedRead = (i64, Option<i64>, Option<String>, bool, Option<i64>);

pub(super) async fn lock_related_in_transaction(
    pool: &PgPool,
    offset: PgInterval,
    p: LockRelatedParams,
    record: Option<&super::PgStore>,
    read: bool,
) -> Result<Result<(LockOutcome, Vec<Row>, Option<Duration>), StoreError>, sqlx::Error> {
    let token = p.holder.token.0;
    let mut ids: Vec<i64> = p.related.iter().map(|id| id.0).collect();
    ids.push(p.holder.id.0);
    ids.sort_unstable();
    ids.dedup();
    let mut session = Session::acquire(pool).await?;
    let mut tx = session.begin().await?;
    let rows: Vec<LockRelatedRead> =
        sqlx::query_as(sql::LOCK_RELATED_READ).bind(offset).bind(&ids).fetch_all(&mut *tx).await?;
    let mut expires_in: BTreeMap<i64, Option<i64>> = BTreeMap::new();
    let found: BTreeMap<i64, (Option<i64>, bool, bool)> = rows
        .into_iter()
        .map(|(id, lock_token, lock_owner, live, expires_in_us)| {
            let holder = p.holder.token;
            let owner = lock_owner.as_deref();
            let available = related_available(lock_token.map(LockToken), owner, live, holder, &p.owner);
            let own = held_by_own_pipeline(lock_token.map(LockToken), owner, &p.owner);
            expires_in.insert(id, expires_in_us);
            (id, (lock_token, available, own))
        })
        .collect();
    if let Some(missing) = p.related.iter().find(|id| !found.contains_key(&id.0)) {
        tx.rollback().await?;
        return Ok(Err(StoreError::Invalid(format!("lock_related: related row {missing} does not exist"))));
    }
    let holds = found.get(&p.holder.id.0).is_some_and(|(lock_token, _, _)| *lock_token == Some(token));
    if !holds {
        tx.rollback().await?;
        return Ok(Ok((LockOutcome::Stale, Vec::new(), None)));
    }
    let available: Vec<i64> = p.related.iter().map(|id| id.0).filter(|id| found[id].1).collect();
    let locked = available.len() == p.related.len();
    if !available.is_empty() {
        sqlx::query(sql::LOCK_RELATED_WRITE)
            .bind(offset)
            .bind(&available)
            .bind(locked.then_some(token))
            .bind(&p.owner)
            .bind(interval(p.lease_ttl))
            .execute(&mut *tx)
            .await?;
    }
    let mut until = None;
    let outcome = if locked {
        LockOutcome::Locked
    } else {
        let by_own_pipeline = p.related.iter().map(|id| found[&id.0]).all(|(_, available, own)| available || own);
        let mut unavailable: Vec<i64> = p.related.iter().map(|id| id.0).filter(|id| !found[id].1).collect();
        unavailable.sort_unstable();
        unavailable.dedup();
        // The longest span until an unavailable row's lock or mark expires; `None` once one has no expiry.
        until = unavailable.iter().try_fold(Duration::ZERO, |until, id| {
            expires_in[id].map(|us| until.max(Duration::from_micros(us.max(0) as u64)))
        });
        if p.park {
            sqlx::query(sql::LOCK_RELATED_WAIT).bind(&unavailable).execute(&mut *tx).await?;
        }
        LockOutcome::Contended { by_own_pipeline }
    };
    if let Some(store) = record {
        let related = if locked { p.related.clone() } else { Vec::new() };
        let op = CommitOp::LockRelated { holder: p.holder, related, owner: p.owner.clone(), outcome };
        super::history::append(store, &mut tx, &op).await?;
    }
    let mut rows = Vec::new();
    if locked && read {
        let mut related: Vec<i64> = p.related.iter().map(|id| id.0).collect();
        related.sort_unstable();
        related.dedup();
        let read = sqlx::query(sql::ROWS_BY_ID).bind(&related).fetch_all(&mut *tx).await?;
        rows = read.iter().map(super::codec::row).collect::<Result<_, _>>()?;
    }
    tx.commit().await?;
    Ok(Ok((outcome, rows, until)))
}

/// The guarded main write of an apply ([`sql::APPLY_MAIN`]); `None` when the row no longer carries the token (nothing
/// written).
pub(super) async fn apply_main(
    conn: &mut PgConnection,
    offset: PgInterval,
    lease: Lease,
    update: RowUpdate,
    guarded: bool,
) -> Result<Option<Timestamp>, sqlx::Error> {
    let data = update.data.map(Json);
    let query = |statement| {
        sqlx::query_scalar(statement)
            .bind(offset)
            .bind(lease.id.0)
            .bind(lease.token.0)
            .bind(update.status.as_deref())
            .bind(data.as_ref())
    };
    let now: Option<PgTime> = if guarded {
        lease_write(conn, &sql::APPLY_MAIN, query).await?
    } else {
        query(sql::APPLY_MAIN_UNGUARDED).fetch_optional(conn).await?
    };
    Ok(now.map(|t| t.0))
}

/// Runs a write of one lease ([`sql::LeaseWrite`]): its statements in order, each built by `query` from its text
/// (the same parameters for both), until one returns a row; `None` when neither does (the lease is stale: nothing
/// was written).
pub(super) async fn lease_write<'q, T>(
    conn: &mut PgConnection,
    write: &sql::LeaseWrite,
    query: impl Fn(&'static str) -> QueryScalar<'q, Postgres, T, PgArguments>,
) -> Result<Option<T>, sqlx::Error>
where
    T: Send + Unpin,
    (T,): for<'r> FromRow<'r, PgRow>,
{
    for statement in write.statements() {
        if let Some(out) = query(statement).fetch_optional(&mut *conn).await? {
            return Ok(Some(out));
        }
    }
    Ok(None)
}

/// Related updates folded per row in order, as MemStore writes them one after another: a later `Some` wins.
pub(super) fn merge_related(related: Vec<RelatedUpdate>) -> BTreeMap<RowId, RowUpdate> {
    let mut merged: BTreeMap<RowId, RowUpdate> = BTreeMap::new();
    for RelatedUpdate { id, update } in related {
        let entry = merged.entry(id).or_default();
        entry.status = update.status.or(entry.status.take());
        entry.data = update.data.or(entry.data.take());
    }
    merged
}

type RelatedColumns = (Vec<i64>, Vec<Option<String>>, Vec<Option<Json<serde_json::Value>>>);

fn related_columns(related: &BTreeMap<RowId, RowUpdate>) -> RelatedColumns {
    let ids = related.keys().map(|id| id.0).collect();
    let statuses = related.values().map(|u| u.status.clone()).collect();
    let data = related.values().map(|u| u.data.clone().map(Json)).collect();
    (ids, statuses, data)
}

/// Inserts `rows` in one statement ([`sql::INSERT_MANY`]); ids in input order.
pub(super) async fn insert_rows(
    conn: &mut PgConnection,
    offset: PgInterval,
    rows: Vec<NewRow>,
) -> Result<Vec<RowId>, sqlx::Error> {
    insert_rows_with(conn, sql::INSERT_MANY, offset, rows).await
}

/// Inserts `rows` in one statement, `statement` ([`sql::INSERT_MANY`] or its qualified copy,
/// [`sql::CallerInserts::insert_many`]); ids in input order.
pub(super) async fn insert_rows_with(
    conn: &mut PgConnection,
    statement: impl SqlSafeStr,
    offset: PgInterval,
    rows: Vec<NewRow>,
) -> Result<Vec<RowId>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let count = rows.len();
    let mut kinds = Vec::with_capacity(count);
    let mut parents = Vec::with_capacity(count);
    let mut statuses = Vec::with_capacity(count);
    let mut data = Vec::with_capacity(count);
    for row in rows {
        kinds.push(row.kind);
        parents.push(row.parent_id.map(|id| id.0));
        statuses.push(row.status);
        data.push(Json(row.data));
    }
    let ids: Vec<i64> = sqlx::query_scalar(statement)
        .bind(offset)
        .bind(kinds)
        .bind(parents)
        .bind(statuses)
        .bind(data)
        .fetch_all(conn)
        .await?;
    assert_eq!(ids.len(), count, "bulk insert of {count} rows returned {} ids", ids.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "bulk insert returned ids out of input order: {ids:?}");
    Ok(ids.into_iter().map(RowId).collect())
}

/// Appends `events` in one statement, in input order.
pub(super) async fn insert_events(
    conn: &mut PgConnection,
    offset: PgInterval,
    events: Vec<NewEvent>,
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let count = events.len();
    let mut rows = Vec::with_capacity(count);
    let mut kinds = Vec::with_capacity(count);
    let mut data = Vec::with_capacity(count);
    for event in events {
        rows.push(event.row_id.0);
        kinds.push(event.kind);
        data.push(Json(event.data));
    }
    let seqs: Vec<i64> =
        sqlx::query_scalar(sql::INSERT_EVENTS).bind(offset).bind(rows).bind(kinds).bind(data).fetch_all(conn).await?;
    assert!(
        seqs.len() == count && seqs.windows(2).all(|w| w[0] < w[1]),
        "events were given sequence numbers out of input order: {seqs:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn related_updates_fold_like_sequential_writes() {
        let update = |status: Option<&str>, data: Option<serde_json::Value>| RowUpdate {
            status: status.map(String::from),
            data,
        };
        let merged = merge_related(vec![
            RelatedUpdate { id: RowId(2), update: update(Some("a"), Some(serde_json::json!(1))) },
            RelatedUpdate { id: RowId(1), update: update(Some("x"), None) },
            RelatedUpdate { id: RowId(2), update: update(None, Some(serde_json::json!(2))) },
        ]);
        assert_eq!(merged[&RowId(2)], update(Some("a"), Some(serde_json::json!(2))));
        assert_eq!(merged[&RowId(1)], update(Some("x"), None));
    }
}
