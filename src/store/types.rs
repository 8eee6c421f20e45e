//! The row, lease and event shapes that cross the [`Store`](super::Store) seam.
//!
//! One generic resource table holds every kind of row (DESIGN §2, as river keeps one job table): operations, jobs,
//! allocations and nodes are values of [`Row::kind`]. The lease columns are dstack's: `lock_expires_at`,
//! `lock_token`, `lock_owner` (`seeds/dstack-pipelines.md`, Overview).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A row's primary key: `bigint` in PostgreSQL, assigned by the store in insertion order starting at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RowId(pub i64);

impl fmt::Display for RowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The fencing token of a lease: a fresh value from one store-wide sequence at every fetch, so a later lease on
/// the same row always carries a larger token. A write guarded by `id + lock_token` fails once the row was leased
/// again (dstack PIPELINES, "Guarded apply by lock token").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockToken(pub i64);

impl fmt::Display for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A point on the store's clock: microseconds since the Unix epoch, the precision of PostgreSQL's `timestamptz`.
///
/// Every lease timestamp is read from the store's clock (`now()` in PostgreSQL, the injected clock in MemStore),
/// never from a replica's (DESIGN §2, Time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// Microseconds since the Unix epoch.
    pub fn as_micros(self) -> i64 {
        self.0
    }

    /// This instant plus `span`, saturating at the end of the representable range.
    pub fn plus(self, span: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_micros(span)))
    }

    /// This instant minus `span`, saturating at the start of the representable range.
    pub fn minus(self, span: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration_micros(span)))
    }
}

impl Timestamp {
    /// The instant as people read it, in UTC to the millisecond: `2026-12-01 00:28:15.123 UTC` (proleptic Gregorian
    /// calendar; `Display` prints raw Unix seconds instead, as traces and the store's messages do).
    pub fn utc(self) -> String {
        let millis = self.0.div_euclid(1_000);
        let (days, ms_of_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
        let (year, month, day) = civil_from_days(days);
        let (hours, minutes, seconds, ms) =
            (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1_000 % 60, ms_of_day % 1_000);
        format!("{year:04}-{month:02}-{day:02} {hours:02}:{minutes:02}:{seconds:02}.{ms:03} UTC")
    }
}

/// The (year, month, day) of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.div_euclid(1_000_000);
        let micros = self.0.rem_euclid(1_000_000);
        write!(f, "{secs}.{micros:06}")
    }
}

/// `span` in whole microseconds, saturating at `i64::MAX`.
pub fn duration_micros(span: Duration) -> i64 {
    i64::try_from(span.as_micros()).unwrap_or(i64::MAX)
}

/// One row of the resource table, as a store call read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// Primary key.
    pub id: RowId,
    /// Resource kind, e.g. `"operation"`, `"job"`; pipelines fetch one kind.
    pub kind: String,
    /// The row this one belongs to (a job's operation), if any.
    pub parent_id: Option<RowId>,
    /// Free-form state name that pipelines filter on, e.g. `"pending"`.
    pub status: String,
    /// The kind's own fields (`jsonb` in PostgreSQL).
    pub data: serde_json::Value,
    /// Store time of the insert.
    pub created_at: Timestamp,
    /// Store time of the last write to this row (insert, apply, related update).
    pub updated_at: Timestamp,
    /// The version of the row's status and data: it changes at every write of either (and may change at other
    /// writes), so two reads of a row with the same `(version, updated_at)` read the same status and data, and a
    /// reader may keep what it decoded from them (a controller pass decodes only the jobs and
    /// allocations that changed since its last pass). MemStore: a store-wide counter of such writes. PostgreSQL:
    /// the `xmin` of the row's current tuple (the transaction that wrote it; every update writes a new tuple), a
    /// 32-bit transaction id that wraps around, hence the pair with `updated_at`. Compare it only for equality.
    #[serde(default)]
    pub version: i64,
    /// Store time of the last successful apply or reset-and-retry; `None` for a row never processed.
    pub last_processed_at: Option<Timestamp>,
    /// Store time at which the current lease ends; `None` when no lease is held.
    pub lock_expires_at: Option<Timestamp>,
    /// Fencing token of the current lease; `None` when no lease is held.
    pub lock_token: Option<LockToken>,
    /// Pipeline (or `Pipeline:{item_id}`) that owns the row; kept across reset-and-retry.
    pub lock_owner: Option<String>,
    /// Set by a fetch hint naming this row: the next fetch takes it without waiting `min_processing_interval`.
    pub hinted: bool,
    /// Failures recorded since the row's last successful apply ([`Store::record_failure`] adds one, an apply
    /// resets it to 0): the attempt number of the last failure in a row (river's `attempt`).
    ///
    /// [`Store::record_failure`]: super::Store::record_failure
    pub attempts: u32,
    /// The last [`FAILURE_ERRORS_KEPT`](super::FAILURE_ERRORS_KEPT) failures recorded on the row, oldest first;
    /// kept across applies, so a row that failed and then gave up or succeeded still says why it failed.
    pub errors: Vec<AttemptError>,
    /// Store time before which no fetch takes the row, set by a failure's backoff; a fetch hint does not bypass
    /// it. `None` (or a past time) puts no bound.
    pub not_before: Option<Timestamp>,
}

