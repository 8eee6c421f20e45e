//! The run: which contenders each table holds, the order they are measured in, the workers sweep, and where the
//! results go.

use crate::measure::{Sample, Sleeps, Trivial};
use crate::pg::{self, BenchDb, StoreTweaks};
use crate::report::{Group, Line, Machine, Report, Series, Table};
use crate::settings::{DrainMode, Section, Settings};
use crate::{mem, plot, raw_sql};
use lockstep::pipeline::PipelineConfig;
use std::time::Duration;

/// Workers per replica in the side-by-side tables (the 1 and 4 replicas × 8 workers).
const WORKERS: usize = 8;
/// Replica counts of the side-by-side tables.
const REPLICAS: [usize; 2] = [1, 4];
/// Items per raw claim in the batched raw limit.
const RAW_BATCH: usize = 100;
/// Processing time of the sweep's model check.
const PROCESSING: Duration = Duration::from_millis(10);
/// Rows of a sweep point whose processing takes [`PROCESSING`]: ≥ 64 workers × 100/s × (warm-up + window).
const PROCESSING_ROWS: usize = 40_000;

/// One line of a side-by-side table.
#[derive(Clone, Copy, Debug)]
enum Contender {
    /// The raw limit: as many clients as the replicas have workers, `batch` rows per claim and completion.
    Raw { batch: usize },
    /// Lockstep with `tune` applied to the default config (8 workers) and `tweaks` to its stores.
    Lockstep { label: &'static str, tune: fn(&mut PipelineConfig), tweaks: StoreTweaks },
}

fn defaults(_: &mut PipelineConfig) {}

fn no_batching(config: &mut PipelineConfig) {
    config.apply_batch_window = Duration::ZERO;
}

/// The per-item mode: one row per fetch (a queue of one), every apply and refetch a store call of its own, and a
/// fetch loop per worker (while the workers outrun the fetches, as many one-row fetches in flight as workers: the
/// raw one-row line's clients each claim one row at a time too).
pub fn per_item(config: &mut PipelineConfig) {
    let one = 1.0 / config.workers as f64;
    config.fetchers = config.workers;
    config.queue_upper_factor = one;
    config.queue_lower_factor = one;
    config.fetch_limit_max = 1;
    config.apply_batch_window = Duration::ZERO;
    config.refetch_batch_window = Duration::ZERO;
}

impl Contender {
    fn label(&self) -> String {
        match self {
            Contender::Raw { batch: 1 } => "raw, 1 row per call".into(),
            Contender::Raw { batch } => format!("raw, batches of {batch}"),
            Contender::Lockstep { label, .. } => format!("lockstep, {label}"),
        }
    }
}

/// The bench pipeline: `workers` workers over the bench rows, every other field at its default.
pub fn bench_config(workers: usize) -> PipelineConfig {
    PipelineConfig { workers, ..PipelineConfig::new("bench", pg::KIND, &["ready"]) }
}

fn no_refetch(config: &mut PipelineConfig) {
    config.refetch = false;
}

fn reread_every_row(config: &mut PipelineConfig) {
    config.refetch_after = Duration::ZERO;
}

fn reread_every_row_unbatched(config: &mut PipelineConfig) {
    config.refetch_after = Duration::ZERO;
    config.refetch_batch_window = Duration::ZERO;
}

fn two_fetchers(config: &mut PipelineConfig) {
    config.fetchers = 2;
}

fn pg_contenders() -> Vec<Contender> {
    let ping = StoreTweaks { ping_before_use: true, ..StoreTweaks::default() };
    let unbounded = StoreTweaks { call_timeout: Duration::ZERO, ..StoreTweaks::default() };
    let plain = StoreTweaks::default();
    vec![
        Contender::Raw { batch: 1 },
        Contender::Raw { batch: RAW_BATCH },
        Contender::Lockstep { label: "defaults", tune: defaults, tweaks: plain },
        Contender::Lockstep { label: "two fetchers", tune: two_fetchers, tweaks: plain },
        Contender::Lockstep { label: "every row reread", tune: reread_every_row, tweaks: plain },
        Contender::Lockstep { label: "every row reread, unbatched", tune: reread_every_row_unbatched, tweaks: plain },
        Contender::Lockstep { label: "refetch off", tune: no_refetch, tweaks: plain },
        Contender::Lockstep { label: "apply batching off", tune: no_batching, tweaks: plain },
        Contender::Lockstep { label: "ping before each call", tune: defaults, tweaks: ping },
        Contender::Lockstep { label: "store calls unbounded", tune: defaults, tweaks: unbounded },
    ]
}

fn mem_contenders() -> Vec<Contender> {
    vec![
        Contender::Raw { batch: 1 },
        Contender::Raw { batch: RAW_BATCH },
        Contender::Lockstep { label: "defaults", tune: defaults, tweaks: StoreTweaks::default() },
        Contender::Lockstep { label: "two fetchers", tune: two_fetchers, tweaks: StoreTweaks::default() },
        Contender::Lockstep { label: "every row reread", tune: reread_every_row, tweaks: StoreTweaks::default() },
        Contender::Lockstep { label: "apply batching off", tune: no_batching, tweaks: StoreTweaks::default() },
    ]
}

/// Measures every contender for every replica count, `settings.reps` times, interleaved (rep by rep), so a
/// burst of load from elsewhere hits one repetition of every contender rather than every repetition of one.
async fn table(settings: &Settings, section: Section, contenders: &[Contender]) -> Table {
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); contenders.len()]; REPLICAS.len()];
    for rep in 0..settings.reps {
        for (g, replicas) in REPLICAS.iter().enumerate() {
            for (c, contender) in contenders.iter().enumerate() {
                let sample = measure(settings, section, *contender, *replicas).await;
                eprintln!(
                    "[{section:?} rep {}/{}] {replicas} × {WORKERS}: {}: {:.0} items/s",
                    rep + 1,
                    settings.reps,
                    contender.label(),
                    sample.rate()
                );
                samples[g][c].push(sample);
            }
        }
    }
    let reference = contenders.iter().position(|c| matches!(c, Contender::Raw { batch: RAW_BATCH })).expect("ref");
    let groups = REPLICAS
        .iter()
        .zip(samples)
        .map(|(replicas, lines)| {
            let reference: Vec<f64> = lines[reference].iter().map(Sample::rate).collect();
            let lines = contenders
                .iter()
                .zip(lines)
                .map(|(contender, samples)| {
                    let ratios = samples.iter().zip(&reference).map(|(s, r)| s.rate() / r).collect();
                    Line { label: contender.label(), samples, ratios }
                })
                .collect();
            let title = format!("{replicas} replica(s) × {WORKERS} workers; raw: {} clients", replicas * WORKERS);
            Group { title, lines }
        })
        .collect();
    let title = match section {
        Section::Pg => "PostgreSQL: trivial processing, items/s (raw = SKIP LOCKED claim + completion, raw_sql.rs)",
        _ => "MemStore in process: trivial processing, items/s (raw = Store::fetch + Store::apply_batch calls)",
    };
    Table { title: title.into(), reference: format!("raw, batches of {RAW_BATCH}"), groups }
}

