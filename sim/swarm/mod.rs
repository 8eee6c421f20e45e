//! Swarm: every seed draws its own world (`lockstep sim swarm`). A fixed world per scenario file lets a fix fit
//! the file; a swarm draws, from each seed's own streams, the cluster (replicas, agents, slots), the pipelines'
//! knobs (workers, lease ttl and margin, fetch loops), the row workload (its arrival rate from idle to several
//! times its workers' capacity, processing times with tasks longer than their lease, parent/child fan-out,
//! shared rows, failures), gang and plain operations (sizes, reserved jobs, placement modes, failure rules,
//! aborts) and a random subset of the fault kinds with their rates (swarm testing, Groce et al. 2012: a world
//! that runs a few kinds at a time reaches what one running all of them at once drowns).
//!
//! A drawn world is a plain scenario file ([`World::text`]): `sim swarm --seed N --emit` prints it, and `run`,
//! `replay`, `explain`, `shrink` and `--html` take it as any other. Its checkers are those that hold for every
//! world (every checker always runs); its bounds are derived from what it holds ([`mod@draw`]'s module docs).
//!
//! - [`ranges`]: the knobs' ranges, their defaults, a ranges file and the flags that narrow them;
//! - [`mod@draw`]: one world from a seed;
//! - [`coverage`]: what a sweep of worlds reached, per fault kind and per engine path.

pub mod coverage;
pub mod draw;
pub mod ranges;

pub use coverage::SwarmCoverage;
pub use draw::{World, draw};
pub use ranges::{Ranges, Shape};

use super::scenario_file::gang::SpecSource;
use super::scenario_file::{PipelineSets, ScenarioError, ScenarioFile};
#[cfg(any(madsim, doc))]
use super::user::PipelineSet;
use std::collections::BTreeMap;

/// The version of the drawing code: part of every ranges label ([`Ranges::version_label`]), bumped when a seed
/// draws another world from the same ranges.
pub const DRAW_VERSION: u32 = 3;

/// The name of every drawn world's scenario (its replay files are `swarm-seed-N.replay.json`).
pub const WORLD_NAME: &str = "swarm";

impl World {
    /// The world as a parsed scenario file, with `sets` the pipeline sets it may name.
    ///
    /// Errors: a world that breaks a scenario file's rule, which is a bug of the drawing code (the tests draw
    /// thousands of worlds and parse each).
    pub fn file(&self, sets: &PipelineSets) -> Result<ScenarioFile, ScenarioError> {
        let origin = format!("<swarm world of seed {}>", self.seed);
        ScenarioFile::parse_in(&self.text, &origin, SpecSource::Files(&BTreeMap::new()), sets)
    }
}

#[cfg(madsim)]
/// The run of the world `seed` draws within `ranges`, with `set` (a user's [`PipelineSet`]) in place of the
/// built-in row workload if given: the world and its run's report.
///
/// Panics if the world is not a valid scenario file (a bug of the drawing code).
pub fn run_world(ranges: &Ranges, seed: u64, set: Option<&PipelineSet>) -> (World, super::RunReport) {
    let sets: PipelineSets = set.map(|set| (set.name().to_string(), set.clone())).into_iter().collect();
    let world = draw(ranges, seed, set.map(PipelineSet::name));
    let file = world.file(&sets).unwrap_or_else(|error| panic!("seed {seed} drew an invalid world: {error}"));
    let report = super::run(&file.scenario, seed);
    (world, report)
}

