//! What the HTML timeline draws, read from a trace's text alone ([`Model::of_trace`]): one lane per node with
//! its faults as spans, one per operation with its incarnations, one per allocation with its jobs and their
//! processes, and one per row with its leases (holder, token, until when), takeovers and stale writes.
//!
//! The trace lines it reads ([`super::super::trace`], `sim/gang.rs`'s module docs, `CommitOp`'s `Display`):
//! - faults: `kill`/`restart` (a replica or agent; the database's `kill` ends at its next `start`; `world heal`
//!   ends every fault still open),
//!   `pause`/`resume`, `clock-drift`/`clock-exact` on the node itself; `partition A<->B`/`partition-end`,
//!   `isolate X`/`isolate-end`, `degrade`/`degrade-end`, `buggify`/`buggify-end` on `world`;
//!   `lost-replies`/`lost-replies-end` on `db`; `contention` and `skipped` are instants;
//! - leases: `commit fetch PIPELINE [ID#TOKEN,…]` hands out leases (a row leased again while its previous lease
//!   never ended is a takeover), `heartbeat [ID#TOKEN,…]` renews them, `apply ID#TOKEN applied|stale`,
//!   `reset ID#TOKEN`, `failure ID#TOKEN …` and `release [ID#TOKEN,…]` end them; an apply under a token that is
//!   not the row's latest is a stale apply (`stale`: the guard turned it away; `applied`: a stale write, the bug
//!   lease exclusivity catches);
//! - operations: `submit`, `incarnation` (a span until the next one or the operation's end), `op-state`,
//!   `gang-wait` (until `gang-placed`); jobs: `job`/`node-lost` lines with `alloc=` open a job's span on its
//!   allocation at `assigned` and end it at `completed`, `failed` or `aborted`; processes: `proc-start` until
//!   `proc-exit`, `proc-kill` or the `fence-kill` naming the job.
//!
//! A lease's end is the earliest of the line that ends it and its expiry (its last renewal plus the lease ttl of
//! its pipeline) when the ttl is known ([`LeaseTtls`]: from the scenario; a bare trace has none, and a lease
//! then lasts until the line that ends it or takes it over).

use super::super::explain::{field_tokens, parse_line};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Which section a lane belongs to, in the order the page shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// A node: `world`, `db`, `client`, `replica-N`, `agent-N`, a service.
    Node,
    /// A gang operation (its row id).
    Operation,
    /// An allocation (`alloc=ROW.SLOT` in job lines).
    Allocation,
    /// A row of the database, with its leases.
    Row,
}

/// One horizontal lane of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Its section.
    pub group: Group,
    /// Its name in its section: the node's name, the operation's or row's id, the allocation (`7.1`).
    pub key: String,
    /// What its label says beside the key (the operation's name, the row's kind, the allocation's node).
    pub note: String,
    /// The operations (row ids) whose lines touch it; an operation lane holds its own id.
    pub ops: BTreeSet<u64>,
}

/// What an item is; the page draws each kind in its own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A node killed (or the database down) until its restart.
    Down,
    /// A node paused until it resumes.
    Pause,
    /// A link cut between two nodes.
    Partition,
    /// Every link of a node cut.
    Isolate,
    /// A node's clock drifting.
    Drift,
    /// Slow, lossy links everywhere.
    Degrade,
    /// The database dropping replies after commit.
    LostReplies,
    /// madsim's buggify on.
    Buggify,
    /// Any other line of a node (starts, fences, sessions, time-outs, contention bursts, …): an instant.
    Event,
    /// One incarnation of an operation, until the next or the operation's end.
    Incarnation,
    /// An all-or-nothing incarnation waiting in the gang queue.
    GangWait,
    /// An operation's state change: an instant.
    OpState,
    /// A job placed on an allocation, until it ended; `state` holds how.
    Job,
    /// A job's process, from its start to its exit or kill.
    Process,
    /// A lease on a row: holder, token, from its handing out to its end.
    Lease,
    /// A row leased again while its previous lease never ended: an instant.
    Takeover,
    /// An apply (or failure, heartbeat) under a token that is not the row's latest, turned away: an instant.
    StaleApply,
    /// An apply under a token that is not the row's latest that took effect: an instant (the guarded apply's bug).
    StaleWrite,
}

