//! The trace of a run: one line per event, `time node kind fields`, in the order the simulator produced them
//! (DESIGN §5: the same seed and build give a byte-identical trace; `tests/sim_world.rs` checks it).
//!
//! Events come from every part of the world: the database node writes one `commit` line per committed store
//! call (naming the node that sent it) and one line per reply it drops; store clients write their time-outs;
//! replicas write their starts and drains; the world writes every fault it injects and heals. Time is simulated
//! time since the world was built, in microseconds, printed as seconds.
//!
//! A commit line keeps the commit itself ([`Fields::Commit`]), a gang controller's event line its event
//! ([`Fields::OperationEvent`]); both are written out only when the trace is read (rendered, hashed, printed or
//! matched): a passing run never reads most of its lines.

use super::gang;
use crate::store::{CommitOp, Event, RowId};
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// Most events a trace keeps (STYLE: every growing thing has a bound). A 10-minute, 10 000-row run writes about
/// 10⁵. A run that would write more ends there, [`Outgrown`]: its scenario is too large for one run.
pub const TRACE_LEN_MAX: usize = 5_000_000;

/// Why a run ended before its end without being judged: it outgrew a bound of one run (its trace reached
/// [`TRACE_LEN_MAX`] events; or, judged outside the run, it passed its wall-clock limit with its simulated time
/// still advancing: [`wall_limit`](super::run::wall_limit)). The scenario is too large to simulate in one run (a long span at high rates, or
/// many replicas each woken by every hint), which says nothing of the system under test: the run's report carries
/// it as [`RunReport::outgrown`](super::run::RunReport::outgrown), `sim run` and `sim sweep` exit 2 naming the keys
/// to change, and no replay file is written. The trace records nothing past its bound and wakes
/// [`Trace::outgrown`], which the run races against the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgrown {
    /// What was outgrown and when, one line: `its trace reached 5000000 events at 1234.5 s of simulated time`.
    pub what: String,
}

/// The most events a run's trace holds: `LOCKSTEP_SIM_TRACE_LEN_MAX` (a lower bound, so that a test can see a run
/// outgrow it quickly), else [`TRACE_LEN_MAX`].
///
/// Panics if the variable is set to something other than a whole number in `1..=TRACE_LEN_MAX` (the simulator's
/// commands refuse that first, exit 2: [`try_trace_len_max`]).
pub fn trace_len_max() -> usize {
    try_trace_len_max().unwrap_or_else(|rule| panic!("{rule}"))
}

/// As [`trace_len_max`]; a bad value is the broken rule, naming the variable.
pub fn try_trace_len_max() -> Result<usize, String> {
    match std::env::var("LOCKSTEP_SIM_TRACE_LEN_MAX") {
        Err(_) => Ok(TRACE_LEN_MAX),
        Ok(text) => match text.parse::<usize>() {
            Ok(max) if (1..=TRACE_LEN_MAX).contains(&max) => Ok(max),
            _ => Err(format!("LOCKSTEP_SIM_TRACE_LEN_MAX={text:?} must be a whole number in 1..={TRACE_LEN_MAX}")),
        },
    }
}

/// Every kind of event a trace holds, sorted: what `[[expect.trace]] kind` may name (a kind no event has would
/// make an `at_most` expectation pass whatever happens: a new user's trial). Debug builds check every recorded
/// event against it ([`Trace::record`]), so a new kind that is not added here fails the tests that reach it.
pub const KINDS: &[&str] = &[
    "abort",
    "buggify",
    "buggify-end",
    "build",
    "call-timeout",
    "calls-fault",
    "calls-healed",
    "clock-drift",
    "clock-exact",
    "clock-jump",
    "commit",
    "contention",
    "control-refused",
    "crash-loop",
    "crash-loop-end",
    "degrade",
    "degrade-end",
    "drain",
    "drained",
    "effect",
    "fence",
    "fence-kill",
    "gang-placed",
    "gang-wait",
    "handler-hang",
    "handler-hang-end",
    "heal",
    "hint-loss",
    "hint-loss-end",
    "incarnation",
    "interrupted",
    "isolate",
    "isolate-end",
    "job",
    "job-kill",
    "kill",
    "link-heal",
    "lost-replies",
    "lost-replies-end",
    "mutation",
    "node-lost",
    "note",
    "op-event",
    "op-state",
    "partition",
    "partition-end",
    "pause",
    "proc-exit",
    "proc-kill",
    "proc-pause",
    "proc-resume",
    "proc-start",
    "proc-start-failed",
    "records-unreadable",
    "reply-dropped",
    "restart",
    "restart-failed",
    "resume",
    "session",
    "skipped",
    "spec-update",
    "start",
    "store-hang",
    "store-hang-end",
    "store-hang-lost",
    "submit",
    "submit-refused",
    "update-spec",
    "workload-done",
];

/// One event of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Simulated time since the world was built.
    pub at: Duration,
    /// The node it happened on or to: `world`, `db`, `client`, `replica-0`, …
    pub node: Arc<str>,
    /// What happened, one word: `commit`, `pause`, `call-timeout`, …
    pub kind: &'static str,
    /// The details, `key=value` pairs or a commit's text.
    pub fields: Fields,
}

