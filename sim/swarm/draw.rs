//! Drawing one world: a seed's own stream picks every knob within [`Ranges`], and the world is written as a plain
//! scenario file, so that everything that takes a scenario file takes it.
//!
//! Each part of the world draws from a stream of its own (`swarm-topology`, `swarm-rows`, `swarm-gang`,
//! `swarm-faults`), so narrowing one range (say the fault kinds) leaves the other parts of a seed's world as they
//! were.
//!
//! The expectations are derived from what was drawn, not drawn: the liveness bound covers the backlog a world can
//! hold at its heal (every row it inserted, processed by its workers alone, twice over), and the starvation bound
//! the longest a parent can wait behind children that its fair share of workers is processing. A correct system
//! passes them whatever the world; a row that is never processed, or a parent that loses every race, does not.

use super::ranges::{Ranges, Shape};
use crate::sim::faults::FaultKind;
use crate::sim::rng;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::time::Duration;

/// One drawn world: its scenario file and what the sweep's table reports of it.
#[derive(Clone, Debug, PartialEq)]
pub struct World {
    /// The seed it was drawn from (and runs under: the file's `seeds = [seed]`).
    pub seed: u64,
    /// The scenario file, whole (a comment header saying how it was drawn, then the keys).
    pub text: String,
    /// Its shape.
    pub shape: Shape,
    /// The fault kinds it switched on, in [`FaultKind::ALL`]'s order.
    pub kinds: Vec<FaultKind>,
    /// The row workload's arrival rate as a multiple of its task workers' capacity (`None` without rows).
    pub load: Option<f64>,
    /// One line: the shape, the topology, the load and the kinds on.
    pub summary: String,
}

/// The world of `seed` within `ranges`; `pipelines` names a user's pipeline set that takes the built-in row
/// workload's place (its own workload and handlers; `None`: the built-in rows).
pub fn draw(ranges: &Ranges, seed: u64, pipelines: Option<&str>) -> World {
    let mut topology = rng::stream(seed, "swarm-topology");
    let shape = ranges.shapes[topology.random_range(0..ranges.shapes.len())];
    let replicas = pick(&mut topology, &ranges.replicas);
    // Drawn whatever the shape, so that narrowing the shapes leaves the rest of the topology as it was.
    let (agents, slots) = (pick(&mut topology, &ranges.agents), pick(&mut topology, &ranges.slots));
    let mut text = String::new();
    let mut body = String::new();
    let _ = writeln!(body, "name = \"swarm\"\nversion = 1\nseeds = [{seed}]");
    if let Some(set) = pipelines.filter(|_| shape.rows()) {
        let _ = writeln!(body, "pipelines = \"{set}\"");
    }
    let span = ms(pick_duration(&mut topology, &ranges.span));
    let gang = shape.gang().then(|| Gang::draw(ranges, seed, (agents, slots), span));
    let _ = writeln!(body, "\n[topology]\nreplicas = {replicas}");
    if let Some(gang) = &gang {
        let _ = writeln!(body, "agents = {}\nslots = {}", gang.agents, gang.slots);
    }
    let latency_high = topology.random_range(2..=20u64);
    let mut call_timeout = topology.random_range(1_000..=4_000u64);
    let rows = (shape.rows() && pipelines.is_none()).then(|| Rows::draw(ranges, seed, replicas, span));
    let user_set = shape.rows() && pipelines.is_some();
    // Each part draws from its own stream, so the faults can be drawn before the rows are written.
    let faults = Faults::draw(ranges, seed, shape, rows.is_some(), replicas, span, &rows);
    // A hung store call ends at its bound: with a store-hang kind on, the bound is drawn from its own stream, from
    // a second to twice the lease ttl of what the hung calls would renew (the rows' lease for a replica's, the node
    // lease for an agent's; the longer where both hang), so that a run also sees calls that outlast the leases they
    // would renew (as production's 36 s bound outlasts a 30 s lease and a 10 s node lease).
    let replica_ttl = rows.as_ref().map_or(10_000, |rows| rows.lease_ttl);
    let ttls = [
        faults.kinds.contains(&FaultKind::StoreHang).then_some(replica_ttl),
        faults
            .kinds
            .contains(&FaultKind::AgentStoreHang)
            .then(|| gang.as_ref().map_or(10_000, |gang| gang.agent_lease.0)),
    ];
    if let Some(ttl) = ttls.into_iter().flatten().max() {
        call_timeout = rng::stream(seed, "swarm-call-timeout").random_range(1_000..=2 * ttl);
    }
    let _ =
        writeln!(body, "\n[network]\nlatency = [\"1ms\", \"{latency_high}ms\"]\ncall_timeout = \"{call_timeout}ms\"");
    // Hanging handlers end at their pipeline's handler_timeout: one drawn from its own stream, from one to three
    // lease ttls, so that a run sees hung items cut and retried (the engine's default, a minute, would outlast
    // most worlds).
    let handler_timeout = rows.as_ref().filter(|_| faults.kinds.contains(&FaultKind::HandlerHang)).map(|rows| {
        let mut rng = rng::stream(seed, "swarm-handler-timeout");
        rng.random_range(rows.lease_ttl..=3 * rows.lease_ttl)
    });
    // A user's set brings its own pipelines and workload: the swarm draws the world around them.
    if let Some(rows) = &rows {
        rows.write(&mut body, handler_timeout);
    }
    if let Some(gang) = &gang {
        gang.write(&mut body);
    }
    faults.write(&mut body, span);
    if let Some(gang) = gang.as_ref().filter(|_| ranges.mutations.iter().any(|m| m == "agent_drift_beyond_margin")) {
        gang.write_drift_beyond_margin(&mut body, seed, span);
    }
    Expect::of(rows.as_ref(), gang.as_ref(), handler_timeout, user_set).write(&mut body);
    if !ranges.mutations.is_empty() {
        body.push_str("\n[mutation]\n");
        for mutation in &ranges.mutations {
            let _ = writeln!(body, "{mutation} = true");
        }
    }
    let load = rows.as_ref().map(|rows| rows.load);
    let summary = summary(
        shape,
        replicas,
        gang.as_ref(),
        rows.as_ref(),
        user_set.then_some(pipelines).flatten(),
        &faults.kinds,
        span,
    );
    let _ = writeln!(
        text,
        "# Drawn by `lockstep sim swarm` ({}, seed {seed}): {summary}.\n# `sim run` runs it as the swarm did; \
         `sim shrink` cuts it down.",
        ranges.version_label()
    );
    text.push_str(&body);
    World { seed, text, shape, kinds: faults.kinds, load, summary }
}

