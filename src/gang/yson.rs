//! YSON text: a strict parser and a canonical writer for the subset that operation specs use (DESIGN §4).
//!
//! Why our own: the crates that claim YSON were checked on the seed's examples (2026-11-29). `yson` 0.1.0 is an
//! empty placeholder; `yson-rs` 0.2.1 and its fork `ytsaurus-yson` 0.3.1 parse the examples, but both accept
//! text YTsaurus rejects (`{a=1 b=2}` with no `;`, trailing `//x` after the value), keep the last of two
//! duplicate keys silently (a spec with two tasks of one name would lose one without a word), and report errors
//! without a line and column. A spec is user input, so this parser is strict and says where it stopped.
//!
//! Grammar (YTsaurus "YSON" docs, text form): a value is an optional attribute map `<k=v;...>` followed by a map
//! `{k=v;...}`, a list `[v;...]`, a string (`"quoted"` with C escapes, or unquoted `[A-Za-z_][A-Za-z0-9_.-]*`),
//! an integer (`-12`, `12u` for uint64), a double (`1.5`, `1e3`, `%nan`, `%inf`, `%-inf`), a boolean (`%true`,
//! `%false`) or the entity `#`. Items are separated by `;`, and a trailing `;` is allowed. Binary YSON is not
//! supported. Strings must be UTF-8 (specs are text).

use std::collections::BTreeMap;
use std::fmt::{self, Write};

/// Deepest nesting the parser accepts; deeper input is an error, not a stack overflow.
pub const DEPTH_MAX: usize = 64;

/// A YSON value with its attributes (empty when it has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The attributes written before the value as `<k=v;...>`, by key.
    pub attributes: BTreeMap<String, Node>,
    /// The value.
    pub value: Value,
}

/// A YSON value without attributes.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `#`.
    Entity,
    /// `%true` or `%false`.
    Bool(bool),
    /// A signed 64-bit integer.
    Int64(i64),
    /// An unsigned 64-bit integer, written with the suffix `u`.
    Uint64(u64),
    /// A double, including `%nan`, `%inf` and `%-inf`.
    Double(f64),
    /// A string.
    String(String),
    /// `[...]`.
    List(Vec<Node>),
    /// `{...}`, by key; a key appears once.
    Map(BTreeMap<String, Node>),
}

impl Node {
    /// A node with no attributes.
    pub fn plain(value: Value) -> Node {
        Node { attributes: BTreeMap::new(), value }
    }
}

/// Where and why parsing stopped. Lines and columns count from 1; columns count characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct YsonError {
    /// Line of the offending character.
    pub line: usize,
    /// Column of the offending character.
    pub column: usize,
    /// What was expected or wrong.
    pub message: String,
}

/// Parses one YSON value from `text`; only whitespace may follow it.
pub fn parse(text: &str) -> Result<Node, YsonError> {
    let mut parser = Parser { text, pos: 0, depth: 0 };
    let node = parser.node()?;
    parser.skip_whitespace();
    if parser.pos < text.len() {
        return Err(parser.error(format!("unexpected {} after the value", parser.describe_next())));
    }
    Ok(node)
}

