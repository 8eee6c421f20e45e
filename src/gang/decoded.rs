//! Rows decoded once and kept while their version stays (issue 17): a controller pass and an agent pass read every
//! job or allocation they look at, but decode only those written since the pass before. An entry is used only for a
//! row read at the [`Row::version`], `updated_at` and status it was decoded at, which every store changes at each
//! write of the row's status or data, so what a reader decides never depends on what it kept.

use super::model::DecodeError;
use crate::store::{Row, RowId, Timestamp};
use std::collections::BTreeMap;

/// One decoded row and the version of the row it was decoded from.
#[derive(Debug)]
pub(crate) struct Kept<T> {
    stamp: Stamp,
    value: T,
}

/// What identifies a row's status and data: its [`Row::version`] and `updated_at` (and the status, cheap to
/// compare).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    version: i64,
    updated_at: Timestamp,
    status: String,
}

impl Stamp {
    fn matches(&self, r: &Row) -> bool {
        self.version == r.version && self.updated_at == r.updated_at && self.status == r.status
    }

    fn of(r: &Row) -> Stamp {
        Stamp { version: r.version, updated_at: r.updated_at, status: r.status.clone() }
    }
}

/// One row as a read hands it over: unchanged since the last pass decoded it, or decoded now (with the stamp of
/// the row it came from, to compare the next pass's read with).
#[derive(Debug)]
pub(crate) enum Fresh<T> {
    Unchanged,
    Decoded(Result<(T, Stamp), DecodeError>),
}

impl<T> Fresh<T> {
    /// Row `r` against `last`: unchanged if `last` holds its id at the same stamp, else decoded by `decode`. Runs
    /// where the store reads the row (under MemStore's lock), so it only compares and decodes.
    pub(crate) fn read(
        last: &BTreeMap<RowId, Kept<T>>,
        r: &Row,
        decode: impl Fn(&Row) -> Result<T, DecodeError>,
    ) -> Fresh<T> {
        match last.get(&r.id) {
            Some(kept) if kept.stamp.matches(r) => Fresh::Unchanged,
            _ => Fresh::Decoded(decode(r).map(|value| (value, Stamp::of(r)))),
        }
    }
}

/// The value of row `id` as `read` found it: taken from `last` (moved, since a read meets a row once) if unchanged,
/// else the one decoded now; kept in `kept`, for the next pass, unless it did not decode.
pub(crate) fn keep<T: Clone>(
    last: &mut BTreeMap<RowId, Kept<T>>,
    kept: &mut BTreeMap<RowId, Kept<T>>,
    id: RowId,
    read: Fresh<T>,
) -> Result<T, DecodeError> {
    match read {
        Fresh::Unchanged => {
            let entry = last.remove(&id).expect("an unchanged row was kept");
            let value = entry.value.clone();
            kept.insert(id, entry);
            Ok(value)
        }
        Fresh::Decoded(decoded) => {
            let (value, stamp) = decoded?;
            kept.insert(id, Kept { stamp, value: value.clone() });
            Ok(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewRow;
    use serde_json::json;

    fn decode_n(row: &Row) -> Result<u64, DecodeError> {
        Ok(row.data["n"].as_u64().unwrap_or(0))
    }

    /// Keeps `row` decoded, as a pass that read it would.
    fn kept_after_reading(row: &Row) -> BTreeMap<RowId, Kept<u64>> {
        let (mut last, mut kept) = (BTreeMap::new(), BTreeMap::new());
        let read = Fresh::read(&last, row, decode_n);
        assert_eq!(keep(&mut last, &mut kept, row.id, read).unwrap(), 1);
        kept
    }

    #[test]
    fn a_kept_value_is_used_only_for_the_same_version_time_and_status() {
        let row = NewRow::new("job", "running", json!({"n": 1})).into_row(RowId(7), Timestamp(100));
        let unchanged = Fresh::read(&kept_after_reading(&row), &row, decode_n);
        assert!(matches!(unchanged, Fresh::Unchanged), "the same row read again: {unchanged:?}");
        // Any write (another replica's, a pass's whose apply was stale, an agent's) changes the version, the time or
        // the status: the row is decoded again, whatever its data (only the stamp is compared).
        let written = [
            Row { version: row.version + 1, data: json!({"n": 2}), ..row.clone() },
            Row { updated_at: Timestamp(101), data: json!({"n": 2}), ..row.clone() },
            Row { status: "completed".into(), data: json!({"n": 2}), ..row.clone() },
        ];
        for other in written {
            let mut last = kept_after_reading(&row);
            let read = Fresh::read(&last, &other, decode_n);
            assert!(matches!(read, Fresh::Decoded(Ok((2, _)))), "{other:?} read as {read:?}");
            let mut next = BTreeMap::new();
            assert_eq!(keep(&mut last, &mut next, other.id, read).unwrap(), 2);
            assert!(matches!(Fresh::read(&next, &other, decode_n), Fresh::Unchanged), "{other:?} kept at its stamp");
        }
    }
}
