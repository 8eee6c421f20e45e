//! Scenarios: topology, workload, faults, bounds (DESIGN §5). A run is a function of (scenario, seed, build).
//!
//! Scenarios are Rust values for now; the TOML scenario files of DESIGN §5 would deserialize into the same
//! shape. A scenario has a row workload (optional: `rows_max = 0` inserts no rows and runs no row pipelines), an
//! optional gang part (agents, operations, job behaviour, control actions: [`GangWorkload`]) and expectations.

use super::faults::Target;
use super::faults::{Fault, FaultKind, FaultPlan, RandomFault};
use super::gang::{AgentTunables, ControllerTunables, Expectations, GangWorkload, OperationExpectation, Submission};
use super::user::PipelineSet;
use super::workload::{Workers, WorkloadSpec};
use crate::agent::{Behaviour, End, JobScript, Rule};
use crate::gang::SpecFormat;
use std::ops::Range;
use std::time::Duration;

/// A scenario that breaks a rule: the message names the field and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidScenario {
    /// A field's value breaks a rule.
    #[error("invalid scenario: {0}")]
    Invalid(String),
}

/// The lease ttl the time limit assumes for a user's pipelines: the engine's default (their configs may set
/// another; the run waits out the longest one registered before its last snapshot).
pub const USER_LEASE_TTL_ASSUMED: Duration = crate::pipeline::config::LEASE_TTL_DEFAULT;

/// Test-only switches that plant a bug in the system, to prove that the checkers catch it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Mutation {
    /// The store's apply skips its token guard ([`MemStore::disable_apply_guard_for_mutation_test`]).
    ///
    /// [`MemStore::disable_apply_guard_for_mutation_test`]: crate::store::MemStore::disable_apply_guard_for_mutation_test
    pub apply_guard_disabled: bool,
    /// The controller places all-or-nothing gangs incrementally while their data says all-or-nothing
    /// ([`PlacementSettings::gate_disabled_for_mutation_test`]): checker `gang_ranks_together` must fire.
    ///
    /// [`PlacementSettings::gate_disabled_for_mutation_test`]: crate::gang::placement::PlacementSettings::gate_disabled_for_mutation_test
    pub gang_gate_disabled: bool,
    /// The controller places a rank whose previous process may still run (`gang::model::Lingering`) in another
    /// allocation at once ([`PlacementSettings::lingering_gate_disabled_for_mutation_test`]): in
    /// scenarios/gang-revival-restart-race.toml two processes of one rank run at once, and checker
    /// `rank_exclusivity` must fire.
    ///
    /// [`PlacementSettings::lingering_gate_disabled_for_mutation_test`]: crate::gang::placement::PlacementSettings::lingering_gate_disabled_for_mutation_test
    pub lingering_gate_disabled: bool,
    /// Fixed `agent-clock-drift` faults may run an agent's clock slower than the margin rule of DESIGN §2 allows,
    /// so it keeps its processes past its node lease's expiry: checker `rank_exclusivity` must fire.
    pub agent_drift_beyond_margin: bool,
    /// A related lock treats every other owner's fresh intent mark as taken, items' age aside
    /// ([`MemStore::disable_related_age_rule_for_mutation_test`]): in scenarios/rows-shared-pairs.toml claims
    /// hold each other off in cycles of marks, and checker `starvation` must fire.
    ///
    /// [`MemStore::disable_related_age_rule_for_mutation_test`]: crate::store::MemStore::disable_related_age_rule_for_mutation_test
    pub related_age_rule_disabled: bool,
    /// Items take no turns in their replica's waitlist and meet only in the store
    /// ([`PipelineConfig::waitlist_disabled_for_mutation_test`]): in scenarios/rows-hot-row.toml each claim waiting
    /// for the hot counter is reset once per turn, and checker `starvation` must fire.
    ///
    /// [`PipelineConfig::waitlist_disabled_for_mutation_test`]: crate::pipeline::PipelineConfig::waitlist_disabled_for_mutation_test
    pub waitlist_disabled: bool,
    /// A worker that records a failure leaves the row's retry to its fetcher's empty-fetch backoff
    /// ([`PipelineConfig::retry_wake_disabled_for_mutation_test`]): in scenarios/rows-failing.toml rows failing
    /// after the heal are fetched again seconds past their retry, and checker `retries` must fire.
    ///
    /// [`PipelineConfig::retry_wake_disabled_for_mutation_test`]: crate::pipeline::PipelineConfig::retry_wake_disabled_for_mutation_test
    pub retry_wake_disabled: bool,
    /// A replica's fetcher never backs off for contention
    /// ([`PipelineConfig::contention_backoff_disabled_for_mutation_test`]): in scenarios/rows-hot-row-backlog.toml
    /// the replica that lost the hot row leases and resets claim after claim, and checker `expect` (at most 300
    /// contended locks) must fire.
    ///
    /// [`PipelineConfig::contention_backoff_disabled_for_mutation_test`]: crate::pipeline::PipelineConfig::contention_backoff_disabled_for_mutation_test
    pub contention_backoff_disabled: bool,
    /// A wake hint wakes no parked waiter ([`PipelineConfig::park_wake_disabled_for_mutation_test`]): each waits
    /// until the lock it met expires, as if the holder's write had not told it: in scenarios/rows-hot-row.toml
    /// claims wait out the holder's lease ttl at every hand-over, and checker `starvation` must fire.
    ///
    /// [`PipelineConfig::park_wake_disabled_for_mutation_test`]: crate::pipeline::PipelineConfig::park_wake_disabled_for_mutation_test
    pub park_wake_disabled: bool,
}

