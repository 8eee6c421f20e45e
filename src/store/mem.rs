//! MemStore: the store in process memory, with PostgreSQL's semantics and an injected clock (DESIGN §2).
//!
//! One mutex makes every call one atomic transaction, which is what `SELECT … FOR NO KEY UPDATE SKIP LOCKED`
//! plus an `UPDATE` in one transaction give row by row. It is the embedded default and the simulator's database,
//! and it can keep a commit history: the record the simulator's checkers read instead of trusting replicas.

use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Most commits a history keeps; a run that writes more is a runaway and fails loudly.
const HISTORY_LEN_MAX: usize = 20_000_000;

/// The in-memory store. Clones share one database.
#[derive(Clone)]
pub struct MemStore {
    inner: Arc<Inner>,
    /// Who makes the calls through this handle, recorded in its commits (see [`MemStore::as_caller`]).
    caller: Option<Arc<str>>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    hints: broadcast::Sender<Hint>,
    /// The mutation switch of [`MemStore::disable_apply_guard_for_mutation_test`].
    apply_guard_disabled: AtomicBool,
    /// The mutation switch of [`MemStore::disable_related_age_rule_for_mutation_test`].
    related_age_rule_disabled: AtomicBool,
}

/// A row's place in fetch order: `last_processed_at` (never-processed first), then id.
type FetchKey = (Option<Timestamp>, RowId);

/// The rows, by id. Ids are given in insert order from 1 and a deleted row ([`Store::purge`]) leaves its slot
/// empty, so row `id` is at index `id − 1` of a vector: a lookup is an index, not a search of a map (a fetch reads
/// a row per candidate it scans, and every call reads or writes rows by id).
#[derive(Default)]
struct Rows(Vec<Option<Row>>);

impl Rows {
    /// Row `id`, if the store gave that id and has not deleted the row.
    fn get(&self, id: &RowId) -> Option<&Row> {
        let index = usize::try_from(id.0).ok()?.checked_sub(1)?;
        self.0.get(index)?.as_ref()
    }

    /// Row `id` to write, if the store gave that id and has not deleted the row.
    fn get_mut(&mut self, id: &RowId) -> Option<&mut Row> {
        let index = usize::try_from(id.0).ok()?.checked_sub(1)?;
        self.0.get_mut(index)?.as_mut()
    }

    /// Appends `row`, which must carry the next id.
    fn push(&mut self, row: Row) {
        let next = RowId(self.0.len() as i64 + 1);
        assert_eq!(row.id, next, "row {} inserted where the next id is {next}", row.id);
        self.0.push(Some(row));
    }

    /// Deletes row `id`, returning it.
    fn remove(&mut self, id: &RowId) -> Option<Row> {
        let index = usize::try_from(id.0).ok()?.checked_sub(1)?;
        self.0.get_mut(index)?.take()
    }

    /// Every row, by id.
    fn values(&self) -> impl Iterator<Item = &Row> {
        self.0.iter().flatten()
    }
}

impl std::ops::Index<&RowId> for Rows {
    type Output = Row;

    fn index(&self, id: &RowId) -> &Row {
        self.get(id).unwrap_or_else(|| panic!("row {id} does not exist"))
    }
}

/// The set under `key` in `map`, added empty if there is none: a new string only for a key not seen before (a map
/// keyed by `String` otherwise takes one per `entry`, and every insert and status write goes through here).
fn set_for<'a, K: Ord>(map: &'a mut BTreeMap<String, BTreeSet<K>>, key: &str) -> &'a mut BTreeSet<K> {
    if !map.contains_key(key) {
        map.insert(key.to_string(), BTreeSet::new());
    }
    map.get_mut(key).expect("key just added")
}

/// Rows by kind, then status: in fetch order ([`FetchKey`]) for [`State::by_status`], by id for each parent's
/// [`State::by_parent_status`]. Nested rather than keyed by a `(kind, status)` pair, so that a lookup borrows the
/// caller's strings: a pair key is two new strings per lookup, and every fetch, apply and status write looks up
///.
struct StatusIndex<K>(BTreeMap<String, BTreeMap<String, BTreeSet<K>>>);

impl<K> Default for StatusIndex<K> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K: Ord> StatusIndex<K> {
    /// The rows of `kind` in `status`, if there are any.
    fn get(&self, kind: &str, status: &str) -> Option<&BTreeSet<K>> {
        self.0.get(kind)?.get(status)
    }

    /// The rows of `kind` in `status` to change, if there are any.
    fn get_mut(&mut self, kind: &str, status: &str) -> Option<&mut BTreeSet<K>> {
        self.0.get_mut(kind)?.get_mut(status)
    }

    /// Adds `key` to the rows of `kind` in `status` (new strings only for a kind or status not seen before).
    fn insert(&mut self, kind: &str, status: &str, key: K) {
        if !self.0.contains_key(kind) {
            self.0.insert(kind.to_string(), BTreeMap::new());
        }
        let statuses = self.0.get_mut(kind).expect("kind just added");
        set_for(statuses, status).insert(key);
    }

    /// Removes `key` from the rows of `kind` in `status`, and the status once it holds none; whether it was there.
    /// The kind stays, even empty: a row moving between statuses removes before it inserts, and dropping the last
    /// row's kind would make the insert allocate it again.
    fn remove(&mut self, kind: &str, status: &str, key: &K) -> bool {
        let Some(statuses) = self.0.get_mut(kind) else { return false };
        let Some(rows) = statuses.get_mut(status) else { return false };
        let removed = rows.remove(key);
        if rows.is_empty() {
            statuses.remove(status);
        }
        removed
    }
}

#[derive(Default)]
struct State {
    rows: Rows,
    /// Rows of each kind, so a list scans one kind.
    by_kind: BTreeMap<String, BTreeSet<RowId>>,
    /// Rows of each kind and status in fetch order (`last_processed_at`, never-processed first, then `id`), so a
    /// fetch reads only rows its status filter admits and stops after `limit` eligible ones, as the index of a
    /// PostgreSQL fetch lets it (without it the simulator spends most of its time in fetch scans, and a backlog of
    /// ready rows makes every fetch sort all of them).
    by_status: StatusIndex<FetchKey>,
    /// Rows carrying each token: a main row and the related rows locked with its token.
    by_token: BTreeMap<LockToken, BTreeSet<RowId>>,
    /// Rows whose token a related lock wrote ([`Store::lock_related`]), not a fetch: PostgreSQL's `related_token`
    /// column. Every other write of a row's token (a fetch, a mark, an unlock) takes the row out. A write API that
    /// takes over an expired lock clears only these rows of its token, never the lease's own row.
    related_locked: BTreeSet<RowId>,
    /// The row each key of [`Store::insert_keyed`] names (PostgreSQL's `insert_keys`); kept for good, as rows are.
    insert_keys: BTreeMap<String, RowId>,
    /// Children of each parent, then kind, by id: a parent's `list` and `query` read only its children, as
    /// PostgreSQL's `resources_parent_idx` lets them. Nested like [`StatusIndex`], so that a lookup
    /// borrows the kind.
    by_parent: BTreeMap<RowId, BTreeMap<String, BTreeSet<RowId>>>,
    /// Children of each parent, then kind and status, by id: a query for a parent's rows in some statuses (an
    /// operation's undone inbox) reads only those, as `resources_parent_status_idx` lets PostgreSQL.
    by_parent_status: BTreeMap<RowId, StatusIndex<RowId>>,
    events: Vec<Event>,
    next_id: i64,
    next_token: i64,
    /// The last [`Row::version`] given: every insert and every write of a status or data takes the next one.
    version: i64,
    history: Option<Vec<Commit>>,
    /// Rows some parked waiter waits on ([`LockRelatedParams::park`]; PostgreSQL's `lock_waited` column): the
    /// write that clears such a row's token wakes its waiters ([`State::woken`]).
    waited: BTreeSet<RowId>,
    /// Waited rows whose token the call being made cleared: published as one [`wake_hint`] when it commits
    /// ([`State::record`]).
    woken: Vec<RowId>,
    /// Where wake hints go: the store's hint channel (set at construction).
    wakes: Option<broadcast::Sender<Hint>>,
}

/// One committed store call, as the simulator's checkers and traces read it. Reads are not recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The call's one `now`.
    pub at: Timestamp,
    /// Who made the call, when the handle was labelled with [`MemStore::as_caller`] (the simulator's node).
    pub caller: Option<Arc<str>>,
    /// What it did.
    pub op: CommitOp,
}