/// One thing drawn on a lane: a span (`end > start`, or an open one closed at the trace's end) or an instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Index of its lane in [`Model::lanes`].
    pub lane: usize,
    /// Simulated microseconds since the world was built.
    pub start: u64,
    /// Its end in the same clock (equal to `start` for an instant).
    pub end: u64,
    /// What it is.
    pub kind: Kind,
    /// The trace line (0-based, in the text's lines) it starts at.
    pub line: usize,
    /// The trace line that ended it, if one did.
    pub end_line: Option<usize>,
    /// A short text drawn inside it (the lease's token and holder, the job, the incarnation's reason).
    pub label: String,
    /// How it ended, for spans that end in different ways (`applied`, `reset`, `expired`, `taken over`,
    /// `completed`, `exit 1`, `killed`, …); empty otherwise.
    pub state: String,
    /// The operation it belongs to, if any.
    pub op: Option<u64>,
    /// The node that holds it (a lease's holder, a process's agent), as the index of its lane.
    pub holder: Option<usize>,
}

/// The lease ttl of each pipeline (by the name `fetch` lines give it), for where a lease ends when nothing
/// ended it. Pipelines not listed have none known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseTtls {
    /// By pipeline name.
    pub by_pipeline: BTreeMap<String, Duration>,
    /// Pipelines whose name starts with one of these prefixes (`agent:` for every agent's node pipeline).
    pub by_prefix: Vec<(String, Duration)>,
    /// Any other pipeline (the built-in row workload's).
    pub default: Option<Duration>,
}

impl LeaseTtls {
    /// The ttl of `pipeline`'s leases, if known.
    pub fn of(&self, pipeline: &str) -> Option<Duration> {
        let prefixed = self.by_prefix.iter().find(|(prefix, _)| pipeline.starts_with(prefix.as_str()));
        self.by_pipeline.get(pipeline).copied().or(prefixed.map(|(_, ttl)| *ttl)).or(self.default)
    }
}

/// Every lane and item of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    /// Lanes in page order: nodes (world, db, client, replicas, agents, the rest by name), operations,
    /// allocations and rows, each by id.
    pub lanes: Vec<Lane>,
    /// Items, by lane and then by start.
    pub items: Vec<Item>,
    /// The last line's time (simulated microseconds).
    pub end: u64,
}

/// Simulated microseconds of a trace time (`12.000345`); `None` if it is not one.
pub fn micros(at: &str) -> Option<u64> {
    let (seconds, fraction) = at.split_once('.')?;
    if fraction.len() != 6 {
        return None;
    }
    seconds.parse::<u64>().ok()?.checked_mul(1_000_000)?.checked_add(fraction.parse::<u64>().ok()?)
}

/// `key=value` of `fields` (string literals kept whole), for the first word with that key.
fn field<'a>(fields: &'a str, key: &str) -> Option<&'a str> {
    field_tokens(fields).into_iter().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// The value of a `key=value` as text: a string literal unquoted, `-` as nothing.
fn text_of(value: Option<&str>) -> String {
    match value {
        Some("-") | None => String::new(),
        Some(value) => value.trim_matches('"').replace("\\\"", "\""),
    }
}

/// `row#token` → (row, token).
fn lease_of(word: &str) -> Option<(u64, u64)> {
    let (row, token) = word.split_once('#')?;
    Some((row.parse().ok()?, token.parse().ok()?))
}

/// The leases of a bracketed list, `[12#5,13#6]`.
fn leases_in(list: &str) -> Vec<(u64, u64)> {
    list.trim_matches(|c| c == '[' || c == ']').split(',').filter_map(lease_of).collect()
}

