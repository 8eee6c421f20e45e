//! A run as one self-contained HTML page: `lockstep sim run FILE --html OUT.html`, `sim replay …
//! --html`, `sim explain TRACE --html` and `sim sweep --html DIR` (one page per failing seed).
//!
//! The page holds everything it needs inline (style, script, the model as JSON and the trace's text) and loads
//! nothing (its Content-Security-Policy forbids every fetch), so it opens from disk in any browser. Against
//! simulated time it shows a lane per node with its faults as shaded spans, a lane per operation with its
//! incarnations, a lane per allocation with its jobs and their processes, and a lane per row with its leases
//! (holder, token, until when) and the takeovers and stale applies on it ([`model`]); each checker's verdict,
//! and for a violation a marker at its moment that filters the page to the rows and operations it names. Zoom
//! (Ctrl + wheel, buttons, `+`/`-`), pan (drag, arrows), filter by operation or rows, and hover for the trace
//! lines behind what is drawn. It draws on a canvas only the lanes and items in view, so a 10 000-row world
//! opens in a few seconds.
//!
//! Everything is built from the trace's text ([`html`]), so a trace file alone is enough (`explain --html`); a
//! run adds its checkers' verdicts, its summary and its pipelines' lease ttls ([`Context::of_run`]). The page is
//! a function of the trace and the context: no wall time, no build id.

pub mod model;

use super::checkers::Violation;
use super::explain;
use super::run::RunReport;
use super::scenario::Scenario;
use super::summary::{operations_named, rows_named};
use model::{Group, Kind, LeaseTtls, Model, micros};
use serde::Serialize;

/// What a page says besides the trace: its title, the run's verdicts and summary, the lease ttls, and what it
/// opens filtered to.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The page's title: the scenario file, version and seed, or the trace file.
    pub title: String,
    /// The run's readable summary ([`super::summary::render`]), shown folded.
    pub summary: Option<String>,
    /// Every checker's verdict, if a run judged the trace.
    pub verdicts: Option<Verdicts>,
    /// The pipelines' lease ttls, for where an unended lease expires.
    pub ttls: LeaseTtls,
    /// The operation the page opens filtered to (`explain --operation`).
    pub operation: Option<u64>,
    /// The rows the page opens filtered to (`explain --row`).
    pub rows: Vec<u64>,
}

/// What the checkers said of a run.
#[derive(Clone, Debug, Default)]
pub struct Verdicts {
    /// Every checker that judged the run, in order, with its violations (none: it passed).
    pub checkers: Vec<(String, Vec<String>)>,
    /// The panic that ended the run before the checkers, if any.
    pub panic: Option<String>,
}

impl Verdicts {
    /// The verdicts of `report`: each checker of `report.checkers` (or, for a run that never reached them,
    /// those with violations) and its violations.
    pub fn of(report: &RunReport) -> Verdicts {
        let mut checkers: Vec<(String, Vec<String>)> =
            report.checkers.iter().map(|name| (name.to_string(), Vec::new())).collect();
        for Violation { checker, message } in &report.violations {
            match checkers.iter_mut().find(|(name, _)| name == checker) {
                Some((_, messages)) => messages.push(message.clone()),
                None => checkers.push((checker.to_string(), vec![message.clone()])),
            }
        }
        // A run that outgrew one run was never judged: the page shows it as a run that ended early, not a pass.
        let outgrown = || report.outgrown.as_ref().map(|what| format!("it outgrew one run, unjudged: {what}"));
        Verdicts { checkers, panic: report.panic.clone().or_else(outgrown) }
    }

    fn passed(&self) -> bool {
        self.panic.is_none() && self.checkers.iter().all(|(_, messages)| messages.is_empty())
    }
}

impl Context {
    /// The context of a trace file alone, titled `title`.
    pub fn of_trace(title: impl Into<String>) -> Context {
        Context { title: title.into(), ..Context::default() }
    }

    /// The context of `report`, a run of `scenario`, titled `title`: its verdicts, its summary and the lease
    /// ttls of its pipelines.
    pub fn of_run(title: impl Into<String>, scenario: &Scenario, report: &RunReport) -> Context {
        Context {
            title: title.into(),
            summary: Some(super::summary::render(report)),
            verdicts: Some(Verdicts::of(report)),
            ttls: lease_ttls(scenario),
            ..Context::default()
        }
    }
}

