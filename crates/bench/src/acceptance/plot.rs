//! Figures like the paper's Figures 1 and 2: acceptance rate against temperature or the
//! number of drafts, one line per method with its standard error shaded, as PNG and SVG.
//!
//! Text needs a TrueType font: `$MDSD_FONT`, else the first of a few common system paths
//! (DejaVu Sans, Liberation Sans, Arial). Without one the figures are skipped with a note.

use super::evaluate::Metric;
use super::report::Cell;
use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a font for plotters once; `Err` says why figures cannot be drawn.
pub(crate) fn font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<String> =
            std::env::var("MDSD_FONT").ok().into_iter().chain(FONT_PATHS.iter().map(|s| s.to_string())).collect();
        for path in &candidates {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| format!("{path} is not a usable TrueType font"));
            }
        }
        Err("no TrueType font found (set MDSD_FONT to a .ttf file)".into())
    })
    .clone()
}

/// One figure: x values (in `cells` order) and the lines of `metrics`.
pub struct Figure<'a> {
    pub title: String,
    pub x_label: &'a str,
    pub xs: Vec<f64>,
    pub cells: Vec<&'a Cell>,
    pub metrics: &'a [Metric],
}

pub(crate) const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, fig: &Figure<'_>) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let series: Vec<Vec<(f64, f64, f64)>> = fig
        .metrics
        .iter()
        .map(|&m| {
            fig.xs
                .iter()
                .zip(&fig.cells)
                .map(|(&x, c)| {
                    let a = c.get(m).alpha;
                    (x, a.mean * 100.0, a.se * 100.0)
                })
                .collect()
        })
        .collect();
    let lo = series.iter().flatten().map(|v| v.1 - v.2).fold(f64::INFINITY, f64::min);
    let hi = series.iter().flatten().map(|v| v.1 + v.2).fold(f64::NEG_INFINITY, f64::max);
    let pad = ((hi - lo) * 0.08).max(0.5);
    let (x0, x1) = (
        fig.xs.iter().copied().fold(f64::INFINITY, f64::min),
        fig.xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let x_pad = if x1 > x0 { 0.0 } else { 0.5 };
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((x0 - x_pad)..(x1 + x_pad), (lo - pad)..(hi + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(fig.x_label)
        .y_desc("acceptance rate (%)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (k, (&m, pts)) in fig.metrics.iter().zip(&series).enumerate() {
        let color = COLORS[k % COLORS.len()];
        // Shaded band: mean ± standard error.
        let mut band: Vec<(f64, f64)> = pts.iter().map(|&(x, y, se)| (x, y + se)).collect();
        band.extend(pts.iter().rev().map(|&(x, y, se)| (x, y - se)));
        chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.2).filled()))).map_err(err)?;
        chart
            .draw_series(LineSeries::new(pts.iter().map(|&(x, y, _)| (x, y)), color.stroke_width(2)))
            .map_err(err)?
            .label(m.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&(x, y, _)| Circle::new((x, y), 3, color.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `<stem>.png` and `<stem>.svg`; returns the paths written, or a note why none were.
pub fn write(fig: &Figure<'_>, stem: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    font()?;
    let with = |ext: &str| std::path::PathBuf::from(format!("{}.{ext}", stem.display()));
    let (png, svg) = (with("png"), with("svg"));
    let size = (900, 600);
    let run = || -> anyhow::Result<()> {
        draw(BitMapBackend::new(&png, size).into_drawing_area(), fig).with_context(|| png.display().to_string())?;
        draw(SVGBackend::new(&svg, size).into_drawing_area(), fig).with_context(|| svg.display().to_string())?;
        Ok(())
    };
    run().map_err(|e| format!("{e:#}"))?;
    Ok(vec![png, svg])
}