/// Bare row ids of a bracketed list or `key=[…]`, `[3,4]`.
fn ids_in(list: &str) -> Vec<u64> {
    let list = list.split_once('=').map_or(list, |(_, values)| values);
    list.trim_matches(|c| c == '[' || c == ']').split(',').filter_map(|id| id.parse().ok()).collect()
}

/// A world-level target as a fault line prints it (`Replica(1)`, `Agent(0)`, `Db`, `Client`) → its node name.
fn node_of_target(target: &str) -> Option<String> {
    let target = target.trim();
    let indexed = |prefix: &str, name: &str| {
        let index = target.strip_prefix(prefix)?.strip_suffix(')')?;
        index.parse::<usize>().ok().map(|index| format!("{name}-{index}"))
    };
    match target {
        "Db" => Some("db".into()),
        "Client" => Some("client".into()),
        _ => indexed("Replica(", "replica").or_else(|| indexed("Agent(", "agent")),
    }
}

/// The order of node lanes: world, db, client, replicas, agents by number, then the rest by name.
fn node_order(name: &str) -> (u8, u64, String) {
    let numbered = |prefix: &str| name.strip_prefix(prefix).and_then(|n| n.parse::<u64>().ok());
    match name {
        "world" => (0, 0, String::new()),
        "db" => (1, 0, String::new()),
        "client" => (2, 0, String::new()),
        _ => match (numbered("replica-"), numbered("agent-")) {
            (Some(n), _) => (3, n, String::new()),
            (_, Some(n)) => (4, n, String::new()),
            _ => (5, 0, name.to_string()),
        },
    }
}

/// An allocation key `7.1` in id order (`7.10` after `7.9`).
fn allocation_order(key: &str) -> (u64, u64, String) {
    let (row, slot) = key.split_once('.').unwrap_or((key, ""));
    (row.parse().unwrap_or(u64::MAX), slot.parse().unwrap_or(0), key.to_string())
}

/// How a lease still held when the trace ends ends.
const HELD_AT_END: &str = "held at the end";

/// A lease being followed: open until a line ends it.
#[derive(Clone, Debug)]
struct OpenLease {
    row: u64,
    token: u64,
    holder: String,
    pipeline: String,
    start: u64,
    renewed: u64,
    line: usize,
    op: Option<u64>,
}

/// A span being followed on some lane, keyed by what ends it.
#[derive(Clone, Debug)]
struct Open {
    lane: LaneKey,
    start: u64,
    kind: Kind,
    line: usize,
    label: String,
    op: Option<u64>,
    holder: Option<String>,
}

/// A lane before lanes are numbered.
type LaneKey = (Group, String);

