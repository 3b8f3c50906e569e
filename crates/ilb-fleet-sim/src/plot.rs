//! SVG plots (plotters' SVG backend, no system fonts: text is emitted as SVG `<text>`), returned
//! as `(file name, svg)` pairs so the binary decides where they go:
//! - `latency.svg`: mean end-to-end latency over time, one line per policy (log scale);
//! - `load-POLICY.svg`: requests in flight per engine over time;
//! - `weights-heatmap-POLICY.svg`: the last weight matrix (streams × engines) of `feedback` and `ilb`;
//! - `weights-over-time.svg`: each engine's share of traffic over time, `feedback` above `ilb`.

use crate::{Comparison, SimError};
use plotters::prelude::*;

/// At most this many engines get a line (evenly spread over the fleet).
const MAX_LINES: usize = 40;

fn plot_err(e: impl std::fmt::Display) -> SimError {
    SimError::Plot(e.to_string())
}

fn pick_engines(n: usize) -> Vec<usize> {
    if n <= MAX_LINES {
        (0..n).collect()
    } else {
        (0..MAX_LINES).map(|i| i * n / MAX_LINES).collect()
    }
}

/// Every plot of a comparison.
pub fn all(c: &Comparison) -> Result<Vec<(String, String)>, SimError> {
    let mut out = vec![("latency.svg".to_owned(), latency(c)?)];
    for name in &c.order {
        out.push((format!("load-{name}.svg"), load(c, name)?));
    }
    for name in ["feedback", "ilb"] {
        if c.policies.contains_key(name) {
            out.push((format!("weights-heatmap-{name}.svg"), heatmap(c, name)?));
        }
    }
    out.push(("weights-over-time.svg".to_owned(), weights_over_time(c)?));
    Ok(out)
}

fn latency(c: &Comparison) -> Result<String, SimError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (mut lo, mut hi) = (f64::INFINITY, 1.0f64);
        for r in c.policies.values() {
            for &v in r.series.e2e_ms.iter().filter(|v| v.is_finite() && **v > 0.0) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        let lo = if lo.is_finite() { lo * 0.8 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: mean end-to-end latency (ms)", c.scenario), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..c.duration_s, (lo..hi * 1.2).log_scale())
            .map_err(plot_err)?;
        chart.configure_mesh().x_desc("simulated seconds").draw().map_err(plot_err)?;
        for (i, name) in c.order.iter().enumerate() {
            let Some(r) = c.policies.get(name) else { continue };
            let color = Palette99::pick(i).to_rgba();
            let points =
                r.series.t_s.iter().zip(&r.series.e2e_ms).filter(|(_, v)| v.is_finite() && **v > 0.0);
            chart
                .draw_series(LineSeries::new(points.map(|(&t, &v)| (t, v)), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn load(c: &Comparison, name: &str) -> Result<String, SimError> {
    let r = &c.policies[name];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 450)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let n = r.series.in_flight.first().map_or(0, Vec::len);
        let hi = r.series.in_flight.iter().flatten().fold(1f32, |a, &b| a.max(b)) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: requests in flight per engine, {name}", c.scenario), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..c.duration_s, 0f64..hi * 1.05)
            .map_err(plot_err)?;
        chart.configure_mesh().x_desc("simulated seconds").draw().map_err(plot_err)?;
        for (k, j) in pick_engines(n).into_iter().enumerate() {
            let color = Palette99::pick(k).mix(0.8);
            let points = r.series.t_s.iter().zip(&r.series.in_flight).map(|(&t, row)| (t, f64::from(row[j])));
            chart.draw_series(LineSeries::new(points, color.stroke_width(1))).map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn heatmap(c: &Comparison, name: &str) -> Result<String, SimError> {
    let r = &c.policies[name];
    let n_engines = r.series.in_flight.first().map_or(1, Vec::len).max(1);
    let n_streams = (r.series.final_weights.len() / n_engines).max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 120 + 18 * n_streams as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{}: weights (rows: streams, columns: engines), {name}", c.scenario),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..n_engines as f64, 0f64..n_streams as f64)
            .map_err(plot_err)?;
        chart.configure_mesh().disable_mesh().x_desc("engine").y_desc("stream").draw().map_err(plot_err)?;
        let cells = r.series.final_weights.iter().enumerate().filter(|(_, &w)| w > 0.0).map(|(i, &w)| {
            let (s, j) = ((i / n_engines) as f64, (i % n_engines) as f64);
            let level = w.sqrt().clamp(0.0, 1.0);
            let color = RGBColor(255, (255.0 * (1.0 - level)) as u8, (255.0 * (1.0 - level)) as u8);
            Rectangle::new([(j, s), (j + 1.0, s + 1.0)], color.filled())
        });
        chart.draw_series(cells).map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn weights_over_time(c: &Comparison) -> Result<String, SimError> {
    let names: Vec<&str> = ["feedback", "ilb"].into_iter().filter(|n| c.policies.contains_key(*n)).collect();
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (900, 300 * names.len().max(1) as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((names.len().max(1), 1));
        for (panel, name) in panels.iter().zip(&names) {
            let r = &c.policies[*name];
            let n = r.series.share.first().map_or(0, Vec::len);
            let hi = r.series.share.iter().flatten().fold(1e-6f32, |a, &b| a.max(b)) as f64;
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("{name}: each engine's share of traffic"), ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(30)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..c.duration_s, 0f64..hi * 1.05)
                .map_err(plot_err)?;
            chart.configure_mesh().x_desc("simulated seconds").draw().map_err(plot_err)?;
            for (k, j) in pick_engines(n).into_iter().enumerate() {
                let color = Palette99::pick(k).mix(0.8);
                let points = r.series.t_s.iter().zip(&r.series.share).map(|(&t, row)| (t, f64::from(row[j])));
                chart.draw_series(LineSeries::new(points, color.stroke_width(1))).map_err(plot_err)?;
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
