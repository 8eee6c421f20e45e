//! Values the store refuses, checked before any write (DESIGN §2, "Bad values are refused before SQL").
//!
//! PostgreSQL cannot store a NUL character in `text` (SQLSTATE 22021) nor `\u0000` in `jsonb` (22P05), and a
//! btree index entry larger than about a third of a page (≈ 2700 bytes; SQLSTATE 54000) fails its insert. MemStore
//! would store all of them, so a handler that writes one would pass every simulation and fail in production, where
//! the failure also took down every other item of its apply batch. Both stores run these checks first: MemStore
//! returns [`StoreError::Invalid`] naming the rule, and PgStore returns the same error without sending SQL. A
//! `serde_json::Value` cannot hold NaN or an infinity, and `jsonb`'s `numeric` holds every number it can, so
//! numbers need no check here.

use super::{
    ApplyParams, FailureParams, FetchParams, InsertKeyedParams, NewEvent, NewRow, PURGE_LIMIT_MAX, PurgeParams, Retry,
    RowId, RowQuery, RowUpdate, StoreError,
};
use serde_json::Value;

/// Most bytes of a `kind` or `status`: both are keys of the fetch index (`resources_fetch_idx`), whose entries
/// PostgreSQL refuses past ≈ 2700 bytes (a third of an 8 KiB page). Two keys of 1024 bytes, the timestamp and the
/// id leave room to spare; real kinds and statuses are a few words.
pub const KEY_TEXT_BYTES_MAX: usize = 1024;

/// Most bytes of one error text a failure records on its row ([`Store::record_failure`]); a longer one is cut at
/// a character boundary. 2 KiB holds a message and a short chain of causes; a stack trace belongs in logs.
///
/// [`Store::record_failure`]: super::Store::record_failure
pub const FAILURE_ERROR_BYTES_MAX: usize = 2048;

/// Most errors a row keeps ([`Row::errors`](super::Row::errors)): the last ones, oldest dropped first, so a row that
/// fails forever does not grow forever (graphile-worker keeps the last error, river and Oban all of them).
pub const FAILURE_ERRORS_KEPT: usize = 5;

/// Checks a text column: no NUL character. `what` names the call, `field` the column.
pub fn check_text(what: &str, field: &str, value: &str) -> Result<(), StoreError> {
    if value.contains('\0') {
        return Err(invalid(what, field, "contains a NUL character, which PostgreSQL text cannot hold"));
    }
    Ok(())
}

/// Checks a key of the fetch index (`kind`, `status`): a text column of at most [`KEY_TEXT_BYTES_MAX`] bytes.
pub fn check_key(what: &str, field: &str, value: &str) -> Result<(), StoreError> {
    check_text(what, field, value)?;
    if value.len() > KEY_TEXT_BYTES_MAX {
        let rule = format!("is {} bytes, more than the {KEY_TEXT_BYTES_MAX} an index key may hold", value.len());
        return Err(invalid(what, field, &rule));
    }
    Ok(())
}

/// Checks a `jsonb` value: no NUL character in any string or object key, at any depth. The error names the path
/// of the first one (`data.a[2].b`).
pub fn check_json(what: &str, field: &str, value: &Value) -> Result<(), StoreError> {
    // The paths are written only for a value that fails: a gang restart checks tens of thousands of clean values,
    // and formatting a path per node was an eighth of its CPU.
    if json_clean(value) { Ok(()) } else { check_json_at(what, field, value) }
}

/// Whether `value` holds no NUL character in any string or object key, at any depth.
fn json_clean(value: &Value) -> bool {
    match value {
        Value::String(text) => !text.contains('\0'),
        Value::Array(items) => items.iter().all(json_clean),
        Value::Object(fields) => fields.iter().all(|(key, item)| !key.contains('\0') && json_clean(item)),
        Value::Null | Value::Bool(_) | Value::Number(_) => true,
    }
}

