//! The PostgreSQL side: a schema of its own per measurement (lockstep's migrations, the rows inserted with
//! `Store::insert_many`, then `VACUUM ANALYZE`), the raw SQL clients, and lockstep replicas on it.

use crate::measure::{CostProbe, Sample, Waits, measure, per_call, postgres_cpu_secs, process_cpu_secs};
use crate::raw_sql;
use crate::settings::Settings;
use lockstep::pipeline::{Handler, ManagerOptions, PipelineConfig, PipelineManager};
use lockstep::store::{FetchParams, NewRow, PgOptions, PgStore, Store};
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often a connection refused because the server is full ("too many clients": the server's sessions are
/// shared with other users' tests) is retried, one second apart.
const CONNECT_TRIES: usize = 60;
/// The fetch limit explained half-way through a drain (the queue's largest batch with the default config).
const EXPLAIN_FETCH_LIMIT: usize = 100;
/// How long [`BenchDb::updates`] waits between two reads of the table's counters.
const STATS_SETTLE: Duration = Duration::from_millis(300);
/// The kind and status of every bench row (the raw SQL names them literally).
pub const KIND: &str = "job";
const READY: &str = "ready";

/// One measurement's schema, filled with ready rows.
pub struct BenchDb {
    url: String,
    schema: String,
    rows: usize,
}

impl BenchDb {
    /// A fresh schema `bench_<pid>_<n>` with lockstep's tables and `rows` ready rows of kind [`KIND`].
    pub async fn create(settings: &Settings, rows: usize) -> BenchDb {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let schema = format!("bench_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let db = BenchDb { url: settings.database_url.clone(), schema, rows };
        // The store runs the migrations; the rows are the kind `Store::insert` makes (checked below).
        let store = connect_store(db.options("lockstep_bench_setup", 2)).await;
        store.insert(NewRow::new(KIND, READY, json!({}))).await.expect("insert a bench row");
        let mut conn = db.connect_raw().await;
        if let Some(schema_sql) = &settings.schema_sql {
            sqlx::raw_sql(sqlx::AssertSqlSafe(schema_sql.as_str()))
                .execute(&mut conn)
                .await
                .expect("LOCKSTEP_BENCH_SCHEMA_SQL runs");
        }
        let more = rows.saturating_sub(1) as i64;
        sqlx::query(raw_sql::FILL).bind(more).execute(&mut conn).await.expect("fill the bench rows");
        sqlx::raw_sql(raw_sql::VACUUM_ANALYZE).execute(&mut conn).await.expect("vacuum analyze");
        store.close().await;
        db
    }

    /// Store options on this schema: pool of `max_connections`, sessions named `application_name`.
    pub fn options(&self, application_name: &str, max_connections: u32) -> PgOptions {
        let mut options = PgOptions::new(self.url.clone());
        options.schema = self.schema.clone();
        options.max_connections = max_connections;
        options.application_name = application_name.to_string();
        options.acquire_timeout = Duration::from_secs(30);
        options
    }

    /// A plain connection with this schema as its `search_path` (the raw clients and the cost probe).
    pub async fn connect_raw(&self) -> PgConnection {
        let options: PgConnectOptions = self.url.parse().expect("DATABASE_URL parses");
        let options = options.application_name("lockstep_bench_raw").options([("search_path", self.schema.as_str())]);
        for _ in 1..CONNECT_TRIES {
            match PgConnection::connect_with(&options).await {
                Ok(conn) => return conn,
                Err(e) if server_full(&e.to_string()) => tokio::time::sleep(Duration::from_secs(1)).await,
                Err(e) => panic!("connect to PostgreSQL: {e}"),
            }
        }
        PgConnection::connect_with(&options).await.expect("connect to PostgreSQL")
    }

    /// Rows the schema started with.
    pub fn rows(&self) -> u64 {
        self.rows as u64
    }

    /// `(n_tup_upd, n_tup_hot_upd)` of the resource table, once they stop changing (the sessions that ended
    /// report their last counters as they exit).
    pub async fn updates(&self) -> (i64, i64) {
        let mut conn = self.connect_raw().await;
        let mut last = (-1, -1);
        loop {
            let now: (i64, i64) = sqlx::query_as(raw_sql::TABLE_UPDATES)
                .bind(&self.schema)
                .fetch_optional(&mut conn)
                .await
                .expect("table statistics")
                .unwrap_or((0, 0));
            if now == last {
                conn.close().await.ok();
                return now;
            }
            last = now;
            tokio::time::sleep(STATS_SETTLE).await;
        }
    }

    /// Prints every index of the resource table with its scans, entries read and heap rows fetched so far
    /// (`pg_stat_user_indexes`): entries read per scan of the fetch index say how much of its range a fetch walks.
    pub async fn print_index_reads(&self) {
        let mut conn = self.connect_raw().await;
        let rows: Vec<(String, i64, i64, i64)> =
            sqlx::query_as(raw_sql::INDEX_READS).bind(&self.schema).fetch_all(&mut conn).await.expect("index stats");
        for (index, scans, read, fetched) in rows {
            println!("INDEX {index} scans={scans} entries_read={read} rows_fetched={fetched}");
        }
        conn.close().await.ok();
    }

    /// Drops the schema.
    pub async fn drop(self) {
        if let Err(e) = PgStore::drop_schema(&self.url, &self.schema).await {
            eprintln!("could not drop bench schema {}: {e}", self.schema);
        }
    }
}

/// Whether a connection error says the server has no session left for us (53300, "too many clients").
fn server_full(message: &str) -> bool {
    message.contains("53300") || message.contains("too many clients")
}

/// A store on `options`, retrying while the server is full.
async fn connect_store(options: PgOptions) -> PgStore {
    for _ in 1..CONNECT_TRIES {
        match PgStore::connect_with(options.clone()).await {
            Ok(store) => return store,
            Err(e) if server_full(&e.to_string()) => {
                eprintln!("PostgreSQL is full (other users' sessions); retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("PostgreSQL at DATABASE_URL (or the local default): {e}"),
        }
    }
    PgStore::connect_with(options).await.expect("PostgreSQL at DATABASE_URL (or the local default)")
}

/// Cost counters with a database: every `postgres` process's CPU, this process's CPU, and the WAL position.
pub struct PgProbe {
    conn: PgConnection,
}

impl PgProbe {
    pub async fn new(db: &BenchDb) -> PgProbe {
        PgProbe { conn: db.connect_raw().await }
    }
}

impl CostProbe for PgProbe {
    async fn read(&mut self) -> (f64, f64, Option<u64>) {
        let wal: i64 = sqlx::query_scalar(raw_sql::WAL_BYTES).fetch_one(&mut self.conn).await.expect("WAL position");
        (postgres_cpu_secs(), process_cpu_secs("self"), Some(wal as u64))
    }
}

/// The raw SQL limit: `clients` connections, each claiming up to `batch` rows per statement and completing them
/// in a second statement, until the window ends.
pub async fn raw_clients(settings: &Settings, clients: usize, batch: usize) -> Sample {
    let db = BenchDb::create(settings, settings.pg_rows).await;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut conn = db.connect_raw().await;
        let (done, stop) = (done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<i64> =
                    sqlx::query_scalar(raw_sql::CLAIM).bind(batch as i64).fetch_all(&mut conn).await.expect("claim");
                if ids.is_empty() {
                    break;
                }
                sqlx::query(raw_sql::COMPLETE).bind(&ids).execute(&mut conn).await.expect("complete");
                done.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            conn.close().await.ok();
        }));
    }
    let mut probe = PgProbe::new(&db).await;
    let sample =
        measure(|| done.load(Ordering::Relaxed), db.rows(), &mut probe, settings.warmup, settings.window).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("raw client");
    }
    db.drop().await;
    sample
}

