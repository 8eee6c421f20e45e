//! Rows decoded once and kept while their version stays: a controller pass and an agent pass read every
//! job or allocation they look at, but decode only those written since the pass before. An entry is used only for a
//! row read at the [`Row::version`], `updated_at` and status it was decoded at, which every store changes at each
//! write of the row's status or data, so what a reader decides never depends on what it kept.

use super::model::DecodeError;
use crate::store::{Row, RowId, Timestamp};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One decoded row, the version of the row it was decoded from, and the last pass that read it (marked where the
/// store reads the row, through a shared reference).
#[derive(Debug)]
pub(crate) struct Kept<T> {
    stamp: Stamp,
    value: T,
    read_in: AtomicU64,
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

/// One row as a read hands it over: unchanged since the last pass decoded it (a copy of the kept value), or
/// decoded now (with the stamp of the row it came from, to compare the next pass's read with).
#[derive(Debug)]
pub(crate) enum Fresh<T> {
    Unchanged(T),
    Decoded(Result<(T, Stamp), DecodeError>),
}

/// The rows one reader (a controller pass over one operation, an agent) decoded, by row id, kept from one of its
/// passes to the next. A pass calls [`KeptRows::begin`], reads each row through [`KeptRows::read`] (where the store
/// reads it) and [`KeptRows::keep`], then [`KeptRows::end`], which drops the rows it did not read (a finished
/// incarnation's leave with it). Entries stay in place from pass to pass, so a pass that reads 10 000 unchanged
/// rows moves none of them and looks each up once (moving every entry between two maps was a tenth of a
/// gang restart's passes). Values are cheap to copy ([`super::model::Job`] and [`super::model::Allocation`] share
/// their data).
#[derive(Debug)]
pub(crate) struct KeptRows<T> {
    rows: BTreeMap<RowId, Kept<T>>,
    /// The current pass, counted by [`KeptRows::begin`].
    pass: u64,
}

impl<T> Default for KeptRows<T> {
    fn default() -> Self {
        KeptRows { rows: BTreeMap::new(), pass: 0 }
    }
}

impl<T: Clone> KeptRows<T> {
    /// Starts a pass: the rows it keeps are those it reads from now until [`KeptRows::end`].
    pub(crate) fn begin(&mut self) {
        self.pass += 1;
    }

    /// Row `r` against what is kept: unchanged if its id is kept at the same stamp (then marked read by this pass),
    /// else decoded by `decode`. Runs where the store reads the row (under MemStore's lock), so it only compares,
    /// copies and decodes.
    pub(crate) fn read(&self, r: &Row, decode: impl Fn(&Row) -> Result<T, DecodeError>) -> Fresh<T> {
        match self.rows.get(&r.id) {
            Some(kept) if kept.stamp.matches(r) => {
                kept.read_in.store(self.pass, Ordering::Relaxed);
                Fresh::Unchanged(kept.value.clone())
            }
            _ => Fresh::Decoded(decode(r).map(|value| (value, Stamp::of(r)))),
        }
    }

    /// The value of row `id` as `read` found it: the kept one if unchanged (already marked by `read`), else the
    /// one decoded now, which replaces it (a row that did not decode is no longer kept). Either is kept for the
    /// next pass.
    pub(crate) fn keep(&mut self, id: RowId, read: Fresh<T>) -> Result<T, DecodeError> {
        match read {
            Fresh::Unchanged(value) => Ok(value),
            Fresh::Decoded(Err(error)) => {
                self.rows.remove(&id);
                Err(error)
            }
            Fresh::Decoded(Ok((value, stamp))) => {
                let kept = Kept { stamp, value: value.clone(), read_in: AtomicU64::new(self.pass) };
                self.rows.insert(id, kept);
                Ok(value)
            }
        }
    }

    /// Drops the rows with ids up to `last` (no bound when `None`: none is dropped): a pass that does not read every
    /// row ([`super::last_pass`]) drops those of finished incarnations this way.
    pub(crate) fn forget_through(&mut self, last: Option<RowId>) {
        if let Some(last) = last {
            self.rows = self.rows.split_off(&RowId(last.0.saturating_add(1)));
        }
    }

    /// Ends the pass: drops the rows it did not read.
    pub(crate) fn end(&mut self) {
        let pass = self.pass;
        self.rows.retain(|_, kept| *kept.read_in.get_mut() == pass);
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
    fn kept_after_reading(row: &Row) -> KeptRows<u64> {
        let mut kept = KeptRows::default();
        kept.begin();
        let read = kept.read(row, decode_n);
        assert_eq!(kept.keep(row.id, read).unwrap(), 1);
        kept.end();
        kept
    }

    #[test]
    fn a_kept_value_is_used_only_for_the_same_version_time_and_status() {
        let row = NewRow::new("job", "running", json!({"n": 1})).into_row(RowId(7), Timestamp(100));
        let unchanged = kept_after_reading(&row).read(&row, decode_n);
        assert!(matches!(unchanged, Fresh::Unchanged(1)), "the same row read again: {unchanged:?}");
        // Any write (another replica's, a pass's whose apply was stale, an agent's) changes the version, the time or
        // the status: the row is decoded again, whatever its data (only the stamp is compared).
        let written = [
            Row { version: row.version + 1, data: json!({"n": 2}), ..row.clone() },
            Row { updated_at: Timestamp(101), data: json!({"n": 2}), ..row.clone() },
            Row { status: "completed".into(), data: json!({"n": 2}), ..row.clone() },
        ];
        for other in written {
            let mut kept = kept_after_reading(&row);
            kept.begin();
            let read = kept.read(&other, decode_n);
            assert!(matches!(read, Fresh::Decoded(Ok((2, _)))), "{other:?} read as {read:?}");
            assert_eq!(kept.keep(other.id, read).unwrap(), 2);
            kept.end();
            assert!(matches!(kept.read(&other, decode_n), Fresh::Unchanged(2)), "{other:?} kept at its stamp");
        }
    }

    #[test]
    fn a_pass_keeps_only_the_rows_it_read() {
        let row = NewRow::new("job", "running", json!({"n": 1})).into_row(RowId(7), Timestamp(100));
        let mut kept = kept_after_reading(&row);
        // A pass that reads nothing (the row left the query: its incarnation finished) drops it.
        kept.begin();
        kept.end();
        assert!(matches!(kept.read(&row, decode_n), Fresh::Decoded(Ok((1, _)))), "a row no pass read is not kept");
        // A pass cut short (no `end`) leaves what it did not read to be dropped by the next pass's `end`.
        let mut kept = kept_after_reading(&row);
        kept.begin();
        kept.begin();
        let other = Row { id: RowId(8), ..row.clone() };
        let read = kept.read(&other, decode_n);
        kept.keep(other.id, read).unwrap();
        kept.end();
        assert!(matches!(kept.read(&row, decode_n), Fresh::Decoded(_)), "row 7 was read by no completed pass");
        assert!(matches!(kept.read(&other, decode_n), Fresh::Unchanged(1)), "row 8 was read by the last pass");
    }
}
