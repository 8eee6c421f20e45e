//! A world for the pure controller pass: rows kept in maps, passes run by hand, agents played by the test.
//! Declared once, in `tests/all.rs`; a test file names it with `use crate::gang_support;`.

#![allow(dead_code)]

#[cfg(not(madsim))]
pub mod link;

use lockstep::gang::api::OperationView;
use lockstep::gang::audit;
use lockstep::gang::controller::{EVENT_INCARNATION_STARTED, EVENT_JOB_STATE, PassInput, PassOutput, run_pass};
use lockstep::gang::model::{
    Allocation, AllocationData, AllocationRef, Job, JobId, JobOutcome, JobStatus, Message, OperationData,
    OperationStatus,
};
use lockstep::gang::placement::{PlacementSettings, QueueEntry};
use lockstep::gang::{OperationSpec, SpecFormat};
use lockstep::store::{Event, LockToken, RowId, Timestamp};
use serde_json::Value;
use std::collections::BTreeMap;

/// The operation's row id in every world.
pub const OP: RowId = RowId(1);

pub struct World {
    pub status: OperationStatus,
    pub data: OperationData,
    pub jobs: Vec<Job>,
    pub allocations: BTreeMap<RowId, Allocation>,
    /// Live session of each node.
    pub sessions: BTreeMap<RowId, LockToken>,
    pub nodes: Vec<RowId>,
    pub inbox: Vec<(RowId, Message)>,
    pub events: Vec<(String, Value)>,
    next_row: i64,
    next_token: i64,
    pub revival_next: bool,
    /// The store's clock.
    pub now: Timestamp,
    /// The gang queue (this world's one operation is all that may wait in it).
    pub queue: Vec<QueueEntry>,
    /// The replica's placement settings.
    pub settings: PlacementSettings,
}

impl World {
    /// A world running `spec` (YSON) with `nodes` nodes of `slots` slots each.
    pub fn new(spec: &str, nodes: usize, slots: u32) -> World {
        let spec = OperationSpec::parse(spec, SpecFormat::Yson).expect("valid spec");
        let mut world = World {
            status: OperationStatus::Starting,
            data: OperationData::new(spec),
            jobs: Vec::new(),
            allocations: BTreeMap::new(),
            sessions: BTreeMap::new(),
            nodes: Vec::new(),
            inbox: Vec::new(),
            events: Vec::new(),
            next_row: 100,
            next_token: 1000,
            revival_next: false,
            now: Timestamp(1_700_000_000_000_000),
            queue: Vec::new(),
            settings: PlacementSettings::default(),
        };
        for n in 0..nodes {
            let node = world.row();
            world.nodes.push(node);
            let token = world.token();
            world.sessions.insert(node, token);
            for slot in 0..slots {
                let row = world.row();
                let data = AllocationData::free(node, format!("node-{n}"), slot);
                world.allocations.insert(row, Allocation { row, allocated: false, data: data.into() });
            }
        }
        world
    }

    /// Allocations of the nodes with a live session.
    pub fn cluster_slots(&self) -> u32 {
        self.allocations.values().filter(|a| self.sessions.contains_key(&a.data.node)).count() as u32
    }

    /// The agents answer for the processes the controller moved on from (messages only): each allocation marked
    /// with a job that may still run there (`AllocationData::lingering`) gets a `JobEnded` (aborted, "process
    /// killed") for that job, as its agent sends it after killing the process, or on finding none. Every lingering
    /// entry's allocation carries its mark (or the agent would never learn of it).
    pub fn report_stale_kills(&mut self) {
        for l in &self.data.lingering {
            let marked = self.allocations.get(&l.allocation).and_then(|a| a.data.lingering);
            assert_eq!(marked, Some(l.job), "the allocation of lingering job {} is not marked with it", l.job);
        }
        let marked: Vec<(JobId, AllocationRef)> = self
            .allocations
            .values()
            .filter(|a| a.allocated)
            .filter_map(|a| a.data.lingering.map(|job| (job, a.current())))
            .collect();
        for (job, allocation) in marked {
            let outcome = JobOutcome::Aborted { reason: "process killed".into() };
            self.send(Message::JobEnded { job, allocation, outcome });
        }
    }

    /// Moves the store's clock on by `span`.
    pub fn advance(&mut self, span: std::time::Duration) {
        self.now = self.now.plus(span);
    }

