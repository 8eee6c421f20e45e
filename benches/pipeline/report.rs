//! The results: side-by-side tables (median of the repetitions, their spread, the ratio to the raw limit measured
//! in the same repetition, and the cost per item), the throughput-against-workers series, and the machine they ran
//! on; printed and written as Markdown.

use crate::measure::Sample;
use std::fmt::Write as _;

/// What the numbers ran on.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: Option<String>,
    pub load_before: String,
    pub load_after: String,
    pub date_utc: String,
    pub window_secs: f64,
    pub reps: usize,
}

/// One contender's measurements in one group, one sample per repetition.
#[derive(Clone, Debug)]
pub struct Line {
    pub label: String,
    pub samples: Vec<Sample>,
    /// Its rate divided by the group's reference (the batched raw limit) in the same repetition.
    pub ratios: Vec<f64>,
}

/// Contenders measured under the same load shape (replicas × workers, or as many raw clients).
#[derive(Clone, Debug)]
pub struct Group {
    pub title: String,
    pub lines: Vec<Line>,
}

/// One store's side-by-side table.
#[derive(Clone, Debug)]
pub struct Table {
    pub title: String,
    /// The label of the reference line the ratios divide by.
    pub reference: String,
    pub groups: Vec<Group>,
}

/// Throughput against workers for one configuration.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    /// Processing time per item, if not trivial: the model's line is workers / processing time.
    pub processing_ms: Option<f64>,
    pub points: Vec<(usize, Sample)>,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub machine: Machine,
    pub tables: Vec<Table>,
    pub series: Vec<Series>,
    pub plot_file: Option<String>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `1234567.0` → `1 234 567`.
fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "–".into();
    }
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{2009}');
        }
        out.push(c);
    }
    out
}

impl Line {
    fn rates(&self) -> Vec<f64> {
        self.samples.iter().map(Sample::rate).collect()
    }

    /// Median rate, items per second.
    pub fn rate(&self) -> f64 {
        median(&self.rates())
    }

    /// (max − min) / median of the rates, as a percentage: how much the repetitions disagree.
    fn spread_pct(&self) -> f64 {
        let rates = self.rates();
        let max = rates.iter().cloned().fold(f64::MIN, f64::max);
        let min = rates.iter().cloned().fold(f64::MAX, f64::min);
        (max - min) / median(&rates) * 100.0
    }

    fn cells(&self) -> [String; 6] {
        let cpu = median(&self.samples.iter().map(Sample::cpu_us_per_item).collect::<Vec<_>>());
        let db_cpu = median(&self.samples.iter().map(Sample::db_cpu_us_per_item).collect::<Vec<_>>());
        let per_call: Vec<(f64, f64, f64)> = self.samples.iter().filter_map(|s| s.per_call).collect();
        let per_call = if per_call.is_empty() {
            "–".into()
        } else {
            let fetch = median(&per_call.iter().map(|p| p.0).collect::<Vec<_>>());
            let apply = median(&per_call.iter().map(|p| p.1).collect::<Vec<_>>());
            let refetch = median(&per_call.iter().map(|p| p.2).collect::<Vec<_>>());
            let refetch = if refetch > 0.0 { format!("{refetch:.1}") } else { "–".into() };
            format!("{fetch:.1} / {apply:.1} / {refetch}")
        };
        let wal: Vec<f64> = self.samples.iter().filter_map(Sample::wal_per_item).collect();
        let ran_out = if self.samples.iter().any(|s| s.ran_out) { " (rows ran out)" } else { "" };
        [
            format!("{}{ran_out}", thousands(self.rate())),
            format!("±{:.0}%", self.spread_pct() / 2.0),
            format!("{:.2}", median(&self.ratios)),
            if db_cpu > 0.0 { format!("{cpu:.0} ({db_cpu:.0} + {:.0})", cpu - db_cpu) } else { format!("{cpu:.0}") },
            if wal.is_empty() { "–".into() } else { format!("{:.0}", median(&wal)) },
            per_call,
        ]
    }
}

impl Report {
    /// The results as Markdown: machine, tables, series.
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Measured {} on {} × {} ({:.0} GiB), Linux {}.",
            m.date_utc, m.cpus, m.cpu_model, m.memory_gib, m.kernel
        );
        if let Some(pg) = &m.postgres {
            let _ = writeln!(out, "PostgreSQL {pg}, on the same machine (loopback).");
        }
        let _ = writeln!(
            out,
            "Each point: {:.0} s window after warm-up; tables: median of {} interleaved repetitions. Load average \
             (1, 5, 15 min) before: {}; after: {}.",
            m.window_secs, m.reps, m.load_before, m.load_after
        );
        for table in &self.tables {
            let _ = writeln!(out, "\n### {}\n", table.title);
            let _ = writeln!(
                out,
                "| | items/s | ± half spread | ÷ {} | CPU µs/item (DB + client) | WAL bytes/item | rows/fetch, \
                 applies/call, refetches/call |",
                table.reference
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
            for group in &table.groups {
                let _ = writeln!(out, "| **{}** | | | | | | |", group.title);
                for line in &group.lines {
                    let [rate, spread, ratio, cpu, wal, calls] = line.cells();
                    let _ = writeln!(out, "| {} | {rate} | {spread} | {ratio} | {cpu} | {wal} | {calls} |", line.label);
                }
            }
        }
        if !self.series.is_empty() {
            let _ = writeln!(out, "\n### Throughput against workers (one replica, items/s)\n");
            let mut workers: Vec<usize> = self.series.iter().flat_map(|s| s.points.iter().map(|(w, _)| *w)).collect();
            workers.sort_unstable();
            workers.dedup();
            let header: Vec<String> = workers.iter().map(|w| w.to_string()).collect();
            let _ = writeln!(out, "| workers | {} |", header.join(" | "));
            let _ = writeln!(out, "|---|{}", "---:|".repeat(workers.len()));
            for series in &self.series {
                let cells: Vec<String> = workers
                    .iter()
                    .map(|w| {
                        series.points.iter().find(|(pw, _)| pw == w).map_or("".into(), |(_, s)| thousands(s.rate()))
                    })
                    .collect();
                let _ = writeln!(out, "| {} | {} |", series.label, cells.join(" | "));
                if let Some(ms) = series.processing_ms {
                    let model: Vec<String> = workers
                        .iter()
                        .map(|w| {
                            let Some((_, s)) = series.points.iter().find(|(pw, _)| pw == w) else { return "".into() };
                            let expected = *w as f64 * 1000.0 / ms;
                            format!("{:+.1}%", (s.rate() / expected - 1.0) * 100.0)
                        })
                        .collect();
                    let _ = writeln!(out, "| ↳ vs workers / {ms} ms | {} |", model.join(" | "));
                }
            }
            if let Some(plot) = &self.plot_file {
                let _ = writeln!(out, "\nPlot: `{plot}`.");
            }
        }
        out
    }
}