/// How a lockstep replica's store is set up beyond the schema: `ping_before_use` of its pool, and its
/// `call_timeout` (zero: calls unbounded, as before the bound was the default).
#[derive(Clone, Copy, Debug)]
pub struct StoreTweaks {
    pub ping_before_use: bool,
    pub call_timeout: std::time::Duration,
}

impl Default for StoreTweaks {
    fn default() -> Self {
        StoreTweaks {
            ping_before_use: PgOptions::PING_BEFORE_USE_DEFAULT,
            call_timeout: PgOptions::CALL_TIMEOUT_DEFAULT,
        }
    }
}

/// Lockstep: `replicas` replicas (a `PgStore` and a `PipelineManager` each) running `config` with `handler` on a
/// fresh schema of `rows` rows, measured over the window; then shut down and their pools closed.
pub async fn lockstep<H: Handler<PgStore> + Clone>(
    settings: &Settings,
    rows: usize,
    replicas: usize,
    config: PipelineConfig,
    handler: H,
    tweaks: StoreTweaks,
) -> Sample {
    let db = BenchDb::create(settings, rows).await;
    let name = config.name.clone();
    let mut managers = Vec::new();
    let mut stores = Vec::new();
    for replica in 0..replicas {
        let mut options = db.options(&format!("lockstep_bench_r{replica}"), config.connections_needed() as u32);
        options.ping_before_use = tweaks.ping_before_use;
        options.call_timeout = tweaks.call_timeout;
        let store = Arc::new(connect_store(options).await);
        stores.push(store.clone());
        let mut manager = PipelineManager::new(store, ManagerOptions { seed: replica as u64 });
        manager.register(config.clone(), handler.clone()).expect("bench pipeline config");
        managers.push(manager);
    }
    for manager in &mut managers {
        manager.start();
    }
    let applied = || managers.iter().map(|m| m.metrics(&name).expect("registered").applied).sum::<u64>();
    let mut probe = PgProbe::new(&db).await;
    let measured = measure(applied, db.rows(), &mut probe, settings.warmup, settings.window);
    let explained = explain_fetch_midway(settings, &db, &config, || applied() >= db.rows() / 2);
    let done = AtomicBool::new(false);
    let slots = config.apply_batch_max * config.apply_batches_in_flight;
    let sampled = async {
        if settings.sample_waits {
            Some(sample_waits(managers[0].pipeline(&name).expect("registered"), slots, &done).await)
        } else {
            None
        }
    };
    let measured_then_done = async {
        let (sample, ()) = tokio::join!(measured, explained);
        done.store(true, Ordering::Relaxed);
        sample
    };
    let (sample, waits) = tokio::join!(measured_then_done, sampled);
    let snapshots: Vec<_> = managers.iter().map(|m| m.metrics(&name).expect("registered")).collect();
    let sample = Sample { per_call: Some(per_call(&snapshots)), waits, ..sample };
    for manager in &mut managers {
        manager.shutdown().await;
    }
    drop(managers);
    for store in stores {
        store.close().await;
    }
    let sample = Sample { updates: Some(db.updates().await), ..sample };
    if settings.explain_fetch {
        db.print_index_reads().await;
    }
    db.drop().await;
    sample
}