/// One failure a row records (river's `errors`, graphile-worker's `last_error`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt that failed: [`Row::attempts`] after it was recorded, from 1.
    pub attempt: u32,
    /// Store time of the record.
    pub at: Timestamp,
    /// What went wrong, bounded to [`FAILURE_ERROR_BYTES_MAX`](super::FAILURE_ERROR_BYTES_MAX) bytes, NUL removed.
    pub error: String,
}

/// A row to insert. The store assigns `id`, `created_at` and `updated_at`; the row starts unleased and unprocessed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewRow {
    /// Resource kind.
    pub kind: String,
    /// Parent row, if any.
    pub parent_id: Option<RowId>,
    /// Initial status.
    pub status: String,
    /// Initial data.
    pub data: serde_json::Value,
}

impl NewRow {
    /// A parentless row of `kind` in `status` with `data`.
    pub fn new(kind: impl Into<String>, status: impl Into<String>, data: serde_json::Value) -> NewRow {
        NewRow { kind: kind.into(), parent_id: None, status: status.into(), data }
    }

    /// The same row with `parent` as its parent.
    pub fn with_parent(mut self, parent: RowId) -> NewRow {
        self.parent_id = Some(parent);
        self
    }

    /// The row a store holds after inserting this one as `id` at `now` (store time): created and updated at `now`,
    /// never processed, unleased, not hinted, with no failed attempts, at version 0 (MemStore sets its own).
    pub fn into_row(self, id: RowId, now: Timestamp) -> Row {
        Row {
            id,
            kind: self.kind,
            parent_id: self.parent_id,
            status: self.status,
            data: self.data,
            created_at: now,
            updated_at: now,
            version: 0,
            last_processed_at: None,
            lock_expires_at: None,
            lock_token: None,
            lock_owner: None,
            hinted: false,
            attempts: 0,
            errors: Vec::new(),
            not_before: None,
        }
    }
}

/// Parameters of [`Store::insert_keyed`](super::Store::insert_keyed): an insert made at most once per key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InsertKeyedParams {
    /// The idempotency key: the caller's name for this one insert (a submit's `--key`, or one the client made).
    /// The store keeps it for good, so the key names one row for the life of the store. Non-empty text of at most
    /// [`KEY_TEXT_BYTES_MAX`](super::KEY_TEXT_BYTES_MAX) bytes, no NUL.
    pub key: String,
    /// The row to insert unless `key` names one already.
    pub row: NewRow,
}

/// What [`Store::insert_keyed`](super::Store::insert_keyed) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedInsert {
    /// The row the key names: the one this call inserted, or the one an earlier call with the key inserted.
    pub id: RowId,
    /// Whether this call inserted it (false: the key named a row already, and nothing was inserted).
    pub inserted: bool,
}

