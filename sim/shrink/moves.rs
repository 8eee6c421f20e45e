//! The candidates of one shrinking step: each a smaller scenario file (a `toml::Table`), with what it removed.
//!
//! Every move makes one quantity strictly smaller and is bounded below (counts at their least, durations at
//! [`SPAN_MIN`], rates at [`RATE_MIN`]), so a search that accepts only these moves ends. In the order tried
//! (the first failing candidate of a step wins, so the larger cuts come first):
//! 1. the random fault processes replaced by the faults they injected in the current run (`materialized`),
//!    fixed at the times and with the targets and spans the trace shows: each can then be dropped on its own;
//! 2. every fault dropped at once, then each fixed fault and each random process alone;
//! 3. each operation dropped (with its controls and expectations), the trace and operation expectations
//!    dropped (unless `expect` is the checker to fail);
//! 4. the row workload: none at all (in a gang scenario), rows at most half, three quarters, seven eighths or
//!    fifteen sixteenths of, or one less than what the client inserted, no jobs or half the rate, no claims or
//!    half the rate, one task per job (where jobs are made), one resource, one claim pipeline, half the span;
//! 5. a replica, an agent, a slot less;
//! 6. each fixed fault's span (or down time) halved, each fixed fault moved earlier (half its time), the fault
//!    window cut to just past the last fixed fault, each random process at half its rate;
//! 7. each operation's job counts halved, the jobs' durations halved.

use super::super::timeline::model::{Group, Kind, LeaseTtls, Model};
use crate::duration;
use crate::text::{count, count_as};
use std::time::Duration;
use toml::{Table, Value};

/// The shortest span, down time or duration a move halves to.
pub const SPAN_MIN: Duration = Duration::from_millis(100);

/// The lowest rate (per minute) a random process is halved to.
pub const RATE_MIN: f64 = 0.1;

/// One candidate: what the move did (a sentence for the step's line) and the scenario it made.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Which family of moves made it: `faults`, `operations`, `workload`, `topology`, `spans`, `jobs`.
    pub kind: &'static str,
    /// What was removed or shortened, e.g. `dropped faults.at[2] (pause of replica 0 at 10s)`.
    pub what: String,
    /// The scenario file's table.
    pub table: Table,
}

/// What the moves need of the current run: its trace (faults to fix), the rows its client inserted, and the
/// scenario's counts as parsed (defaults filled in).
pub struct Current<'a> {
    /// The current scenario's table.
    pub table: &'a Table,
    /// Its run's trace, as text.
    pub trace: &'a str,
    /// Rows the run's client inserted.
    pub rows_inserted: usize,
    /// Replicas, as parsed.
    pub replicas: usize,
    /// Agents, as parsed.
    pub agents: usize,
    /// Slots per agent, as parsed.
    pub slots: u32,
    /// Whether `expect` is the checker to fail (its expectations are then kept).
    pub keep_expectations: bool,
}

/// Every candidate of one step, in the order tried: the family of moves `first` (the one that made the last
/// step, which often has more to give: rows one after another) before the others, each family in the order of
/// the module docs.
pub fn candidates(current: &Current<'_>, first: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    let table = current.table;
    let at = array(table, &["faults", "at"]);
    let random = array(table, &["faults", "random"]);
    if !random.is_empty()
        && let Some(candidate) = materialized(table, current.trace)
    {
        out.push(candidate);
    }
    if at.len() + random.len() > 1 {
        let mut t = table.clone();
        set_array(&mut t, &["faults", "at"], Vec::new());
        set_array(&mut t, &["faults", "random"], Vec::new());
        let what = format!("dropped every fault ({} fixed, {} random)", at.len(), random.len());
        out.push(Candidate { kind: "", what, table: t });
    }
    for (index, fault) in at.iter().enumerate() {
        let mut t = table.clone();
        let mut list = at.clone();
        list.remove(index);
        set_array(&mut t, &["faults", "at"], list);
        let what = format!("dropped faults.at[{index}] ({})", describe_fault(fault));
        out.push(Candidate { kind: "", what, table: t });
    }
    for (index, process) in random.iter().enumerate() {
        let mut t = table.clone();
        let mut list = random.clone();
        list.remove(index);
        set_array(&mut t, &["faults", "random"], list);
        let what = format!("dropped faults.random[{index}] ({})", describe_fault(process));
        out.push(Candidate { kind: "", what, table: t });
    }
    tag(&mut out, "faults");
    operations(current, &mut out);
    tag(&mut out, "operations");
    workload(current, &mut out);
    tag(&mut out, "workload");
    topology(current, &mut out);
    tag(&mut out, "topology");
    fault_spans(table, &at, &random, &mut out);
    tag(&mut out, "spans");
    jobs(table, &mut out);
    tag(&mut out, "jobs");
    out.sort_by_key(|candidate| candidate.kind != first);
    out
}

