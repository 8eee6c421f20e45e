//! PgStore: the [`Store`] on PostgreSQL through sqlx, with MemStore's semantics (DESIGN §2). Not in simulator
//! builds.
//!
//! Each store call is one statement, or one transaction where a call needs several, and every timestamp it
//! writes is the database's `now()` (plus a clock offset that only tests set), one `now` per transaction. The
//! fetch leases rows with `FOR NO KEY UPDATE SKIP LOCKED` in the statement that selects them; guarded writes
//! match `id + lock_token`. Fetch hints travel as `NOTIFY` between replicas (see `listen`). The SQL lives in
//! `sql`, the type conversions in `codec`, the error mapping in `error`, the calls that need a transaction of
//! several statements (apply, related locks) in `write`, the batched apply in `apply_batch`, the inserts on a
//! caller's own connection and transaction ([`PgStore::insert_in`]) in `enqueue`, the connection options in
//! `options`.

mod apply_batch;
mod codec;
mod enqueue;
mod error;
mod history;
mod listen;
mod options;
mod retry;
mod session;
mod sql;
mod write;

pub use options::PgOptions;

use crate::store::{
    ApplyOutcome, ApplyParams, CommitOp, Event, FAILURE_ERRORS_KEPT, FailureOutcome, FailureParams, FetchParams,
    HINT_BUFFER_LEN_MAX, HeartbeatParams, Hint, InsertKeyedParams, KeyedInsert, Lease, LockOutcome, LockRead,
    LockRelatedParams, NewHint, NewRow, PurgeParams, Retry, Row, RowId, RowQuery, RowUpdate, Store, StoreError,
    Timestamp, WriteOutcome, bounded_error, check_apply, check_failure, check_fetch, check_insert_keyed, check_key,
    check_new_row, check_purge, check_query, check_text, check_update, duration_micros, parent_missing,
};
use codec::{PgTime, interval};
use session::Session;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection, PgConnection, Row as _};
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{broadcast, oneshot};

/// The PostgreSQL store. Clones share one pool, clock offset and hint listener; the listener stops when the
/// last clone is dropped.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    channel: String,
    /// The inserts [`PgStore::insert_in`] and [`PgStore::insert_keyed_in`] run, qualified by `schema`.
    caller_inserts: sql::CallerInserts,
    /// Tags this store's `NOTIFY` payloads, so its listener skips hints it already delivered locally.
    instance: u64,
    clock_offset_micros: AtomicI64,
    /// The bounds a `Timeout` reports.
    waits: options::Waits,
    /// How to open the migration's own session (`migrate`).
    migration: PgConnectOptions,
    /// Calls run again after a conflict, since the store opened (`retry`).
    conflict_retries: AtomicU64,
    max_connections: u32,
    /// [`PgOptions::call_timeout`]; zero: unbounded.
    call_timeout: Duration,
    hints: broadcast::Sender<Hint>,
    /// Chaos mode ([`PgOptions::history`]): the `caller` of this store's history records (its
    /// `application_name`); `None` records nothing.
    history: Option<String>,
    /// [`PgOptions::apply_guard_disabled_for_mutation_test`].
    apply_guard_disabled: bool,
    /// Dropped with the store, which stops the listener task.
    _listener_shutdown: oneshot::Sender<()>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore").field("schema", &self.inner.schema).finish_non_exhaustive()
    }
}

impl PgStore {
    /// [`Store::apply`] without its hints: the guarded write alone.
    async fn apply_unhinted(&self, p: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        self.bounded(async {
            check_apply(&p)?;
            let simple = p.related.is_empty() && p.locked.is_empty() && p.inserts.is_empty() && p.events.is_empty();
            let guarded = !self.inner.apply_guard_disabled;
            if !simple || self.inner.history.is_some() {
                let record = self.inner.history.is_some().then_some(self);
                let outcome = self
                    .run_inserting(
                        "apply",
                        || write::apply_in_transaction(&self.inner.pool, self.offset(), p.clone(), record, guarded),
                        |parent| apply_naming(std::slice::from_ref(&p), parent),
                    )
                    .await?;
                if record.is_some() && outcome == ApplyOutcome::Stale {
                    self.record_stale_apply(p.lease).await;
                }
                return Ok(outcome);
            }
            // One statement, so no explicit transaction (saves the BEGIN and COMMIT round trips).
            let now = self
                .run_again_on_conflict("apply", || {
                    let (pool, offset, lease, update) = (&self.inner.pool, self.offset(), p.lease, p.update.clone());
                    async move {
                        let mut conn = pool.acquire().await?;
                        write::apply_main(&mut conn, offset, lease, update, guarded).await
                    }
                })
                .await?;
            Ok(match now {
                Some(now) => ApplyOutcome::Applied { inserted: Vec::new(), now },
                None => ApplyOutcome::Stale,
            })
        })
        .await
    }

    /// [`Store::apply_batch`] without its hints: the guarded writes alone.
    async fn apply_batch_unhinted(&self, mut batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        self.bounded(async {
            // A bad value would fail the whole transaction in PostgreSQL; refuse it before SQL, as MemStore does.
            batch.iter().try_for_each(check_apply)?;
            match batch.len() {
                0 => Ok(Vec::new()),
                // One item: the single apply's statement is the same work without the batch's bookkeeping.
                1 => Ok(vec![self.apply_unhinted(batch.pop().expect("one item")).await?]),
                // The planted bug lives in the single apply's statement: one item at a time.
                _ if self.inner.apply_guard_disabled => {
                    let mut outcomes = Vec::with_capacity(batch.len());
                    for p in batch {
                        outcomes.push(self.apply_unhinted(p).await?);
                    }
                    Ok(outcomes)
                }
                _ => {
                    let outcomes = self
                        .run_inserting(
                            "apply_batch",
                            || {
                                let record = self.inner.history.is_some().then_some(self);
                                apply_batch::apply_batch(&self.inner.pool, self.offset(), batch.clone(), record)
                            },
                            |parent| apply_naming(&batch, parent),
                        )
                        .await?;
                    if self.inner.history.is_some() {
                        let stale = batch.iter().zip(&outcomes).filter(|(_, o)| **o == ApplyOutcome::Stale);
                        for (p, _) in stale {
                            self.record_stale_apply(p.lease).await;
                        }
                    }
                    Ok(outcomes)
                }
            }
        })
        .await
    }

    /// [`Store::lock_related`] in one transaction; with `read`, a lock that is taken also reads the related rows
    /// before it commits (`write::lock_related_in_transaction`).
    async fn lock_related_reading(
        &self,
        p: LockRelatedParams,
        read: bool,
    ) -> Result<(LockOutcome, Vec<Row>, Option<Duration>), StoreError> {
        self.bounded(async {
            check_text(&format!("lock_related {}#{}", p.holder.id, p.holder.token), "owner", &p.owner)?;
            let outcome = self
                .run_again_on_conflict("lock_related", || {
                    let record = self.inner.history.is_some().then_some(self);
                    write::lock_related_in_transaction(&self.inner.pool, self.offset(), p.clone(), record, read)
                })
                .await?;
            if self.inner.history.is_some() && matches!(outcome, Ok((LockOutcome::Stale, _, _))) {
                let LockRelatedParams { holder, related, owner, .. } = p;
                self.record_stale(CommitOp::LockRelated { holder, related, owner, outcome: LockOutcome::Stale }).await;
            }
            outcome
        })
        .await
    }