/// The lease ttls of `scenario`'s pipelines: the row workload's (`[pipeline] lease_ttl`), the operation
/// pipeline's (`[controller] lease_ttl`) and the agents' node leases (`[agent] lease_ttl`, pipelines
/// `agent:…`). A user's pipeline set's are not known here (its leases end where a line ends them).
pub fn lease_ttls(scenario: &Scenario) -> LeaseTtls {
    let mut ttls = LeaseTtls::default();
    if scenario.pipelines.is_none() {
        ttls.default = Some(scenario.workload.lease_ttl);
    }
    if let Some(gang) = &scenario.gang {
        ttls.by_pipeline.insert(crate::gang::pipeline::OPERATION_PIPELINE.to_string(), gang.controller.lease_ttl);
        ttls.by_prefix.push(("agent:".to_string(), gang.agent.lease_ttl));
    }
    ttls
}

/// The page of `report`, a run of `scenario`, titled `title`: [`html`] of its trace with [`Context::of_run`].
pub fn html_of_run(title: impl Into<String>, scenario: &Scenario, report: &RunReport) -> String {
    html(&report.trace_text(), &Context::of_run(title, scenario, report))
}

/// The page of a trace's text (`time node kind fields` lines, as `run --trace` writes them) with `context`.
pub fn html(trace: &str, context: &Context) -> String {
    let model = Model::of_trace(trace, &context.ttls);
    let data = Data::of(&model, trace, context);
    let json = serde_json::to_string(&data).expect("the timeline's data serializes");
    // Inside a <script> element nothing may read as a closing tag: `<` only occurs in JSON strings, where
    // `\u003c` means the same.
    let json = json.replace('<', "\\u003c");
    let title = escape_html(&context.title);
    PAGE.replace("{{STYLE}}", STYLE)
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{TITLE}}", &title)
        .replacen("{{DATA}}", &json, 1)
}

const PAGE: &str = include_str!("timeline/page.html");
const STYLE: &str = include_str!("timeline/page.css");
const SCRIPT: &str = include_str!("timeline/page.js");

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The page's data, as the script reads it.
#[derive(Serialize)]
struct Data<'a> {
    title: &'a str,
    verdict: Option<&'static str>,
    panic: Option<&'a str>,
    summary: Option<&'a str>,
    checkers: Vec<CheckerData>,
    end: u64,
    lanes: Vec<LaneData<'a>>,
    kinds: Vec<Kind>,
    items: Items<'a>,
    focus: Focus,
    trace: &'a str,
}

#[derive(Serialize)]
struct CheckerData {
    name: String,
    ok: bool,
    message: String,
    /// The violation's moment (simulated microseconds), if one is known.
    at: Option<u64>,
    rows: Vec<u64>,
    ops: Vec<u64>,
}

#[derive(Serialize)]
struct LaneData<'a> {
    group: Group,
    key: &'a str,
    note: &'a str,
    ops: Vec<u64>,
}

/// The items, a column per field (smaller than an object per item).
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Items<'a> {
    lane: Vec<usize>,
    start: Vec<u64>,
    end: Vec<u64>,
    kind: Vec<usize>,
    line: Vec<usize>,
    end_line: Vec<Option<usize>>,
    label: Vec<&'a str>,
    state: Vec<&'a str>,
    op: Vec<Option<u64>>,
    holder: Vec<Option<usize>>,
}

#[derive(Serialize)]
struct Focus {
    op: Option<u64>,
    rows: Vec<u64>,
}