fn tag(out: &mut [Candidate], kind: &'static str) {
    for candidate in out.iter_mut().filter(|candidate| candidate.kind.is_empty()) {
        candidate.kind = kind;
    }
}

fn operations(current: &Current<'_>, out: &mut Vec<Candidate>) {
    let table = current.table;
    let operations = array(table, &["operations"]);
    for (index, operation) in operations.iter().enumerate() {
        let name = operation.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let mut t = table.clone();
        let mut list = operations.clone();
        list.remove(index);
        set_array(&mut t, &["operations"], list);
        let names = |entry: &Value, key: &str| entry.get(key).and_then(Value::as_str) == Some(name.as_str());
        let controls: Vec<Value> =
            array(&t, &["controls"]).into_iter().filter(|control| !names(control, "operation")).collect();
        set_array(&mut t, &["controls"], controls);
        let expected: Vec<Value> =
            array(&t, &["expect", "operation"]).into_iter().filter(|entry| !names(entry, "name")).collect();
        set_array(&mut t, &["expect", "operation"], expected);
        out.push(Candidate { kind: "", what: format!("dropped operations[{index}] ({name})"), table: t });
    }
    if !current.keep_expectations {
        for key in ["trace", "operation"] {
            let list = array(table, &["expect", key]);
            if !list.is_empty() {
                let mut t = table.clone();
                set_array(&mut t, &["expect", key], Vec::new());
                out.push(Candidate {
                    kind: "",
                    what: format!("dropped the {} [[expect.{key}]]", list.len()),
                    table: t,
                });
            }
        }
    }
}