/// Samples the first replica's pipeline every [`Waits::EVERY`] until `done` (see [`Waits`]); `slots`: its most
/// unanswered applies.
async fn sample_waits<S: Store>(pipeline: &lockstep::pipeline::Pipeline<S>, slots: usize, done: &AtomicBool) -> Waits {
    let workers = pipeline.config.workers;
    let (mut samples, mut fetching, mut all_idle, mut full, mut unanswered) = (0u64, 0u64, 0u64, 0u64, 0usize);
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Waits::EVERY).await;
        let shared = &pipeline.shared;
        let queued = shared.queue_len();
        let open = shared.leases_len().saturating_sub(queued);
        samples += 1;
        fetching += u64::from(shared.reserved() > 0);
        all_idle += u64::from(shared.idle_workers() == workers);
        full += u64::from(open >= slots);
        unanswered += open;
    }
    let share = |n: u64| n as f64 / samples.max(1) as f64;
    Waits {
        samples,
        fetching: share(fetching),
        all_idle: share(all_idle),
        slots_full: share(full),
        unanswered_mean: unanswered as f64 / samples.max(1) as f64,
    }
}

/// With `settings.explain_fetch`, once `half_done` (or half-way through the window): prints `EXPLAIN (ANALYZE, BUFFERS)` of the pipeline's fetch of
/// a full batch (its generic plan, as the replicas' connections run it; rolled back), from a session of its own.
async fn explain_fetch_midway(
    settings: &Settings,
    db: &BenchDb,
    config: &PipelineConfig,
    half_done: impl Fn() -> bool,
) {
    if !settings.explain_fetch {
        return;
    }
    // Half-way through the rows, or through the window when the rows last longer than it.
    let deadline = std::time::Instant::now() + settings.warmup + settings.window / 2;
    while !half_done() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = connect_store(db.options("lockstep_bench_explain", 1)).await;
    let params = FetchParams {
        pipeline: config.name.clone(),
        kind: config.kind.clone(),
        statuses: config.statuses.clone(),
        limit: EXPLAIN_FETCH_LIMIT,
        lease_ttl: config.lease_ttl,
        min_processing_interval: config.min_processing_interval,
        retry_delay: config.retry_delay,
    };
    let plan = store.explain_analyze_fetch_generic(&params).await.expect("explain the fetch");
    println!("EXPLAIN (ANALYZE, BUFFERS) of the fetch of {EXPLAIN_FETCH_LIMIT} rows, half-way through:");
    for line in plan {
        println!("    {line}");
    }
    store.close().await;
}
