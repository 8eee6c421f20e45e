//! A rank with a lingering process (`gang::model::Lingering`) under node loss and restarts, on the pure
//! pass with the test agent of `gang_support`: no order of reports makes a pass panic, an abort always ends the
//! operation, and a rank moves to another allocation only on evidence that its previous process is dead.

use crate::gang_support;

use gang_support::World;
use lockstep::gang::model::{JobStatus, Message, OperationStatus};
use lockstep::store::RowId;

/// The trainer of `gang-mixed-soak`: two ranks and two reserved jobs.
const TRAINER: &str = "{tasks={trainer={job_count=4;command=t;gang_options={size=2}}}}";

/// A running world: every job started.
fn running(spec: &str, nodes: usize, slots: u32) -> World {
    let mut world = World::new(spec, nodes, slots);
    world.pass();
    world.start_assigned();
    assert_eq!(world.status, OperationStatus::Running);
    world
}

/// The allocation row where the process of the trainer's `rank` may still run, if the operation says so.
fn lingering_row(world: &World, rank: u32) -> Option<RowId> {
    world.data.lingering.iter().find(|l| l.task == "trainer" && l.gang_rank == rank).map(|l| l.allocation)
}

/// A revival left rank 0 lingering in its old allocation (its node is alive, its kill not reported yet); the new
/// incarnation's rank 1 starts and fails before rank 0's node reports: a gang restart whose plan gives rank 0 to a
/// reserved allocation. Returns the world after the revival, with rank 1 and the reserved jobs running.
fn revival_with_rank_zero_lingering() -> (World, RowId) {
    let mut world = running(TRAINER, 8, 1);
    world.lose_node_of("trainer", 1);
    world.revival_next = true;
    world.pass();
    assert_eq!(world.data.incarnation, 1);
    let row = lingering_row(&world, 0).expect("rank 0's process may still run on its live node");
    assert_eq!(world.live("trainer", 0).status, JobStatus::Pending, "rank 0 waits for its old process");
    world.start_assigned();
    for cookie in 1..4 {
        assert_eq!(world.live("trainer", cookie).status, JobStatus::Running, "cookie {cookie}");
    }
    (world, row)
}

