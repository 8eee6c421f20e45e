//! Exactly-once effects outside the store: no subject was acted on twice by a simulated external
//! service ([`crate::sim::service`]).
//!
//! A guarded apply makes a row's *database* writes happen once, but a handler's call to the outside world is not
//! fenced by the lease's token: a handler that charges a card, loses the reply, fails its item, and charges
//! again on the retry has charged twice. Services dedupe requests by idempotency key; this checker reads each
//! service's log and fails a run in which two effects were performed for one subject (a retry without a key, or
//! with a different key each time).

use super::{CheckInput, listed};
use std::collections::BTreeMap;

/// The check; the error lists every subject acted on more than once, with the keys and callers of its effects.
pub fn check(input: &CheckInput<'_>) -> Result<(), String> {
    let mut performed: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    for effect in input.effects.iter().filter(|effect| effect.applied) {
        let key = effect.idempotency_key.as_deref().unwrap_or("no key");
        let seen = format!("{key} from {} at {:.3} s", effect.caller, effect.at.as_secs_f64());
        performed.entry((effect.service.as_str(), effect.subject.as_str())).or_default().push(seen);
    }
    let doubled: Vec<String> = performed
        .iter()
        .filter(|(_, effects)| effects.len() > 1)
        .map(|((service, subject), effects)| {
            format!("{service}: {subject:?} performed {} times ({})", effects.len(), effects.join(", "))
        })
        .collect();
    if doubled.is_empty() {
        return Ok(());
    }
    let subjects = crate::text::count_as(doubled.len() as u64, "subject", "subjects");
    Err(format!("{subjects} acted on more than once: {}", listed(&doubled)))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::input;
    use super::*;
    use crate::sim::service::Effect;
    use std::time::Duration;

    fn effect(subject: &str, key: Option<&str>, applied: bool) -> Effect {
        Effect {
            service: "payments".into(),
            at: Duration::from_secs(1),
            caller: "replica-0".into(),
            subject: subject.into(),
            idempotency_key: key.map(str::to_string),
            applied,
        }
    }

    #[test]
    fn a_replayed_key_is_not_a_second_effect() {
        let effects = [effect("line 1", Some("k1"), true), effect("line 1", Some("k1"), false)];
        let input = super::super::CheckInput { effects: &effects, ..input(&[], &[], &[]) };
        assert_eq!(check(&input), Ok(()));
    }

    #[test]
    fn a_subject_performed_twice_fires() {
        let effects = [effect("line 1", None, true), effect("line 2", None, true), effect("line 1", None, true)];
        let input = super::super::CheckInput { effects: &effects, ..input(&[], &[], &[]) };
        let error = check(&input).unwrap_err();
        assert!(error.starts_with("1 subject acted on more than once"), "{error}");
        assert!(error.contains("payments: \"line 1\" performed 2 times"), "{error}");
    }
}