/// Changes to one row's own columns; `None` leaves a column as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowUpdate {
    /// New status.
    pub status: Option<String>,
    /// New data, replacing the old value whole.
    pub data: Option<serde_json::Value>,
}

impl RowUpdate {
    /// An update that sets only the status.
    pub fn status(status: impl Into<String>) -> RowUpdate {
        RowUpdate { status: Some(status.into()), data: None }
    }
}

/// An event appended to the `events` table in the same transaction as the apply that caused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    /// The row the event is about.
    pub row_id: RowId,
    /// Event kind, e.g. `"status_changed"`, `"incarnation_started"`.
    pub kind: String,
    /// Event fields.
    pub data: serde_json::Value,
}

/// A stored event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the store-wide event sequence, starting at 1.
    pub seq: i64,
    /// The row the event is about.
    pub row_id: RowId,
    /// Event kind.
    pub kind: String,
    /// Event fields.
    pub data: serde_json::Value,
    /// Store time of the transaction that wrote it (the apply's one `now`).
    pub at: Timestamp,
}

/// A lease as its holder knows it: the row and the fencing token it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The leased row.
    pub id: RowId,
    /// The token the fetch set on it.
    pub token: LockToken,
}

/// Parameters of [`Store::fetch`](super::Store::fetch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchParams {
    /// Pipeline name, written to `lock_owner`; a row owned by another pipeline with no live lease is skipped.
    pub pipeline: String,
    /// Row kind to fetch.
    pub kind: String,
    /// Statuses a row must have to be eligible (the pipeline's status filter); must not be empty.
    pub statuses: Vec<String>,
    /// Most rows to lease in this call.
    pub limit: usize,
    /// Lease length on the store's clock: `lock_expires_at = now + lease_ttl`.
    pub lease_ttl: Duration,
    /// A processed row is eligible again only this long after its `last_processed_at`; new rows, hinted rows
    /// and rows this pipeline reset for retry (after `retry_delay`) skip it.
    pub min_processing_interval: Duration,
    /// A row this pipeline reset for retry is eligible again this long after the reset.
    pub retry_delay: Duration,
}

/// Parameters of [`Store::heartbeat`](super::Store::heartbeat).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatParams {
    /// Leases to extend. Related rows locked with the same tokens are extended with them.
    pub leases: Vec<Lease>,
    /// New lease length from the store's `now`.
    pub lease_ttl: Duration,
}

/// Parameters of [`Store::lock_related`](super::Store::lock_related).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRelatedParams {
    /// The main lease the related locks belong to; they carry its token and are extended and released with it.
    pub holder: Lease,
    /// Rows to lock, all or none.
    pub related: Vec<RowId>,
    /// Owner written to the related rows: the pipeline name for children a parent must hold all of, or
    /// `Pipeline:{item_id}` for a resource shared by several items (dstack PIPELINES, related locks).
    pub owner: String,
    /// Lease length of the related locks and of the intent marks left on contention.
    pub lease_ttl: Duration,
    /// How long a contended holder's row waits before a fetch may take it again, when the call resets it
    /// ([`Store::lock_related_or_reset`](super::Store::lock_related_or_reset)); the pipeline's `retry_delay`.
    pub retry_delay: Duration,
    /// Park instead of reset (DESIGN §3, "Parked waiters"): on contention the store records the holder as a waiter
    /// on every unavailable row, so that the write that frees one (its holder's apply, reset, release or failure)
    /// publishes a [`wake_hint`] naming it, and `lock_related_or_reset` / `lock_related_and_read` leave the
    /// holder's lease as it is and answer [`LockAttempt::Parked`] / [`LockRead::Parked`]. False: the calls reset
    /// on contention, as they always did.
    pub park: bool,
}

/// The prefix of a wake hint ([`wake_hint`]): a hint whose text starts with it names rows, not a kind.
pub const WAKE_HINT_PREFIX: &str = "lock_waits:";

