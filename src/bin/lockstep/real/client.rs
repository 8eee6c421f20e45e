//! The client commands: `submit`, `status`, `list`, `abort`, `migrate`. Each connects, makes its calls through
//! `lockstep::gang::api` (write requests go to the operation's inbox with a fetch hint, so they never contend with a
//! replica's lease), and exits.

use super::{Database, Failure, duration};
use lockstep::files;
use lockstep::gang::api::{self, GangError};
use lockstep::gang::listing::{LIST_LEN_MAX_DEFAULT, ListFilter, OperationList};
use lockstep::gang::model::OperationStatus;
use lockstep::gang::spec::SPEC_FILE_BYTES_MAX;
use lockstep::gang::status::StatusReport;
use lockstep::gang::{OperationSpec, SpecFormat};
use lockstep::store::{PgStore, RowId};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Pooled sessions of a client command: it makes one call at a time.
const CLIENT_CONNECTIONS: u32 = 1;

/// A spec's text format on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    Yson,
    Json,
    Yaml,
}

impl From<FormatArg> for SpecFormat {
    fn from(format: FormatArg) -> SpecFormat {
        match format {
            FormatArg::Yson => SpecFormat::Yson,
            FormatArg::Json => SpecFormat::Json,
            FormatArg::Yaml => SpecFormat::Yaml,
        }
    }
}

/// Flags of `submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub database: Database,
    /// The spec file: YSON (.yson), JSON (.json) or YAML (.yaml, .yml); `-` reads standard input (YSON unless
    /// --format says otherwise).
    pub spec: PathBuf,
    /// The spec's format, when its extension does not tell (standard input: YSON when not given).
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// The submission's key (1 to 256 bytes, no control character): a submit with a key that an earlier one used
    /// creates nothing and prints that one's operation, so a submit whose outcome is unknown (exit 1) can be run
    /// again safely with its key. Without it the command makes a key and prints it on stderr.
    #[arg(long)]
    pub key: Option<String>,
    /// Follow the operation to its end (state and incarnation changes on stderr); exit 0 if it completed, 1 if it
    /// failed or was aborted.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: pause between two reads of the operation (not zero).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse_nonzero, default_value = "500ms")]
    pub poll_interval: Duration,
    /// With --wait: how long the operation may stay `starting` before a note says no replica seems to run (tests
    /// shorten it).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "15s", hide = true)]
    pub no_replica_hint_after: Duration,
}

/// Flags of `status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub database: Database,
    /// The operation's id, as `submit` printed it (`lockstep list` lists them).
    pub operation: i64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show the jobs of every incarnation, not only the current one.
    #[arg(long)]
    pub all: bool,
}

/// An operation state on the command line (`--state`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateArg {
    Starting,
    Running,
    Completed,
    Failed,
    Aborted,
}

impl From<StateArg> for OperationStatus {
    fn from(state: StateArg) -> OperationStatus {
        match state {
            StateArg::Starting => OperationStatus::Starting,
            StateArg::Running => OperationStatus::Running,
            StateArg::Completed => OperationStatus::Completed,
            StateArg::Failed => OperationStatus::Failed,
            StateArg::Aborted => OperationStatus::Aborted,
        }
    }
}

/// Flags of `list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub database: Database,
    /// Only operations in this state; repeat the flag or give a comma list for several (`--state
    /// starting,running`). Every state when not given.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STATE")]
    pub state: Vec<StateArg>,
    /// Only operations submitted at most this long ago (a duration: 90s, 30m, 1h, 48h), on the database's clock.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_nonzero)]
    pub since: Option<Duration>,
    /// Only operations submitted more than this long ago, on the database's clock; with --since, the operations
    /// submitted between the two ages.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_nonzero)]
    pub older_than: Option<Duration>,
    /// At most this many operations, the newest; a last line (or `left_out` in JSON) counts the rest.
    #[arg(long, value_name = "N", default_value_t = LIST_LEN_MAX_DEFAULT, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Print the list as JSON: `{"now": …, "operations": [{"operation", "state", "submitted_at", "age_ms",
    /// "incarnation", "tasks", "result"}, …], "left_out": N}` (times in microseconds since the Unix epoch).
    #[arg(long)]
    pub json: bool,
}