async fn measure(settings: &Settings, section: Section, contender: Contender, replicas: usize) -> Sample {
    let clients = replicas * WORKERS;
    match (section, contender) {
        (Section::Pg, Contender::Raw { batch }) => pg::raw_clients(settings, clients, batch).await,
        (Section::Pg, Contender::Lockstep { tune, tweaks, .. }) => {
            let mut config = bench_config(WORKERS);
            tune(&mut config);
            pg::lockstep(settings, settings.pg_rows, replicas, config, Trivial, tweaks).await
        }
        (_, Contender::Raw { batch }) => mem::raw_clients(settings, clients, batch).await,
        (_, Contender::Lockstep { tune, .. }) => {
            let mut config = bench_config(WORKERS);
            tune(&mut config);
            mem::lockstep(settings, settings.mem_rows, replicas, config, Trivial).await
        }
    }
}

/// Throughput against workers, one replica with the default config: trivial processing and [`PROCESSING`], on
/// both stores.
async fn sweep(settings: &Settings) -> Vec<Series> {
    let workers: Vec<usize> = if settings.smoke { vec![1, 8] } else { vec![1, 2, 4, 8, 16, 32, 64] };
    // PostgreSQL's pool is workers + 2 per replica; the server allows 100 sessions, shared with other users.
    let pg_workers: Vec<usize> = workers.iter().copied().filter(|w| *w <= 32).collect();
    let ms = PROCESSING.as_secs_f64() * 1000.0;
    let rows = PROCESSING_ROWS.min(settings.mem_rows);
    let mut series = Vec::new();
    let mut points = Vec::new();
    for w in &pg_workers {
        points.push((
            *w,
            pg::lockstep(settings, settings.pg_rows, 1, bench_config(*w), Trivial, StoreTweaks::default()).await,
        ));
    }
    series.push(Series { label: "PostgreSQL, trivial processing".into(), processing_ms: None, points });
    let mut points = Vec::new();
    for w in &pg_workers {
        let sample = pg::lockstep(settings, rows, 1, bench_config(*w), Sleeps(PROCESSING), StoreTweaks::default());
        points.push((*w, sample.await));
    }
    series.push(Series { label: format!("PostgreSQL, {ms} ms processing"), processing_ms: Some(ms), points });
    let mut points = Vec::new();
    for w in &workers {
        points.push((*w, mem::lockstep(settings, settings.mem_rows, 1, bench_config(*w), Trivial).await));
    }
    series.push(Series { label: "MemStore, trivial processing".into(), processing_ms: None, points });
    let mut points = Vec::new();
    for w in &workers {
        points.push((*w, mem::lockstep(settings, rows, 1, bench_config(*w), Sleeps(PROCESSING)).await));
    }
    series.push(Series { label: format!("MemStore, {ms} ms processing"), processing_ms: Some(ms), points });
    for s in &series {
        let rates: Vec<String> = s.points.iter().map(|(w, p)| format!("{w}: {:.0}", p.rate())).collect();
        eprintln!("[sweep] {}: {}", s.label, rates.join(", "));
    }
    series
}