fn workload(current: &Current<'_>, out: &mut Vec<Candidate>) {
    let table = current.table;
    let Some(workload) = table.get("workload").and_then(Value::as_table) else { return };
    // A gang scenario without a `[workload]` table runs no row workload at all.
    if !array(table, &["operations"]).is_empty() {
        let mut t = table.clone();
        t.remove("workload");
        out.push(Candidate { kind: "", what: "no row workload".into(), table: t });
    }
    let mut push = |what: String, key: &str, value: Value| {
        let mut t = table.clone();
        let entry = t.get_mut("workload").and_then(Value::as_table_mut).expect("a workload table");
        entry.insert(key.to_string(), value);
        out.push(Candidate { kind: "", what, table: t });
    };
    // Fewer rows: half, three quarters, seven eighths, fifteen sixteenths, one less (the first that still fails
    // wins): the finer cuts spare a long run of one-row steps when the failure needs most of the rows.
    let rows = current.rows_inserted;
    let rows_max = workload.get("rows_max").and_then(Value::as_integer).map_or(usize::MAX, |max| max as usize);
    let now = rows.min(rows_max);
    let mut fewer: Vec<usize> = vec![now / 2, now * 3 / 4, now * 7 / 8, now * 15 / 16, now.saturating_sub(1)];
    fewer.retain(|max| *max >= 1 && *max < now);
    fewer.dedup();
    for max in fewer {
        // The limit and the count it is below, each named: the candidate's rows_max, and what the failing run
        // inserted.
        let what =
            format!("workload.rows_max {max}: at most {} (the failing run inserted {rows})", count(max as u64, "row"));
        push(what, "rows_max", Value::Integer(max as i64));
    }
    for (key, what) in [("jobs_per_minute", "jobs"), ("claims_per_minute", "claims")] {
        let rate = workload.get(key).and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)));
        if rate != Some(0.0) {
            push(format!("no {what}"), key, Value::Float(0.0));
        }
        if let Some(rate) = rate.filter(|rate| rate / 2.0 >= RATE_MIN) {
            push(format!("{what} at {} per minute (was {rate})", rate / 2.0), key, Value::Float(rate / 2.0));
        }
    }
    // Tasks per job matter only where jobs are made.
    let one_task = Value::Array(vec![Value::Integer(1), Value::Integer(1)]);
    let jobs = workload.get("jobs_per_minute").and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)));
    if workload.get("tasks_per_job") != Some(&one_task) && jobs != Some(0.0) {
        push("one task per job".into(), "tasks_per_job", one_task);
    }
    for (key, what) in [("resources", "one resource"), ("claim_pipelines", "one claim pipeline")] {
        if workload.get(key).and_then(Value::as_integer) != Some(1) {
            push(what.to_string(), key, Value::Integer(1));
        }
    }
    if let Some(span) = workload.get("span").and_then(Value::as_str).and_then(|s| duration::parse(s).ok())
        && span / 2 >= SPAN_MIN
    {
        push(
            format!("workload.span {} (was {})", format_duration(span / 2), format_duration(span)),
            "span",
            duration_value(span / 2),
        );
    }
}

fn topology(current: &Current<'_>, out: &mut Vec<Candidate>) {
    let table = current.table;
    let has_operations = !array(table, &["operations"]).is_empty();
    let counts = [
        ("replicas", current.replicas as i64, 1, ("replica", "replicas")),
        ("agents", current.agents as i64, if has_operations { 1 } else { 0 }, ("agent", "agents")),
        ("slots", i64::from(current.slots), 1, ("slot per agent", "slots per agent")),
    ];
    for (key, now, least, (one, many)) in counts {
        if now > least && (key != "slots" || current.agents > 0) {
            let mut t = table.clone();
            table_at(&mut t, &["topology"]).insert(key.to_string(), Value::Integer(now - 1));
            let what = format!("{} (was {now})", count_as((now - 1) as u64, one, many));
            out.push(Candidate { kind: "", what, table: t });
        }
    }
}

fn fault_spans(table: &Table, at: &[Value], random: &[Value], out: &mut Vec<Candidate>) {
    for (index, fault) in at.iter().enumerate() {
        for key in ["span", "down"] {
            let Some(span) = fault.get(key).and_then(Value::as_str).and_then(|s| duration::parse(s).ok()) else {
                continue;
            };
            if span / 2 >= SPAN_MIN {
                let mut list = at.to_vec();
                set_key(&mut list[index], key, duration_value(span / 2));
                let mut t = table.clone();
                set_array(&mut t, &["faults", "at"], list);
                let what =
                    format!("faults.at[{index}].{key} {} (was {})", format_duration(span / 2), format_duration(span));
                out.push(Candidate { kind: "", what, table: t });
            }
        }
        if let Some(when) = fault.get("at").and_then(Value::as_str).and_then(|s| duration::parse(s).ok())
            && when / 2 >= SPAN_MIN
        {
            let mut list = at.to_vec();
            set_key(&mut list[index], "at", duration_value(when / 2));
            let mut t = table.clone();
            set_array(&mut t, &["faults", "at"], list);
            let what =
                format!("faults.at[{index}] moved to {} (was {})", format_duration(when / 2), format_duration(when));
            out.push(Candidate { kind: "", what, table: t });
        }
    }
    let until = table
        .get("faults")
        .and_then(|faults| faults.get("until"))
        .and_then(Value::as_str)
        .and_then(|s| duration::parse(s).ok());
    if let Some(until) = until {
        let last = at
            .iter()
            .filter_map(|fault| fault.get("at").and_then(Value::as_str).and_then(|s| duration::parse(s).ok()))
            .max();
        let shorter = match (random.is_empty(), last) {
            (true, Some(last)) => last + Duration::from_secs(1),
            (true, None) => SPAN_MIN,
            (false, _) => until / 2,
        };
        if shorter < until && shorter >= SPAN_MIN {
            let mut t = table.clone();
            table_at(&mut t, &["faults"]).insert("until".into(), duration_value(shorter));
            let what = format!("faults.until {} (was {})", format_duration(shorter), format_duration(until));
            out.push(Candidate { kind: "", what, table: t });
        }
    }
    for (index, process) in random.iter().enumerate() {
        let Some(rate) = process.get("per_minute").and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
        else {
            continue;
        };
        if rate / 2.0 >= RATE_MIN {
            let mut list = random.to_vec();
            set_key(&mut list[index], "per_minute", Value::Float(rate / 2.0));
            let mut t = table.clone();
            set_array(&mut t, &["faults", "random"], list);
            out.push(Candidate {
                kind: "",
                what: format!("faults.random[{index}] at {} per minute (was {rate})", rate / 2.0),
                table: t,
            });
        }
    }
}