/// The hint a write that frees rows some parked waiter waits on publishes (DESIGN §3, "Parked waiters"):
/// `lock_waits:4,9`, the rows by id. It travels as fetch hints do (PostgreSQL: `NOTIFY` from the trigger of
/// migration 0009, sent at the freeing write's commit). A kind named with this prefix would be taken for one.
pub fn wake_hint(rows: &[RowId]) -> super::Hint {
    let mut text = String::from(WAKE_HINT_PREFIX);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&row.0.to_string());
    }
    text
}

/// The rows a [`wake_hint`] names; `None` for any other hint (a kind). Ids that do not parse are skipped.
pub fn parse_wake_hint(hint: &str) -> Option<Vec<RowId>> {
    let rows = hint.strip_prefix(WAKE_HINT_PREFIX)?;
    Some(rows.split(',').filter_map(|id| id.trim().parse().ok()).map(RowId).collect())
}

/// The owner of a related row shared by several items of one pipeline, `{pipeline}:{item}` (dstack PIPELINES,
/// "Locking a shared related resource"), as [`LoadCx::lock_shared`](crate::pipeline::LoadCx::lock_shared) writes
/// it. Pipeline names hold no `:` ([`PipelineConfig::validate`](crate::pipeline::PipelineConfig::validate)), so
/// [`parse_shared_owner`] reads it back one way.
pub fn shared_owner(pipeline: &str, item: RowId) -> String {
    format!("{pipeline}:{item}")
}

/// The pipeline and item of a [`shared_owner`] text; `None` for any other owner (a pipeline name).
pub fn parse_shared_owner(owner: &str) -> Option<(&str, RowId)> {
    let (pipeline, item) = owner.split_once(':')?;
    Some((pipeline, RowId(item.parse().ok()?)))
}

/// Whether a related row is available to a related lock by `owner` for the lease with token `holder`: the one
/// rule of both backends (MemStore's `lock_related`, PgStore's availability read). `live`: the row's
/// `lock_expires_at` is unset or still ahead of the store's clock.
///
/// - a row locked with `holder` is available; one locked with another token only once that lock expired;
/// - a row with no token (free, an intent mark, a reset mark) is available when it carries no owner, `owner`
///   itself, or an expired mark;
/// - a shared lock (`owner` = `{pipeline}:{item}`) also takes a row marked with its own pipeline's name: a row
///   that pipeline reset for retry, or marked for a parent of its own. Without it, two items of one pipeline that
///   each lock the other's row as shared found each other's reset marks and never finished (a new user's trial;
///   `lock_related`, whose owner is the pipeline's name, always took them);
/// - and a fresh intent mark of a younger item (a shared owner whose item id is larger, of any pipeline) yields to
///   an older one: without it two items that each need two shared rows can mark one each and hold each other off
///   until the marks expire, again and again (a livelock a new user's trial found, first within one pipeline,
///   then between two pipelines sharing counters). Item ids are row ids, unique across pipelines, so ordered by
///   them the oldest contender's marks are never taken from it, it locks all its rows once their leases end, and
///   marks form no cycle.
pub(crate) fn related_available(
    lock_token: Option<LockToken>,
    lock_owner: Option<&str>,
    live: bool,
    holder: LockToken,
    owner: &str,
) -> bool {
    match (lock_token, lock_owner) {
        (Some(token), _) => token == holder || !live,
        (None, None) => true,
        (None, Some(mark)) => mark == owner || !live || own_pipelines_mark(mark, owner) || younger_mark(mark, owner),
    }
}

/// Whether a related row that a lock by `owner` found unavailable, with lock token `lock_token` and lock owner
/// `held_by`, is held by `owner`'s own pipeline: it carries a token (a lease or a lock, not an intent mark) and the
/// two owners name the same pipeline, as a plain name or as the `pipeline:item` of a shared lock (pipeline names
/// hold no ':').
pub(crate) fn held_by_own_pipeline(lock_token: Option<LockToken>, held_by: Option<&str>, owner: &str) -> bool {
    let pipeline = |owner: &str| owner.split(':').next().unwrap_or(owner).to_string();
    lock_token.is_some() && held_by.is_some_and(|held_by| pipeline(held_by) == pipeline(owner))
}

