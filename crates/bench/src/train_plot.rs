//! `bench train-plot`: the curves of an EAGLE training run (`mdsd train-eagle`'s
//! `train_log.jsonl`) as PNG and SVG: the loss per step with the validation loss per epoch, and
//! the top-1 accuracy per epoch on the validation split and the held-out evaluation answers.

use crate::acceptance::plot::{font, COLORS};
use anyhow::{bail, Context};
use clap::Args;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct TrainPlotArgs {
    /// The run's log (`OUT/train_log.jsonl`).
    log: PathBuf,
    /// Stem of the figures (`STEM.png`, `STEM.svg`); default: the log's, beside it.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The curves read from a log: `(step, loss)` per step; per epoch `(step, loss, top-1)` of the
/// validation split and of the evaluation answers (top-1 over the target's whole vocabulary).
#[derive(Debug, Default, PartialEq)]
pub struct Curves {
    pub train: Vec<(f64, f64)>,
    pub validation: Vec<(f64, f64, f64)>,
    pub eval: Vec<(f64, f64, f64)>,
}

pub fn read(log: &Path) -> anyhow::Result<Curves> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut c = Curves::default();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: line {} is not JSON", log.display(), i + 1))?;
        let num = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
        let step = num(&v["step"]);
        let s = &v["scores"];
        match v["event"].as_str() {
            Some("step") => c.train.push((step, num(&s["loss"]))),
            Some("eval") if v["split"] == "validation" => {
                c.validation.push((step, num(&s["loss"]), num(&s["acc_full"])))
            }
            Some("eval") => c.eval.push((step, num(&s["loss"]), num(&s["acc_full"]))),
            _ => {}
        }
    }
    if c.train.is_empty() {
        bail!("{}: no training steps logged", log.display());
    }
    Ok(c)
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Curves) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
    let last = c.train.last().map_or(1.0, |p| p.0).max(1.0);
    let finite = |v: &[f64]| v.iter().copied().filter(|x| x.is_finite()).collect::<Vec<f64>>();
    let losses = finite(&c.train.iter().map(|p| p.1).chain(c.validation.iter().map(|p| p.1)).collect::<Vec<_>>());
    let hi = losses.iter().copied().fold(0.0f64, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&left)
        .caption("loss", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..last, 0.0..hi.max(1e-3))
        .map_err(err)?;
    chart.configure_mesh().x_desc("step").label_style(("sans-serif", 13)).draw().map_err(err)?;
    let series = [
        ("training (per step)", &c.train.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>()),
        ("validation (per epoch)", &c.validation.iter().map(|p| (p.0, p.1)).collect()),
    ];
    for (k, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[k];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(err)?;
    let mut chart = ChartBuilder::on(&right)
        .caption("top-1 accuracy (whole vocabulary)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..last, 0.0..1.0)
        .map_err(err)?;
    chart.configure_mesh().x_desc("step").label_style(("sans-serif", 13)).draw().map_err(err)?;
    for (k, (label, pts)) in
        [("validation", &c.validation), ("evaluation (MT-Bench answers)", &c.eval)].iter().enumerate()
    {
        let color = COLORS[k + 2];
        let pts: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.2)).filter(|p| p.1.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

pub fn run(args: &TrainPlotArgs) -> anyhow::Result<()> {
    let curves = read(&args.log)?;
    let stem = args.out.clone().unwrap_or_else(|| args.log.with_extension(""));
    font().map_err(|e| anyhow::anyhow!("cannot draw the figures: {e}"))?;
    let size = (1200, 480);
    for ext in ["png", "svg"] {
        let path = PathBuf::from(format!("{}.{ext}", stem.display()));
        let area_result = if ext == "png" {
            draw(BitMapBackend::new(&path, size).into_drawing_area(), &curves)
        } else {
            draw(SVGBackend::new(&path, size).into_drawing_area(), &curves)
        };
        area_result.with_context(|| path.display().to_string())?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps, validation and evaluation lines become the three curves; other events are
    /// skipped; a log without steps is an error naming it.
    #[test]
    fn a_log_reads_into_curves() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("train_log.jsonl");
        std::fs::write(
            &log,
            concat!(
                "{\"event\":\"step\",\"step\":1,\"scores\":{\"loss\":3.0}}\n",
                "{\"event\":\"checkpoint\",\"step\":1}\n",
                "{\"event\":\"eval\",\"step\":1,\"split\":\"validation\",\"scores\":{\"loss\":2.5,\"acc_full\":0.25}}\n",
                "{\"event\":\"eval\",\"step\":1,\"split\":\"eval\",\"scores\":{\"loss\":2.7,\"acc_full\":0.2}}\n",
            ),
        )
        .unwrap();
        let c = read(&log).unwrap();
        assert_eq!(c.train, [(1.0, 3.0)]);
        assert_eq!(c.validation, [(1.0, 2.5, 0.25)]);
        assert_eq!(c.eval, [(1.0, 2.7, 0.2)]);
        std::fs::write(&log, "{\"event\":\"checkpoint\",\"step\":1}\n").unwrap();
        assert!(read(&log).unwrap_err().to_string().contains("train_log.jsonl"));
    }
}
