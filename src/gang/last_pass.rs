//! What a replica's last pass over an operation left (issue 17): the operation's jobs and the allocations granted
//! to it, as that pass's apply wrote them. Only an operation's applied passes write its jobs and the allocations
//! it holds (agents and write APIs insert rows; DESIGN §3, write APIs), and every applied pass writes the
//! operation's data with its own lease token in it ([`OperationData::written_by`]). So while the operation's data
//! names a pass this replica kept the state of, nothing else has written those rows since, and the replica's next
//! pass takes them from here: it reads only the job rows inserted since (the ids its own apply gave its new jobs),
//! the first job of the incarnation (whose lock tells whether a pass died mid-pass: revival) and the rows that do
//! change under it (inbox, nodes, free allocations). A gang restart's passes then cost what they consume, not the
//! incarnation's 10 000 jobs and allocations each.
//!
//! [`OperationData::written_by`]: super::model::OperationData::written_by

use super::controller::PassOutput;
use super::model::{Allocation, Job};
use crate::store::{LockToken, RowId};
use std::collections::BTreeMap;

/// The state one pass over an operation leaves, if its apply applies: the pass's lease token, the jobs after the
/// pass (those with rows after its `jobs_after`, and those its apply inserts) and the allocations granted to the
/// operation after it.
#[derive(Debug)]
pub(crate) struct LastPass {
    /// The lease token of the pass: its apply writes it into the operation's data.
    pub(crate) token: LockToken,
    /// Jobs with rows, as the pass left them, by row id: those after the operation's `jobs_after` once the pass
    /// applied (the current incarnation's).
    pub(crate) jobs: Vec<Job>,
    /// Jobs the pass's apply inserts, in insert order (no row yet): the store gives them the next ids, in order
    /// ([`crate::store::Store::apply`]).
    pub(crate) inserted: Vec<Job>,
    /// Allocations granted to the operation after the pass, by row id.
    pub(crate) allocations: Vec<Allocation>,
}

impl LastPass {
    /// The state after the pass under lease `token` of `operation` that was given `jobs` and `allocations` (those
    /// granted to it) and wrote `output`.
    pub(crate) fn after(
        token: LockToken,
        operation: RowId,
        jobs: Vec<Job>,
        allocations: Vec<Allocation>,
        output: &PassOutput,
    ) -> LastPass {
        let updated: BTreeMap<RowId, &Job> =
            output.updated_jobs.iter().map(|job| (job.row.expect("an updated job has a row"), job)).collect();
        let after = output.data.jobs_after;
        let mut jobs: Vec<Job> = jobs
            .into_iter()
            .filter_map(|job| {
                let row = job.row.expect("a job read has a row");
                after.is_none_or(|after| row > after).then(|| match updated.get(&row) {
                    Some(updated) => (*updated).clone(),
                    None => job,
                })
            })
            .collect();
        jobs.sort_by_key(|job| job.row);
        let mut granted: BTreeMap<RowId, Allocation> = allocations.into_iter().map(|a| (a.row, a)).collect();
        for allocation in &output.allocations {
            if allocation.allocated && allocation.data.operation == Some(operation) {
                granted.insert(allocation.row, allocation.clone());
            } else {
                granted.remove(&allocation.row);
            }
        }
        LastPass { token, jobs, inserted: output.new_jobs.clone(), allocations: granted.into_values().collect() }
    }

    /// The row after which the job rows inserted since this pass are: its last job row, else the operation's
    /// `jobs_after` (`jobs_after` of the data the pass wrote).
    pub(crate) fn rows_after(&self, jobs_after: Option<RowId>) -> Option<RowId> {
        self.jobs.last().and_then(|job| job.row).or(jobs_after)
    }

    /// The first job row of the incarnation the pass left, if it kept one (else the first row inserted since is).
    pub(crate) fn first_job(&self) -> Option<RowId> {
        self.jobs.first().and_then(|job| job.row)
    }