#[test]
fn a_restart_while_a_revived_rank_lingers_never_places_that_rank_elsewhere() {
    let (mut world, row) = revival_with_rank_zero_lingering();
    world.exit("trainer", 1, 1); // rank 1 fails before rank 0's old process is known dead
    assert_eq!(world.status, OperationStatus::Running);
    assert_eq!(world.data.incarnation, 2, "the failure restarted the gang");
    // The allocation where rank 0's old process may run stayed held, so the restart reuses it for rank 0 (its
    // agent kills the old process before it starts the new one) instead of giving rank 0 to a reserved one.
    let rank0 = world.jobs.iter().find(|j| !j.is_terminal() && j.data.gang_rank == Some(0)).expect("rank 0");
    assert_eq!(rank0.data.allocation.map(|a| a.row), Some(row), "rank 0 back in its own allocation");
    assert_eq!(rank0.status, JobStatus::Assigned);
    assert!(world.data.lingering.is_empty(), "settled by the placement: {:?}", world.data.lingering);
    assert_eq!(world.live("trainer", 2).data.gang_rank, Some(1), "the reserved allocation takes the freed rank");
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn an_abort_behind_the_report_that_restarts_a_lingering_gang_ends_the_operation() {
    let (mut world, _) = revival_with_rank_zero_lingering();
    world.report("trainer", 1, lockstep::gang::model::JobOutcome::Exited { code: 1 });
    world.send(Message::Abort { reason: "user asked".into() });
    world.pass();
    assert_eq!(world.status, OperationStatus::Aborted);
    assert!(world.allocations.values().all(|a| !a.allocated), "every allocation released");
}

#[test]
fn an_abort_ends_the_operation_even_when_the_rest_of_its_pass_panics() {
    // A state only a bug or a foreign writer makes (a job of a task the spec does not have: the pass that handles
    // its end panics on it), then that job's end and an abort behind it: the abort still applies.
    let mut world = running("{tasks={worker={job_count=3;command=w;gang_options={}}}}", 4, 1);
    let ghost = world.jobs.iter().position(|j| j.data.job_cookie == 2).unwrap();
    world.jobs[ghost].data_mut().task = "ghost".into();
    let (job, allocation) = (world.jobs[ghost].data.id, world.jobs[ghost].data.allocation.unwrap());
    let outcome = lockstep::gang::model::JobOutcome::Exited { code: 1 };
    world.send(Message::JobEnded { job, allocation, outcome });
    world.send(Message::Abort { reason: "user asked".into() });
    let output = world.pass();
    assert_eq!(world.status, OperationStatus::Aborted);
    assert_eq!(world.data.result.as_deref(), Some("user asked"));
    assert_eq!(output.consumed.len(), 2, "both messages consumed");
    assert!(world.allocations.values().all(|a| !a.allocated), "every allocation released");
}

#[test]
fn a_restart_while_a_cookies_previous_rank_lingers_and_its_next_job_runs_elsewhere_reuses_one_allocation() {
    // Found by the simulator (gang-revival-restart-race seed 48): the allocation where a rank lingers is kept, and
    // its cookie's next job runs elsewhere, so a restart holds two allocations whose last jobs name one cookie.
    let mut world = running(TRAINER, 10, 1);
    world.exit("trainer", 0, 1); // rank 0 fails: the reserved allocation of cookie 2 takes rank 0
    assert_eq!(world.live("trainer", 2).data.gang_rank, Some(0));
    world.start_assigned();
    world.lose_node_of("trainer", 1);
    world.revival_next = true;
    world.pass(); // lack after revival: cookie 2's rank 0 lingers in its kept allocation
    let kept = lingering_row(&world, 0).expect("rank 0 lingers");
    let cookie2 = world.live("trainer", 2);
    assert_eq!(cookie2.data.gang_rank, None, "cookie 2 is reserved in the new incarnation");
    assert!(cookie2.data.allocation.is_some_and(|a| a.row != kept), "and runs elsewhere at once");
    world.start_assigned();
    world.exit("trainer", 1, 1); // a restart before the kept allocation's agent answered
    assert_eq!(world.status, OperationStatus::Running);
    let rank0 = world.jobs.iter().find(|j| !j.is_terminal() && j.data.gang_rank == Some(0)).expect("rank 0");
    assert!(rank0.data.allocation.is_none_or(|a| a.row == kept), "rank 0 placed nowhere but where it lingers");
    world.report_stale_kills();
    world.pass();
    assert!(world.data.lingering.is_empty(), "{:?}", world.data.lingering);
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}

#[test]
fn a_gang_whose_nodes_keep_dying_fails_at_max_node_loss_restart_count() {
    // Today only failures count toward max_failed_job_count: a gang on nodes that keep dying restarted forever.
    let spec = "{tasks={w={job_count=2;command=w;gang_options={}}};max_node_loss_restart_count=3}";
    let mut world = running(spec, 8, 1);
    for restart in 1..=3 {
        assert_eq!(world.status, OperationStatus::Running, "restart {restart}");
        world.lose_node_of("w", 1);
        world.pass();
        world.start_assigned();
    }
    assert_eq!(world.status, OperationStatus::Failed);
    assert_eq!(world.data.node_loss_restart_count, 3);
    let result = world.data.result.clone().unwrap();
    assert!(
        result.starts_with("gang restarts caused by lost nodes (3) reached max_node_loss_restart_count 3"),
        "{result}"
    );
    assert_eq!(world.switches().len(), 3, "the start and two restarts; the third loss failed the operation");
}

#[test]
fn node_loss_restarts_are_bounded_by_default_and_failures_do_not_count_toward_them() {
    let mut world = running("{tasks={w={job_count=2;command=w;gang_options={}}};max_failed_job_count=50}", 30, 1);
    world.exit("w", 1, 1);
    world.start_assigned();
    assert_eq!(world.data.node_loss_restart_count, 0, "a failure is not a node loss");
    for _ in 0..lockstep::gang::spec::MAX_NODE_LOSS_RESTART_COUNT_DEFAULT {
        world.lose_node_of("w", 0);
        world.pass();
        world.start_assigned();
    }
    assert_eq!(world.status, OperationStatus::Failed);
}

#[test]
fn an_all_or_nothing_restart_keeps_the_reuse_it_planned_when_the_old_rank_reports_its_end_in_the_same_pass() {
    // Found by the simulator (gang-agent-cannot-list-allocations): rank 1 fails and rank 0 exits, both reports in
    // one pass. The failure restarts the gang: rank 0's running job lingers in its allocation, which the restart
    // plans to reuse for rank 0 (deferred until the whole incarnation is placed). Rank 0's report then settles
    // the entry; the allocation must stay for the planned reuse, not go back to the free ones (where the reserved
    // job took it, and rank 0, placed in a grant gone stale, was aborted "node lost" at the next pass).
    let spec = "{tasks={trainer={job_count=3;command=t;gang_options={size=2}}};gang_placement=all_or_nothing}";
    let mut world = running(spec, 4, 1);
    let rank0 = world.live("trainer", 0).data.allocation.expect("placed").row;
    world.report("trainer", 1, lockstep::gang::model::JobOutcome::Exited { code: 1 });
    world.report("trainer", 0, lockstep::gang::model::JobOutcome::Exited { code: 0 });
    world.pass();
    assert_eq!(world.data.incarnation, 1, "the failure restarted the gang");
    let next = world.live("trainer", 0);
    assert_eq!(next.data.allocation.map(|a| a.row), Some(rank0), "rank 0 reuses its allocation");
    assert_eq!(next.status, JobStatus::Assigned);
    world.start_assigned();
    world.pass();
    assert!(world.job_events("aborted", Some("node lost")).is_empty(), "no node was lost");
    assert_eq!(world.data.incarnation, 1);
    world.run_to_end();
    assert_eq!(world.status, OperationStatus::Completed);
}
