//! All-or-nothing placement and the gang queue (`gang::placement`) on the pure pass: several operations
//! sharing one cluster's allocations and one gang queue, passes run by hand in a chosen order, agents played by
//! the test.

use lockstep::gang::controller::{EVENT_GANG_PLACED, EVENT_GANG_WAITING, PassInput, run_pass};
use lockstep::gang::model::{
    Allocation, AllocationData, Job, JobOutcome, JobStatus, Message, OperationData, OperationStatus,
};
use lockstep::gang::placement::{GangPlacement, PlacementSettings, QueueEntry};
use lockstep::gang::{OperationSpec, SpecFormat, audit};
use lockstep::store::{LockToken, RowId, Timestamp};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const GANG2: &str = "{tasks={w={job_count=2;command=w;gang_options={}}};gang_placement=all_or_nothing}";
const GANG3: &str = "{tasks={w={job_count=3;command=w;gang_options={}}};gang_placement=all_or_nothing}";
const GANG4: &str = "{tasks={w={job_count=4;command=w;gang_options={}}};gang_placement=all_or_nothing}";
const SOLO: &str = "{tasks={w={job_count=1;command=w;gang_options={}}};gang_placement=all_or_nothing}";

struct Op {
    status: OperationStatus,
    data: OperationData,
    jobs: Vec<Job>,
    inbox: Vec<(RowId, Message)>,
    events: Vec<(String, Value)>,
}

/// One cluster: nodes of one slot each, operations by row id, one gang queue, the store's clock.
struct Cluster {
    ops: BTreeMap<RowId, Op>,
    allocations: BTreeMap<RowId, Allocation>,
    sessions: BTreeMap<RowId, LockToken>,
    queue: Vec<QueueEntry>,
    now: Timestamp,
    settings: PlacementSettings,
    next_row: i64,
    /// Nodes whose session ended, with when (store clock): expected back for `settings.node_return_grace`.
    lost: BTreeMap<RowId, Timestamp>,
}

impl Cluster {
    fn new(nodes: usize) -> Cluster {
        let mut cluster = Cluster {
            ops: BTreeMap::new(),
            allocations: BTreeMap::new(),
            sessions: BTreeMap::new(),
            queue: Vec::new(),
            now: Timestamp(1_700_000_000_000_000),
            settings: PlacementSettings::default(),
            next_row: 1000,
            lost: BTreeMap::new(),
        };
        for _ in 0..nodes {
            cluster.add_node();
        }
        cluster
    }

    fn row(&mut self) -> RowId {
        self.next_row += 1;
        RowId(self.next_row)
    }

    fn add_node(&mut self) -> RowId {
        let node = self.row();
        let token = LockToken(self.row().0);
        self.sessions.insert(node, token);
        let row = self.row();
        let data = AllocationData::free(node, format!("node-{}", node.0), 0);
        self.allocations.insert(row, Allocation { row, allocated: false, data: data.into() });
        node
    }

    fn submit(&mut self, spec: &str) -> RowId {
        let id = self.row();
        let spec = OperationSpec::parse(spec, SpecFormat::Yson).expect("valid spec");
        let op = Op {
            status: OperationStatus::Starting,
            data: OperationData::new(spec),
            jobs: Vec::new(),
            inbox: Vec::new(),
            events: Vec::new(),
        };
        self.ops.insert(id, op);
        id
    }

    fn cluster_slots(&self) -> u32 {
        self.allocations.values().filter(|a| self.sessions.contains_key(&a.data.node)).count() as u32
    }

    /// Allocations of the nodes lost less than `node_return_grace` ago.
    fn returning_slots(&self) -> u32 {
        let grace = self.settings.node_return_grace.as_micros() as i64;
        let recent = |node: &RowId| self.lost.get(node).is_some_and(|at| self.now.as_micros() - at.as_micros() < grace);
        self.allocations.values().filter(|a| recent(&a.data.node)).count() as u32
    }

