//! The [`Lingering`] entries of an operation while one pass works on them, indexed by (task, gang rank) and by
//! job, so that a gang restart of N ranks and the N reports that follow it cost N log N, not N² (a
//! 10 000-job restart spent most of its time scanning the list once per rank and once per message).
//!
//! The list's order is kept: entries are numbered as they are added, and [`LingeringSet::into_vec`] returns them
//! in that order, as the `Vec` the operation's data holds would have them (an entry added again for its rank goes
//! to the end).

use super::model::{JobId, Lingering};
use crate::store::RowId;
use std::collections::{BTreeMap, BTreeSet};

/// The lingering entries of one pass. At most one entry per (task, gang rank), as [`LingeringSet::push`] keeps it.
/// The indexes are looked up by the task's name and the job without allocating a key (a gang restart of
/// 10 000 ranks pushes 10 000 entries and looks up each rank as it places the new incarnation).
#[derive(Clone, Debug, Default)]
pub(crate) struct LingeringSet {
    /// Entries by the order they were added.
    entries: BTreeMap<u64, Lingering>,
    /// The entry of each gang rank, by task.
    by_rank: BTreeMap<String, BTreeMap<u32, u64>>,
    /// The entries of each job (one, as a job has one rank), as (job, entry).
    by_job: BTreeSet<(JobId, u64)>,
    next: u64,
}

impl LingeringSet {
    /// The set holding `list`, in its order.
    pub(crate) fn new(list: Vec<Lingering>) -> LingeringSet {
        let mut set = LingeringSet::default();
        for lingering in list {
            set.push(lingering);
        }
        set
    }

    /// Adds `lingering` at the end, in place of the entry of its (task, gang rank) if there is one.
    pub(crate) fn push(&mut self, lingering: Lingering) {
        self.remove_rank(&lingering.task, lingering.gang_rank);
        let seq = self.next;
        self.next += 1;
        match self.by_rank.get_mut(&lingering.task) {
            Some(ranks) => {
                ranks.insert(lingering.gang_rank, seq);
            }
            None => {
                self.by_rank.insert(lingering.task.clone(), BTreeMap::from([(lingering.gang_rank, seq)]));
            }
        }
        self.by_job.insert((lingering.job, seq));
        self.entries.insert(seq, lingering);
    }

    /// The allocation row where a process of (`task`, `rank`) may still run.
    pub(crate) fn allocation_of(&self, task: &str, rank: u32) -> Option<RowId> {
        let seq = self.by_rank.get(task)?.get(&rank)?;
        Some(self.entries[seq].allocation)
    }

    /// Drops the entry of (`task`, `rank`), if any.
    pub(crate) fn remove_rank(&mut self, task: &str, rank: u32) {
        if let Some(seq) = self.by_rank.get_mut(task).and_then(|ranks| ranks.remove(&rank)) {
            self.forget(seq);
        }
    }

    /// The entries of `job`, in the order they were added.
    fn of_job(&self, job: JobId) -> impl Iterator<Item = u64> + '_ {
        self.by_job.range((job, 0)..=(job, u64::MAX)).map(|(_, seq)| *seq)
    }

    /// Drops the entries of `job` and returns them.
    pub(crate) fn remove_job(&mut self, job: JobId) -> Vec<Lingering> {
        let seqs: Vec<u64> = self.of_job(job).collect();
        let mut removed = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let lingering = self.forget(seq);
            self.unrank(&lingering);
            removed.push(lingering);
        }
        removed
    }

    /// Whether an entry names `job`.
    pub(crate) fn holds_job(&self, job: JobId) -> bool {
        self.of_job(job).next().is_some()
    }

    /// Keeps only the entries `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Lingering) -> bool) {
        let dropped: Vec<u64> = self.entries.iter().filter(|(_, l)| !keep(l)).map(|(seq, _)| *seq).collect();
        for seq in dropped {
            let lingering = self.forget(seq);
            self.unrank(&lingering);
        }
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        let next = self.next;
        *self = LingeringSet { next, ..LingeringSet::default() };
    }

    /// The entries, in the order they were added.
    pub(crate) fn into_vec(self) -> Vec<Lingering> {
        self.entries.into_values().collect()
    }

    /// Removes the rank index's entry of `lingering`'s (task, gang rank).
    fn unrank(&mut self, lingering: &Lingering) {
        if let Some(ranks) = self.by_rank.get_mut(&lingering.task) {
            ranks.remove(&lingering.gang_rank);
        }
    }

    /// Removes entry `seq` from the entries and the job index, and returns it (the caller updates `by_rank`).
    fn forget(&mut self, seq: u64) -> Lingering {
        let lingering = self.entries.remove(&seq).expect("indexed entry");
        self.by_job.remove(&(lingering.job, seq));
        lingering
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LockToken;

    fn entry(job: u64, task: &str, rank: u32) -> Lingering {
        Lingering {
            job: JobId { operation: RowId(1), index: job },
            task: task.into(),
            gang_rank: rank,
            allocation: RowId(100 + job as i64),
            node: RowId(7),
            session: LockToken(9),
        }
    }

    /// The set behaves as the `Vec` operations it replaces: retain by rank then push, find by rank, retain by job.
    #[test]
    fn the_set_keeps_the_order_and_the_entries_of_the_list_it_replaces() {
        let mut list = vec![entry(1, "a", 0), entry(2, "a", 1), entry(3, "b", 0)];
        let mut set = LingeringSet::new(list.clone());
        let again = entry(4, "a", 0);
        list.retain(|l| (l.task.as_str(), l.gang_rank) != ("a", 0));
        list.push(again.clone());
        set.push(again);
        assert_eq!(set.allocation_of("a", 0), Some(RowId(104)));
        assert_eq!(set.allocation_of("a", 2), None);
        assert!(set.holds_job(JobId { operation: RowId(1), index: 2 }));
        list.retain(|l| l.job.index != 3);
        assert_eq!(set.remove_job(JobId { operation: RowId(1), index: 3 }), vec![entry(3, "b", 0)]);
        assert!(!set.holds_job(JobId { operation: RowId(1), index: 3 }));
        list.retain(|l| !(l.task == "a" && l.gang_rank == 1));
        set.remove_rank("a", 1);
        list.push(entry(5, "b", 0));
        set.push(entry(5, "b", 0));
        set.retain(|l| l.job.index != 4);
        list.retain(|l| l.job.index != 4);
        assert_eq!(set.allocation_of("a", 0), None, "retained out");
        assert_eq!(set.clone().into_vec(), list);
        set.clear();
        assert_eq!(set.into_vec(), vec![]);
    }
}
