//! One operation's or one row's timeline from a trace (`lockstep sim explain`).
//!
//! A trace line is `time node kind fields` ([`super::trace`]); node and kind are single words. A line is about
//! operation `ID` when one of its field tokens is exactly `op=ID` (tokens split at whitespace, `,`, brackets
//! and parentheses, so `op=1` never matches `op=12`). A line is about row `ID` when a field token is `id=ID` or
//! `row=ID`, or, in a `commit` or `reply-dropped` line (the store calls, `sim/db.rs`, rendered by
//! `CommitOp`'s `Display`: `fetch tasks [12#5,13#6]`, `apply 12#5 applied related=[3,4] inserted=[]`,
//! `lock_related 12#5 jobs [3,4] Locked`, `insert 12 task`, `hint job Some(RowId(12))`), a bare number or a
//! lease `ID#token` in any position, lists included.

use super::trace::TraceEvent;
use crate::table::{Align, pad};

/// One parsed trace line; the parts borrow from the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceLine<'a> {
    /// Simulated time, seconds with six decimals (`12.000345`).
    pub at: &'a str,
    /// The node (`replica-0`, `db`, `world`, …).
    pub node: &'a str,
    /// What happened (`commit`, `pause`, …).
    pub kind: &'a str,
    /// The rest of the line.
    pub fields: &'a str,
}

/// Splits a trace line into its parts; `None` for a blank line or one with fewer than three words.
pub fn parse_line(line: &str) -> Option<TraceLine<'_>> {
    let mut rest = line.trim_start();
    let mut word = || {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, after) = rest.split_at(end);
        rest = after.trim_start();
        (!word.is_empty()).then_some(word)
    };
    let (at, node, kind) = (word()?, word()?, word()?);
    Some(TraceLine { at, node, kind, fields: rest.trim_end() })
}

/// Whether `text` reads as a trace file (`sim run --trace FILE`): at least one line, and every non-blank line a
/// trace line whose time is seconds with decimals (`12.000345 replica-0 commit …`). Errors: the first line that is
/// not (1-based number and text), or `(0, "")` for a text without any line.
pub fn check_trace(text: &str) -> Result<(), (usize, &str)> {
    let is_time = |at: &str| {
        at.split_once('.').is_some_and(|(s, f)| {
            !s.is_empty()
                && !f.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && f.bytes().all(|b| b.is_ascii_digit())
        })
    };
    let mut lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()).peekable();
    if lines.peek().is_none() {
        return Err((0, ""));
    }
    for (index, line) in lines {
        if !parse_line(line).is_some_and(|parsed| is_time(parsed.at)) {
            return Err((index + 1, line));
        }
    }
    Ok(())
}

/// The whitespace-separated words of `fields`, a string literal kept whole: a trace value with spaces, quotes
/// or `=` is written as a Rust string literal (`reason="node lost"`, `error="op=3 \"x\""`: sim/gang.rs), so
/// `reason="node lost"` is one word and nothing inside a literal is a word of its own.
pub fn field_tokens(fields: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let (mut start, mut quoted, mut escaped) = (None, false, false);
    for (at, c) in fields.char_indices() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        if c.is_whitespace() {
            if let Some(from) = start.take() {
                words.push(&fields[from..at]);
            }
            continue;
        }
        start.get_or_insert(at);
        quoted = c == '"';
    }
    if let Some(from) = start {
        words.push(&fields[from..]);
    }
    words
}

/// The field tokens of `fields`: its words ([`field_tokens`]), those outside string literals split further at
/// commas, brackets and parentheses; a word holding a string literal is one token.
fn tokens(fields: &str) -> impl Iterator<Item = &str> {
    field_tokens(fields).into_iter().flat_map(|word| {
        let parts: Vec<&str> = if word.contains('"') {
            vec![word]
        } else {
            word.split([',', '[', ']', '(', ')', '{', '}']).filter(|t| !t.is_empty()).collect()
        };
        parts
    })
}

/// Whether `fields` holds the token `op=ID` exactly (not inside a quoted value).
pub fn mentions_operation(fields: &str, operation: &str) -> bool {
    tokens(fields).any(|token| token.strip_prefix("op=") == Some(operation))
}

/// Whether a line of `kind` with `fields` is about row `row` (the rules of the module doc).
pub fn mentions_row(kind: &str, fields: &str, row: &str) -> bool {
    let store_call = matches!(kind, "commit" | "reply-dropped");
    for word in field_tokens(fields).into_iter().filter(|word| !word.contains('"')) {
        // `related=[3,4]`: the key applies to every id of the list that follows it in the same word.
        let (key, values) = match word.split_once('=') {
            Some((key, values)) => (Some(key), values),
            None => (None, word),
        };
        for token in tokens(values) {
            let id = token.split('#').next().unwrap_or(token);
            let keyed = matches!(key, Some("id" | "row" | "related" | "inserted"));
            if id == row && (keyed || (store_call && key.is_none())) {
                return true;
            }
        }
    }
    false
}

/// The lines of `trace` (a trace file's text) about operation `operation`, in order.
pub fn operation_lines<'a>(trace: &'a str, operation: &str) -> Vec<TraceLine<'a>> {
    trace.lines().filter_map(parse_line).filter(|line| mentions_operation(line.fields, operation)).collect()
}

