//! Scenarios: topology, workload, faults, bounds (DESIGN §5). A run is a function of (scenario, seed, build).
//!
//! Scenarios are Rust values for now; the TOML scenario files of DESIGN §5 would deserialize into the same
//! shape.

use super::faults::{FaultKind, FaultPlan, RandomFault};
use super::workload::{Workers, WorkloadSpec};
use std::ops::Range;
use std::time::Duration;

/// Test-only switches that plant a bug in the system, to prove that the checkers catch it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutation {
    /// The store's apply skips its token guard ([`MemStore::disable_apply_guard_for_mutation_test`]).
    ///
    /// [`MemStore::disable_apply_guard_for_mutation_test`]: crate::store::MemStore::disable_apply_guard_for_mutation_test
    pub apply_guard_disabled: bool,
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
}

impl Scenario {
    /// When the world heals: the end of the fault window or of the workload, whichever is later.
    pub fn heal_at(&self) -> Duration {
        self.faults.until.max(self.workload.span)
    }

    /// The simulated-time limit of a run: past it, the run fails as a hang. Generous (the heal time three times
    /// over), because a client whose calls keep failing falls behind its schedule and the heal waits for it.
    pub fn time_limit(&self) -> Duration {
        self.heal_at() * 3
            + self.liveness_bound
            + self.drain_budget
            + self.workload.lease_ttl * 4
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
            faults: FaultPlan { fixed: Vec::new(), random: every_fault(1.0), until: workload.span },
            workload,
            call_timeout: Duration::from_secs(2),
            net_latency: Duration::from_millis(1)..Duration::from_millis(10),
            liveness_bound: Duration::from_secs(120),
            starvation_bound: Duration::from_secs(60),
            drain_budget: Duration::from_secs(60),
            mutation: Mutation::default(),
        }
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
            faults: FaultPlan { fixed: Vec::new(), random: every_fault(1.0), until: workload.span },
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
        rows_max: 2_000,
        task_process: Duration::from_millis(20)..Duration::from_millis(1_000),
        task_slow_chance: 0.05,
        task_slow: Duration::from_secs(7)..Duration::from_secs(12),
        task_failure_chance: 0.1,
        job_process: Duration::from_millis(10)..Duration::from_millis(200),
        claim_process: Duration::from_millis(10)..Duration::from_millis(300),
        workers: Workers { tasks: 3, jobs: 2, claims: 2 },
        lease_ttl: Duration::from_secs(6),
        lease_margin: Duration::from_secs(1),
        min_processing_interval: Duration::from_secs(1),
    }
}

/// One random process of every kind, `scale` faults of each per simulated minute on average, with spans that
/// outlast the 6 s lease ttl where that matters (pauses, partitions, kills).
pub fn every_fault(scale: f64) -> Vec<RandomFault> {
    let secs = |from: u64, to: u64| Duration::from_secs(from)..Duration::from_secs(to);
    FaultKind::ALL
        .iter()
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
            };
            RandomFault { kind, per_minute: scale, span }
        })
        .collect()
}