/// Whether `mark` is the plain name of the pipeline of `owner`, a shared owner.
fn own_pipelines_mark(mark: &str, owner: &str) -> bool {
    parse_shared_owner(owner).is_some_and(|(pipeline, _)| mark == pipeline)
}

/// Whether `mark` is the shared owner of an item younger than `owner`'s (of any pipeline).
fn younger_mark(mark: &str, owner: &str) -> bool {
    match (parse_shared_owner(mark), parse_shared_owner(owner)) {
        (Some((_, marked_item)), Some((_, item))) => marked_item > item,
        _ => false,
    }
}

/// Parameters of [`Store::purge`](super::Store::purge): which finished rows retention deletes, and how many at most
/// in one call (river's job cleaner, pgmq's archive: a queue table that keeps every finished row grows for good).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeParams {
    /// The kind of the rows to delete.
    pub kind: String,
    /// Their statuses: the kind's final statuses, which no pipeline fetches and no write API changes any more.
    /// Must not be empty.
    pub statuses: Vec<String>,
    /// Age on the store's clock: a row is deleted only once its `updated_at` is at least this far in the past.
    pub older_than: Duration,
    /// The statuses its parent must be in: with any, a row is deleted only if it has a parent in one of them (a
    /// child kind that its parent reads while the parent lives goes once the parent is final: the gang
    /// controller's jobs once their operation ended). Empty: whatever its parent, or none.
    pub parent_statuses: Vec<String>,
    /// Most rows to delete in this call, oldest id first (1 to [`PURGE_LIMIT_MAX`]): a call holds the locks of
    /// the rows it deletes, and nothing else, for one short transaction.
    pub limit: usize,
}

/// The most rows one [`Store::purge`](super::Store::purge) call deletes.
pub const PURGE_LIMIT_MAX: usize = 10_000;

/// A change to a related row, applied under the main lease's guard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelatedUpdate {
    /// The related row, which must still be locked with the holder's token.
    pub id: RowId,
    /// Its changes.
    pub update: RowUpdate,
}

/// A fetch hint that a write publishes when it commits ([`ApplyParams::hints`], a handler's `Changes::hints`): it
/// wakes the fetchers of `kind` on every replica, and with `row` it also marks that row hinted, so that its next
/// fetch takes it without waiting `min_processing_interval`, as [`Store::hint`](super::Store::hint) does.
///
/// `"job".into()` makes a hint of a kind alone; [`NewHint::row`] one that names a row.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NewHint {
    /// The kind whose fetchers wake.
    pub kind: String,
    /// The row to mark hinted, if any.
    pub row: Option<RowId>,
}

impl NewHint {
    /// A hint of `kind` that marks row `id` hinted.
    pub fn row(kind: impl Into<String>, id: RowId) -> NewHint {
        NewHint { kind: kind.into(), row: Some(id) }
    }

    /// The hints of an enqueue: one per kind of `rows`, in the order the kinds first appear, naming no row (a new
    /// row is fetched without waiting `min_processing_interval`, DESIGN §2, Eligibility). What
    /// `PgStore::insert_in` publishes at the caller's commit, and what a caller of
    /// [`Store::insert_many`](super::Store::insert_many) passes to model it on any store (docs/real-mode.md,
    /// "Enqueue in your own transaction").
    pub fn kinds_of(rows: &[NewRow]) -> Vec<NewHint> {
        let mut hints: Vec<NewHint> = Vec::new();
        for row in rows {
            if !hints.iter().any(|hint| hint.kind == row.kind) {
                hints.push(NewHint::from(row.kind.as_str()));
            }
        }
        hints
    }
}

impl From<&str> for NewHint {
    fn from(kind: &str) -> NewHint {
        NewHint { kind: kind.to_string(), row: None }
    }
}

impl From<String> for NewHint {
    fn from(kind: String) -> NewHint {
        NewHint { kind, row: None }
    }
}