/// The write a [`Commit`] records (as JSON in PgStore's chaos-mode history).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CommitOp {
    /// Leases a fetch handed out.
    Fetch {
        /// The fetching pipeline ([`FetchParams::pipeline`]), now each row's `lock_owner`.
        pipeline: String,
        /// One lease per row taken, each with the token the fetch wrote, in the order the fetch returned them
        /// (empty when it found nothing).
        leases: Vec<Lease>,
    },
    /// Leases a heartbeat extended.
    Heartbeat {
        /// The leases of the call still live and so extended, in the caller's order; the ones it asked for that
        /// had expired or been taken over are left out.
        held: Vec<Lease>,
    },
    /// A related lock attempt and its outcome.
    LockRelated {
        /// The lease whose token the related rows were to carry ([`LockRelatedParams::holder`]).
        holder: Lease,
        /// The rows asked for, as the caller gave them.
        related: Vec<RowId>,
        /// The lock owner written on them (or, when contended, the intent mark on the free ones).
        owner: String,
        /// What the attempt did.
        outcome: LockOutcome,
    },
    /// A guarded apply: `applied` is false when it was stale and wrote nothing.
    Apply {
        /// The guard: the main row and the token its worker held.
        lease: Lease,
        /// Whether it wrote ([`ApplyOutcome::Applied`]) or was stale ([`ApplyOutcome::Stale`]).
        applied: bool,
        /// Applied: every other row the token held, now unlocked (the related rows locked by the item, updated
        /// or not). Stale: the related rows the apply would have updated.
        related: Vec<RowId>,
        /// The ids given to the apply's inserts, in order (empty when stale).
        inserted: Vec<RowId>,
    },
    /// A recorded failure ([`Store::record_failure`]): `attempts` is the row's count after it, `None` when the
    /// lease was already gone and nothing was written; `gave_up` when the row took its terminal status.
    Failure {
        /// The guard of the failed item.
        lease: Lease,
        /// The row's failed-attempt count after the call; `None` when the lease was gone and nothing was written.
        attempts: Option<u32>,
        /// Whether the row took its terminal status ([`Retry::GiveUp`]) rather than waiting for a retry.
        gave_up: bool,
    },
    /// A reset-and-retry; `held` is false when the lease was already gone.
    Reset {
        /// The lease reset ([`Store::reset_for_retry`]).
        lease: Lease,
        /// Whether it was still held, and so reset (its related rows unlocked, the row due after the delay).
        held: bool,
    },
    /// Leases given back.
    Release {
        /// The leases still held and so released (unlocked with their related rows), in the caller's order; the
        /// ones already gone are left out.
        released: Vec<Lease>,
    },
    /// A row inserted outside an apply.
    Insert {
        /// The id the store gave the row.
        id: RowId,
        /// Its kind.
        kind: String,
    },
    /// A write API's update and its outcome.
    UpdateUnleased {
        /// The row the update was for.
        id: RowId,
        /// Whether it was written, or the row was busy or missing.
        outcome: WriteOutcome,
    },
    /// A fetch hint.
    Hint {
        /// The kind whose fetchers are woken.
        kind: String,
        /// The row the hint names, if any (a fetcher may look at it first).
        row: Option<RowId>,
    },
    /// Retention deleted these rows of `kind` ([`Store::purge`]), by id.
    Purge {
        /// The kind purged ([`PurgeParams::kind`]).
        kind: String,
        /// The rows deleted with their events, by id (empty when none was old enough or free).
        deleted: Vec<RowId>,
    },
}

impl fmt::Display for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.at)?;
        if let Some(caller) = &self.caller {
            write!(f, "{caller} ")?;
        }
        write!(f, "{}", self.op)
    }
}

impl fmt::Display for CommitOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        self.write_text(&mut text);
        f.write_str(&text)
    }
}

impl CommitOp {
    /// Appends the commit's text to `out`, as its `Display` writes it: `fetch p [1#1,2#2]`,
    /// `lock_related 3#7 p [4,5] Contended`, `apply 3#7 applied related=[4,5] inserted=[]`, `hint k Some(RowId(3))`.
    ///
    /// The simulator's database node writes the texts of a call's commits into one buffer that it keeps from call
    /// to call, rather than a new `String` per commit grown as `Display` writes it; numbers are written digit by
    /// digit, without the formatting machinery (every trace line is byte for byte the text `Display`
    /// wrote before, and `Display` now calls this).
    pub fn write_text(&self, out: &mut String) {
        match self {
            CommitOp::Fetch { pipeline, leases } => {
                out.push_str("fetch ");
                out.push_str(pipeline);
                push_leases(out, leases);
            }
            CommitOp::Heartbeat { held } => {
                out.push_str("heartbeat");
                push_leases(out, held);
            }
            CommitOp::LockRelated { holder, related, owner, outcome } => {
                out.push_str("lock_related ");
                push_lease(out, holder);
                out.push(' ');
                out.push_str(owner);
                out.push(' ');
                push_ids(out, related);
                out.push(' ');
                out.push_str(match outcome {
                    LockOutcome::Locked => "Locked",
                    LockOutcome::Contended { .. } => "Contended",
                    LockOutcome::Stale => "Stale",
                });
            }
            CommitOp::Apply { lease, applied, related, inserted } => {
                out.push_str("apply ");
                push_lease(out, lease);
                out.push_str(if *applied { " applied related=" } else { " stale related=" });
                push_ids(out, related);
                out.push_str(" inserted=");
                push_ids(out, inserted);
            }
            CommitOp::Failure { lease, attempts, gave_up } => {
                out.push_str("failure ");
                push_lease(out, lease);
                match attempts {
                    None => out.push_str(" stale"),
                    Some(n) => {
                        out.push_str(" attempt=");
                        push_number(out, i64::from(*n));
                        out.push_str(if *gave_up { " gave-up" } else { " retry" });
                    }
                }
            }
            CommitOp::Reset { lease, held } => {
                out.push_str("reset ");
                push_lease(out, lease);
                out.push_str(if *held { " held=true" } else { " held=false" });
            }
            CommitOp::Release { released } => {
                out.push_str("release");
                push_leases(out, released);
            }
            CommitOp::Insert { id, kind } => {
                out.push_str("insert ");
                push_number(out, id.0);
                out.push(' ');
                out.push_str(kind);
            }
            CommitOp::UpdateUnleased { id, outcome } => {
                out.push_str("update_unleased ");
                push_number(out, id.0);
                out.push_str(match outcome {
                    WriteOutcome::Written => " Written",
                    WriteOutcome::Busy => " Busy",
                    WriteOutcome::Missing => " Missing",
                });
            }
            CommitOp::Purge { kind, deleted } => {
                out.push_str("purge ");
                out.push_str(kind);
                out.push_str(" [");
                for (i, id) in deleted.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_number(out, id.0);
                }
                out.push(']');
            }
            CommitOp::Hint { kind, row } => {
                out.push_str("hint ");
                out.push_str(kind);
                match row {
                    None => out.push_str(" None"),
                    Some(id) => {
                        out.push_str(" Some(RowId(");
                        push_number(out, id.0);
                        out.push_str("))");
                    }
                }
            }
        }
    }
}

/// ` [id#token,…]`: a space, then each lease's `id#token` joined by commas in brackets.
fn push_leases(out: &mut String, leases: &[Lease]) {
    out.push_str(" [");
    for (index, lease) in leases.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_lease(out, lease);
    }
    out.push(']');
}

/// `id#token`.
fn push_lease(out: &mut String, lease: &Lease) {
    push_number(out, lease.id.0);
    out.push('#');
    push_number(out, lease.token.0);
}

/// `[id,…]`: row ids joined by commas in brackets.
fn push_ids(out: &mut String, ids: &[RowId]) {
    out.push('[');
    for (index, id) in ids.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_number(out, id.0);
    }
    out.push(']');
}

/// `n` in decimal, as `Display` writes it (a `-` before a negative number).
fn push_number(out: &mut String, n: i64) {
    // 20 digits hold every `u64`, so every `i64`'s magnitude.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push('-');
    }
    out.push_str(std::str::from_utf8(&digits[start..]).expect("decimal digits are ASCII"));
}

impl MemStore {
    /// Publishes the kinds of `hints` to the subscribers, each once, in order: after the call that wrote them
    /// committed (PostgreSQL's one `NOTIFY` per payload and transaction). No subscriber is not an error.
    fn publish_kinds(&self, hints: &[NewHint]) {
        let mut kinds: Vec<&str> = Vec::new();
        for hint in hints {
            if !kinds.contains(&hint.kind.as_str()) {
                kinds.push(&hint.kind);
            }
        }
        for kind in kinds {
            let _ = self.inner.hints.send(kind.to_string());
        }
    }

