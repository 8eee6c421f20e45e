//! Exactly-once effect of guarded applies (DESIGN §3 guarded apply; §5): every row's work took effect once.
//!
//! Every apply that does a row's work appends an `effect` event naming its pipeline (and the counter row it
//! incremented, for claims) in the same transaction, so the events table records applied work only. The check:
//! 1. no row has two effects of one pipeline (a stale holder's apply, or a retried apply, wrote again);
//! 2. every final row that the workload processes has exactly one effect of its pipeline (no final row without
//!    its work);
//! 3. every counter row's `count` equals the number of effects that name it (`counter`, or one of `counters` for
//!    a claim of several resources: no lost or doubled increment of a shared row, whatever interleaving of claim
//!    pipelines);
//! 4. a row its pipeline gave up on (`failed`) took no effect: no apply of it ever succeeded.

use super::{CheckInput, RowModel, listed};
use crate::sim::workload::{self, EFFECT_EVENT, FAILED_STATUS};
use crate::store::RowId;
use std::collections::BTreeMap;

/// The check; the error lists every broken count.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    if !matches!(input.rows, RowModel::Builtin) {
        // A user's pipelines append no `effect` events of the built-in workload; their effects outside the store
        // are the services' (`external_exactly_once`), their own invariants their checkers'.
        return Ok(());
    }
    // Keyed by the pipeline's name as the event holds it: no new string per effect.
    let mut effects: BTreeMap<(RowId, &str), usize> = BTreeMap::new();
    let mut increments: BTreeMap<RowId, u64> = BTreeMap::new();
    for event in input.events.iter().filter(|event| event.kind == EFFECT_EVENT) {
        let pipeline = event.data["pipeline"].as_str().unwrap_or("?");
        *effects.entry((event.row_id, pipeline)).or_default() += 1;
        if let Some(counter) = event.data["counter"].as_i64() {
            *increments.entry(RowId(counter)).or_default() += 1;
        }
        for counter in event.data.get("counters").and_then(|ids| ids.as_array()).into_iter().flatten() {
            *increments.entry(RowId(counter.as_i64().unwrap_or(0))).or_default() += 1;
        }
    }
    let mut broken = Vec::new();
    for ((row, pipeline), count) in &effects {
        if *count > 1 {
            broken.push(format!("row {row}: pipeline {pipeline} took effect {count} times"));
        }
    }
    for row in input.rows_final.iter().filter(|row| workload::is_terminal(row)) {
        if let Some(pipeline) = workload::expected_effect(row)
            && !effects.contains_key(&(row.id, pipeline.as_str()))
        {
            let (id, kind, status) = (row.id, &row.kind, &row.status);
            broken.push(format!("row {id} ({kind} {status}) is final without an effect of {pipeline}"));
        }
        if row.status == FAILED_STATUS
            && let Some(((_, pipeline), _)) = effects.range((row.id, "")..).next().filter(|((id, _), _)| *id == row.id)
        {
            broken.push(format!("row {} ({} failed) took an effect of {pipeline}", row.id, row.kind));
        }
        if let Some(count) = row.data.get("count").and_then(|count| count.as_u64()) {
            let expected = increments.get(&row.id).copied().unwrap_or(0);
            if count != expected {
                broken.push(format!("counter row {} holds {count} but {expected} effects incremented it", row.id));
            }
        }
    }
    if broken.is_empty() {
        return Ok(());
    }
    Err(format!("{} broken counts: {}", broken.len(), listed(&broken)))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{T0, input, row};
    use super::*;
    use crate::store::{Event, Row};
    use serde_json::json;

    fn effect(seq: i64, row: i64, pipeline: &str, counter: Option<i64>) -> Event {
        let data = match counter {
            Some(counter) => json!({ "pipeline": pipeline, "counter": counter }),
            None => json!({ "pipeline": pipeline }),
        };
        Event { seq, row_id: RowId(row), kind: EFFECT_EVENT.into(), data, at: T0 }
    }

    fn counter(id: i64, count: u64) -> Row {
        let mut row = row(id, "resource", "free");
        row.data = json!({ "count": count });
        row
    }

    #[test]
    fn one_effect_per_row_and_matching_counters_pass() {
        let events = [effect(1, 1, "tasks", None), effect(2, 2, "claims-0", Some(3))];
        let rows = [row(1, "task", "done"), row(2, "claim-0", "done"), counter(3, 1)];
        assert_eq!(check(&input(&[], &events, &rows)), Ok(()));
    }

    #[test]
    fn a_doubled_effect_and_a_lost_increment_fire() {
        let events = [effect(1, 1, "tasks", None), effect(2, 1, "tasks", None), effect(3, 2, "claims-1", Some(3))];
        let rows = [row(1, "task", "done"), row(2, "claim-1", "done"), counter(3, 0)];
        let violation = check(&input(&[], &events, &rows)).expect_err("the checker missed a doubled effect");
        assert!(violation.contains("row 1: pipeline tasks took effect 2 times"), "{violation}");
        assert!(violation.contains("counter row 3 holds 0 but 1 effects incremented it"), "{violation}");
    }

    #[test]
    fn an_effect_on_several_counters_counts_once_on_each() {
        let data = json!({ "pipeline": "claims-0", "counters": [3, 4] });
        let events = [Event { seq: 1, row_id: RowId(2), kind: EFFECT_EVENT.into(), data, at: T0 }];
        let rows = [row(2, "claim-0", "done"), counter(3, 1), counter(4, 0)];
        let violation = check(&input(&[], &events, &rows)).expect_err("missed a lost increment of counter 4");
        assert!(violation.contains("counter row 4 holds 0 but 1 effects incremented it"), "{violation}");
        assert!(!violation.contains("counter row 3"), "{violation}");
    }

    #[test]
    fn a_final_row_without_its_effect_fires() {
        let violation = check(&input(&[], &[], &[row(5, "job", "done")])).expect_err("missed a row done for free");
        assert!(violation.contains("row 5 (job done) is final without an effect of jobs"), "{violation}");
    }

    #[test]
    fn a_failed_row_with_an_effect_fires_and_one_without_passes() {
        let rows = [row(6, "task", FAILED_STATUS), row(7, "task", FAILED_STATUS)];
        let events = [effect(1, 6, "tasks", None)];
        let violation = check(&input(&[], &events, &rows)).expect_err("missed an effect of a row given up");
        assert!(violation.contains("row 6 (task failed) took an effect of tasks"), "{violation}");
        assert!(!violation.contains("row 7"), "{violation}");
    }
}