/// Splits a rich YPath such as `<file_name=duties.dat>//tmp/duties_180124.dat` into its attributes and the path
/// (YTsaurus "YPath" docs: attributes before the path). A string without a leading `<` has no attributes.
pub fn parse_rich_path(text: &str) -> Result<(BTreeMap<String, Node>, String), YsonError> {
    let mut parser = Parser { text, pos: 0, depth: 0 };
    parser.skip_whitespace();
    if parser.peek() != Some('<') {
        return Ok((BTreeMap::new(), text.trim().to_string()));
    }
    let attributes = parser.attributes()?;
    Ok((attributes, text[parser.pos..].trim().to_string()))
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.pos += 1;
        }
    }

    fn error(&self, message: String) -> YsonError {
        let before = &self.text[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        YsonError { line, column, message }
    }

    fn describe_next(&self) -> String {
        match self.peek() {
            None => "end of input".to_string(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn expect(&mut self, wanted: char) -> Result<(), YsonError> {
        self.skip_whitespace();
        if self.peek() == Some(wanted) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(format!("expected {wanted:?}, found {}", self.describe_next())))
        }
    }

    fn node(&mut self) -> Result<Node, YsonError> {
        self.depth += 1;
        if self.depth > DEPTH_MAX {
            return Err(self.error(format!("nesting deeper than {DEPTH_MAX}")));
        }
        self.skip_whitespace();
        let attributes = if self.peek() == Some('<') { self.attributes()? } else { BTreeMap::new() };
        self.skip_whitespace();
        let value = self.value()?;
        self.depth -= 1;
        Ok(Node { attributes, value })
    }

    fn value(&mut self) -> Result<Value, YsonError> {
        match self.peek() {
            Some('{') => {
                self.pos += 1;
                Ok(Value::Map(self.items('}')?))
            }
            Some('[') => self.list(),
            Some('"') => Ok(Value::String(self.quoted()?)),
            Some('#') => {
                self.pos += 1;
                Ok(Value::Entity)
            }
            Some('%') => self.percent(),
            Some(c) if c == '-' || c == '+' || c.is_ascii_digit() => self.number(),
            Some(c) if is_unquoted_start(c) => Ok(Value::String(self.unquoted())),
            Some(c) if (c as u32) < 0x20 && !c.is_whitespace() => {
                Err(self.error(format!("binary YSON (marker {:#04x}) is not supported", c as u32)))
            }
            _ => Err(self.error(format!("expected a value, found {}", self.describe_next()))),
        }
    }

    fn attributes(&mut self) -> Result<BTreeMap<String, Node>, YsonError> {
        self.expect('<')?;
        self.items('>')
    }

    /// `key = node` items up to `close`, separated by `;` with an optional trailing one; duplicate keys are errors.
    fn items(&mut self, close: char) -> Result<BTreeMap<String, Node>, YsonError> {
        let mut items = BTreeMap::new();
        loop {
            self.skip_whitespace();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(items);
            }
            let key_at = self.pos;
            let key = match self.peek() {
                Some('"') => self.quoted()?,
                Some(c) if is_unquoted_start(c) => self.unquoted(),
                _ => return Err(self.error(format!("expected a key or {close:?}, found {}", self.describe_next()))),
            };
            self.expect('=')?;
            let node = self.node()?;
            if items.insert(key.clone(), node).is_some() {
                self.pos = key_at;
                return Err(self.error(format!("duplicate key {key:?}")));
            }
            self.skip_whitespace();
            match self.peek() {
                Some(';') => self.pos += 1,
                Some(c) if c == close => {}
                _ => return Err(self.error(format!("expected ';' or {close:?}, found {}", self.describe_next()))),
            }
        }
    }

    fn list(&mut self) -> Result<Value, YsonError> {
        self.expect('[')?;
        let mut nodes = Vec::new();
        loop {
            self.skip_whitespace();
            if self.peek() == Some(']') {
                self.pos += 1;
                return Ok(Value::List(nodes));
            }
            nodes.push(self.node()?);
            self.skip_whitespace();
            match self.peek() {
                Some(';') => self.pos += 1,
                Some(']') => {}
                _ => return Err(self.error(format!("expected ';' or ']', found {}", self.describe_next()))),
            }
        }
    }

    fn unquoted(&mut self) -> String {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            self.pos += 1;
        }
        self.text[start..self.pos].to_string()
    }

    fn quoted(&mut self) -> Result<String, YsonError> {
        self.expect('"')?;
        let mut bytes = Vec::new();
        loop {
            let at = self.pos;
            match self.bump() {
                None => return Err(self.error("unterminated string".into())),
                Some('"') => break,
                Some('\\') => self.escape(&mut bytes)?,
                Some(c) => bytes.extend_from_slice(&self.text.as_bytes()[at..at + c.len_utf8()]),
            }
        }
        String::from_utf8(bytes).map_err(|_| self.error("string is not valid UTF-8".into()))
    }

    /// A C escape after `\` (YTsaurus writes and reads strings with C escapes).
    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), YsonError> {
        let byte = match self.bump() {
            Some('n') => b'\n',
            Some('r') => b'\r',
            Some('t') => b'\t',
            Some('a') => 0x07,
            Some('b') => 0x08,
            Some('f') => 0x0c,
            Some('v') => 0x0b,
            Some(c @ ('\\' | '"' | '\'' | '?')) => c as u8,
            Some('x') => self.radix_digits(16, 2, 2)?,
            Some(c) if c.is_digit(8) => {
                self.pos -= 1;
                self.radix_digits(8, 1, 3)?
            }
            Some(c) => return Err(self.error(format!("unknown escape \\{c}"))),
            None => return Err(self.error("unterminated string".into())),
        };
        out.push(byte);
        Ok(())
    }

    fn radix_digits(&mut self, radix: u32, min: usize, max: usize) -> Result<u8, YsonError> {
        let mut value: u32 = 0;
        let mut count = 0;
        while count < max {
            match self.peek().and_then(|c| c.to_digit(radix)) {
                Some(digit) => {
                    value = value * radix + digit;
                    self.pos += 1;
                    count += 1;
                }
                None => break,
            }
        }
        if count < min || value > 0xff {
            return Err(self.error(format!("bad escape: expected {min}..{max} digits of base {radix} below 256")));
        }
        Ok(value as u8)
    }

    fn percent(&mut self) -> Result<Value, YsonError> {
        let start = self.pos;
        self.pos += 1;
        while self.peek().is_some_and(|c| c.is_ascii_alphabetic() || c == '-' || c == '+') {
            self.pos += 1;
        }
        match &self.text[start..self.pos] {
            "%true" => Ok(Value::Bool(true)),
            "%false" => Ok(Value::Bool(false)),
            "%nan" => Ok(Value::Double(f64::NAN)),
            "%inf" | "%+inf" => Ok(Value::Double(f64::INFINITY)),
            "%-inf" => Ok(Value::Double(f64::NEG_INFINITY)),
            other => {
                let other = other.to_string();
                self.pos = start;
                Err(self.error(format!("unknown literal {other:?} (expected %true, %false, %nan, %inf, %-inf)")))
            }
        }
    }

    fn number(&mut self) -> Result<Value, YsonError> {
        let start = self.pos;
        let mut double = false;
        while let Some(c) = self.peek() {
            match c {
                '0'..='9' | '-' | '+' => {}
                '.' | 'e' | 'E' => double = true,
                _ => break,
            }
            self.pos += 1;
        }
        let literal = &self.text[start..self.pos];
        let bad = |parser: &mut Self, kind: &str| {
            let message = format!("bad {kind} literal {literal:?}");
            parser.pos = start;
            Err(parser.error(message))
        };
        if self.peek() == Some('u') {
            self.pos += 1;
            return match literal.parse::<u64>() {
                Ok(v) if !double => Ok(Value::Uint64(v)),
                _ => bad(self, "uint64"),
            };
        }
        if double {
            return match literal.parse::<f64>() {
                Ok(v) => Ok(Value::Double(v)),
                Err(_) => bad(self, "double"),
            };
        }
        match literal.parse::<i64>() {
            Ok(v) => Ok(Value::Int64(v)),
            Err(_) => bad(self, "int64"),
        }
    }
}

