//! `lockstep chaos run FILE.toml`: a scenario file on real PostgreSQL and real replica processes, with real
//! faults and the simulator's checkers (`lockstep::chaos`). Prints the same summary as `sim run`, plus the wall
//! time and where the history is; exit codes as `sim run`: 0 passed, 1 a checker failed (or the world did), 2 bad
//! input (a scenario or fault the harness refuses), and as `sim sweep`'s 130 when Ctrl-C or SIGTERM stopped the run
//! (it stops every node, writes what it has and drops its schema first; a second signal ends it at once).

use super::chaos_nodes::{self, ChaosAgentArgs, ChaosServeArgs};
use super::{DATABASE_URL_VAR, Database, Failure};
use lockstep::chaos::{ChaosOptions, Ended, Interrupted, run};
use std::path::PathBuf;

/// The exit code of a run stopped by Ctrl-C or SIGTERM: 128 + SIGINT, the shell's convention, as `sim sweep`'s.
pub const INTERRUPTED: u8 = 130;

/// `lockstep chaos …`.
#[derive(clap::Subcommand, Debug)]
pub enum ChaosCommand {
    /// Run a scenario file on real PostgreSQL with real replica processes and real faults, then the simulator's
    /// checkers on the recorded history.
    Run(ChaosRunArgs),
    /// A replica of a run (`chaos run` starts it; not for users): `serve` with the run's history and planted bugs,
    /// or the simulator's row workload pipelines.
    #[command(hide = true)]
    Serve(ChaosServeArgs),
    /// An agent of a run (`chaos run` starts it; not for users): `agent` running the scenario's `[jobs]` rules.
    #[command(hide = true)]
    Agent(ChaosAgentArgs),
}

impl ChaosCommand {
    /// Whether the command runs until stopped (a run's replica or agent).
    pub fn is_long_running(&self) -> bool {
        matches!(self, ChaosCommand::Serve(_) | ChaosCommand::Agent(_))
    }
}

/// Flags of `chaos run`.
#[derive(clap::Args, Debug)]
pub struct ChaosRunArgs {
    /// The scenario file (TOML, as `sim run` takes).
    pub scenario: PathBuf,
    /// PostgreSQL connection URL; a fresh schema of its database holds the run (dropped at the end). Every local
    /// user can read it in the process list while the run lasts: for a URL with a password, use
    /// --database-url-file or the DATABASE_URL environment variable instead.
    #[arg(long, value_name = "URL", conflicts_with = "database_url_file")]
    pub database_url: Option<String>,
    /// A file holding the connection URL (white space around it is ignored), read at start, as `serve` and
    /// `agent` take it: the URL does not show in the process list. The run's replicas and agents get their
    /// proxies' URLs in their environment, never on their command lines.
    #[arg(long, value_name = "PATH")]
    pub database_url_file: Option<PathBuf>,
    /// The workload's seed (and the random fault processes'); default the file's first.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep the run's schema (rows, events, history table) instead of dropping it.
    #[arg(long)]
    pub keep: bool,
    /// Multiply every scenario time (fault times, downs and spans, the workload span) by this, dividing the
    /// workload's rates so the rows stay as many: `--time-scale 0.5` runs a 60 s scenario's schedule in 30 s.
    /// Lease ttls, processing times and the liveness bound are not scaled.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Run without the faults that have no real form (clock drift, buggify, network faults without the proxy),
    /// listing them, instead of refusing the scenario.
    #[arg(long)]
    pub skip_refused: bool,
    /// Directory for the run's history (history.txt), fault log (faults.txt) and replica logs. Default: a new
    /// directory in the system's temp dir.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Mutation testing only: the replicas' guarded apply skips its token guard (a checker must fire).
    #[arg(long, hide = true)]
    pub apply_guard_off: bool,
}

/// Runs `command`; the exit code.
pub async fn execute(command: ChaosCommand) -> Result<u8, Failure> {
    match command {
        ChaosCommand::Run(args) => run_scenario(args).await,
        ChaosCommand::Serve(args) => chaos_nodes::serve(args).await.map(|()| 0),
        ChaosCommand::Agent(args) => chaos_nodes::agent(args).await.map(|()| 0),
    }
}