/// Longest a drain may take (a stuck drain fails the run instead of hanging it).
const DRAIN_MAX: Duration = Duration::from_secs(3600);

/// The drain section: `settings.drain_replicas` replicas × [`WORKERS`] workers, default config (or the per-item
/// mode, and the overrides of `settings`), processing `settings.drain_processing`, drain `settings.drain_rows`
/// ready rows, timed from the replicas' start to the last apply; one `RESULT` line in the format
/// `benches/peers/summary.sh` reads, with where the first replica waited.
async fn drain(settings: &Settings) {
    let drain_settings = Settings { warmup: Duration::ZERO, window: DRAIN_MAX, sample_waits: true, ..settings.clone() };
    let (replicas, rows) = (settings.drain_replicas, settings.drain_rows);
    let mut config = bench_config(WORKERS);
    let mut label = format!("lockstep_{replicas}x{WORKERS}");
    if settings.drain_mode == DrainMode::PerItem {
        per_item(&mut config);
        label.push_str("_per_item");
    }
    if let Some(fetchers) = settings.drain_fetchers {
        config.fetchers = fetchers;
    }
    if let Some(in_flight) = settings.drain_applies_in_flight {
        config.apply_batches_in_flight = in_flight;
    }
    if let Some(limit) = settings.drain_fetch_limit_max {
        config.fetch_limit_max = limit;
    }
    if let Some(max) = settings.drain_apply_batch_max {
        config.apply_batch_max = max;
    }
    let processing = settings.drain_processing;
    let sample = if processing.is_zero() {
        pg::lockstep(&drain_settings, rows, replicas, config.clone(), Trivial, StoreTweaks::default()).await
    } else {
        label.push_str(&format!("_{}ms", processing.as_millis()));
        pg::lockstep(&drain_settings, rows, replicas, config.clone(), Sleeps(processing), StoreTweaks::default()).await
    };
    let label = settings.drain_label.clone().unwrap_or(label);
    assert!(sample.ran_out, "the drain of {rows} rows did not end within {DRAIN_MAX:?}");
    let (upd, hot_upd) = sample.updates.unwrap_or_default();
    let (rows_per_fetch, applies_per_call, _) = sample.per_call.unwrap_or_default();
    let waits = sample.waits.unwrap_or_default();
    println!(
        "RESULT {label} items={} secs={:.3} db_cpu_s={:.2} client_cpu_s={:.2} wal_bytes={} \
         upd={upd} hot_upd={hot_upd} rows_per_fetch={rows_per_fetch:.1} applies_per_call={applies_per_call:.1} \
         fetchers={} applies_in_flight={} fetching={:.2} all_idle={:.2} slots_full={:.2} unanswered={:.0} \
         samples={}",
        sample.items,
        sample.secs,
        sample.db_cpu_secs,
        sample.client_cpu_secs,
        sample.wal_bytes.unwrap_or(0),
        config.fetchers,
        config.apply_batches_in_flight,
        waits.fetching,
        waits.all_idle,
        waits.slots_full,
        waits.unanswered_mean,
        waits.samples,
    );
}

