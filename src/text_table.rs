//! The fixed-width tables of the CLI (`plan`, `status`): each column padded to its widest cell,
//! two spaces apart; the last column is not padded, so one long text does not pad every line.

use std::fmt::Write as _;

pub fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N.saturating_sub(1))
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(out, "{cell:<width$}  ");
        }
        if let Some(last) = row.last() {
            let _ = writeln!(out, "{last}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
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