    fn row(&mut self) -> RowId {
        self.next_row += 1;
        RowId(self.next_row)
    }

    fn token(&mut self) -> LockToken {
        self.next_token += 1;
        LockToken(self.next_token)
    }

    /// One controller pass, its output applied to the world.
    pub fn pass(&mut self) -> PassOutput {
        let free = self
            .allocations
            .values()
            .filter(|a| !a.allocated)
            .filter_map(|a| self.sessions.get(&a.data.node).map(|s| (a.clone(), *s)))
            .collect();
        let input = PassInput {
            operation: OP,
            status: self.status,
            data: self.data.clone(),
            jobs: self.jobs.clone(),
            allocations: self.allocations.values().filter(|a| a.data.operation == Some(OP)).cloned().collect(),
            messages: std::mem::take(&mut self.inbox),
            free,
            node_sessions: self.sessions.clone(),
            revival: std::mem::take(&mut self.revival_next),
            now: self.now,
            queue: self.queue.clone(),
            cluster_slots: self.cluster_slots(),
            returning_slots: 0,
            settings: self.settings.clone(),
        };
        let output = run_pass(input);
        if let Some(queue) = &output.queue {
            self.queue = queue.clone();
        }
        self.status = output.status;
        self.data = output.data.clone();
        for job in &output.updated_jobs {
            let at = self.jobs.iter().position(|j| j.row == job.row).expect("updated job exists");
            assert!(!self.jobs[at].is_terminal(), "terminal job {} rewritten", job.data.id);
            self.jobs[at] = job.clone();
        }
        for allocation in &output.allocations {
            self.allocations.insert(allocation.row, allocation.clone());
        }
        // What the pass hands back as left is the world after its writes: the jobs after `jobs_after` with rows,
        // and the allocations granted to the operation, by row (what a replica's next pass is given).
        let mut left_jobs: Vec<Job> =
            self.jobs.iter().filter(|j| j.row > self.data.jobs_after && j.row.is_some()).cloned().collect();
        left_jobs.sort_by_key(|j| j.row);
        assert_eq!(output.left.jobs, left_jobs, "the jobs a pass leaves");
        let held: Vec<Allocation> =
            self.allocations.values().filter(|a| a.allocated && a.data.operation == Some(OP)).cloned().collect();
        assert_eq!(output.left.allocations, held, "the allocations a pass leaves");
        for job in &output.new_jobs {
            let mut job = job.clone();
            job.row = Some(self.row());
            self.jobs.push(job);
        }
        self.events.extend(output.events.iter().cloned());
        self.check_invariants();
        output
    }

    /// Invariants after every pass: one live job per (task, cookie) and per (task, rank) in the current
    /// incarnation; no two live jobs in one allocation; every placed live job's allocation names it.
    pub fn check_invariants(&self) {
        let mut cookies = BTreeMap::new();
        let mut ranks = BTreeMap::new();
        let mut placed = BTreeMap::new();
        for job in self.jobs.iter().filter(|j| !j.is_terminal()) {
            assert_eq!(job.data.incarnation, self.data.incarnation, "live job {} of an older incarnation", job.data.id);
            let key = (job.data.task.clone(), job.data.job_cookie);
            assert!(cookies.insert(key.clone(), job.data.id).is_none(), "two live jobs of {key:?}");
            if let Some(rank) = job.data.gang_rank {
                assert!(ranks.insert((job.data.task.clone(), rank), job.data.id).is_none(), "rank {rank} twice");
            }
            if let Some(a) = job.data.allocation {
                assert!(placed.insert(a, job.data.id).is_none(), "two live jobs in allocation {a}");
                let allocation = &self.allocations[&a.row];
                assert_eq!(allocation.current(), a, "job {} in a stale grant", job.data.id);
                assert!(allocation.allocated, "job {} in a free allocation", job.data.id);
                let launch = allocation.data.job.as_ref().expect("allocation of a live job has a launch");
                assert_eq!(launch.job, job.data.id);
            }
        }
        let violations = audit::operation(&self.view());
        assert!(violations.is_empty(), "{violations:#?}");
        if self.status.is_terminal() {
            assert!(cookies.is_empty(), "live jobs after the operation ended");
            assert!(self.allocations.values().all(|a| a.data.operation != Some(OP)), "allocations held after the end");
        }
    }