    /// Publishes the fetch hints of a call's applied items once the call committed: one statement marks the rows
    /// they name and sends one `NOTIFY` per kind, then this store's own subscribers hear each kind at once. A hint
    /// that fails is logged, not returned: the apply committed, and a lost hint costs a fetcher at most its backoff.
    async fn publish_hints(&self, hints: Vec<NewHint>) {
        if hints.is_empty() {
            return;
        }
        let rows: Vec<i64> = hints.iter().filter_map(|hint| hint.row).map(|id| id.0).collect();
        let mut kinds: Vec<&str> = Vec::new();
        for hint in &hints {
            if !kinds.contains(&hint.kind.as_str()) {
                kinds.push(&hint.kind);
            }
        }
        let payloads: Vec<String> = kinds.iter().map(|kind| listen::payload(self.inner.instance, kind)).collect();
        let sent = self
            .bounded(async {
                sqlx::query(sql::HINTS)
                    .bind(&rows)
                    .bind(&self.inner.channel)
                    .bind(&payloads)
                    .execute(&self.inner.pool)
                    .await
                    .map_err(|e| self.fail(e))
            })
            .await;
        if let Err(error) = sent {
            tracing::warn!(?kinds, %error, "fetch hints after an apply failed");
            return;
        }
        for kind in kinds {
            // No subscriber is not an error.
            let _ = self.inner.hints.send(kind.to_string());
        }
    }