    /// The session of the node running `id`'s placed live job of `cookie` ends (its agent died).
    fn lose_node_of(&mut self, id: RowId, cookie: u32) -> RowId {
        let job = self.live(id).into_iter().find(|j| j.data.job_cookie == cookie && j.data.allocation.is_some());
        let node = self.allocations[&job.expect("placed").data.allocation.unwrap().row].data.node;
        self.sessions.remove(&node);
        self.lost.insert(node, self.now);
        node
    }

    /// `node`'s agent comes back with a new session.
    fn return_node(&mut self, node: RowId) {
        let token = LockToken(self.row().0);
        self.sessions.insert(node, token);
        self.lost.remove(&node);
    }

    /// One pass over `id`, its output applied.
    fn pass(&mut self, id: RowId) {
        let free: Vec<(Allocation, LockToken)> = self
            .allocations
            .values()
            .filter(|a| !a.allocated)
            .filter_map(|a| self.sessions.get(&a.data.node).map(|s| (a.clone(), *s)))
            .collect();
        let (cluster_slots, returning_slots) = (self.cluster_slots(), self.returning_slots());
        let op = self.ops.get_mut(&id).expect("operation exists");
        let input = PassInput {
            operation: id,
            status: op.status,
            data: op.data.clone(),
            jobs: op.jobs.clone(),
            allocations: self.allocations.values().filter(|a| a.data.operation == Some(id)).cloned().collect(),
            messages: std::mem::take(&mut op.inbox),
            free,
            node_sessions: self.sessions.clone(),
            revival: false,
            now: self.now,
            queue: self.queue.clone(),
            cluster_slots,
            returning_slots,
            settings: self.settings.clone(),
        };
        let output = run_pass(input);
        op.status = output.status;
        op.data = output.data;
        for job in output.updated_jobs {
            let at = op.jobs.iter().position(|j| j.row == job.row).expect("updated job exists");
            op.jobs[at] = job;
        }
        for mut job in output.new_jobs {
            self.next_row += 1;
            job.row = Some(RowId(self.next_row));
            op.jobs.push(job);
        }
        op.events.extend(output.events);
        for allocation in output.allocations {
            self.allocations.insert(allocation.row, allocation);
        }
        if let Some(queue) = output.queue {
            self.queue = queue;
        }
        self.check(id);
    }

    /// Every pass once, in id order.
    fn round(&mut self) {
        let ids: Vec<RowId> = self.ops.keys().copied().collect();
        for id in ids {
            if !self.ops[&id].status.is_terminal() {
                self.pass(id);
            }
        }
    }

    fn check(&self, id: RowId) {
        let op = &self.ops[&id];
        let view = lockstep::gang::api::OperationView {
            id,
            status: op.status,
            data: op.data.clone(),
            jobs: op.jobs.clone(),
            events: Vec::new(),
        };
        let violations = audit::rank_uniqueness(&view);
        assert!(violations.is_empty(), "{violations:?}");
        if op.data.waiting.is_some() {
            // A waiting gang holds nothing but the allocations kept until their agents answer for a process that
            // may still run there.
            let kept =
                op.data.lingering.iter().filter(|l| self.allocations[&l.allocation].data.lingering == Some(l.job));
            let held = self.held(id);
            assert_eq!(held, kept.count(), "operation {id} waits while it holds {held} allocations");
            assert!(self.queue.iter().any(|e| e.operation == id), "operation {id} waits outside the queue");
        } else {
            assert!(self.queue.iter().all(|e| e.operation != id), "operation {id} is queued but not waiting");
        }
        let mut used = BTreeSet::new();
        for allocation in self.allocations.values().filter(|a| a.allocated) {
            assert!(used.insert(allocation.row));
        }
    }

    fn op(&self, id: RowId) -> &Op {
        &self.ops[&id]
    }

    fn held(&self, id: RowId) -> usize {
        self.allocations.values().filter(|a| a.allocated && a.data.operation == Some(id)).count()
    }

    fn placed_ranks(&self, id: RowId) -> usize {
        let op = self.op(id);
        op.jobs
            .iter()
            .filter(|j| !j.is_terminal() && j.data.gang_rank.is_some() && j.data.allocation.is_some())
            .filter(|j| j.data.incarnation == op.data.incarnation)
            .count()
    }