fn summary(
    shape: Shape,
    replicas: usize,
    gang: Option<&Gang>,
    rows: Option<&Rows>,
    set: Option<&str>,
    kinds: &[FaultKind],
    span: u64,
) -> String {
    let mut parts = vec![format!("{} world, {replicas} replica{}", shape.name(), if replicas == 1 { "" } else { "s" })];
    if let Some(gang) = gang {
        parts.push(format!("{} agents x {} slots, {} operations", gang.agents, gang.slots, gang.operations.len()));
    }
    if let Some(rows) = rows {
        parts.push(format!(
            "tasks at {:.2} x capacity, claims at {:.2} x their counters' (~{} rows)",
            rows.load, rows.claims_load, rows.expected_rows
        ));
    }
    if let Some(set) = set {
        parts.push(format!("pipeline set {set}"));
    }
    parts.push(format!("span {}", crate::duration::format(Duration::from_millis(span))));
    let kinds: Vec<&str> = kinds.iter().map(|kind| kind.name()).collect();
    parts.push(if kinds.is_empty() { "no faults".to_string() } else { format!("faults {}", kinds.join(" ")) });
    parts.join(", ")
}

/// A uniform draw from an inclusive range.
fn pick<T: rand::distr::uniform::SampleUniform + PartialOrd + Copy>(
    rng: &mut ChaCha8Rng,
    range: &RangeInclusive<T>,
) -> T {
    rng.random_range(*range.start()..=*range.end())
}

fn pick_duration(rng: &mut ChaCha8Rng, range: &RangeInclusive<Duration>) -> Duration {
    Duration::from_millis(rng.random_range(ms(*range.start())..=ms(*range.end())))
}

fn ms(span: Duration) -> u64 {
    u64::try_from(span.as_millis()).unwrap_or(u64::MAX)
}

/// Rounds a rate or chance to three decimals, as the file shows it.
fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// A share that is zero with chance `zero`, else uniform in `range`.
fn maybe(rng: &mut ChaCha8Rng, zero: f64, range: RangeInclusive<f64>) -> f64 {
    if rng.random_bool(zero) { 0.0 } else { round3(rng.random_range(range)) }
}

