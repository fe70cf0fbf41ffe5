//! The fixed-width tables of the CLI (`plan`, `status`): each column padded to its widest cell,
//! two spaces apart; the last column is not padded, so one long text does not pad every line.

use std::fmt::Write as _;

pub fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|r| r.each_ref().map(|c| printable(c)))
        .collect();
    let widths: Vec<usize> = (0..N.saturating_sub(1))
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(out, "{cell:<width$}  ");
        }
        if let Some(last) = row.last() {
            let _ = writeln!(out, "{last}");
        }
    }
    out
}

/// Text from the cluster (node names, agent-written fields in error messages) as a terminal
/// shows it: control characters escaped (`\u{1b}`, `\n`), so none moves the cursor, clears the
/// screen or forges a line of its own.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped() {
        let rows = [["a\u{1b}[2Jb".to_string(), "x\ny\r".into()]];
        assert_eq!(super::render(&rows), "a\\u{1b}[2Jb  x\\ny\\r\n");
        assert_eq!(super::printable("né ok"), "né ok");
    }

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let rows = [
            ["NODE".to_string(), "A".into(), "WHY".into()],
            ["node-long".to_string(), "12".into(), "x".into()],
        ];
        assert_eq!(
            super::render(&rows),
            "NODE       A   WHY\nnode-long  12  x\n"
        );
    }
}
