//! When a pipeline had room: the stretches of store time in which some replica of a pipeline had an idle worker
//! (fewer live leases of the pipeline than its workers), read from the commit history alone. A checker that bounds
//! how long a ready row waits counts only this idle time: a row that waits while every worker of its pipeline is
//! busy waits for capacity (an overloaded world), which is no fault of the engine; a row that waits while a worker
//! idles is one (a fetcher asleep past a retry it should have woken for, a hint nobody acted on).
//!
//! A lease is live from its fetch until a commit ends it (its apply, stale or not, its failure, its reset, its
//! release) or, without a heartbeat that extends it, until its expiry (fetch or last heartbeat + the lease ttl): a
//! replica that died holds nothing once its leases lapse. Replicas are the commits' callers (`replica-N`), so a
//! replica that never fetched holds nothing and idles. A lapse does not free a worker still running the item's
//! handler, though: the engine lets a handler run on past its lease, bounded by `handler_timeout` and not by the
//! lease (its guarded apply still succeeds if no one took the row, docs/engine.md), so a lease that lapses before
//! its worker's write under it (its apply, stale or not, its failure, its reset; read ahead in the history) holds
//! its room until that write. A replica cut off from the store for longer than a lease ttl cannot heartbeat, and its
//! workers are still busy with such items after the heal. A lease its holder never writes under again (a dead
//! replica, a queued item dropped unstarted, a fetch whose answer was lost) frees its room at the lapse, as does a
//! release after it (the heartbeater gives back queued items, not a worker's). A replica whose items were last
//! turned away by rows its pipeline's items hold in another replica backs off (DESIGN §3, the contention backoff):
//! its idle workers are no room until one of its related locks is taken again.

use crate::store::{Commit, CommitOp, LockOutcome, LockToken, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// What the world's pipelines can hold at once: replicas, each pipeline's workers per replica, the lease ttl.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Replica nodes (`replica-0` …).
    pub replicas: usize,
    /// Lease ttl of the pipelines (a lease not heartbeated lapses after it).
    pub lease_ttl: Duration,
    /// Workers per replica, by pipeline name. A pipeline not listed is taken to idle at every moment (its waits are
    /// judged whole).
    pub workers: BTreeMap<String, usize>,
    /// The pipelines that lease each row kind (`task` → `tasks`), for the kinds whose hints are judged.
    pub pipelines_of_kind: BTreeMap<String, Vec<String>>,
    /// How long the faults' effects may outlast the heal: a store call sent before it may still be in flight (up to
    /// its time-out), and a hint subscription a fault broke is renewed within a second. Waits are judged from the
    /// heal plus this span.
    pub settle: Duration,
    /// Whether the world's fault plan is empty: then nothing heals, and the retries' waits are judged from the
    /// run's start (a fault-free scenario's failures all fall before its heal, at the end of its workload).
    pub fault_free: bool,
}

/// No pipeline listed: every wait is judged whole (the checkers' unit tests; a world whose capacity is not known).
pub static UNBOUNDED: Capacity = Capacity {
    replicas: 0,
    lease_ttl: Duration::ZERO,
    workers: BTreeMap::new(),
    pipelines_of_kind: BTreeMap::new(),
    settle: Duration::ZERO,
    fault_free: false,
};

/// One live lease: its pipeline, its holder and when it lapses unless extended or ended.
struct Held {
    pipeline: String,
    caller: Option<Arc<str>>,
    expires: Timestamp,
}

/// The idle time of each pipeline, advanced commit by commit: [`IdleClock::advance`] to a commit's time (or any
/// later time), then [`IdleClock::observe`] the commit.
pub struct IdleClock<'a> {
    capacity: &'a Capacity,
    start: Timestamp,
    now: Timestamp,
    leases: BTreeMap<LockToken, Held>,
    expiries: BTreeSet<(Timestamp, LockToken)>,
    live: BTreeMap<(String, Option<Arc<str>>), usize>,
    /// When a worker's write first ended each lease (apply, failure, reset), read ahead in the history: a lease that
    /// lapses before it still holds its worker until then.
    written: BTreeMap<LockToken, Timestamp>,
    /// Replicas of a pipeline whose last related lock was turned away by rows the pipeline's items hold elsewhere,
    /// with no lock taken since: the engine backs such a replica off (`Shared::backs_off_for_contention`), and its
    /// idle workers are no capacity, since what they would fetch meets the same holders.
    contended: BTreeSet<(String, Option<Arc<str>>)>,
    idle_us: BTreeMap<String, u64>,
}

