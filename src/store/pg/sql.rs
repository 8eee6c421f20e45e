//! Every SQL statement of PgStore (STYLE: SQL lives only in `store/pg`).
//!
//! Conventions: `$1` is always the test clock offset (an `interval`, zero in production), and every store time
//! is `lockstep_now($1)` (see `migrations/0001_resources.sql`). Within one transaction `now()` is constant, so all
//! rows a call writes get one `now`. Spans are `interval`s of microseconds and go through `lockstep_ts_plus` and
//! `lockstep_ts_minus`, which saturate as `Timestamp::plus` and `Timestamp::minus` do. Each statement's comment
//! names the MemStore code it mirrors (src/store/mem.rs); the conformance suite checks they agree.
//!
//! One lock order (DESIGN §2): a statement that writes several rows first locks every row it may write, in id
//! order, in a `locked` CTE (`ORDER BY id FOR NO KEY UPDATE`), and writes only rows of that CTE. PostgreSQL does
//! not fold a CTE with a locking clause into the query, and a row is written only once the CTE has returned it,
//! that is, locked it; so every row lock a statement waits for is taken in id order, and two calls can never wait
//! for each other in a circle. The fetch locks in its own order but with `SKIP LOCKED`: it never waits.
//!
//! The rows of a lease: its own row, found by id (every lease call knows it) and the token it carries, and the
//! rows it locked as related, which carry its token in `lock_token` and again in `related_token`, found through
//! `resources_related_token_idx` (`migrations/0005_related_token.sql`: a lease itself enters no token index, one
//! index entry fewer per lease). Every statement keeps `related_token` NULL or equal to `lock_token`: only a
//! related lock sets it, and every write that clears or replaces a token clears it.

use crate::store::{FetchParams, duration_micros};

/// The columns of a [`Row`](crate::store::Row) of the table aliased `r`, as `codec::row` reads them by name; the
/// version is the tuple's `xmin` ([`Row::version`](crate::store::Row::version)).
macro_rules! row_columns {
    () => {
        "r.id, r.kind, r.parent_id, r.status, r.data, r.created_at, r.updated_at, r.xmin::text::int8 AS version, \
         r.last_processed_at, r.lock_expires_at, r.lock_token, r.lock_owner, r.hinted, r.attempts, r.errors, \
         r.not_before"
    };
}

/// `SET search_path` is sent as a startup option; this checks whether the schema exists before creating it, so a
/// role without `CREATE` on the database can use a schema made for it. `$1`: schema name.
pub(super) const SCHEMA_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)";

/// Whether schema `$1` holds sqlx's migration table (false if the schema itself is missing).
pub(super) const MIGRATIONS_TABLE_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = '_sqlx_migrations')";

/// The relations of schema `$1` whose names lockstep's migrations create (`resources`, `events`, `lock_tokens`,
/// `insert_keys`), by name: found in a schema no lockstep migration is recorded in, they are another application's.
pub(super) const CLASHING_RELATIONS: &str = "SELECT c.relname::text FROM pg_class c \
     JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = $1 AND c.relname IN ('resources', 'events', 'lock_tokens', 'insert_keys') ORDER BY c.relname";

/// The versions of the migrations applied successfully to `schema` (a checked identifier, as for `create_schema`).
pub(super) fn applied_migrations(schema: &str) -> String {
    format!("SELECT version FROM \"{schema}\"._sqlx_migrations WHERE success")
}

/// The store's time. `$1`: clock offset.
pub(super) const NOW: &str = "SELECT lockstep_now($1)";

/// The fetch template (mem.rs `fetch_eligible`, `Store::fetch`): lock up to `{limit}` eligible rows, skipping rows
/// other transactions hold, and lease them in the same statement. Tokens are drawn in fetch order, so the first
/// row gets the smallest. The UPDATE returns rows in no particular order; the caller sorts them. [`fetch`] writes
/// the limit in.
///
/// Eligible rows come from two branches, one per index (`migrations/0004_fetch_index_unleased.sql`): `unleased`,
/// rows with no lease expiry, read from `resources_fetch_idx` in fetch order (the scan stops after `{limit}`
/// eligible rows, and a leased row is not in its range); and `expired`, rows whose lease or mark expired (a
/// takeover), read from `resources_lease_expiry_idx`. Each branch takes at most `{limit}` rows in fetch order and
/// `picked` the first `{limit}` of both, so the rows leased are the first `{limit}` eligible rows in fetch order,
/// as with one scan. A row a branch locked and `picked` left out stays unwritten (its lock ends with the
/// statement). The conditions are the original single scan's, split by `lock_expires_at IS NULL`: with no expiry
/// a row is eligible when it has no owner or this pipeline's (`$4`), and this pipeline's reset rows wait
/// `retry_delay`; an expired row waits `min_processing_interval`; a row that failed since it was last processed
/// (`not_before > last_processed_at`) waits only for its retry time.
///
/// `$2` kind, `$3` statuses (see [`fetch`]), `$4` pipeline, `$5` lease ttl, `$6` retry delay, `$7` min processing
/// interval.
macro_rules! fetch_sql {
    ($status_matches:literal) => {
        concat!(
            "WITH unleased AS (
    SELECT id, last_processed_at
    FROM resources
    WHERE kind = $2
      AND ",
            $status_matches,
            "
      AND lock_expires_at IS NULL
      AND (lock_owner IS NULL OR lock_owner = $4)
      AND (not_before IS NULL OR not_before <= lockstep_now($1))
      AND (last_processed_at IS NULL
           OR hinted
           OR not_before > last_processed_at
           OR CASE WHEN lock_owner = $4
                   THEN last_processed_at <= lockstep_ts_minus(lockstep_now($1), $6)
                   ELSE last_processed_at <= lockstep_ts_minus(lockstep_now($1), $7)
              END)
    ORDER BY last_processed_at NULLS FIRST, id
    LIMIT {limit}
    FOR NO KEY UPDATE SKIP LOCKED
), expired AS (
    SELECT id, last_processed_at
    FROM resources
    WHERE kind = $2
      AND ",
            $status_matches,
            "
      AND lock_expires_at IS NOT NULL
      AND lock_expires_at <= lockstep_now($1)
      AND (not_before IS NULL OR not_before <= lockstep_now($1))
      AND (last_processed_at IS NULL
           OR hinted
           OR not_before > last_processed_at
           OR last_processed_at <= lockstep_ts_minus(lockstep_now($1), $7))
    ORDER BY last_processed_at NULLS FIRST, id
    LIMIT {limit}
    FOR NO KEY UPDATE SKIP LOCKED
), picked AS (
    SELECT id, last_processed_at
    FROM (SELECT id, last_processed_at FROM unleased UNION ALL SELECT id, last_processed_at FROM expired) AS both_kinds
    ORDER BY last_processed_at NULLS FIRST, id
    LIMIT {limit}
), tokened AS (
    SELECT ordered.id, nextval('lock_tokens') AS token
    FROM (SELECT id, last_processed_at FROM picked ORDER BY last_processed_at NULLS FIRST, id) AS ordered
)
UPDATE resources AS r
SET lock_token = tokened.token,
    lock_owner = $4,
    lock_expires_at = lockstep_ts_plus(lockstep_now($1), $5),
    hinted = false,
    related_token = NULL
FROM tokened
WHERE r.id = tokened.id
RETURNING ",
            row_columns!()
        )
    };
}

