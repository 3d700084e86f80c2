//! The charts of BENCHMARKS.md, drawn as SVG with plotters (no system fonts needed: the SVG
//! viewer renders the text).

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// One line of a chart: its legend and its points.
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) points: Vec<(f64, f64)>,
}

const SIZE: (u32, u32) = (900, 560);

fn color(index: usize) -> RGBColor {
    // Distinct, print-friendly colours (Okabe–Ito), then the palette.
    const COLORS: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 0, 0),
        RGBColor(240, 228, 66),
    ];
    COLORS.get(index).copied().unwrap_or_else(|| {
        let c = Palette99::pick(index).to_rgba();
        RGBColor(c.0, c.1, c.2)
    })
}

/// A line chart with a logarithmic x axis (and y axis when `log_y`).
pub(crate) fn lines(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    log_y: bool,
    series: &[Series],
) -> anyhow::Result<()> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if x_min > x_max {
        return Err(anyhow!("no points for chart {title}"));
    }
    let x_range = (x_min * 0.8).max(1e-3)..x_max * 1.25;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(78);
    // The two y axes give charts of different types: the drawing is written once for both.
    macro_rules! draw_lines {
        ($chart:expr, $legend_at:expr) => {{
            let mut chart = $chart.map_err(|e| anyhow!("{e}"))?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
            for (i, s) in series.iter().enumerate() {
                let c = color(i);
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                    .map_err(|e| anyhow!("{e}"))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position($legend_at)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow!("{e}"))?;
        }};
    }
    if log_y {
        let y_range = (y_min * 0.8).max(1e-3)..y_max * 1.25;
        draw_lines!(
            builder.build_cartesian_2d(x_range.log_scale(), y_range.log_scale()),
            SeriesLabelPosition::UpperLeft
        );
    } else {
        draw_lines!(
            builder.build_cartesian_2d(x_range.log_scale(), 0f64..1f64),
            SeriesLabelPosition::LowerRight
        );
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
