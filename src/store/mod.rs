//! The store: one trait over every byte of shared state, and its homes (DESIGN §2).
//!
//! Each [`Store`] call is one atomic transaction. The engine in [`crate::pipeline`] is generic over `S: Store` and
//! never names a backend. [`MemStore`] is the embedded default and the simulator's database; `PgStore` (PostgreSQL,
//! not in simulator builds) serves production.

mod clock;
pub mod conformance;
mod error;
mod mem;
#[cfg(not(madsim))]
mod pg;
mod types;
mod values;

pub use clock::{Clock, ManualClock, TokioClock};
pub use error::StoreError;
pub use mem::{Commit, CommitOp, MemStore};
#[cfg(not(madsim))]
pub use pg::{PgOptions, PgStore};
pub use types::*;
pub use values::{
    FAILURE_ERROR_BYTES_MAX, FAILURE_ERRORS_KEPT, KEY_TEXT_BYTES_MAX, bounded_error, check_apply, check_event,
    check_failure, check_fetch, check_insert_keyed, check_json, check_key, check_new_row, check_purge, check_query,
    check_text, check_update, parent_missing,
};

use std::future::Future;
use std::time::Duration;
use tokio::sync::broadcast;

/// A fetch hint as it travels between services and fetchers: the kind of rows that became ready.
pub type Hint = String;

/// The catch-up hint: every kind may have rows that became ready unheard, so every fetcher should look. PgStore's
/// listener sends it to its own subscribers after it lost its session and listens again (hints sent meanwhile
/// were lost). Subscribers treat it as they treat a lag. A real kind named `*` is only woken more often.
pub const HINT_EVERY_KIND: &str = "*";

/// Capacity of a hint subscription's buffer; a subscriber that falls further behind sees
/// `RecvError::Lagged` and must treat it as "every kind was hinted".
pub const HINT_BUFFER_LEN_MAX: usize = 1024;

/// A user of a store's connection pool, such as a pipeline (its config says how many connections its workers,
/// fetch loops, heartbeater and apply batches hold at once, DESIGN §3): what `PgOptions::with_pool_for` sizes a
/// pool from. The layers above the store state their needs through it, so the store names none of them.
pub trait PoolUser {
    /// The most connections of the pool this user holds at once.
    fn connections_needed(&self) -> usize;
}