    fn live(&self, id: RowId) -> Vec<Job> {
        self.op(id).jobs.iter().filter(|j| !j.is_terminal()).cloned().collect()
    }

    /// The agents start every assigned job of `id` (messages only).
    fn start(&mut self, id: RowId) {
        let starts: Vec<Message> = self
            .live(id)
            .into_iter()
            .filter(|j| j.status == JobStatus::Assigned)
            .map(|j| Message::JobStarted { job: j.data.id, allocation: j.data.allocation.unwrap() })
            .collect();
        self.ops.get_mut(&id).unwrap().inbox.extend(starts.into_iter().map(|m| (RowId(0), m)));
    }

    /// The live placed job of `id`'s `cookie` ends with `outcome` (message only).
    fn end(&mut self, id: RowId, cookie: u32, outcome: JobOutcome) {
        let job = self.live(id).into_iter().find(|j| j.data.job_cookie == cookie && j.data.allocation.is_some());
        let job = job.unwrap_or_else(|| panic!("no placed live job of {id}/{cookie}"));
        let message = Message::JobEnded { job: job.data.id, allocation: job.data.allocation.unwrap(), outcome };
        self.ops.get_mut(&id).unwrap().inbox.push((RowId(0), message));
    }

    /// Every placed live job of `id` exits 0 (messages only).
    fn complete(&mut self, id: RowId) {
        for job in self.live(id).into_iter().filter(|j| j.data.allocation.is_some()) {
            self.end(id, job.data.job_cookie, JobOutcome::Exited { code: 0 });
        }
    }

    /// The agents report the processes of `id` they killed because the controller moved on (messages only).
    fn report_stale_kills(&mut self, id: RowId) {
        let op = self.ops.get_mut(&id).unwrap();
        for l in op.data.lingering.clone() {
            let job = op.jobs.iter().find(|j| j.data.id == l.job).unwrap();
            let outcome = JobOutcome::Aborted { reason: "process killed".into() };
            let message = Message::JobEnded { job: l.job, allocation: job.data.allocation.unwrap(), outcome };
            op.inbox.push((RowId(0), message));
        }
    }

    fn events(&self, id: RowId, kind: &str) -> Vec<Value> {
        self.op(id).events.iter().filter(|(k, _)| k == kind).map(|(_, v)| v.clone()).collect()
    }

    fn queued(&self) -> Vec<RowId> {
        self.queue.iter().map(|e| e.operation).collect()
    }
}

#[test]
fn two_gangs_of_two_on_three_slots_run_one_after_the_other_each_whole() {
    let mut cluster = Cluster::new(3);
    let a = cluster.submit(GANG2);
    let b = cluster.submit(GANG2);
    cluster.round();
    assert_eq!(cluster.placed_ranks(a), 2, "the first gang is placed whole");
    assert_eq!(cluster.placed_ranks(b), 0, "the second gets none of the one free slot");
    assert_eq!(cluster.held(b), 0);
    assert_eq!(cluster.queued(), [b]);
    let waiting = cluster.op(b).data.waiting.clone().expect("b waits");
    assert_eq!((waiting.need, waiting.since), (2, cluster.now));
    assert_eq!(cluster.events(b, EVENT_GANG_WAITING).len(), 1);
    assert_eq!(cluster.op(a).data.placement, Some(GangPlacement::AllOrNothing));

    cluster.start(a);
    cluster.round();
    cluster.now = cluster.now.plus(Duration::from_secs(20));
    cluster.complete(a);
    cluster.round();
    assert_eq!(cluster.op(a).status, OperationStatus::Completed);
    cluster.round();
    assert_eq!(cluster.placed_ranks(b), 2, "placed whole once two slots are free");
    assert!(cluster.queued().is_empty());
    assert_eq!(cluster.op(b).data.waiting, None);
    let placed = cluster.events(b, EVENT_GANG_PLACED);
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0]["waited_ms"], 20_000);
    assert_eq!(cluster.events(b, EVENT_GANG_WAITING).len(), 1, "waiting is announced once");
}