    /// Connects to `url` with default [`PgOptions`] and runs the migrations.
    ///
    /// Errors: `Invalid` for a malformed URL (`url: …`, the rule of [`PgOptions::check_url`] for one that is empty
    /// or not PostgreSQL's) or a role, password or database the server refuses (SQLSTATE class 28, 3D000), `Unavailable`/`Timeout` when PostgreSQL cannot be reached, `Other` when a migration fails. No
    /// error contains the URL.
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        PgStore::connect_with(PgOptions::new(url)).await
    }

    /// Connects with `options`: creates the schema if missing and runs the migrations (both under the schema's
    /// migration lock, so processes started together on a new schema take turns), opens the pool (each
    /// connection's `search_path` is the schema, and its time-outs are the options'), and starts the hint
    /// listener, returning once it listens.
    ///
    /// Errors: as [`PgStore::connect`], plus `Invalid` for a schema name outside the allowed characters or a
    /// time-out PostgreSQL cannot take.
    pub async fn connect_with(options: PgOptions) -> Result<PgStore, StoreError> {
        options::check_schema(&options.schema)?;
        PgOptions::check_url(&options.url).map_err(|rule| StoreError::Invalid(format!("url: {rule}")))?;
        options.check_listen()?;
        let waits = options.waits();
        let fail = |err| error::store_error(err, waits);
        let base = options::connect_options(&options.url).map_err(fail)?;
        // Every session of the store (pool, listener, migration) logs a slow statement at INFO, not sqlx's WARN
        // past 1 s with the statement's whole text (see `PgOptions::slow_statement_threshold`).
        let base = base
            .application_name(&options.application_name)
            .log_slow_statements(log::LevelFilter::Info, options.slow_statement_threshold);
        let migration = base.clone().options(options.session_settings(true)?);
        if options.migrate {
            let lock = first_session(&migration, waits).await?;
            migrate_schema(lock, &migration, &options.schema, options.acquire_timeout)
                .await
                .map_err(|err| err.into_store(fail))?;
        } else {
            check_migrated(first_session(&base, waits).await?, &options.schema).await?;
        }
        // Startup options rather than an `after_connect` hook: no extra round trip per connection, and they
        // survive `RESET ALL`. Plans are cached as PostgreSQL chooses (`plan_cache_mode = auto`): every statement
        // finds its rows by primary key, token or the fetch index, and the fetch writes its limit into its text so
        // that its generic plan is the index scan (see `sql::fetch`; tests/pg_explain.rs checks the generic plan).
        // Forcing custom plans made every call plan again: 0.12 ms for a refetch by primary key against 0.03 ms
        // with the cached plan, 1.2 ms for the fetch against 0.06 ms (docs/benchmarks-history.md, "What made it
        // faster").
        let connect = base.options(options.session_settings(false)?);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(options.ping_before_use)
            .after_release(release_check(options.call_timeout))
            .connect_with(connect.clone())
            .await
            .map_err(fail)?;
        if options.history {
            sqlx::query(history::CREATE).execute(&pool).await.map_err(fail)?;
        }
        let channel = listen::channel(&options.schema);
        let instance = listen::instance();
        let (hints, _) = broadcast::channel(HINT_BUFFER_LEN_MAX);
        let (shutdown, shutdown_rx) = oneshot::channel();
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                caller_inserts: sql::CallerInserts::new(&options.schema),
                schema: options.schema,
                channel: channel.clone(),
                instance,
                clock_offset_micros: AtomicI64::new(duration_micros(options.clock_offset)),
                waits,
                migration,
                conflict_retries: AtomicU64::new(0),
                max_connections: options.max_connections,
                call_timeout: options.call_timeout,
                hints: hints.clone(),
                history: options.history.then(|| options.application_name.clone()),
                apply_guard_disabled: options.apply_guard_disabled_for_mutation_test,
                _listener_shutdown: shutdown,
            }),
        };
        let listener = listen::ListenerConfig {
            connect,
            channel,
            instance,
            check_interval: options.listen_check_interval,
            check_timeout: options.listen_check_timeout,
        };
        listen::start(listener, hints, shutdown_rx).await.map_err(|err| store.fail(err))?;
        Ok(store)
    }

    /// Runs the migrations in `migrations/` not yet applied to this store's schema (idempotent), on a session of
    /// its own under the schema's migration lock, as connecting does.
    ///
    /// Errors: `Unavailable`/`Timeout` when PostgreSQL cannot be reached, `Other` when a migration fails or the
    /// schema holds migrations this build does not know.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let (migration, schema) = (&self.inner.migration, &self.inner.schema);
        let lock = PgConnection::connect_with(migration).await.map_err(|err| self.fail(err))?;
        migrate_schema(lock, migration, schema, self.inner.waits.acquire)
            .await
            .map_err(|err| err.into_store(|err| self.fail(err)))
    }

    /// How many store calls of this store (and its clones) were run again after a serialization failure or
    /// deadlock (DESIGN §2, "One lock order"): tests check that PgStore's own calls never deadlock each other.
    #[doc(hidden)]
    pub fn conflict_retries(&self) -> u64 {
        self.inner.conflict_retries.load(Ordering::Relaxed)
    }

    /// How many of the pool's connections sit idle, given back and checked (tests that must not start a fault
    /// while a connection is still being checked).
    #[doc(hidden)]
    pub fn idle_connections(&self) -> usize {
        self.inner.pool.num_idle()
    }

    /// How many of the pool's connections are out: in a call, or on their way back to the pool or to their close
    /// (tests that wait for a given-up call's session to settle).
    #[doc(hidden)]
    pub fn connections_out(&self) -> usize {
        (self.inner.pool.size() as usize).saturating_sub(self.inner.pool.num_idle())
    }

    /// The value of the PostgreSQL setting `name` on one of the pool's sessions (tests that check the session
    /// time-outs).
    #[doc(hidden)]
    pub async fn session_setting(&self, name: &str) -> Result<String, StoreError> {
        sqlx::query_scalar(sql::CURRENT_SETTING).bind(name).fetch_one(&self.inner.pool).await.map_err(|e| self.fail(e))
    }

    /// Closes the pool: waits for the calls in flight, then closes every connection; later calls fail with
    /// `Unavailable`. The hint listener's session ends when the last clone of the store is dropped.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    /// The schema holding this store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Moves this store's clock forward by `span` (tests only: production leaves the offset at zero). Affects
    /// every later call of every clone; other `PgStore`s on the same schema keep their own offsets.
    #[doc(hidden)]
    pub fn advance_clock(&self, span: Duration) {
        let micros = duration_micros(span);
        // The closure always returns `Some`, so the update cannot fail.
        let _ = self
            .inner
            .clock_offset_micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |offset| Some(offset.saturating_add(micros)));
    }

    /// The SQL text of the fetch with `params` (for tests that EXPLAIN it): one text per limit for a single
    /// status, one per limit for several.
    #[doc(hidden)]
    pub fn fetch_sql(params: &FetchParams) -> String {
        sql::fetch(params.statuses.len(), params.limit)
    }

    /// Refreshes the planner's statistics, then returns `EXPLAIN` of the fetch with `params`, one plan line per
    /// element (tests that check the fetch uses an index).
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn explain_fetch(&self, params: &FetchParams) -> Result<Vec<String>, StoreError> {
        let pool = &self.inner.pool;
        sqlx::query(sql::ANALYZE).execute(pool).await.map_err(|e| self.fail(e))?;
        let explain = AssertSqlSafe(format!("EXPLAIN {}", PgStore::fetch_sql(params)));
        let lines =
            fetch_query(sqlx::query(explain), self.offset(), params).fetch_all(pool).await.map_err(|e| self.fail(e))?;
        lines.iter().map(|line| line.try_get::<String, _>(0)).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    /// Refreshes the planner's statistics, then returns `EXPLAIN` of the fetch's generic plan with `params`: the
    /// plan a connection reuses once it has run the fetch five times (tests that check it still uses the index).
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn explain_fetch_generic(&self, params: &FetchParams) -> Result<Vec<String>, StoreError> {
        let pool = &self.inner.pool;
        sqlx::query(sql::ANALYZE).execute(pool).await.map_err(|e| self.fail(e))?;
        let mut session = Session::acquire(pool).await.map_err(|e| self.fail(e))?;
        let mut tx = session.begin().await.map_err(|e| self.fail(e))?;
        sqlx::query(sql::FORCE_GENERIC_PLAN).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let prepare = AssertSqlSafe(sql::prepare_fetch(params.statuses.len(), params.limit));
        sqlx::query(prepare).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let explain = AssertSqlSafe(sql::explain_prepared_fetch(params, self.offset().microseconds));
        let lines = sqlx::query(explain).fetch_all(&mut *tx).await.map_err(|e| self.fail(e))?;
        sqlx::query(sql::DEALLOCATE_FETCH).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        tx.rollback().await.map_err(|e| self.fail(e))?;
        lines.iter().map(|line| line.try_get::<String, _>(0)).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    /// `EXPLAIN (ANALYZE, BUFFERS)` of the fetch's generic plan with `params`, run in a transaction that is rolled
    /// back (the rows it leases are left as they were; the token sequence moves on). No `ANALYZE` first: the
    /// benchmark calls it under load to see what a fetch of the running pipeline reads.
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn explain_analyze_fetch_generic(&self, params: &FetchParams) -> Result<Vec<String>, StoreError> {
        let mut session = Session::acquire(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        let mut tx = session.begin().await.map_err(|e| self.fail(e))?;
        sqlx::query(sql::FORCE_GENERIC_PLAN).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let prepare = AssertSqlSafe(sql::prepare_fetch(params.statuses.len(), params.limit));
        sqlx::query(prepare).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let explain = sql::explain_prepared_fetch(params, self.offset().microseconds).replacen(
            "EXPLAIN",
            "EXPLAIN (ANALYZE, BUFFERS)",
            1,
        );
        let lines = sqlx::query(AssertSqlSafe(explain)).fetch_all(&mut *tx).await.map_err(|e| self.fail(e))?;
        tx.rollback().await.map_err(|e| self.fail(e))?;
        lines.iter().map(|line| line.try_get::<String, _>(0)).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    /// `EXPLAIN (ANALYZE, BUFFERS)` of the generic plan of [`Store::next_expiry`] with `params`' kind and statuses,
    /// the plan a connection reuses once it has run the statement five times, one plan line per element (tests
    /// that check how many index entries and pages the read visits). The statement writes nothing; it runs in a
    /// transaction that is rolled back.
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn explain_analyze_next_expiry_generic(&self, params: &FetchParams) -> Result<Vec<String>, StoreError> {
        let mut session = Session::acquire(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        let mut tx = session.begin().await.map_err(|e| self.fail(e))?;
        sqlx::query(sql::FORCE_GENERIC_PLAN).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let prepare = AssertSqlSafe(sql::prepare_next_expiry());
        sqlx::query(prepare).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        let explain = AssertSqlSafe(sql::explain_analyze_prepared_next_expiry(params, self.offset().microseconds));
        let lines = sqlx::query(explain).fetch_all(&mut *tx).await.map_err(|e| self.fail(e))?;
        sqlx::query(sql::DEALLOCATE_NEXT_EXPIRY).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
        tx.rollback().await.map_err(|e| self.fail(e))?;
        lines.iter().map(|line| line.try_get::<String, _>(0)).collect::<Result<_, _>>().map_err(|e| self.fail(e))
    }

    /// `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)` of the single apply's guarded statements (`Store::apply` of a
    /// lease with no related updates, inserts or events) for `lease` and `update`, as the apply runs them: in order
    /// until one writes (its plan's top node returns a row). Run in a transaction that is rolled back: nothing is
    /// written. One plan per statement run, one line per plan element (tests that check which statements an apply
    /// runs and which rows it locks first).
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn explain_analyze_apply(&self, lease: Lease, update: RowUpdate) -> Result<Vec<Vec<String>>, StoreError> {
        let mut session = Session::acquire(&self.inner.pool).await.map_err(|e| self.fail(e))?;
        let mut tx = session.begin().await.map_err(|e| self.fail(e))?;
        let mut plans = Vec::new();
        for statement in sql::APPLY_MAIN.statements() {
            let explain = AssertSqlSafe(format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {statement}"));
            let lines = sqlx::query(explain)
                .bind(self.offset())
                .bind(lease.id.0)
                .bind(lease.token.0)
                .bind(update.status.as_deref())
                .bind(update.data.as_ref().map(Json))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.fail(e))?;
            let plan: Vec<String> =
                lines.iter().map(|line| line.try_get(0)).collect::<Result<_, _>>().map_err(|e| self.fail(e))?;
            let wrote = plan.first().is_some_and(|top| !top.contains("actual rows=0 "));
            plans.push(plan);
            if wrote {
                break;
            }
        }
        tx.rollback().await.map_err(|e| self.fail(e))?;
        Ok(plans)
    }

    /// How often this store's connection planned the batched refetch: `(generic, custom)` plans, `None` before
    /// its first call (tests that check a connection reuses the generic plan; run them on a pool of one
    /// connection, as the counts are per session).
    #[doc(hidden)]
    pub async fn refetch_batch_plans(&self) -> Result<Option<(i64, i64)>, StoreError> {
        sqlx::query_as(sql::PREPARED_PLANS)
            .bind(sql::REFETCH_BATCH)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(|e| self.fail(e))
    }

    /// Drops `schema` and everything in it, on a connection of its own (tests clean up after a passing case).
    /// Refuses [`PgOptions::SCHEMA_DEFAULT`]. Gives up with an error after 5 s waiting for a lock, rather than
    /// hang a test whose runtime is blocked while a connection still holds one.
    #[doc(hidden)]
    pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
        options::check_schema(schema)?;
        if schema == "public" || schema == PgOptions::SCHEMA_DEFAULT {
            return Err(StoreError::Invalid(format!("drop_schema: refusing to drop {schema}")));
        }
        let fail = |err| error::store_error(err, options::Waits::DEFAULT);
        let options = options::connect_options(url).map_err(fail)?;
        let mut conn = PgConnection::connect_with(&options).await.map_err(fail)?;
        sqlx::query(sql::DROP_SCHEMA_LOCK_TIMEOUT).execute(&mut conn).await.map_err(fail)?;
        sqlx::query(AssertSqlSafe(sql::drop_schema(schema))).execute(&mut conn).await.map_err(fail)?;
        conn.close().await.map_err(fail)
    }

    /// Terminates the server sessions of every hint listener on this store's channel (its own and those of other
    /// stores on the schema), waiting up to 5 s for each to end, and returns how many there were: tests check
    /// that listeners reconnect.
    #[doc(hidden)]
    pub async fn disconnect_hint_listeners(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar(sql::TERMINATE_LISTENERS)
            .bind(&self.inner.channel)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.fail(e))
    }

    /// Terminates every other server session whose `application_name` is `application_name` (as a lost network
    /// or a restarted server would), waiting up to 5 s for each, and returns how many there were: tests check that
    /// the engine survives lost connections.
    ///
    /// Errors: `Invalid` unless `application_name` contains this store's schema name, so that a test run ends only
    /// sessions it named itself (several runs share a database; each has schemas of its own).
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn terminate_sessions(&self, application_name: &str) -> Result<i64, StoreError> {
        if !application_name.contains(self.schema()) {
            return Err(StoreError::Invalid(format!(
                "terminate_sessions: application_name {application_name:?} does not contain the store's schema {}: \
                 it could name another run's sessions",
                self.schema()
            )));
        }
        sqlx::query_scalar(sql::TERMINATE_SESSIONS)
            .bind(application_name)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.fail(e))
    }

    /// Runs a statement that fails with SQLSTATE `sqlstate` (five ASCII letters or digits) and returns the
    /// error as the store maps it: tests check that serialization failures, deadlocks and lost sessions come back
    /// as the typed errors the engine retries.
    #[doc(hidden)]
    #[doc(hidden)]
    pub async fn raise_for_test(&self, sqlstate: &str) -> StoreError {
        assert!(sqlstate.len() == 5 && sqlstate.bytes().all(|b| b.is_ascii_alphanumeric()), "SQLSTATE {sqlstate}");
        let statement = sql::raise(sqlstate);
        match sqlx::query(AssertSqlSafe(statement)).execute(&self.inner.pool).await {
            Ok(_) => panic!("a statement raising {sqlstate} succeeded"),
            Err(e) => self.fail(e),
        }
    }

    fn offset(&self) -> PgInterval {
        PgInterval { months: 0, days: 0, microseconds: self.inner.clock_offset_micros.load(Ordering::SeqCst) }
    }

    /// Runs one store call within [`PgOptions::call_timeout`] (unbounded when zero): past it, the call is
    /// abandoned and fails with [`StoreError::Timeout`] naming the bound. What the call sent may or may not have
    /// run (as after any lost connection); the guarded writes make a retry safe.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let limit = self.inner.call_timeout;
        if limit.is_zero() {
            return call.await;
        }
        tokio::time::timeout(limit, call).await.unwrap_or(Err(StoreError::Timeout(limit)))
    }

    fn fail(&self, err: sqlx::Error) -> StoreError {
        error::store_error(err, self.inner.waits)
    }

    /// [`PgStore::fail`] for a call that inserts rows: a row that named a parent that does not exist (the parent
    /// foreign key, SQLSTATE 23503) is refused as MemStore refuses it ([`parent_missing`]), `label(parent)` naming
    /// the call and the first of its rows that names `parent`.
    fn fail_inserting(&self, err: sqlx::Error, label: impl FnOnce(RowId) -> String) -> StoreError {
        match error::missing_parent(&err) {
            Some(parent) => parent_missing(&label(parent), parent),
            None => self.fail(err),
        }
    }

    /// [`PgStore::run_again_on_conflict`] for a call that inserts rows, its errors mapped by
    /// [`PgStore::fail_inserting`].
    async fn run_inserting<T, F, Fut>(
        &self,
        what: &str,
        call: F,
        label: impl FnOnce(RowId) -> String,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        retry::conflicts(&self.inner.conflict_retries, what, call).await.map_err(|e| self.fail_inserting(e, label))
    }

    /// Runs `call`, one whole transaction (or a single statement), and runs it again at once after a
    /// serialization failure or deadlock, a bounded number of times (DESIGN §2; see `retry`). `what` names the
    /// call in logs.
    async fn run_again_on_conflict<T, F, Fut>(&self, what: &str, call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        retry::conflicts(&self.inner.conflict_retries, what, call).await.map_err(|e| self.fail(e))
    }
}

