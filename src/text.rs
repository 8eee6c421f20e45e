//! Words for messages and reports: a count with its noun in the right number (`1 row`, `3 rows`). Real mode's
//! reports (`status`, a gang that cannot be placed) and the simulator's summaries say counts the same way.
//!
//! A leaf: it uses nothing of the crate, so every layer can use it.

/// `n` and `word`, with an `s` unless `n` is 1: `1 shard`, `4 shards`, `0 seeds`.
pub fn count(n: impl Into<u64>, word: &str) -> String {
    count_as(n, word, &format!("{word}s"))
}

/// `n` and `one` if `n` is 1, else `n` and `many`: `1 slot per agent`, `2 slots per agent`.
pub fn count_as(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    if n == 1 { format!("{n} {one}") } else { format!("{n} {many}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_of_one_is_singular_and_every_other_plural() {
        assert_eq!(count(1u64, "seed"), "1 seed");
        assert_eq!(count(0u64, "seed"), "0 seeds");
        assert_eq!(count(2u64, "failing seed"), "2 failing seeds");
        assert_eq!(count_as(1u64, "slot per agent", "slots per agent"), "1 slot per agent");
        assert_eq!(count_as(3u64, "slot per agent", "slots per agent"), "3 slots per agent");
    }
}