#[test]
fn incremental_placement_starts_a_gang_in_waves_the_behaviour_all_or_nothing_replaces() {
    let mut cluster = Cluster::new(3);
    let incremental = GANG2.replace("all_or_nothing", "incremental");
    let a = cluster.submit(&incremental);
    let b = cluster.submit(&incremental);
    cluster.round();
    assert_eq!((cluster.placed_ranks(a), cluster.placed_ranks(b)), (2, 1), "b's rank 0 runs alone");
    assert!(cluster.queued().is_empty());
}

#[test]
fn the_replicas_default_placement_is_fixed_at_the_first_pass_and_the_spec_wins_over_it() {
    let mut cluster = Cluster::new(3);
    cluster.settings.default = GangPlacement::AllOrNothing;
    let defaulted = cluster.submit("{tasks={w={job_count=2;command=w;gang_options={}}}}");
    let explicit = cluster.submit(&GANG2.replace("all_or_nothing", "incremental"));
    let plain = cluster.submit("{tasks={w={job_count=1;command=w}}}");
    cluster.round();
    assert_eq!(cluster.op(defaulted).data.placement, Some(GangPlacement::AllOrNothing));
    assert_eq!(cluster.op(explicit).data.placement, Some(GangPlacement::Incremental));
    assert_eq!(cluster.op(plain).data.placement, None, "a plain operation has no gang placement");
    // A replica with another default takes over: the operation keeps the placement it started with.
    cluster.settings.default = GangPlacement::Incremental;
    cluster.round();
    assert_eq!(cluster.op(defaulted).data.placement, Some(GangPlacement::AllOrNothing));
    assert_eq!(cluster.placed_ranks(explicit), 1, "incremental: one rank in the one slot left");
}

#[test]
fn a_waiting_gang_reserves_its_need_so_neither_smaller_gangs_nor_plain_jobs_take_the_slots_it_waits_for() {
    let mut cluster = Cluster::new(3);
    let first = cluster.submit(GANG2);
    cluster.round();
    let big = cluster.submit(GANG3);
    cluster.round();
    assert_eq!(cluster.queued(), [big], "one slot free of the three it needs");
    let small = cluster.submit(SOLO);
    let plain = cluster.submit("{tasks={p={job_count=1;command=p}}}");
    cluster.round();
    assert_eq!(cluster.placed_ranks(small), 0, "the free slot is the big gang's");
    assert_eq!(cluster.queued(), [big, small], "the small gang queues behind it");
    assert!(cluster.live(plain).iter().all(|j| j.status == JobStatus::Pending), "a plain job waits too");
    cluster.start(first);
    cluster.complete(first);
    cluster.round();
    assert_eq!(cluster.placed_ranks(big), 3, "the head is placed first");
    assert_eq!(cluster.queued(), [small]);
    cluster.start(big);
    cluster.complete(big);
    cluster.round();
    cluster.round();
    assert_eq!(cluster.placed_ranks(small), 1);
    assert!(cluster.live(plain).iter().all(|j| j.status == JobStatus::Assigned));
    assert!(cluster.queued().is_empty());
}

#[test]
fn a_stream_of_small_gangs_does_not_starve_a_big_one() {
    // Three slots, each busy with a small gang; a new small gang arrives every round and one running job ends.
    // Without the reservation the big gang would wait for a round in which no small gang took a freed slot.
    let mut cluster = Cluster::new(3);
    let mut running: Vec<RowId> = Vec::new();
    for _ in 0..3 {
        let small = cluster.submit(SOLO);
        cluster.round();
        cluster.start(small);
        running.push(small);
    }
    let big = cluster.submit(GANG3);
    cluster.round();
    assert_eq!(cluster.queued(), [big]);
    let mut rounds = 0;
    while cluster.placed_ranks(big) < 3 {
        rounds += 1;
        assert!(rounds <= 3, "the big gang waited {rounds} rounds: {:?}", cluster.queued());
        let done = running.remove(0);
        cluster.complete(done);
        cluster.submit(SOLO);
        cluster.round();
        for id in cluster.ops.keys().copied().collect::<Vec<_>>() {
            if cluster.placed_ranks(id) > 0 && id != big && !running.contains(&id) && id != done {
                running.push(id);
                cluster.start(id);
            }
        }
    }
    assert_eq!(rounds, 3, "placed as soon as the three slots it found busy were free");
}

