//! What a replica's last pass over an operation left: the operation's jobs and the allocations granted
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
    /// The state after the pass under lease `token` that wrote `output`: what it left ([`PassOutput::left`], taken
    /// out of `output`; the pass handed it back rather than this merging its writes into what it was given) and the
    /// jobs its apply inserts.
    pub(crate) fn after(token: LockToken, output: &mut PassOutput) -> LastPass {
        let left = std::mem::take(&mut output.left);
        LastPass { token, jobs: left.jobs, inserted: output.new_jobs.clone(), allocations: left.allocations }
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
    use crate::gang::controller::{PassLeft, PassOutput};
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
            left: PassLeft::default(),
        }
    }

    #[test]
    fn what_a_pass_leaves_is_what_it_handed_back_and_the_jobs_it_inserts() {
        let mut out = output(None);
        out.left.jobs = vec![job(Some(10), 0, JobStatus::Running), job(Some(11), 1, JobStatus::Running)];
        out.left.allocations = vec![allocation(20, Some(OP)), allocation(22, Some(OP))];
        out.new_jobs = vec![job(None, 2, JobStatus::Pending)];
        let last = LastPass::after(LockToken(7), &mut out);
        assert_eq!(out.left, PassLeft::default(), "taken out of the output");
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
        // A gang restart: the job read is aborted, a new one inserted, and the rows after 10 are the new ones.
        let mut out = output(Some(RowId(10)));
        out.updated_jobs = vec![job(Some(10), 0, JobStatus::Aborted)];
        out.new_jobs = vec![job(None, 1, JobStatus::Pending)];
        let last = LastPass::after(LockToken(7), &mut out);
        assert!(last.jobs.is_empty(), "the finished incarnation's job was kept: {:?}", last.jobs);
        assert_eq!((last.rows_after(Some(RowId(10))), last.first_job()), (Some(RowId(10)), None));
        assert!(LastPass::after(LockToken(7), &mut out).into_jobs(&[]).is_none(), "no row where one was inserted");
        assert!(last.into_jobs(&[RowId(12), RowId(13)]).is_none(), "two rows where one was inserted");
    }
}