/// The fetch for several statuses: `$3` is a `text[]`. The index finds each status's rows; they are sorted.
const FETCH: &str = fetch_sql!("status = ANY($3)");

/// The fetch for one status (the common case): `$3` is a `text`. The index yields rows already in fetch order,
/// so the scan stops after `limit` eligible rows instead of sorting every row of the status (a backlog of ready
/// rows would otherwise be read whole by every fetch).
const FETCH_ONE_STATUS: &str = fetch_sql!("status = $3");

/// Where [`fetch`] writes the limit into the templates (three times each).
const LIMIT_MARK: &str = "{limit}";

/// The fetch's text for `statuses` statuses (one, or several as a `text[]`) and at most `limit` rows.
///
/// The limit is a literal of the text, not a parameter, so that the statement's generic plan can see it: with it,
/// PostgreSQL plans an index scan of `resources_fetch_idx` in fetch order that stops at the limit, and after five
/// executions a connection reuses that plan instead of planning the fetch at every call. Planning the fetch costs
/// twice its execution (1.2 ms against 0.6 ms for 13 rows, measured on these machines; docs/benchmarks-history.md,
/// "What made it faster"), and with
/// `LIMIT $n` the generic plan is a sequential scan, so the limit had to be seen either way. One prepared
/// statement per limit value and shape: at most the queue's max of each.
pub(super) fn fetch(statuses: usize, limit: usize) -> String {
    let template = if statuses == 1 { FETCH_ONE_STATUS } else { FETCH };
    template.replace(LIMIT_MARK, &limit.to_string())
}

/// Explaining the fetch's generic plan (tests; PostgreSQL 15 has no `EXPLAIN (GENERIC_PLAN)`), step 1 of 4, in a
/// transaction: generic plans for this transaction only.
pub(super) const FORCE_GENERIC_PLAN: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// Step 2: prepare the fetch of [`fetch`]`(statuses, limit)` as `lockstep_explain_fetch`.
pub(super) fn prepare_fetch(statuses: usize, limit: usize) -> String {
    let statuses_type = if statuses == 1 { "text" } else { "text[]" };
    format!(
        "PREPARE lockstep_explain_fetch(interval, text, {statuses_type}, text, interval, interval, interval) AS {}",
        fetch(statuses, limit)
    )
}