#[test]
fn a_restart_that_fits_reuses_allocations_and_one_that_does_not_releases_them_all_and_waits() {
    let mut cluster = Cluster::new(4);
    let gang = cluster.submit(GANG3);
    cluster.round();
    cluster.start(gang);
    cluster.round();
    let before: BTreeMap<u32, _> =
        cluster.live(gang).iter().map(|j| (j.data.job_cookie, j.data.allocation.unwrap())).collect();
    // Rank 1 aborts: one free slot besides the two reusable ones.
    cluster.end(gang, 1, JobOutcome::Aborted { reason: "preempted".into() });
    cluster.round();
    assert_eq!(cluster.op(gang).data.incarnation, 1);
    assert_eq!(cluster.placed_ranks(gang), 3, "placed whole at once");
    for cookie in [0, 2] {
        let job = cluster.live(gang).into_iter().find(|j| j.data.job_cookie == cookie).unwrap();
        assert_eq!(job.data.allocation, Some(before[&cookie]), "cookie {cookie} reuses its allocation");
    }
    // Now another gang takes the free slots and rank 0 aborts: two reusable allocations, no free one.
    cluster.start(gang);
    cluster.round();
    let other = cluster.submit(SOLO);
    cluster.round();
    assert_eq!(cluster.placed_ranks(other), 1);
    cluster.end(gang, 0, JobOutcome::Aborted { reason: "preempted".into() });
    cluster.round();
    assert_eq!(cluster.op(gang).data.incarnation, 2);
    assert_eq!(cluster.placed_ranks(gang), 0, "nothing placed");
    // Nothing held, not even the allocations it could have reused, but the two where ranks 1 and 2 may still run:
    // those stay, idle and marked, until their agents answer for the processes.
    assert_eq!(cluster.held(gang), 2);
    assert_eq!(cluster.queued(), [gang]);
    cluster.start(other);
    cluster.complete(other);
    cluster.round();
    cluster.round();
    // Ranks 1 and 2 may still run in the allocations kept for them (their agents have not answered): placing them
    // elsewhere now could run two processes of one rank at once.
    assert_eq!(cluster.op(gang).data.lingering.len(), 2);
    assert_eq!(cluster.placed_ranks(gang), 0);
    cluster.report_stale_kills(gang);
    cluster.round();
    assert_eq!(cluster.held(gang), 3);
    assert_eq!(cluster.placed_ranks(gang), 3);
    assert!(cluster.op(gang).data.lingering.is_empty());
}

#[test]
fn a_gang_larger_than_the_cluster_fails_after_the_unfit_timeout_and_reserves_nothing_meanwhile() {
    let mut cluster = Cluster::new(3);
    cluster.settings.unfit_timeout = Duration::from_secs(30);
    let huge = cluster.submit(GANG4);
    cluster.round();
    assert_eq!(cluster.op(huge).status, OperationStatus::Running, "not failed at once");
    assert_eq!(cluster.op(huge).data.waiting.as_ref().unwrap().unfit_since, Some(cluster.now));
    let small = cluster.submit(GANG2);
    cluster.round();
    assert_eq!(cluster.placed_ranks(small), 2, "a gang that can never fit holds nothing back");
    cluster.now = cluster.now.plus(Duration::from_secs(29));
    cluster.round();
    assert_eq!(cluster.op(huge).status, OperationStatus::Running);
    cluster.now = cluster.now.plus(Duration::from_secs(1));
    cluster.round();
    let op = cluster.op(huge);
    assert_eq!(op.status, OperationStatus::Failed);
    let result = op.data.result.as_deref().unwrap();
    assert!(
        result.starts_with(
            "gang_placement all_or_nothing: incarnation 0 needs 4 allocations at once, but the live nodes offered \
             only 3 (no node lost within node_return_grace 300s is expected back) for 30s (gang_unfit_timeout 30s): \
             it can never be placed"
        ),
        "{result}"
    );
    assert!(cluster.queued().is_empty(), "a failed gang leaves the queue");
}