impl Mutation {
    /// Every mutation's key in a scenario file's `[mutation]` table.
    pub const NAMES: [&'static str; 9] = [
        "apply_guard_disabled",
        "gang_gate_disabled",
        "lingering_gate_disabled",
        "agent_drift_beyond_margin",
        "related_age_rule_disabled",
        "waitlist_disabled",
        "retry_wake_disabled",
        "contention_backoff_disabled",
        "park_wake_disabled",
    ];
}

/// Everything a run needs besides its seed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name, in traces and reports.
    pub name: String,
    /// Replica nodes.
    pub replicas: usize,
    /// What the client inserts and how the pipelines behave.
    pub workload: WorkloadSpec,
    /// Faults: fixed events and random processes, and the end of the fault window.
    pub faults: FaultPlan,
    /// Time-out of each store call (simulated time).
    pub call_timeout: Duration,
    /// Network latency range when no fault degrades it.
    pub net_latency: Range<Duration>,
    /// After the heal, every row must reach its final status within this span (the liveness checker).
    pub liveness_bound: Duration,
    /// After the heal, no parent may wait longer than this for the related locks it contends for.
    pub starvation_bound: Duration,
    /// Longest a drain of every replica may take at the end.
    pub drain_budget: Duration,
    /// Planted bugs (none by default).
    pub mutation: Mutation,
    /// Gang operations: agents, what the client submits, how jobs behave (none by default).
    pub gang: Option<GangWorkload>,
    /// What the run must show besides the invariants (checker `expect`).
    pub expect: Expectations,
    /// A user's pipelines ([`super::user`]): every replica runs them and the client runs their workload, in place
    /// of the built-in row workload (which must then be off: `workload.rows_max` 0). None by default.
    pub pipelines: Option<PipelineSet>,
}

impl Scenario {
    /// When the world heals: the end of the fault window, of the row workload, or of the gang client's last
    /// submission or control action, whichever is latest.
    pub fn heal_at(&self) -> Duration {
        let gang = self.gang.as_ref().map_or(Duration::ZERO, GangWorkload::span);
        self.faults.until.max(self.workload.span).max(gang)
    }

    /// Agent nodes (0 without a gang part).
    pub fn agents(&self) -> usize {
        self.gang.as_ref().map_or(0, |gang| gang.agents)
    }

    /// The longest lease any pipeline of the scenario takes (rows', and operations' if there is a gang part):
    /// after the drain the run waits this long (and a second) for every lease to lapse.
    pub fn lease_ttl_max(&self) -> Duration {
        let operations = self.gang.as_ref().map_or(Duration::ZERO, |gang| gang.controller.lease_ttl);
        self.workload.lease_ttl.max(operations)
    }