fn is_unquoted_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

/// Canonical YSON text of `node`: strings always quoted, `;` after every item, no whitespace. [`parse`] reads it
/// back to an equal node (NaN aside, which equals nothing).
pub fn to_text(node: &Node) -> String {
    let mut out = String::new();
    write_node(&mut out, node).expect("writing to a String cannot fail");
    out
}

fn write_node(out: &mut String, node: &Node) -> fmt::Result {
    if !node.attributes.is_empty() {
        out.push('<');
        write_items(out, &node.attributes)?;
        out.push('>');
    }
    match &node.value {
        Value::Entity => out.push('#'),
        Value::Bool(b) => out.push_str(if *b { "%true" } else { "%false" }),
        Value::Int64(v) => write!(out, "{v}")?,
        Value::Uint64(v) => write!(out, "{v}u")?,
        Value::Double(v) if v.is_nan() => out.push_str("%nan"),
        Value::Double(v) if v.is_infinite() => out.push_str(if *v > 0.0 { "%inf" } else { "%-inf" }),
        // `{:?}` keeps a `.0` or an exponent, so the text reads back as a double, and is shortest round-trip.
        Value::Double(v) => write!(out, "{v:?}")?,
        Value::String(s) => write_string(out, s),
        Value::List(nodes) => {
            out.push('[');
            for node in nodes {
                write_node(out, node)?;
                out.push(';');
            }
            out.push(']');
        }
        Value::Map(items) => {
            out.push('{');
            write_items(out, items)?;
            out.push('}');
        }
    }
    Ok(())
}