#[test]
fn a_gang_submitted_before_its_agents_registered_waits_for_them_instead_of_failing() {
    let mut cluster = Cluster::new(0);
    cluster.settings.unfit_timeout = Duration::from_secs(30);
    let gang = cluster.submit(GANG3);
    cluster.round();
    assert_eq!(cluster.op(gang).status, OperationStatus::Running);
    cluster.now = cluster.now.plus(Duration::from_secs(20));
    for _ in 0..3 {
        cluster.add_node();
    }
    cluster.round();
    assert_eq!(cluster.placed_ranks(gang), 3);
    assert_eq!(cluster.op(gang).data.waiting, None);
}

#[test]
fn a_rank_of_a_placed_incarnation_restarting_alone_is_placed_even_behind_a_waiting_gang() {
    // The task without gang_options restarts its ranked jobs alone; its peers may wait for it at a rendezvous,
    // so the gang queue does not hold it back (else both gangs could wait forever).
    let spec = "{tasks={g={job_count=1;command=g;gang_options={}};p={job_count=2;command=p}};\
                gang_placement=all_or_nothing}";
    let mut cluster = Cluster::new(4);
    let gang = cluster.submit(spec);
    cluster.round();
    assert_eq!(cluster.placed_ranks(gang), 3);
    cluster.start(gang);
    cluster.round();
    let waiting = cluster.submit(GANG2);
    cluster.round();
    assert_eq!(cluster.queued(), [waiting], "one free slot of the two it needs");
    cluster.end(gang, 1, JobOutcome::Exited { code: 3 });
    cluster.round();
    assert_eq!(cluster.op(gang).data.incarnation, 0, "no gang restart");
    let rerun = cluster.live(gang).into_iter().find(|j| j.data.task == "p" && j.data.job_cookie == 1).unwrap();
    assert_eq!(rerun.status, JobStatus::Assigned, "placed though the waiting gang reserves every free slot");
    assert_eq!(rerun.data.gang_rank, Some(1));
}

#[test]
fn an_abort_of_a_waiting_gang_takes_it_out_of_the_queue() {
    let mut cluster = Cluster::new(1);
    let first = cluster.submit(SOLO);
    let second = cluster.submit(SOLO);
    cluster.round();
    assert_eq!(cluster.queued(), [second]);
    cluster.ops.get_mut(&second).unwrap().inbox.push((RowId(0), Message::Abort { reason: "enough".into() }));
    cluster.round();
    assert_eq!(cluster.op(second).status, OperationStatus::Aborted);
    assert!(cluster.queued().is_empty());
    assert_eq!(cluster.op(first).status, OperationStatus::Running);
}

#[test]
fn with_the_gate_disabled_for_a_mutation_test_an_all_or_nothing_gang_is_placed_in_waves() {
    let mut cluster = Cluster::new(3);
    cluster.settings.gate_disabled_for_mutation_test = true;
    let a = cluster.submit(GANG2);
    let b = cluster.submit(GANG2);
    cluster.round();
    assert_eq!((cluster.placed_ranks(a), cluster.placed_ranks(b)), (2, 1));
    assert_eq!(cluster.op(b).data.placement, Some(GangPlacement::AllOrNothing), "while its data says otherwise");
}

