//! The gang checkers that follow gang ranks through the executors' process log (DESIGN §4, §5), where
//! `allocation_exclusivity` looks at one allocation at a time:
//!
//! - [`rank_exclusivity`]: no two processes of one (operation, task, gang rank) run at once, whatever their
//!   incarnations and allocations (a process frozen with its paused node does not run). A process fenced late (its agent's clock ran slower than the margin rule of
//!   DESIGN §2 allows) still running on one node while the next incarnation's process of its rank runs on another
//!   is the bug it catches: two peers of one rank talking to one gang.
//! - [`ranks_together`]: for an operation placed all-or-nothing, the ranks of one incarnation start together.
//!   Precisely: take each (task, rank)'s *original* job of the incarnation (the one the incarnation created: the
//!   lowest job index; a job restarted alone later replaces it) and that job's process start, if it started; all
//!   those starts lie within `start_skew_max` of each other. The controller places them in one pass, and a live
//!   agent starts a job placed in its node within its node lease ttl plus a poll (past its lease's local deadline
//!   it fences, and its next session never starts a job placed under the old one), so the bound holds for any
//!   fault within the margin rule; a job whose agent died before starting it never starts, and is left out.
//!   Placement in waves (the incremental behaviour, or a broken gate) starts a rank only once an allocation
//!   frees up, a job's duration later.

use crate::agent::{ProcessEvent, ProcessEventKind};
use crate::gang::api::OperationView;
use crate::gang::model::JobId;
use crate::gang::placement::GangPlacement;
use crate::store::RowId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// One gang rank of one task of one operation.
type RankKey<'a> = (RowId, &'a str, u32);

/// How soon after its node resumes a process must be killed for [`rank_exclusivity`] to forgive the moment it ran:
/// a few task switches of simulated time (a resumed agent whose lease's deadline passed fences before any store
/// call; 1 µs was measured).
pub const RESUME_FENCE_GRACE: Duration = Duration::from_millis(50);

/// Every point of `events` (the process log, in order) where a process starts, or resumes, while another process
/// of the same (operation, task, gang rank) runs, as a sentence naming both jobs, incarnations, nodes and
/// allocations. A process frozen with its paused node does not run (it talks to no peer); one that resumes and is
/// killed (or exits, its time having run out while it was frozen) within [`RESUME_FENCE_GRACE`], as a resumed agent fences at once when its lease's deadline passed
/// meanwhile, is not counted either: a paused machine's processes always run for the moment its agent takes to
/// wake (fencing tokens at the peers, such as `YT_OPERATION_INCARNATION`, cover that; self-fencing cannot). Processes of jobs without a rank are not followed. Times are offsets from the log's first
/// event.
pub fn rank_exclusivity(events: &[ProcessEvent]) -> Vec<String> {
    let grace = RESUME_FENCE_GRACE;
    let origin = events.first().map(|e| e.at);
    // Per rank, the processes started and not ended, each with whether it is frozen.
    let mut live: BTreeMap<RankKey<'_>, Vec<(&ProcessEvent, bool)>> = BTreeMap::new();
    // Resumed processes that resumed beside a running one: a violation unless they end at the same instant.
    let mut resumed: BTreeMap<JobId, (Instant, Vec<String>)> = BTreeMap::new();
    let mut violations = Vec::new();
    let overlap = |what: &str, event: &ProcessEvent, other: &ProcessEvent| {
        format!(
            "operation {} task {} rank {}: job {} (incarnation {}) {what} on {} in allocation {} at {} while job {} \
             (incarnation {}) runs on {} in allocation {}",
            event.job.operation,
            event.task,
            event.gang_rank.unwrap_or_default(),
            event.job,
            event.incarnation,
            event.node,
            event.allocation,
            crate::duration::format(offset(origin, event.at)),
            other.job,
            other.incarnation,
            other.node,
            other.allocation
        )
    };
    for event in events {
        let Some(rank) = event.gang_rank else { continue };
        if let Some((at, found)) = resumed.remove(&event.job) {
            // Killed by its fencing agent, or ended by itself (its time ran out while it was frozen).
            let ended = matches!(event.kind, ProcessEventKind::Killed | ProcessEventKind::Exited(_));
            let killed_at_once = event.at <= at + grace && ended;
            if !killed_at_once {
                violations.extend(found);
            }
        }
        let processes = live.entry((event.job.operation, event.task.as_str(), rank)).or_default();
        let running: Vec<&ProcessEvent> =
            processes.iter().filter(|(p, frozen)| !frozen && p.job != event.job).map(|(p, _)| *p).collect();
        match event.kind {
            ProcessEventKind::Started => {
                violations.extend(running.into_iter().map(|other| overlap("starts", event, other)));
                processes.push((event, false));
            }
            ProcessEventKind::Paused | ProcessEventKind::Resumed => {
                let frozen = event.kind == ProcessEventKind::Paused;
                if !frozen {
                    let found: Vec<String> =
                        running.into_iter().map(|other| overlap("resumes", event, other)).collect();
                    if !found.is_empty() {
                        resumed.insert(event.job, (event.at, found));
                    }
                }
                for (_, state) in processes.iter_mut().filter(|(p, _)| p.job == event.job) {
                    *state = frozen;
                }
            }
            ProcessEventKind::StartFailed => {}
            ProcessEventKind::Exited(_) | ProcessEventKind::Killed => processes.retain(|(p, _)| p.job != event.job),
        }
    }
    violations.extend(resumed.into_values().flat_map(|(_, found)| found));
    violations
}

