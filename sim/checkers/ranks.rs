//! The gang checkers that follow gang ranks through the executors' process log (DESIGN §4, §5), where
//! `allocation_exclusivity` looks at one allocation at a time:
//!
//! - [`rank_exclusivity`]: no two processes of one (operation, task, gang rank) run at once, whatever their
//!   incarnations and allocations, except for the blink of a frozen process waking up (a process frozen with its
//!   paused node does not run; one that resumes and is killed at once by its fencing agent is forgiven, whichever
//!   of the pair it is). A process fenced late (its agent's clock ran slower than the margin rule of DESIGN §2
//!   allows) still running on one node while the next incarnation's process of its rank runs on another is the
//!   bug it catches: two peers of one rank talking to one gang.
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

/// One stretch of time in which a ranked process ran: from its start, or a resume of its node, to its end, or a
/// pause of its node. Its ends are positions in the process log, so that two events of one instant keep their order.
struct Stretch<'a> {
    /// The event that began it (a start or a resume).
    begin: &'a ProcessEvent,
    /// Its position in the log.
    from: usize,
    /// The position of the event that ended it; `usize::MAX` while it runs at the end of the log.
    to: usize,
    /// A wake-up blink: it began with a resume and ended (a kill, or an exit) within [`RESUME_FENCE_GRACE`].
    blink: bool,
}

/// Every point of `events` (the process log, in order) where a process starts, or resumes, while another process
/// of the same (operation, task, gang rank) runs, as a sentence naming both jobs, incarnations, nodes and
/// allocations. Times are offsets from the log's first event. Processes of jobs without a rank are not followed.
///
/// The promise judged is the one a system can keep (DESIGN §4, One process per rank): no two processes of one
/// rank run at once, except for the blink of a frozen process waking up. A process frozen with its paused node
/// (a frozen VM) does not run, and no one can kill it; it resumes at the same instant as its agent, and runs until
/// the agent, its lease's local deadline past, fences (at once: before any store call). So a stretch that begins
/// with a resume and ends in a kill (or an exit: its time ran out while it was frozen) within
/// [`RESUME_FENCE_GRACE`] does not count, whichever process of the pair it is: the one that resumes beside a
/// running successor, or one that resumes at the heal just before its successor, paused too, resumes beside it.
/// A resumed process that lives on does count. Peers guard against the blink with a fencing token
/// (`YT_OPERATION_INCARNATION`); self-fencing cannot.
pub fn rank_exclusivity(events: &[ProcessEvent]) -> Vec<String> {
    let origin = events.first().map(|e| e.at);
    let mut stretches: BTreeMap<RankKey<'_>, Vec<Stretch<'_>>> = BTreeMap::new();
    // The stretch each running process is in, by job: its rank and its index in `stretches`.
    let mut open: BTreeMap<JobId, (RankKey<'_>, usize)> = BTreeMap::new();
    for (position, event) in events.iter().enumerate() {
        let Some(rank) = event.gang_rank else { continue };
        let key = (event.job.operation, event.task.as_str(), rank);
        match event.kind {
            ProcessEventKind::Started | ProcessEventKind::Resumed => {
                if open.contains_key(&event.job) {
                    continue;
                }
                let list = stretches.entry(key).or_default();
                open.insert(event.job, (key, list.len()));
                list.push(Stretch { begin: event, from: position, to: usize::MAX, blink: false });
            }
            ProcessEventKind::Paused | ProcessEventKind::Exited(_) | ProcessEventKind::Killed => {
                let Some((key, index)) = open.remove(&event.job) else { continue };
                let stretch = &mut stretches.get_mut(&key).expect("an open stretch is listed")[index];
                stretch.to = position;
                stretch.blink = stretch.begin.kind == ProcessEventKind::Resumed
                    && event.kind != ProcessEventKind::Paused
                    && event.at <= stretch.begin.at + RESUME_FENCE_GRACE;
            }
            ProcessEventKind::StartFailed => {}
        }
    }
    let mut violations = Vec::new();
    for list in stretches.values() {
        let counted: Vec<&Stretch<'_>> = list.iter().filter(|s| !s.blink).collect();
        for stretch in &counted {
            let event = stretch.begin;
            let what = if event.kind == ProcessEventKind::Started { "starts" } else { "resumes" };
            let beside = counted
                .iter()
                .filter(|other| other.begin.job != event.job && other.from < stretch.from && stretch.from < other.to);
            violations.extend(beside.map(|other| (stretch.from, overlap(origin, what, event, other.begin))));
        }
    }
    violations.sort();
    violations.into_iter().map(|(_, sentence)| sentence).collect()
}

/// "job X starts (or resumes) … while job Y runs …", for [`rank_exclusivity`].
fn overlap(origin: Option<Instant>, what: &str, event: &ProcessEvent, other: &ProcessEvent) -> String {
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

    #[test]
    fn a_frozen_process_killed_as_it_wakes_beside_its_successor_waking_too_runs_beside_no_one() {
        let t = Instant::now();
        let s = Duration::from_secs;
        // The old rank 0 freezes with agent-40; its successor starts on agent-41, which freezes too; at the heal
        // both wake at one instant, the old one first in the log, and agent-40 fences at once: the successor
        // resumes beside a process that is being killed as it wakes, a blink no system can avoid.
        let both_wake = [
            event(t, 0, 0, 0, 40, ProcessEventKind::Started),
            event(t + s(2), 0, 0, 0, 40, ProcessEventKind::Paused),
            event(t + s(12), 3, 1, 0, 41, ProcessEventKind::Started),
            event(t + s(14), 3, 1, 0, 41, ProcessEventKind::Paused),
            event(t + s(15), 0, 0, 0, 40, ProcessEventKind::Resumed),
            event(t + s(15), 3, 1, 0, 41, ProcessEventKind::Resumed),
            event(t + s(15), 0, 0, 0, 40, ProcessEventKind::Killed),
            event(t + s(30), 3, 1, 0, 41, ProcessEventKind::Exited(0)),
        ];
        assert!(rank_exclusivity(&both_wake).is_empty(), "{:?}", rank_exclusivity(&both_wake));
        // Planted: the old one lives on for a second after both woke; the successor resumed beside it.
        let mut late = both_wake.clone();
        late[6].at = t + s(16);
        let found = rank_exclusivity(&late);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "operation 7 task w rank 0: job 7-3 (incarnation 7-i1) resumes on agent-41 in allocation 41.1 at 15s \
                 while job 7-0 (incarnation 7-i0) runs on agent-40"
            ),
            "{found:?}"
        );
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