    /// Checks every rule a scenario file could break. Errors: the first broken rule, naming its field.
    pub fn check(&self) -> Result<(), InvalidScenario> {
        let invalid = |message: String| Err(InvalidScenario::Invalid(message));
        if self.replicas == 0 || self.replicas > 200 {
            return invalid(format!("replicas: {} is not in 1..=200", self.replicas));
        }
        if let Some(gang) = &self.gang {
            gang.check().map_err(InvalidScenario::Invalid)?;
        }
        if let Some(set) = &self.pipelines {
            set.check().map_err(InvalidScenario::Invalid)?;
            if self.workload.rows_max > 0 {
                return invalid(format!(
                    "pipelines: the pipeline set {} replaces the built-in row workload: set workload.rows_max to 0",
                    set.name()
                ));
            }
        }
        self.expect.check(self.gang.as_ref()).map_err(InvalidScenario::Invalid)?;
        let rows = self.workload.rows_max > 0;
        let (replicas, agents) = (self.replicas, self.agents());
        let target_ok = |target: Target| match target {
            Target::Replica(i) => i < replicas,
            Target::Agent(i) => i < agents,
            Target::Db | Target::Client => true,
        };
        for (index, event) in self.faults.fixed.iter().enumerate() {
            let ok = match &event.fault {
                Fault::Kill { replica, .. }
                | Fault::Pause { replica, .. }
                | Fault::ClockDrift { replica, .. }
                | Fault::HintLoss { replica, .. }
                | Fault::CrashLoop { replica, .. }
                | Fault::ClockJump { replica, .. }
                | Fault::HandlerHang { replica, .. } => *replica < replicas,
                Fault::StoreHang { node, .. } => {
                    matches!(node, Target::Replica(_) | Target::Agent(_)) && target_ok(*node)
                }
                Fault::AgentKill { agent, .. }
                | Fault::AgentPause { agent, .. }
                | Fault::AgentClockDrift { agent, .. }
                | Fault::AgentClockBeyondMargin { agent, .. }
                | Fault::AgentCalls { agent, .. } => *agent < agents,
                Fault::Partition { a, b, .. } => target_ok(*a) && target_ok(*b),
                Fault::Isolate { node, .. } => target_ok(*node),
                Fault::Contention { .. } if !rows => {
                    return invalid(format!("faults.fixed[{index}]: {}", self.no_claims()));
                }
                _ => true,
            };
            if !ok {
                return invalid(format!(
                    "faults.fixed[{index}]: {} targets a node the world lacks ({replicas} replicas, {agents} agents)",
                    event.fault
                ));
            }
        }
        for (index, event) in self.faults.fixed.iter().enumerate() {
            let (Fault::AgentClockDrift { rate_ppm, .. }, Some(gang)) = (&event.fault, &self.gang) else { continue };
            let floor = gang.agent_rate_min_ppm();
            if *rate_ppm < floor && !self.mutation.agent_drift_beyond_margin {
                return invalid(format!(
                    "faults.fixed[{index}].rate_ppm: {rate_ppm} breaks the margin rule of DESIGN §2: an agent clock \
                     slower than {floor} (1 - lease_margin / lease_ttl = 1 - {:?} / {:?}) holds its node lease past \
                     the store's expiry (plant that bug with [mutation] agent_drift_beyond_margin)",
                    gang.agent.lease_margin, gang.agent.lease_ttl
                ));
            }
        }
        for (index, event) in self.faults.fixed.iter().enumerate() {
            let (Fault::AgentClockBeyondMargin { rate_ppm, .. }, Some(gang)) = (&event.fault, &self.gang) else {
                continue;
            };
            let floor = gang.agent_rate_min_ppm();
            if *rate_ppm >= floor {
                return invalid(format!(
                    "faults.fixed[{index}].rate_ppm: {rate_ppm} keeps the margin rule of DESIGN §2 (at least {floor} = \
                     1 - lease_margin / lease_ttl = 1 - {:?} / {:?}): agent-clock-beyond-margin runs below it; a rate \
                     within the rule is agent-clock-drift",
                    gang.agent.lease_margin, gang.agent.lease_ttl
                ));
            }
        }
        for (index, process) in self.faults.random.iter().enumerate() {
            if process.kind.targets_agents() && agents == 0 && process.per_minute > 0.0 {
                return invalid(format!("faults.random[{index}]: {} needs agents", process.kind.name()));
            }
            if process.kind == FaultKind::Contention && !rows && process.per_minute > 0.0 {
                return invalid(format!("faults.random[{index}]: {}", self.no_claims()));
            }
        }
        Ok(())
    }

    /// Why a `contention` fault cannot run in `self`, which has no built-in row workload: its bursts are that
    /// workload's claims on its counter rows (a trial printed the fault's debug form and "a node the world lacks").
    fn no_claims(&self) -> String {
        match &self.pipelines {
            Some(set) => format!(
                "a contention fault bursts the built-in row workload's claims, and the pipeline set {} replaces that \
                 workload: leave contention out",
                set.name()
            ),
            None => "a contention fault bursts the built-in row workload's claims: set workload.rows_max above 0"
                .to_string(),
        }
    }