    /// The world as the store's API would show it.
    pub fn view(&self) -> OperationView {
        let events = self.events.iter().enumerate().map(|(i, (kind, data))| Event {
            seq: i as i64 + 1,
            row_id: OP,
            kind: kind.clone(),
            data: data.clone(),
            at: Timestamp::EPOCH,
        });
        OperationView {
            id: OP,
            status: self.status,
            data: self.data.clone(),
            jobs: self.jobs.clone(),
            events: events.collect(),
        }
    }

    pub fn job(&self, id: JobId) -> &Job {
        self.jobs.iter().find(|j| j.data.id == id).expect("job exists")
    }

    /// The live job of `task`'s `cookie` in the current incarnation.
    pub fn live(&self, task: &str, cookie: u32) -> &Job {
        self.jobs
            .iter()
            .find(|j| !j.is_terminal() && j.data.task == task && j.data.job_cookie == cookie)
            .unwrap_or_else(|| panic!("no live job of {task}/{cookie}"))
    }

    /// Jobs of incarnation `index`.
    pub fn incarnation(&self, index: u32) -> Vec<&Job> {
        self.jobs.iter().filter(|j| j.data.incarnation == index).collect()
    }

    /// The agent starts every assigned job (messages, then a pass).
    pub fn start_assigned(&mut self) {
        let assigned: Vec<(JobId, AllocationRef)> = self
            .jobs
            .iter()
            .filter(|j| j.status == JobStatus::Assigned)
            .map(|j| (j.data.id, j.data.allocation.unwrap()))
            .collect();
        for (job, allocation) in assigned {
            self.send(Message::JobStarted { job, allocation });
        }
        self.pass();
    }

    pub fn send(&mut self, message: Message) {
        let row = self.row();
        self.inbox.push((row, message));
    }

    /// The agent reports that `task`/`cookie`'s live job ended with `outcome` (message only).
    pub fn report(&mut self, task: &str, cookie: u32, outcome: JobOutcome) -> JobId {
        let job = self.live(task, cookie);
        let (id, allocation) = (job.data.id, job.data.allocation.expect("a placed job"));
        self.send(Message::JobEnded { job: id, allocation, outcome });
        id
    }

    /// Ends `task`/`cookie`'s live job with `outcome` and runs a pass.
    pub fn end(&mut self, task: &str, cookie: u32, outcome: JobOutcome) -> JobId {
        let id = self.report(task, cookie, outcome);
        self.pass();
        id
    }

    pub fn exit(&mut self, task: &str, cookie: u32, code: i32) -> JobId {
        self.end(task, cookie, JobOutcome::Exited { code })
    }

    /// Ends the session of the node running `task`/`cookie`'s live job.
    pub fn lose_node_of(&mut self, task: &str, cookie: u32) -> RowId {
        let a = self.live(task, cookie).data.allocation.expect("placed");
        let node = self.allocations[&a.row].data.node;
        self.sessions.remove(&node);
        node
    }

    /// Gives `node` a new session (its agent came back).
    pub fn revive_node(&mut self, node: RowId) {
        let token = self.token();
        self.sessions.insert(node, token);
    }

    pub fn events_of(&self, kind: &str) -> Vec<&Value> {
        self.events.iter().filter(|(k, _)| k == kind).map(|(_, v)| v).collect()
    }

    pub fn switches(&self) -> Vec<&Value> {
        self.events_of(EVENT_INCARNATION_STARTED)
    }

    /// Job state events moving to `to` with `reason`.
    pub fn job_events(&self, to: &str, reason: Option<&str>) -> Vec<&Value> {
        self.events_of(EVENT_JOB_STATE)
            .into_iter()
            .filter(|e| e["to"] == to && reason.is_none_or(|r| e["reason"] == r))
            .collect()
    }

    /// Starts and completes every live job, pass by pass, until the operation ends (bounded).
    pub fn run_to_end(&mut self) {
        for _ in 0..1000 {
            if self.status.is_terminal() {
                return;
            }
            self.start_assigned();
            let running: Vec<(String, u32)> = self
                .jobs
                .iter()
                .filter(|j| j.status == JobStatus::Running)
                .map(|j| (j.data.task.clone(), j.data.job_cookie))
                .collect();
            for (task, cookie) in running {
                self.report(&task, cookie, JobOutcome::Exited { code: 0 });
            }
            self.pass();
        }
        panic!("operation did not end in 1000 rounds");
    }
}