/// Flags of `abort`.
#[derive(clap::Args, Debug)]
pub struct AbortArgs {
    #[command(flatten)]
    pub database: Database,
    /// The operation's id.
    pub operation: i64,
    /// The reason recorded on the operation: 1 to 1 024 bytes on one line (no control character).
    #[arg(long, default_value = "aborted by user")]
    pub reason: String,
}

/// Flags of `migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: Database,
}

/// The format of `path`: `--format` if given, else YSON for standard input (`-`, as YTsaurus's own specs are
/// written), else its extension. Errors (usage): a file without a known extension.
pub fn spec_format(path: &Path, flag: Option<FormatArg>) -> Result<SpecFormat, Failure> {
    if let Some(format) = flag {
        return Ok(format.into());
    }
    if is_stdin(path) {
        return Ok(SpecFormat::Yson);
    }
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("yson") => Ok(SpecFormat::Yson),
        Some("json") => Ok(SpecFormat::Json),
        Some("yaml" | "yml") => Ok(SpecFormat::Yaml),
        _ => Err(Failure::usage(format!(
            "{}: cannot tell the spec's format from its extension (.yson, .json, .yaml, .yml); pass --format",
            path.display()
        ))),
    }
}

/// Whether `path` is `-`: standard input, as Unix commands take it.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Reads and validates the spec at `path`. Errors (usage): unreadable file, one past the spec files' cap
/// ([`SPEC_FILE_BYTES_MAX`], 16 MiB: `/dev/zero` is refused, not read until memory runs out), syntax error, broken rules (each
/// naming its field).
pub fn read_spec(path: &Path, flag: Option<FormatArg>) -> Result<OperationSpec, Failure> {
    let format = spec_format(path, flag)?;
    let text = if is_stdin(path) {
        files::read_text_from(std::io::stdin().lock(), "spec file", SPEC_FILE_BYTES_MAX)
    } else {
        files::read_text(path, "spec file", SPEC_FILE_BYTES_MAX)
    };
    let text = text.map_err(|error| Failure::usage(format!("cannot read spec {}: {error}", path.display())))?;
    OperationSpec::parse(&text, format)
        .map_err(|error| Failure::usage(format!("spec {} is invalid:\n{error}", path.display())))
}

/// One warning on stderr per key of `spec` that lockstep does not know (kept, as YTsaurus keeps unrecognized keys,
/// but without effect), with the known key it is closest to: `warning: spec key tasks.t.gang_option is not one
/// lockstep knows; it is kept but has no effect (did you mean gang_options?)`.
fn warn_unknown_keys(spec: &OperationSpec) {
    for path in spec.unknown_keys() {
        let hint =
            lockstep::gang::spec::did_you_mean(path).map_or(String::new(), |key| format!(" (did you mean {key}?)"));
        eprintln!("warning: spec key {path} is not one lockstep knows; it is kept but has no effect{hint}");
    }
}

fn gang_failure(error: GangError) -> Failure {
    match error {
        GangError::Spec(error) => Failure::usage(format!("spec is invalid:\n{error}")),
        error @ GangError::Key { .. } => Failure::usage(format!("--key: {error}")),
        error @ GangError::Reason { .. } => Failure::usage(format!("--reason: {error}")),
        error => Failure::runtime(error.to_string()),
    }
}

/// How `submit` retries a submission whose outcome is unknown: 6 attempts, 0.25 s after the first failure and
/// doubling to 4 s, so about 7.75 s of waits in all, time for a dropped connection to be made again or a failed-over
/// database to answer; then the command exits 1 and names the key to submit again with.
const SUBMIT_RETRY: api::SubmitRetry =
    api::SubmitRetry { attempts_max: 6, backoff_min: Duration::from_millis(250), backoff_max: Duration::from_secs(4) };

/// A key for a submission whose user gave none: 128 random bits in hex, so no two submissions share one.
fn made_key() -> String {
    format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
}