    /// The simulated-time limit of a run: past it, the run fails as a hang. Generous (the heal time three times
    /// over), because a client whose calls keep failing falls behind its schedule and the heal waits for it.
    pub fn time_limit(&self) -> Duration {
        self.heal_at() * 3
            + self.liveness_bound
            + self.drain_budget
            + self.workload.lease_ttl * 4
            + self.pipelines.as_ref().map_or(Duration::ZERO, |_| USER_LEASE_TTL_ASSUMED * 4)
            + Duration::from_secs(120)
    }

    /// No faults: 2 replicas, 30 s of workload. A baseline for determinism and sanity.
    pub fn quiet() -> Scenario {
        let workload = WorkloadSpec { span: Duration::from_secs(30), ..small_workload() };
        Scenario {
            name: "quiet".into(),
            replicas: 2,
            faults: FaultPlan { until: Duration::ZERO, ..FaultPlan::default() },
            ..Scenario::mixed()
        }
        .with_workload(workload)
    }

    /// The mixed-fault scenario of the seed sweeps: 3 replicas, about 200 rows over 60 s, and every random fault
    /// process at once (about one fault of each kind per simulated minute).
    pub fn mixed() -> Scenario {
        let workload = small_workload();
        Scenario {
            name: "mixed".into(),
            replicas: 3,
            faults: FaultPlan { random: every_fault(1.0), until: workload.span, ..FaultPlan::default() },
            workload,
            call_timeout: Duration::from_secs(2),
            net_latency: Duration::from_millis(1)..Duration::from_millis(10),
            liveness_bound: Duration::from_secs(120),
            starvation_bound: Duration::from_secs(60),
            drain_budget: Duration::from_secs(60),
            mutation: Mutation::default(),
            gang: None,
            expect: Expectations::default(),
            pipelines: None,
        }
    }

    /// Gang operations under every fault: 2 replicas and 5 agents of 2 slots, no row workload, the three specs
    /// of [`GANG_SPECS`] submitted in turn every 15 s for 2 minutes, jobs of 5–60 s with a few scripted failures
    /// (one of a ranked trainer: a gang restart), and the random faults of [`every_fault`] (without contention,
    /// which needs rows) and [`agent_faults`] at half a fault of each kind per minute. Every operation must end.
    pub fn gang_mixed() -> Scenario {
        let window = Duration::from_secs(120);
        let operations = (0..8)
            .map(|index| Submission {
                name: format!("op-{index}"),
                at: Duration::from_secs(15 * index as u64),
                spec: GANG_SPECS[index % GANG_SPECS.len()].into(),
                format: SpecFormat::Yson,
            })
            .collect();
        let gang = GangWorkload {
            agents: 5,
            slots: 2,
            agent: AgentTunables::default(),
            controller: sim_controller(),
            operations,
            jobs: gang_jobs(),
            controls: Vec::new(),
        };
        let mut random: Vec<RandomFault> =
            every_fault(0.5).into_iter().filter(|process| process.kind != FaultKind::Contention).collect();
        random.extend(agent_faults(0.5));
        Scenario {
            name: "gang-mixed".into(),
            replicas: 2,
            workload: no_rows(),
            faults: FaultPlan { random, until: window, ..FaultPlan::default() },
            liveness_bound: Duration::from_secs(900),
            gang: Some(gang),
            ..Scenario::mixed()
        }
    }

    /// A gang scenario without faults or row workload: 2 replicas, `agents` agents of `slots` slots, the given
    /// submissions, every job exiting 0 after `job` (a base for directed tests).
    pub fn gang_quiet(agents: usize, slots: u32, operations: Vec<Submission>, job: Duration) -> Scenario {
        let gang = GangWorkload {
            agents,
            slots,
            agent: AgentTunables::default(),
            controller: sim_controller(),
            operations,
            jobs: JobScript::uniform(job),
            controls: Vec::new(),
        };
        Scenario {
            name: "gang-quiet".into(),
            replicas: 2,
            workload: no_rows(),
            faults: FaultPlan::default(),
            liveness_bound: Duration::from_secs(600),
            gang: Some(gang),
            ..Scenario::mixed()
        }
    }