/// The pool's check of a connection a call gives back, with [`PgOptions::call_timeout`] on (`limit` not zero): a
/// ping answered within `limit`, or the connection is dropped without a word (an error here makes sqlx close it
/// hard: a graceful close writes a `Terminate`, which can wait for ever on a half-open socket whose send buffer is
/// full). sqlx's own check after it has no time-out, so a connection whose call was abandoned on a half-open socket
/// would hold its pool slot for as long as the socket lives. With `limit` zero it passes every connection on to
/// sqlx's check at once. A connection that passes this ping and goes half-open before sqlx's own ping right after
/// it still hangs there: a window of one round trip.
fn release_check(
    limit: Duration,
) -> impl for<'c> Fn(
    &'c mut PgConnection,
    sqlx::pool::PoolConnectionMetadata,
) -> futures_util::future::BoxFuture<'c, Result<bool, sqlx::Error>>
+ Send
+ Sync
+ 'static {
    move |conn, _| {
        Box::pin(async move {
            if limit.is_zero() {
                return Ok(true);
            }
            match tokio::time::timeout(limit, conn.ping()).await {
                Ok(Ok(())) => Ok(true),
                Ok(Err(err)) => Err(err),
                Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer to the ping of a connection given back within {limit:?}: dropped"),
                ))),
            }
        })
    }
}