/// Step 3: explain it with the fetch's parameters as [`fetch`] numbers them, written as literals (`EXPLAIN
/// EXECUTE` takes no bind parameters): `offset_micros` the clock offset, `statuses` one or several.
pub(super) fn explain_prepared_fetch(p: &FetchParams, offset_micros: i64) -> String {
    let interval = |micros: i64| format!("'{micros} microseconds'::interval");
    let statuses = match p.statuses.as_slice() {
        [status] => quote(status),
        statuses => format!("ARRAY[{}]::text[]", statuses.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")),
    };
    format!(
        "EXPLAIN EXECUTE lockstep_explain_fetch({}, {}, {statuses}, {}, {}, {}, {})",
        interval(offset_micros),
        quote(&p.kind),
        quote(&p.pipeline),
        interval(duration_micros(p.lease_ttl)),
        interval(duration_micros(p.retry_delay)),
        interval(duration_micros(p.min_processing_interval)),
    )
}

/// `text` as a string literal (`standard_conforming_strings` is on: only quotes need doubling).
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Step 4: forget it (a prepared statement outlives the transaction).
pub(super) const DEALLOCATE_FETCH: &str = "DEALLOCATE lockstep_explain_fetch";

/// The next expiry (mem.rs `next_expiry`): microseconds from the store's now to the least future
/// `lock_expires_at` of the rows of a kind in some statuses, NULL when none (an infinite expiry never ends and is
/// left out). `$1` clock offset, `$2` kind, `$3` statuses (`text[]`).
///
/// One indexed min per status: for each status asked (`unnest($3)`, a nested loop over the statuses), the first
/// entry of `resources_lease_expiry_idx` (kind, status, lock_expires_at; only rows with an expiry) after the
/// store's now and before `'infinity'`, then the least of those. Each is a descent of the index that reads one
/// entry, so a call reads O(statuses × log n) index pages, however many leases are live. `lock_expires_at <
/// 'infinity'` is `isfinite(lock_expires_at)` for an expiry after now (the only other non-finite value,
/// `-infinity`, is never after now), written as a bound of the index range: as a filter, a kind whose only
/// future expiries are infinite would walk them all. A status given twice is read twice and changes no minimum.
///
/// It was `min(lock_expires_at) … WHERE status = ANY($3)`: PostgreSQL 15 does not read an index in order under
/// `= ANY(array)`, so that statement's plan read every entry of the kind's statuses after now, every live lease
/// (3.7–4.2 ms a call with 30 000 live leases, docs/benchmarks-history.md, "Seventh round"), and a fetcher runs it
/// after every empty fetch (`Store::fetch_with_expiry`). `tests/pg_explain.rs` checks the plan.
pub(super) const NEXT_EXPIRY: &str =
    "SELECT (extract(epoch FROM min(first.lock_expires_at) - lockstep_now($1)) * 1000000)::int8
FROM unnest($3::text[]) AS asked(status)
CROSS JOIN LATERAL (
    SELECT r.lock_expires_at
    FROM resources AS r
    WHERE r.kind = $2
      AND r.status = asked.status
      AND r.lock_expires_at > lockstep_now($1)
      AND r.lock_expires_at < 'infinity'::timestamptz
    ORDER BY r.lock_expires_at
    LIMIT 1
) AS first";

/// Explaining the next expiry's generic plan (tests), after [`FORCE_GENERIC_PLAN`] in a transaction: prepare
/// [`NEXT_EXPIRY`] as `lockstep_explain_next_expiry`.
pub(super) fn prepare_next_expiry() -> String {
    format!("PREPARE lockstep_explain_next_expiry(interval, text, text[]) AS {NEXT_EXPIRY}")
}

/// Then `EXPLAIN (ANALYZE, BUFFERS)` of it with the parameters [`NEXT_EXPIRY`] takes, as literals: the clock offset
/// `offset_micros`, `p`'s kind and statuses.
pub(super) fn explain_analyze_prepared_next_expiry(p: &FetchParams, offset_micros: i64) -> String {
    let statuses = p.statuses.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ");
    format!(
        "EXPLAIN (ANALYZE, BUFFERS) EXECUTE lockstep_explain_next_expiry('{offset_micros} microseconds'::interval, {}, \
         ARRAY[{statuses}]::text[])",
        quote(&p.kind)
    )
}

/// Then forget it (a prepared statement outlives the transaction).
pub(super) const DEALLOCATE_NEXT_EXPIRY: &str = "DEALLOCATE lockstep_explain_next_expiry";

/// The refetch: the row if it still carries the token. `$1` id, `$2` token.
pub(super) const REFETCH: &str =
    concat!("SELECT ", row_columns!(), " FROM resources AS r WHERE r.id = $1 AND r.lock_token = $2");

/// The batched refetch (mem.rs `refetch_batch`): the row of every lease that still carries its token, with the
/// lease's position in the input (`input_order`, from 1); a stale or missing lease returns no row, and a lease
/// given twice returns its row twice. The rows come in no particular order; the caller places them by position.
/// `$1` ids (`int8[]`), `$2` tokens (`int8[]`, same length), padded to [`REFETCH_BATCH_LEN_MIN`].
///
/// The plan is a nested loop of primary key lookups, the same for any number of leases.
pub(super) const REFETCH_BATCH: &str = concat!(
    "SELECT lease.input_order, ",
    row_columns!(),
    " FROM unnest($1::int8[], $2::int8[]) WITH ORDINALITY AS lease(id, token, input_order)
JOIN resources AS r ON r.id = lease.id AND r.lock_token = lease.token"
);

/// Fewest leases [`REFETCH_BATCH`] is sent with: shorter batches are padded with leases that match no row (id
/// and token 0: ids and tokens start at 1). PostgreSQL plans a prepared statement afresh at every call (a
/// custom plan) unless its cached generic plan costs less than the custom plans it made so far; the generic plan
/// assumes 10 elements in an array parameter (`estimate_array_length`), so a custom plan for fewer leases always
/// looks cheaper, and a batch of a few refetches paid its planning at every call (≈ 0.12 ms, more than the
/// execution; measured on these machines with 4 leases). From 10 leases on, the custom plans cost at least the
/// generic one, and after five calls each connection reuses the generic plan; a padding lease costs one index
/// lookup that finds nothing.
pub(super) const REFETCH_BATCH_LEN_MIN: usize = 10;

/// The plan counts of [`REFETCH_BATCH`] on this session (tests): `(generic_plans, custom_plans)`, no row
/// before its first call. `$1` the statement's text.
pub(super) const PREPARED_PLANS: &str =
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1";

/// The heartbeat (mem.rs `heartbeat`): lock every row carrying one of the tokens, main and related, in id order;
/// then extend those whose token's main row still carries it under a lease that has not expired (an expired lease
/// is never revived), to the later of their expiry and `now() + ttl` (a heartbeat never shortens a lease, even
/// one that runs in a transaction whose `now()` is old). Returns the extended rows' `(id, lock_token)`; a lease
/// was held if its own row is among them.
///
/// `$2` ids (`int8[]`), `$3` tokens (`int8[]`, same length), `$4` lease ttl.
pub(super) const HEARTBEAT: &str = "WITH locked AS (
    SELECT id, lock_token, lock_expires_at
    FROM resources
    WHERE (id = ANY($2) AND lock_token = ANY($3)) OR related_token = ANY($3)
    ORDER BY id
    FOR NO KEY UPDATE
), held AS (
    SELECT locked.lock_token
    FROM locked
    JOIN unnest($2::int8[], $3::int8[]) AS lease(id, token)
      ON locked.id = lease.id AND locked.lock_token = lease.token
    WHERE locked.lock_expires_at > lockstep_now($1)
)
UPDATE resources AS r
SET lock_expires_at = GREATEST(r.lock_expires_at, lockstep_ts_plus(lockstep_now($1), $4))
FROM locked
WHERE r.id = locked.id AND locked.lock_token IN (SELECT lock_token FROM held)
RETURNING r.id, r.lock_token";