    /// The jobs of the next pass, given the ids of the job rows inserted since (ascending): the kept jobs, then the
    /// inserted ones with their rows. `None` if the store holds another number of rows than the apply inserted (a
    /// writer other than the operation's passes: not trusted).
    pub(crate) fn into_jobs(self, inserted: &[RowId]) -> Option<Vec<Job>> {
        if inserted.len() != self.inserted.len() {
            return None;
        }
        let mut jobs = self.jobs;
        jobs.extend(self.inserted.into_iter().zip(inserted).map(|(job, row)| Job { row: Some(*row), ..job }));
        Some(jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::controller::PassOutput;
    use crate::gang::model::{AllocationData, JobData, JobId, JobStatus, OperationData, OperationStatus};
    use crate::gang::spec::{OperationSpec, SpecFormat};
    use std::sync::Arc;

    const OP: RowId = RowId(1);

    fn job(row: Option<i64>, index: u64, status: JobStatus) -> Job {
        let data = JobData {
            id: JobId { operation: OP, index },
            task: "w".into(),
            job_cookie: index as u32,
            gang_rank: Some(index as u32),
            reserved: false,
            incarnation: 0,
            allocation: None,
            monitoring_descriptor: None,
            exit_code: None,
            reason: None,
        };
        Job { row: row.map(RowId), status, data: Arc::new(data) }
    }

    fn allocation(row: i64, operation: Option<RowId>) -> Allocation {
        let data = AllocationData { operation, ..AllocationData::free(RowId(50), "n".into(), row as u32) };
        Allocation { row: RowId(row), allocated: operation.is_some(), data: Arc::new(data) }
    }

    fn output(jobs_after: Option<RowId>) -> PassOutput {
        let spec = OperationSpec::parse("{tasks={w={job_count=2;command=w;gang_options={}}}}", SpecFormat::Yson);
        let data = OperationData { jobs_after, ..OperationData::new(spec.unwrap()) };
        PassOutput {
            status: OperationStatus::Running,
            data,
            updated_jobs: Vec::new(),
            new_jobs: Vec::new(),
            allocations: Vec::new(),
            consumed: Vec::new(),
            events: Vec::new(),
            queue: None,
        }
    }

    #[test]
    fn what_a_pass_leaves_holds_its_writes_over_what_it_was_given() {
        let given = vec![job(Some(10), 0, JobStatus::Assigned), job(Some(11), 1, JobStatus::Running)];
        let granted = vec![allocation(20, Some(OP)), allocation(21, Some(OP))];
        let mut out = output(None);
        out.updated_jobs = vec![job(Some(10), 0, JobStatus::Running)];
        out.new_jobs = vec![job(None, 2, JobStatus::Pending)];
        // Allocation 21 released, 22 granted from the free ones, 23 granted to another operation meanwhile (never
        // one of this operation's writes, but it must not count as held).
        out.allocations = vec![allocation(21, None), allocation(22, Some(OP)), allocation(23, Some(RowId(2)))];
        let last = LastPass::after(LockToken(7), OP, given, granted, &out);
        let statuses: Vec<_> = last.jobs.iter().map(|j| (j.row, j.status)).collect();
        assert_eq!(statuses, [(Some(RowId(10)), JobStatus::Running), (Some(RowId(11)), JobStatus::Running)]);
        let held: Vec<RowId> = last.allocations.iter().map(|a| a.row).collect();
        assert_eq!(held, [RowId(20), RowId(22)]);
        assert_eq!((last.rows_after(None), last.first_job()), (Some(RowId(11)), Some(RowId(10))));
        // The next pass: the store gave the inserted job row 30.
        let jobs = last.into_jobs(&[RowId(30)]).expect("one row inserted, one row found");
        assert_eq!(jobs.last().map(|j| (j.row, j.data.id.index)), Some((Some(RowId(30)), 2)));
    }

    #[test]
    fn a_restart_leaves_only_the_jobs_it_inserts_and_another_count_of_rows_is_not_trusted() {
        let given = vec![job(Some(10), 0, JobStatus::Running)];
        // A gang restart: the job read is aborted, a new one inserted, and the rows after 10 are the new ones.
        let mut out = output(Some(RowId(10)));
        out.updated_jobs = vec![job(Some(10), 0, JobStatus::Aborted)];
        out.new_jobs = vec![job(None, 1, JobStatus::Pending)];
        let last = LastPass::after(LockToken(7), OP, given, Vec::new(), &out);
        assert!(last.jobs.is_empty(), "the finished incarnation's job was kept: {:?}", last.jobs);
        assert_eq!((last.rows_after(Some(RowId(10))), last.first_job()), (Some(RowId(10)), None));
        assert!(LastPass::after(LockToken(7), OP, vec![], vec![], &out).into_jobs(&[]).is_none());
        assert!(last.into_jobs(&[RowId(12), RowId(13)]).is_none(), "two rows where one was inserted");
    }
}
