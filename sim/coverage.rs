//! What a run went through: how often it reached the paths its faults exist for. A sweep asserts these are not
//! zero over its seeds, or the checkers would hold vacuously (a scenario that never makes an apply stale proves
//! nothing about stale applies).

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

impl Coverage {
    /// The coverage of one run.
    pub fn of(history: &[Commit], trace: &[TraceEvent]) -> Coverage {
        let mut coverage = Coverage::default();
        // Rows whose last lease was handed out and not yet applied, reset or released.
        let mut open: BTreeMap<crate::store::RowId, bool> = BTreeMap::new();
        let mut applied = std::collections::BTreeSet::new();
        for commit in history {
            match &commit.op {
                CommitOp::Fetch { leases, .. } => {
                    for lease in leases {
                        if open.insert(lease.id, true) == Some(true) {
                            coverage.bump("takeover");
                        }
                    }
                }
                CommitOp::Apply { lease, applied: true, .. } => {
                    coverage.bump("applied");
                    applied.insert(*lease);
                    open.insert(lease.id, false);
                }
                CommitOp::Apply { lease, applied: false, .. } => {
                    coverage.bump("stale-apply");
                    if applied.contains(lease) {
                        coverage.bump("repeated-apply");
                    }
                }
                CommitOp::Reset { lease, held: true } => {
                    coverage.bump("reset");
                    open.insert(lease.id, false);
                }
                CommitOp::Failure { lease, attempts: Some(_), gave_up } => {
                    coverage.bump(if *gave_up { "gave-up" } else { "failure-recorded" });
                    open.insert(lease.id, false);
                }
                CommitOp::Release { released } => {
                    for lease in released {
                        open.insert(lease.id, false);
                    }
                }
                CommitOp::LockRelated { outcome: LockOutcome::Contended, .. } => coverage.bump("contended"),
                CommitOp::LockRelated { outcome: LockOutcome::Locked, .. } => coverage.bump("locked"),
                _ => {}
            }
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
        // A run bumps a key per commit: a new string only for a key not seen before (issue 17).
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