/// `submit`: parse, submit under the submission's key (retried while the outcome is unknown), print the id; with
/// `--wait`, follow the operation to its end.
pub async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    let spec = read_spec(&args.spec, args.format)?;
    warn_unknown_keys(&spec);
    if let Some(key) = &args.key {
        api::check_submit_key(key).map_err(|error| Failure::usage(format!("--key: {error}")))?;
    }
    let key = args.key.clone().unwrap_or_else(made_key);
    if args.key.is_none() {
        eprintln!("submit key: {key} (if this submit fails, run it again with --key {key}: it creates nothing twice)");
    }
    let store = args.database.connect_migrated("lockstep submit", CLIENT_CONNECTIONS).await?;
    let submitted = match api::submit_keyed(&store, spec, &key, SUBMIT_RETRY).await {
        Ok(submitted) => submitted,
        Err(GangError::Store(error)) if !matches!(error, lockstep::store::StoreError::Invalid(_)) => {
            return Err(Failure::runtime(format!(
                "submit with key {key}: {error}; whether the operation was created is unknown: run the same submit \
                 with --key {key} (it creates nothing twice)"
            )));
        }
        Err(error) => return Err(gang_failure(error)),
    };
    let operation = submitted.operation;
    if !submitted.created {
        eprintln!("key {key} names operation {operation}, submitted before: nothing new was created");
    }
    println!("{operation}");
    let _ = std::io::stdout().flush();
    if !args.wait {
        return Ok(());
    }
    let end = follow(&store, operation, &args).await?;
    match end.state {
        OperationStatus::Completed => Ok(()),
        state => Err(Failure::runtime(format!(
            "operation {operation} {state}: {}",
            end.result.unwrap_or_else(|| "no reason recorded".into())
        ))),
    }
}

/// Reads `operation` every `poll_interval` until it ends, logging each change of state, incarnation or job
/// counts to stderr, and once, if it is still `starting` after `--no-replica-hint-after` (15 s: a replica's first
/// pass comes within a fetch backoff, 5 s at most, of the submit's hint), that no controller replica has taken it,
/// naming the `serve` command for the schema. A read that fails is logged and retried (the
/// database may come back). Never ends for an operation that never ends: `--wait` follows it as long as it runs.
async fn follow(store: &PgStore, operation: RowId, args: &SubmitArgs) -> Result<StatusReport, Failure> {
    let (poll_interval, schema, hint_after) = (args.poll_interval, &args.database.schema, args.no_replica_hint_after);
    let mut last = None;
    let started = tokio::time::Instant::now();
    let mut hinted = false;
    loop {
        match StatusReport::read(store, operation, false).await {
            Ok(report) => {
                let summary = summary(&report);
                if last.as_ref() != Some(&summary) {
                    eprintln!("{summary}");
                    last = Some(summary);
                }
                if !hinted && report.state == OperationStatus::Starting && started.elapsed() >= hint_after {
                    hinted = true;
                    eprintln!(
                        "note: operation {operation} is still starting after {:.1} s: no controller replica has taken \
                         it. Is `lockstep serve --schema {schema}` running against this database?",
                        hint_after.as_secs_f64()
                    );
                }
                if report.state.is_terminal() {
                    return Ok(report);
                }
            }
            Err(GangError::NotFound(id)) => return Err(Failure::runtime(format!("operation {id} not found"))),
            Err(error) => tracing::warn!(%operation, %error, "reading the operation failed; retrying"),
        }
        tokio::time::sleep(poll_interval).await;
    }
}

/// One line: `operation 5: running, incarnation 5-i1, jobs: 2 running, 1 completed`; `jobs: none yet` before a
/// replica's first pass has created the incarnation's jobs.
fn summary(report: &StatusReport) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for job in report.tasks.iter().flat_map(|t| &t.jobs) {
        *counts.entry(job.state).or_insert(0usize) += 1;
    }
    let jobs: Vec<String> = counts.iter().map(|(state, n)| format!("{n} {state}")).collect();
    let jobs = if jobs.is_empty() { "none yet".to_string() } else { jobs.join(", ") };
    format!("operation {}: {}, incarnation {}, jobs: {jobs}", report.operation, report.state, report.incarnation)
}

/// `status`: the report as a table, or as JSON with `--json`.
pub async fn status(args: StatusArgs) -> Result<(), Failure> {
    let store = args.database.connect_migrated("lockstep status", CLIENT_CONNECTIONS).await?;
    let report = StatusReport::read(&store, RowId(args.operation), args.all).await.map_err(gang_failure)?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).expect("status reports serialize");
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

