//! The trace of a run: one line per event, `time node kind fields`, in the order the simulator produced them
//! (DESIGN §5: the same seed and build give a byte-identical trace; `tests/sim_world.rs` checks it).
//!
//! Events come from every part of the world: the database node writes one `commit` line per committed store
//! call (naming the node that sent it) and one line per reply it drops; store clients write their time-outs;
//! replicas write their starts and drains; the world writes every fault it injects and heals. Time is simulated
//! time since the world was built, in microseconds, printed as seconds.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// Most events a trace keeps (STYLE: every growing thing has a bound). A 10-minute, 10 000-row run writes about
/// 10⁵. A run that would write more ends there, [`Outgrown`]: its scenario is too large for one run.
pub const TRACE_LEN_MAX: usize = 5_000_000;

/// Why a run ended before its end without being judged: it outgrew a bound of one run (its trace reached
/// [`TRACE_LEN_MAX`] events). The scenario is too large to simulate in one run (a long span at high rates, or
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
    "clock-drift",
    "clock-exact",
    "commit",
    "contention",
    "control-refused",
    "degrade",
    "degrade-end",
    "drain",
    "drained",
    "effect",
    "fence",
    "fence-kill",
    "gang-placed",
    "gang-wait",
    "heal",
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
    pub fields: String,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.at.as_micros();
        write!(
            f,
            "{:>5}.{:06} {:<10} {:<14} {}",
            micros / 1_000_000,
            micros % 1_000_000,
            self.node,
            self.kind,
            self.fields
        )
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
    pub fn record(&self, node: &Arc<str>, kind: &'static str, fields: impl Into<String>) {
        debug_assert!(KINDS.binary_search(&kind).is_ok(), "trace kind {kind:?} is not in trace::KINDS");
        let mut inner = self.lock();
        let at = inner.start.elapsed();
        if inner.events.len() >= inner.len_max {
            if inner.outgrown.is_none() {
                let what = format!(
                    "its trace reached {} events at {:.1} s of simulated time",
                    inner.len_max,
                    at.as_secs_f64()
                );
                inner.outgrown = Some(Outgrown { what });
                inner.outgrown_notify.notify_one();
            }
            return;
        }
        inner.events.push(TraceEvent { at, node: node.clone(), kind, fields: fields.into() });
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

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}

/// `events` as text, one per line, each line ending in a newline.
pub fn render(events: &[TraceEvent]) -> String {
    let mut text = String::with_capacity(events.len() * 80);
    for event in events {
        text.push_str(&event.to_string());
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
    fn the_kinds_are_sorted_once_each() {
        assert!(KINDS.windows(2).all(|pair| pair[0] < pair[1]), "KINDS must be sorted, each once: {KINDS:?}");
    }
}