/// The row part: pipelines and the built-in workload.
struct Rows {
    lease_ttl: u64,
    lease_margin: u64,
    min_processing_interval: u64,
    fetchers: usize,
    workers: (usize, usize, usize),
    tasks_per_job: u64,
    task_process: (u64, u64),
    task_slow_chance: f64,
    task_slow: (u64, u64),
    task_failure_chance: f64,
    task_fail_first_share: f64,
    task_fail_first_attempts: u32,
    task_fail_always_share: f64,
    claim_fail_first_share: f64,
    attempts_max: u32,
    job_process: (u64, u64),
    claim_process: (u64, u64),
    jobs_per_minute: f64,
    claims_per_minute: f64,
    claim_pipelines: usize,
    resources: usize,
    hot_share: f64,
    claim_resources: usize,
    rows_max: usize,
    span: u64,
    load: f64,
    /// The claims' arrival rate as a multiple of what their workers and counters can take.
    claims_load: f64,
    expected_rows: u64,
    /// Seconds the task workers alone need for every task the world inserts (the backlog at the heal, at worst).
    task_work_s: f64,
    /// Seconds the claim workers and counters need for every claim the world inserts, at the pace of the tightest.
    claims_work_s: f64,
}

impl Rows {
    fn draw(ranges: &Ranges, seed: u64, replicas: usize, span: u64) -> Rows {
        let mut rng = rng::stream(seed, "swarm-rows");
        let lease_ttl = ms(pick_duration(&mut rng, &ranges.lease_ttl));
        // The engine's rules: heartbeat_trigger (ttl / 2) ≥ 2 heartbeats (2 s) + margin, and margin > the 2 ms
        // apply batch window.
        let margin_max = (lease_ttl / 2).saturating_sub(2_000).clamp(100, 3_000);
        let lease_margin = rng.random_range(100.min(margin_max)..=margin_max);
        let min_processing_interval = rng.random_range(200..=2_000u64);
        let fetchers = rng.random_range(1..=2usize);
        let workers =
            (pick(&mut rng, &ranges.workers), pick(&mut rng, &ranges.workers), pick(&mut rng, &ranges.workers));
        let tasks_per_job = rng.random_range(1..=5u64);
        let low = rng.random_range(10..=300u64);
        let task_process = (low, low + rng.random_range(10..=2_000u64));
        let task_slow_chance = maybe(&mut rng, 0.5, 0.02..=0.3);
        // Slow tasks outlive their lease: only heartbeats keep them.
        let slow_low = lease_ttl + rng.random_range(500..=2_000u64);
        let task_slow = (slow_low, slow_low + rng.random_range(500..=lease_ttl));
        let task_failure_chance = maybe(&mut rng, 0.5, 0.01..=0.2);
        let task_fail_first_share = maybe(&mut rng, 0.6, 0.05..=0.3);
        let task_fail_first_attempts = rng.random_range(1..=3u32);
        let task_fail_always_share = maybe(&mut rng, 0.8, 0.01..=0.1);
        let claim_fail_first_share = maybe(&mut rng, 0.7, 0.05..=0.3);
        let attempts_max = rng.random_range(3..=10u32);
        let job_low = rng.random_range(5..=100u64);
        let job_process = (job_low, job_low + rng.random_range(5..=300u64));
        let claim_low = rng.random_range(5..=100u64);
        let claim_process = (claim_low, claim_low + rng.random_range(5..=400u64));
        let claim_pipelines = rng.random_range(1..=3usize);
        let resources = rng.random_range(1..=5usize);
        let hot_share = round3(rng.random_range(0.0..=0.9));
        let claim_resources = if resources > 1 && rng.random_bool(0.2) { 2 } else { 1 };
        // The load: above capacity in a share of the worlds (up to `overload`), else anywhere from idle to 0.9.
        let overloaded = ranges.overload >= 1.0 && rng.random_bool(ranges.overload_share);
        let load = round3(match overloaded {
            true => rng.random_range(1.0..=ranges.overload),
            false => rng.random_range(0.0..=ranges.overload.min(0.9)),
        });
        let mean = |(low, high): (u64, u64)| (low + high) as f64 / 2.0 / 1000.0;
        let task_mean = mean(task_process) * (1.0 - task_slow_chance) + mean(task_slow) * task_slow_chance;
        let tasks_capacity = (replicas * workers.0) as f64 / task_mean; // tasks per second
        let tasks_mean = (1 + tasks_per_job) as f64 / 2.0;
        // Claims: the workers' capacity, or the counters' if that is lower. A counter takes one claim at a time: the
        // hot one takes `hot_share` of them, and claims locking `claim_resources` of the `resources` at once run at
        // most resources / claim_resources at a time (two of two: one at a time).
        let claim_mean = mean(claim_process);
        let workers_capacity = (replicas * workers.2 * claim_pipelines) as f64 / claim_mean;
        let hot_capacity = if hot_share > 0.0 { 1.0 / claim_mean / hot_share } else { f64::INFINITY };
        let counters_capacity = (resources / claim_resources).max(1) as f64 / claim_mean;
        let claims_capacity = workers_capacity.min(hot_capacity).min(counters_capacity);
        let share_claims = if rng.random_bool(0.15) { 0.0 } else { rng.random_range(0.2..=1.0) };
        let jobs_per_minute = round3((load * tasks_capacity * 60.0 / tasks_mean).min(60_000.0));
        let claims_per_minute = round3((load * claims_capacity * 60.0 * share_claims).min(60_000.0));
        let rows_max = ranges.rows_max;
        let per_second = jobs_per_minute / 60.0 * (1.0 + tasks_mean) + claims_per_minute / 60.0;
        let expected_rows = ((per_second * span as f64 / 1000.0) as u64).min(rows_max as u64);
        let inserted_s = (span as f64 / 1000.0).min(rows_max as f64 / per_second.max(1e-9));
        let tasks_total = jobs_per_minute / 60.0 * tasks_mean * inserted_s;
        let task_work_s = tasks_total / tasks_capacity;
        // Seconds the claim workers and counters need for every claim, at the pace of the tightest of them.
        let claims_work_s = claims_per_minute / 60.0 * inserted_s / claims_capacity;
        Rows {
            lease_ttl,
            lease_margin,
            min_processing_interval,
            fetchers,
            workers,
            tasks_per_job,
            task_process,
            task_slow_chance,
            task_slow,
            task_failure_chance,
            task_fail_first_share,
            task_fail_first_attempts,
            task_fail_always_share,
            claim_fail_first_share,
            attempts_max,
            job_process,
            claim_process,
            jobs_per_minute,
            claims_per_minute,
            claim_pipelines,
            resources,
            hot_share,
            claim_resources,
            rows_max,
            span,
            load,
            claims_load: if claims_capacity > 0.0 { claims_per_minute / 60.0 / claims_capacity } else { 0.0 },
            expected_rows,
            task_work_s,
            claims_work_s,
        }
    }

