//! What a run went through: how often it reached the paths its faults exist for. A sweep asserts these are not
//! zero over its seeds, or the checkers would hold vacuously (a scenario that never makes an apply stale proves
//! nothing about stale applies).

use super::checkers::row_map::RowMap;
use super::trace::TraceEvent;
use crate::store::{Commit, CommitOp, LockOutcome};
use std::collections::BTreeMap;
use std::fmt;

/// Counts by name: commit outcomes (`applied`, `stale-apply`, `repeated-apply`: a stale apply of a lease that
/// had applied already, `takeover`, `reset`, `contended`, `locked`) and
/// trace events other than commits (`kill`, `pause`, `call-timeout`, `reply-dropped`, `db-kill`, …).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    counts: BTreeMap<String, u64>,
}

/// The commit outcomes [`Coverage::of`] counts, a counter each while it reads the history: no lookup of a
/// string key per commit (a 10 000-row run has 90 000 commits). Named as [`Coverage`] names them.
#[derive(Default)]
struct CommitOutcomes {
    applied: u64,
    stale_apply: u64,
    repeated_apply: u64,
    takeover: u64,
    reset: u64,
    gave_up: u64,
    failure_recorded: u64,
    contended: u64,
    locked: u64,
}

impl CommitOutcomes {
    /// Each outcome's key and count.
    fn counts(&self) -> [(&'static str, u64); 9] {
        [
            ("applied", self.applied),
            ("stale-apply", self.stale_apply),
            ("repeated-apply", self.repeated_apply),
            ("takeover", self.takeover),
            ("reset", self.reset),
            ("gave-up", self.gave_up),
            ("failure-recorded", self.failure_recorded),
            ("contended", self.contended),
            ("locked", self.locked),
        ]
    }
}

impl Coverage {
    /// The coverage of one run.
    pub fn of(history: &[Commit], trace: &[TraceEvent]) -> Coverage {
        let mut outcomes = CommitOutcomes::default();
        // Rows whose last lease was handed out and not yet applied, reset or released.
        let mut open: RowMap<bool> = RowMap::new();
        let mut applied = std::collections::BTreeSet::new();
        for commit in history {
            match &commit.op {
                CommitOp::Fetch { leases, .. } => {
                    for lease in leases {
                        if open.insert(lease.id, true) == Some(true) {
                            outcomes.takeover += 1;
                        }
                    }
                }
                CommitOp::Apply { lease, applied: true, .. } => {
                    outcomes.applied += 1;
                    applied.insert(*lease);
                    open.insert(lease.id, false);
                }
                CommitOp::Apply { lease, applied: false, .. } => {
                    outcomes.stale_apply += 1;
                    if applied.contains(lease) {
                        outcomes.repeated_apply += 1;
                    }
                }
                CommitOp::Reset { lease, held: true } => {
                    outcomes.reset += 1;
                    open.insert(lease.id, false);
                }
                CommitOp::Failure { lease, attempts: Some(_), gave_up } => {
                    if *gave_up {
                        outcomes.gave_up += 1;
                    } else {
                        outcomes.failure_recorded += 1;
                    }
                    open.insert(lease.id, false);
                }
                CommitOp::Release { released } => {
                    for lease in released {
                        open.insert(lease.id, false);
                    }
                }
                CommitOp::LockRelated { outcome: LockOutcome::Contended { .. }, .. } => outcomes.contended += 1,
                CommitOp::LockRelated { outcome: LockOutcome::Locked, .. } => outcomes.locked += 1,
                _ => {}
            }
        }
        // A key is in the counts once it was seen, as `bump` adds it.
        let mut coverage = Coverage::default();
        for (key, count) in outcomes.counts().into_iter().filter(|(_, count)| *count > 0) {
            coverage.counts.insert(key.to_string(), count);
        }
        for event in trace.iter().filter(|event| event.kind != "commit") {
            if &*event.node == "db" {
                coverage.bump(&format!("db-{}", event.kind));
            } else {
                coverage.bump(event.kind);
            }
        }
        coverage
    }

    fn bump(&mut self, key: &str) {
        // A run bumps a key per commit: a new string only for a key not seen before.
        match self.counts.get_mut(key) {
            Some(count) => *count += 1,
            None => {
                self.counts.insert(key.to_string(), 1);
            }
        }
    }

    /// The count of `key` (0 if never seen).
    pub fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    /// Adds another run's counts.
    pub fn add(&mut self, other: &Coverage) {
        for (key, count) in &other.counts {
            *self.counts.entry(key.clone()).or_default() += count;
        }
    }

    /// The keys of `keys` whose count is 0.
    pub fn missing<'a>(&self, keys: &[&'a str]) -> Vec<&'a str> {
        keys.iter().copied().filter(|key| self.get(key) == 0).collect()
    }
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.counts.iter().map(|(key, count)| format!("{key}={count}")).collect();
        write!(f, "{}", pairs.join(" "))
    }
}
