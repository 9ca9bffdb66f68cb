//! Small formatting helpers shared by the subcommands.

use crate::error::CliError;

/// `-o md|json` (bench, membw): whether JSON was asked for.
pub fn wants_json(output: &str) -> Result<bool, CliError> {
    match output {
        "md" => Ok(false),
        "json" => Ok(true),
        other => Err(CliError::msg(format!(
            "unknown output format '{other}'; choose md or json"
        ))),
    }
}

/// Bytes as a human-readable size: `512 B`, `1.50 KiB`, `3.21 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A table with aligned columns: left-aligned text, right-aligned numbers.
pub struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns as (title, right-aligned).
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    /// The table, each line indented by `indent` spaces.
    pub fn render(&self, indent: usize) -> String {
        let n = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for r in std::iter::once(&header).chain(&self.rows) {
            let mut line = " ".repeat(indent);
            for (i, c) in r.iter().enumerate() {
                let pad = width[i] - c.chars().count();
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    if i + 1 < n {
                        line.push_str(&" ".repeat(pad));
                    }
                }
                if i + 1 < n {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tables() {
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
        let mut t = Table::new(&[("name", false), ("n", true)]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["long".into(), "100".into()]);
        assert_eq!(t.render(1), " name    n\n a       1\n long  100\n");
    }
}