/// Parameters of [`Store::apply`](super::Store::apply): the result of processing one leased row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyParams {
    /// The guard: the main row and the token its worker holds.
    pub lease: Lease,
    /// Changes to the main row.
    pub update: RowUpdate,
    /// Changes to related rows locked with the same token; every related row locked with it is unlocked.
    pub related: Vec<RelatedUpdate>,
    /// Related rows locked with the same token whose lock the apply relies on though it need not update them (a
    /// parent that read its children under their locks): each must still carry the token at apply, as the rows of
    /// `related` must, else the apply is `Stale` and writes nothing. A related lock that expired while its holder
    /// stalled may have gone to the row's own pipeline, which may have changed the row: what the holder read is
    /// then not what it would apply to. The engine gives every row the item locked through its
    /// [`LoadCx`](crate::pipeline::LoadCx); ids may repeat and may also be in `related`.
    pub locked: Vec<RowId>,
    /// Rows to create in the same transaction.
    pub inserts: Vec<NewRow>,
    /// Events to append in the same transaction.
    pub events: Vec<NewEvent>,
    /// Fetch hints to publish if, and once, the apply commits: each as [`Store::hint`](super::Store::hint) would
    /// (a row named is marked hinted in the apply's transaction), each kind published once per call however many
    /// items of a batch name it, as PostgreSQL delivers one `NOTIFY` per channel and payload per transaction. A
    /// stale apply publishes none (dstack PIPELINES, checklist 8: hint the pipelines a change concerns;
    /// in the apply, not in a call of its own after it).
    pub hints: Vec<NewHint>,
}

impl ApplyParams {
    /// Every related row the apply's guard covers: the rows of `related` and of `locked`, by id, each once.
    pub fn guarded_related(&self) -> Vec<RowId> {
        let mut ids: Vec<RowId> = self.related.iter().map(|r| r.id).chain(self.locked.iter().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// An apply of `update` to the leased row with no related rows, inserts, events or hints.
    pub fn new(lease: Lease, update: RowUpdate) -> ApplyParams {
        ApplyParams {
            lease,
            update,
            related: Vec::new(),
            locked: Vec::new(),
            inserts: Vec::new(),
            events: Vec::new(),
            hints: Vec::new(),
        }
    }
}

/// What a guarded apply did (STYLE: a result the protocol expects is a value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Everything was written; the main row and its related rows are unlocked. Holds the ids given to
    /// `inserts`, in order, and the transaction's one `now`.
    Applied {
        /// The ids given to [`ApplyParams::inserts`], in their order.
        inserted: Vec<RowId>,
        /// The transaction's `now` (store time), as written to `processed_at` and the events' times.
        now: Timestamp,
    },
    /// The main row (or a related row of `related` or `locked`) no longer carries the token: nothing was written.
    Stale,
}

/// What [`Store::lock_related`](super::Store::lock_related) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOutcome {
    /// Every related row is now locked with the holder's token.
    Locked,
    /// Some related row is held by someone else: no lock was taken, but the free rows were marked with the
    /// owner (no token, expiring after the lease ttl) so that their own pipelines leave them to this owner.
    /// `by_own_pipeline`: every row that was not available is locked, under a live token, by an owner of the lock
    /// owner's own pipeline (`held_by_own_pipeline`), that is by another of its items at work, in this replica
    /// or another (an intent mark, which carries no token, is no such hold); its holders can then work through
    /// the same backlog (the engine's contention backoff,
    /// `Shared::backs_off_for_contention`).
    Contended {
        /// Whether every unavailable row is held, under a live token, by an item of the owner's own pipeline
        /// (see above).
        by_own_pipeline: bool,
    },
    /// The holder's lease is no longer current: nothing was written.
    Stale,
}

