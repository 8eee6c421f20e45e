//! The batched guarded apply ([`Store::apply_batch`](crate::store::Store::apply_batch); DESIGN §3, Batching):
//! several workers' applies in one transaction of set-based statements, each item still guarded by its own
//! `id + lock_token`, a stale item reported alone.
//!
//! Two shapes:
//! 1. Every item only updates its main row (the common case): one statement, [`sql::APPLY_BATCH_MAIN`], guards,
//!    writes and unlocks every item at once, so the batch costs one round trip and one commit.
//! 2. Some item has related updates, related locks it relies on (`ApplyParams::locked`), inserts or events: one
//!    transaction locks every main and related row, and every row carrying one of the batch's tokens, in id order
//!    and reads their tokens ([`sql::APPLY_BATCH_LOCK`]), decides which items are held whole (every related row,
//!    updated or only locked, still carrying the item's token), then writes only those: related updates, main
//!    rows, inserts and events, one statement each. A stale item writes nothing.
//!
//! Items are decided as if applied one after another in input order (what MemStore does): a lease given twice
//! applies once, its later copies are stale; tokens are store-wide unique, so no two distinct leases share one.

use super::codec::PgTime;
use super::session::Session;
use super::sql;
use super::write::{insert_events, insert_rows, merge_related};
use crate::store::{ApplyOutcome, ApplyParams, CommitOp, Lease, LockToken, NewEvent, NewRow, RowId, RowUpdate};
use sqlx::postgres::PgPool;
use sqlx::postgres::types::PgInterval;
use sqlx::types::Json;
use std::collections::{BTreeMap, BTreeSet};

type Columns = (Vec<i64>, Vec<i64>, Vec<Option<String>>, Vec<Option<Json<serde_json::Value>>>);

/// Applies `batch` (at least two items) in one transaction; outcomes in input order.
///
/// `record`: the store whose history (chaos mode) gets each applied item, in the batch's transaction (the
/// transactional shape then serves simple batches too).
pub(super) async fn apply_batch(
    pool: &PgPool,
    offset: PgInterval,
    batch: Vec<ApplyParams>,
    record: Option<&super::PgStore>,
) -> Result<Vec<ApplyOutcome>, sqlx::Error> {
    let first = first_copies(&batch);
    let simple = batch
        .iter()
        .all(|p| p.related.is_empty() && p.locked.is_empty() && p.inserts.is_empty() && p.events.is_empty());
    if simple && record.is_none() {
        apply_mains(pool, offset, batch, &first).await
    } else {
        apply_in_transaction(pool, offset, batch, &first, record).await
    }
}

/// For each item, whether it is the first in the batch with its token (a later copy of a lease is stale).
fn first_copies(batch: &[ApplyParams]) -> Vec<bool> {
    let mut seen = BTreeSet::new();
    batch.iter().map(|p| seen.insert(p.lease.token)).collect()
}

/// Shape 1: one statement for a batch of main-row updates.
async fn apply_mains(
    pool: &PgPool,
    offset: PgInterval,
    batch: Vec<ApplyParams>,
    first: &[bool],
) -> Result<Vec<ApplyOutcome>, sqlx::Error> {
    let tokens: Vec<LockToken> = batch.iter().map(|p| p.lease.token).collect();
    let mains = batch.into_iter().zip(first).filter(|(_, first)| **first).map(|(p, _)| (p.lease, p.update));
    let applied: Vec<(i64, i64, PgTime)> =
        sqlx::query_as(sql::APPLY_BATCH_MAIN).bind(offset).bind_columns(main_columns(mains)).fetch_all(pool).await?;
    let now = applied.first().map(|(_, _, now)| now.0);
    let applied: BTreeSet<i64> = applied.into_iter().map(|(_, token, _)| token).collect();
    Ok(tokens
        .iter()
        .zip(first)
        .map(|(token, first)| match now {
            Some(now) if *first && applied.contains(&token.0) => ApplyOutcome::Applied { inserted: Vec::new(), now },
            _ => ApplyOutcome::Stale,
        })
        .collect())
}