/// Related locks, step 1: lock the holder and the related rows in id order and read what decides whether each is
/// available to the holder (`related_available` in store/types.rs, the rule MemStore applies too): its token, its
/// owner, and whether its lock or mark is live. Step 2 writes only rows this step locked. `$2` ids (related and
/// holder).
pub(super) const LOCK_RELATED_READ: &str = "SELECT id, lock_token, lock_owner,
    lock_expires_at IS NULL OR lock_expires_at > lockstep_now($1) AS live,
    (EXTRACT(EPOCH FROM lock_expires_at - lockstep_now($1)) * 1000000)::int8 AS expires_in_us
FROM resources
WHERE id = ANY($2)
ORDER BY id
FOR NO KEY UPDATE";

/// Related locks, step 2: lock (token set) or mark (token NULL) rows. A mark leaves a row that already carries
/// the owner with no token as it is (mem.rs `own_mark`): a retry never pushes a mark's expiry back. `$2` ids, `$3`
/// token or NULL, `$4` owner, `$5` lease ttl.
pub(super) const LOCK_RELATED_WRITE: &str = "UPDATE resources
SET lock_token = $3, related_token = $3, lock_owner = $4, lock_expires_at = lockstep_ts_plus(lockstep_now($1), $5)
WHERE id = ANY($2)
  AND ($3::int8 IS NOT NULL OR lock_token IS NOT NULL OR lock_owner IS DISTINCT FROM $4)";

/// Related locks, step 3 of a contended lock that parks its holder (DESIGN §3, "Parked waiters"): record that
/// someone waits on the rows that turned it away, so that the write that frees one wakes its waiters (the trigger
/// of migration 0009). The rows are locked by step 1 already. `$1` ids.
pub(super) const LOCK_RELATED_WAIT: &str =
    "UPDATE resources SET lock_waited = true WHERE id = ANY($1) AND NOT lock_waited";

/// Apply, step 1 when there are related updates (mem.rs `apply`): lock every row carrying the token (the main row
/// if still held, and the related rows) in id order, then write the related rows still locked with it. The
/// caller compares the count with the distinct ids it sent and rolls back on a shortfall (Stale); the main write
/// that follows finds its rows locked already.
///
/// `$2` ids, `$3` statuses (`text[]`, NULL = keep), `$4` data (`jsonb[]`, NULL = keep), `$5` token.
pub(super) const APPLY_RELATED: &str = "WITH locked AS (
    SELECT id FROM resources WHERE (id = $6 AND lock_token = $5) OR related_token = $5 ORDER BY id FOR NO KEY UPDATE
)
UPDATE resources AS r
SET status = COALESCE(u.status, r.status),
    data = COALESCE(u.data, r.data),
    updated_at = lockstep_now($1)
FROM unnest($2::int8[], $3::text[], $4::jsonb[]) AS u(id, status, data)
WHERE r.id = u.id AND r.lock_token = $5 AND r.id IN (SELECT id FROM locked)
RETURNING r.id";

/// Apply, step 0 when the item locked related rows it does not update
/// ([`ApplyParams::locked`](crate::store::ApplyParams::locked); mem.rs `State::apply`): lock every row carrying the
/// token (the main row if still held, and the related rows) in id order, as [`APPLY_RELATED`] does, and count the
/// rows of `$1` among them. The caller compares the count with the distinct ids it sent and rolls back on a
/// shortfall (Stale: a related lock was lost, its row may have been written since the holder read it). A row
/// carrying `related_token = $2` carries `lock_token = $2` too.
///
/// `$1` related ids (distinct), `$2` token, `$3` main row id.
pub(super) const APPLY_LOCKED_HELD: &str = "WITH locked AS (
    SELECT id FROM resources WHERE (id = $3 AND lock_token = $2) OR related_token = $2 ORDER BY id FOR NO KEY UPDATE
)
SELECT count(*) FROM locked WHERE id = ANY($1)";

/// A write of one lease ([`APPLY_MAIN`], [`RECORD_FAILURE`], [`RESET_FOR_RETRY`]) in its two statements, run in
/// this order until one returns a row ([`LeaseWrite::statements`]): if the main row `$2` still carries the token
/// `$3`, set `$set` on it, unlock the related rows locked with the token, and return `$select` (of the main row as
/// written); no row from either when stale (then nothing was written).
///
/// - `alone`, for a lease that holds no related rows (the common case, and every apply of the per-item mode): one
///   `UPDATE` of the main row by id and token, guarded by a probe of the small partial index
///   `resources_related_token_idx` (no row carries `related_token = $3` in the statement's snapshot). It locks its
///   one row itself, so there is no order to keep, and it runs none of the CTEs' lock step, second `UPDATE` node
///   and init plans: per-item mode's PostgreSQL CPU per item went from 382 to 307 µs (docs/benchmarks-history.md,
///   "Fifth round"). Not locking first also saves a row lock, a heap write and a WAL record (the fourth round).
/// - `with_related`, when `alone` wrote nothing (the lease holds related rows, or is stale: a stale write costs a
///   second statement, which a stale lease can afford): every row of the lease is locked in id order before any is
///   written (DESIGN §2, one lock order; `tests/pg_lock_order.rs`), then the main row is written and the related
///   rows unlocked. Its own probe keeps it from locking first when a concurrent change (none can add a related row
///   with this token but its holder) left no related rows.
///
/// Either way the related rows are those of the statement's snapshot, as they were when every call locked first.
macro_rules! lease_write {
    ($set:literal, $returning:literal, $select:literal) => {
        LeaseWrite {
            alone: concat!(
                "UPDATE resources
    SET ",
                $set,
                "
    WHERE id = $2 AND lock_token = $3 AND NOT EXISTS (SELECT 1 FROM resources WHERE related_token = $3)
    RETURNING ",
                $select
            ),
            with_related: concat!(
                "WITH related AS (
    SELECT EXISTS (SELECT 1 FROM resources WHERE related_token = $3) AS held
), locked AS (
    SELECT id FROM resources
    WHERE ((id = $2 AND lock_token = $3) OR related_token = $3) AND (SELECT held FROM related)
    ORDER BY id
    FOR NO KEY UPDATE
), main AS (
    UPDATE resources
    SET ",
                $set,
                "
    WHERE id = $2 AND lock_token = $3 AND (NOT (SELECT held FROM related) OR id IN (SELECT id FROM locked))
    RETURNING ",
                $returning,
                "
), unlocked AS (
    UPDATE resources
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    WHERE id IN (SELECT id FROM locked) AND id <> $2 AND EXISTS (SELECT 1 FROM main)
)
SELECT ",
                $select,
                " FROM main"
            ),
        }
    };
}