/// Builds a [`Model`] line by line.
#[derive(Default)]
struct Builder {
    ttls: LeaseTtls,
    nodes: BTreeSet<String>,
    notes: BTreeMap<LaneKey, String>,
    lane_ops: BTreeMap<LaneKey, BTreeSet<u64>>,
    items: Vec<(LaneKey, Item, Option<String>)>,
    faults: BTreeMap<(String, &'static str), Vec<Open>>,
    incarnations: BTreeMap<u64, Open>,
    waits: BTreeMap<String, Open>,
    jobs: BTreeMap<String, Open>,
    processes: BTreeMap<String, Open>,
    leases: BTreeMap<u64, OpenLease>,
    latest_token: BTreeMap<u64, u64>,
    now: u64,
}

impl Model {
    /// The model of a trace's text (`time node kind fields` lines; other lines are skipped), with the lease
    /// ttls known for its pipelines.
    pub fn of_trace(trace: &str, ttls: &LeaseTtls) -> Model {
        let mut builder = Builder { ttls: ttls.clone(), ..Builder::default() };
        for (index, text) in trace.lines().enumerate() {
            let Some(line) = parse_line(text) else { continue };
            let Some(at) = micros(line.at) else { continue };
            builder.now = builder.now.max(at);
            builder.nodes.insert(line.node.to_string());
            builder.line(index, at, line.node, line.kind, line.fields);
        }
        builder.finish()
    }
}

impl Builder {
    fn line(&mut self, index: usize, at: u64, node: &str, kind: &str, fields: &str) {
        let op = field(fields, "op").and_then(|op| op.parse::<u64>().ok());
        match kind {
            "commit" => self.commit(index, at, node, fields, op),
            "kill" | "pause" | "clock-drift" => {
                let (kind, label) = match kind {
                    "kill" => (Kind::Down, if node == "db" { "database down" } else { "killed" }),
                    "pause" => (Kind::Pause, "paused"),
                    _ => (Kind::Drift, "clock drift"),
                };
                let label = match field(fields, "rate_ppm") {
                    Some(rate) => format!("{label} {rate} ppm"),
                    None => label.to_string(),
                };
                self.open_fault(node, kind, index, at, (Group::Node, node.to_string()), label);
            }
            "restart" | "resume" | "clock-exact" => {
                let opened = match kind {
                    "restart" => Kind::Down,
                    "resume" => Kind::Pause,
                    _ => Kind::Drift,
                };
                self.close_fault(node, opened, index, at);
            }
            "start" if node == "db" => self.close_fault(node, Kind::Down, index, at),
            "heal" => {
                // The world heals every fault left open at once (restarts, resumes, exact clocks, links back).
                for open in std::mem::take(&mut self.faults).into_values().flatten().collect::<Vec<_>>() {
                    self.close(open, at, Some(index), "healed".into());
                }
                self.instant((Group::Node, node.into()), Kind::Event, index, at, kind.into(), op, None);
            }
            "partition" | "partition-end" => self.partition(index, at, kind, fields),
            "isolate" | "isolate-end" => {
                let target = fields.split_whitespace().next().and_then(node_of_target);
                if let Some(target) = target {
                    self.nodes.insert(target.clone());
                    match kind {
                        "isolate" => {
                            let lane = (Group::Node, target.clone());
                            self.open_fault(&target, Kind::Isolate, index, at, lane, "isolated".into());
                        }
                        _ => self.close_fault(&target, Kind::Isolate, index, at),
                    }
                }
            }
            "degrade" | "buggify" | "lost-replies" => {
                let (fault, label) = match kind {
                    "degrade" => (Kind::Degrade, "links degraded"),
                    "buggify" => (Kind::Buggify, "buggify"),
                    _ => (Kind::LostReplies, "replies lost"),
                };
                self.open_fault(node, fault, index, at, (Group::Node, node.to_string()), label.into());
            }
            "degrade-end" | "buggify-end" | "lost-replies-end" => {
                let fault = match kind {
                    "degrade-end" => Kind::Degrade,
                    "buggify-end" => Kind::Buggify,
                    _ => Kind::LostReplies,
                };
                self.close_fault(node, fault, index, at);
            }
            "submit" => {
                if let Some(op) = op {
                    let lane = (Group::Operation, op.to_string());
                    self.notes.insert(lane.clone(), text_of(field(fields, "name")));
                    self.instant(lane, Kind::OpState, index, at, "submitted".into(), Some(op), None);
                }
                self.instant((Group::Node, node.into()), Kind::Event, index, at, kind.into(), op, None);
            }
            "incarnation" => self.incarnation(index, at, fields, op),
            "op-state" => self.op_state(index, at, fields, op),
            "gang-wait" | "gang-placed" => self.gang_queue(index, at, kind, fields, op),
            "job" | "node-lost" => self.job(index, at, fields, op),
            "proc-start" | "proc-exit" | "proc-kill" | "proc-start-failed" => {
                self.process(index, at, node, kind, fields, op)
            }
            "fence-kill" => {
                for job in field(fields, "jobs").unwrap_or("").split(',') {
                    self.close_process(job, index, at, "killed by fence");
                }
                self.instant((Group::Node, node.into()), Kind::Event, index, at, kind.into(), op, None);
            }
            "spec-update" => {
                if let Some(op) = op {
                    let lane = (Group::Operation, op.to_string());
                    self.instant(lane, Kind::OpState, index, at, "spec update".into(), Some(op), None);
                }
            }
            _ => self.instant((Group::Node, node.into()), Kind::Event, index, at, kind.into(), op, None),
        }
    }