    /// An empty store on `clock`.
    pub fn new(clock: impl Clock) -> MemStore {
        let (hints, _) = broadcast::channel(HINT_BUFFER_LEN_MAX);
        let inner = Inner {
            clock: Arc::new(clock),
            state: Mutex::new(State { wakes: Some(hints.clone()), ..State::default() }),
            hints,
            apply_guard_disabled: AtomicBool::new(false),
            related_age_rule_disabled: AtomicBool::new(false),
        };
        MemStore { inner: Arc::new(inner), caller: None }
    }

    /// A handle on the same database whose calls record `caller` in their commits: the simulator's database
    /// node labels each call with the node that sent it, so checkers and traces can name the writer.
    pub fn as_caller(&self, caller: impl Into<Arc<str>>) -> MemStore {
        MemStore { inner: self.inner.clone(), caller: Some(caller.into()) }
    }

    /// Mutation testing only: from now on `apply` skips its token guard (main and related rows) and writes as if
    /// every token were current. The simulator's mutation check flips it to prove that its lease-exclusivity
    /// checker fails when the guard is gone. Never call it elsewhere.
    #[doc(hidden)]
    pub fn disable_apply_guard_for_mutation_test(&self) {
        self.inner.apply_guard_disabled.store(true, Ordering::SeqCst);
    }

    /// Mutation testing only: from now on a related lock treats every other owner's fresh intent mark as taken,
    /// as before related locks' age rule (`store::related_available`): items of one pipeline that lock several
    /// shared rows can hold each other off in a cycle of marks. The simulator's mutation check flips it to prove
    /// that scenarios/rows-shared-pairs.toml's starvation checker catches that livelock. Never call it elsewhere.
    #[doc(hidden)]
    pub fn disable_related_age_rule_for_mutation_test(&self) {
        self.inner.related_age_rule_disabled.store(true, Ordering::SeqCst);
    }

    /// An empty store on `clock` that records every commit (see [`MemStore::history`]).
    pub fn with_history(clock: impl Clock) -> MemStore {
        let store = MemStore::new(clock);
        store.lock().history = Some(Vec::new());
        store
    }

    /// The commits recorded so far, oldest first; empty unless built [`MemStore::with_history`].
    pub fn history(&self) -> Vec<Commit> {
        self.lock().history.clone().unwrap_or_default()
    }

    /// How many commits the history holds (0 unless built [`MemStore::with_history`]).
    pub fn history_len(&self) -> usize {
        self.lock().history.as_ref().map_or(0, Vec::len)
    }

    /// The commits recorded from index `start` on, oldest first: the tail a caller's last call added.
    pub fn history_from(&self, start: usize) -> Vec<Commit> {
        self.lock().history.as_ref().map_or_else(Vec::new, |history| history.get(start..).unwrap_or(&[]).to_vec())
    }

    /// What `read` makes of each commit recorded from index `start` on, oldest first, read in place (no copy of
    /// the commits; `read` must not call the store).
    pub fn map_history_from<T>(&self, start: usize, read: impl FnMut(&Commit) -> T) -> Vec<T> {
        let state = self.lock();
        state
            .history
            .as_ref()
            .map_or_else(Vec::new, |history| history.get(start..).unwrap_or(&[]).iter().map(read).collect())
    }

    /// Moves the commit history out, leaving it empty (recording goes on): for a run's checkers once the run is
    /// over, instead of a copy of every commit ([`MemStore::history`]).
    pub fn take_history(&self) -> Vec<Commit> {
        self.lock().history.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Every row, by id: a snapshot for checkers and tests.
    pub fn rows(&self) -> Vec<Row> {
        self.lock().rows.values().cloned().collect()
    }

    /// Whether `pred` holds for every row, read in place (no copy): for checks the simulator repeats.
    pub fn rows_all(&self, pred: impl FnMut(&Row) -> bool) -> bool {
        self.lock().rows.values().all(pred)
    }

    /// The rows for which `pred` holds, by id (copies of those only): a snapshot of the few rows a check needs,
    /// e.g. the simulator's rows not yet final when its liveness wait ends.
    pub fn rows_where(&self, mut pred: impl FnMut(&Row) -> bool) -> Vec<Row> {
        self.lock().rows.values().filter(|row| pred(row)).cloned().collect()
    }

    /// The lease `caller` works under inside a pass, if any: a live lease (its expiry after now) that one of
    /// `caller`'s own fetches handed out, under which related rows are locked (a row other than the leased one
    /// carries its token), so that its worker has the row and its next guarded write is a related lock, its
    /// apply or its reset-and-retry. The simulator's `[faults] pause_inside_pass` waits for one before it pauses a
    /// replica, as `lockstep chaos run` waits for `PgStore::lease_in_pass`. `None` without a history
    /// ([`MemStore::with_history`]: the fetch's caller is known only from it).
    pub fn lease_in_pass(&self, caller: &str) -> Option<Lease> {
        let now = self.now();
        let state = self.lock();
        let history = state.history.as_ref()?;
        let live = |lease: &Lease| {
            state.rows.get(&lease.id).is_some_and(|row| {
                row.lock_token == Some(lease.token) && row.lock_expires_at.is_some_and(|expiry| expiry > now)
            })
        };
        // Tokens carried by more than one row; each was handed out by exactly one fetch, a recent one: look back
        // to it.
        state.by_token.iter().filter(|(_, ids)| ids.len() > 1).find_map(|(token, _)| {
            history.iter().rev().find_map(|commit| match &commit.op {
                CommitOp::Fetch { leases, .. } => leases
                    .iter()
                    .find(|lease| lease.token == *token)
                    .map(|lease| (commit.caller.as_deref() == Some(caller) && live(lease)).then_some(*lease)),
                _ => None,
            })?
        })
    }

    /// Every event, in sequence order: a snapshot for checkers.
    pub fn all_events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// How many events the store holds.
    pub fn events_len(&self) -> usize {
        self.lock().events.len()
    }

    /// The events from index `start` on (0-based, sequence order): the tail a caller's last call appended.
    pub fn events_from(&self, start: usize) -> Vec<Event> {
        self.lock().events.get(start..).unwrap_or(&[]).to_vec()
    }

    /// A snapshot of row `id`, outside any call (no commit): for the simulator's trace and checkers.
    pub fn row(&self, id: RowId) -> Option<Row> {
        self.lock().rows.get(&id).cloned()
    }

    /// What `read` makes of row `id`, read in place outside any call (no commit, no copy of the row).
    pub fn read_row<T>(&self, id: RowId, read: impl FnOnce(&Row) -> T) -> Option<T> {
        self.lock().rows.get(&id).map(read)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug of ours that already failed the run; keep serving reads.
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }
}

/// Whether `row`, a row of `p`'s kind in one of `p`'s statuses, may be leased by the fetch `p` at `now` (the rule
/// of [`Store::fetch`], with its kind and status filter). The fetch reads such rows through its status index, so
/// neither text is compared again here (a fetch scans every leased row of its statuses).
pub(crate) fn fetch_eligible(row: &Row, p: &FetchParams, now: Timestamp) -> bool {
    debug_assert!(row.kind == p.kind && p.statuses.contains(&row.status), "row {} is not of the fetch", row.id);
    let lease_live = row.lock_expires_at.is_some_and(|expires| expires > now);
    if lease_live {
        return false;
    }
    let lease_expired = row.lock_expires_at.is_some();
    let own_or_free = row.lock_owner.as_deref().is_none_or(|owner| owner == p.pipeline);
    if !lease_expired && !own_or_free {
        return false;
    }
    if row.not_before.is_some_and(|not_before| not_before > now) {
        return false;
    }
    let reset_by_me = !lease_expired && row.lock_owner.as_deref() == Some(p.pipeline.as_str());
    match row.last_processed_at {
        None => true,
        Some(_) if row.hinted => true,
        Some(at) if reset_by_me => at <= now.minus(p.retry_delay),
        // A row that failed since it was last processed is paced by its retry time (`not_before`, checked above),
        // not by the minimum interval since that processing.
        Some(at) if row.not_before.is_some_and(|retry| retry > at) => true,
        Some(at) => at <= now.minus(p.min_processing_interval),
    }
}

/// How long from `now` until `expires` (a store time after `now`).
fn expires_in(expires: Timestamp, now: Timestamp) -> Duration {
    Duration::from_micros((expires.as_micros() - now.as_micros()) as u64)
}

/// Whether a related row is available to `holder` with `owner` at `now` (the rule of [`Store::lock_related`]).
/// `age_rule` false: the planted bug of [`MemStore::disable_related_age_rule_for_mutation_test`].
fn related_available(row: &Row, holder: Lease, owner: &str, now: Timestamp, age_rule: bool) -> bool {
    let live = row.lock_expires_at.is_none_or(|expires| expires > now);
    let mark = row.lock_owner.as_deref();
    if !age_rule && row.lock_token.is_none() && live && mark.is_some_and(|mark| mark != owner) {
        return false;
    }
    super::types::related_available(row.lock_token, mark, live, holder.token, owner)
}

/// Whether `row` carries `owner`'s mark with no token (an intent mark, fresh or expired, or `owner`'s reset
/// mark): a contended [`Store::lock_related`] by `owner` leaves it as it is.
fn own_mark(row: &Row, owner: &str) -> bool {
    row.lock_token.is_none() && row.lock_owner.as_deref() == Some(owner)
}

impl State {
    fn record(&mut self, caller: &Option<Arc<str>>, at: Timestamp, op: CommitOp) {
        if let Some(history) = &mut self.history {
            assert!(history.len() < HISTORY_LEN_MAX, "commit history passed {HISTORY_LEN_MAX} entries");
            history.push(Commit { at, caller: caller.clone(), op });
        }
        // The call commits: its frees of waited rows wake their waiters (as PostgreSQL's trigger `NOTIFY`s).
        if !self.woken.is_empty() {
            let woken = std::mem::take(&mut self.woken);
            if let Some(wakes) = &self.wakes {
                let _ = wakes.send(wake_hint(&woken));
            }
        }
    }