/// The two statements of a write of one lease (see `lease_write!`).
pub(super) struct LeaseWrite {
    /// For a lease that holds no related rows: one `UPDATE`, no row when the lease holds some (or is stale).
    pub alone: &'static str,
    /// For a lease that holds related rows: lock them all in id order, then write.
    pub with_related: &'static str,
}

impl LeaseWrite {
    /// The statements in the order a write runs them, until one returns a row.
    pub(super) fn statements(&self) -> [&'static str; 2] {
        [self.alone, self.with_related]
    }
}

/// [`APPLY_MAIN`] without its token guard on the main row: the planted bug of
/// [`PgOptions::apply_guard_disabled_for_mutation_test`](super::PgOptions::apply_guard_disabled_for_mutation_test)
/// (mutation testing only). The row is written whoever holds it.
pub(super) const APPLY_MAIN_UNGUARDED: &str = "WITH locked AS (
    SELECT id FROM resources WHERE id = $2 OR related_token = $3 ORDER BY id FOR NO KEY UPDATE
), main AS (
    UPDATE resources
    SET status = COALESCE($4, status),
        data = COALESCE($5, data),
        updated_at = lockstep_now($1),
        last_processed_at = lockstep_now($1),
        attempts = 0,
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    WHERE id = $2
    RETURNING id
), unlocked AS (
    UPDATE resources
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    WHERE id IN (SELECT id FROM locked) AND id <> $2 AND lock_token = $3 AND EXISTS (SELECT 1 FROM main)
)
SELECT lockstep_now($1) FROM main";

/// Apply, the guarded main write (`lease_write!`): if the main row carries the token, write it, set
/// `last_processed_at = updated_at = now`, clear its lease, and unlock the others (related rows).
/// `hinted` is left alone: a hint that arrived during the lease must survive the apply (conformance
/// `hint_during_a_lease_survives_the_apply`; the fetch already cleared hints older than the lease). Returns the one
/// `now`, or no row when stale (then nothing was written).
///
/// `$2` id, `$3` token, `$4` status (NULL = keep), `$5` data (NULL = keep).
pub(super) const APPLY_MAIN: LeaseWrite = lease_write!(
    "status = COALESCE($4, status),
        data = COALESCE($5, data),
        updated_at = lockstep_now($1),
        last_processed_at = lockstep_now($1),
        attempts = 0,
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL",
    "id",
    "lockstep_now($1)"
);

/// Batched apply, the guarded main writes (mem.rs `State::apply`, once per item; `Store::apply_batch`): every row
/// carrying one of the tokens is locked in id order; every input row that still carries its token is written as
/// [`APPLY_MAIN`] writes one, and every other locked row carrying one of the applied tokens (a related row) is
/// unlocked. A row whose token changed is left alone, and so are the related rows of its token. Returns the
/// applied `(id, token)` pairs with the one `now`; no row when nothing applied.
///
/// `main` takes the locked ids as one array (`ARRAY(SELECT id FROM locked)`, an init plan, run once before the first
/// row is written): as a semi join (`r.id IN (SELECT id FROM locked)`) the planner, which cannot estimate how many
/// rows `locked` finds, chose a nested loop that rescanned `locked` for every written row (the drain bench's
/// PostgreSQL CPU was 1.5 × until this, docs/benchmarks-history.md, "Third round"). The array is scanned per
/// written row: 100 × 100
/// comparisons of `int8` at most.
///
/// `unlocked` filters the locked rows by "not a main row written" first (a hashed lookup per locked row): in the
/// common batch, where no lease holds related rows, that leaves none, and nothing else of it runs. Filtering by
/// token first joined every locked row with every written one and looked each up by id (about a third of a 60-item
/// apply's execution time, measured with `EXPLAIN ANALYZE`, docs/benchmarks-history.md, "First round: measured
/// first").
///
/// `$2` ids, `$3` tokens (distinct), `$4` statuses (`text[]`, NULL = keep), `$5` data (`jsonb[]`, NULL = keep),
/// all the same length.
pub(super) const APPLY_BATCH_MAIN: &str = "WITH locked AS (
    SELECT id, lock_token FROM resources
    WHERE (id = ANY($2) AND lock_token = ANY($3)) OR related_token = ANY($3)
    ORDER BY id
    FOR NO KEY UPDATE
), main AS (
    UPDATE resources AS r
    SET status = COALESCE(u.status, r.status),
        data = COALESCE(u.data, r.data),
        updated_at = lockstep_now($1),
        last_processed_at = lockstep_now($1),
        attempts = 0,
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM unnest($2::int8[], $3::int8[], $4::text[], $5::jsonb[]) AS u(id, token, status, data)
    WHERE r.id = u.id AND r.lock_token = u.token AND r.id = ANY(ARRAY(SELECT id FROM locked))
    RETURNING r.id, u.token
), unlocked AS (
    UPDATE resources AS r
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM locked
    WHERE r.id = locked.id
      AND locked.id NOT IN (SELECT id FROM main)
      AND locked.lock_token IN (SELECT token FROM main)
)
SELECT id, token, lockstep_now($1) AS now FROM main";

/// Batched apply with related updates, inserts or events, step 1: lock every main and related row of the batch,
/// and every row carrying one of its tokens (related rows locked without an update), in id order, and read their
/// tokens, so the caller can tell which items are held whole before writing anything; the later steps write only
/// rows locked here. `$1` ids, `$2` tokens.
pub(super) const APPLY_BATCH_LOCK: &str = "SELECT id, lock_token FROM resources
WHERE id = ANY($1) OR related_token = ANY($2)
ORDER BY id
FOR NO KEY UPDATE";