#[test]
fn a_restarting_gang_whose_node_is_down_keeps_its_place_and_its_slots_until_the_node_returns() {
    // Issue 40: the gang needs more slots than the live nodes offer while its node is down; it was taken for unfit,
    // held nothing back (later work took the slots it freed) and failed after the unfit timeout.
    let mut cluster = Cluster::new(3);
    let gang = cluster.submit(GANG3);
    cluster.round();
    cluster.start(gang);
    cluster.round();
    let node = cluster.lose_node_of(gang, 2);
    cluster.round();
    assert_eq!(cluster.op(gang).data.incarnation, 1, "the node loss restarted the gang");
    assert_eq!(cluster.queued(), [gang]);
    let waiting = cluster.op(gang).data.waiting.clone().expect("waits");
    assert_eq!(waiting.unfit_since, None, "its node is expected back: not unfit");
    cluster.report_stale_kills(gang); // ranks 0 and 1 were killed on their live nodes: their slots are free
    cluster.round();
    assert_eq!(cluster.held(gang), 0);
    // Later work: a plain operation and a gang of one. Neither takes a slot the waiting gang freed.
    let plain = cluster.submit("{tasks={p={job_count=1;command=p}}}");
    let solo = cluster.submit(SOLO);
    cluster.round();
    assert_eq!(cluster.held(plain) + cluster.held(solo), 0, "the freed slots stay reserved for the gang");
    cluster.now = cluster.now.plus(Duration::from_secs(90)); // past the 60 s unfit timeout
    cluster.round();
    assert_eq!(cluster.op(gang).status, OperationStatus::Running, "not failed while its node is expected back");
    cluster.return_node(node);
    cluster.round();
    assert_eq!(cluster.placed_ranks(gang), 3, "placed whole once its node is back");
    assert_eq!(cluster.held(plain) + cluster.held(solo), 0, "and the later work waits for a free slot");
}

#[test]
fn a_gang_whose_lost_node_never_returns_fails_after_the_grace_and_the_unfit_timeout_naming_what_it_counted() {
    let mut cluster = Cluster::new(3);
    cluster.settings.unfit_timeout = Duration::from_secs(30);
    cluster.settings.node_return_grace = Duration::from_secs(100);
    let gang = cluster.submit(GANG3);
    cluster.round();
    cluster.start(gang);
    cluster.round();
    cluster.lose_node_of(gang, 0);
    cluster.round();
    cluster.now = cluster.now.plus(Duration::from_secs(99));
    cluster.round();
    assert_eq!(cluster.op(gang).data.waiting.as_ref().unwrap().unfit_since, None, "still expected back");
    cluster.now = cluster.now.plus(Duration::from_secs(1));
    cluster.round();
    assert_eq!(cluster.op(gang).data.waiting.as_ref().unwrap().unfit_since, Some(cluster.now), "no longer");
    cluster.now = cluster.now.plus(Duration::from_secs(30));
    cluster.round();
    let op = cluster.op(gang);
    assert_eq!(op.status, OperationStatus::Failed);
    let result = op.data.result.as_deref().unwrap();
    assert!(
        result.contains(
            "incarnation 1 needs 3 allocations at once, but the live nodes offered only 2 (no node lost within \
             node_return_grace 100s is expected back) for 30s"
        ),
        "{result}"
    );
    assert!(cluster.queued().is_empty());
}

#[test]
fn a_restarting_gang_waits_ahead_of_the_gangs_that_arrived_after_it() {
    // Issue 40: a gang that restarted and did not fit joined the queue at its end, so a gang submitted after it
    // (waiting already) took the slots it freed, and it waited a whole job length more.
    let mut cluster = Cluster::new(4);
    let first = cluster.submit(GANG3);
    cluster.round();
    cluster.start(first);
    cluster.round();
    let later = cluster.submit(GANG2);
    cluster.round();
    assert_eq!(cluster.queued(), [later], "one free slot of the two it needs");
    cluster.end(first, 1, JobOutcome::Exited { code: 1 });
    cluster.round();
    assert_eq!(cluster.op(first).data.incarnation, 1);
    eprintln!(
        "DEBUG later placed {} held {} first held {} waiting {:?}",
        cluster.placed_ranks(later),
        cluster.held(later),
        cluster.held(first),
        cluster.op(first).data.waiting
    );
    assert_eq!(cluster.queued(), [first, later], "the restarting gang waits ahead of the gang that came after it");
    cluster.report_stale_kills(first);
    cluster.round();
    cluster.round();
    assert_eq!(cluster.placed_ranks(first), 3, "placed first with the slots it freed");
    assert_eq!(cluster.placed_ranks(later), 0);
    assert_eq!(cluster.queued(), [later]);
}