    /// The same scenario expecting `expectation` too.
    pub fn expecting(mut self, expectation: OperationExpectation) -> Scenario {
        self.expect.operations.push(expectation);
        self
    }

    /// The benchmark: 3 replicas, 10 000 rows inserted over 590 simulated seconds under every random fault, then
    /// convergence; a little over 10 simulated minutes in all.
    pub fn mixed_large() -> Scenario {
        let workload = WorkloadSpec {
            span: Duration::from_secs(590),
            jobs_per_minute: 200.0,
            claims_per_minute: 310.0,
            resources: 20,
            hot_share: 0.1,
            rows_max: 10_000,
            workers: Workers { tasks: 8, jobs: 4, claims: 3 },
            ..small_workload()
        };
        Scenario {
            name: "mixed-large".into(),
            faults: FaultPlan { random: every_fault(1.0), until: workload.span, ..FaultPlan::default() },
            workload,
            ..Scenario::mixed()
        }
    }

    /// The same scenario with `workload`.
    pub fn with_workload(mut self, workload: WorkloadSpec) -> Scenario {
        self.workload = workload;
        self
    }
}

/// The operation pipeline of the built-in gang scenarios: a 10 s lease and a pass at least every 2 s (simulated),
/// so restarts and takeovers fit in a short simulated run.
fn sim_controller() -> ControllerTunables {
    ControllerTunables {
        lease_ttl: Duration::from_secs(10),
        min_processing_interval: Duration::from_secs(2),
        ..ControllerTunables::default()
    }
}

/// The sweeps' workload: jobs of 1–4 tasks and claims on 3 resources (half of them on the hot one), about 200
/// rows in 60 s, short leases (6 s) so that faults outlast them.
pub fn small_workload() -> WorkloadSpec {
    WorkloadSpec {
        span: Duration::from_secs(60),
        jobs_per_minute: 40.0,
        tasks_per_job: 1..=4,
        claims_per_minute: 40.0,
        claim_pipelines: 2,
        resources: 3,
        hot_share: 0.5,
        claim_resources: 1,
        rows_max: 2_000,
        task_process: Duration::from_millis(20)..Duration::from_millis(1_000),
        task_slow_chance: 0.05,
        task_slow: Duration::from_secs(7)..Duration::from_secs(12),
        task_failure_chance: 0.1,
        task_fail_first_share: 0.0,
        claim_fail_first_share: 0.0,
        task_fail_first_attempts: 2,
        task_fail_always_share: 0.0,
        attempts_max: 10,
        job_process: Duration::from_millis(10)..Duration::from_millis(200),
        claim_process: Duration::from_millis(10)..Duration::from_millis(300),
        workers: Workers { tasks: 3, jobs: 2, claims: 2 },
        lease_ttl: Duration::from_secs(6),
        lease_margin: Duration::from_secs(1),
        min_processing_interval: Duration::from_secs(1),
        fetchers: 1,
        park_waiters: crate::pipeline::config::PARK_WAITERS_DEFAULT,
        waitlist_disabled: false,
        retry_wake_disabled: false,
        contention_backoff_disabled: false,
        park_wake_disabled: false,
        handler_timeout: None,
    }
}

/// The specs [`Scenario::gang_mixed`] submits in turn (YSON): a 3-job gang; a gang of 2 ranks and 2 reserved
/// jobs beside a plain task; the seed's master/slave vanilla operation with `max_failed_job_count = 3`.
pub const GANG_SPECS: [&str; 3] = [
    "{tasks={worker={job_count=3;command=w;gang_options={}}}}",
    "{tasks={trainer={job_count=4;command=t;gang_options={size=2}};logger={job_count=2;command=l}}}",
    "{tasks={master={job_count=1;command=m};slave={job_count=10;command=s}};max_failed_job_count=3}",
];

/// The jobs of [`Scenario::gang_mixed`]: 5–60 s, exit 0, except the first start of worker cookie 1 (exit 1: a
/// gang restart), the second start of trainer cookie 0 (exit 2) and the first of slave cookie 3 (exit 1: a
/// failure that counts toward the limit but restarts nothing else).
pub fn gang_jobs() -> JobScript {
    let failing = |task: &str, cookie, attempt, code| Rule {
        task: Some(task.into()),
        job_cookie: Some(cookie),
        attempt: Some(attempt),
        behaviour: Behaviour { duration: (Duration::from_secs(1), Duration::from_secs(8)), end: End::Exit(code) },
    };
    JobScript {
        seed: 0,
        default: Behaviour { duration: (Duration::from_secs(5), Duration::from_secs(60)), end: End::Exit(0) },
        rules: vec![failing("worker", 1, 0, 1), failing("trainer", 0, 1, 2), failing("slave", 3, 0, 1)],
    }
}

