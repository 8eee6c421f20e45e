//! The controller's rules (DESIGN §4) on the pure pass, one test per rule, with the test agent of `gang_support`.

use crate::gang_support;

use gang_support::{OP, World};
use lockstep::gang::controller::REASON_INCARNATION_CHANGED;
use lockstep::gang::model::{JobOutcome, JobStatus, Message, OperationStatus, incarnation_id};
use std::collections::BTreeSet;

const GANG3: &str = "{tasks={worker={job_count=3;command=w;gang_options={}}}}";

fn aborted(reason: &str) -> JobOutcome {
    JobOutcome::Aborted { reason: reason.into() }
}

/// A running world: every job started.
fn running(spec: &str, nodes: usize, slots: u32) -> World {
    let mut world = World::new(spec, nodes, slots);
    world.pass();
    world.start_assigned();
    assert_eq!(world.status, OperationStatus::Running);
    world
}

#[test]
fn a_gang_starts_with_incarnation_zero_and_ranks_equal_to_cookies() {
    let world = running(GANG3, 4, 1);
    let switches = world.switches();
    assert_eq!(switches.len(), 1);
    assert_eq!(switches[0]["reason"], "operation_started");
    assert_eq!(switches[0]["incarnation"], incarnation_id(OP, 0));
    for cookie in 0..3 {
        let job = world.live("worker", cookie);
        assert_eq!(job.status, JobStatus::Running);
        assert_eq!(job.data.gang_rank, Some(cookie));
        assert!(!job.data.reserved);
        assert!(job.data.monitoring_descriptor.is_some());
    }
}