/// What [`Store::lock_related_or_reset`](super::Store::lock_related_or_reset) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockAttempt {
    /// Every related row is now locked with the holder's token.
    Locked,
    /// A related row was held by someone else (the lock was contended, and marked the free rows as
    /// [`LockOutcome::Contended`] says); then the holder's lease was reset for retry. `held`: whether the lease
    /// was still held at the reset (else nothing was reset); `by_own_pipeline` as the contended lock's.
    Reset {
        /// Whether the holder's lease was still held at the reset (else nothing was reset).
        held: bool,
        /// As [`LockOutcome::Contended::by_own_pipeline`]: the unavailable rows are held by items of the
        /// owner's own pipeline.
        by_own_pipeline: bool,
    },
    /// With [`LockRelatedParams::park`]: a related row was held by someone else (the lock was contended and
    /// marked the free rows as [`LockOutcome::Contended`] says), the holder was recorded as a waiter on each
    /// unavailable row, and its lease was left as it is. `until`: the longest span, from the store's `now`, until
    /// the locks or marks of the unavailable rows expire (`None` when one has no expiry: a row reset for retry by
    /// its own pipeline, which frees it only by its apply).
    Parked {
        /// Longest span until an unavailable row's lock or mark expires (see above).
        until: Option<Duration>,
        /// As [`LockOutcome::Contended::by_own_pipeline`].
        by_own_pipeline: bool,
    },
    /// The holder's lease is no longer current: nothing was written.
    Stale,
}

/// What [`Store::lock_related_and_read`](super::Store::lock_related_and_read) did: a
/// [`Store::lock_related_or_reset`](super::Store::lock_related_or_reset) that brings back the rows it locked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockRead {
    /// Every related row is now locked with the holder's token; here they are as the lock left them (the lock
    /// columns written, nothing else changed since), by id, each once.
    Locked(Vec<Row>),
    /// As [`LockAttempt::Reset`]: contended, and the holder's lease reset for retry (`held`: whether it still was;
    /// `by_own_pipeline` as the contended lock's).
    Reset {
        /// As [`LockAttempt::Reset::held`]: whether the holder's lease was still held at the reset.
        held: bool,
        /// As [`LockAttempt::Reset::by_own_pipeline`].
        by_own_pipeline: bool,
    },
    /// As [`LockAttempt::Parked`]: contended, the holder recorded as a waiter and its lease left as it is.
    Parked {
        /// As [`LockAttempt::Parked::until`].
        until: Option<Duration>,
        /// As [`LockAttempt::Parked::by_own_pipeline`].
        by_own_pipeline: bool,
    },
    /// As [`LockAttempt::Stale`]: the holder's lease is no longer current, nothing was written.
    Stale,
}

/// Parameters of [`Store::record_failure`](super::Store::record_failure): a leased item failed, and how it goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureParams {
    /// The guard: the failed row and the token its worker holds.
    pub lease: Lease,
    /// Why it failed; the store keeps it bounded (see [`bounded_error`](super::bounded_error)).
    pub error: String,
    /// Whether the row is tried again, and when.
    pub retry: Retry,
}

/// What becomes of a failed row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Tried again: no fetch takes the row before the store's `now` plus this span.
    After(Duration),
    /// Not tried again: the row takes this terminal status (the pipeline's failed status, e.g. `failed`).
    GiveUp {
        /// The status to set.
        status: String,
    },
}

/// What [`Store::record_failure`](super::Store::record_failure) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureOutcome {
    /// The failure was written; the row now counts `attempts` failures in a row.
    Recorded {
        /// The row's [`Row::attempts`] after the write.
        attempts: u32,
    },
    /// The row no longer carries the token: nothing was written.
    Stale,
}