/// The store's first session with the server, opened within the acquire time-out (sqlx's own connect has no
/// bound: a server that accepts the connection and never answers, as Redis does PostgreSQL's startup message,
/// would hold `connect_with` forever). Errors name the server's address ([`error::greeting_error`]): one that is
/// not PostgreSQL is `Invalid`, one that closes the connection or does not answer in time `Unavailable`.
async fn first_session(options: &PgConnectOptions, waits: options::Waits) -> Result<PgConnection, StoreError> {
    let address = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    match tokio::time::timeout(waits.acquire, PgConnection::connect_with(options)).await {
        Ok(Ok(session)) => Ok(session),
        Ok(Err(err)) => Err(error::greeting_error(err, &address, waits)),
        Err(_) => Err(StoreError::Unavailable(error::scrub(&format!(
            "the server at {address} did not answer within {} (the acquire time-out): is it PostgreSQL, and is it \
             up?",
            crate::duration::format(waits.acquire)
        )))),
    }
}

/// Creates `schema` unless it exists (checked first, so a role that may not create schemas can use one made
/// for it) and applies the migrations not yet applied to it, on sessions of their own (`options`: the schema as
/// `search_path`, no statement or lock time-out), one of which, `lock`, holds the schema's migration lock
/// throughout: a session-level advisory lock keyed by the schema's name. Processes started together on a schema
/// that does not exist yet (a replica and an agent) take turns instead of racing on `CREATE SCHEMA`; the later
/// ones find it created and migrated. The lock ends with its session, which ends here also when a step fails
/// (dropping a connection closes it).
async fn migrate_schema(
    mut lock: PgConnection,
    options: &PgConnectOptions,
    schema: &str,
    acquire_timeout: Duration,
) -> Result<(), MigrateError> {
    let key = i64::from_ne_bytes(crate::hash::fnv1a64(format!("lockstep migrate {schema}").as_bytes()).to_ne_bytes());
    sqlx::query(sql::MIGRATION_LOCK).bind(key).execute(&mut lock).await?;
    let exists: bool = sqlx::query_scalar(sql::SCHEMA_EXISTS).bind(schema).fetch_one(&mut lock).await?;
    if !exists {
        sqlx::query(AssertSqlSafe(sql::create_schema(schema))).execute(&mut lock).await?;
    } else if let Some(rule) = clashing_tables(&mut lock, schema).await? {
        return Err(MigrateError::Clash(rule));
    }
    // The migrator runs on a pool of one session: on a `&mut PgConnection` its future is not `Send`
    // (launchbadge/sqlx#2016 on GitHub), and `connect_with` must stay spawnable.
    let migrator =
        PgPoolOptions::new().max_connections(1).acquire_timeout(acquire_timeout).connect_with(options.clone()).await?;
    let migrated = sqlx::migrate!("./migrations").run(&migrator).await;
    migrator.close().await;
    migrated.map_err(sqlx::Error::from)?;
    Ok(lock.close().await?)
}

/// Why [`migrate_schema`] stopped: PostgreSQL's error, or a schema that already holds another application's
/// tables under lockstep's names.
enum MigrateError {
    Sql(sqlx::Error),
    /// The rule, naming the schema and the tables.
    Clash(String),
}

impl From<sqlx::Error> for MigrateError {
    fn from(err: sqlx::Error) -> MigrateError {
        MigrateError::Sql(err)
    }
}

impl MigrateError {
    /// As a store error: PostgreSQL's through `fail`, a clash as [`StoreError::Invalid`].
    fn into_store(self, fail: impl FnOnce(sqlx::Error) -> StoreError) -> StoreError {
        match self {
            MigrateError::Sql(err) => fail(err),
            MigrateError::Clash(rule) => StoreError::Invalid(rule),
        }
    }
}

/// The rule a schema breaks when it holds a relation named as one of lockstep's (`resources`, `events`,
/// `lock_tokens`) while no lockstep migration is recorded in it: another application's table, which the first
/// migration would fail on half-way (leaving sqlx's `_sqlx_migrations` behind, as a new user's trial found).
/// `None` when the schema is lockstep's or holds none of those names.
async fn clashing_tables(conn: &mut PgConnection, schema: &str) -> Result<Option<String>, sqlx::Error> {
    let clashing: Vec<String> = sqlx::query_scalar(sql::CLASHING_RELATIONS).bind(schema).fetch_all(&mut *conn).await?;
    if clashing.is_empty() {
        return Ok(None);
    }
    let recorded: bool = sqlx::query_scalar(sql::MIGRATIONS_TABLE_EXISTS).bind(schema).fetch_one(&mut *conn).await?;
    if recorded {
        let applied: Vec<i64> =
            sqlx::query_scalar(AssertSqlSafe(sql::applied_migrations(schema))).fetch_all(&mut *conn).await?;
        if !applied.is_empty() {
            return Ok(None);
        }
    }
    Ok(Some(format!(
        "schema: {schema} already holds {}, which no lockstep migration made (another application's): lockstep \
         keeps its tables in a schema of its own; give it another one",
        clashing.join(", ")
    )))
}

/// What a schema holding migration `version`, which this build does not have, is: one a newer lockstep migrated.
/// `schema`: its name, where known.
fn newer_schema(schema: Option<&str>, version: i64) -> String {
    let schema = schema.map_or("the schema".to_string(), |schema| format!("schema {schema}"));
    format!(
        "{schema} holds migration {version}, which this build of lockstep does not have: a newer lockstep migrated \
         it; use that build (or a schema of its own for this one)"
    )
}