/// `list`: the operations the flags select, as a table, or as JSON with `--json`. Errors (usage): `--since` not
/// longer than `--older-than`.
pub async fn list(args: ListArgs) -> Result<(), Failure> {
    let filter = ListFilter {
        states: args.state.iter().map(|state| OperationStatus::from(*state)).collect(),
        since: args.since,
        older_than: args.older_than,
        limit: args.limit,
    };
    filter.check().map_err(Failure::usage)?;
    let store = args.database.connect_migrated("lockstep list", CLIENT_CONNECTIONS).await?;
    let list = OperationList::read(&store, &filter).await.map_err(gang_failure)?;
    if args.json {
        let json = serde_json::to_string_pretty(&list).expect("operation lists serialize");
        println!("{json}");
    } else {
        print!("{}", list.render());
    }
    Ok(())
}

/// `abort`: records the request in the operation's inbox; a replica's next pass aborts it. An operation that has
/// already ended is a state reached, not a failure: exit 0 with a message naming its state, also when it completed
/// or failed before the abort (then nothing was aborted, and the message says so): either way the operation runs
/// nothing any more, which is what a script that aborts wants to know. An operation that does not exist is exit 1.
pub async fn abort(args: AbortArgs) -> Result<(), Failure> {
    let store = args.database.connect_migrated("lockstep abort", CLIENT_CONNECTIONS).await?;
    match api::abort(&store, RowId(args.operation), &args.reason).await {
        Ok(()) => eprintln!("abort of operation {} requested", args.operation),
        Err(GangError::Ended { operation, status: OperationStatus::Aborted }) => {
            eprintln!("operation {operation} already aborted")
        }
        Err(GangError::Ended { operation, status }) => {
            eprintln!("operation {operation} already {status}: it ended before the abort, so nothing was aborted")
        }
        Err(error) => return Err(gang_failure(error)),
    }
    Ok(())
}

/// `migrate`: connecting applies the migrations.
pub async fn migrate(args: MigrateArgs) -> Result<(), Failure> {
    let store = args.database.connect("lockstep migrate", CLIENT_CONNECTIONS, None).await?;
    store.close().await;
    eprintln!("schema {} is migrated", args.database.schema);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep::gang::model::JobStatus;
    use lockstep::gang::status::{JobStatusLine, TaskStatus};

    #[test]
    fn the_format_comes_from_the_flag_then_the_extension() {
        assert_eq!(spec_format(Path::new("a.yson"), None).unwrap(), SpecFormat::Yson);
        assert_eq!(spec_format(Path::new("a.JSON"), None).unwrap(), SpecFormat::Json);
        assert_eq!(spec_format(Path::new("a.yml"), None).unwrap(), SpecFormat::Yaml);
        assert_eq!(spec_format(Path::new("a.txt"), Some(FormatArg::Yaml)).unwrap(), SpecFormat::Yaml);
        assert_eq!(spec_format(Path::new("-"), None).unwrap(), SpecFormat::Yson, "standard input is YSON by default");
        assert_eq!(spec_format(Path::new("-"), Some(FormatArg::Json)).unwrap(), SpecFormat::Json);
        let error = spec_format(Path::new("spec"), None).unwrap_err();
        assert_eq!(error.code, 2);
        assert!(error.message.contains("--format"), "{}", error.message);
    }

    #[test]
    fn a_progress_line_says_so_when_no_job_exists_yet() {
        let job = |state| JobStatusLine {
            job: "5-0".into(),
            gang_rank: Some(0),
            job_cookie: 0,
            reserved: false,
            state,
            node: None,
            incarnation: "5-i0".into(),
            reason: None,
        };
        let task = |jobs| TaskStatus { name: "w".into(), job_count: 2, gang_size: Some(2), jobs };
        let mut report = StatusReport {
            operation: RowId(5),
            state: OperationStatus::Starting,
            incarnation: "5-i0".into(),
            incarnation_index: 0,
            gang_restarts: 0,
            failed_job_count: 0,
            max_failed_job_count: 0,
            result: None,
            placement: None,
            waiting: None,
            tasks: vec![task(Vec::new())],
        };
        assert_eq!(summary(&report), "operation 5: starting, incarnation 5-i0, jobs: none yet");
        report.state = OperationStatus::Running;
        report.tasks = vec![task(vec![job(JobStatus::Running), job(JobStatus::Running), job(JobStatus::Pending)])];
        let line = summary(&report);
        assert!(line.starts_with("operation 5: running, incarnation 5-i0, jobs: "), "{line}");
        assert!(line.contains("2 running") && line.contains("1 pending") && !line.contains("none"), "{line}");
    }
}