/// The lease operations of the pipeline engine plus plain reads and writes (DESIGN §2).
///
/// Every call is atomic, and every timestamp it writes comes from the store's own clock. The protocol's expected
/// outcomes (stale, contended, busy) are values; `Err(StoreError)` means the store itself failed and the outcome
/// of a write may be unknown.
///
/// Values PostgreSQL cannot store (a NUL in text or jsonb, an index key past [`KEY_TEXT_BYTES_MAX`]) are refused by
/// every backend alike, before anything is written (DESIGN §2): `insert`, `apply`, `apply_batch`,
/// `update_unleased`, `fetch`, `lock_related` and `record_failure` return [`StoreError::Invalid`] naming the call,
/// the field and the rule. An `apply_batch` with one bad item writes nothing and fails whole; the engine's batcher
/// checks items before batching and sends the items of a batch that still fails one by one.
///
/// A row's parent must exist when the row is inserted (DESIGN §2, "Parents"): `insert`, `insert_id`,
/// `insert_many`, `insert_keyed` and the inserts of `apply` and `apply_batch` return [`StoreError::Invalid`]
/// ([`parent_missing`]: `insert_many: rows[1]: parent_id 12 names no row …`) for a row whose `parent_id` names no
/// row, and write nothing; a stale apply inserts nothing, so its rows are not judged. A row inserted by the same
/// call cannot be a parent (its id is not known before the call). On PostgreSQL a foreign key holds the rule, so an
/// insert under a parent that a concurrent [`Store::purge`] deletes is refused, or keeps the parent.
pub trait Store: Send + Sync + 'static {
    /// Leases up to `limit` eligible rows of `kind`, oldest `last_processed_at` first (never-processed rows
    /// first, then by id), setting `lock_expires_at = now + lease_ttl`, a fresh `lock_token` per row, `lock_owner
    /// = pipeline`, and clearing `hinted`.
    ///
    /// Eligible (dstack PIPELINES, checklist 1; DESIGN §3): status in `statuses`; and either no live lease and
    /// no owner other than `pipeline`, or an expired lease of any owner (an expired foreign lease is taken, so a
    /// dead parent never starves its children, dstack #3704); not before its retry time (`not_before`, which
    /// [`Store::record_failure`] sets), hinted or not; and either never processed, or hinted, or failed since it
    /// was last processed (`not_before > last_processed_at`: its retry time paces it, not the interval), or
    /// processed at least `min_processing_interval` ago, where for a row this pipeline reset for retry
    /// `retry_delay` replaces `min_processing_interval`.
    fn fetch(&self, params: FetchParams) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// How long, on the store's clock from its `now`, until the first lease or mark on the rows `params` looks at
    /// ends: the least `lock_expires_at − now` over rows of `params.kind` in one of `params.statuses` whose
    /// `lock_expires_at` is in the future (a live lease of any owner, a related lock, or an intent mark), or
    /// `None` when there is none. Writes nothing; the other fields of `params` are ignored.
    ///
    /// A fetcher that found nothing to lease asks it so that it can fetch again when a lease it had to skip
    /// expires, rather than at the end of its backoff (a dead replica's rows are taken over within
    /// the lease ttl plus a small slack). MemStore finds it in the empty fetch's own scan
    /// ([`Store::fetch_with_expiry`]); PgStore reads one entry of its lease-expiry index per status, however many
    /// leases are live.
    ///
    /// The default answers `None` (no expiry known: the fetcher keeps its backoff); backends override it.
    fn next_expiry(&self, params: FetchParams) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        let _ = params;
        async { Ok(None) }
    }

    /// A fetch and, when it leased nothing, the [`Store::next_expiry`] of the same rows: what a fetcher needs
    /// after every fetch (an empty one waits for the first lease it had to skip). Returns the leased rows and,
    /// only when there are none, the expiry (`None` after a fetch that leased rows).
    ///
    /// Two steps, not one atomic call: the default makes the two calls one after the other, as PgStore runs two
    /// statements and the simulator's network store two calls (docs/simulator.md, "Atomic units"); another
    /// pipeline's lease taken between them counts in the expiry. MemStore overrides it with one scan. A failed
    /// [`Store::next_expiry`] is logged and answers `None`: the fetch itself succeeded.
    fn fetch_with_expiry(
        &self,
        params: FetchParams,
    ) -> impl Future<Output = Result<(Vec<Row>, Option<Duration>), StoreError>> + Send {
        async move {
            let rows = self.fetch(params.clone()).await?;
            if !rows.is_empty() {
                return Ok((rows, None));
            }
            match self.next_expiry(params.clone()).await {
                Ok(expiry) => Ok((rows, expiry)),
                Err(error) => {
                    tracing::warn!(pipeline = %params.pipeline, %error, "next expiry failed");
                    Ok((rows, None))
                }
            }
        }
    }

    /// Reads the row if it still carries `lease.token`; `None` means the lease is stale.
    fn refetch(&self, lease: Lease) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send;

    /// Several refetches in one call (DESIGN §3, Batching: the workers' loads by token, grouped): the outcome of
    /// each lease, in input order, is what [`Store::refetch`] would return for it: the row if it still carries
    /// the lease's token, `None` if the lease is stale or the row is missing. Writes nothing, so a lease given
    /// twice reads the same row twice.
    ///
    /// `Err` means the store failed and no outcome is known for any lease.
    ///
    /// The default refetches the leases one call at a time; backends that can do better (one statement, one
    /// lock) override it. An empty batch returns an empty vector without calling the store.
    fn refetch_batch(&self, leases: Vec<Lease>) -> impl Future<Output = Result<Vec<Option<Row>>, StoreError>> + Send {
        async move {
            let mut rows = Vec::with_capacity(leases.len());
            for lease in leases {
                rows.push(self.refetch(lease).await?);
            }
            Ok(rows)
        }
    }

    /// Extends every lease in `params.leases` that is still held, and the related rows locked with the same
    /// tokens, to `now + lease_ttl`, or leaves a row's expiry as it is where it is already later: a heartbeat
    /// never shortens a lease (a shorter ttl, or a `now` read in a transaction that began long ago, cannot make
    /// others count a live holder as dead). Returns the leases still held; the others were lost or re-tokened and
    /// are not written.
    ///
    /// Held means the row carries the lease's token *and* the lease has not expired (`lock_expires_at > now`):
    /// a heartbeat never revives an expired lease, even one no one took over, because others may already have
    /// acted on its expiry (the controller declares a node lost when its node lease expires, and a late
    /// heartbeat must not bring that session back). The guarded apply still accepts an expired lease no
    /// one took (its guard is the token).
    fn heartbeat(&self, params: HeartbeatParams) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Locks every row of `params.related` with the holder's token and `params.owner`, all or nothing.
    ///
    /// A related row is available unless it holds a live lease with another token, or carries another owner's
    /// mark with no token (a reset main row, or another locker's intent mark that has not expired). On
    /// contention no lock is taken, and the available rows get `owner` as an intent mark that expires after
    /// `lease_ttl` (dstack PIPELINES, "Locking many related resources"), except rows that already carry `owner`
    /// with no token (its own intent mark, fresh or expired, or its reset mark), which are left as they are: a
    /// parent's contended retries never push back the expiry of the marks it left, so a mark holds its row for
    /// the parent at most one lease ttl, and once it expired the row's own pipeline takes it (a parent
    /// that re-marked its children at every retry kept their pipeline off them for minutes). A row is marked again
    /// only after someone took it (its own pipeline's apply or release clears the mark).
    fn lock_related(&self, params: LockRelatedParams) -> impl Future<Output = Result<LockOutcome, StoreError>> + Send;

    /// [`Store::lock_related`], and on [`LockOutcome::Contended`] the longest span from the store's `now` until
    /// the unavailable rows' locks or marks expire (`None` when one has none, or the backend does not tell): what a
    /// parked waiter's timer waits for at the latest (DESIGN §3, "Parked waiters"). With
    /// [`LockRelatedParams::park`], a contended call also records the holder as a waiter on each unavailable row.
    ///
    /// The default calls [`Store::lock_related`] and tells no span; MemStore and PgStore override it.
    fn lock_related_until(
        &self,
        params: LockRelatedParams,
    ) -> impl Future<Output = Result<(LockOutcome, Option<Duration>), StoreError>> + Send {
        async move { Ok((self.lock_related(params).await?, None)) }
    }

    /// A related lock and, if it is contended, the reset-and-retry of the holder's lease that follows it
    /// (DESIGN §3: reset-and-retry when a related lock is unavailable): [`Store::lock_related`] of `params`, then,
    /// on [`LockOutcome::Contended`], [`Store::reset_for_retry`] of `params.holder`. Both are recorded as the two
    /// calls would record them. With [`LockRelatedParams::park`], a contended lock records its waits and resets
    /// nothing: [`LockAttempt::Parked`] with [`Store::lock_related_until`]'s span.
    ///
    /// Two steps, not one atomic call: the default makes the two calls one after the other, as PgStore runs a
    /// transaction and a statement and the simulator's network store two calls (docs/simulator.md, "Atomic
    /// units"). Between them the holder may lose its lease (the reset then writes nothing: `held` false), and a
    /// failure after the lock committed leaves its intent marks and the holder's lease, which then expires.
    /// Errors: the store's; after a contended lock, the reset's (the lease is then left to expire).
    fn lock_related_or_reset(
        &self,
        params: LockRelatedParams,
    ) -> impl Future<Output = Result<LockAttempt, StoreError>> + Send {
        async move {
            let (holder, retry_delay, park) = (params.holder, params.retry_delay, params.park);
            Ok(match self.lock_related_until(params).await? {
                (LockOutcome::Locked, _) => LockAttempt::Locked,
                (LockOutcome::Stale, _) => LockAttempt::Stale,
                (LockOutcome::Contended { by_own_pipeline }, until) if park => {
                    LockAttempt::Parked { until, by_own_pipeline }
                }
                (LockOutcome::Contended { by_own_pipeline }, _) => {
                    LockAttempt::Reset { held: self.reset_for_retry(holder, retry_delay).await?, by_own_pipeline }
                }
            })
        }
    }

    /// [`Store::lock_related_or_reset`], and when the lock is taken, the related rows as it left them, read in the
    /// same call: what a handler that locks rows in order to read them needs, in one round trip (a
    /// lock and then a read of what it locked were two). Nobody else writes a row while it carries the holder's
    /// token, and the apply is stale unless every row locked still carries it ([`ApplyParams::locked`]: a lock
    /// that expired while its holder stalled may have gone to the row's own pipeline), so the rows read are the
    /// rows the holder will apply to. Errors as `lock_related_or_reset`'s.
    ///
    /// The default makes the lock (and reset) calls, then reads each row with [`Store::get`]; backends override it
    /// with the lock and the read in one transaction (PgStore) or one call (the simulator's network store). The
    /// reset of a contended lock is a second step there, as in `lock_related_or_reset`.
    fn lock_related_and_read(
        &self,
        params: LockRelatedParams,
    ) -> impl Future<Output = Result<LockRead, StoreError>> + Send {
        async move {
            let mut ids = params.related.clone();
            Ok(match self.lock_related_or_reset(params).await? {
                LockAttempt::Locked => {
                    ids.sort_unstable();
                    ids.dedup();
                    let mut rows = Vec::with_capacity(ids.len());
                    for id in ids {
                        let row = self.get(id).await?;
                        rows.push(row.ok_or_else(|| StoreError::Other(format!("locked related row {id} is gone")))?);
                    }
                    LockRead::Locked(rows)
                }
                LockAttempt::Reset { held, by_own_pipeline } => LockRead::Reset { held, by_own_pipeline },
                LockAttempt::Parked { until, by_own_pipeline } => LockRead::Parked { until, by_own_pipeline },
                LockAttempt::Stale => LockRead::Stale,
            })
        }
    }

    /// The guarded apply: if the main row and every row of `params.related` and `params.locked` still carry
    /// `params.lease.token`, writes the update, the related updates, the inserts and the events; clears the lease
    /// columns of the main
    /// row and of every related row locked with the token; sets the main row's `last_processed_at` and every
    /// written row's `updated_at` to one `now`, and the main row's `attempts` to 0 (a success ends a streak of
    /// failures; `errors` stay). It leaves `hinted` as it is: only a fetch consumes a hint, and one
    /// that arrived during the lease may announce a change the worker never read. Once it commits, it publishes
    /// `params.hints` as [`Store::hint`] would (the rows they name are marked hinted in the same transaction where
    /// the backend can; PgStore and the simulator's network store mark and publish them in a step after the
    /// commit, which a failure can lose: docs/simulator.md, "Atomic units"). Otherwise writes nothing, publishes nothing and returns `Stale` (dstack PIPELINES,
    /// checklist 5, 6 and 8, "Bulk apply with one consistent current time").
    fn apply(&self, params: ApplyParams) -> impl Future<Output = Result<ApplyOutcome, StoreError>> + Send;

    /// Several guarded applies in one transaction (DESIGN §3, Batching): the outcome of each item, in input
    /// order, is what [`Store::apply`] would have returned had the items been applied one after another in that
    /// order. Each item is guarded by its own `id + lock_token` (and its related rows by the same token): a stale
    /// item writes nothing and is reported `Stale` alone, without affecting the others. Every applied item shares
    /// the transaction's one `now`; inserted rows get ids in item order, then in each item's order, and events are
    /// appended in the same order. A lease given twice applies at most once (the later copy is stale). The hints
    /// of the applied items are published after the commit, each kind once per call in the backends that
    /// override this (PostgreSQL delivers one `NOTIFY` per payload and transaction); a stale item's are not.
    ///
    /// `Err` means the store failed and no outcome is known for any item: some, all or none may have been
    /// written (a failed commit, or the default's sequential calls stopping half-way).
    ///
    /// The default applies the items one call at a time; backends that can do better (one transaction, one
    /// lock) override it. An empty batch returns an empty vector without calling the store.
    fn apply_batch(
        &self,
        batch: Vec<ApplyParams>,
    ) -> impl Future<Output = Result<Vec<ApplyOutcome>, StoreError>> + Send {
        async move {
            let mut outcomes = Vec::with_capacity(batch.len());
            for params in batch {
                outcomes.push(self.apply(params).await?);
            }
            Ok(outcomes)
        }
    }

    /// Records that the holder of `params.lease` failed its item (DESIGN §3, failures; river, graphile-worker,
    /// Oban): if the row still carries the token, adds one to `attempts`, appends the error (bounded by
    /// [`bounded_error`], with the store's `now` and the new attempt number) to `errors`, keeping the last
    /// [`FAILURE_ERRORS_KEPT`], clears the lease columns (owner too, so any replica's pipeline may retry it) and
    /// unlocks related rows locked with the token, and sets `updated_at = now`. Then, for [`Retry::After`],
    /// `not_before = now + delay` (no fetch takes the row before, hinted or not); for [`Retry::GiveUp`], the row
    /// takes the given status and `not_before` is cleared. `last_processed_at` stays as it is, so the row keeps
    /// its place in fetch order. Otherwise writes nothing and returns `Stale`.
    ///
    /// Errors: `Invalid` when the give-up status is not a valid status ([`check_failure`]), before any write.
    fn record_failure(&self, params: FailureParams) -> impl Future<Output = Result<FailureOutcome, StoreError>> + Send;

    /// Reset-and-retry: if the row still carries `lease.token`, keeps `lock_owner`, clears `lock_token` and
    /// `lock_expires_at`, sets `not_before = now + delay` (no fetch takes the row before, hinted or not), and
    /// releases related rows locked with the token. Returns whether the lease was still held (dstack PIPELINES,
    /// checklist 7).
    ///
    /// `last_processed_at` stays as it is, so a contended row keeps its place in fetch order (DESIGN §3, related
    /// locks): dstack's reset stamps it `now`, which sends the row behind every row that arrived while it waited,
    /// and under overload a contended parent then waits for the whole backlog (the swarm's starvation seeds).
    fn reset_for_retry(&self, lease: Lease, delay: Duration) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives leases back unprocessed (on shutdown): clears the lease columns of every row still carrying its
    /// token, and of related rows locked with it, without touching `last_processed_at`. Returns how many main
    /// rows were released.
    fn release(&self, leases: Vec<Lease>) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Inserts a row and returns it as stored. Errors: `Invalid` for a bad value or a parent that does not exist.
    fn insert(&self, row: NewRow) -> impl Future<Output = Result<Row, StoreError>> + Send;

    /// [`Store::insert`], returning only the new row's id, for a caller that does not read the row (an agent's
    /// reports: a 10 000-job gang restart inserts 20 000 of them). The same checks, the same write and
    /// commit. The default calls [`Store::insert`]; MemStore does not copy the row it stored.
    fn insert_id(&self, row: NewRow) -> impl Future<Output = Result<RowId, StoreError>> + Send {
        let inserted = self.insert(row);
        async move { Ok(inserted.await?.id) }
    }

    /// Inserts `rows` in one transaction, all or none, and once it commits publishes `hints` (as
    /// [`ApplyParams::hints`]: rows named are marked hinted, each kind once); returns the new rows' ids in input
    /// order. For a writer of many rows at once (an agent's reports: a thousand starts of one gang were a thousand
    /// round trips). Errors: `Invalid` for a row [`Store::insert`] would refuse, before any write.
    ///
    /// It is also an enqueue in the caller's transaction where the store has none to join (MemStore, the
    /// simulator): the caller's own rows, as rows of their own kind, and its work items in one call, with
    /// [`NewHint::kinds_of`] the rows as `hints`, commit together or not at all and wake each kind's fetchers once
    /// committed. `PgStore::insert_in` stores the same rows and sends the same hints on the caller's connection, at
    /// the caller's commit (docs/real-mode.md, "Enqueue in your own transaction").
    ///
    /// The default checks every row, then inserts them one call at a time and sends each hint with
    /// [`Store::hint`] (not atomic: a failure half-way leaves the rows before it); backends override it.
    fn insert_many(
        &self,
        rows: Vec<NewRow>,
        hints: Vec<NewHint>,
    ) -> impl Future<Output = Result<Vec<RowId>, StoreError>> + Send {
        async move {
            for (i, row) in rows.iter().enumerate() {
                check_new_row(&format!("insert_many: rows[{i}]"), row)?;
            }
            let mut ids = Vec::with_capacity(rows.len());
            for row in rows {
                ids.push(self.insert_id(row).await?);
            }
            for hint in hints {
                self.hint(&hint.kind, hint.row).await?;
            }
            Ok(ids)
        }
    }

    /// Inserts `params.row` unless a row was inserted under `params.key` before, in one transaction with the key
    /// (a unique index of keys the store keeps: PostgreSQL's `insert_keys` table, MemStore's map, the simulated
    /// database's index of keyed inserts). Returns the row the key names and whether this call inserted it. So a
    /// call whose outcome is unknown (an error, a lost reply) can be made again with the same key and inserts
    /// nothing twice (a retried submit runs once); a second call returns the first row whatever its own
    /// row holds. Two calls with one key at once insert one row: the later waits for the earlier's transaction and
    /// returns its row.
    ///
    /// Errors: `Invalid` for a key or a row [`Store::insert`] would refuse (empty or oversized key, NUL), before
    /// any write; the store's. The default refuses every call (`Invalid`): a store that keeps no keys cannot keep
    /// the promise. MemStore, PgStore and the simulator's network store implement it.
    fn insert_keyed(&self, params: InsertKeyedParams) -> impl Future<Output = Result<KeyedInsert, StoreError>> + Send {
        let key = params.key;
        async move { Err(StoreError::Invalid(format!("insert_keyed {key:?}: this store keeps no insert keys"))) }
    }

    /// Reads a row.
    fn get(&self, id: RowId) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send;

    /// Rows of `kind` whose parent is `parent` (any parent when `None`), by id.
    fn list(&self, kind: &str, parent: Option<RowId>) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Several indexed reads in one call: for each query, in input order, the rows that pass its filters
    /// ([`RowQuery::matches`]), by id. The reads see one state of the store (one snapshot: MemStore's lock,
    /// PostgreSQL's repeatable-read transaction), as `list` does for its one read.
    ///
    /// A query costs about the rows it returns: each filter is served by an index. Errors:
    /// `Invalid` for a kind or status PostgreSQL text cannot hold ([`check_query`]), before any read.
    ///
    /// The default answers each query from [`Store::get`] (with `ids`) or [`Store::list`] and filters: the same
    /// rows, at the cost of reading every row of the kind (or parent). Backends override it.
    fn query(&self, queries: Vec<RowQuery>) -> impl Future<Output = Result<Vec<Vec<Row>>, StoreError>> + Send {
        async move {
            check_query(&queries)?;
            let mut answers = Vec::with_capacity(queries.len());
            for q in queries {
                let rows = match &q.ids {
                    Some(ids) => {
                        let ids: std::collections::BTreeSet<RowId> = ids.iter().copied().collect();
                        let mut rows = Vec::with_capacity(ids.len());
                        for id in ids {
                            rows.extend(self.get(id).await?);
                        }
                        rows
                    }
                    None => self.list(&q.kind, q.parent).await?,
                };
                answers.push(rows.into_iter().filter(|row| q.matches(row)).collect());
            }
            Ok(answers)
        }
    }

    /// [`Store::list`], with each row handed to `read` by reference instead of returned, as [`Store::query_map`]
    /// is to `query`. The default calls [`Store::list`] and maps its rows.
    fn list_map<T, F>(
        &self,
        kind: &str,
        parent: Option<RowId>,
        read: F,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send
    where
        T: Send,
        F: Fn(&Row) -> T + Send,
    {
        let rows = self.list(kind, parent);
        async move { Ok(rows.await?.iter().map(read).collect()) }
    }

    /// [`Store::query`], with each row handed to `read` by reference instead of returned: the answers hold what
    /// `read` made of the rows, in the same order. The same reads, the same snapshot and the same errors as `query`.
    ///
    /// A caller that decodes rows into its own types saves a copy of every row (copying rows and their
    /// JSON data was most of a 10 000-job gang restart's CPU). MemStore calls `read` under its lock, so `read`
    /// should only decode; the default calls [`Store::query`] and maps its rows.
    fn query_map<T, F>(
        &self,
        queries: Vec<RowQuery>,
        read: F,
    ) -> impl Future<Output = Result<Vec<Vec<T>>, StoreError>> + Send
    where
        T: Send,
        F: Fn(&Row) -> T + Send,
    {
        async move {
            let answers = self.query(queries).await?;
            Ok(answers.iter().map(|rows| rows.iter().map(&read).collect()).collect())
        }
    }

    /// Events about `row`, in sequence order.
    fn events(&self, row: RowId) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// A write API's update of a row that respects leases: writes only if the row has no live lease and no
    /// owner mark, else returns `Busy` (DESIGN §3, write APIs).
    fn update_unleased(
        &self,
        id: RowId,
        update: RowUpdate,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send;

    /// Retention: deletes up to `params.limit` rows of `params.kind` in one of `params.statuses` whose `updated_at`
    /// is at least `params.older_than` before the store's `now`, oldest id first, with their events, in one
    /// transaction; returns how many it deleted. A row is kept while anything may still need it: while it carries
    /// a live lease or lock or an owner mark (a reset for retry, an intent mark), and while any row names it as
    /// its parent (so a parent goes after its children; on PostgreSQL a child whose insert has not committed keeps
    /// its parent too, as the parent foreign key locks it: DESIGN §2, "Parents"). Keys of [`Store::insert_keyed`]
    /// that name a deleted row are kept: a retried keyed insert still finds its first row's id (and no row under
    /// it). With `params.parent_statuses`, only rows whose parent is in one of them go (a row without a parent
    /// stays).
    ///
    /// Errors: `Invalid` for an empty kind or status list or a limit outside 1 to [`PURGE_LIMIT_MAX`]. The
    /// default is for stores that wrap another in tests: they delete nothing and say so (`Invalid`).
    fn purge(&self, params: PurgeParams) -> impl Future<Output = Result<usize, StoreError>> + Send {
        async move { Err(StoreError::Invalid(format!("purge of {}: this store deletes no rows", params.kind))) }
    }

    /// Publishes a fetch hint for `kind` after the call commits; with `row`, also marks that row `hinted` so the
    /// next fetch takes it without waiting `min_processing_interval`. Hints reach every subscriber of every
    /// replica sharing the store (PostgreSQL: `NOTIFY`).
    fn hint(&self, kind: &str, row: Option<RowId>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A new subscription to fetch hints. It sees hints published after this call.
    fn subscribe_hints(&self) -> broadcast::Receiver<Hint>;

    /// The store's current time.
    fn now(&self) -> impl Future<Output = Result<Timestamp, StoreError>> + Send;

    /// Most calls the store serves at once (a connection pool's size), or `None` when unbounded (MemStore).
    /// The manager refuses pipelines that need more (DESIGN §3).
    fn connection_limit(&self) -> Option<usize> {
        None
    }
}