    /// Notes that `id`'s token was cleared: if a parked waiter waits on it, it is woken when the call commits.
    fn freed(&mut self, id: RowId) {
        if self.waited.remove(&id) {
            self.woken.push(id);
        }
    }

    fn holds(&self, lease: Lease) -> bool {
        self.rows.get(&lease.id).is_some_and(|row| row.lock_token == Some(lease.token))
    }

    fn fresh_token(&mut self) -> LockToken {
        self.next_token += 1;
        LockToken(self.next_token)
    }

    fn set_lease(&mut self, id: RowId, token: Option<LockToken>, owner: Option<String>, expires: Option<Timestamp>) {
        self.related_locked.remove(&id);
        let row = self.rows.get_mut(&id).expect("set_lease on a missing row");
        let freed = row.lock_token.is_some() && token.is_none();
        if let Some(old) = row.lock_token.take() {
            let rows = self.by_token.get_mut(&old).expect("token index lost a token");
            rows.remove(&id);
            if rows.is_empty() {
                self.by_token.remove(&old);
            }
        }
        row.lock_token = token;
        row.lock_owner = owner;
        row.lock_expires_at = expires;
        if let Some(token) = token {
            self.by_token.entry(token).or_default().insert(id);
        }
        if freed {
            self.freed(id);
        }
    }

    /// Rows other than `lease.id` that carry `lease.token`.
    fn related_of(&self, lease: Lease) -> Vec<RowId> {
        let rows = self.by_token.get(&lease.token);
        rows.into_iter().flatten().copied().filter(|id| *id != lease.id).collect()
    }

    fn unlock(&mut self, id: RowId) {
        self.set_lease(id, None, None, None);
    }

    /// Locks rows `ids` with `token` for `owner` until `expires` ([`State::set_lease`] for each, the token's index
    /// entry extended once).
    fn lock_rows(&mut self, ids: &[RowId], token: LockToken, owner: &str, expires: Timestamp) {
        for id in ids {
            let row = self.rows.get_mut(id).expect("lock_rows on a missing row");
            if let Some(old) = row.lock_token.take() {
                let rows = self.by_token.get_mut(&old).expect("token index lost a token");
                rows.remove(id);
                if rows.is_empty() {
                    self.by_token.remove(&old);
                }
            }
            row.lock_token = Some(token);
            row.lock_owner = Some(owner.to_string());
            row.lock_expires_at = Some(expires);
        }
        self.by_token.entry(token).or_default().extend(ids.iter().copied());
        self.related_locked.extend(ids.iter().copied());
    }

    /// Rows locked as related rows ([`State::related_locked`]) with `token`, but `except`.
    fn related_locked_with(&self, token: LockToken, except: RowId) -> Vec<RowId> {
        let rows = self.by_token.get(&token).into_iter().flatten().copied();
        rows.filter(|id| *id != except && self.related_locked.contains(id)).collect()
    }

    /// Unlocks every row locked with the lease's token (its own row, if held, and its related rows); returns the
    /// related rows (by id).
    /// One removal of the token's index entry rather than one per row: a gang restart's passes lock and unlock
    /// 10 000 jobs each.
    fn unlock_lease(&mut self, lease: Lease) -> Vec<RowId> {
        let rows = self.by_token.remove(&lease.token).unwrap_or_default();
        for id in &rows {
            self.related_locked.remove(id);
            let row = self.rows.get_mut(id).expect("token index names a missing row");
            debug_assert_eq!(row.lock_token, Some(lease.token), "token index out of date for row {id}");
            row.lock_token = None;
            row.lock_owner = None;
            row.lock_expires_at = None;
            if self.waited.remove(id) {
                self.woken.push(*id);
            }
        }
        rows.into_iter().filter(|id| *id != lease.id).collect()
    }

    fn insert(&mut self, new: NewRow, now: Timestamp) -> RowId {
        self.next_id += 1;
        let id = RowId(self.next_id);
        set_for(&mut self.by_kind, &new.kind).insert(id);
        self.by_status.insert(&new.kind, &new.status, (None, id));
        if let Some(parent) = new.parent_id {
            set_for(self.by_parent.entry(parent).or_default(), &new.kind).insert(id);
            self.by_parent_status.entry(parent).or_default().insert(&new.kind, &new.status, id);
        }
        let mut row = new.into_row(id, now);
        self.version += 1;
        row.version = self.version;
        self.rows.push(row);
        id
    }

    /// Refuses `rows` if one names a parent that does not exist (DESIGN §2, "Parents"), before any write; `what(i)`
    /// names the call and row `i`. A row of the same call cannot be a parent: its id is not known before the call.
    fn check_parents(&self, rows: &[NewRow], what: impl Fn(usize) -> String) -> Result<(), StoreError> {
        let missing = |row: &NewRow| row.parent_id.filter(|parent| self.rows.get(parent).is_none());
        match rows.iter().enumerate().find_map(|(i, row)| missing(row).map(|parent| (i, parent))) {
            Some((i, parent)) => Err(parent_missing(&what(i), parent)),
            None => Ok(()),
        }
    }

    /// Refuses an apply batch if an item that would apply inserts a row under a parent that does not exist, before
    /// any write, as PostgreSQL's foreign key fails the batch's transaction whole. A stale item inserts nothing, so
    /// its rows are not checked; an item applies if it holds its lease and every row it guards, and no earlier item
    /// of the batch applied with its token ([`Store::apply_batch`]: a lease given twice applies once).
    fn check_apply_parents(&self, batch: &[ApplyParams], guard_disabled: bool) -> Result<(), StoreError> {
        if !batch.iter().any(|p| p.inserts.iter().any(|row| row.parent_id.is_some())) {
            return Ok(());
        }
        let mut spent: BTreeSet<LockToken> = BTreeSet::new();
        for p in batch {
            let token = p.lease.token;
            let holds = |id: RowId| self.holds(Lease { id, token });
            let applies = guard_disabled
                || (!spent.contains(&token) && holds(p.lease.id) && p.guarded_related().into_iter().all(holds));
            if applies {
                spent.insert(token);
                let lease = p.lease;
                self.check_parents(&p.inserts, |i| format!("apply {}#{}: inserts[{i}]", lease.id, lease.token))?;
            }
        }
        Ok(())
    }

    /// The insert of [`Store::insert`] at `now`, recorded as one commit.
    fn insert_recorded(&mut self, caller: &Option<Arc<str>>, new: NewRow, now: Timestamp) -> RowId {
        let kind = new.kind.clone();
        let id = self.insert(new, now);
        self.record(caller, now, CommitOp::Insert { id, kind });
        id
    }

    /// Sets row `id`'s `last_processed_at`, keeping its place in the fetch order of `by_status`.
    fn set_processed_at(&mut self, id: RowId, at: Timestamp) {
        let row = self.rows.get_mut(&id).expect("processed row");
        let rows = self.by_status.get_mut(&row.kind, &row.status).expect("status index lost a row");
        assert!(rows.remove(&(row.last_processed_at, id)), "row {id} missing from the status index");
        row.last_processed_at = Some(at);
        rows.insert((row.last_processed_at, id));
    }