/// For every operation of `views` placed all-or-nothing and each of its incarnations, the original jobs of the
/// ranks whose processes started more than `start_skew_max` apart (see the module docs), as a sentence naming the
/// first and the last of them.
pub fn ranks_together(views: &[OperationView], events: &[ProcessEvent], start_skew_max: Duration) -> Vec<String> {
    let mut violations = Vec::new();
    let mut first_start: BTreeMap<JobId, Instant> = BTreeMap::new();
    for event in events.iter().filter(|e| e.kind == ProcessEventKind::Started) {
        first_start.entry(event.job).or_insert(event.at);
    }
    for view in views.iter().filter(|v| v.data.placement == Some(GangPlacement::AllOrNothing)) {
        // The original job of each (incarnation, task, rank): the lowest job index.
        let mut originals: BTreeMap<(u32, &str, u32), JobId> = BTreeMap::new();
        for job in &view.jobs {
            let Some(rank) = job.data.gang_rank else { continue };
            let key = (job.data.incarnation, job.data.task.as_str(), rank);
            let id = originals.entry(key).or_insert(job.data.id);
            *id = (*id).min(job.data.id);
        }
        let incarnations: BTreeSet<u32> = originals.keys().map(|(incarnation, _, _)| *incarnation).collect();
        for incarnation in incarnations {
            let mut starts: Vec<(Instant, &str, u32, JobId)> = originals
                .iter()
                .filter(|((inc, _, _), _)| *inc == incarnation)
                .filter_map(|((_, task, rank), job)| first_start.get(job).map(|at| (*at, *task, *rank, *job)))
                .collect();
            starts.sort();
            let (Some(first), Some(last)) = (starts.first(), starts.last()) else { continue };
            let spread = last.0 - first.0;
            if spread > start_skew_max {
                violations.push(format!(
                    "operation {} incarnation {incarnation}: rank {}/{} (job {}) started {} after rank {}/{} \
                     (job {}), more than {}: its ranks were not placed together",
                    view.id,
                    last.1,
                    last.2,
                    last.3,
                    crate::duration::format(spread),
                    first.1,
                    first.2,
                    first.3,
                    crate::duration::format(start_skew_max)
                ));
            }
        }
    }
    violations
}