/// [`check_json`] writing the path of every value it visits, for the error of one that fails.
fn check_json_at(what: &str, field: &str, value: &Value) -> Result<(), StoreError> {
    match value {
        Value::String(text) => check_json_text(what, field, text),
        Value::Array(items) => {
            items.iter().enumerate().try_for_each(|(i, item)| check_json_at(what, &format!("{field}[{i}]"), item))
        }
        Value::Object(fields) => fields.iter().try_for_each(|(key, item)| {
            let path = format!("{field}.{}", key.replace('\0', "\\u0000"));
            check_json_text(what, &format!("{path} (key)"), key)?;
            check_json_at(what, &path, item)
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
    }
}

fn check_json_text(what: &str, field: &str, text: &str) -> Result<(), StoreError> {
    if text.contains('\0') {
        return Err(invalid(what, field, "contains \\u0000, which PostgreSQL jsonb cannot hold"));
    }
    Ok(())
}

/// Checks a row to insert: kind and status as index keys, data as `jsonb`.
pub fn check_new_row(what: &str, row: &NewRow) -> Result<(), StoreError> {
    check_key(what, "kind", &row.kind)?;
    check_key(what, "status", &row.status)?;
    check_json(what, "data", &row.data)
}

/// Checks a keyed insert ([`Store::insert_keyed`](super::Store::insert_keyed)): its key is non-empty text an index
/// key can hold, and its row one [`check_new_row`] passes.
pub fn check_insert_keyed(p: &InsertKeyedParams) -> Result<(), StoreError> {
    check_key("insert_keyed", "key", &p.key)?;
    if p.key.is_empty() {
        return Err(invalid("insert_keyed", "key", "must not be empty"));
    }
    check_new_row("insert_keyed", &p.row)
}

/// Checks an update of a row's own columns.
pub fn check_update(what: &str, update: &RowUpdate) -> Result<(), StoreError> {
    if let Some(status) = &update.status {
        check_key(what, "status", status)?;
    }
    match &update.data {
        Some(data) => check_json(what, "data", data),
        None => Ok(()),
    }
}

/// Checks an event to append.
pub fn check_event(what: &str, event: &NewEvent) -> Result<(), StoreError> {
    check_text(what, "event kind", &event.kind)?;
    check_json(what, "event data", &event.data)
}

/// Checks every value a guarded apply would write: the update, the related updates, the inserts and the events.
/// The error names the lease (`apply 5#7`) and the first bad value.
pub fn check_apply(p: &ApplyParams) -> Result<(), StoreError> {
    if apply_clean(p) {
        return Ok(());
    }
    let what = format!("apply {}#{}", p.lease.id, p.lease.token);
    check_update(&format!("{what}: update"), &p.update)?;
    for related in &p.related {
        check_update(&format!("{what}: related row {}", related.id), &related.update)?;
    }
    for (i, row) in p.inserts.iter().enumerate() {
        check_new_row(&format!("{what}: inserts[{i}]"), row)?;
    }
    for (i, event) in p.events.iter().enumerate() {
        check_event(&format!("{what}: events[{i}]"), event)?;
    }
    for (i, hint) in p.hints.iter().enumerate() {
        check_key(&format!("{what}: hints[{i}]"), "kind", &hint.kind)?;
    }
    Ok(())
}

/// Whether every value of `p` passes [`check_apply`], without writing the names an error would need.
fn apply_clean(p: &ApplyParams) -> bool {
    let key = |text: &str| !text.contains('\0') && text.len() <= KEY_TEXT_BYTES_MAX;
    let update = |u: &RowUpdate| u.status.as_deref().is_none_or(key) && u.data.as_ref().is_none_or(json_clean);
    update(&p.update)
        && p.related.iter().all(|related| update(&related.update))
        && p.inserts.iter().all(|row| key(&row.kind) && key(&row.status) && json_clean(&row.data))
        && p.events.iter().all(|event| !event.kind.contains('\0') && json_clean(&event.data))
        && p.hints.iter().all(|hint| key(&hint.kind))
}

/// Checks a fetch's parameters: a pipeline name and at least one status, none with a NUL, statuses as index keys.
/// (The messages of the first two rules are MemStore's and PgStore's of old.)
pub fn check_fetch(p: &FetchParams) -> Result<(), StoreError> {
    if p.statuses.is_empty() {
        return Err(StoreError::Invalid("fetch: statuses must not be empty".into()));
    }
    if p.pipeline.is_empty() {
        return Err(StoreError::Invalid("fetch: pipeline name must not be empty".into()));
    }
    check_text("fetch", "pipeline", &p.pipeline)?;
    check_key("fetch", "kind", &p.kind)?;
    p.statuses.iter().try_for_each(|status| check_key("fetch", "statuses", status))
}

/// Checks the queries of a [`Store::query`](super::Store::query) call: no NUL in a kind or a status (PostgreSQL
/// text cannot hold one, so the read would fail there).
pub fn check_query(queries: &[RowQuery]) -> Result<(), StoreError> {
    for (i, q) in queries.iter().enumerate() {
        let what = format!("query {i}");
        check_text(&what, "kind", &q.kind)?;
        q.statuses.iter().flatten().try_for_each(|status| check_text(&what, "statuses", status))?;
    }
    Ok(())
}

/// Checks a failure to record: a give-up status must be a valid status. The error text needs no check: the store
/// bounds it with [`bounded_error`].
pub fn check_failure(p: &FailureParams) -> Result<(), StoreError> {
    match &p.retry {
        Retry::GiveUp { status } => {
            check_key(&format!("record_failure {}#{}", p.lease.id, p.lease.token), "retry.status", status)
        }
        Retry::After(_) => Ok(()),
    }
}

/// `error` as a row records it: NUL characters removed, cut at a character boundary to at most
/// [`FAILURE_ERROR_BYTES_MAX`] bytes (the cut ends in "…", counted in the bound).
pub fn bounded_error(error: &str) -> String {
    let clean: String = error.chars().filter(|c| *c != '\0').collect();
    if clean.len() <= FAILURE_ERROR_BYTES_MAX {
        return clean;
    }
    let ellipsis = '…';
    let mut end = FAILURE_ERROR_BYTES_MAX - ellipsis.len_utf8();
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = clean[..end].to_string();
    cut.push(ellipsis);
    cut
}

/// The refusal of a row whose `parent_id` names no row (DESIGN §2, "Parents"): `what` names the call and the row
/// (`insert_many: rows[2]`, `apply 5#7: inserts[0]`). MemStore returns it before any write; PgStore maps its
/// foreign key's violation (SQLSTATE 23503) to the same text.
pub fn parent_missing(what: &str, parent: RowId) -> StoreError {
    invalid(what, "parent_id", &format!("{parent} names no row (a row's parent must exist when the row is inserted)"))
}

fn invalid(what: &str, field: &str, rule: &str) -> StoreError {
    StoreError::Invalid(format!("{what}: {field} {rule}"))
}

/// Checks a purge's parameters ([`Store::purge`](super::Store::purge)): a kind and statuses (and parent statuses)
/// the store can hold, at least one status, no empty one, and a limit from 1 to [`PURGE_LIMIT_MAX`].
pub fn check_purge(p: &PurgeParams) -> Result<(), StoreError> {
    let what = format!("purge of {}", p.kind);
    check_key(&what, "kind", &p.kind)?;
    if p.kind.is_empty() {
        return Err(StoreError::Invalid(format!("{what}: kind is empty (no row has an empty kind)")));
    }
    if p.statuses.is_empty() {
        return Err(StoreError::Invalid(format!("{what}: statuses is empty (name the kind's final statuses)")));
    }
    for status in &p.statuses {
        check_key(&what, "status", status)?;
        if status.is_empty() {
            return Err(StoreError::Invalid(format!("{what}: a status is empty")));
        }
    }
    for status in &p.parent_statuses {
        check_key(&what, "parent status", status)?;
        if status.is_empty() {
            return Err(StoreError::Invalid(format!("{what}: a parent status is empty")));
        }
    }
    if p.limit == 0 || p.limit > PURGE_LIMIT_MAX {
        return Err(StoreError::Invalid(format!("{what}: limit {} is outside 1 to {PURGE_LIMIT_MAX}", p.limit)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_anywhere_in_json_is_named_by_its_path() {
        let value = json!({"a": [1, {"b": "x\u{0}y"}]});
        let message = check_json("insert", "data", &value).unwrap_err().to_string();
        assert_eq!(
            message,
            "invalid store call: insert: data.a[1].b contains \\u0000, which PostgreSQL jsonb cannot hold"
        );
        let key = json!({"k\u{0}": 1});
        assert!(check_json("insert", "data", &key).unwrap_err().to_string().contains("(key)"));
        check_json("insert", "data", &json!({"a": ["fine", 1.5, null, true]})).unwrap();
    }

    #[test]
    fn an_apply_names_its_first_bad_value_behind_clean_ones() {
        use crate::store::{Lease, LockToken, NewEvent, RelatedUpdate, RowId};
        let lease = Lease { id: RowId(5), token: LockToken(7) };
        let clean = RowUpdate { status: Some("done".into()), data: Some(json!({"a": ["x", {"b": 1}]})) };
        let mut p = ApplyParams::new(lease, clean.clone());
        p.related.push(RelatedUpdate { id: RowId(6), update: clean.clone() });
        p.events.push(NewEvent { row_id: RowId(5), kind: "e".into(), data: json!({"k": "v"}) });
        check_apply(&p).unwrap();
        let bad = RowUpdate { status: None, data: Some(json!({"a": [{"b": "x\u{0}"}]})) };
        p.related.push(RelatedUpdate { id: RowId(8), update: bad });
        p.events.push(NewEvent { row_id: RowId(5), kind: "e".into(), data: json!({"k\u{0}": 1}) });
        assert_eq!(
            check_apply(&p).unwrap_err().to_string(),
            "invalid store call: apply 5#7: related row 8: data.a[0].b contains \\u0000, which PostgreSQL jsonb \
             cannot hold"
        );
        p.related.pop();
        let message = check_apply(&p).unwrap_err().to_string();
        assert!(message.contains("apply 5#7: events[1]: event data.k\\u0000 (key) contains"), "{message}");
        p.events.pop();
        p.inserts.push(NewRow::new("k".repeat(KEY_TEXT_BYTES_MAX + 1), "s", json!({})));
        assert!(check_apply(&p).unwrap_err().to_string().contains("inserts[0]: kind is 1025 bytes"));
    }

    #[test]
    fn keys_past_the_index_bound_are_refused() {
        check_key("insert", "kind", &"k".repeat(KEY_TEXT_BYTES_MAX)).unwrap();
        let message = check_key("insert", "kind", &"k".repeat(KEY_TEXT_BYTES_MAX + 1)).unwrap_err().to_string();
        assert!(message.contains("1025 bytes"), "{message}");
        assert!(check_key("insert", "status", "re\0ady").is_err());
    }

    #[test]
    fn bounded_error_strips_nul_and_cuts_at_a_char_boundary() {
        assert_eq!(bounded_error("a\0b"), "ab");
        let long = "é".repeat(FAILURE_ERROR_BYTES_MAX);
        let cut = bounded_error(&long);
        assert!(cut.len() <= FAILURE_ERROR_BYTES_MAX, "{} bytes", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.len() > FAILURE_ERROR_BYTES_MAX - 8, "{} bytes", cut.len());
    }
}