/// Batched apply, step 2: the related updates of the held items, each guarded by its item's token. Returns the
/// written ids; the caller checks that every one was written (it holds their row locks since step 1).
///
/// `$2` ids (distinct), `$3` tokens, `$4` statuses (NULL = keep), `$5` data (NULL = keep).
pub(super) const APPLY_BATCH_RELATED: &str = "UPDATE resources AS r
SET status = COALESCE(u.status, r.status),
    data = COALESCE(u.data, r.data),
    updated_at = lockstep_now($1)
FROM unnest($2::int8[], $3::int8[], $4::text[], $5::jsonb[]) AS u(id, token, status, data)
WHERE r.id = u.id AND r.lock_token = u.token
RETURNING r.id";

/// A failure (mem.rs `record_failure`, `State::record_failure`; `lease_write!`): if the row still carries the
/// token, count the attempt, append the error (with the attempt and the store time as Unix microseconds) and keep
/// the last `$7`, clear the lease and unlock related rows locked with the token, then
/// either set `not_before = now + $5` (retry) or, with a give-up status `$6`, set the status and clear
/// `not_before`. Returns the new attempt count, or no row when stale (then nothing was written).
///
/// `$2` id, `$3` token, `$4` error text (bounded by the caller), `$5` delay, `$6` give-up status or NULL, `$7` errors
/// kept.
pub(super) const RECORD_FAILURE: LeaseWrite = lease_write!(
    "attempts = attempts + 1,
        errors = (
            SELECT COALESCE(jsonb_agg(kept.e ORDER BY kept.n), '[]'::jsonb)
            FROM jsonb_array_elements(errors || jsonb_build_array(jsonb_build_object(
                    'attempt', attempts + 1,
                    'at', (extract(epoch FROM lockstep_now($1)) * 1000000)::bigint,
                    'error', $4::text))) WITH ORDINALITY AS kept(e, n)
            WHERE kept.n > jsonb_array_length(errors) + 1 - $7::int
        ),
        status = COALESCE($6::text, status),
        not_before = CASE WHEN $6::text IS NULL THEN lockstep_ts_plus(lockstep_now($1), $5) END,
        updated_at = lockstep_now($1),
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL",
    "attempts",
    "attempts"
);

/// Reset-and-retry (mem.rs `reset_for_retry`; `lease_write!`): keep the owner, clear token and expiry, set
/// `not_before = now + $4` (`last_processed_at` stays: the row keeps its place in fetch order), and unlock related
/// rows. Returns one row when the lease was held. `$2` id, `$3` token, `$4` delay.
pub(super) const RESET_FOR_RETRY: LeaseWrite = lease_write!(
    "lock_token = NULL, lock_expires_at = NULL, related_token = NULL,
        not_before = lockstep_ts_plus(lockstep_now($1), $4)",
    "id",
    "id"
);

/// Release (mem.rs `release`): lock every row carrying one of the tokens in id order, then clear the lease
/// columns of those whose token's main row still carries it. Returns the `(id, token)` pairs that were held. `$1`
/// ids, `$2` tokens. Writes no timestamp, so it takes no clock offset.
pub(super) const RELEASE: &str = "WITH locked AS (
    SELECT id, lock_token FROM resources
    WHERE (id = ANY($1) AND lock_token = ANY($2)) OR related_token = ANY($2)
    ORDER BY id
    FOR NO KEY UPDATE
), held AS (
    SELECT locked.id, locked.lock_token
    FROM locked
    JOIN unnest($1::int8[], $2::int8[]) AS lease(id, token)
      ON locked.id = lease.id AND locked.lock_token = lease.token
), unlocked AS (
    UPDATE resources AS r
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM locked
    WHERE r.id = locked.id AND locked.lock_token IN (SELECT lock_token FROM held)
)
SELECT id, lock_token FROM held";

/// Inserts one row. `$2` kind, `$3` parent, `$4` status, `$5` data.
pub(super) const INSERT: &str = concat!(
    "INSERT INTO resources AS r (kind, parent_id, status, data, created_at, updated_at)
VALUES ($2, $3, $4, $5, lockstep_now($1), lockstep_now($1))
RETURNING ",
    row_columns!()
);

/// A keyed insert, step 1 (mem.rs `insert_keyed`; `migrations/0007_insert_keys.sql`): the row key `$1` names, if
/// any.
pub(super) const KEYED_ROW: &str = "SELECT row_id FROM insert_keys WHERE key = $1";

/// A keyed insert, step 2, after [`INSERT`] in the same transaction: the key `$2` names the new row `$3`, unless a
/// concurrent insert with the key committed first (then no row: the caller rolls back and reads that one's row with
/// [`KEYED_ROW`]). `ON CONFLICT` waits for a concurrent inserter of the key to end before it decides.
pub(super) const INSERT_KEY: &str = "INSERT INTO insert_keys (key, row_id, created_at)
VALUES ($2, $3, lockstep_now($1))
ON CONFLICT (key) DO NOTHING
RETURNING row_id";

/// Inserts many rows in one statement, ids assigned in input order (rows are produced in `ordinality` order and
/// each takes the next id as it is inserted; the caller checks the returned ids increase). `$2` kinds, `$3`
/// parents, `$4` statuses, `$5` data, all the same length.
pub(super) const INSERT_MANY: &str = "INSERT INTO resources (kind, parent_id, status, data, created_at, updated_at)
SELECT new.kind, new.parent_id, new.status, new.data, lockstep_now($1), lockstep_now($1)
FROM unnest($2::text[], $3::int8[], $4::text[], $5::jsonb[]) WITH ORDINALITY AS new(kind, parent_id, status, data, n)
ORDER BY new.n
RETURNING id";