impl TraceEvent {
    /// Appends the event's line to `out`, as `Display` writes it (without a newline).
    pub fn write_line(&self, out: &mut String) {
        use fmt::Write;
        let micros = self.at.as_micros();
        let (seconds, micros) = (micros / 1_000_000, micros % 1_000_000);
        let _ = write!(out, "{seconds:>5}.{micros:06} {:<10} {:<14} ", self.node, self.kind);
        self.fields.write_text(out);
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = String::new();
        self.write_line(&mut line);
        f.write_str(&line)
    }
}

/// An event's details as recorded. A run's trace is mostly the database node's commits (87 038 of the 89 061
/// events of the large world's seed 1): each keeps its commit and is written out only when read. Before, every
/// commit's text was written when it committed, copied into a `String` of its own and freed with the trace: 3.7 %
/// of that seed's instructions, where a passing run reads none of them (docs/benchmarks-history.md, "Simulator:
/// a trace written out only when read").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fields {
    /// Text written when the event was recorded: `key=value` pairs.
    Text(String),
    /// A commit: its text ([`CommitOp::write_text`]), then ` op=<id>` when it concerns the gang operation `op`.
    Commit {
        /// What the commit did.
        op: CommitOp,
        /// The gang operation it concerns, when the database node traces gang operations.
        operation: Option<RowId>,
    },
    /// An event the gang controller recorded on an operation ([`gang::event_fields`]).
    OperationEvent {
        /// The event.
        event: Box<Event>,
        /// The node of the allocation it names, as it was when the event was recorded ([`gang::event_node`]).
        node: Option<String>,
    },
}

impl Fields {
    /// Appends the text to `out`: a [`Fields::Commit`] is written out here, the same text each time.
    pub fn write_text(&self, out: &mut String) {
        match self {
            Fields::Text(text) => out.push_str(text),
            Fields::Commit { op, operation } => {
                op.write_text(out);
                if let Some(operation) = operation {
                    use fmt::Write;
                    let _ = write!(out, " op={operation}");
                }
            }
            Fields::OperationEvent { event, node } => out.push_str(&gang::event_fields(event, node.as_deref())),
        }
    }

    /// The text: borrowed for [`Fields::Text`], written out for a commit (each call writes it again, so a
    /// caller reading an event's fields several times takes it once).
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Fields::Text(text) => Cow::Borrowed(text),
            Fields::Commit { .. } | Fields::OperationEvent { .. } => {
                let mut text = String::new();
                self.write_text(&mut text);
                Cow::Owned(text)
            }
        }
    }
}

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl From<String> for Fields {
    fn from(text: String) -> Fields {
        Fields::Text(text)
    }
}

impl From<&str> for Fields {
    fn from(text: &str) -> Fields {
        Fields::Text(text.to_string())
    }
}

/// A run's trace. Clones share one trace; every node of the world writes to it.
#[derive(Clone)]
pub struct Trace {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    start: Instant,
    events: Vec<TraceEvent>,
    len_max: usize,
    /// Set by the first event past `len_max` (and `outgrown_notify` woken).
    outgrown: Option<Outgrown>,
    outgrown_notify: Arc<tokio::sync::Notify>,
}

impl Trace {
    /// An empty trace whose clock starts now (simulated time), holding at most [`TRACE_LEN_MAX`] events.
    pub fn new() -> Trace {
        Trace::with_len_max(TRACE_LEN_MAX)
    }

    /// An empty trace holding at most `len_max` events (at most [`TRACE_LEN_MAX`]): recording one more ends the
    /// run, [`Outgrown`]. The simulator's runs take it from `LOCKSTEP_SIM_TRACE_LEN_MAX` ([`trace_len_max`]).
    pub fn with_len_max(len_max: usize) -> Trace {
        let len_max = len_max.min(TRACE_LEN_MAX);
        let inner = Inner {
            start: Instant::now(),
            events: Vec::new(),
            len_max,
            outgrown: None,
            outgrown_notify: Arc::default(),
        };
        Trace { inner: Arc::new(Mutex::new(inner)) }
    }

    /// Appends an event at the current simulated time.
    pub fn record(&self, node: &Arc<str>, kind: &'static str, fields: impl Into<Fields>) {
        let mut inner = self.lock();
        let at = inner.start.elapsed();
        inner.push(at, node, kind, fields.into());
    }

    /// Appends an event at `now`, an instant the caller read at this point of the run: simulated time stands still
    /// while a task runs, so a caller recording many events in one poll reads the clock once (the database node's
    /// call and its commits; each read of madsim's clock through `Instant::now` costs about 220 instructions,
    /// a measured cost). Debug builds check that no event goes back in time.
    pub fn record_at(&self, now: Instant, node: &Arc<str>, kind: &'static str, fields: impl Into<Fields>) {
        let mut inner = self.lock();
        let at = now.saturating_duration_since(inner.start);
        debug_assert!(
            inner.events.last().is_none_or(|last| last.at <= at),
            "trace event {kind:?} at {at:?} is older than the last"
        );
        inner.push(at, node, kind, fields.into());
    }