    /// Writes the rows' part; `handler_timeout` (milliseconds) into `[pipeline]` when drawn.
    fn write(&self, out: &mut String, handler_timeout: Option<u64>) {
        let (tasks, jobs, claims) = self.workers;
        let pair = |(low, high): (u64, u64)| format!("[\"{low}ms\", \"{high}ms\"]");
        let _ = writeln!(
            out,
            "\n[pipeline]\nlease_ttl = \"{}ms\"\nlease_margin = \"{}ms\"\nmin_processing_interval = \"{}ms\"\n\
             fetchers = {}\nworkers = {{ tasks = {tasks}, jobs = {jobs}, claims = {claims} }}",
            self.lease_ttl, self.lease_margin, self.min_processing_interval, self.fetchers
        );
        if let Some(timeout) = handler_timeout {
            // After the workers' inline table, a key of `[pipeline]` still.
            let _ = writeln!(out, "handler_timeout = \"{timeout}ms\"");
        }
        let _ = writeln!(
            out,
            "\n[workload]\nspan = \"{}ms\"\njobs_per_minute = {:?}\ntasks_per_job = [1, {}]\nclaims_per_minute = {:?}\n\
             claim_pipelines = {}\nresources = {}\nhot_share = {:?}\nclaim_resources = {}\nrows_max = {}\n\
             task_process = {}\ntask_slow_chance = {:?}\ntask_slow = {}\ntask_failure_chance = {:?}\n\
             task_fail_first_share = {:?}\ntask_fail_first_attempts = {}\ntask_fail_always_share = {:?}\n\
             claim_fail_first_share = {:?}\nattempts_max = {}\njob_process = {}\nclaim_process = {}",
            self.span,
            self.jobs_per_minute,
            self.tasks_per_job,
            self.claims_per_minute,
            self.claim_pipelines,
            self.resources,
            self.hot_share,
            self.claim_resources,
            self.rows_max,
            pair(self.task_process),
            self.task_slow_chance,
            pair(self.task_slow),
            self.task_failure_chance,
            self.task_fail_first_share,
            self.task_fail_first_attempts,
            self.task_fail_always_share,
            self.claim_fail_first_share,
            self.attempts_max,
            pair(self.job_process),
            pair(self.claim_process),
        );
    }
}