/// The statements of an insert on a caller's connection (`enqueue`): [`INSERT_MANY`], [`KEYED_ROW`] and
/// [`INSERT_KEY`] with every name of the store qualified by its schema, since the caller's `search_path` need not
/// hold it (`pg_notify` and `unnest` are `pg_catalog`'s, which every `search_path` searches first). Built once per
/// store; the same parameters as the statements they mirror.
pub(super) struct CallerInserts {
    /// [`INSERT_MANY`], qualified.
    pub(super) insert_many: String,
    /// [`KEYED_ROW`], qualified.
    pub(super) keyed_row: String,
    /// [`INSERT_KEY`], qualified.
    pub(super) insert_key: String,
}

impl CallerInserts {
    /// The statements for `schema`, a name `check_schema` accepted (identifiers cannot be bound as parameters).
    pub(super) fn new(schema: &str) -> CallerInserts {
        let s = format!("\"{schema}\"");
        CallerInserts {
            insert_many: format!(
                "INSERT INTO {s}.resources (kind, parent_id, status, data, created_at, updated_at)
SELECT new.kind, new.parent_id, new.status, new.data, {s}.lockstep_now($1), {s}.lockstep_now($1)
FROM unnest($2::text[], $3::int8[], $4::text[], $5::jsonb[]) WITH ORDINALITY AS new(kind, parent_id, status, data, n)
ORDER BY new.n
RETURNING id"
            ),
            keyed_row: format!("SELECT row_id FROM {s}.insert_keys WHERE key = $1"),
            insert_key: format!(
                "INSERT INTO {s}.insert_keys (key, row_id, created_at)
VALUES ($2, $3, {s}.lockstep_now($1))
ON CONFLICT (key) DO NOTHING
RETURNING row_id"
            ),
        }
    }
}

/// Fetch hints without row marks, as [`HINTS`] sends them (delivered at commit, dropped at rollback). `$1` channel,
/// `$2` payloads (one per kind). Names nothing of the store's schema.
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload";

/// Appends events in input order. `$2` row ids, `$3` kinds, `$4` data.
pub(super) const INSERT_EVENTS: &str = "INSERT INTO events (row_id, kind, data, at)
SELECT new.row_id, new.kind, new.data, lockstep_now($1)
FROM unnest($2::int8[], $3::text[], $4::jsonb[]) WITH ORDINALITY AS new(row_id, kind, data, n)
ORDER BY new.n
RETURNING seq";

/// Reads a row. `$1` id.
pub(super) const GET: &str = concat!("SELECT ", row_columns!(), " FROM resources AS r WHERE r.id = $1");

/// Rows by id, each once, in id order. `$1` ids.
pub(super) const ROWS_BY_ID: &str =
    concat!("SELECT ", row_columns!(), " FROM resources AS r WHERE r.id = ANY($1::int8[]) ORDER BY r.id");

/// Rows of a kind, all or one parent's, by id. `$1` kind, `$2` parent or NULL.
pub(super) const LIST: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM resources AS r WHERE r.kind = $1 AND ($2::int8 IS NULL OR r.parent_id = $2) ORDER BY r.id"
);

/// One query of [`Store::query`](crate::store::Store::query) (mem.rs `State::query`, `RowQuery::matches`): the
/// rows of a kind that pass the query's filters, by id. Parameters are numbered in the order the filters appear
/// and only for the filters given (`$1` kind, then parent, statuses `text[]`, after, ids `int8[]`), so that each
/// shape is one prepared statement whose plan the planner can fit to its index: a parent and statuses use
/// `resources_parent_status_idx`, a parent alone `resources_parent_idx`, ids the primary key, and statuses alone
/// both halves of the rows of a kind and status, `resources_fetch_idx` (no lease expiry) and
/// `resources_lease_expiry_idx` (one), in a bitmap OR, then a sort by id: each index holds only its half
/// (`migrations/0004_fetch_index_unleased.sql`), and the filter that is always true, `lock_expires_at IS NULL OR
/// lock_expires_at IS NOT NULL`, is what lets the planner use the two together.
pub(super) fn query(parent: bool, statuses: bool, after: bool, ids: bool) -> String {
    let mut text = concat!("SELECT ", row_columns!(), " FROM resources AS r WHERE r.kind = $1").to_string();
    let mut n = 1;
    let mut filter = |on: bool, condition: &str| {
        if on {
            n += 1;
            text.push_str(&condition.replace('#', &n.to_string()));
        }
    };
    filter(parent, " AND r.parent_id = $#");
    filter(statuses, " AND r.status = ANY($#::text[])");
    filter(after, " AND r.id > $#");
    filter(ids, " AND r.id = ANY($#::int8[])");
    if statuses && !parent {
        text.push_str(" AND (r.lock_expires_at IS NULL OR r.lock_expires_at IS NOT NULL)");
    }
    text.push_str(" ORDER BY r.id");
    text
}

/// Starts the read-only transaction of a [`query`] call of several queries: they all read one snapshot.
pub(super) const QUERY_SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// Events about a row, in sequence order. `$1` row id.
/// Every row of the schema by id (chaos mode's snapshots, `history`).
pub(super) const ALL_ROWS: &str = concat!("SELECT ", row_columns!(), " FROM resources AS r ORDER BY r.id");

pub(super) const EVENTS: &str = "SELECT seq, row_id, kind, data, at FROM events WHERE row_id = $1 ORDER BY seq";

