//! Random histories on the pure controller: job endings of every kind, lost and returning nodes, revivals, in any
//! order. After every pass the world's invariants and every audit hold (one live job per cookie and rank, no two
//! jobs in one allocation, reuse keeps identity, completion and failure rules); once the faults stop, the
//! operation ends.

use crate::gang_support;

use gang_support::World;
use lockstep::gang::model::{JobOutcome, JobStatus, Message};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Action {
    Exit { job: usize, code: i32 },
    Abort { job: usize },
    Interrupt { job: usize },
    LoseNode { job: usize },
    ReviveNodes,
    Revival,
    Start,
    AbortOperation,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        40 => (any::<usize>(), prop_oneof![Just(0), Just(0), Just(1), Just(137)])
            .prop_map(|(job, code)| Action::Exit { job, code }),
        10 => any::<usize>().prop_map(|job| Action::Abort { job }),
        10 => any::<usize>().prop_map(|job| Action::Interrupt { job }),
        10 => any::<usize>().prop_map(|job| Action::LoseNode { job }),
        10 => Just(Action::ReviveNodes),
        10 => Just(Action::Revival),
        30 => Just(Action::Start),
        1 => Just(Action::AbortOperation),
    ]
}

fn spec() -> impl Strategy<Value = String> {
    (1u32..5, 0u32..4, 0u32..3, 1u32..5).prop_map(|(gang_jobs, reserved, plain_jobs, max_failed)| {
        let size = gang_jobs;
        let mut tasks = format!("g={{job_count={};command=g;gang_options={{size={size}}}}};", gang_jobs + reserved);
        if plain_jobs > 0 {
            tasks.push_str(&format!("p={{job_count={plain_jobs};command=p}};"));
        }
        format!("{{tasks={{{tasks}}};max_failed_job_count={max_failed}}}")
    })
}

/// Live jobs of the world that an agent placed (assigned or running), in id order.
fn placed(world: &World) -> Vec<(String, u32, JobStatus)> {
    world
        .jobs
        .iter()
        .filter(|j| matches!(j.status, JobStatus::Assigned | JobStatus::Running))
        .map(|j| (j.data.task.clone(), j.data.job_cookie, j.status))
        .collect()
}

fn act(world: &mut World, action: &Action) {
    let jobs = placed(world);
    let pick = |i: usize| (!jobs.is_empty()).then(|| jobs[i % jobs.len()].clone());
    match action {
        Action::Exit { job, code } => {
            if let Some((task, cookie, JobStatus::Running)) = pick(*job) {
                world.exit(&task, cookie, *code);
            }
        }
        Action::Abort { job } => {
            if let Some((task, cookie, _)) = pick(*job) {
                world.end(&task, cookie, JobOutcome::Aborted { reason: "preempted".into() });
            }
        }
        Action::Interrupt { job } => {
            if let Some((task, cookie, JobStatus::Running)) = pick(*job) {
                world.end(&task, cookie, JobOutcome::Interrupted { reason: "drained".into() });
            }
        }
        Action::LoseNode { job } => {
            if let Some((task, cookie, _)) = pick(*job) {
                world.lose_node_of(&task, cookie);
                world.pass();
            }
        }
        Action::ReviveNodes => {
            let dead: Vec<_> = world.nodes.iter().copied().filter(|n| !world.sessions.contains_key(n)).collect();
            for node in dead {
                world.revive_node(node);
            }
            world.pass();
        }
        Action::Revival => {
            world.revival_next = true;
            world.pass();
        }
        Action::Start => world.start_assigned(),
        Action::AbortOperation => {
            world.send(Message::Abort { reason: "user".into() });
            world.pass();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_history_keeps_the_rules_and_ends_once_faults_stop(
        spec in spec(),
        nodes in 3usize..8,
        slots in 1u32..3,
        actions in prop::collection::vec(action(), 0..40),
    ) {
        let mut world = World::new(&spec, nodes, slots);
        world.pass();
        for action in &actions {
            if world.status.is_terminal() {
                break;
            }
            act(&mut world, action);
        }
        let dead: Vec<_> = world.nodes.iter().copied().filter(|n| !world.sessions.contains_key(n)).collect();
        for node in dead {
            world.revive_node(node);
        }
        world.pass();
        world.run_to_end();
        prop_assert!(world.status.is_terminal());
    }
}