/// The gang part: agents, the controller's and agents' knobs, operations, how jobs behave, control actions.
struct Gang {
    agents: usize,
    slots: u32,
    controller: String,
    agent: String,
    jobs: String,
    operations: Vec<(u64, String)>,
    aborts: Vec<(u64, usize)>,
    /// Seconds of job time every operation needs once, on all slots at once, and the longest job.
    work_s: f64,
    job_max_s: f64,
    restarts: u32,
    unfit_timeout_s: u64,
    /// The agents' node lease ttl and margin, in milliseconds.
    agent_lease: (u64, u64),
}

impl Gang {
    fn draw(ranges: &Ranges, seed: u64, (agents, slots): (usize, u32), span: u64) -> Gang {
        let mut rng = rng::stream(seed, "swarm-gang");
        let total = agents as u32 * slots;
        let controller_ttl = rng.random_range(6_000..=20_000u64);
        let placement = if rng.random_bool(0.5) { "incremental" } else { "all_or_nothing" };
        let unfit_timeout = rng.random_range(30..=120u64);
        let controller = format!(
            "\n[controller]\nworkers = {}\nlease_ttl = \"{controller_ttl}ms\"\nlease_margin = \"1s\"\n\
             min_processing_interval = \"{}ms\"\ngang_placement = \"{placement}\"\ngang_unfit_timeout = \"{unfit_timeout}s\"",
            rng.random_range(1..=4usize),
            rng.random_range(1_000..=3_000u64),
        );
        let agent_ttl = rng.random_range(6_000..=20_000u64);
        let agent_margin = rng.random_range(1_000..=agent_ttl / 4);
        let agent = format!("\n[agent]\nlease_ttl = \"{agent_ttl}ms\"\nlease_margin = \"{agent_margin}ms\"");
        let job_low = rng.random_range(1_000..=10_000u64);
        let job_high = job_low + rng.random_range(0..=40_000u64);
        let count = pick(&mut rng, &ranges.operations);
        let mut operations = Vec::new();
        let mut aborts = Vec::new();
        let mut work_s = 0.0;
        let mut tasks_used: Vec<&str> = Vec::new();
        for index in 0..count {
            let (spec, jobs_in_op, tasks, endless) = operation_spec(&mut rng, total);
            work_s += jobs_in_op as f64 * job_high as f64 / 1000.0;
            for task in tasks {
                if !tasks_used.contains(&task) {
                    tasks_used.push(task);
                }
            }
            // Submissions in the first two thirds of the span, so that faults meet them running.
            let at = rng.random_range(0..=span * 2 / 3);
            operations.push((at, spec));
            // An operation that never ends on its own (`restart_completed_jobs`: a service) is always aborted.
            if rng.random_bool(0.1) || endless {
                aborts.push((at + rng.random_range(1_000..=30_000u64), index));
            }
        }
        let mut jobs = format!("\n[jobs]\nduration = [\"{job_low}ms\", \"{job_high}ms\"]");
        let mut restarts = 0;
        for _ in 0..rng.random_range(0..=3u32) {
            // A scripted failure: the start `attempt` of one task's cookie ends early with a non-zero code (a
            // ranked job's failure restarts its gang). Only tasks some operation has: the file refuses a rule
            // that can never match.
            let task = tasks_used[rng.random_range(0..tasks_used.len())];
            let _ = write!(
                jobs,
                "\n\n[[jobs.rule]]\ntask = \"{task}\"\ncookie = {}\nattempt = {}\nduration = [\"500ms\", \"{}ms\"]\nexit_code = {}",
                rng.random_range(0..=2u32),
                rng.random_range(0..=1u32),
                rng.random_range(1_000..=job_low.max(1_000) + 4_000),
                rng.random_range(1..=3i32),
            );
            restarts += 1;
        }
        Gang {
            agents,
            slots,
            controller,
            agent,
            jobs,
            operations,
            aborts,
            work_s,
            job_max_s: job_high as f64 / 1000.0,
            restarts,
            unfit_timeout_s: unfit_timeout,
            agent_lease: (agent_ttl, agent_margin),
        }
    }