fn jobs(table: &Table, out: &mut Vec<Candidate>) {
    let operations = array(table, &["operations"]);
    for (index, operation) in operations.iter().enumerate() {
        let Some(spec) = operation.get("spec").and_then(Value::as_str) else { continue };
        let Some(halved) = halve_counts(spec) else { continue };
        let mut list = operations.clone();
        set_key(&mut list[index], "spec", Value::String(halved));
        let mut t = table.clone();
        set_array(&mut t, &["operations"], list);
        out.push(Candidate { kind: "", what: format!("operations[{index}]: half the jobs"), table: t });
    }
    let duration = table.get("jobs").and_then(|jobs| jobs.get("duration")).cloned();
    let halved = match &duration {
        Some(Value::String(one)) => {
            duration::parse(one).ok().filter(|d| *d / 2 >= SPAN_MIN).map(|d| duration_value(d / 2))
        }
        Some(Value::Array(range)) => {
            let ends: Option<Vec<Duration>> =
                range.iter().map(|end| end.as_str().and_then(|s| duration::parse(s).ok())).collect();
            ends.filter(|ends| ends.iter().all(|end| *end / 2 >= SPAN_MIN))
                .map(|ends| Value::Array(ends.into_iter().map(|end| duration_value(end / 2)).collect()))
        }
        _ => None,
    };
    if let Some(halved) = halved {
        let mut t = table.clone();
        table_at(&mut t, &["jobs"]).insert("duration".into(), halved);
        out.push(Candidate { kind: "", what: "jobs last half as long".into(), table: t });
    }
}

