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

/// Most events a trace keeps; a run that produces more is a runaway and fails loudly (STYLE: every growing
/// thing has a bound). A 10-minute, 10 000-row run writes about 10⁵.
pub const TRACE_LEN_MAX: usize = 5_000_000;

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
}

impl Trace {
    /// An empty trace whose clock starts now (simulated time).
    pub fn new() -> Trace {
        Trace { inner: Arc::new(Mutex::new(Inner { start: Instant::now(), events: Vec::new() })) }
    }

    /// Appends an event at the current simulated time.
    pub fn record(&self, node: &Arc<str>, kind: &'static str, fields: impl Into<String>) {
        let mut inner = self.lock();
        assert!(inner.events.len() < TRACE_LEN_MAX, "trace passed {TRACE_LEN_MAX} events: a runaway run");
        let at = inner.start.elapsed();
        inner.events.push(TraceEvent { at, node: node.clone(), kind, fields: fields.into() });
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