/// A row workload that inserts nothing (`rows_max = 0`): replicas run no row pipelines.
pub fn no_rows() -> WorkloadSpec {
    WorkloadSpec { span: Duration::ZERO, rows_max: 0, resources: 0, ..small_workload() }
}

/// One random process of each agent fault kind ([`FaultKind::targets_agents`]) but `agent-calls` (which the
/// runs built on this predate; scenario files ask for it by name), `scale` faults of each per simulated minute,
/// with spans that outlast the agents' 10 s node lease where that matters.
pub fn agent_faults(scale: f64) -> Vec<RandomFault> {
    let secs = |from: u64, to: u64| Duration::from_secs(from)..Duration::from_secs(to);
    FaultKind::ALL
        .iter()
        .filter(|kind| {
            kind.targets_agents()
                && !matches!(
                    kind,
                    FaultKind::AgentCalls | FaultKind::AgentClockBeyondMargin | FaultKind::AgentStoreHang
                )
        })
        .map(|&kind| {
            let span = match kind {
                FaultKind::AgentKill => secs(1, 20),
                FaultKind::AgentPause => secs(5, 25),
                FaultKind::AgentPartition => secs(5, 30),
                FaultKind::AgentClockDrift => secs(10, 40),
                _ => secs(3, 20),
            };
            RandomFault { kind, per_minute: scale, span }
        })
        .collect()
}

/// One random process of every kind that targets replicas, the database, the network or the client (not
/// agents: [`agent_faults`]) but `hint-loss`, `crash-loop`, `clock-jump`, `handler-hang` and `store-hang` (which the runs built on this predate; scenario files
/// ask for them by name), `scale` faults of each per simulated minute on average, with spans that outlast the 6 s
/// lease ttl where that matters (pauses, partitions, kills).
pub fn every_fault(scale: f64) -> Vec<RandomFault> {
    let secs = |from: u64, to: u64| Duration::from_secs(from)..Duration::from_secs(to);
    FaultKind::ALL
        .iter()
        .filter(|kind| {
            !kind.targets_agents()
                && !matches!(
                    kind,
                    FaultKind::HintLoss
                        | FaultKind::CrashLoop
                        | FaultKind::ClockJump
                        | FaultKind::HandlerHang
                        | FaultKind::StoreHang
                )
        })
        .map(|&kind| {
            let span = match kind {
                FaultKind::Kill => secs(1, 10),
                FaultKind::Pause => secs(7, 20),
                FaultKind::Partition => secs(2, 15),
                FaultKind::Isolate => secs(2, 10),
                FaultKind::Degrade => secs(5, 20),
                FaultKind::LostReplies => secs(5, 20),
                FaultKind::DbRestart => Duration::from_millis(200)..Duration::from_secs(3),
                FaultKind::ClockDrift => secs(10, 30),
                FaultKind::Contention => Duration::ZERO..Duration::ZERO,
                FaultKind::Buggify => secs(3, 10),
                _ => unreachable!("agent and later kinds are filtered out"),
            };
            RandomFault { kind, per_minute: scale, span }
        })
        .collect()
}

/// Written by hand so that a scenario without `park_wake_disabled` prints as it did before the field existed: the
/// scenario's content hash ([`crate::sim::ScenarioFile::content_hash`]) is taken over this text.
impl std::fmt::Debug for Mutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_struct("Mutation");
        m.field("apply_guard_disabled", &self.apply_guard_disabled)
            .field("gang_gate_disabled", &self.gang_gate_disabled)
            .field("lingering_gate_disabled", &self.lingering_gate_disabled)
            .field("agent_drift_beyond_margin", &self.agent_drift_beyond_margin)
            .field("related_age_rule_disabled", &self.related_age_rule_disabled)
            .field("waitlist_disabled", &self.waitlist_disabled)
            .field("retry_wake_disabled", &self.retry_wake_disabled)
            .field("contention_backoff_disabled", &self.contention_backoff_disabled);
        if self.park_wake_disabled {
            m.field("park_wake_disabled", &self.park_wake_disabled);
        }
        m.finish()
    }
}