    /// [`Store::purge`] at `now`: deletes the rows the call may delete, with their events and every index entry;
    /// returns their ids.
    fn purge(&mut self, p: &PurgeParams, now: Timestamp) -> Vec<RowId> {
        let cutoff = now.minus(p.older_than);
        let mut candidates: Vec<RowId> = Vec::new();
        for status in p.statuses.iter().collect::<BTreeSet<_>>() {
            candidates.extend(self.by_status.get(&p.kind, status).into_iter().flatten().map(|(_, id)| *id));
        }
        candidates.sort_unstable();
        let unheld = |row: &Row| {
            let expired = row.lock_expires_at.is_some_and(|expires| expires <= now);
            (row.lock_token.is_none() && row.lock_owner.is_none()) || expired
        };
        let childless = |id: &RowId| self.by_parent.get(id).is_none_or(|kinds| kinds.values().all(BTreeSet::is_empty));
        let parent_final = |row: &Row| {
            p.parent_statuses.is_empty()
                || row
                    .parent_id
                    .and_then(|parent| self.rows.get(&parent))
                    .is_some_and(|parent| p.parent_statuses.contains(&parent.status))
        };
        let doomed: Vec<RowId> = candidates
            .into_iter()
            .filter(|id| {
                let row = &self.rows[id];
                row.updated_at <= cutoff && unheld(row) && childless(id) && parent_final(row)
            })
            .take(p.limit)
            .collect();
        for id in &doomed {
            // An expired lease's token leaves its index (its holder's late write finds no row: stale).
            self.set_lease(*id, None, None, None);
            let row = self.rows.remove(id).expect("a doomed row exists");
            self.by_kind.get_mut(&row.kind).expect("kind index lost a row").remove(id);
            assert!(
                self.by_status.remove(&row.kind, &row.status, &(row.last_processed_at, *id)),
                "row {id} missing from the status index"
            );
            if let Some(parent) = row.parent_id {
                if let Some(children) = self.by_parent.get_mut(&parent).and_then(|kinds| kinds.get_mut(&row.kind)) {
                    children.remove(id);
                }
                if let Some(children) = self.by_parent_status.get_mut(&parent) {
                    children.remove(&row.kind, &row.status, id);
                }
            }
            self.by_parent.remove(id);
            self.by_parent_status.remove(id);
        }
        if !doomed.is_empty() {
            let gone: BTreeSet<RowId> = doomed.iter().copied().collect();
            self.events.retain(|event| !gone.contains(&event.row_id));
        }
        doomed
    }

    fn write(&mut self, id: RowId, update: RowUpdate, now: Timestamp) {
        let row = self.rows.get_mut(&id).expect("write to a missing row");
        if let Some(status) = update.status
            && status != row.status
        {
            let old = std::mem::replace(&mut row.status, status);
            let key = (row.last_processed_at, id);
            assert!(self.by_status.remove(&row.kind, &old, &key), "row {id} missing from the status index");
            self.by_status.insert(&row.kind, &row.status, key);
            if let Some(parent) = row.parent_id {
                let children = self.by_parent_status.get_mut(&parent).expect("parent status index lost a parent");
                assert!(
                    children.remove(&row.kind, &old, &id),
                    "row {id} missing from its parent {parent}'s status index"
                );
                children.insert(&row.kind, &row.status, id);
            }
        }
        if let Some(data) = update.data {
            row.data = data;
        }
        row.updated_at = now;
        // Every status or data write goes through here (apply, related updates, a give-up, update_unleased).
        self.version += 1;
        row.version = self.version;
    }
}

impl State {
    /// The write of a fetch hint at `now`: marks its row hinted (if it names one that exists) and records the
    /// commit. The caller publishes the kind once the call's lock is released.
    fn hint(&mut self, caller: &Option<Arc<str>>, now: Timestamp, hint: &NewHint) {
        if let Some(row) = hint.row.and_then(|id| self.rows.get_mut(&id)) {
            row.hinted = true;
        }
        self.record(caller, now, CommitOp::Hint { kind: hint.kind.clone(), row: hint.row });
    }

    /// The guarded apply of [`Store::apply`] at `now`, recorded as one commit; `guard_disabled` is the mutation
    /// switch of [`MemStore::disable_apply_guard_for_mutation_test`].
    fn apply(
        &mut self,
        caller: &Option<Arc<str>>,
        p: ApplyParams,
        now: Timestamp,
        guard_disabled: bool,
    ) -> ApplyOutcome {
        let lease = p.lease;
        // Every related row the item locked, updated or not, still carries the token (`ApplyParams::locked`).
        let related_held = p.guarded_related().into_iter().all(|id| self.holds(Lease { id, token: lease.token }));
        if (!self.holds(lease) || !related_held) && !guard_disabled {
            let related = p.related.iter().map(|r| r.id).collect();
            self.record(caller, now, CommitOp::Apply { lease, applied: false, related, inserted: Vec::new() });
            return ApplyOutcome::Stale;
        }
        self.write(lease.id, p.update, now);
        for related in p.related {
            self.write(related.id, related.update, now);
        }
        let locked = self.unlock_lease(lease);
        // Held, the lease's row was among its token's; with the guard disabled it may carry another token.
        self.unlock(lease.id);
        // `hinted` stays: a hint that arrived during the lease is for the next fetch (see `Store::apply`).
        self.set_processed_at(lease.id, now);
        self.rows.get_mut(&lease.id).expect("applied row").attempts = 0;
        let inserted: Vec<RowId> = p.inserts.into_iter().map(|new| self.insert(new, now)).collect();
        for event in p.events {
            let seq = self.events.len() as i64 + 1;
            self.events.push(Event { seq, row_id: event.row_id, kind: event.kind, data: event.data, at: now });
        }
        let op = CommitOp::Apply { lease, applied: true, related: locked, inserted: inserted.clone() };
        self.record(caller, now, op);
        ApplyOutcome::Applied { inserted, now }
    }
}

impl State {
    /// The fetch of [`Store::fetch`] at `now`, recorded as one commit: the leased rows and, when it leased none,
    /// the first expiry after `now` of a lease or mark on the rows it scanned (every row of the fetch's kind and
    /// statuses: [`Store::next_expiry`]), found by the same scan.
    fn fetch(&mut self, caller: &Option<Arc<str>>, p: FetchParams, now: Timestamp) -> (Vec<Row>, Option<Timestamp>) {
        // Each status once, in the order given (no set built per fetch). The answer does not depend on
        // the order: the eligible rows are sorted below, and an expiry is kept only when no status had one.
        let statuses = p.statuses.iter().enumerate().filter(|(i, status)| !p.statuses[..*i].contains(status));
        // Each status's rows are in fetch order (`None < Some(_)`: never-processed rows first, as `ORDER BY
        // last_processed_at NULLS FIRST, id`), so the first `limit` eligible rows of each, merged, hold the answer.
        let mut eligible: Vec<FetchKey> = Vec::new();
        let mut first: Option<Timestamp> = None;
        for rows in statuses.filter_map(|(_, status)| self.by_status.get(&p.kind, status)) {
            let mut taken = 0;
            for (at, id) in rows {
                let row = &self.rows[id];
                if taken < p.limit && fetch_eligible(row, &p, now) {
                    eligible.push((*at, *id));
                    taken += 1;
                    if taken == p.limit {
                        break;
                    }
                } else if eligible.is_empty()
                    && let Some(expires) = row.lock_expires_at.filter(|expires| *expires > now)
                {
                    // Only an empty fetch brings an expiry back, so the scan stops looking once a row is eligible.
                    first = Some(first.map_or(expires, |first| first.min(expires)));
                }
            }
        }
        eligible.sort_unstable();
        eligible.truncate(p.limit);
        let first = if eligible.is_empty() { first } else { None };
        let mut leased = Vec::with_capacity(eligible.len());
        for (_, id) in eligible {
            let token = self.fresh_token();
            self.set_lease(id, Some(token), Some(p.pipeline.clone()), Some(now.plus(p.lease_ttl)));
            let row = self.rows.get_mut(&id).expect("eligible row vanished");
            row.hinted = false;
            leased.push(row.clone());
        }
        let leases = leased.iter().map(|row| Lease { id: row.id, token: row.lock_token.expect("leased") }).collect();
        self.record(caller, now, CommitOp::Fetch { pipeline: p.pipeline, leases });
        (leased, first)
    }

    /// The rows of one [`Store::query`], by id, read through the narrowest index its filters allow.
    fn query(&self, q: &RowQuery) -> Vec<Row> {
        self.query_rows(q).cloned().collect()
    }

    /// The children of `parent` of `kind`, by id, if it has any.
    fn children(&self, parent: RowId, kind: &str) -> Option<&BTreeSet<RowId>> {
        self.by_parent.get(&parent)?.get(kind)
    }