/// What [`Store::update_unleased`](super::Store::update_unleased) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// The row had no live lease and was updated.
    Written,
    /// The row is leased (or marked by an owner); retry later (DESIGN §3, write APIs respect leases).
    Busy,
    /// No such row.
    Missing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_prints_the_calendar_date_and_time() {
        assert_eq!(Timestamp::EPOCH.utc(), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(Timestamp(1_796_093_096_567_662).utc(), "2026-12-01 02:44:56.567 UTC");
        assert_eq!(Timestamp(951_782_400_000_000).utc(), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(Timestamp(-1_000).utc(), "1969-12-31 23:59:59.999 UTC");
    }

    #[test]
    fn a_shared_owner_reads_back_and_nothing_else_does() {
        assert_eq!(shared_owner("jobs", RowId(42)), "jobs:42");
        assert_eq!(parse_shared_owner("jobs:42"), Some(("jobs", RowId(42))));
        assert_eq!(parse_shared_owner("jobs"), None);
        assert_eq!(parse_shared_owner("jobs:x"), None);
    }

    #[test]
    fn a_younger_items_fresh_mark_of_any_pipeline_and_the_pipelines_own_mark_give_way() {
        let (holder, other) = (LockToken(7), LockToken(8));
        let available = |token, owner, live| related_available(token, owner, live, holder, "jobs:5");
        assert!(available(None, None, true), "a free row");
        assert!(available(None, Some("jobs:5"), true), "its own mark");
        assert!(available(None, Some("jobs:6"), true), "a younger item's mark");
        assert!(!available(None, Some("jobs:4"), true), "an older item's mark");
        assert!(available(None, Some("jobs:4"), false), "an older item's expired mark");
        assert!(available(None, Some("nodes:6"), true), "another pipeline's younger item's mark");
        assert!(!available(None, Some("nodes:4"), true), "another pipeline's older item's mark");
        assert!(available(None, Some("jobs"), true), "the pipeline's own reset or parent mark");
        assert!(!available(None, Some("nodes"), true), "another pipeline's reset or parent mark");
        assert!(available(Some(holder), Some("jobs:5"), true), "its own lock");
        assert!(!available(Some(other), Some("jobs:6"), true), "a younger item's lock");
        assert!(available(Some(other), Some("jobs:6"), false), "an expired lock");
    }
}

/// One indexed read of [`Store::query`](super::Store::query): the rows of `kind` that pass every filter given, by
/// id. A filter left `None` does not filter. Each filter is served by an index in every backend (MemStore's
/// `BTreeMap`s; PostgreSQL's `resources_parent_status_idx`, `resources_parent_idx`, `resources_fetch_idx` with
/// `resources_lease_expiry_idx`, and the primary key), so a read costs what it returns, not what the table holds
/// (a controller pass reads the current incarnation's jobs, the undone inbox and the allocations it may
/// use, not every row of their kinds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowQuery {
    /// Resource kind.
    pub kind: String,
    /// Only the children of this row.
    pub parent: Option<RowId>,
    /// Only rows in one of these statuses (an empty list matches nothing).
    pub statuses: Option<Vec<String>>,
    /// Only rows whose id is greater than this one (a keyset cursor: rows inserted later have larger ids).
    pub after: Option<RowId>,
    /// Only these rows (ids missing from the table, or of another kind, are left out; duplicates read once).
    pub ids: Option<Vec<RowId>>,
}

impl RowQuery {
    /// Every row of `kind`.
    pub fn new(kind: impl Into<String>) -> RowQuery {
        RowQuery { kind: kind.into(), ..RowQuery::default() }
    }

    /// The same query, only the children of `parent`.
    pub fn parent(mut self, parent: RowId) -> RowQuery {
        self.parent = Some(parent);
        self
    }

    /// The same query, only rows in one of `statuses`.
    pub fn statuses<T: Into<String>>(mut self, statuses: impl IntoIterator<Item = T>) -> RowQuery {
        self.statuses = Some(statuses.into_iter().map(Into::into).collect());
        self
    }

    /// The same query, only rows with an id greater than `after` (no filter when `None`).
    pub fn after(mut self, after: Option<RowId>) -> RowQuery {
        self.after = after;
        self
    }

    /// The same query, only the rows `ids`.
    pub fn ids(mut self, ids: impl IntoIterator<Item = RowId>) -> RowQuery {
        self.ids = Some(ids.into_iter().collect());
        self
    }

    /// Whether `row` passes every filter of the query (the rule every backend implements).
    pub fn matches(&self, row: &Row) -> bool {
        row.kind == self.kind
            && self.parent.is_none_or(|parent| row.parent_id == Some(parent))
            && self.statuses.as_ref().is_none_or(|statuses| statuses.contains(&row.status))
            && self.after.is_none_or(|after| row.id > after)
            && self.ids.as_ref().is_none_or(|ids| ids.contains(&row.id))
    }
}