/// Runs the sections `settings` asks for, prints the results, and writes them (Markdown and the plot).
pub async fn run(settings: Settings) {
    if settings.runs(Section::Drain) {
        drain(&settings).await;
        if settings.sections == [Section::Drain] {
            return;
        }
    }
    std::fs::create_dir_all(&settings.out_dir).expect("results directory");
    let mut report = Report { machine: machine(&settings).await, ..Report::default() };
    if settings.runs(Section::Pg) {
        report.tables.push(table(&settings, Section::Pg, &pg_contenders()).await);
    }
    if settings.runs(Section::Mem) {
        report.tables.push(table(&settings, Section::Mem, &mem_contenders()).await);
    }
    if settings.runs(Section::Sweep) {
        report.series = sweep(&settings).await;
        let path = settings.out_dir.join("throughput-vs-workers.png");
        plot::draw(&report.series, &path).expect("draw the plot");
        report.plot_file = Some(path.file_name().expect("a file name").to_string_lossy().into_owned());
    }
    report.machine.load_after = load_average();
    let markdown = report.markdown();
    println!("{markdown}");
    let path = settings.out_dir.join("pipeline.md");
    std::fs::write(&path, &markdown).expect("write the results");
    eprintln!("results written to {}", settings.out_dir.display());
    if settings.smoke {
        std::fs::remove_dir_all(&settings.out_dir).ok();
        println!("smoke run passed (sizes tiny, numbers meaningless): cargo bench --bench pipeline measures");
    }
}

fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(", ")
}

/// The machine the numbers ran on, read now.
async fn machine(settings: &Settings) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let postgres = if settings.runs(Section::Pg) || settings.runs(Section::Sweep) {
        let db = BenchDb::create(settings, 0).await;
        let mut conn = db.connect_raw().await;
        let version: String = sqlx::query_scalar(raw_sql::SERVER_VERSION).fetch_one(&mut conn).await.expect("version");
        let commit: String = sqlx::query_scalar(raw_sql::COMMIT_SETTINGS).fetch_one(&mut conn).await.expect("settings");
        db.drop().await;
        Some(format!("{version} ({commit})"))
    } else {
        None
    };
    Machine {
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        postgres,
        load_before: load_average(),
        load_after: String::new(),
        date_utc: date_utc(),
        window_secs: settings.window.as_secs_f64(),
        reps: settings.reps,
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock (civil-from-days, H. Hinnant's algorithm).
fn date_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