    /// The rows of one [`Store::query`], by id, borrowed.
    fn query_rows<'a>(&'a self, q: &RowQuery) -> impl Iterator<Item = &'a Row> + 'a {
        let after = q.after.map_or(Bound::Unbounded, Bound::Excluded);
        let range = |ids: &BTreeSet<RowId>| ids.range((after, Bound::Unbounded)).copied().collect::<Vec<_>>();
        let mut ids: Vec<RowId> = match (&q.ids, q.parent, &q.statuses) {
            (Some(ids), _, _) => ids.iter().copied().collect::<BTreeSet<_>>().into_iter().collect(),
            (None, Some(parent), Some(statuses)) => {
                let statuses: BTreeSet<&String> = statuses.iter().collect();
                let children = self.by_parent_status.get(&parent);
                statuses.into_iter().filter_map(|status| children?.get(&q.kind, status)).flat_map(range).collect()
            }
            (None, Some(parent), None) => self.children(parent, &q.kind).map(range).unwrap_or_default(),
            (None, None, Some(statuses)) => {
                let statuses: BTreeSet<&String> = statuses.iter().collect();
                let rows = statuses.into_iter().filter_map(|status| self.by_status.get(&q.kind, status));
                rows.flatten().map(|(_, id)| *id).filter(|id| q.after.is_none_or(|after| *id > after)).collect()
            }
            (None, None, None) => self.by_kind.get(&q.kind).map(range).unwrap_or_default(),
        };
        ids.sort_unstable();
        // The ids filter was applied by the lookup above; matching each row against the list again would cost
        // the list's length per row. Without ids, the index read holds exactly the rows of the query's kind,
        // parent, statuses and cursor, so no row is matched again: that reads each row's kind, a text apart from
        // the row, which a reader that does not need it pays for with a cache miss per row (3 % of a
        // 10 000-job gang restart).
        let exact = q.ids.is_none();
        let filters = RowQuery {
            kind: q.kind.clone(),
            parent: q.parent,
            statuses: q.statuses.clone(),
            after: q.after,
            ids: None,
        };
        ids.into_iter().filter_map(|id| self.rows.get(&id)).filter(move |row| {
            debug_assert!(!exact || filters.matches(row), "row {} read through an index that does not match", row.id);
            exact || filters.matches(row)
        })
    }

    /// The write of [`Store::record_failure`] at `now` for a lease still held; returns the row's new attempt count.
    fn record_failure(&mut self, p: FailureParams, now: Timestamp) -> u32 {
        let lease = p.lease;
        for id in self.related_of(lease) {
            self.unlock(id);
        }
        self.unlock(lease.id);
        let gave_up = match p.retry {
            Retry::After(delay) => Some(now.plus(delay)),
            Retry::GiveUp { status } => {
                self.write(lease.id, RowUpdate::status(status), now);
                None
            }
        };
        let row = self.rows.get_mut(&lease.id).expect("failed row");
        row.attempts = row.attempts.saturating_add(1);
        row.errors.push(AttemptError { attempt: row.attempts, at: now, error: bounded_error(&p.error) });
        let excess = row.errors.len().saturating_sub(FAILURE_ERRORS_KEPT);
        row.errors.drain(..excess);
        row.not_before = gave_up;
        row.updated_at = now;
        row.attempts
    }
}

impl Store for MemStore {
    async fn fetch(&self, p: FetchParams) -> Result<Vec<Row>, StoreError> {
        check_fetch(&p)?;
        let now = self.now();
        Ok(self.lock().fetch(&self.caller, p, now).0)
    }

    async fn fetch_with_expiry(&self, p: FetchParams) -> Result<(Vec<Row>, Option<Duration>), StoreError> {
        // One lock and one scan: the fetch's own scan of an empty fetch's rows finds their first expiry (the
        // default runs the fetch and then `next_expiry`, which scans the same rows again).
        check_fetch(&p)?;
        let now = self.now();
        let (rows, first) = self.lock().fetch(&self.caller, p, now);
        Ok((rows, first.map(|expires| expires_in(expires, now))))
    }