    /// TEST ONLY (`[mutation] agent_drift_beyond_margin`): a fixed drift of one agent's clock 10 % below the margin
    /// rule's floor (1 − lease_margin / lease_ttl), from early in the window to its end, and a cut of that agent from
    /// the database during it longer than its node lease: its node is declared lost and its ranks move on while the
    /// slow clock keeps its processes past its lease.
    fn write_drift_beyond_margin(&self, out: &mut String, seed: u64, span: u64) {
        let mut rng = rng::stream(seed, "swarm-mutation");
        let (ttl, margin) = self.agent_lease;
        let floor = 1_000_000 - margin * 1_000_000 / ttl;
        let rate_ppm = floor.saturating_sub(100_000).max(crate::pipeline::clock::RATE_PPM_MIN);
        let at = rng.random_range(0..=span / 3);
        let agent = rng.random_range(0..self.agents);
        let _ = writeln!(
            out,
            "\n[[faults.at]]\nat = \"{at}ms\"\nkind = \"agent-clock-drift\"\nagent = {agent}\nrate_ppm = {rate_ppm}\nspan = \"{}ms\"",
            span - at,
        );
        let cut_at = (at + rng.random_range(2_000..=10_000u64)).min(span - 1);
        let cut = (ttl + rng.random_range(2_000..=10_000u64)).min(span);
        let _ = writeln!(
            out,
            "\n[[faults.at]]\nat = \"{cut_at}ms\"\nkind = \"partition\"\na = \"agent-{agent}\"\nb = \"db\"\nspan = \"{cut}ms\""
        );
    }

    fn write(&self, out: &mut String) {
        out.push_str(&self.controller);
        out.push('\n');
        out.push_str(&self.agent);
        out.push('\n');
        out.push_str(&self.jobs);
        out.push('\n');
        for (index, (at, spec)) in self.operations.iter().enumerate() {
            let _ = writeln!(out, "\n[[operations]]\nname = \"op-{index}\"\nat = \"{at}ms\"\nspec = \"{spec}\"");
        }
        for (at, index) in &self.aborts {
            let at = (*at).max(self.operations[*index].0);
            let _ = writeln!(
                out,
                "\n[[controls]]\nat = \"{at}ms\"\noperation = \"op-{index}\"\naction = \"abort\"\nreason = \"swarm\""
            );
        }
    }
}

/// One operation's spec (YSON, quotes escaped for a TOML basic string), its jobs, its tasks' names and whether it
/// never ends on its own (its completed jobs restart: it needs an abort): a plain vanilla operation,
/// a master and its slaves, or a gang (ranks, reserved jobs, now and then a plain task beside it), sized against
/// the world's `slots` (a gang larger than them now and then: all-or-nothing fails it as unfit, incremental
/// places it part by part).
fn operation_spec(rng: &mut ChaCha8Rng, slots: u32) -> (String, u32, Vec<&'static str>, bool) {
    let max_failed = rng.random_range(1..=10u32);
    let fit = slots.clamp(1, 6);
    match rng.random_range(0..4u32) {
        0 => {
            let count = rng.random_range(1..=fit + 1);
            let extra = match rng.random_range(0..4u32) {
                0 => ";fail_on_job_restart=%true",
                1 => ";restart_completed_jobs=%true",
                _ => "",
            };
            let spec = format!(
                "{{tasks={{worker={{job_count={count};command=w}}}};max_failed_job_count={max_failed}{extra}}}"
            );
            (spec, count, vec!["worker"], extra.starts_with(";restart"))
        }
        1 => {
            let slaves = rng.random_range(1..=fit + 2);
            (
                format!(
                    "{{tasks={{trainer={{job_count=1;command=m}};worker={{job_count={slaves};command=s}}}};\
                     max_failed_job_count={max_failed}}}"
                ),
                1 + slaves,
                vec!["trainer", "worker"],
                false,
            )
        }
        _ => {
            let count = if rng.random_bool(0.1) { fit + 1 } else { rng.random_range(1..=fit) };
            let size = rng.random_range(1..=count);
            let plain = if rng.random_bool(0.3) { rng.random_range(1..=2u32) } else { 0 };
            let mut tasks = format!("trainer={{job_count={count};command=t;gang_options={{size={size}}}}}");
            if plain > 0 {
                let _ = write!(tasks, ";logger={{job_count={plain};command=l}}");
            }
            let placement = match rng.random_range(0..4u32) {
                0 => ";gang_placement=incremental",
                1 => ";gang_placement=all_or_nothing",
                _ => "",
            };
            let names = if plain > 0 { vec!["trainer", "logger"] } else { vec!["trainer"] };
            (format!("{{tasks={{{tasks}}};max_failed_job_count={max_failed}{placement}}}"), count + plain, names, false)
        }
    }
}