/// `chaos run`: the scenario's run, its summary printed; the exit code.
async fn run_scenario(args: ChaosRunArgs) -> Result<u8, Failure> {
    // Real mode's rule: --database-url-file or --database-url (clap refuses both), else DATABASE_URL; checked to be
    // PostgreSQL's.
    let database = Database {
        database_url: args.database_url.clone(),
        database_url_file: args.database_url_file.clone(),
        schema: String::new(),
    };
    let (url, source) = database.url(std::env::var(DATABASE_URL_VAR).ok())?;
    let exe = std::env::current_exe().map_err(|e| Failure::runtime(format!("cannot find this binary: {e}")))?;
    let options = ChaosOptions {
        scenario: args.scenario.clone(),
        database_url: url,
        database_url_source: source,
        seed: args.seed,
        keep: args.keep,
        time_scale: args.time_scale,
        skip_refused: args.skip_refused,
        exe,
        out: args.out.clone(),
        apply_guard_off: args.apply_guard_off,
    };
    lockstep::interrupt::catch("\ninterrupted: stopping the run (interrupt again to stop at once)\n");
    let ended = run(options, signalled()).await;
    lockstep::interrupt::release();
    let done = match ended.map_err(|error| Failure { code: error.code, message: error.message })? {
        Ended::Ran(done) => *done,
        Ended::Interrupted(interrupted) => {
            print_interrupted(&args, &interrupted);
            return Ok(INTERRUPTED);
        }
    };
    println!("{} (chaos, real PostgreSQL), seed {}", args.scenario.display(), done.report.seed);
    for skipped in &done.skipped {
        println!("skipped fault: {skipped}");
    }
    print!("{}", lockstep::sim::summary::render(&done.report));
    // `[faults] pause_inside_pass`: every pause says where it landed; one not seen inside a pass was skipped.
    if !done.landings.is_empty() {
        let inside = done.landings.iter().filter(|landing| landing.lease.is_some()).count();
        println!("pauses inside a pass: {inside} of {}", done.landings.len());
        for landing in &done.landings {
            let (node, at, waited) = (&landing.node, landing.at.as_secs_f64(), landing.waited.as_secs_f64());
            match landing.lease {
                Some(lease) => {
                    println!(
                        "  {node} at {at:.3} s: inside a pass (lease {}#{}), {waited:.3} s late",
                        lease.id, lease.token
                    )
                }
                None => println!("  {node} at {at:.3} s: NOT inside a pass: none seen in {waited:.3} s; skipped"),
            }
        }
    }
    println!("wall time: {:.1} s", done.report.wall.as_secs_f64());
    let commits = lockstep::text::count(done.report.commits as u64, "commit");
    println!("history: {} ({commits})", done.dir.join("history.txt").display());
    if args.keep {
        println!("schema kept: {}", done.schema);
    }
    Ok(if done.report.passed() { 0 } else { 1 })
}

/// What an interrupted run did, in `sim sweep`'s words: `interrupted (Ctrl-C): …`, the schema, the files.
fn print_interrupted(args: &ChaosRunArgs, run: &Interrupted) {
    println!("{} (chaos, real PostgreSQL)", args.scenario.display());
    let stopped = match &run.stopped {
        Ok(()) => "every replica and agent stopped".to_string(),
        Err(broken) => format!("every replica and agent stopped ({broken})"),
    };
    println!(
        "interrupted ({}): the run stopped at {:.1} s, before its checkers: no more faults; {stopped}",
        run.signal,
        run.at.as_secs_f64()
    );
    match (run.dropped, args.keep) {
        (true, _) => println!("schema dropped: {}", run.schema),
        (false, true) => println!("schema kept: {}", run.schema),
        (false, false) => println!("schema NOT dropped: {} (the error is above)", run.schema),
    }
    let history = match &run.history {
        Ok(commits) => format!("history.txt: {}, ", lockstep::text::count(*commits as u64, "commit")),
        Err(error) => {
            println!("history not written: PostgreSQL did not read it: {error}");
            String::new()
        }
    };
    println!("files: {} ({history}faults.txt, trace.txt, the nodes' logs)", run.dir.display());
}

/// Resolves once Ctrl-C or SIGTERM came ([`lockstep::interrupt`]), naming it: the harness then stops every node,
/// writes what it has and drops its schema, and the command prints what it did and exits 130; a second signal
/// ends the process at once (its nodes die with it, `PR_SET_PDEATHSIG`; the schema stays).
async fn signalled() -> &'static str {
    loop {
        match lockstep::interrupt::signal() {
            Some(signal) => return signal,
            None => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}