    async fn next_expiry(&self, p: FetchParams) -> Result<Option<Duration>, StoreError> {
        let now = self.now();
        let state = self.lock();
        let statuses: BTreeSet<&String> = p.statuses.iter().collect();
        let first = statuses
            .into_iter()
            .filter_map(|status| state.by_status.get(&p.kind, status))
            .flatten()
            .filter_map(|(_, id)| state.rows[id].lock_expires_at.filter(|expires| *expires > now))
            .min();
        Ok(first.map(|expires| expires_in(expires, now)))
    }

    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        let state = self.lock();
        Ok(state.rows.get(&lease.id).filter(|row| row.lock_token == Some(lease.token)).cloned())
    }

    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        // One lock: every lease is read in the same state, as one PostgreSQL statement reads one snapshot.
        let state = self.lock();
        Ok(leases
            .into_iter()
            .map(|lease| state.rows.get(&lease.id).filter(|row| row.lock_token == Some(lease.token)).cloned())
            .collect())
    }

    async fn heartbeat(&self, p: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        let now = self.now();
        let expires = now.plus(p.lease_ttl);
        let mut state = self.lock();
        // An expired lease is gone even if no one took it over: a heartbeat never revives it, so a holder the
        // others already count as dead (a node the controller declared lost) cannot come back under it.
        let live = |state: &State, lease: Lease| {
            state.holds(lease) && state.rows[&lease.id].lock_expires_at.is_some_and(|expires| expires > now)
        };
        let held: Vec<Lease> = p.leases.into_iter().filter(|lease| live(&state, *lease)).collect();
        for lease in &held {
            let ids: Vec<RowId> = state.by_token[&lease.token].iter().copied().collect();
            for id in ids {
                // Never earlier than an expiry already written: a heartbeat only extends (`Store::heartbeat`).
                let row = state.rows.get_mut(&id).expect("indexed row");
                row.lock_expires_at = row.lock_expires_at.max(Some(expires));
            }
        }
        state.record(&self.caller, now, CommitOp::Heartbeat { held: held.clone() });
        Ok(held)
    }

    async fn lock_related(&self, p: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        Ok(self.lock_related_until(p).await?.0)
    }

    async fn lock_related_until(&self, p: LockRelatedParams) -> Result<(LockOutcome, Option<Duration>), StoreError> {
        check_text(&format!("lock_related {}#{}", p.holder.id, p.holder.token), "owner", &p.owner)?;
        let now = self.now();
        let age_rule = !self.inner.related_age_rule_disabled.load(Ordering::Relaxed);
        let mut state = self.lock();
        // Each related row is looked up once: whether it exists and whether it is available (a gang restart's
        // passes lock 10 000 jobs each).
        let mut available = Vec::with_capacity(p.related.len());
        let mut unavailable = Vec::new();
        let (mut taken, mut by_own_pipeline) = (false, true);
        // The longest span until an unavailable row's lock or mark expires; `None` once one has no expiry.
        let mut until = Some(Duration::ZERO);
        for id in &p.related {
            let Some(row) = state.rows.get(id) else {
                return Err(StoreError::Invalid(format!("lock_related: related row {id} does not exist")));
            };
            if related_available(row, p.holder, &p.owner, now, age_rule) {
                available.push(*id);
            } else {
                taken = true;
                by_own_pipeline &= held_by_own_pipeline(row.lock_token, row.lock_owner.as_deref(), &p.owner);
                let expires = row.lock_expires_at.map(|expires| expires_in(expires.max(now), now));
                until = until.zip(expires).map(|(until, expires)| until.max(expires));
                unavailable.push(*id);
            }
        }
        let outcome = if !state.holds(p.holder) {
            LockOutcome::Stale
        } else if !taken {
            state.lock_rows(&available, p.holder.token, &p.owner, now.plus(p.lease_ttl));
            LockOutcome::Locked
        } else {
            // Contended: the available rows get the owner's intent mark (no token). A row that already carries
            // this owner's mark keeps it as it is: retries never push a mark's expiry back, so a mark holds its row
            // at most one lease ttl (`Store::lock_related`).
            let expires = Some(now.plus(p.lease_ttl));
            for id in available {
                if own_mark(&state.rows[&id], &p.owner) {
                    continue;
                }
                state.set_lease(id, None, Some(p.owner.clone()), expires);
            }
            if p.park {
                state.waited.extend(unavailable);
            }
            LockOutcome::Contended { by_own_pipeline }
        };
        let until = if matches!(outcome, LockOutcome::Contended { .. }) { until } else { None };
        state.record(
            &self.caller,
            now,
            CommitOp::LockRelated { holder: p.holder, related: p.related, owner: p.owner, outcome },
        );
        Ok((outcome, until))
    }

    async fn apply(&self, p: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.apply_batch(vec![p]).await.map(|mut outcomes| outcomes.pop().expect("one outcome per item"))
    }

    async fn apply_batch(&self, batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // A bad value fails the whole transaction, as in PostgreSQL: nothing of the batch is written.
        batch.iter().try_for_each(check_apply)?;
        // One lock and one `now` for every item: the batch is one transaction, its items applied in order.
        let now = self.now();
        let guard_disabled = self.inner.apply_guard_disabled.load(Ordering::SeqCst);
        let mut published = Vec::new();
        let outcomes = {
            let mut state = self.lock();
            state.check_apply_parents(&batch, guard_disabled)?;
            let mut outcomes = Vec::with_capacity(batch.len());
            for mut p in batch {
                let hints = std::mem::take(&mut p.hints);
                let outcome = state.apply(&self.caller, p, now, guard_disabled);
                if matches!(outcome, ApplyOutcome::Applied { .. }) {
                    for hint in hints {
                        if !published.contains(&hint) {
                            state.hint(&self.caller, now, &hint);
                            published.push(hint);
                        }
                    }
                }
                outcomes.push(outcome);
            }
            outcomes
        };
        self.publish_kinds(&published);
        Ok(outcomes)
    }

    async fn record_failure(&self, p: FailureParams) -> Result<FailureOutcome, StoreError> {
        check_failure(&p)?;
        let now = self.now();
        let mut state = self.lock();
        let lease = p.lease;
        let gave_up = matches!(p.retry, Retry::GiveUp { .. });
        let attempts = state.holds(lease).then(|| state.record_failure(p, now));
        state.record(&self.caller, now, CommitOp::Failure { lease, attempts, gave_up });
        Ok(match attempts {
            Some(attempts) => FailureOutcome::Recorded { attempts },
            None => FailureOutcome::Stale,
        })
    }

    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        let now = self.now();
        let mut state = self.lock();
        let held = state.holds(lease);
        if held {
            for id in state.related_of(lease) {
                state.unlock(id);
            }
            let owner = state.rows[&lease.id].lock_owner.clone();
            state.set_lease(lease.id, None, owner, None);
            state.rows.get_mut(&lease.id).expect("held row").not_before = Some(now.plus(delay));
        }
        state.record(&self.caller, now, CommitOp::Reset { lease, held });
        Ok(held)
    }

    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        let now = self.now();
        let mut state = self.lock();
        let released: Vec<Lease> = leases.into_iter().filter(|lease| state.holds(*lease)).collect();
        for lease in &released {
            for id in state.related_of(*lease) {
                state.unlock(id);
            }
            state.unlock(lease.id);
        }
        let count = released.len();
        state.record(&self.caller, now, CommitOp::Release { released });
        Ok(count)
    }

    async fn insert(&self, new: NewRow) -> Result<Row, StoreError> {
        check_new_row("insert", &new)?;
        let now = self.now();
        let mut state = self.lock();
        state.check_parents(std::slice::from_ref(&new), |_| "insert".to_string())?;
        let id = state.insert_recorded(&self.caller, new, now);
        Ok(state.rows[&id].clone())
    }

    async fn insert_id(&self, new: NewRow) -> Result<RowId, StoreError> {
        check_new_row("insert", &new)?;
        let now = self.now();
        let mut state = self.lock();
        state.check_parents(std::slice::from_ref(&new), |_| "insert".to_string())?;
        Ok(state.insert_recorded(&self.caller, new, now))
    }

    async fn insert_many(&self, rows: Vec<NewRow>, hints: Vec<NewHint>) -> Result<Vec<RowId>, StoreError> {
        for (i, row) in rows.iter().enumerate() {
            check_new_row(&format!("insert_many: rows[{i}]"), row)?;
        }
        for (i, hint) in hints.iter().enumerate() {
            check_key(&format!("insert_many: hints[{i}]"), "kind", &hint.kind)?;
        }
        let now = self.now();
        let ids = {
            let mut state = self.lock();
            state.check_parents(&rows, |i| format!("insert_many: rows[{i}]"))?;
            let ids = rows.into_iter().map(|new| state.insert_recorded(&self.caller, new, now)).collect();
            let mut published: Vec<&NewHint> = Vec::new();
            for hint in &hints {
                if !published.contains(&hint) {
                    state.hint(&self.caller, now, hint);
                    published.push(hint);
                }
            }
            ids
        };
        self.publish_kinds(&hints);
        Ok(ids)
    }

    async fn insert_keyed(&self, p: InsertKeyedParams) -> Result<KeyedInsert, StoreError> {
        check_insert_keyed(&p)?;
        let now = self.now();
        let mut state = self.lock();
        Ok(match state.insert_keys.get(&p.key) {
            Some(id) => KeyedInsert { id: *id, inserted: false },
            None => {
                state.check_parents(std::slice::from_ref(&p.row), |_| "insert_keyed".to_string())?;
                let id = state.insert_recorded(&self.caller, p.row, now);
                state.insert_keys.insert(p.key, id);
                KeyedInsert { id, inserted: true }
            }
        })
    }

    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        Ok(self.lock().rows.get(&id).cloned())
    }

    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        let state = self.lock();
        let ids = match parent {
            Some(parent) => state.children(parent, kind),
            None => state.by_kind.get(kind),
        };
        Ok(ids.into_iter().flatten().map(|id| state.rows[id].clone()).collect())
    }

    async fn list_map<T, F>(&self, kind: &str, parent: Option<RowId>, read: F) -> Result<Vec<T>, StoreError>
    where
        T: Send,
        F: Fn(&Row) -> T + Send,
    {
        let state = self.lock();
        let ids = match parent {
            Some(parent) => state.children(parent, kind),
            None => state.by_kind.get(kind),
        };
        Ok(ids.into_iter().flatten().map(|id| read(&state.rows[id])).collect())
    }

    async fn query(&self, queries: Vec<RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        check_query(&queries)?;
        let state = self.lock();
        Ok(queries.iter().map(|q| state.query(q)).collect())
    }

    async fn query_map<T, F>(&self, queries: Vec<RowQuery>, read: F) -> Result<Vec<Vec<T>>, StoreError>
    where
        T: Send,
        F: Fn(&Row) -> T + Send,
    {
        check_query(&queries)?;
        let state = self.lock();
        Ok(queries.iter().map(|q| state.query_rows(q).map(&read).collect()).collect())
    }

    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        Ok(self.lock().events.iter().filter(|event| event.row_id == row).cloned().collect())
    }

    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        check_update(&format!("update_unleased {id}"), &update)?;
        let now = self.now();
        let mut state = self.lock();
        let outcome = match state.rows.get(&id) {
            None => WriteOutcome::Missing,
            Some(row) => {
                let live = row.lock_expires_at.is_some_and(|expires| expires > now);
                let reset_mark = row.lock_expires_at.is_none() && row.lock_owner.is_some();
                if live || reset_mark {
                    WriteOutcome::Busy
                } else {
                    // An expired lease is taken over and cleared, so its holder's late apply is stale; so is an
                    // expired related lock, with the other rows its holder locked as related (its late apply is
                    // stale too), but not the holder's own row: its lease is the holder's to lose (PostgreSQL
                    // unlocks the rows carrying the token as `related_token`, `sql::UPDATE_UNLEASED`).
                    let related = match row.lock_token {
                        Some(token) => state.related_locked_with(token, id),
                        None => Vec::new(),
                    };
                    for related_id in related {
                        state.unlock(related_id);
                    }
                    state.unlock(id);
                    state.write(id, update, now);
                    WriteOutcome::Written
                }
            }
        };
        state.record(&self.caller, now, CommitOp::UpdateUnleased { id, outcome });
        Ok(outcome)
    }

    async fn purge(&self, p: PurgeParams) -> Result<usize, StoreError> {
        check_purge(&p)?;
        let now = self.now();
        let mut state = self.lock();
        let deleted = state.purge(&p, now);
        let count = deleted.len();
        state.record(&self.caller, now, CommitOp::Purge { kind: p.kind, deleted });
        Ok(count)
    }

    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        let now = self.now();
        self.lock().hint(&self.caller, now, &NewHint { kind: kind.to_string(), row });
        // After commit; no subscriber is not an error.
        let _ = self.inner.hints.send(kind.to_string());
        Ok(())
    }

    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.hints.subscribe()
    }

    async fn now(&self) -> Result<Timestamp, StoreError> {
        Ok(MemStore::now(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(limit: usize) -> FetchParams {
        FetchParams {
            pipeline: "p".into(),
            kind: "k".into(),
            statuses: vec!["ready".into()],
            limit,
            lease_ttl: Duration::from_secs(30),
            min_processing_interval: Duration::ZERO,
            retry_delay: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn a_taken_history_holds_every_commit_and_recording_goes_on() {
        let store = MemStore::with_history(ManualClock::new(Timestamp(0)));
        for _ in 0..2 {
            store.insert(NewRow::new("k", "ready", serde_json::json!({}))).await.unwrap();
        }
        store.fetch(params(2)).await.unwrap();
        let texts = store.map_history_from(1, |commit| commit.op.to_string());
        assert_eq!(texts, ["insert 2 k", "fetch p [1#1,2#2]"], "commits from index 1, as the trace writes them");
        assert_eq!(store.take_history().len(), 3);
        assert_eq!(store.history_len(), 0, "taken, not copied");
        store.hint("k", None).await.unwrap();
        assert_eq!(store.history_len(), 1, "recording goes on after a take");
    }

    #[tokio::test]
    async fn an_empty_fetch_brings_back_the_first_expiry_it_skipped_and_a_fetch_that_leased_none() {
        let clock = ManualClock::new(Timestamp(0));
        let store = MemStore::new(clock.clone());
        store.insert(NewRow::new("k", "ready", serde_json::json!({}))).await.unwrap();
        let (rows, expiry) = store.fetch_with_expiry(params(1)).await.unwrap();
        assert_eq!((rows.len(), expiry), (1, None), "a fetch that leased rows brings back no expiry");
        clock.advance(Duration::from_secs(10));
        let other = FetchParams { pipeline: "q".into(), ..params(1) };
        let (rows, expiry) = store.fetch_with_expiry(other).await.unwrap();
        assert!(rows.is_empty());
        assert_eq!(expiry, Some(Duration::from_secs(20)), "the lease it skipped ends 30 s after the first fetch");
    }

    /// The text of `op` as `Display` wrote it before [`CommitOp::write_text`] (with `format!`): the traces'
    /// format, which the written text must keep byte for byte.
    fn text_by_format(op: &CommitOp) -> String {
        let leases = |l: &[Lease]| l.iter().map(|l| format!("{}#{}", l.id, l.token)).collect::<Vec<_>>().join(",");
        let ids = |ids: &[RowId]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>().join(",");
        match op {
            CommitOp::Fetch { pipeline, leases: l } => format!("fetch {pipeline} [{}]", leases(l)),
            CommitOp::Heartbeat { held } => format!("heartbeat [{}]", leases(held)),
            CommitOp::LockRelated { holder, related, owner, outcome } => {
                // The text names the outcome only: a contended lock's `by_own_pipeline` is not in the trace.
                let outcome = format!("{outcome:?}");
                let outcome = outcome.split(' ').next().unwrap_or_default();
                format!("lock_related {}#{} {owner} [{}] {outcome}", holder.id, holder.token, ids(related))
            }
            CommitOp::Apply { lease, applied, related, inserted } => format!(
                "apply {}#{} {} related=[{}] inserted=[{}]",
                lease.id,
                lease.token,
                if *applied { "applied" } else { "stale" },
                ids(related),
                ids(inserted)
            ),
            CommitOp::Failure { lease, attempts: None, .. } => format!("failure {}#{} stale", lease.id, lease.token),
            CommitOp::Failure { lease, attempts: Some(n), gave_up } => {
                let next = if *gave_up { "gave-up" } else { "retry" };
                format!("failure {}#{} attempt={n} {next}", lease.id, lease.token)
            }
            CommitOp::Reset { lease, held } => format!("reset {}#{} held={held}", lease.id, lease.token),
            CommitOp::Release { released } => format!("release [{}]", leases(released)),
            CommitOp::Insert { id, kind } => format!("insert {id} {kind}"),
            CommitOp::UpdateUnleased { id, outcome } => format!("update_unleased {id} {outcome:?}"),
            CommitOp::Hint { kind, row } => format!("hint {kind} {row:?}"),
            CommitOp::Purge { kind, deleted } => format!("purge {kind} [{}]", ids(deleted)),
        }
    }

    #[test]
    fn a_commits_written_text_is_the_text_format_wrote() {
        let lease = |id: i64, token: i64| Lease { id: RowId(id), token: LockToken(token) };
        let many: Vec<Lease> = [(1, 1), (20, 305), (4_000, 99_999_999), (i64::MAX, i64::MIN)]
            .into_iter()
            .map(|(id, token)| lease(id, token))
            .collect();
        let ids = vec![RowId(0), RowId(-7), RowId(10), RowId(1_234_567)];
        let mut ops = vec![
            CommitOp::Fetch { pipeline: "jobs".into(), leases: Vec::new() },
            CommitOp::Fetch { pipeline: "jobs".into(), leases: many.clone() },
            CommitOp::Heartbeat { held: many.clone() },
            CommitOp::Heartbeat { held: Vec::new() },
            CommitOp::Release { released: many },
            CommitOp::Insert { id: RowId(42), kind: "job".into() },
            CommitOp::Hint { kind: "job".into(), row: None },
            CommitOp::Hint { kind: "job".into(), row: Some(RowId(9)) },
            CommitOp::Purge { kind: "job".into(), deleted: Vec::new() },
            CommitOp::Purge { kind: "job".into(), deleted: ids.clone() },
        ];
        for outcome in [LockOutcome::Locked, LockOutcome::Contended { by_own_pipeline: false }, LockOutcome::Stale] {
            ops.push(CommitOp::LockRelated {
                holder: lease(3, 7),
                related: ids.clone(),
                owner: "op:3".into(),
                outcome,
            });
        }
        for applied in [true, false] {
            ops.push(CommitOp::Apply { lease: lease(5, 8), applied, related: ids.clone(), inserted: Vec::new() });
            ops.push(CommitOp::Reset { lease: lease(5, 8), held: applied });
        }
        for (attempts, gave_up) in [(None, false), (Some(1), false), (Some(u32::MAX), true)] {
            ops.push(CommitOp::Failure { lease: lease(6, 11), attempts, gave_up });
        }
        for outcome in [WriteOutcome::Written, WriteOutcome::Busy, WriteOutcome::Missing] {
            ops.push(CommitOp::UpdateUnleased { id: RowId(12), outcome });
        }
        let mut buffer = String::from("before ");
        for op in &ops {
            let start = buffer.len();
            op.write_text(&mut buffer);
            assert_eq!(&buffer[start..], text_by_format(op), "written after other text");
            assert_eq!(op.to_string(), text_by_format(op), "Display");
        }
    }

    #[tokio::test]
    async fn ids_the_store_never_gave_read_no_row() {
        let store = MemStore::new(ManualClock::new(Timestamp(0)));
        store.insert(NewRow::new("k", "ready", serde_json::json!({}))).await.unwrap();
        assert!(store.get(RowId(1)).await.unwrap().is_some());
        for id in [0, -1, 2, i64::MIN, i64::MAX] {
            assert!(store.get(RowId(id)).await.unwrap().is_none(), "row {id} was never inserted");
        }
    }

    #[tokio::test]
    async fn a_fetch_of_no_rows_brings_back_the_expiry_next_expiry_reads() {
        let clock = ManualClock::new(Timestamp(0));
        let store = MemStore::new(clock.clone());
        for status in ["ready", "waiting"] {
            store.insert(NewRow::new("k", status, serde_json::json!({}))).await.unwrap();
        }
        let both = FetchParams { statuses: vec!["waiting".into(), "ready".into()], ..params(2) };
        store.fetch(both.clone()).await.unwrap();
        clock.advance(Duration::from_secs(5));
        let expiry = store.next_expiry(both.clone()).await.unwrap();
        assert_eq!(expiry, Some(Duration::from_secs(25)));
        let nothing = FetchParams { limit: 0, ..both.clone() };
        assert_eq!(store.fetch_with_expiry(nothing).await.unwrap(), (Vec::new(), expiry), "a fetch of limit 0");
        let other = FetchParams { pipeline: "q".into(), ..both };
        assert_eq!(store.fetch_with_expiry(other).await.unwrap(), (Vec::new(), expiry), "every row leased");
    }

    #[tokio::test]
    async fn a_contended_lock_or_reset_resets_the_holder_and_records_both_calls() {
        let store = MemStore::with_history(ManualClock::new(Timestamp(0)));
        for kind in ["k", "child"] {
            store.insert(NewRow::new(kind, "ready", serde_json::json!({}))).await.unwrap();
        }
        let parent = store.fetch(params(1)).await.unwrap().remove(0);
        let child = FetchParams { kind: "child".into(), pipeline: "c".into(), ..params(1) };
        store.fetch(child).await.unwrap();
        let holder = Lease { id: parent.id, token: parent.lock_token.unwrap() };
        let lock = LockRelatedParams {
            holder,
            related: vec![RowId(2)],
            owner: "p".into(),
            lease_ttl: Duration::from_secs(30),
            retry_delay: Duration::from_millis(500),
            park: false,
        };
        assert_eq!(
            store.lock_related_or_reset(lock).await.unwrap(),
            LockAttempt::Reset { held: true, by_own_pipeline: false }
        );
        let texts = store.map_history_from(4, |commit| commit.op.to_string());
        assert_eq!(texts, ["lock_related 1#1 p [2] Contended", "reset 1#1 held=true"]);
    }
}