    fn open_fault(&mut self, node: &str, kind: Kind, line: usize, at: u64, lane: LaneKey, label: String) {
        let open = Open { lane, start: at, kind, line, label, op: None, holder: None };
        self.faults.entry((node.to_string(), kind_name(kind))).or_default().push(open);
    }

    fn close_fault(&mut self, node: &str, kind: Kind, line: usize, at: u64) {
        let open = self.faults.get_mut(&(node.to_string(), kind_name(kind))).and_then(|opened| opened.pop());
        if let Some(open) = open {
            self.close(open, at, Some(line), String::new());
        }
    }

    fn partition(&mut self, index: usize, at: u64, kind: &str, fields: &str) {
        let pair = fields.split_whitespace().next().unwrap_or("");
        let Some((a, b)) = pair.split_once("<->") else { return };
        let (Some(a), Some(b)) = (node_of_target(a), node_of_target(b)) else { return };
        for (this, other) in [(&a, &b), (&b, &a)] {
            self.nodes.insert(this.clone());
            let key = format!("{this}|{other}");
            match kind {
                "partition" => {
                    let lane = (Group::Node, this.clone());
                    self.open_fault(&key, Kind::Partition, index, at, lane, format!("cut from {other}"));
                }
                _ => self.close_fault(&key, Kind::Partition, index, at),
            }
        }
    }

    fn incarnation(&mut self, index: usize, at: u64, fields: &str, op: Option<u64>) {
        let Some(op) = op else { return };
        if let Some(open) = self.incarnations.remove(&op) {
            self.close(open, at, Some(index), "restarted".into());
        }
        let trigger = text_of(field(fields, "trigger"));
        let reason = text_of(field(fields, "reason"));
        let index_text = text_of(field(fields, "index"));
        let label = match trigger.is_empty() {
            true => format!("incarnation {index_text}: {reason}"),
            false => format!("incarnation {index_text}: {reason} (trigger job {trigger})"),
        };
        let lane = (Group::Operation, op.to_string());
        self.lane_ops.entry(lane.clone()).or_default().insert(op);
        let open = Open { lane, start: at, kind: Kind::Incarnation, line: index, label, op: Some(op), holder: None };
        self.incarnations.insert(op, open);
    }

    fn op_state(&mut self, index: usize, at: u64, fields: &str, op: Option<u64>) {
        let Some(op) = op else { return };
        let to = text_of(field(fields, "to"));
        let lane = (Group::Operation, op.to_string());
        self.instant(lane, Kind::OpState, index, at, to.clone(), Some(op), None);
        if matches!(to.as_str(), "completed" | "failed" | "aborted")
            && let Some(open) = self.incarnations.remove(&op)
        {
            self.close(open, at, Some(index), to);
        }
    }

    fn gang_queue(&mut self, index: usize, at: u64, kind: &str, fields: &str, op: Option<u64>) {
        let Some(op) = op else { return };
        let incarnation = text_of(field(fields, "inc"));
        if let Some(open) = self.waits.remove(&incarnation) {
            self.close(open, at, Some(index), "placed".into());
        }
        if kind == "gang-wait" {
            let label = format!("waiting for {} slots", text_of(field(fields, "need")));
            let lane = (Group::Operation, op.to_string());
            let open = Open { lane, start: at, kind: Kind::GangWait, line: index, label, op: Some(op), holder: None };
            self.waits.insert(incarnation, open);
        }
    }