/// Retention (mem.rs `State::purge`, `Store::purge`): deletes up to `$5` rows of kind `$2` in one of the statuses
/// `$3` whose `updated_at` is `$4` or more before now, oldest id first, that carry no live lease, lock or owner mark
/// and that no row names as its parent, with their events; with parent statuses `$6` (not empty), only rows whose
/// parent is in one of them (a final status, which no write changes again, so the parent is not locked). `SKIP
/// LOCKED`: a row another transaction holds is left for the next call, so retention never waits for a lock a fetch
/// or an apply holds (and never holds one past its own short transaction). Returns the deleted ids.
pub(super) const PURGE: &str = "WITH doomed AS (
    SELECT r.id FROM resources r
    WHERE r.kind = $2 AND r.status = ANY($3) AND r.updated_at <= lockstep_ts_minus(lockstep_now($1), $4)
      AND ((r.lock_token IS NULL AND r.lock_owner IS NULL) OR r.lock_expires_at <= lockstep_now($1))
      AND NOT EXISTS (SELECT 1 FROM resources c WHERE c.parent_id = r.id)
      AND (cardinality($6::text[]) = 0
           OR EXISTS (SELECT 1 FROM resources p WHERE p.id = r.parent_id AND p.status = ANY($6::text[])))
    ORDER BY r.id
    LIMIT $5
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM events e USING doomed d WHERE e.row_id = d.id
)
DELETE FROM resources r USING doomed d WHERE r.id = d.id
RETURNING r.id";

/// The write API's update (mem.rs `update_unleased`): lock the row and the rows carrying its token in id order;
/// busy while a live lease or an owner's reset mark is on the row; otherwise clear any expired lease (and the
/// related rows locked with its token), then write. Returns no row when the row is missing, else whether it was
/// busy. `$2` id, `$3` status, `$4` data.
///
/// The token is read before the locks are taken; in the instant between, only a fetch or a related lock can give
/// the row another token, and either makes it busy, so nothing is left to unlock that `locked` missed.
pub(super) const UPDATE_UNLEASED: &str = "WITH locked AS (
    SELECT id, lock_token, lock_expires_at, lock_owner
    FROM resources
    WHERE id = $2 OR related_token = (SELECT lock_token FROM resources WHERE id = $2)
    ORDER BY id
    FOR NO KEY UPDATE
), target AS (
    SELECT id, lock_token,
        (lock_expires_at IS NOT NULL AND lock_expires_at > lockstep_now($1))
            OR (lock_expires_at IS NULL AND lock_owner IS NOT NULL) AS busy
    FROM locked
    WHERE id = $2
), written AS (
    UPDATE resources AS r
    SET status = COALESCE($3, r.status),
        data = COALESCE($4, r.data),
        updated_at = lockstep_now($1),
        lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM target
    WHERE r.id = target.id AND NOT target.busy
), unlocked AS (
    UPDATE resources AS r
    SET lock_token = NULL, lock_owner = NULL, lock_expires_at = NULL, related_token = NULL
    FROM locked, target
    WHERE r.id = locked.id AND locked.lock_token = target.lock_token AND r.id <> target.id AND NOT target.busy
)
SELECT busy FROM target";

/// The fetch hints of a call's applied items ([`ApplyParams::hints`](crate::store::ApplyParams::hints)), in one
/// statement: lock the rows named in id order (DESIGN §2, one lock order: it writes several rows, and a heartbeat
/// or apply of a lease holding some of them locks them in id order too), mark them, and `NOTIFY` each payload
/// once. The marks take the locked ids as one array (an init plan, run before the first row is written), as
/// [`APPLY_BATCH_MAIN`] does. `$1` row ids, `$2` channel, `$3` payloads (one per kind).
pub(super) const HINTS: &str = "WITH locked AS (
    SELECT id FROM resources WHERE id = ANY($1::int8[]) ORDER BY id FOR NO KEY UPDATE
), marked AS (
    UPDATE resources SET hinted = true WHERE id = ANY(ARRAY(SELECT id FROM locked))
)
SELECT pg_notify($2, payload) FROM unnest($3::text[]) AS payload";

/// A fetch hint: mark the row (if any) and `NOTIFY` (delivered at commit). `$1` row id or NULL, `$2` channel,
/// `$3` payload.
pub(super) const HINT: &str = "WITH marked AS (
    UPDATE resources SET hinted = true WHERE id = $1
)
SELECT pg_notify($2, $3)";

/// Ends the sessions listening on a channel (tests of the listener's reconnect), waiting up to 5 s for each.
/// `$1` channel. Returns how many were ended. A listener's last statement is exactly `LISTEN "channel"` (sqlx's
/// `PgListener::listen`, or with a `;` when it listens again after a reconnect): an exact match, so a channel
/// whose name merely contains this one (another test run's) is never touched.
pub(super) const TERMINATE_LISTENERS: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND query IN ('LISTEN \"' || $1 || '\"', 'LISTEN \"' || $1 || '\";')";

/// Ends the sessions of one application (tests of lost connections), waiting up to 5 s for each.
/// `$1` application_name. Returns how many were ended.
pub(super) const TERMINATE_SESSIONS: &str = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND application_name = $1";

/// Planner statistics for the resource table (tests that EXPLAIN the fetch).
pub(super) const ANALYZE: &str = "ANALYZE resources";

/// `CREATE SCHEMA` for a name `check_schema` accepted (identifiers cannot be bound as parameters).
pub(super) fn create_schema(schema: &str) -> String {
    format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")
}

/// The migration lock of a schema (`migrate_schema`): a session-level advisory lock, held until the migrating
/// session ends. `$1` the key, a hash of the schema's name.
pub(super) const MIGRATION_LOCK: &str = "SELECT pg_advisory_lock($1)";

/// A setting of this session (tests of the session time-outs). `$1` its name.
pub(super) const CURRENT_SETTING: &str = "SELECT current_setting($1)";

/// Bounds the wait of `drop_schema` for locks (a blocked test must not hang).
pub(super) const DROP_SCHEMA_LOCK_TIMEOUT: &str = "SET lock_timeout = '5s'";

/// `DROP SCHEMA … CASCADE` for a name `check_schema` accepted.
pub(super) fn drop_schema(schema: &str) -> String {
    format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")
}

/// A statement that raises SQLSTATE `sqlstate` (tests of the error mapping; the caller checks the code's shape).
pub(super) fn raise(sqlstate: &str) -> String {
    format!("DO $$ BEGIN RAISE EXCEPTION 'raised for a test' USING ERRCODE = '{sqlstate}'; END $$")
}
