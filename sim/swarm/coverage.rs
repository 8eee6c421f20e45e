//! What a swarm reached, across its seeds: for each fault kind, the worlds that switched it on and those in which
//! it was injected; for each engine and controller path, the worlds whose run went through it. A kind or path that
//! no world (or under 1 % of them) reached is named, so that a checker passing over it is not read as proof.

use crate::sim::run::RunReport;
use crate::sim::summary::fault_counts;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The engine's and the controller's paths a swarm reports, each a [`crate::sim::coverage::Coverage`] key or a
/// key read from the trace here: every pipeline's (applies, stale applies, a lease taken over, resets for retry,
/// contended and granted related locks, failures recorded, store calls timed out and replies lost), the row
/// workload's (a stale apply of a lease that had applied already, a row given up)
/// and gang operations (gang restarts, revivals, lost nodes, fenced agents, gangs queued for all-or-nothing
/// placement, processes killed).
pub const PATHS: [(&str, Scope); 17] = [
    ("applied", Scope::Any),
    ("stale-apply", Scope::Any),
    ("repeated-apply", Scope::Rows),
    ("takeover", Scope::Any),
    ("reset", Scope::Any),
    ("contended", Scope::Any),
    ("locked", Scope::Any),
    ("failure-recorded", Scope::Any),
    ("gave-up", Scope::Rows),
    ("call-timeout", Scope::Any),
    ("reply-dropped", Scope::Any),
    ("gang-restart", Scope::Gang),
    ("revival", Scope::Gang),
    ("node-lost", Scope::Gang),
    ("fence", Scope::Gang),
    ("gang-wait", Scope::Gang),
    ("proc-kill", Scope::Gang),
];

/// Which worlds a path can be reached in (its share is of those worlds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every world.
    Any,
    /// Worlds with the row workload.
    Rows,
    /// Worlds with operations.
    Gang,
}

/// What one seed reached: the names of the fault kinds its world switched on, of those injected, and of the
/// [`PATHS`] its run went through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Kinds on in the world.
    pub on: Vec<String>,
    /// Kinds the run injected at least once (from its trace).
    pub injected: Vec<String>,
    /// Paths the run went through.
    pub paths: Vec<String>,
}

impl Reached {
    /// What `report`'s run reached, its world having switched `on` those kinds.
    pub fn of(report: &RunReport, on: Vec<String>) -> Reached {
        let injected = fault_counts(&report.trace).into_keys().filter(|kind| kind != "skipped").collect();
        let mut paths = Vec::new();
        for (path, _) in PATHS {
            let reached = match path {
                "gang-restart" => report.trace.iter().any(|event| {
                    event.kind == "incarnation" && !event.fields.text().contains("reason=operation_started")
                }),
                "revival" => report.trace.iter().any(|event| {
                    event.kind == "incarnation" && event.fields.text().contains("reason=lack_after_revival")
                }),
                _ => report.coverage.get(path) > 0,
            };
            if reached {
                paths.push(path.to_string());
            }
        }
        Reached { on, injected, paths }
    }
}

/// Seeds by what they reached, summed over a sweep (or merged shards). Constant in size whatever the number of
/// seeds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwarmCoverage {
    /// Seeds counted.
    pub seeds: u64,
    /// Seeds with the row workload, and with operations.
    pub rows_seeds: u64,
    /// Seeds with operations.
    pub gang_seeds: u64,
    /// Seeds with the built-in row workload (the only worlds a contention fault can run in).
    pub builtin_seeds: u64,
    /// Seeds whose world switched each kind on.
    pub on: BTreeMap<String, u64>,
    /// Seeds whose run injected each kind.
    pub injected: BTreeMap<String, u64>,
    /// Seeds whose run went through each path.
    pub paths: BTreeMap<String, u64>,
}

impl SwarmCoverage {
    /// Counts one seed: what it `reached`, and whether its world had rows (the built-in ones, or a user's set),
    /// the built-in rows, and operations.
    pub fn add(&mut self, reached: &Reached, (rows, builtin, gang): (bool, bool, bool)) {
        self.seeds += 1;
        self.rows_seeds += u64::from(rows);
        self.builtin_seeds += u64::from(builtin);
        self.gang_seeds += u64::from(gang);
        for (names, counts) in
            [(&reached.on, &mut self.on), (&reached.injected, &mut self.injected), (&reached.paths, &mut self.paths)]
        {
            for name in names {
                *counts.entry(name.clone()).or_default() += 1;
            }
        }
    }