    fn job(&mut self, index: usize, at: u64, fields: &str, op: Option<u64>) {
        let job = text_of(field(fields, "job"));
        let alloc = text_of(field(fields, "alloc"));
        let to = text_of(field(fields, "to"));
        let node = text_of(field(fields, "node"));
        if job.is_empty() {
            return;
        }
        if matches!(to.as_str(), "completed" | "failed" | "aborted") {
            if let Some(open) = self.jobs.remove(&job) {
                let reason = text_of(field(fields, "reason"));
                let state = if reason.is_empty() { to } else { format!("{to}: {reason}") };
                self.close(open, at, Some(index), state);
            }
            return;
        }
        if alloc.is_empty() || self.jobs.contains_key(&job) {
            return;
        }
        let lane = (Group::Allocation, alloc);
        if !node.is_empty() {
            self.notes.insert(lane.clone(), node.clone());
        }
        if let Some(op) = op {
            self.lane_ops.entry(lane.clone()).or_default().insert(op);
        }
        let rank = text_of(field(fields, "rank"));
        let rank = if rank.is_empty() { String::new() } else { format!(" rank {rank}") };
        let label = format!("job {job} {}{rank} ({})", text_of(field(fields, "task")), text_of(field(fields, "inc")));
        let holder = (!node.is_empty()).then_some(node);
        let open = Open { lane, start: at, kind: Kind::Job, line: index, label, op, holder };
        self.jobs.insert(job, open);
    }

    fn process(&mut self, index: usize, at: u64, node: &str, kind: &str, fields: &str, op: Option<u64>) {
        let job = text_of(field(fields, "job"));
        let alloc = text_of(field(fields, "alloc"));
        match kind {
            "proc-start" => {
                self.close_process(&job, index, at, "restarted");
                let lane = (Group::Allocation, alloc);
                if let Some(op) = op {
                    self.lane_ops.entry(lane.clone()).or_default().insert(op);
                }
                let label = format!("process of {job}");
                let holder = Some(node.to_string());
                let open = Open { lane, start: at, kind: Kind::Process, line: index, label, op, holder };
                self.processes.insert(job, open);
            }
            "proc-exit" => {
                let code = text_of(field(fields, "code"));
                self.close_process(&job, index, at, &format!("exit {code}"));
            }
            "proc-kill" => self.close_process(&job, index, at, "killed"),
            _ => {
                let lane = (Group::Allocation, alloc);
                self.instant(lane, Kind::Event, index, at, "start failed".into(), op, Some(node.into()));
            }
        }
    }

    fn close_process(&mut self, job: &str, index: usize, at: u64, how: &str) {
        if let Some(open) = self.processes.remove(job) {
            self.close(open, at, Some(index), how.to_string());
        }
    }