impl<'a> IdleClock<'a> {
    /// A clock of `capacity`'s pipelines, every replica idle, starting at `start`, for the commits of `history`
    /// (read ahead for the workers' writes under lapsed leases; see the module doc).
    pub fn new(capacity: &'a Capacity, start: Timestamp, history: &[Commit]) -> IdleClock<'a> {
        IdleClock {
            capacity,
            start,
            now: start,
            leases: BTreeMap::new(),
            expiries: BTreeSet::new(),
            live: BTreeMap::new(),
            written: worker_writes(history),
            contended: BTreeSet::new(),
            idle_us: BTreeMap::new(),
        }
    }

    /// Moves the clock forward to `at` (never back), ending the leases that lapse on the way and counting each
    /// pipeline's idle time.
    pub fn advance(&mut self, at: Timestamp) {
        while let Some(&(expires, token)) = self.expiries.first() {
            if expires > at {
                break;
            }
            self.count_until(expires);
            match self.written.get(&token) {
                // The lease lapsed under a running handler: its worker is busy until its write.
                Some(&written) if written > expires => {
                    self.expiries.remove(&(expires, token));
                    self.expiries.insert((written, token));
                    if let Some(held) = self.leases.get_mut(&token) {
                        held.expires = written;
                    }
                }
                _ => self.end(token),
            }
        }
        self.count_until(at);
    }

    /// Counts what `commit` did to the leases: fetches start them, heartbeats extend them, applies, failures,
    /// resets and releases end them. Advance to its time first.
    pub fn observe(&mut self, commit: &Commit) {
        match &commit.op {
            CommitOp::Fetch { pipeline, leases } => {
                for lease in leases {
                    let expires = commit.at.plus(self.capacity.lease_ttl);
                    let held = Held { pipeline: pipeline.clone(), caller: commit.caller.clone(), expires };
                    *self.live.entry((pipeline.clone(), commit.caller.clone())).or_default() += 1;
                    self.expiries.insert((expires, lease.token));
                    if let Some(old) = self.leases.insert(lease.token, held) {
                        // A token is handed out once; should a history repeat one, the later fetch holds it.
                        self.expiries.remove(&(old.expires, lease.token));
                        self.release(&old);
                    }
                }
            }
            CommitOp::LockRelated { holder, outcome, .. } => {
                if let Some(held) = self.leases.get(&holder.token) {
                    let key = (held.pipeline.clone(), commit.caller.clone());
                    match outcome {
                        LockOutcome::Contended { by_own_pipeline: true } => self.contended.insert(key),
                        LockOutcome::Locked => self.contended.remove(&key),
                        _ => false,
                    };
                }
            }
            CommitOp::Heartbeat { held } => {
                let expires = commit.at.plus(self.capacity.lease_ttl);
                for lease in held {
                    if let Some(live) = self.leases.get_mut(&lease.token) {
                        self.expiries.remove(&(live.expires, lease.token));
                        live.expires = live.expires.max(expires);
                        self.expiries.insert((live.expires, lease.token));
                    }
                }
            }
            CommitOp::Apply { lease, .. } | CommitOp::Failure { lease, .. } | CommitOp::Reset { lease, .. } => {
                self.end(lease.token)
            }
            CommitOp::Release { released } => {
                for lease in released {
                    self.end(lease.token);
                }
            }
            _ => {}
        }
    }

    /// Store time during which some replica of `pipeline` had an idle worker, from the clock's start to now, in
    /// microseconds (all of it for a pipeline [`Capacity::workers`] does not list).
    pub fn idle_us(&self, pipeline: &str) -> u64 {
        match self.capacity.workers.contains_key(pipeline) {
            true => self.idle_us.get(pipeline).copied().unwrap_or(0),
            false => self.now.as_micros().saturating_sub(self.start.as_micros()) as u64,
        }
    }

    /// Whether some replica of `pipeline` has an idle worker now, not backing off for contention.
    pub fn is_idle(&self, pipeline: &str) -> bool {
        let Some(&workers) = self.capacity.workers.get(pipeline) else { return true };
        (0..self.capacity.replicas.max(1)).any(|index| {
            let caller: Option<Arc<str>> = match self.capacity.replicas {
                0 => None,
                _ => Some(Arc::from(format!("replica-{index}"))),
            };
            let key = (pipeline.to_string(), caller);
            self.live.get(&key).copied().unwrap_or(0) < workers && !self.contended.contains(&key)
        })
    }

    fn count_until(&mut self, at: Timestamp) {
        if at <= self.now {
            return;
        }
        let span = (at.as_micros() - self.now.as_micros()) as u64;
        let idle: Vec<String> =
            self.capacity.workers.keys().filter(|pipeline| self.is_idle(pipeline)).cloned().collect();
        for pipeline in idle {
            *self.idle_us.entry(pipeline).or_default() += span;
        }
        self.now = at;
    }

    fn end(&mut self, token: LockToken) {
        if let Some(held) = self.leases.remove(&token) {
            self.expiries.remove(&(held.expires, token));
            self.release(&held);
        }
    }

    fn release(&mut self, held: &Held) {
        let key = (held.pipeline.clone(), held.caller.clone());
        if let Some(count) = self.live.get_mut(&key) {
            *count = count.saturating_sub(1);
        }
    }
}

/// The first write of each lease's worker in `history` (its apply, stale or not, its failure, its reset), by token.
fn worker_writes(history: &[Commit]) -> BTreeMap<LockToken, Timestamp> {
    let mut written = BTreeMap::new();
    for commit in history {
        if let CommitOp::Apply { lease, .. } | CommitOp::Failure { lease, .. } | CommitOp::Reset { lease, .. } =
            &commit.op
        {
            written.entry(lease.token).or_insert(commit.at);
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{apply, at, commit, lease};
    use super::*;
    use crate::store::CommitOp;

    fn capacity() -> Capacity {
        Capacity {
            replicas: 1,
            lease_ttl: Duration::from_secs(10),
            workers: BTreeMap::from([("p".to_string(), 1)]),
            pipelines_of_kind: BTreeMap::new(),
            settle: Duration::ZERO,
            fault_free: false,
        }
    }

    fn fetch_by(secs: u64, token: i64) -> Commit {
        let mut commit = commit(secs, CommitOp::Fetch { pipeline: "p".into(), leases: vec![lease(1, token)] });
        commit.caller = Some(Arc::from("replica-0"));
        commit
    }

    #[test]
    fn a_pipeline_whose_only_worker_holds_a_lease_is_not_idle_until_the_lease_ends() {
        let capacity = capacity();
        let history = [fetch_by(2, 1), apply(5, lease(1, 1), true)];
        let mut clock = IdleClock::new(&capacity, at(0), &history);
        for commit in &history {
            clock.advance(commit.at);
            clock.observe(commit);
        }
        clock.advance(at(6));
        assert_eq!(clock.idle_us("p"), 3_000_000, "idle 0-2 s and 5-6 s");
        assert!(clock.is_idle("p"));
        assert_eq!(clock.idle_us("other"), 6_000_000, "a pipeline not listed idles all along");
    }

    #[test]
    fn a_lease_not_heartbeated_lapses_at_its_expiry_and_a_heartbeat_extends_it() {
        let capacity = capacity();
        let heartbeat = commit(8, CommitOp::Heartbeat { held: vec![lease(1, 1)] });
        let history = [fetch_by(0, 1), heartbeat];
        let mut clock = IdleClock::new(&capacity, at(0), &history);
        for commit in &history {
            clock.advance(commit.at);
            clock.observe(commit);
        }
        clock.advance(at(30));
        assert_eq!(clock.idle_us("p"), 12_000_000, "held until 8 + 10 s, idle after");
    }

    /// A replica cut off from the store cannot heartbeat: its worker's lease lapses at 10 s while the handler
    /// runs on, and its apply (stale here) comes at 14 s. The worker was busy until then, not idle from 10 s. A
    /// lease its holder never writes under again (a dead replica, an item dropped from the queue) frees its worker
    /// at the lapse, and so does a release after the lapse (the heartbeater gives back queued items, not a
    /// worker's).
    #[test]
    fn a_lease_that_lapsed_under_a_running_handler_holds_its_worker_until_its_write() {
        let capacity = capacity();
        let idle_by = |history: &[Commit], until: u64| {
            let mut clock = IdleClock::new(&capacity, at(0), history);
            for commit in history {
                clock.advance(commit.at);
                clock.observe(commit);
            }
            clock.advance(at(until));
            clock.idle_us("p")
        };
        let by_replica = |mut commit: Commit| {
            commit.caller = Some(Arc::from("replica-0"));
            commit
        };
        let stale = [fetch_by(0, 1), by_replica(apply(14, lease(1, 1), false))];
        assert_eq!(idle_by(&stale, 20), 6_000_000, "busy until the stale apply at 14 s");
        let failed = [
            fetch_by(0, 1),
            by_replica(commit(13, CommitOp::Failure { lease: lease(1, 1), attempts: None, gave_up: false })),
        ];
        assert_eq!(idle_by(&failed, 20), 7_000_000, "busy until the failure at 13 s");
        let silent = [fetch_by(0, 1)];
        assert_eq!(idle_by(&silent, 20), 10_000_000, "no later write: free at the lapse");
        let released = [fetch_by(0, 1), by_replica(commit(14, CommitOp::Release { released: vec![lease(1, 1)] }))];
        assert_eq!(idle_by(&released, 20), 10_000_000, "a release is no worker's: free at the lapse");
    }
}