/// Shape 2: lock, decide, write the held items, in one transaction. Rolls back (awaited, so no row lock outlives
/// the call) when no item is held.
async fn apply_in_transaction(
    pool: &PgPool,
    offset: PgInterval,
    batch: Vec<ApplyParams>,
    first: &[bool],
    record: Option<&super::PgStore>,
) -> Result<Vec<ApplyOutcome>, sqlx::Error> {
    let mut ids: Vec<i64> =
        batch.iter().flat_map(|p| p.guarded_related().into_iter().map(|id| id.0).chain([p.lease.id.0])).collect();
    ids.sort_unstable();
    ids.dedup();
    let batch_tokens: Vec<i64> = batch.iter().map(|p| p.lease.token.0).collect();
    let mut session = Session::acquire(pool).await?;
    let mut tx = session.begin().await?;
    let found: Vec<(i64, Option<i64>)> =
        sqlx::query_as(sql::APPLY_BATCH_LOCK).bind(&ids).bind(&batch_tokens).fetch_all(&mut *tx).await?;
    let tokens: BTreeMap<i64, Option<i64>> = found.into_iter().collect();
    let carries = |id: RowId, token: LockToken| tokens.get(&id.0).copied().flatten() == Some(token.0);
    let held: Vec<bool> = batch
        .iter()
        .zip(first)
        .map(|(p, first)| {
            let token = p.lease.token;
            // Every related row the item locked, updated or not (`ApplyParams::locked`), still carries the token.
            *first && carries(p.lease.id, token) && p.guarded_related().into_iter().all(|id| carries(id, token))
        })
        .collect();
    if !held.contains(&true) {
        tx.rollback().await?;
        return Ok(vec![ApplyOutcome::Stale; batch.len()]);
    }
    let mut related = Vec::new();
    let mut mains = Vec::new();
    let mut inserts: Vec<Vec<NewRow>> = Vec::new();
    let mut events: Vec<NewEvent> = Vec::new();
    let mut records: Vec<(Lease, Vec<RowId>)> = Vec::new();
    for (p, _) in batch.into_iter().zip(&held).filter(|(_, held)| **held) {
        let token = p.lease.token;
        let merged = merge_related(p.related);
        records.push((p.lease, merged.keys().copied().collect()));
        // Held items' related rows are distinct: each carries its one item's token.
        related.extend(merged.into_iter().map(|(id, update)| (id, token, update)));
        mains.push((p.lease, p.update));
        inserts.push(p.inserts);
        events.extend(p.events);
    }
    if !related.is_empty() {
        let count = related.len();
        let columns = columns(related.into_iter());
        let written =
            sqlx::query(sql::APPLY_BATCH_RELATED).bind(offset).bind_columns(columns).execute(&mut *tx).await?;
        assert_eq!(written.rows_affected(), count as u64, "related rows of held items were locked since step 1");
    }
    let count = mains.len();
    let applied: Vec<(i64, i64, PgTime)> = sqlx::query_as(sql::APPLY_BATCH_MAIN)
        .bind(offset)
        .bind_columns(main_columns(mains.into_iter()))
        .fetch_all(&mut *tx)
        .await?;
    assert_eq!(applied.len(), count, "main rows of held items were locked since step 1");
    let now = applied[0].2.0;
    let counts: Vec<usize> = inserts.iter().map(Vec::len).collect();
    let mut ids = insert_rows(&mut tx, offset, inserts.into_iter().flatten().collect()).await?.into_iter();
    insert_events(&mut tx, offset, events).await?;
    let inserted: Vec<Vec<RowId>> = counts.iter().map(|count| ids.by_ref().take(*count).collect()).collect();
    if let Some(store) = record {
        for ((lease, related), inserted) in records.into_iter().zip(&inserted) {
            let op = CommitOp::Apply { lease, applied: true, related, inserted: inserted.clone() };
            super::history::append(store, &mut tx, &op).await?;
        }
    }
    tx.commit().await?;
    let mut inserted = inserted.into_iter();
    Ok(held
        .into_iter()
        .map(|held| {
            if !held {
                return ApplyOutcome::Stale;
            }
            ApplyOutcome::Applied { inserted: inserted.next().expect("one insert list per held item"), now }
        })
        .collect())
}

/// The main rows' columns of [`sql::APPLY_BATCH_MAIN`], sorted by id.
fn main_columns(mains: impl Iterator<Item = (Lease, RowUpdate)>) -> Columns {
    columns(mains.map(|(lease, update)| (lease.id, lease.token, update)))
}

/// `(id, token, update)` rows as the `unnest` columns of the batch statements, sorted by id.
fn columns(rows: impl Iterator<Item = (RowId, LockToken, RowUpdate)>) -> Columns {
    let mut rows: Vec<(RowId, LockToken, RowUpdate)> = rows.collect();
    rows.sort_unstable_by_key(|(id, token, _)| (*id, *token));
    let mut columns: Columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, token, update) in rows {
        columns.0.push(id.0);
        columns.1.push(token.0);
        columns.2.push(update.status);
        columns.3.push(update.data.map(Json));
    }
    columns
}

/// Binds the four `unnest` columns in order (`$2` to `$5`).
trait BindColumns {
    fn bind_columns(self, columns: Columns) -> Self;
}

impl<'q, O> BindColumns for sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    fn bind_columns(self, (ids, tokens, statuses, data): Columns) -> Self {
        self.bind(ids).bind(tokens).bind(statuses).bind(data)
    }
}

impl<'q> BindColumns for sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    fn bind_columns(self, (ids, tokens, statuses, data): Columns) -> Self {
        self.bind(ids).bind(tokens).bind(statuses).bind(data)
    }
}
