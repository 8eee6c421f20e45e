//! The PNG of throughput against workers: one line per measured series, the model (workers / processing time) as
//! dashed lines, log scales on both axes.
//!
//! Text is drawn by plotters' pure-Rust `ab_glyph` backend from a TrueType font read at run time (DejaVu Sans,
//! Debian's `fonts-dejavu-core`, on every machine of this project's kind); without one the plot is still drawn,
//! with no text.

use crate::report::Series;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::Path;

/// Where a TrueType sans-serif font is looked for, first found wins.
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

const SIZE: (u32, u32) = (1100, 700);

/// Registers the first font of [`FONT_PATHS`] as plotters' "sans-serif"; false when none is found.
fn register_sans() -> bool {
    let Some(bytes) = FONT_PATHS.iter().find_map(|path| std::fs::read(path).ok()) else { return false };
    // plotters keeps fonts for the process's life; one leak per run.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}

/// Draws `series` to `path` (PNG).
pub fn draw(series: &[Series], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let text = register_sans();
    if !text {
        eprintln!("no TrueType font found at {FONT_PATHS:?}: the plot has no text");
    }
    let points = series.iter().flat_map(|s| s.points.iter());
    let workers_max = points.clone().map(|(w, _)| *w).max().unwrap_or(64).max(2) as f64;
    let rate_max = points.clone().map(|(_, s)| s.rate()).fold(1.0, f64::max);
    let rate_min = points.map(|(_, s)| s.rate()).fold(f64::MAX, f64::min).max(1.0);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption("lockstep: throughput against workers (one replica)", ("sans-serif", 26))
            .x_label_area_size(50)
            .y_label_area_size(90);
    }
    let mut chart = builder
        .build_cartesian_2d((1.0f64..workers_max * 1.1).log_scale(), (rate_min / 2.0..rate_max * 3.0).log_scale())?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("workers")
            .y_desc("items per second")
            .label_style(("sans-serif", 16))
            .x_labels(8)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"));
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    let colors: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        BLACK,
    ];
    let mut models_drawn: Vec<f64> = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let data: Vec<(f64, f64)> = s.points.iter().map(|(w, sample)| (*w as f64, sample.rate())).collect();
        let drawn = chart.draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?;
        if text {
            drawn
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart.draw_series(data.iter().map(|point| Circle::new(*point, 4, color.filled())))?;
        if let Some(ms) = s.processing_ms.filter(|ms| !models_drawn.contains(ms)) {
            models_drawn.push(ms);
            let color = BLACK;
            let model: Vec<(f64, f64)> = data.iter().map(|(w, _)| (*w, w * 1000.0 / ms)).collect();
            let dashed = DashedLineSeries::new(model, 6, 4, color.mix(0.6).stroke_width(1));
            let drawn = chart.draw_series(dashed)?;
            if text {
                drawn
                    .label(format!("model: workers / {ms} ms"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.6).stroke_width(1)));
            }
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