fn write_items(out: &mut String, items: &BTreeMap<String, Node>) -> fmt::Result {
    for (key, node) in items {
        write_string(out, key);
        out.push('=');
        write_node(out, node)?;
        out.push(';');
    }
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn string(s: &str) -> Node {
        Node::plain(Value::String(s.into()))
    }

    #[test]
    fn scalars_parse_as_written() {
        let map = parse(r#"{a=%true; b=%false; c=#; d=1u; e=-2.5; f=abc_d.e-f; g="\x41\n\"\101"; h=-7; i=1e3}"#);
        let Value::Map(map) = map.unwrap().value else { panic!("not a map") };
        assert_eq!(map["a"].value, Value::Bool(true));
        assert_eq!(map["b"].value, Value::Bool(false));
        assert_eq!(map["c"].value, Value::Entity);
        assert_eq!(map["d"].value, Value::Uint64(1));
        assert_eq!(map["e"].value, Value::Double(-2.5));
        assert_eq!(map["f"].value, Value::String("abc_d.e-f".into()));
        assert_eq!(map["g"].value, Value::String("A\n\"A".into()));
        assert_eq!(map["h"].value, Value::Int64(-7));
        assert_eq!(map["i"].value, Value::Double(1000.0));
    }

    #[test]
    fn attributes_attach_to_the_next_value() {
        let node = parse(r#"[<file_name=duties.dat>"//tmp/x"; <a=1;b=2;>y;]"#).unwrap();
        let Value::List(items) = node.value else { panic!("not a list") };
        assert_eq!(items[0].attributes["file_name"], string("duties.dat"));
        assert_eq!(items[0].value, Value::String("//tmp/x".into()));
        assert_eq!(items[1].attributes.len(), 2);
    }

    #[test]
    fn rich_paths_split_attributes_from_the_path() {
        let (attributes, path) = parse_rich_path("<file_name=duties.dat>//tmp/duties_180124.dat").unwrap();
        assert_eq!(attributes["file_name"], string("duties.dat"));
        assert_eq!(path, "//tmp/duties_180124.dat");
        let (attributes, path) = parse_rich_path("//tmp/run_master.py").unwrap();
        assert!(attributes.is_empty());
        assert_eq!(path, "//tmp/run_master.py");
    }

    #[test]
    fn errors_say_where() {
        let cases = [
            ("{a=1 b=2}", 1, 6, "expected ';' or '}'"),
            ("{a=1;;}", 1, 6, "expected a key"),
            ("{\n  a=1;\n  a=2;\n}", 3, 3, "duplicate key \"a\""),
            ("{a=1} //x", 1, 7, "after the value"),
            ("{a=b/c}", 1, 5, "expected ';' or '}'"),
            ("{a=%yes}", 1, 4, "unknown literal"),
            ("{a=\"abc}", 1, 9, "unterminated string"),
            ("{a=9223372036854775808}", 1, 4, "bad int64"),
            ("", 1, 1, "expected a value"),
            ("{a=\u{1}}", 1, 4, "binary YSON"),
        ];
        for (text, line, column, message) in cases {
            let error = parse(text).unwrap_err();
            assert_eq!((error.line, error.column), (line, column), "{text:?}: {error}");
            assert!(error.message.contains(message), "{text:?}: {error}");
        }
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(DEPTH_MAX + 1) + &"]".repeat(DEPTH_MAX + 1);
        assert!(parse(&deep).unwrap_err().message.contains("nesting"));
        let fine = "[".repeat(DEPTH_MAX) + &"]".repeat(DEPTH_MAX);
        parse(&fine).unwrap();
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z_][a-z0-9_.-]{0,8}", ".{0,6}"]
    }

    fn arb_node() -> impl Strategy<Value = Node> {
        let leaf = prop_oneof![
            Just(Value::Entity),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int64),
            any::<u64>().prop_map(Value::Uint64),
            any::<f64>().prop_filter("NaN equals nothing", |v| !v.is_nan()).prop_map(Value::Double),
            ".{0,12}".prop_map(Value::String),
        ]
        .prop_map(Node::plain);
        leaf.prop_recursive(4, 48, 6, |inner| {
            let attributes = prop::collection::btree_map(arb_key(), inner.clone(), 0..3);
            let value = prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
                prop::collection::btree_map(arb_key(), inner, 0..6).prop_map(Value::Map),
            ];
            (attributes, value).prop_map(|(attributes, value)| Node { attributes, value })
        })
    }

    proptest! {
        #[test]
        fn canonical_text_reads_back_to_the_same_node(node in arb_node()) {
            let text = to_text(&node);
            prop_assert_eq!(parse(&text).unwrap(), node, "{}", text);
        }
    }
}