/// One random fault process: its kind, its rate per minute, and its spans (shortest, longest; in milliseconds)
/// unless the kind takes none.
type Process = (FaultKind, f64, Option<(u64, u64)>);

/// How many kinds at the end of [`FaultKind::ALL`] came after the swarm first drew worlds (`clock-jump`,
/// `handler-hang`, `store-hang`, `agent-clock-beyond-margin`, `agent-store-hang`).
const LATER_KINDS: usize = 5;

/// The fault part: a random subset of the kinds, each a random process with its rate and spans.
struct Faults {
    kinds: Vec<FaultKind>,
    processes: Vec<Process>,
    pause_inside_pass: bool,
}

impl Faults {
    fn draw(
        ranges: &Ranges,
        seed: u64,
        shape: Shape,
        builtin_rows: bool,
        _replicas: usize,
        span: u64,
        rows: &Option<Rows>,
    ) -> Faults {
        let mut rng = rng::stream(seed, "swarm-faults");
        let ttl = rows.as_ref().map_or(10_000, |rows| rows.lease_ttl);
        let draw_kind = |kind: FaultKind, rng: &mut ChaCha8Rng| -> Option<Process> {
            // One draw per kind whether or not the ranges allow it, so that narrowing `kinds` keeps the others'
            // draws where they were.
            // A kind off by default is rare where it is named: a quarter of the chance (one draw all the same).
            let chance = if kind.off_by_default() { ranges.kind_chance / 4.0 } else { ranges.kind_chance };
            let on = rng.random_bool(chance);
            let rate = round3(pick(rng, &ranges.fault_rate));
            let fits = match kind {
                kind if kind.targets_agents() => shape.gang(),
                FaultKind::Contention => builtin_rows,
                // Only row handlers hang (the built-in ones or a user's).
                FaultKind::HandlerHang => shape.rows(),
                _ => true,
            };
            if !(on && fits && ranges.kinds.contains(&kind)) {
                return None;
            }
            let spans = match kind {
                FaultKind::Kill => Some((1_000, 2 * ttl)),
                FaultKind::Pause => Some((1_000, 3 * ttl)),
                FaultKind::Partition => Some((1_000, 20_000)),
                FaultKind::Isolate => Some((1_000, 15_000)),
                FaultKind::Degrade | FaultKind::LostReplies => Some((2_000, 20_000)),
                FaultKind::DbRestart => Some((200, 3_000)),
                FaultKind::ClockDrift | FaultKind::AgentClockDrift | FaultKind::AgentClockBeyondMargin => {
                    Some((5_000, 30_000))
                }
                FaultKind::AgentCalls => Some((2_000, 30_000)),
                // A dead hint channel: fetchers poll. A crash loop long enough that the replica's leases lapse.
                FaultKind::HintLoss => Some((2_000, 60_000)),
                FaultKind::CrashLoop => Some((2_000, 3 * ttl)),
                FaultKind::Contention => None,
                FaultKind::Buggify => Some((2_000, 10_000)),
                // Node loss from a blink to a minute: long enough that gangs restart without the node.
                FaultKind::AgentKill => Some((1_000, 60_000)),
                FaultKind::AgentPause => Some((2_000, 25_000)),
                FaultKind::AgentPartition => Some((2_000, 30_000)),
                FaultKind::AgentIsolate => Some((2_000, 20_000)),
                // A jump's span is its size: from a blink to past two lease ttls either way.
                FaultKind::ClockJump => Some((100, 2 * ttl + 5_000)),
                FaultKind::HandlerHang => Some((1_000, 20_000)),
                // Half-open connections from a blink to past a few lease ttls: every call in it ends at its bound.
                FaultKind::StoreHang => Some((1_000, 3 * ttl)),
                // An agent's from a blink to past two node leases (10 to 30 s in drawn worlds).
                FaultKind::AgentStoreHang => Some((1_000, 60_000)),
            };
            // Every fault's span fits in the fault window (the file's rule).
            let spans = spans.map(|(low, high): (u64, u64)| (low.min(span), high.min(span).max(low.min(span))));
            Some((kind, rate, spans))
        };
        // The kinds added after `pause_inside_pass` draw after it, so that a seed draws the world it drew before
        // they existed, with them added (a seed a note names stays that seed).
        let (first, later) = FaultKind::ALL.split_at(FaultKind::ALL.len() - LATER_KINDS);
        let mut processes: Vec<Process> = first.iter().filter_map(|&kind| draw_kind(kind, &mut rng)).collect();
        let pause_on = processes.iter().any(|process| process.0 == FaultKind::Pause);
        let pause_inside_pass = builtin_rows && pause_on && rng.random_bool(0.25);
        processes.extend(later.iter().filter_map(|&kind| draw_kind(kind, &mut rng)));
        let kinds = processes.iter().map(|process| process.0).collect();
        Faults { kinds, processes, pause_inside_pass }
    }