impl<'a> Data<'a> {
    fn of(model: &'a Model, trace: &'a str, context: &'a Context) -> Data<'a> {
        let mut kinds: Vec<Kind> = model.items.iter().map(|item| item.kind).collect();
        kinds.sort();
        kinds.dedup();
        let mut items = Items::default();
        for item in &model.items {
            items.lane.push(item.lane);
            items.start.push(item.start);
            items.end.push(item.end);
            items.kind.push(kinds.binary_search(&item.kind).expect("every kind is listed"));
            items.line.push(item.line);
            items.end_line.push(item.end_line);
            items.label.push(&item.label);
            items.state.push(&item.state);
            items.op.push(item.op);
            items.holder.push(item.holder);
        }
        let lanes = model
            .lanes
            .iter()
            .map(|lane| LaneData {
                group: lane.group,
                key: &lane.key,
                note: &lane.note,
                ops: lane.ops.iter().copied().collect(),
            })
            .collect();
        let verdicts = context.verdicts.as_ref();
        let checkers = verdicts.map_or_else(Vec::new, |verdicts| checker_data(verdicts, trace));
        Data {
            title: &context.title,
            verdict: verdicts.map(|verdicts| if verdicts.passed() { "passed" } else { "failed" }),
            panic: verdicts.and_then(|verdicts| verdicts.panic.as_deref()),
            summary: context.summary.as_deref(),
            checkers,
            end: model.end,
            lanes,
            kinds,
            items,
            focus: Focus { op: context.operation, rows: context.rows.clone() },
            trace,
        }
    }
}

fn checker_data(verdicts: &Verdicts, trace: &str) -> Vec<CheckerData> {
    let mut data = Vec::new();
    for (name, messages) in &verdicts.checkers {
        if messages.is_empty() {
            let (message, at, rows, ops) = (String::new(), None, Vec::new(), Vec::new());
            data.push(CheckerData { name: name.clone(), ok: true, message, at, rows, ops });
        }
        for message in messages {
            let named = Named::of(message);
            let at = named.moment(message, trace);
            data.push(CheckerData {
                name: name.clone(),
                ok: false,
                message: message.clone(),
                at,
                rows: named.rows,
                ops: named.ops,
            });
        }
    }
    data
}

/// The rows, operations and jobs a violation's message names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// Rows it calls `row N` (or whose leases `N#T` it names), [`rows_named`].
    pub rows: Vec<u64>,
    /// Operations it names (`op=N`, `operation N`), [`operations_named`].
    pub ops: Vec<u64>,
    /// Jobs it names (`job 11-4`).
    pub jobs: Vec<String>,
}

impl Named {
    /// What `message` names.
    pub fn of(message: &str) -> Named {
        let ids = |named: Vec<String>| named.iter().filter_map(|id| id.parse().ok()).collect();
        let words: Vec<&str> = message.split_whitespace().collect();
        let jobs = words
            .windows(2)
            .filter(|pair| pair[0] == "job" || pair[0] == "(job")
            .map(|pair| pair[1].trim_end_matches([')', ',', ':', ';']).to_string())
            .filter(|job| {
                job.split_once('-').is_some_and(|(op, n)| op.parse::<u64>().is_ok() && n.parse::<u64>().is_ok())
            })
            .collect();
        Named { rows: ids(rows_named(message)), ops: ids(operations_named(message)), jobs }
    }

    /// The moment a violation happened, in simulated microseconds, from the best evidence its message gives:
    /// 1. the first store time it names (`1700000035.602961`: the offending commit of lease exclusivity),
    ///    less the store clock's origin;
    /// 2. else the last process start (or resume) of the first job it names (the second process of a rank, the
    ///    late rank of a gang);
    /// 3. else the last trace line about the rows it names, or else about the first operation it names;
    /// 4. else none.
    pub fn moment(&self, message: &str, trace: &str) -> Option<u64> {
        if let Some(at) = store_time(message) {
            return Some(at);
        }
        let lines = || trace.lines().filter_map(explain::parse_line);
        let time = |line: explain::TraceLine<'_>| micros(line.at);
        if let Some(job) = self.jobs.first() {
            let token = format!("job={job}");
            let started = lines().rfind(|line| {
                matches!(line.kind, "proc-start" | "proc-resume")
                    && explain::field_tokens(line.fields).contains(&token.as_str())
            });
            if let Some(line) = started {
                return time(line);
            }
        }
        let rows: Vec<String> = self.rows.iter().map(u64::to_string).collect();
        let about = lines().rfind(|line| rows.iter().any(|row| explain::mentions_row(line.kind, line.fields, row)));
        if let Some(line) = about {
            return time(line);
        }
        let op = self.ops.first()?.to_string();
        lines().rfind(|line| explain::mentions_operation(line.fields, &op)).and_then(time)
    }
}

/// The first store timestamp in `message` (seconds with six decimals, at or past the simulator's origin), as
/// simulated microseconds.
fn store_time(message: &str) -> Option<u64> {
    let origin = u64::try_from(super::db::ORIGIN.0).ok()?;
    message
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|word| micros(word.trim_matches('.')))
        .find(|at| *at >= origin)
        .map(|at| at - origin)
}

#[cfg(test)]
mod tests;