#[cfg(any(madsim, doc))]
/// A swarm as a test (what [`super::check_seeds`] is for one scenario): runs the world of every seed of `seeds`
/// drawn within `ranges` (with `set` in place of the built-in rows if given) on [`super::run::jobs`] threads, and
/// fails the test if any failed: prints each failing seed's world in one line and what failed, then panics naming
/// the seeds, with the first failing world's scenario file whole (save it and `lockstep sim run` it, or your own
/// simulator binary's `run`). Returns the reports by seed, without their traces. Simulator build only (`--cfg
/// madsim`; the plain build's `cargo doc` shows it).
pub fn check_swarm(ranges: &Ranges, seeds: &[u64], set: Option<&PipelineSet>) -> Vec<super::RunReport> {
    let results = std::sync::Mutex::new(Vec::with_capacity(seeds.len()));
    let seed_at = |i: u64| usize::try_from(i).ok().and_then(|i| seeds.get(i)).copied();
    let never = std::sync::atomic::AtomicBool::new(false);
    super::for_each(&seed_at, super::run::jobs(), &never, &|seed| {
        let (world, report) = run_world(ranges, seed, set);
        let world = (!report.passed()).then_some(world);
        results.lock().unwrap_or_else(|p| p.into_inner()).push((world, report));
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(_, report)| report.seed);
    let failed: Vec<(&World, &super::RunReport)> =
        results.iter().filter_map(|(world, report)| world.as_ref().map(|world| (world, report))).collect();
    for (world, report) in &failed {
        eprintln!(
            "==== swarm seed {}: {}
{}",
            report.seed,
            world.summary,
            super::run::summary(report)
        );
    }
    if let Some((world, report)) = failed.first() {
        let seeds: Vec<u64> = failed.iter().map(|(_, report)| report.seed).collect();
        panic!(
            "swarm: {} of {} worlds failed: seeds {seeds:?}\nfirst failure: {}\nits world (a scenario file):\n{}",
            failed.len(),
            results.len(),
            super::run::summary(report),
            world.text
        );
    }
    results.into_iter().map(|(_, report)| report.slim()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::faults::FaultKind;

    #[test]
    fn every_world_of_the_default_ranges_is_a_valid_scenario_file() {
        let ranges = Ranges::default();
        for seed in 1..=1_000 {
            let world = draw(&ranges, seed, None);
            if let Err(error) = world.file(&PipelineSets::new()) {
                panic!("seed {seed} drew an invalid world: {error}\n{}", world.text);
            }
        }
    }

    #[test]
    fn narrow_ranges_draw_valid_worlds_too() {
        let narrow = Ranges {
            replicas: 1..=1,
            agents: 1..=1,
            slots: 1..=1,
            workers: 1..=1,
            lease_ttl: ranges::LEASE_TTL_BOUNDS.0..=ranges::LEASE_TTL_BOUNDS.0,
            span: ranges::SPAN_BOUNDS.0..=ranges::SPAN_BOUNDS.0,
            overload: ranges::OVERLOAD_MAX,
            overload_share: 1.0,
            kind_chance: 1.0,
            ..Ranges::default()
        };
        let wide = Ranges {
            replicas: ranges::REPLICAS_MAX..=ranges::REPLICAS_MAX,
            workers: ranges::WORKERS_MAX..=ranges::WORKERS_MAX,
            lease_ttl: ranges::LEASE_TTL_BOUNDS.1..=ranges::LEASE_TTL_BOUNDS.1,
            span: ranges::SPAN_BOUNDS.1..=ranges::SPAN_BOUNDS.1,
            kind_chance: 1.0,
            ..Ranges::default()
        };
        for ranges in [narrow, wide] {
            for seed in 1..=250 {
                let world = draw(&ranges, seed, None);
                if let Err(error) = world.file(&PipelineSets::new()) {
                    panic!("seed {seed} drew an invalid world from {ranges:?}: {error}\n{}", world.text);
                }
            }
        }
    }

    #[test]
    fn every_mutation_plants_into_every_world() {
        for name in crate::sim::Mutation::NAMES {
            let ranges = Ranges { mutations: vec![name.to_string()], ..Ranges::default() };
            for seed in 1..=40 {
                let world = draw(&ranges, seed, None);
                let file = world.file(&PipelineSets::new()).unwrap_or_else(|error| panic!("{name}: {error}"));
                assert_ne!(file.scenario.mutation, crate::sim::Mutation::default(), "{name} not planted");
            }
        }
        let error = Ranges::parse("mutations = [\"apply_guard\"]\n", "r.toml").unwrap_err();
        assert!(error.contains("mutations: unknown mutation \"apply_guard\""), "{error}");
    }

    #[test]
    fn a_seed_draws_one_world_and_another_seed_another() {
        let ranges = Ranges::default();
        assert_eq!(draw(&ranges, 7, None), draw(&ranges, 7, None));
        assert_ne!(draw(&ranges, 7, None).text, draw(&ranges, 8, None).text);
    }

    #[test]
    fn the_drawn_world_runs_its_own_seed_under_the_swarm_name() {
        let world = draw(&Ranges::default(), 42, None);
        let file = world.file(&PipelineSets::new()).unwrap();
        assert_eq!(file.seeds, vec![42]);
        assert_eq!(file.scenario.name, WORLD_NAME);
    }

    #[test]
    fn worlds_switch_fault_kinds_on_and_off_and_only_those_allowed() {
        let ranges = Ranges::default();
        let mut on: BTreeMap<FaultKind, u32> = BTreeMap::new();
        let seeds = 2_000;
        for seed in 1..=seeds {
            let world = draw(&ranges, seed, None);
            for kind in &world.kinds {
                *on.entry(*kind).or_default() += 1;
            }
            if !world.shape.gang() {
                assert!(
                    world.kinds.iter().all(|kind| !kind.targets_agents()),
                    "seed {seed}: agent faults without agents"
                );
            }
        }
        for kind in FaultKind::ALL {
            let share = f64::from(on.get(&kind).copied().unwrap_or(0)) / seeds as f64;
            if kind.off_by_default() {
                assert_eq!(share, 0.0, "{} is on by default", kind.name());
                continue;
            }
            assert!(share > 0.1 && share < 0.6, "{} is on in {share:.3} of the worlds", kind.name());
        }
        // Named, a kind off by default is on in rare worlds that can run it (a quarter of the chance), and the
        // other kinds keep their draws.
        let beyond = FaultKind::AgentClockBeyondMargin;
        let named = Ranges { kinds: FaultKind::ALL.to_vec(), ..Ranges::default() };
        let mut with = 0;
        for seed in 1..=seeds {
            let (world, plain) = (draw(&named, seed, None), draw(&ranges, seed, None));
            with += u32::from(world.kinds.contains(&beyond));
            assert!(!world.kinds.contains(&beyond) || world.shape.gang(), "seed {seed}: {beyond:?} without agents");
            let rest: Vec<FaultKind> = world.kinds.iter().copied().filter(|kind| *kind != beyond).collect();
            assert_eq!(rest, plain.kinds, "seed {seed}: naming {beyond:?} moved the other kinds");
        }
        let share = f64::from(with) / seeds as f64;
        assert!(share > 0.03 && share < 0.15, "{} is on in {share:.3} of the worlds", beyond.name());
        let pauses_only = Ranges { kinds: vec![FaultKind::Pause], ..Ranges::default() };
        for seed in 1..=200 {
            let world = draw(&pauses_only, seed, None);
            assert!(world.kinds.iter().all(|kind| *kind == FaultKind::Pause), "seed {seed}: {:?}", world.kinds);
        }
    }

    #[test]
    fn narrowing_the_kinds_keeps_the_rest_of_a_world() {
        let all = draw(&Ranges::default(), 5, None);
        let none = draw(&Ranges { kinds: vec![], ..Ranges::default() }, 5, None);
        assert!(none.kinds.is_empty());
        assert!(all.kinds.contains(&crate::sim::faults::FaultKind::HandlerHang), "seed 5 hangs handlers");
        // Besides the faults, only the bounds on hung handlers and on hung store calls go with their kinds.
        let before_faults = |text: &str| {
            let head = text.split("\n[faults]").next().unwrap().lines().skip(2);
            let bounds = |line: &&str| !line.starts_with("handler_timeout = ") && !line.starts_with("call_timeout = ");
            head.filter(bounds).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(before_faults(&all.text), before_faults(&none.text), "the world's other parts stay");
        assert!(all.text.contains("\nhandler_timeout = ") && !none.text.contains("handler_timeout"));
    }

    /// A world with a replica's hung store calls draws their bound from 1 s to two of its rows' lease ttls, past the
    /// ttl in some worlds (with an agent's too, up to two of the longer of that and the node lease); every other
    /// world keeps the 1 to 4 s it drew before the kinds existed.
    #[test]
    fn store_hang_worlds_draw_call_timeouts_up_to_two_lease_ttls() {
        let ms = |text: &str, key: &str| -> Option<u64> {
            let line = text.lines().find(|line| line.starts_with(&format!("{key} = \"")))?;
            line.split('"').nth(1)?.strip_suffix("ms")?.parse().ok()
        };
        let (mut hung, mut past_ttl) = (0, 0);
        for seed in 1..=400 {
            let world = draw(&Ranges::default(), seed, None);
            let timeout = ms(&world.text, "call_timeout").expect("every world bounds its calls");
            let agents_hang = world.kinds.contains(&FaultKind::AgentStoreHang);
            if !world.kinds.contains(&FaultKind::StoreHang) && !agents_hang {
                assert!((1_000..=4_000).contains(&timeout), "seed {seed}: {timeout} ms");
                continue;
            }
            if agents_hang {
                assert!((1_000..=120_000).contains(&timeout), "seed {seed}: {timeout} ms with agents' calls hung");
                continue;
            }
            let Some(ttl) = ms(&world.text, "lease_ttl").filter(|_| world.text.contains("\n[workload]")) else {
                assert!((1_000..=20_000).contains(&timeout), "seed {seed}: {timeout} ms without rows");
                continue;
            };
            hung += 1;
            assert!((1_000..=2 * ttl).contains(&timeout), "seed {seed}: {timeout} ms, lease ttl {ttl} ms");
            past_ttl += usize::from(timeout > ttl);
        }
        assert!(hung > 50 && past_ttl > 10, "{hung} row worlds hang their store, {past_ttl} past their lease ttl");
    }

    #[test]
    fn overloaded_worlds_are_drawn_in_their_share_and_idle_ones_too() {
        let ranges = Ranges::default();
        let loads: Vec<f64> = (1..=2_000).filter_map(|seed| draw(&ranges, seed, None).load).collect();
        let over = loads.iter().filter(|load| **load > 1.0).count() as f64 / loads.len() as f64;
        assert!((0.18..0.32).contains(&over), "{over:.3} of the row worlds are above capacity");
        assert!(loads.iter().any(|load| *load < 0.05), "some worlds are nearly idle");
        assert!(loads.iter().any(|load| *load > 2.5), "some worlds run at several times capacity");
        let calm = Ranges { overload: 0.5, ..Ranges::default() };
        assert!((1..=500).filter_map(|seed| draw(&calm, seed, None).load).all(|load| load <= 0.5));
    }
}