    /// The fault kinds and paths reached by fewer than `share` of the seeds that could reach them (a kind: of all
    /// seeds; a path: of the seeds of its [`Scope`]), by name, with their counts. A kind off by default
    /// ([`FaultKind::off_by_default`](crate::sim::faults::FaultKind::off_by_default)) that no world switched on was
    /// not asked for, and is not named.
    pub fn below(&self, share: f64) -> Vec<String> {
        let mut low = Vec::new();
        let under = |count: u64, of: u64| of > 0 && (count as f64) < share * of as f64;
        for kind in crate::sim::faults::FaultKind::ALL {
            let injected = self.injected.get(kind.name()).copied().unwrap_or(0);
            let of = self.kind_seeds(kind);
            let asked = !kind.off_by_default() || self.on.get(kind.name()).is_some_and(|on| *on > 0);
            if asked && under(injected, of) {
                low.push(format!("fault {} ({injected} of {of} seeds)", kind.name()));
            }
        }
        for (path, scope) in PATHS {
            let of = self.scope_seeds(scope);
            let count = self.paths.get(path).copied().unwrap_or(0);
            if under(count, of) {
                low.push(format!("path {path} ({count} of {of} seeds)"));
            }
        }
        low
    }

    /// The worlds that can run `kind`: agent kinds need agents, contention the built-in rows.
    fn kind_seeds(&self, kind: crate::sim::faults::FaultKind) -> u64 {
        match kind {
            kind if kind.targets_agents() => self.gang_seeds,
            crate::sim::faults::FaultKind::Contention => self.builtin_seeds,
            _ => self.seeds,
        }
    }

    fn scope_seeds(&self, scope: Scope) -> u64 {
        match scope {
            Scope::Any => self.seeds,
            Scope::Rows => self.rows_seeds,
            Scope::Gang => self.gang_seeds,
        }
    }

    /// The coverage table: a row per fault kind (seeds that switched it on, that injected it) and per path (seeds
    /// that reached it, of those that could), then what fewer than 1 % of them reached.
    pub fn table(&self) -> String {
        let percent = |count: u64, of: u64| if of == 0 { 0.0 } else { 100.0 * count as f64 / of as f64 };
        let mut text = format!(
            "coverage over {} worlds ({} with rows, {} with operations):\n",
            self.seeds, self.rows_seeds, self.gang_seeds
        );
        let _ = writeln!(text, "  {:<25} {:>7} {:>9}", "fault kind", "on", "injected");
        for kind in crate::sim::faults::FaultKind::ALL {
            let on = self.on.get(kind.name()).copied().unwrap_or(0);
            let injected = self.injected.get(kind.name()).copied().unwrap_or(0);
            let of = self.kind_seeds(kind);
            let _ = writeln!(
                text,
                "  {:<25} {:>6.1}% {:>8.1}% of {of}",
                kind.name(),
                percent(on, of),
                percent(injected, of)
            );
        }
        let _ = writeln!(text, "  {:<25} {:>7}", "path", "reached");
        for (path, scope) in PATHS {
            let of = self.scope_seeds(scope);
            let count = self.paths.get(path).copied().unwrap_or(0);
            let _ = writeln!(text, "  {path:<25} {:>6.1}% of {of}", percent(count, of));
        }
        let low = self.below(0.01);
        match low.is_empty() {
            true => text.push_str("every fault kind and path reached by at least 1% of the worlds that can\n"),
            false => {
                let _ = writeln!(text, "reached by under 1% of the worlds that can: {}", low.join(", "));
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_names_what_too_few_worlds_reached() {
        let mut coverage = SwarmCoverage::default();
        let both = Reached { on: vec!["kill".into()], injected: vec!["kill".into()], paths: vec!["applied".into()] };
        for _ in 0..150 {
            coverage.add(&both, (true, true, false));
        }
        let low = coverage.below(0.01);
        assert!(low.contains(&"fault pause (0 of 150 seeds)".to_string()), "{low:?}");
        assert!(!low.iter().any(|line| line.starts_with("fault kill")), "{low:?}");
        assert!(!low.iter().any(|line| line.starts_with("path applied")), "{low:?}");
        assert!(low.contains(&"path takeover (0 of 150 seeds)".to_string()), "{low:?}");
        assert!(!low.iter().any(|line| line.starts_with("path node-lost")), "no gang world: not judged: {low:?}");
        assert!(!low.iter().any(|line| line.starts_with("fault agent-kill")), "no agents: not judged: {low:?}");
        let mut gang_only = SwarmCoverage::default();
        for _ in 0..150 {
            gang_only.add(&Reached::default(), (false, false, true));
        }
        let low = gang_only.below(0.01);
        assert!(!low.iter().any(|line| line.starts_with("fault contention")), "no built-in rows: {low:?}");
        assert!(low.iter().any(|line| line.starts_with("fault agent-kill")), "{low:?}");
        assert!(!low.iter().any(|line| line.starts_with("fault agent-clock-beyond-margin")), "not asked for: {low:?}");
        let beyond = Reached { on: vec!["agent-clock-beyond-margin".into()], ..Reached::default() };
        gang_only.add(&beyond, (false, false, true));
        let low = gang_only.below(0.01);
        assert!(
            low.iter().any(|line| line.starts_with("fault agent-clock-beyond-margin")),
            "on, never injected: {low:?}"
        );
        assert!(coverage.table().contains("reached by under 1% of the worlds that can: fault pause"));
    }
}