    fn write(&self, out: &mut String, span: u64) {
        let _ = writeln!(out, "\n[faults]\nuntil = \"{span}ms\"");
        if self.pause_inside_pass {
            let _ = writeln!(out, "pause_inside_pass = \"10s\"");
        }
        for (kind, rate, spans) in &self.processes {
            let _ = write!(out, "\n[[faults.random]]\nkind = \"{}\"\nper_minute = {rate:?}\n", kind.name());
            if let Some((low, high)) = spans {
                let _ = writeln!(out, "span = [\"{low}ms\", \"{high}ms\"]");
            }
        }
    }
}

/// The bounds the checkers judge a world by, derived from what it holds.
struct Expect {
    liveness_s: u64,
    starvation_s: Option<u64>,
}

impl Expect {
    /// `handler_timeout`: the rows' pipelines' bound on a handler (milliseconds), when the world hangs handlers.
    fn of(rows: Option<&Rows>, gang: Option<&Gang>, handler_timeout: Option<u64>, user_set: bool) -> Expect {
        let mut liveness_s: f64 = 120.0;
        let mut starvation_s = None;
        if let Some(rows) = rows {
            // Every row the world inserted may still be waiting at the heal (faults can stop all processing):
            // the workers alone need task_work_s for the tasks and claims_work_s for the claims. Twice
            // that, plus the retries' backoffs (at most 2 s per attempt), a slow task, and a few leases.
            let backoffs = f64::from(rows.attempts_max) * 2.0;
            let leases = 4.0 * rows.lease_ttl as f64 / 1000.0;
            let slow = rows.task_slow.1 as f64 / 1000.0;
            // A handler that hung at the heal holds its item until its bound cuts it.
            let hung = handler_timeout.map_or(0.0, |timeout| timeout as f64 / 1000.0);
            liveness_s =
                liveness_s.max(2.0 * (rows.task_work_s + rows.claims_work_s) + backoffs + leases + slow + hung + 60.0);
            // A parent waits behind children that are being processed: a slow child and a few leases; at least the
            // default of 60 s. A claim waits behind the claims ahead of it on its counters: in a fair order, at most
            // the whole backlog of claims (twice over, as for liveness).
            let child = rows.task_slow.1.max(rows.task_process.1) as f64 / 1000.0;
            let parent = (3.0 * child + leases + backoffs + 2.0 * hung).max(60.0);
            starvation_s = Some(parent.max(2.0 * rows.claims_work_s + 60.0).ceil() as u64);
        }
        if user_set {
            liveness_s = liveness_s.max(300.0);
        }
        if let Some(gang) = gang {
            let slots = (gang.agents as f64) * f64::from(gang.slots);
            let restarts = f64::from(gang.restarts + 2) * gang.job_max_s;
            let gang_s = 3.0 * (gang.work_s / slots.max(1.0) + restarts) + gang.unfit_timeout_s as f64 + 180.0;
            liveness_s = liveness_s.max(gang_s);
        }
        let limit = crate::sim::scenario_file::SIMULATED_SPAN_MAX.as_secs() as f64;
        Expect { liveness_s: liveness_s.min(limit).ceil() as u64, starvation_s }
    }

    fn write(&self, out: &mut String) {
        let _ = write!(out, "\n[expect]\nliveness_within = \"{}s\"\n", self.liveness_s);
        if let Some(starvation) = self.starvation_s {
            let _ = writeln!(out, "starvation_within = \"{starvation}s\"");
        }
    }
}