#[test]
fn one_aborted_job_of_a_three_job_gang_switches_once_and_reuses_two_allocations() {
    let mut world = running(GANG3, 4, 1);
    let before: Vec<_> = (0..3).map(|c| world.live("worker", c).clone()).collect();
    let trigger = world.end("worker", 1, aborted("preempted"));

    let switches = world.switches();
    assert_eq!(switches.len(), 2, "one switch after the start");
    assert_eq!(switches[1]["reason"], "job_aborted");
    assert_eq!(switches[1]["trigger"]["job"], trigger.to_string());
    assert_eq!(switches[1]["trigger"]["gang_rank"], 1);
    assert_eq!(world.data.incarnation, 1);
    let by_switch = world.job_events("aborted", Some(REASON_INCARNATION_CHANGED));
    assert_eq!(by_switch.len(), 2, "the other two jobs are aborted by the switch");
    assert_eq!(world.job(trigger).status, JobStatus::Aborted);
    assert_eq!(world.job(trigger).data.reason.as_deref(), Some("preempted"));

    for cookie in [0, 2] {
        let new = world.live("worker", cookie);
        let old = &before[cookie as usize];
        assert_eq!(new.data.incarnation, 1);
        assert_eq!(new.data.allocation, old.data.allocation, "allocation of cookie {cookie} reused");
        assert_eq!(new.data.gang_rank, old.data.gang_rank);
        assert_eq!(new.data.monitoring_descriptor, old.data.monitoring_descriptor);
        assert_eq!(new.status, JobStatus::Assigned);
    }
    let replacement = world.live("worker", 1);
    assert_eq!(replacement.data.gang_rank, Some(1));
    assert_ne!(replacement.data.allocation, before[1].data.allocation, "the trigger's allocation is not reused");
    assert_ne!(replacement.data.allocation.unwrap().row, before[1].data.allocation.unwrap().row);
    assert_eq!(world.data.failed_job_count, 0, "aborts do not count as failures");
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn a_completed_ranked_job_triggers_nothing_and_reruns_at_the_next_switch() {
    let mut world = running(GANG3, 4, 1);
    let done = world.exit("worker", 0, 0);
    assert_eq!(world.switches().len(), 1, "a completion is no trigger");
    assert_eq!(world.job(done).status, JobStatus::Completed);
    let allocation = world.job(done).data.allocation;
    world.exit("worker", 2, 3);
    assert_eq!(world.switches().len(), 2);
    let rerun = world.live("worker", 0);
    assert_eq!(rerun.data.incarnation, 1, "the completed cookie runs again");
    assert_eq!(rerun.data.allocation, allocation, "in its allocation, kept while idle");
    assert_eq!(world.data.failed_job_count, 1, "only the trigger counts");
}

#[test]
fn a_failure_with_max_failed_job_count_two_restarts_once_then_fails_the_operation() {
    let spec = "{tasks={worker={job_count=3;command=w;gang_options={}}};max_failed_job_count=2}";
    let mut world = running(spec, 4, 1);
    world.exit("worker", 1, 1);
    assert_eq!(world.data.failed_job_count, 1);
    assert_eq!(world.switches().len(), 2);
    assert_eq!(world.switches()[1]["reason"], "job_failed");
    assert_eq!(world.status, OperationStatus::Running);

    world.start_assigned();
    world.exit("worker", 2, 1);
    assert_eq!(world.data.failed_job_count, 2);
    assert_eq!(world.status, OperationStatus::Failed);
    assert_eq!(world.switches().len(), 2, "a failing operation does not restart the gang");
    assert!(world.data.result.as_deref().unwrap().contains("max_failed_job_count 2"));
    assert!(world.jobs.iter().all(|j| j.is_terminal()));
}

#[test]
fn size_two_of_three_gives_ranks_zero_and_one_and_a_reserved_job_whose_abort_switches_nothing() {
    let spec = "{tasks={worker={job_count=3;command=w;gang_options={size=2}}}}";
    let mut world = running(spec, 4, 1);
    let ranks: BTreeSet<Option<u32>> = (0..3).map(|c| world.live("worker", c).data.gang_rank).collect();
    assert_eq!(ranks, BTreeSet::from([Some(0), Some(1), None]));
    let reserved = world.live("worker", 2).clone();
    assert!(reserved.data.reserved);
    assert!(!world.live("worker", 0).data.reserved);

    world.end("worker", 2, aborted("preempted"));
    assert_eq!(world.switches().len(), 1, "a reserved job triggers no switch");
    assert_eq!(world.data.incarnation, 0);
    let again = world.live("worker", 2);
    assert_ne!(again.data.id, reserved.data.id, "the reserved job restarts alone");
    assert_eq!(again.data.gang_rank, None);
    assert!(again.data.reserved);
    assert_eq!(world.live("worker", 0).status, JobStatus::Running, "ranked jobs untouched");
}

#[test]
fn a_reserved_allocation_takes_the_freed_rank_and_keeps_its_cookie_and_descriptor() {
    let spec = "{tasks={worker={job_count=3;command=w;gang_options={size=2}}}}";
    let mut world = running(spec, 4, 1);
    let reserved = world.live("worker", 2).clone();
    let trigger = world.live("worker", 0).clone();
    world.exit("worker", 0, 9);
    let promoted = world.live("worker", 2);
    assert_eq!(promoted.data.allocation, reserved.data.allocation);
    assert_eq!(promoted.data.gang_rank, Some(0), "takes the trigger's rank");
    assert_eq!(promoted.data.monitoring_descriptor, reserved.data.monitoring_descriptor);
    assert!(!promoted.data.reserved);
    let demoted = world.live("worker", 0);
    assert_eq!(demoted.data.gang_rank, None, "the trigger's cookie becomes reserved");
    assert!(demoted.data.reserved);
    assert_ne!(demoted.data.allocation, trigger.data.allocation);
    assert_eq!(world.live("worker", 1).data.gang_rank, Some(1));
}

#[test]
fn three_consecutive_switches_give_three_distinct_incarnations() {
    let mut world = running(GANG3, 6, 1);
    for (round, cookie) in [0, 1, 2].into_iter().enumerate() {
        world.end("worker", cookie, aborted("node drained"));
        world.start_assigned();
        assert_eq!(world.data.incarnation as usize, round + 1);
    }
    let ids: BTreeSet<String> =
        world.switches().iter().map(|e| e["incarnation"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 4, "start plus three switches, all distinct: {ids:?}");
    for index in 0..=3 {
        let jobs = world.incarnation(index);
        let ranks: BTreeSet<u32> = jobs.iter().filter_map(|j| j.data.gang_rank).collect();
        assert_eq!(ranks, BTreeSet::from([0, 1, 2]), "each incarnation has each rank once");
        assert_eq!(jobs.len(), 3);
    }
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn the_seed_master_slave_example_completes_with_fewer_slots_than_jobs() {
    let spec = include_str!("../scenarios/specs/seed-master-slave.yson");
    let mut world = World::new(spec, 5, 8);
    world.pass();
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
    let completed = world.jobs.iter().filter(|j| j.status == JobStatus::Completed).count();
    assert_eq!(completed, 101);
    assert!(world.switches().len() == 1, "a plain operation has one incarnation");
}

#[test]
fn the_seed_master_slave_example_fails_on_its_first_failed_job() {
    let spec = "{tasks={master={job_count=1;command=m};slave={job_count=100;command=s}};max_failed_job_count=1}";
    let mut world = running(spec, 11, 10);
    world.exit("slave", 42, 2);
    assert_eq!(world.status, OperationStatus::Failed);
}

#[test]
fn revival_with_a_missing_ranked_job_restarts_without_reusing_allocations() {
    let mut world = running(GANG3, 6, 1);
    let old: BTreeSet<_> = (0..3).map(|c| world.live("worker", c).data.allocation.unwrap()).collect();
    world.lose_node_of("worker", 1);
    world.revival_next = true;
    world.pass();
    let switches = world.switches();
    assert_eq!(switches.len(), 2);
    assert_eq!(switches[1]["reason"], "lack_after_revival");
    assert_eq!(switches[1]["trigger"]["gang_rank"], 1);
    assert_eq!(world.data.incarnation, 1);
    // Ranks 0 and 2 ran on live nodes, whose allocations are not reused: until their agents report the old
    // processes killed, those ranks are placed nowhere else (two processes of one rank would run at once).
    assert_eq!(world.live("worker", 1).status, JobStatus::Assigned, "rank 1's old process died with its node");
    for cookie in [0, 2] {
        assert_eq!(world.live("worker", cookie).status, JobStatus::Pending, "cookie {cookie} waits for the kill");
    }
    assert_eq!(world.data.lingering.len(), 2);
    world.report_stale_kills();
    world.pass();
    assert!(world.data.lingering.is_empty());
    for cookie in 0..3 {
        let job = world.live("worker", cookie);
        assert!(!old.contains(&job.data.allocation.unwrap()), "cookie {cookie} got a fresh allocation");
    }
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn an_aborted_rank_whose_start_was_never_reported_moves_on_its_agents_report_never_on_a_renewal_alone() {
    // Revival again, but the jobs were only assigned: no start was reported, yet the agent may have started one
    // (its report not inserted yet) and still run it after a renewal (its allocation listing failed after a
    // successful heartbeat). The allocation stays held, idle, marked with the job, until the agent reports
    // the job's end: it kills a process it runs, or reports that it runs none.
    let mut world = World::new(GANG3, 6, 1);
    world.pass();
    world.lose_node_of("worker", 1);
    world.revival_next = true;
    world.pass();
    assert_eq!(world.live("worker", 0).status, JobStatus::Pending);
    let lingering = world.data.lingering.iter().find(|l| l.gang_rank == 0).expect("rank 0 lingers").clone();
    let held = &world.allocations[&lingering.allocation];
    assert!(held.allocated && held.data.job.is_none(), "kept, idle, for the agent to see: {held:?}");
    assert_eq!(held.data.lingering, Some(lingering.job), "marked with the job whose end the agent reports");
    // Its node renews its lease meanwhile (a pass reads no lease expiry: a renewal is no evidence that it is dead).
    world.pass();
    world.pass();
    assert_eq!(world.live("worker", 0).status, JobStatus::Pending, "no report, no move");
    world.report_stale_kills();
    world.pass();
    assert!(world.data.lingering.is_empty());
    assert_eq!(world.live("worker", 0).status, JobStatus::Assigned);
    let rank0 = world.live("worker", 0).data.allocation.unwrap();
    let kept = world.jobs.iter().find(|j| j.data.id == lingering.job).unwrap().data.allocation.unwrap();
    assert_ne!(rank0, kept, "the kept grant was released once answered, not reused (a revival reuses nothing)");
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn a_restart_reusing_a_ranks_allocation_needs_no_kill_report() {
    // The agent kills the old process before it starts the new one in the same allocation.
    let mut world = running(GANG3, 4, 1);
    world.end("worker", 1, aborted("preempted"));
    assert!(world.data.lingering.is_empty(), "{:?}", world.data.lingering);
    for cookie in 0..3 {
        assert_eq!(world.live("worker", cookie).status, JobStatus::Assigned);
    }
}

#[test]
fn revival_with_every_ranked_job_alive_changes_nothing() {
    let mut world = running(GANG3, 4, 1);
    world.revival_next = true;
    world.pass();
    assert_eq!(world.switches().len(), 1);
}

#[test]
fn a_lost_node_aborts_its_job_which_restarts_the_gang_with_reuse() {
    let mut world = running(GANG3, 4, 1);
    let kept = world.live("worker", 0).data.allocation;
    world.lose_node_of("worker", 2);
    world.pass();
    let switches = world.switches();
    assert_eq!(switches.len(), 2);
    assert_eq!(switches[1]["reason"], "job_aborted");
    assert_eq!(switches[1]["trigger"]["reason"], "node lost");
    assert_eq!(world.live("worker", 0).data.allocation, kept);
}

#[test]
fn ranked_jobs_get_allocations_before_rankless_ones() {
    let spec = "{tasks={a_plain={job_count=2;command=p};b_gang={job_count=3;command=g;gang_options={size=2}}}}";
    let mut world = World::new(spec, 2, 1);
    world.pass();
    let placed: Vec<_> = world.jobs.iter().filter(|j| j.status == JobStatus::Assigned).collect();
    assert_eq!(placed.len(), 2);
    assert!(placed.iter().all(|j| j.data.gang_rank.is_some()), "{placed:#?}");
}

#[test]
fn a_gang_completes_without_waiting_for_its_reserved_job() {
    let spec = "{tasks={worker={job_count=3;command=w;gang_options={size=2}}}}";
    let mut world = running(spec, 4, 1);
    let reserved = world.live("worker", 2).data.id;
    world.exit("worker", 0, 0);
    world.exit("worker", 1, 0);
    assert_eq!(world.status, OperationStatus::Completed);
    assert_eq!(world.job(reserved).status, JobStatus::Aborted);
    assert_eq!(world.job(reserved).data.reason.as_deref(), Some("operation completed"));
}

#[test]
fn plain_tasks_of_a_gang_operation_restart_with_the_gang_but_never_trigger_it() {
    let spec = "{tasks={trainer={job_count=2;command=t;gang_options={}};logger={job_count=2;command=l}}}";
    let mut world = running(spec, 6, 1);
    world.exit("logger", 0, 5);
    assert_eq!(world.switches().len(), 1, "a plain task's failure triggers nothing");
    assert_eq!(world.data.failed_job_count, 1);
    world.start_assigned();
    let done = world.exit("logger", 1, 0);
    let allocation = world.job(done).data.allocation;
    world.end("trainer", 0, aborted("preempted"));
    assert_eq!(world.switches().len(), 2);
    let rerun = world.live("logger", 1);
    assert_eq!(rerun.data.incarnation, 1, "the completed plain job reruns in the new incarnation");
    assert_eq!(rerun.data.allocation, allocation);
    assert_eq!(world.live("logger", 0).data.incarnation, 1);
}

#[test]
fn messages_about_older_incarnations_are_ignored() {
    let mut world = running(GANG3, 4, 1);
    let stale = world.live("worker", 0).clone();
    world.end("worker", 1, aborted("preempted"));
    world.send(Message::JobEnded {
        job: stale.data.id,
        allocation: stale.data.allocation.unwrap(),
        outcome: JobOutcome::Exited { code: 1 },
    });
    let output = world.pass();
    assert_eq!(output.consumed.len(), 1, "consumed");
    assert_eq!(world.data.failed_job_count, 0, "and ignored");
    assert_eq!(world.switches().len(), 2);
}

#[test]
fn an_abort_request_aborts_every_job_and_releases_every_allocation() {
    let mut world = running(GANG3, 4, 1);
    world.send(Message::Abort { reason: "user asked".into() });
    world.pass();
    assert_eq!(world.status, OperationStatus::Aborted);
    assert_eq!(world.data.result.as_deref(), Some("user asked"));
    assert_eq!(world.job_events("aborted", Some("operation aborted")).len(), 3);
    assert!(world.allocations.values().all(|a| !a.allocated));
}

#[test]
fn plain_vanilla_restarts_a_failed_job_alone_and_counts_it() {
    let mut world = running("{tasks={t={job_count=3;command=c}};max_failed_job_count=3}", 4, 1);
    let failed = world.exit("t", 1, 2);
    assert_eq!(world.data.failed_job_count, 1);
    let again = world.live("t", 1);
    assert_ne!(again.data.id, failed);
    assert_eq!(again.data.incarnation, 0);
    assert_eq!(world.live("t", 0).status, JobStatus::Running);
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn restart_completed_jobs_reruns_a_completed_cookie_in_its_allocation() {
    let mut world = running("{tasks={t={job_count=2;command=c;restart_completed_jobs=%true}}}", 3, 1);
    let first = world.live("t", 0).clone();
    world.exit("t", 0, 0);
    world.exit("t", 1, 0);
    assert_eq!(world.status, OperationStatus::Running, "a task rerunning completed jobs never completes alone");
    let rerun = world.live("t", 0);
    assert_ne!(rerun.data.id, first.data.id);
    assert_eq!(rerun.data.allocation, first.data.allocation);
}

#[test]
fn fail_on_job_restart_fails_the_operation_when_a_started_job_restarts() {
    let mut world = running("{tasks={t={job_count=2;command=c}};fail_on_job_restart=%true}", 3, 1);
    world.end("t", 0, aborted("preempted"));
    assert_eq!(world.status, OperationStatus::Failed);
    assert!(world.data.result.as_deref().unwrap().contains("fail_on_job_restart"));
}

#[test]
fn fail_on_job_restart_spares_a_job_that_never_started() {
    let mut world = World::new("{tasks={t={job_count=2;command=c}};fail_on_job_restart=%true}", 3, 1);
    world.pass();
    world.lose_node_of("t", 0);
    world.pass();
    assert_eq!(world.status, OperationStatus::Running);
    assert_eq!(world.live("t", 0).status, JobStatus::Assigned, "placed again on another node");
}

fn spec(text: &str) -> Box<lockstep::gang::OperationSpec> {
    Box::new(lockstep::gang::OperationSpec::parse(text, lockstep::gang::SpecFormat::Yson).unwrap())
}

#[test]
fn a_spec_update_grows_and_shrinks_a_plain_task() {
    let mut world = running("{tasks={t={job_count=3;command=c}}}", 6, 1);
    world.send(Message::UpdateSpec { spec: spec("{tasks={t={job_count=5;command=c}}}") });
    world.pass();
    assert_eq!(world.data.spec.tasks["t"].job_count, 5);
    for cookie in 3..5 {
        assert_eq!(world.live("t", cookie).status, JobStatus::Assigned, "new cookie {cookie} placed");
    }
    world.send(Message::UpdateSpec { spec: spec("{tasks={t={job_count=2;command=c}}}") });
    world.pass();
    assert_eq!(world.job_events("aborted", Some("job_count decreased")).len(), 3);
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn a_job_count_change_of_a_running_gang_is_refused_when_consumed() {
    let mut world = running(GANG3, 4, 1);
    world.send(Message::UpdateSpec { spec: spec("{tasks={worker={job_count=4;command=w;gang_options={}}}}") });
    world.pass();
    assert_eq!(world.data.spec.tasks["worker"].job_count, 3);
    let refused = world.events_of("spec_update_refused");
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0]["violations"][0],
        "tasks.worker.job_count: cannot change from 3 to 4 in a running gang operation"
    );
}

#[test]
fn a_completed_gang_task_retires_its_reserved_jobs_so_other_tasks_get_their_allocations() {
    let spec = "{tasks={g={job_count=4;command=g;gang_options={size=2}};p={job_count=2;command=p}}}";
    let mut world = running(spec, 6, 1);
    // p's jobs are ranked too (a task without gang_options in a gang operation): they were placed before g's
    // reserved jobs. p's cookie 0 loses its node and restarts alone, with no free allocation left.
    world.lose_node_of("p", 0);
    world.pass();
    assert_eq!(world.live("p", 0).status, JobStatus::Pending);
    assert_eq!(world.live("p", 0).data.gang_rank, Some(0), "it keeps its rank");
    world.exit("g", 0, 0);
    world.exit("g", 1, 0);
    assert_eq!(world.job_events("aborted", Some("gang task completed")).len(), 2, "both reserved jobs retire");
    assert_eq!(world.live("p", 0).status, JobStatus::Assigned, "an allocation of the gang task goes to p");
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn an_idle_allocation_kept_for_reuse_goes_to_a_pending_job_when_nothing_else_is_free() {
    let spec = "{tasks={g={job_count=2;command=g;gang_options={}};p={job_count=1;command=p}}}";
    let mut world = running(spec, 3, 1);
    world.lose_node_of("g", 1);
    world.pass(); // the gang restarts: p reruns in its allocation, rank 1 waits for one
    assert_eq!(world.live("g", 1).status, JobStatus::Pending);
    world.start_assigned();
    world.exit("p", 0, 0); // p's allocation turns idle, kept for a rerun at a later restart...
    let rank1 = world.live("g", 1);
    assert_eq!(rank1.status, JobStatus::Assigned, "...but rank 1 needs it now: {:#?}", world.jobs);
    let p_allocation = world.jobs.iter().rev().find(|j| j.data.task == "p").unwrap().data.allocation.unwrap();
    assert_eq!(rank1.data.allocation.unwrap().row, p_allocation.row);
    assert_ne!(rank1.data.allocation.unwrap(), p_allocation, "a new grant of the row, not a reuse");
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn a_rank_whose_node_fenced_and_came_back_under_a_new_session_does_not_linger() {
    // The agent fenced (killing the process) and took a new session before the controller noticed: the job is
    // still running as far as the rows say, but its allocation's session is over, so its process is dead.
    let mut world = running(GANG3, 4, 1);
    let node = world.lose_node_of("worker", 0);
    world.revive_node(node);
    world.end("worker", 2, aborted("preempted"));
    assert!(world.data.lingering.is_empty(), "{:?}", world.data.lingering);
}
