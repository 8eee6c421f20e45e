//! Conversions between the store's types and PostgreSQL's: the one place that knows how `Timestamp` maps to
//! `timestamptz` and `Duration` to `interval`, and how a result row becomes a [`Row`] or an [`Event`].

use crate::store::{AttemptError, Event, LockToken, Row, RowId, Timestamp, duration_micros};
use sqlx::postgres::types::{Oid, PgInterval};
use sqlx::postgres::{PgRow, PgTypeInfo, PgValueFormat, PgValueRef, Postgres};
use sqlx::types::Json;
use sqlx::{Column as _, Decode, Row as _, Type};
use std::time::Duration;

/// PostgreSQL counts `timestamptz` in microseconds since 2000-01-01 00:00 UTC; the store counts from 1970.
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// OID of the built-in `timestamptz` type (fixed in every PostgreSQL catalog).
const TIMESTAMPTZ_OID: Oid = Oid(1184);

/// A `timestamptz` column read as a store [`Timestamp`].
///
/// `'infinity'` and `'-infinity'` (written by `lockstep_ts_plus`/`lockstep_ts_minus` when a span overflows) read
/// as `Timestamp(i64::MAX)` and `Timestamp(i64::MIN)`, and instants past `Timestamp`'s range saturate, so a
/// saturated sum reads back as `Timestamp::plus` computes it in MemStore.
pub(super) struct PgTime(pub(super) Timestamp);

impl Type<Postgres> for PgTime {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(TIMESTAMPTZ_OID)
    }
}

impl<'r> Decode<'r, Postgres> for PgTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        if value.format() != PgValueFormat::Binary {
            return Err("timestamptz in text format: PgStore only runs prepared statements".into());
        }
        let bytes: [u8; 8] = value.as_bytes()?.try_into().map_err(|_| "timestamptz value is not 8 bytes")?;
        Ok(PgTime(timestamp_from_pg(i64::from_be_bytes(bytes))))
    }
}

/// A `timestamptz`'s binary value (microseconds since 2000, `i64::MAX`/`MIN` for ±infinity) as a [`Timestamp`].
pub(super) fn timestamp_from_pg(pg_micros: i64) -> Timestamp {
    match pg_micros {
        i64::MAX => Timestamp(i64::MAX),
        i64::MIN => Timestamp(i64::MIN),
        micros => Timestamp(micros.saturating_add(PG_EPOCH_UNIX_MICROS)),
    }
}

/// `span` as an `interval` of whole microseconds, truncated and saturating as
/// [`duration_micros`] does for MemStore (no days or months, so adding it never depends on a time zone).
pub(super) fn interval(span: Duration) -> PgInterval {
    PgInterval { months: 0, days: 0, microseconds: duration_micros(span) }
}

/// The names of `sql::row_columns!`, in its order: [`row`] reads them by position from the first.
const ROW_COLUMNS: [&str; 16] = [
    "id",
    "kind",
    "parent_id",
    "status",
    "data",
    "created_at",
    "updated_at",
    "version",
    "last_processed_at",
    "lock_expires_at",
    "lock_token",
    "lock_owner",
    "hinted",
    "attempts",
    "errors",
    "not_before",
];