/// A spec with every `job_count` (and gang `size`) above 1 halved, whatever its format (`job_count=4`,
/// `"job_count": 4`, `job_count: 4`); `None` if none is above 1.
pub fn halve_counts(spec: &str) -> Option<String> {
    let mut out = String::with_capacity(spec.len());
    let mut rest = spec;
    let mut changed = false;
    while let Some(at) = ["job_count", "size"].iter().filter_map(|key| rest.find(key).map(|at| (at, key.len()))).min() {
        let (at, len) = at;
        out.push_str(&rest[..at + len]);
        rest = &rest[at + len..];
        let gap = rest.find(|c: char| !matches!(c, '"' | '=' | ':' | ' ')).unwrap_or(rest.len());
        out.push_str(&rest[..gap]);
        rest = &rest[gap..];
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        match rest[..digits].parse::<u64>() {
            Ok(count) if count > 1 && gap > 0 => {
                out.push_str(&(count / 2).to_string());
                changed = true;
            }
            _ => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// The random fault processes replaced by the faults the trace shows injected (and the fixed faults by the
/// same, read back), each at its time with its target and span: one candidate, or `None` if the trace shows
/// a fault kind it cannot write back.
fn materialized(table: &Table, trace: &str) -> Option<Candidate> {
    let model = Model::of_trace(trace, &LeaseTtls::default());
    let lines: Vec<&str> = trace.lines().collect();
    let mut faults: Vec<(u64, Table)> = Vec::new();
    for item in &model.items {
        let lane = &model.lanes[item.lane];
        if lane.group != Group::Node {
            continue;
        }
        let span = item.end.saturating_sub(item.start);
        let line = lines.get(item.line).copied().unwrap_or("");
        let fault = match item.kind {
            Kind::Down | Kind::Pause | Kind::Drift => node_fault(item.kind, &lane.key, span, line),
            Kind::Partition => partition(&lane.key, span, line)?,
            Kind::Isolate => Some(fields([
                ("kind", "isolate".into()),
                ("node", lane.key.clone().into()),
                ("span", span_value(span)),
            ])),
            Kind::LostReplies => Some(fields([
                ("kind", "lost-replies".into()),
                ("chance", Value::Float(field_f64(line, "chance")?)),
                ("span", span_value(span)),
            ])),
            Kind::Buggify => Some(fields([("kind", "buggify".into()), ("span", span_value(span))])),
            Kind::Degrade => Some(fields([
                ("kind", "degrade".into()),
                ("latency", latency(line)?),
                ("loss", Value::Float(field_f64(line, "loss")?)),
                ("span", span_value(span)),
            ])),
            Kind::Event if line.split_whitespace().nth(2) == Some("calls-fault") => Some(agent_calls(&lane.key, line)?),
            Kind::Event if line.split_whitespace().nth(2) == Some("store-hang") && lane.key.starts_with("agent-") => {
                let agent = lane.key.strip_prefix("agent-")?.parse::<i64>().ok()?;
                let span = crate::duration::parse(field_text(line, "span")?).ok()?;
                Some(fields([
                    ("kind", "store-hang".into()),
                    ("agent", Value::Integer(agent)),
                    ("span", duration_value(span)),
                ]))
            }
            Kind::Event
                if matches!(line.split_whitespace().nth(2), Some("hint-loss" | "crash-loop" | "store-hang")) =>
            {
                Some(replica_span_fault(&lane.key, line)?)
            }
            Kind::Event if line.split_whitespace().nth(2) == Some("contention") => {
                let claims = field_text(line, "claims")?.parse::<i64>().ok()?;
                Some(fields([("kind", "contention".into()), ("claims", Value::Integer(claims))]))
            }
            _ => None,
        };
        if let Some(fault) = fault {
            let mut ordered = Table::new();
            ordered.insert("at".into(), span_value(item.start));
            ordered.extend(fault);
            faults.push((item.start, ordered));
        }
    }
    faults.sort_by_key(|(at, _)| *at);
    let injected = count(faults.len() as u64, "fault");
    let mut t = table.clone();
    let random = array(table, &["faults", "random"]).len() as u64;
    set_array(&mut t, &["faults", "at"], faults.into_iter().map(|(_, fault)| Value::Table(fault)).collect());
    set_array(&mut t, &["faults", "random"], Vec::new());
    let processes = count_as(random, "random fault process", "random fault processes");
    let what = format!("fixed the {injected} the run injected in place of its {processes}");
    Some(Candidate { kind: "", what, table: t })
}

fn node_fault(kind: Kind, node: &str, span: u64, line: &str) -> Option<Table> {
    let (target, index) = match (node.strip_prefix("replica-"), node.strip_prefix("agent-")) {
        (Some(index), _) => ("replica", index.parse::<i64>().ok()?),
        (_, Some(index)) => ("agent", index.parse::<i64>().ok()?),
        _ if node == "db" && kind == Kind::Down => {
            return Some(fields([("kind", "db-restart".into()), ("down", span_value(span))]));
        }
        _ => return None,
    };
    let agent = target == "agent";
    let name = match (kind, agent) {
        (Kind::Down, false) => "kill",
        (Kind::Down, true) => "agent-kill",
        (Kind::Pause, false) => "pause",
        (Kind::Pause, true) => "agent-pause",
        (_, false) => "clock-drift",
        (_, true) if line.contains("beyond_margin=yes") => "agent-clock-beyond-margin",
        (_, true) => "agent-clock-drift",
    };
    let mut fault = fields([("kind", name.into()), (target, Value::Integer(index))]);
    match kind {
        Kind::Down => fault.insert("down".into(), span_value(span)),
        _ => fault.insert("span".into(), span_value(span)),
    };
    if kind == Kind::Drift {
        fault.insert("rate_ppm".into(), Value::Integer(field_text(line, "rate_ppm")?.parse().ok()?));
    }
    Some(fault)
}

/// A `hint-loss` or `crash-loop` fault from its line (`hint-loss span=…`): the replica of the lane and the span the
/// line names.
fn replica_span_fault(node: &str, line: &str) -> Option<Table> {
    let replica = node.strip_prefix("replica-")?.parse::<i64>().ok()?;
    let kind = line.split_whitespace().nth(2)?;
    let span = crate::duration::parse(field_text(line, "span")?).ok()?;
    Some(fields([("kind", kind.into()), ("replica", Value::Integer(replica)), ("span", duration_value(span))]))
}

/// An `agent-calls` fault from its `calls-fault` line: the agent of the lane, the kind of calls, the delay (none
/// when the calls failed) and the span, as the line names them.
fn agent_calls(node: &str, line: &str) -> Option<Table> {
    let agent = node.strip_prefix("agent-")?.parse::<i64>().ok()?;
    let duration = |key: &str| crate::duration::parse(field_text(line, key)?).ok();
    let mut fault = fields([
        ("kind", "agent-calls".into()),
        ("agent", Value::Integer(agent)),
        ("calls", field_text(line, "calls")?.into()),
    ]);
    if field_text(line, "effect")? == "delay" {
        fault.insert("delay".into(), duration_value(duration("delay")?));
    }
    fault.insert("span".into(), duration_value(duration("span")?));
    Some(fault)
}

/// A partition from the line that opened it, once (on the lane of its first node).
fn partition(node: &str, span: u64, line: &str) -> Option<Option<Table>> {
    let pair = line.split_whitespace().nth(3)?;
    let (a, b) = pair.split_once("<->")?;
    let name = |target: &str| -> Option<String> {
        let target = target.trim();
        match target {
            "Db" => Some("db".into()),
            "Client" => Some("client".into()),
            _ => {
                let (kind, index) = target.strip_suffix(')')?.split_once('(')?;
                Some(format!("{}-{index}", kind.to_lowercase()))
            }
        }
    };
    let (a, b) = (name(a)?, name(b)?);
    if a != node {
        return Some(None);
    }
    Some(Some(fields([("kind", "partition".into()), ("a", a.into()), ("b", b.into()), ("span", span_value(span))])))
}

fn field_text<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

fn field_f64(line: &str, key: &str) -> Option<f64> {
    field_text(line, key)?.parse().ok()
}

/// A degrade line's `latency=1.5ms..12ms` (Rust's Debug of a range of durations) as a duration range.
fn latency(line: &str) -> Option<Value> {
    let (from, to) = field_text(line, "latency")?.split_once("..")?;
    let debug = |text: &str| duration::parse(&text.replace('µ', "u")).ok();
    Some(Value::Array(vec![duration_value(debug(from)?), duration_value(debug(to)?)]))
}

fn fields<const N: usize>(entries: [(&str, Value); N]) -> Table {
    entries.into_iter().map(|(key, value)| (key.to_string(), value)).collect()
}

/// Simulated microseconds as a duration value.
fn span_value(micros: u64) -> Value {
    duration_value(Duration::from_micros(micros.max(1)))
}

fn duration_value(span: Duration) -> Value {
    Value::String(format_duration(span))
}

/// A duration as scenario files write it: whole seconds as `"12s"`, else seconds with up to six decimals
/// (`"12.5s"`, `"0.000250s"` → `"250us"`).
pub fn format_duration(span: Duration) -> String {
    let micros = span.as_micros();
    if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros < 1_000 {
        format!("{micros}us")
    } else if micros < 1_000_000 && micros.is_multiple_of(1_000) {
        format!("{}ms", micros / 1_000)
    } else {
        let text = format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
        format!("{}s", text.trim_end_matches('0'))
    }
}

fn describe_fault(fault: &Value) -> String {
    let Some(fault) = fault.as_table() else { return "?".into() };
    let words: Vec<String> = fault
        .iter()
        .map(|(key, value)| match value {
            Value::String(text) => format!("{key} {text}"),
            other => format!("{key} {other}"),
        })
        .collect();
    words.join(", ")
}

/// The array at `path` (empty if missing).
fn array(table: &Table, path: &[&str]) -> Vec<Value> {
    let mut value: Option<&Value> = table.get(path[0]);
    for key in &path[1..] {
        value = value.and_then(|v| v.get(*key));
    }
    value.and_then(Value::as_array).cloned().unwrap_or_default()
}

/// Sets the array at `path` (a table created where missing); an empty array removes the key, and a table left
/// empty is removed.
fn set_array(table: &mut Table, path: &[&str], list: Vec<Value>) {
    let (last, parents) = path.split_last().expect("a path");
    let parent = table_at(table, parents);
    if list.is_empty() {
        parent.remove(*last);
    } else {
        parent.insert(last.to_string(), Value::Array(list));
    }
    if let Some(first) = parents.first()
        && table.get(*first).and_then(Value::as_table).is_some_and(Table::is_empty)
    {
        table.remove(*first);
    }
}

/// The table at `path`, created where missing.
fn table_at<'a>(table: &'a mut Table, path: &[&str]) -> &'a mut Table {
    let mut current = table;
    for key in path {
        let entry = current.entry(key.to_string()).or_insert_with(|| Value::Table(Table::new()));
        current = entry.as_table_mut().expect("a table on the path");
    }
    current
}

fn set_key(entry: &mut Value, key: &str, value: Value) {
    if let Some(table) = entry.as_table_mut() {
        table.insert(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The faults a run injected are written back as fixed faults of their own kinds: a hung store as
    /// `store-hang` (replica and span), an agent's clock beyond the margin rule as `agent-clock-beyond-margin`
    /// (a plain drift stays `agent-clock-drift`).
    #[test]
    fn store_hangs_and_clocks_beyond_the_margin_are_written_back_as_their_kinds() {
        let trace = "\
    0.000000 world      build          scenario=t seed=1 replicas=1
    5.000000 agent-0    clock-drift    rate_ppm=600000 span=10s beyond_margin=yes
    6.000000 agent-1    clock-drift    rate_ppm=900000 span=10s
   10.000000 replica-0  store-hang     span=15s
   12.000000 agent-1    store-hang     span=5s
   10.100000 replica-0  store-hang-lost call=fetch lost=request
   15.000000 agent-0    clock-exact
   16.000000 agent-1    clock-exact
   25.000000 replica-0  store-hang-end
";
        let table: Table = toml::from_str("name = \"t\"\n[faults]\nuntil = \"40s\"\n").unwrap();
        let candidate = materialized(&table, trace).expect("every fault written back");
        let faults = candidate.table["faults"]["at"].as_array().unwrap();
        let kinds: Vec<&str> = faults.iter().map(|fault| fault["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["agent-clock-beyond-margin", "agent-clock-drift", "store-hang", "store-hang"], "{faults:?}");
        assert_eq!(faults[0]["rate_ppm"].as_integer(), Some(600_000));
        assert_eq!(faults[2]["replica"].as_integer(), Some(0));
        assert_eq!(faults[2]["span"].as_str(), Some("15s"));
        assert_eq!((faults[3]["agent"].as_integer(), faults[3].get("replica")), (Some(1), None));
    }
}