    fn commit(&mut self, index: usize, at: u64, node: &str, fields: &str, op: Option<u64>) {
        let words: Vec<&str> = fields.split_whitespace().collect();
        let touch = |builder: &mut Builder, row: u64| {
            if let Some(op) = op {
                builder.lane_ops.entry((Group::Row, row.to_string())).or_default().insert(op);
            }
        };
        match words.as_slice() {
            ["insert", row, kind, ..] => {
                if let Ok(row) = row.parse::<u64>() {
                    self.notes.insert((Group::Row, row.to_string()), kind.to_string());
                    touch(self, row);
                }
            }
            ["fetch", pipeline, list, ..] => {
                for (row, token) in leases_in(list) {
                    touch(self, row);
                    self.fetch(index, at, node, pipeline, row, token, op);
                }
            }
            ["heartbeat", list, ..] => {
                for (row, token) in leases_in(list) {
                    match self.leases.get_mut(&row) {
                        Some(lease) if lease.token == token => lease.renewed = at,
                        _ => self.stale(index, at, node, row, token, Kind::StaleApply, "heartbeat", op),
                    }
                }
            }
            ["apply", lease, outcome, rest @ ..] => {
                let Some((row, token)) = lease_of(lease) else { return };
                touch(self, row);
                for word in rest {
                    for related in ids_in(word) {
                        touch(self, related);
                    }
                }
                let current = self.latest_token.get(&row) == Some(&token);
                match (*outcome, current) {
                    ("applied", true) => self.end_lease(row, token, index, at, "applied"),
                    ("applied", false) => self.stale(index, at, node, row, token, Kind::StaleWrite, "apply", op),
                    _ => self.stale(index, at, node, row, token, Kind::StaleApply, "apply", op),
                }
            }
            ["reset", lease, ..] | ["failure", lease, ..] => {
                let Some((row, token)) = lease_of(lease) else { return };
                let what = words[0];
                match self.latest_token.get(&row) == Some(&token) && !fields.contains(" stale") {
                    true => self.end_lease(row, token, index, at, what),
                    false => self.stale(index, at, node, row, token, Kind::StaleApply, what, op),
                }
            }
            ["release", list, ..] => {
                for (row, token) in leases_in(list) {
                    self.end_lease(row, token, index, at, "released");
                }
            }
            ["lock_related", holder, _owner, list, ..] => {
                if let Some((row, _)) = lease_of(holder) {
                    touch(self, row);
                }
                for related in ids_in(list) {
                    touch(self, related);
                }
            }
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch(&mut self, index: usize, at: u64, node: &str, pipeline: &str, row: u64, token: u64, op: Option<u64>) {
        if let Some(previous) = self.leases.remove(&row) {
            self.push_lease(previous, at, None, "taken over");
            let label = format!("taken over by {node} with token {token}");
            self.instant((Group::Row, row.to_string()), Kind::Takeover, index, at, label, op, Some(node.into()));
        }
        self.latest_token.insert(row, token);
        let (holder, pipeline) = (node.to_string(), pipeline.to_string());
        let lease = OpenLease { row, token, holder, pipeline, start: at, renewed: at, line: index, op };
        self.leases.insert(row, lease);
    }

    fn end_lease(&mut self, row: u64, token: u64, index: usize, at: u64, how: &str) {
        match self.leases.get(&row) {
            Some(lease) if lease.token == token => {
                let lease = self.leases.remove(&row).expect("the lease just found");
                self.push_lease(lease, at, Some(index), how);
            }
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn stale(
        &mut self,
        index: usize,
        at: u64,
        node: &str,
        row: u64,
        token: u64,
        kind: Kind,
        what: &str,
        op: Option<u64>,
    ) {
        let latest = self.latest_token.get(&row).map_or("none".to_string(), u64::to_string);
        let label = match kind {
            Kind::StaleWrite => format!("{what} by {node} took effect under token {token}; the latest is {latest}"),
            _ => format!("{what} by {node} under token {token} turned away; the latest is {latest}"),
        };
        self.instant((Group::Row, row.to_string()), kind, index, at, label, op, Some(node.into()));
    }

    /// Ends `lease` at `at` (the line `end_line` ended it, or a takeover did), or at its expiry if that came first.
    fn push_lease(&mut self, lease: OpenLease, at: u64, end_line: Option<usize>, how: &str) {
        let row = lease.row.to_string();
        let expiry = self.ttls.of(&lease.pipeline).map(|ttl| lease.renewed + micros_of(ttl));
        let (end, state) = match expiry {
            Some(expiry) if expiry < at && end_line.is_none() && how == HELD_AT_END => (expiry, "expired".into()),
            Some(expiry) if expiry < at => (expiry, format!("expired, then {how}")),
            _ => (at, how.to_string()),
        };
        let until = match expiry {
            Some(expiry) => format!(", until {} s", seconds(expiry)),
            None => String::new(),
        };
        let label = format!("#{} {} ({}{until})", lease.token, lease.holder, lease.pipeline);
        let item = Item {
            lane: 0,
            start: lease.start,
            end: end.max(lease.start),
            kind: Kind::Lease,
            line: lease.line,
            end_line,
            label,
            state,
            op: lease.op,
            holder: None,
        };
        self.items.push(((Group::Row, row), item, Some(lease.holder)));
    }

    #[allow(clippy::too_many_arguments)]
    fn instant(
        &mut self,
        lane: LaneKey,
        kind: Kind,
        line: usize,
        at: u64,
        label: String,
        op: Option<u64>,
        holder: Option<String>,
    ) {
        if let Some(op) = op {
            self.lane_ops.entry(lane.clone()).or_default().insert(op);
        }
        let item = Item {
            lane: 0,
            start: at,
            end: at,
            kind,
            line,
            end_line: None,
            label,
            state: String::new(),
            op,
            holder: None,
        };
        self.items.push((lane, item, holder));
    }

    fn close(&mut self, open: Open, at: u64, end_line: Option<usize>, state: String) {
        let item = Item {
            lane: 0,
            start: open.start,
            end: at.max(open.start),
            kind: open.kind,
            line: open.line,
            end_line,
            label: open.label,
            state,
            op: open.op,
            holder: None,
        };
        self.items.push((open.lane, item, open.holder));
    }

    fn finish(mut self) -> Model {
        let end = self.now;
        let open: Vec<Open> = std::mem::take(&mut self.faults).into_values().flatten().collect();
        let open = open
            .into_iter()
            .chain(std::mem::take(&mut self.incarnations).into_values())
            .chain(std::mem::take(&mut self.waits).into_values())
            .chain(std::mem::take(&mut self.jobs).into_values())
            .chain(std::mem::take(&mut self.processes).into_values());
        for open in open.collect::<Vec<_>>() {
            self.close(open, end, None, "still open at the end".into());
        }
        for lease in std::mem::take(&mut self.leases).into_values() {
            self.push_lease(lease, end, None, HELD_AT_END);
        }
        self.number(end)
    }

    /// Numbers the lanes in page order and sorts the items by lane and start.
    fn number(self, end: u64) -> Model {
        let mut keys: BTreeSet<LaneKey> = self.nodes.iter().map(|node| (Group::Node, node.clone())).collect();
        keys.extend(self.items.iter().map(|(lane, _, _)| lane.clone()));
        keys.extend(self.notes.keys().cloned());
        let mut keys: Vec<LaneKey> = keys.into_iter().collect();
        keys.sort_by_cached_key(|(group, key)| {
            let order = match group {
                Group::Node => node_order(key),
                Group::Allocation => {
                    let (row, slot, key) = allocation_order(key);
                    (0, row * 1_000_000 + slot, key)
                }
                _ => (0, key.parse().unwrap_or(u64::MAX), key.clone()),
            };
            (*group, order)
        });
        let index: BTreeMap<&LaneKey, usize> = keys.iter().enumerate().map(|(at, key)| (key, at)).collect();
        let node_lane = |node: &str| index.get(&(Group::Node, node.to_string())).copied();
        let mut items: Vec<Item> = self
            .items
            .iter()
            .map(|(lane, item, holder)| Item {
                lane: index[lane],
                holder: holder.as_deref().and_then(node_lane),
                ..item.clone()
            })
            .collect();
        items.sort_by_key(|item| (item.lane, item.start, item.end, item.line));
        let lanes = keys
            .iter()
            .map(|lane| {
                let mut ops = self.lane_ops.get(lane).cloned().unwrap_or_default();
                if lane.0 == Group::Operation
                    && let Ok(op) = lane.1.parse()
                {
                    ops.insert(op);
                }
                Lane {
                    group: lane.0,
                    key: lane.1.clone(),
                    note: self.notes.get(lane).cloned().unwrap_or_default(),
                    ops,
                }
            })
            .collect();
        Model { lanes, items, end }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Down => "down",
        Kind::Pause => "pause",
        Kind::Partition => "partition",
        Kind::Isolate => "isolate",
        Kind::Drift => "drift",
        Kind::Degrade => "degrade",
        Kind::LostReplies => "lost-replies",
        Kind::Buggify => "buggify",
        _ => "other",
    }
}

fn micros_of(span: Duration) -> u64 {
    u64::try_from(span.as_micros()).unwrap_or(u64::MAX)
}

/// Simulated microseconds as seconds with three decimals.
pub fn seconds(micros: u64) -> String {
    format!("{}.{:03}", micros / 1_000_000, micros % 1_000_000 / 1_000)
}