/// A result row holding the columns of `sql::row_columns!` as a [`Row`].
///
/// The columns are found by name once (`id`) and then read by position: a read by name hashes the name, and a
/// fetch of 100 rows read 1 600 of them (2 % of a replica's CPU in the drain bench). Debug builds check
/// every name.
pub(super) fn row(r: &PgRow) -> Result<Row, sqlx::Error> {
    use sqlx::ColumnIndex;
    let at = ColumnIndex::<PgRow>::index(&"id", r)?;
    debug_assert!(
        ROW_COLUMNS.iter().enumerate().all(|(i, name)| r.columns().get(at + i).is_some_and(|c| c.name() == *name)),
        "the row's columns follow sql::row_columns!"
    );
    Ok(Row {
        id: RowId(r.try_get(at)?),
        kind: r.try_get(at + 1)?,
        parent_id: r.try_get::<Option<i64>, _>(at + 2)?.map(RowId),
        status: r.try_get(at + 3)?,
        data: r.try_get::<Json<serde_json::Value>, _>(at + 4)?.0,
        created_at: r.try_get::<PgTime, _>(at + 5)?.0,
        updated_at: r.try_get::<PgTime, _>(at + 6)?.0,
        version: r.try_get(at + 7)?,
        last_processed_at: r.try_get::<Option<PgTime>, _>(at + 8)?.map(|t| t.0),
        lock_expires_at: r.try_get::<Option<PgTime>, _>(at + 9)?.map(|t| t.0),
        lock_token: r.try_get::<Option<i64>, _>(at + 10)?.map(LockToken),
        lock_owner: r.try_get(at + 11)?,
        hinted: r.try_get(at + 12)?,
        attempts: attempts(r.try_get(at + 13)?)?,
        errors: r.try_get::<Json<Vec<AttemptError>>, _>(at + 14)?.0,
        not_before: r.try_get::<Option<PgTime>, _>(at + 15)?.map(|t| t.0),
    })
}

/// The `attempts` column (an `integer` that only ever grows from 0) as a count.
pub(super) fn attempts(value: i32) -> Result<u32, sqlx::Error> {
    u32::try_from(value).map_err(|_| sqlx::Error::Protocol(format!("attempts {value} is below 0")))
}

/// A result row of `sql::REFETCH_BATCH`: the lease's index in the input (from 0) and its row.
pub(super) fn numbered_row(r: &PgRow) -> Result<(usize, Row), sqlx::Error> {
    let input_order: i64 = r.try_get("input_order")?;
    // `WITH ORDINALITY` numbers from 1.
    let index = usize::try_from(input_order - 1)
        .map_err(|_| sqlx::Error::Protocol(format!("refetch batch: input_order {input_order} is below 1")))?;
    Ok((index, row(r)?))
}

/// A result row of `sql::EVENTS` as an [`Event`].
pub(super) fn event(r: &PgRow) -> Result<Event, sqlx::Error> {
    Ok(Event {
        seq: r.try_get("seq")?,
        row_id: RowId(r.try_get("row_id")?),
        kind: r.try_get("kind")?,
        data: r.try_get::<Json<serde_json::Value>, _>("data")?.0,
        at: r.try_get::<PgTime, _>("at")?.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamptz_binary_maps_to_unix_micros() {
        assert_eq!(timestamp_from_pg(0), Timestamp(PG_EPOCH_UNIX_MICROS));
        assert_eq!(timestamp_from_pg(-PG_EPOCH_UNIX_MICROS), Timestamp::EPOCH);
        assert_eq!(timestamp_from_pg(1), Timestamp(PG_EPOCH_UNIX_MICROS + 1));
    }

    #[test]
    fn infinities_and_far_instants_saturate_like_timestamp_plus() {
        assert_eq!(timestamp_from_pg(i64::MAX), Timestamp(i64::MAX));
        assert_eq!(timestamp_from_pg(i64::MIN), Timestamp(i64::MIN));
        // 294276-12-31, the last valid timestamptz, lies past Timestamp's end (294247).
        assert_eq!(timestamp_from_pg(9_223_371_331_199_999_999), Timestamp(i64::MAX));
        assert_eq!(Timestamp::EPOCH.plus(Duration::MAX), Timestamp(i64::MAX));
    }

    #[test]
    fn interval_truncates_to_micros_and_saturates() {
        assert_eq!(interval(Duration::from_nanos(1_999)).microseconds, 1);
        assert_eq!(interval(Duration::MAX).microseconds, i64::MAX);
        assert_eq!(interval(Duration::from_secs(30)).days, 0);
    }
}