/// Checks, without changing anything, that `schema` exists and holds every migration of this build (for
/// [`PgOptions::migrate`] = false). Errors: [`StoreError::Invalid`] naming the schema if it is missing or not
/// fully migrated; `Other` if it holds a migration this build does not have (a newer lockstep migrated it, so
/// `migrate` cannot help); `Unavailable`/`Timeout` if PostgreSQL cannot be reached. `conn`: a session of the
/// store's, closed here.
async fn check_migrated(mut conn: PgConnection, schema: &str) -> Result<(), StoreError> {
    let fail = |err| error::store_error(err, options::Waits::DEFAULT);
    let applied: Vec<i64> =
        match sqlx::query_scalar(sql::MIGRATIONS_TABLE_EXISTS).bind(schema).fetch_one(&mut conn).await {
            Ok(true) => sqlx::query_scalar(AssertSqlSafe(sql::applied_migrations(schema)))
                .fetch_all(&mut conn)
                .await
                .map_err(fail)?,
            Ok(false) => Vec::new(),
            Err(err) => return Err(fail(err)),
        };
    conn.close().await.map_err(fail)?;
    let migrator = sqlx::migrate!("./migrations");
    let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    if let Some(newer) = applied.iter().find(|version| !known.contains(version)) {
        // `migrate` cannot help here (sqlx refuses a schema holding a migration it does not know).
        return Err(StoreError::Other(newer_schema(Some(schema), *newer)));
    }
    let missing = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .filter(|m| !applied.contains(&m.version))
        .count();
    if missing > 0 {
        return Err(StoreError::Invalid(format!(
            "schema {schema} is not migrated ({missing} of its migrations not applied): run `lockstep migrate --schema \
             {schema}` first"
        )));
    }
    Ok(())
}

/// Binds the fetch's parameters, in `sql::FETCH`'s order, to `query` (the text of [`PgStore::fetch_sql`] or its
/// EXPLAIN).
fn fetch_query<'q>(query: PgQuery<'q>, offset: PgInterval, p: &FetchParams) -> PgQuery<'q> {
    let query = query.bind(offset).bind(p.kind.clone());
    let query = match p.statuses.as_slice() {
        [status] => query.bind(status.clone()),
        statuses => query.bind(statuses.to_vec()),
    };
    query
        .bind(p.pipeline.clone())
        .bind(interval(p.lease_ttl))
        .bind(interval(p.retry_delay))
        .bind(interval(p.min_processing_interval))
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The leases of `leases` (in order, duplicates kept, as MemStore filters them) whose `(id, token)` is in
/// `held`.
fn still_held(leases: Vec<Lease>, held: &[(i64, i64)]) -> Vec<Lease> {
    let held: HashSet<(i64, i64)> = held.iter().copied().collect();
    leases.into_iter().filter(|lease| held.contains(&(lease.id.0, lease.token.0))).collect()
}

fn split_leases(leases: &[Lease]) -> (Vec<i64>, Vec<i64>) {
    leases.iter().map(|lease| (lease.id.0, lease.token.0)).unzip()
}

impl Store for PgStore {
    async fn fetch(&self, p: FetchParams) -> Result<Vec<Row>, StoreError> {
        self.bounded(async {
            check_fetch(&p)?;
            if self.inner.history.is_some() {
                return self.fetch_recorded(p).await;
            }
            let rows = fetch_query(sqlx::query(AssertSqlSafe(PgStore::fetch_sql(&p))), self.offset(), &p)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            let mut rows: Vec<Row> = rows.iter().map(codec::row).collect::<Result<_, _>>().map_err(|e| self.fail(e))?;
            // The UPDATE returns rows in no set order; put them in fetch order (`None` sorts first, as NULLS FIRST).
            rows.sort_unstable_by_key(|row| (row.last_processed_at, row.id));
            Ok(rows)
        })
        .await
    }

    async fn next_expiry(&self, p: FetchParams) -> Result<Option<Duration>, StoreError> {
        self.bounded(async {
            let micros: Option<i64> = sqlx::query_scalar(sql::NEXT_EXPIRY)
                .bind(self.offset())
                .bind(&p.kind)
                .bind(&p.statuses)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            Ok(micros.map(|micros| Duration::from_micros(micros.max(0) as u64)))
        })
        .await
    }

    async fn refetch(&self, lease: Lease) -> Result<Option<Row>, StoreError> {
        self.bounded(async {
            let row = sqlx::query(sql::REFETCH)
                .bind(lease.id.0)
                .bind(lease.token.0)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            row.as_ref().map(codec::row).transpose().map_err(|e| self.fail(e))
        })
        .await
    }

    async fn refetch_batch(&self, leases: Vec<Lease>) -> Result<Vec<Option<Row>>, StoreError> {
        self.bounded(async {
            if leases.is_empty() {
                return Ok(Vec::new());
            }
            let (mut ids, mut tokens) = split_leases(&leases);
            let padded = leases.len().max(sql::REFETCH_BATCH_LEN_MIN);
            ids.resize(padded, 0);
            tokens.resize(padded, 0);
            let found = sqlx::query(sql::REFETCH_BATCH)
                .bind(ids)
                .bind(tokens)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            let mut rows = vec![None; leases.len()];
            for found in &found {
                let (index, row) = codec::numbered_row(found).map_err(|e| self.fail(e))?;
                let slot = rows.get_mut(index).expect("a padding lease (id 0, token 0) matches no row");
                *slot = Some(row);
            }
            Ok(rows)
        })
        .await
    }

    async fn heartbeat(&self, p: HeartbeatParams) -> Result<Vec<Lease>, StoreError> {
        self.bounded(async {
            if p.leases.is_empty() {
                return Ok(Vec::new());
            }
            if self.inner.history.is_some() {
                return self.heartbeat_recorded(p).await;
            }
            let (ids, tokens) = split_leases(&p.leases);
            let extended: Vec<(i64, i64)> = self
                .run_again_on_conflict("heartbeat", || {
                    sqlx::query_as(sql::HEARTBEAT)
                        .bind(self.offset())
                        .bind(ids.clone())
                        .bind(tokens.clone())
                        .bind(interval(p.lease_ttl))
                        .fetch_all(&self.inner.pool)
                })
                .await?;
            Ok(still_held(p.leases, &extended))
        })
        .await
    }

    async fn lock_related(&self, p: LockRelatedParams) -> Result<LockOutcome, StoreError> {
        Ok(self.lock_related_reading(p, false).await?.0)
    }

    async fn lock_related_until(&self, p: LockRelatedParams) -> Result<(LockOutcome, Option<Duration>), StoreError> {
        let (outcome, _, until) = self.lock_related_reading(p, false).await?;
        Ok((outcome, until))
    }