    /// Waits until an event is recorded past the trace's bound ([`Trace::with_len_max`]), then says what was
    /// outgrown; never returns for a run that stays within it. Events past the bound are not recorded.
    pub async fn outgrown(&self) -> Outgrown {
        let notify = self.lock().outgrown_notify.clone();
        loop {
            if let Some(outgrown) = self.lock().outgrown.clone() {
                return outgrown;
            }
            notify.notified().await;
        }
    }

    /// Simulated time since the trace started.
    pub fn elapsed(&self) -> Duration {
        self.lock().start.elapsed()
    }

    /// The simulated time of the last event recorded, if any (since the trace started).
    pub fn last_at(&self) -> Option<Duration> {
        self.lock().events.last().map(|event| event.at)
    }

    /// How many handles share this trace (this one included): after a run's world is gone, 1 for the harness's
    /// own, more if a task of the world outlived it.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Events so far.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// Whether no event was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.lock().events.clone()
    }

    /// Moves the events out, leaving the trace empty (for a run's report once the run is over: no copy of
    /// every event).
    pub fn take_events(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut self.lock().events)
    }

    /// A copy of the events from index `start` on (what was recorded since a caller last looked).
    pub fn events_from(&self, start: usize) -> Vec<TraceEvent> {
        self.lock().events.get(start..).unwrap_or(&[]).to_vec()
    }

    /// How many events of `kind` were recorded.
    pub fn count(&self, kind: &str) -> usize {
        self.lock().events.iter().filter(|event| event.kind == kind).count()
    }

    /// The trace as text, one event per line.
    pub fn render(&self) -> String {
        render(&self.lock().events)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while recording already failed the run; keep the trace readable for its report.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    /// Appends an event at `at` since the start, unless the trace is full: then the first such event sets
    /// `outgrown`.
    fn push(&mut self, at: Duration, node: &Arc<str>, kind: &'static str, fields: Fields) {
        debug_assert!(KINDS.binary_search(&kind).is_ok(), "trace kind {kind:?} is not in trace::KINDS");
        if self.events.len() >= self.len_max {
            if self.outgrown.is_none() {
                let what =
                    format!("its trace reached {} events at {:.1} s of simulated time", self.len_max, at.as_secs_f64());
                self.outgrown = Some(Outgrown { what });
                self.outgrown_notify.notify_one();
            }
            return;
        }
        self.events.push(TraceEvent { at, node: node.clone(), kind, fields });
    }
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}

/// `events` as text, one per line, each line ending in a newline.
pub fn render(events: &[TraceEvent]) -> String {
    let mut text = String::with_capacity(events.len() * 80);
    for event in events {
        event.write_line(&mut text);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_trace_past_its_bound_records_nothing_more_and_says_so_once() {
        let trace = Trace::with_len_max(2);
        let node: Arc<str> = Arc::from("db");
        for i in 0..5 {
            trace.record(&node, "commit", format!("n={i}"));
        }
        assert_eq!(trace.len(), 2, "events past the bound were recorded");
        let outgrown = trace.outgrown().await;
        assert!(outgrown.what.starts_with("its trace reached 2 events at "), "{}", outgrown.what);
        assert_eq!(trace.outgrown().await, outgrown, "the first event past the bound is the one reported");
        assert_eq!(Trace::with_len_max(usize::MAX).inner.lock().unwrap().len_max, TRACE_LEN_MAX);
    }

    #[test]
    fn a_commit_reads_as_the_text_written_when_it_was_recorded() {
        use crate::store::{Lease, LockToken};
        let op = CommitOp::Apply {
            lease: Lease { id: RowId(3), token: LockToken(7) },
            applied: true,
            related: vec![RowId(4), RowId(5)],
            inserted: Vec::new(),
        };
        let node: Arc<str> = Arc::from("replica-1");
        let at = Duration::from_micros(61_000_042);
        let event = |fields: Fields| TraceEvent { at, node: node.clone(), kind: "commit", fields };
        for operation in [None, Some(RowId(9))] {
            let mut text = op.to_string();
            if let Some(operation) = operation {
                text.push_str(&format!(" op={operation}"));
            }
            let commit = event(Fields::Commit { op: op.clone(), operation });
            assert_eq!(commit.fields.text(), text);
            assert_eq!(commit.to_string(), event(Fields::Text(text.clone())).to_string());
            assert_eq!(
                render(&[commit.clone(), commit]),
                format!("{:>5}.{:06} {node:<10} {:<14} {text}\n", 61, 42, "commit").repeat(2)
            );
        }
    }

    #[test]
    fn the_kinds_are_sorted_once_each() {
        assert!(KINDS.windows(2).all(|pair| pair[0] < pair[1]), "KINDS must be sorted, each once: {KINDS:?}");
    }
}