fn offset(origin: Option<Instant>, at: Instant) -> Duration {
    origin.map_or(Duration::ZERO, |origin| at.saturating_duration_since(origin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::model::{AllocationRef, Job, JobData, JobStatus, OperationData, OperationStatus};
    use crate::gang::{OperationSpec, SpecFormat};

    fn event(at: Instant, job: u64, incarnation: u32, rank: u32, row: i64, kind: ProcessEventKind) -> ProcessEvent {
        ProcessEvent {
            at,
            node: format!("agent-{row}"),
            allocation: AllocationRef { row: RowId(row), generation: 1 },
            job: JobId { operation: RowId(7), index: job },
            incarnation: format!("7-i{incarnation}"),
            task: "w".into(),
            gang_rank: Some(rank),
            kind,
        }
    }

    #[test]
    fn a_rank_fenced_late_beside_its_next_incarnation_breaks_rank_exclusivity() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let clean = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(5), 0, 0, 0, 40, ProcessEventKind::Killed),
            event(t + s(6), 3, 1, 0, 41, ProcessEventKind::Started),
            event(t + s(6), 4, 1, 1, 40, ProcessEventKind::Started),
        ];
        assert!(rank_exclusivity(&clean).is_empty(), "{:?}", rank_exclusivity(&clean));
        // Planted: the old rank 0 on agent-40 is killed only after the new rank 0 started on agent-41.
        let late = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(6), 3, 1, 0, 41, ProcessEventKind::Started),
            event(t + s(9), 0, 0, 0, 40, ProcessEventKind::Killed),
        ];
        let found = rank_exclusivity(&late);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "operation 7 task w rank 0: job 7-3 (incarnation 7-i1) starts on agent-41 in allocation 41.1 at 6s \
                 while job 7-0 (incarnation 7-i0) runs on agent-40 in allocation 40.1"
            ),
            "{found:?}"
        );
    }

    #[test]
    fn a_frozen_process_runs_beside_no_one_unless_it_resumes_and_lives_on() {
        let t = Instant::now();
        let s = Duration::from_secs;
        // The old rank 0 freezes with its node; the new one starts elsewhere; the old one resumes and is killed at
        // that instant (its agent fences at once): no overlap.
        let fenced_at_once = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(2), 0, 0, 0, 40, ProcessEventKind::Paused),
            event(t + s(6), 3, 1, 0, 41, ProcessEventKind::Started),
            event(t + s(9), 0, 0, 0, 40, ProcessEventKind::Resumed),
            event(t + s(9), 0, 0, 0, 40, ProcessEventKind::Killed),
        ];
        assert!(rank_exclusivity(&fenced_at_once).is_empty(), "{:?}", rank_exclusivity(&fenced_at_once));
        // Planted: it resumes and runs on for a second beside its successor.
        let mut late = fenced_at_once.clone();
        late[4].at = t + s(10);
        let mut soon = fenced_at_once.clone();
        soon[4].at = t + s(9) + Duration::from_millis(1);
        assert!(rank_exclusivity(&soon).is_empty(), "a kill 1 ms after the resume is the agent fencing at once");
        soon[4].kind = ProcessEventKind::Exited(0);
        assert!(rank_exclusivity(&soon).is_empty(), "its time ran out while it was frozen: it ends on waking");
        let found = rank_exclusivity(&late);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("job 7-0 (incarnation 7-i0) resumes on agent-40"), "{found:?}");
        // And one that resumes and is never killed is caught at the end of the log.
        let found = rank_exclusivity(&late[..4]);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    fn view(placement: Option<GangPlacement>, jobs: &[(u64, u32, u32)]) -> OperationView {
        let spec = OperationSpec::parse("{tasks={w={job_count=2;command=w;gang_options={}}}}", SpecFormat::Yson);
        let mut data = OperationData::new(spec.unwrap());
        data.placement = placement;
        let jobs = jobs
            .iter()
            .map(|&(index, incarnation, rank)| Job {
                row: Some(RowId(100 + index as i64)),
                status: JobStatus::Completed,
                data: JobData {
                    id: JobId { operation: RowId(7), index },
                    task: "w".into(),
                    job_cookie: rank,
                    gang_rank: Some(rank),
                    reserved: false,
                    incarnation,
                    allocation: None,
                    monitoring_descriptor: None,
                    exit_code: Some(0),
                    reason: None,
                }
                .into(),
            })
            .collect();
        OperationView { id: RowId(7), status: OperationStatus::Completed, data, jobs, events: Vec::new() }
    }

    #[test]
    fn ranks_of_an_all_or_nothing_incarnation_starting_a_job_duration_apart_are_not_together() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let skew = s(12);
        let all = view(Some(GangPlacement::AllOrNothing), &[(0, 0, 0), (1, 0, 1), (2, 0, 1)]);
        let together = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(1), 1, 0, 1, 41, ProcessEventKind::Started),
            event(t + s(3), 1, 0, 1, 41, ProcessEventKind::Exited(1)),
            // Rank 1 restarted alone (job 2) long after: not an original, not judged.
            event(t + s(40), 2, 0, 1, 41, ProcessEventKind::Started),
        ];
        assert!(ranks_together(std::slice::from_ref(&all), &together, skew).is_empty());
        // Planted: rank 1 (job 1) starts only after rank 0 ran its whole 20 s (placed in waves).
        let waves = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(20), 0, 0, 0, 40, ProcessEventKind::Exited(0)),
            event(t + s(21), 1, 0, 1, 40, ProcessEventKind::Started),
        ];
        let found = ranks_together(&[all], &waves, skew);
        assert_eq!(
            found,
            ["operation 7 incarnation 0: rank w/1 (job 7-1) started 21s after rank w/0 (job 7-0), more than 12s: its \
              ranks were not placed together"]
        );
        let incremental = view(Some(GangPlacement::Incremental), &[(0, 0, 0), (1, 0, 1)]);
        assert!(ranks_together(&[incremental], &waves, skew).is_empty(), "incremental gangs start in waves");
    }
}