    async fn lock_related_and_read(&self, p: LockRelatedParams) -> Result<LockRead, StoreError> {
        let (holder, retry_delay, park) = (p.holder, p.retry_delay, p.park);
        Ok(match self.lock_related_reading(p, true).await? {
            (LockOutcome::Locked, rows, _) => LockRead::Locked(rows),
            (LockOutcome::Stale, _, _) => LockRead::Stale,
            (LockOutcome::Contended { by_own_pipeline }, _, until) if park => {
                LockRead::Parked { until, by_own_pipeline }
            }
            (LockOutcome::Contended { by_own_pipeline }, _, _) => {
                LockRead::Reset { held: self.reset_for_retry(holder, retry_delay).await?, by_own_pipeline }
            }
        })
    }

    async fn apply(&self, mut p: ApplyParams) -> Result<ApplyOutcome, StoreError> {
        let hints = std::mem::take(&mut p.hints);
        let outcome = self.apply_unhinted(p).await?;
        if matches!(outcome, ApplyOutcome::Applied { .. }) {
            self.publish_hints(hints).await;
        }
        Ok(outcome)
    }

    async fn apply_batch(&self, mut batch: Vec<ApplyParams>) -> Result<Vec<ApplyOutcome>, StoreError> {
        let hints: Vec<Vec<NewHint>> = batch.iter_mut().map(|p| std::mem::take(&mut p.hints)).collect();
        let outcomes = self.apply_batch_unhinted(batch).await?;
        let applied = hints.into_iter().zip(&outcomes).filter(|(_, o)| matches!(o, ApplyOutcome::Applied { .. }));
        self.publish_hints(applied.flat_map(|(hints, _)| hints).collect()).await;
        Ok(outcomes)
    }

    async fn record_failure(&self, p: FailureParams) -> Result<FailureOutcome, StoreError> {
        self.bounded(async {
            check_failure(&p)?;
            if self.inner.history.is_some() {
                return self.record_failure_recorded(p).await;
            }
            let (delay, status) = match p.retry {
                Retry::After(delay) => (delay, None),
                Retry::GiveUp { status } => (Duration::ZERO, Some(status)),
            };
            let error = bounded_error(&p.error);
            let attempts: Option<i32> = self
                .run_again_on_conflict("record_failure", || async {
                    let query = |statement| {
                        sqlx::query_scalar(statement)
                            .bind(self.offset())
                            .bind(p.lease.id.0)
                            .bind(p.lease.token.0)
                            .bind(error.as_str())
                            .bind(interval(delay))
                            .bind(status.as_deref())
                            .bind(FAILURE_ERRORS_KEPT as i32)
                    };
                    write::lease_write(&mut *self.inner.pool.acquire().await?, &sql::RECORD_FAILURE, query).await
                })
                .await?;
            Ok(match attempts {
                Some(attempts) => {
                    FailureOutcome::Recorded { attempts: codec::attempts(attempts).map_err(|e| self.fail(e))? }
                }
                None => FailureOutcome::Stale,
            })
        })
        .await
    }

    async fn reset_for_retry(&self, lease: Lease, delay: Duration) -> Result<bool, StoreError> {
        self.bounded(async {
            if self.inner.history.is_some() {
                return self.reset_recorded(lease, delay).await;
            }
            let reset = self
                .run_again_on_conflict("reset_for_retry", || async {
                    let query = |statement| {
                        sqlx::query_scalar::<_, i64>(statement)
                            .bind(self.offset())
                            .bind(lease.id.0)
                            .bind(lease.token.0)
                            .bind(interval(delay))
                    };
                    write::lease_write(&mut *self.inner.pool.acquire().await?, &sql::RESET_FOR_RETRY, query).await
                })
                .await?;
            Ok(reset.is_some())
        })
        .await
    }

    async fn release(&self, leases: Vec<Lease>) -> Result<usize, StoreError> {
        self.bounded(async {
            if leases.is_empty() {
                return Ok(0);
            }
            if self.inner.history.is_some() {
                return self.release_recorded(leases).await;
            }
            let (ids, tokens) = split_leases(&leases);
            let held: Vec<(i64, i64)> = self
                .run_again_on_conflict("release", || {
                    sqlx::query_as(sql::RELEASE).bind(ids.clone()).bind(tokens.clone()).fetch_all(&self.inner.pool)
                })
                .await?;
            Ok(still_held(leases, &held).len())
        })
        .await
    }