/// The lines of `trace` (a trace file's text) about row `row`, in order.
pub fn row_lines<'a>(trace: &'a str, row: &str) -> Vec<TraceLine<'a>> {
    trace.lines().filter_map(parse_line).filter(|line| mentions_row(line.kind, line.fields, row)).collect()
}

/// Whether the trace event is about any of `rows`.
pub fn event_mentions_rows(event: &TraceEvent, rows: &[String]) -> bool {
    let fields = event.fields.text();
    rows.iter().any(|row| mentions_row(event.kind, &fields, row))
}

/// `lines` as an aligned table: time right-aligned, node and kind padded to the widest of these lines.
pub fn render_timeline(lines: &[TraceLine<'_>]) -> String {
    let width = |part: fn(&TraceLine<'_>) -> usize| lines.iter().map(part).max().unwrap_or(0);
    let (at, node, kind) = (width(|l| l.at.len()), width(|l| l.node.len()), width(|l| l.kind.len()));
    let mut text = String::new();
    for line in lines {
        // Padded by hand: `format!`'s width panics past 65 535 (a trace line with a 70 000-character node name).
        let mut row = String::new();
        pad(&mut row, line.at, at, Align::Right);
        row.push_str("  ");
        pad(&mut row, line.node, node, Align::Left);
        row.push_str("  ");
        pad(&mut row, line.kind, kind, Align::Left);
        row.push_str("  ");
        row.push_str(line.fields);
        text.push_str(row.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
    0.000000 world      build          scenario=t seed=1 replicas=2
    1.000100 db         commit         insert 12 task
    1.000200 replica-0  commit         fetch tasks [12#5,13#6]
    1.500000 replica-0  op-event       op=1 state=running
    1.600000 replica-1  op-event       op=12 state=running
    2.000000 replica-0  commit         apply 12#5 applied related=[] inserted=[]
    2.100000 replica-1  commit         apply 3#9 applied related=[112,12] inserted=[]
    2.200000 client     workload-done  ClientReport { jobs: 12, tasks: 3 }
    2.300000 replica-0  reply-dropped  apply
    2.400000 replica-1  commit         hint job Some(RowId(12))
    3.000000 world      heal           id=12
    3.100000 replica-1  op-event       status op=1
";

    #[test]
    fn a_line_splits_into_time_node_kind_and_fields() {
        let line = parse_line("    1.000200 replica-0  commit         fetch tasks [12#5,13#6]").unwrap();
        assert_eq!(
            line,
            TraceLine { at: "1.000200", node: "replica-0", kind: "commit", fields: "fetch tasks [12#5,13#6]" }
        );
        assert_eq!(parse_line("   ").map(|l| l.kind), None);
        assert_eq!(parse_line("1.0 world heal").unwrap().fields, "");
    }

    #[test]
    fn an_operation_matches_its_exact_token_only() {
        let lines = operation_lines(TRACE, "1");
        let times: Vec<&str> = lines.iter().map(|line| line.at).collect();
        assert_eq!(times, ["1.500000", "3.100000"]);
        assert_eq!(operation_lines(TRACE, "12").len(), 1);
        assert!(operation_lines(TRACE, "2").is_empty());
    }

    #[test]
    fn a_row_matches_ids_leases_lists_and_keys_but_not_other_numbers() {
        let lines = row_lines(TRACE, "12");
        let times: Vec<&str> = lines.iter().map(|line| line.at).collect();
        // Not the `op=12` line, not `jobs: 12` in a non-store line, not `112` or a token `#12`.
        assert_eq!(times, ["1.000100", "1.000200", "2.000000", "2.100000", "2.400000", "3.000000"]);
        assert!(!mentions_row("commit", "apply 3#12 applied related=[] inserted=[]", "12"));
        assert!(mentions_row("commit", "lock_related 12#5 jobs [3,4] Locked", "4"));
        assert!(!mentions_row("pause", "span=12s", "12"));
    }

    #[test]
    fn quoted_values_are_one_token_and_never_match() {
        let fields = r#"op=7 name="a b" reason="node lost" error="op=3 \"x y\" op=4" trigger=7-2"#;
        assert_eq!(
            field_tokens(fields),
            ["op=7", r#"name="a b""#, r#"reason="node lost""#, r#"error="op=3 \"x y\" op=4""#, "trigger=7-2"]
        );
        assert!(mentions_operation(fields, "7"));
        assert!(!mentions_operation(fields, "3") && !mentions_operation(fields, "4"));
        assert!(!mentions_row("commit", r#"insert 5 operation error="row=9""#, "9"));
        assert!(mentions_row("commit", r#"insert 5 operation error="row=9""#, "5"));
        assert_eq!(field_tokens("  a   b  "), ["a", "b"]);
        assert_eq!(field_tokens(r#"unterminated="a b"#), [r#"unterminated="a b"#]);
    }

    #[test]
    fn a_timeline_is_aligned() {
        let lines = row_lines(TRACE, "13");
        assert_eq!(render_timeline(&lines), "1.000200  replica-0  commit  fetch tasks [12#5,13#6]\n");
        let lines = operation_lines(TRACE, "1");
        let text = render_timeline(&lines);
        assert_eq!(
            text,
            "1.500000  replica-0  op-event  op=1 state=running\n3.100000  replica-1  op-event  status op=1\n"
        );
    }
}
