//! The commands lockstep prints for a user to paste into a POSIX shell ("replay it with: …", "run it with: …"):
//! a program's invocation followed by arguments, each quoted as the shell needs, so that a path with a space or a
//! quote in it reaches the program as one argument. Both builds (the normal build prints how to reach the
//! simulator build).

use std::borrow::Cow;

/// `word` as one shell word: unchanged when it holds only characters no shell treats specially (letters, digits
/// and `-_./:=,+@%`), else in single quotes, each `'` written `'\''`. The empty word is `''`.
pub fn quote(word: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return Cow::Borrowed(word);
    }
    Cow::Owned(format!("'{}'", word.replace('\'', r"'\''")))
}

/// `invocation` (already shell text, such as `env -u RUSTFLAGS cargo sim`) followed by `args`, each quoted.
pub fn command<S: AsRef<str>>(invocation: &str, args: &[S]) -> String {
    let mut line = invocation.to_string();
    for arg in args {
        line.push(' ');
        line.push_str(&quote(arg.as_ref()));
    }
    line
}

/// The words of `line` as a POSIX shell splits a line [`command`] printed: words separated by blanks, single
/// quotes kept literally, a backslash outside quotes escaping the next character. `None` for an unterminated
/// quote. For tests that check a printed command against the program's own argument parser.
pub fn split(line: &str) -> Option<Vec<String>> {
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_stay_and_others_are_single_quoted() {
        assert_eq!(
            quote("lockstep-replays/rows-mixed-seed-6.replay.json"),
            "lockstep-replays/rows-mixed-seed-6.replay.json"
        );
        assert_eq!(quote("my runs/a.json"), "'my runs/a.json'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn a_printed_command_splits_back_into_its_arguments() {
        let args = ["replay", "my runs/it's.json", "", "--seed", "7"];
        let line = command("env -u RUSTFLAGS cargo sim", &args);
        assert_eq!(line, r"env -u RUSTFLAGS cargo sim replay 'my runs/it'\''s.json' '' --seed 7");
        let words = split(&line).unwrap();
        assert_eq!(words[..5], ["env", "-u", "RUSTFLAGS", "cargo", "sim"]);
        assert_eq!(words[5..], args);
        assert_eq!(split("a 'b"), None);
    }
}