    async fn insert(&self, new: NewRow) -> Result<Row, StoreError> {
        self.bounded(async {
            check_new_row("insert", &new)?;
            let row = sqlx::query(sql::INSERT)
                .bind(self.offset())
                .bind(new.kind)
                .bind(new.parent_id.map(|id| id.0))
                .bind(new.status)
                .bind(Json(new.data))
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.fail_inserting(e, |_| "insert".to_string()))?;
            codec::row(&row).map_err(|e| self.fail(e))
        })
        .await
    }

    async fn insert_many(&self, rows: Vec<NewRow>, hints: Vec<NewHint>) -> Result<Vec<RowId>, StoreError> {
        for (i, row) in rows.iter().enumerate() {
            check_new_row(&format!("insert_many: rows[{i}]"), row)?;
        }
        for (i, hint) in hints.iter().enumerate() {
            check_key(&format!("insert_many: hints[{i}]"), "kind", &hint.kind)?;
        }
        // One statement (`INSERT … SELECT FROM unnest(…)`): all rows or none, without a transaction's round trips.
        let parents: Vec<Option<RowId>> = rows.iter().map(|row| row.parent_id).collect();
        let ids = self
            .bounded(async {
                let mut conn = self.inner.pool.acquire().await.map_err(|e| self.fail(e))?;
                write::insert_rows(&mut conn, self.offset(), rows).await.map_err(|e| {
                    self.fail_inserting(e, |parent| format!("insert_many: rows[{}]", naming(&parents, parent)))
                })
            })
            .await?;
        self.publish_hints(hints).await;
        Ok(ids)
    }

    async fn insert_keyed(&self, p: InsertKeyedParams) -> Result<KeyedInsert, StoreError> {
        check_insert_keyed(&p)?;
        self.bounded(self.run_inserting(
            "insert_keyed",
            || write::insert_keyed_in_transaction(&self.inner.pool, self.offset(), p.clone()),
            |_| "insert_keyed".to_string(),
        ))
        .await
    }

    async fn get(&self, id: RowId) -> Result<Option<Row>, StoreError> {
        self.bounded(async {
            let row =
                sqlx::query(sql::GET).bind(id.0).fetch_optional(&self.inner.pool).await.map_err(|e| self.fail(e))?;
            row.as_ref().map(codec::row).transpose().map_err(|e| self.fail(e))
        })
        .await
    }

    async fn list(&self, kind: &str, parent: Option<RowId>) -> Result<Vec<Row>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query(sql::LIST)
                .bind(kind)
                .bind(parent.map(|id| id.0))
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            rows.iter().map(codec::row).collect::<Result<_, _>>().map_err(|e| self.fail(e))
        })
        .await
    }

    async fn query(&self, queries: Vec<RowQuery>) -> Result<Vec<Vec<Row>>, StoreError> {
        check_query(&queries)?;
        self.bounded(async {
            if queries.len() == 1 {
                let rows = query_rows(&self.inner.pool, &queries[0]).await.map_err(|e| self.fail(e))?;
                return Ok(vec![rows]);
            }
            // Several queries read one snapshot, as MemStore answers them under one lock.
            let mut session = Session::acquire(&self.inner.pool).await.map_err(|e| self.fail(e))?;
            let mut tx = session.begin().await.map_err(|e| self.fail(e))?;
            sqlx::query(sql::QUERY_SNAPSHOT).execute(&mut *tx).await.map_err(|e| self.fail(e))?;
            let mut answers = Vec::with_capacity(queries.len());
            for q in &queries {
                answers.push(query_rows(&mut *tx, q).await.map_err(|e| self.fail(e))?);
            }
            tx.commit().await.map_err(|e| self.fail(e))?;
            Ok(answers)
        })
        .await
    }

    async fn events(&self, row: RowId) -> Result<Vec<Event>, StoreError> {
        self.bounded(async {
            let rows =
                sqlx::query(sql::EVENTS).bind(row.0).fetch_all(&self.inner.pool).await.map_err(|e| self.fail(e))?;
            rows.iter().map(codec::event).collect::<Result<_, _>>().map_err(|e| self.fail(e))
        })
        .await
    }

    async fn update_unleased(&self, id: RowId, update: RowUpdate) -> Result<WriteOutcome, StoreError> {
        self.bounded(async {
            check_update(&format!("update_unleased {id}"), &update)?;
            if self.inner.history.is_some() {
                return self.update_unleased_recorded(id, update).await;
            }
            let busy: Option<bool> = self
                .run_again_on_conflict("update_unleased", || {
                    sqlx::query_scalar(sql::UPDATE_UNLEASED)
                        .bind(self.offset())
                        .bind(id.0)
                        .bind(update.status.clone())
                        .bind(update.data.clone().map(Json))
                        .fetch_optional(&self.inner.pool)
                })
                .await?;
            Ok(match busy {
                None => WriteOutcome::Missing,
                Some(true) => WriteOutcome::Busy,
                Some(false) => WriteOutcome::Written,
            })
        })
        .await
    }

    async fn purge(&self, p: PurgeParams) -> Result<usize, StoreError> {
        self.bounded(async {
            check_purge(&p)?;
            let limit = i64::try_from(p.limit).expect("a checked limit fits i64");
            let batch = || async {
                let mut session = Session::acquire(&self.inner.pool).await?;
                let mut tx = session.begin().await?;
                let deleted: Vec<i64> = sqlx::query_scalar(sql::PURGE)
                    .bind(self.offset())
                    .bind(&p.kind)
                    .bind(&p.statuses)
                    .bind(interval(p.older_than))
                    .bind(limit)
                    .bind(&p.parent_statuses)
                    .fetch_all(&mut *tx)
                    .await?;
                if self.inner.history.is_some() {
                    let mut ids: Vec<RowId> = deleted.iter().copied().map(RowId).collect();
                    ids.sort_unstable();
                    let op = CommitOp::Purge { kind: p.kind.clone(), deleted: ids };
                    history::append(self, &mut tx, &op).await?;
                }
                tx.commit().await?;
                Ok::<_, sqlx::Error>(deleted)
            };
            // A child committed after the statement's snapshot and before it locked the parent makes the parent's
            // delete violate the parent foreign key: nothing was deleted, and the statement run again sees the child
            // and keeps the parent.
            let mut reruns = 0;
            let deleted: Vec<i64> = loop {
                match retry::conflicts(&self.inner.conflict_retries, "purge", batch).await {
                    Err(err) if error::is_parent_still_referenced(&err) && reruns < retry::CONFLICT_RETRIES_MAX => {
                        reruns += 1;
                        tracing::debug!(kind = %p.kind, reruns, "a purged row got a child meanwhile: run again");
                    }
                    outcome => break outcome.map_err(|e| self.fail(e))?,
                }
            };
            Ok(deleted.len())
        })
        .await
    }

    async fn hint(&self, kind: &str, row: Option<RowId>) -> Result<(), StoreError> {
        self.bounded(async {
            let payload = listen::payload(self.inner.instance, kind);
            sqlx::query(sql::HINT)
                .bind(row.map(|id| id.0))
                .bind(&self.inner.channel)
                .bind(payload)
                .execute(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            // Committed: deliver to this store's subscribers at once; other stores hear the NOTIFY. No subscriber is
            // not an error.
            let _ = self.inner.hints.send(kind.to_string());
            Ok(())
        })
        .await
    }

    fn subscribe_hints(&self) -> broadcast::Receiver<Hint> {
        self.inner.hints.subscribe()
    }

    async fn now(&self) -> Result<Timestamp, StoreError> {
        self.bounded(async {
            let now: PgTime = sqlx::query_scalar(sql::NOW)
                .bind(self.offset())
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.fail(e))?;
            Ok(now.0)
        })
        .await
    }

    fn connection_limit(&self) -> Option<usize> {
        Some(self.inner.max_connections as usize)
    }
}

/// The index of the first of `parents` that is `parent` (0 if none is, which PostgreSQL's foreign key, naming a
/// parent of the statement's rows, never reports).
fn naming(parents: &[Option<RowId>], parent: RowId) -> usize {
    parents.iter().position(|p| *p == Some(parent)).unwrap_or(0)
}

/// MemStore's name for the first insert of `batch` under `parent`: `apply 5#7: inserts[0]`.
fn apply_naming(batch: &[ApplyParams], parent: RowId) -> String {
    for p in batch {
        if let Some(i) = p.inserts.iter().position(|row| row.parent_id == Some(parent)) {
            return format!("apply {}#{}: inserts[{i}]", p.lease.id, p.lease.token);
        }
    }
    "apply_batch".to_string()
}

/// The rows of one [`Store::query`] query on `executor` (mem.rs `State::query`): binds the filters given, in the
/// order [`sql::query`] numbers them.
async fn query_rows<'e, E: sqlx::PgExecutor<'e>>(executor: E, q: &RowQuery) -> Result<Vec<Row>, sqlx::Error> {
    let text = sql::query(q.parent.is_some(), q.statuses.is_some(), q.after.is_some(), q.ids.is_some());
    let mut statement = sqlx::query(AssertSqlSafe(text)).bind(q.kind.clone());
    if let Some(parent) = q.parent {
        statement = statement.bind(parent.0);
    }
    if let Some(statuses) = &q.statuses {
        statement = statement.bind(statuses.clone());
    }
    if let Some(after) = q.after {
        statement = statement.bind(after.0);
    }
    if let Some(ids) = &q.ids {
        statement = statement.bind(ids.iter().map(|id| id.0).collect::<Vec<i64>>());
    }
    let rows = statement.fetch_all(executor).await?;
    rows.iter().map(codec::row).collect()
}
