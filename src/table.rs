//! Plain-text tables for the command line (`list`, `status`, `sim explain`): each column padded with spaces to its
//! widest cell. The padding is written out, not asked of `format!`'s width (`{:<w$}`), which panics at a width past
//! 65 535: one operation with a 70 000-character task name or abort reason made `lockstep list` panic for every
//! user of the schema (a new user's trial).

/// `header` and `rows` as lines of cells left-aligned in columns two spaces apart, each line after `indent`, with
/// no trailing spaces. Widths count characters, not bytes.
pub fn render<const N: usize>(header: [&str; N], rows: &[[String; N]], indent: &str) -> String {
    let mut widths = header.map(|cell| cell.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header = header.map(str::to_string);
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::from(indent);
        for (cell, width) in row.iter().zip(widths) {
            pad(&mut line, cell, width, Align::Left);
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Which side of its column a cell keeps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text: spaces after it.
    Left,
    /// Numbers: spaces before it.
    Right,
}

/// Appends `cell` to `out`, padded with spaces to `width` characters on the side `align` leaves free (a wider cell
/// is written whole).
pub fn pad(out: &mut String, cell: &str, width: usize, align: Align) {
    let spaces = width.saturating_sub(cell.chars().count());
    if align == Align::Right {
        out.extend(std::iter::repeat_n(' ', spaces));
    }
    out.push_str(cell);
    if align == Align::Left {
        out.extend(std::iter::repeat_n(' ', spaces));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_their_widest_cell_without_trailing_spaces() {
        let rows = [["1".to_string(), "running".to_string()], ["12".to_string(), "x".to_string()]];
        assert_eq!(render(["id", "state"], &rows, "  "), "  id  state\n  1   running\n  12  x\n");
    }

    /// `format!("{:<w$}")` panics at a width past 65 535; a cell that wide is padded by hand.
    #[test]
    fn a_cell_wider_than_format_allows_is_rendered() {
        let wide = "t".repeat(70_000);
        let rows = [[wide.clone(), "a".to_string()], ["b".to_string(), "c".to_string()]];
        let text = render(["name", "x"], &rows, "");
        assert!(text.lines().nth(2).unwrap().starts_with(&format!("b{}", " ".repeat(69_999))));
        let mut line = String::new();
        pad(&mut line, "7", 70_001, Align::Right);
        assert_eq!(line.len(), 70_001);
    }
}
