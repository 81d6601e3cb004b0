//! A sweep's peak memory against batch size, one line per setting of the other axes.

use plotters::prelude::*;

use crate::canvas::{self, LABEL_PX, MARGIN, PALETTE, Swatch, XLabels, Y_LABEL_AREA};
use crate::{PlotError, Result, Unit};

/// Peak bytes against `x` (batch size, or a point index), one line with markers per series
/// `(label, [(x, bytes)])`, and `budget` as a dashed red line when given.
///
/// `x_label` names the x axis, `legend_title` (when not empty) heads the legend, e.g. the axes
/// whose values the series labels list. Past 10 series the colours repeat with dashed lines. When every x is positive and they span a factor of 8 or more
/// (1, 2, 4, … 64) the axis is logarithmic, so small batches do not crowd together; ticks sit
/// at the x values present in the data either way.
pub fn sweep_peak_vs_batch(title: &str, x_label: &str, legend_title: &str, series: &[(String, Vec<(f64, f64)>)], budget: Option<u64>) -> Result<String> {
    let xs: Vec<f64> = series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return Err(PlotError::Empty("points"));
    }
    let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let log = lo > 0.0 && hi / lo >= 8.0;
    let pos = |x: f64| if log { x.log2() } else { x };
    let (plo, phi) = (pos(lo), pos(hi));
    let pad = if phi > plo { (phi - plo) * 0.06 } else { 0.5 };
    let max_y = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y)).chain(budget.map(|b| b as f64)).fold(0.0, f64::max);
    let unit = Unit::for_max(max_y);
    let y_max = unit.of(max_y.max(1.0)) * 1.12;

    let mut items: Vec<(String, Swatch)> = series.iter().enumerate().map(|(i, (l, _))| (l.clone(), series_style(i))).collect();
    if let Some(b) = budget {
        items.push((format!("budget {}", unit.fmt(b as f64)), Swatch::Dashed(canvas::BUDGET_RED)));
    }
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let tick_labels: Vec<String> = ticks.iter().map(|x| crate::fmt_number(*x)).collect();
    let x_desc = if log { format!("{x_label} (log scale)") } else { x_label.to_string() };
    let legend = canvas::Legend { heading: legend_title, items: &items, notes: &[] };
    let legend_width = canvas::legend_width(&items);
    // Ticks are placed by value, not evenly: plan as if each had an even share.
    let x_labels = XLabels::plan(&tick_labels, canvas::axis_px(legend_width), &x_desc);
    let height = legend.page_height(canvas::page_height(x_labels.area_px), legend_width);
    canvas::svg(title, height, legend_width, |page, plot, legend_area| {
        let mut chart = ChartBuilder::on(plot)
            .margin(MARGIN)
            .x_label_area_size(x_labels.area_px)
            .y_label_area_size(Y_LABEL_AREA)
            .build_cartesian_2d(plo - pad..phi + pad, 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(8)
            .y_desc(format!("peak allocated ({})", unit.name))
            .y_label_formatter(&|v| crate::fmt_number(*v))
            .label_style(canvas::font(LABEL_PX, BLACK))
            .axis_desc_style(canvas::font(LABEL_PX + 1.0, BLACK))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()?;
        for (i, (_, points)) in series.iter().enumerate() {
            let (color, dashed) = match series_style(i) {
                Swatch::Dashed(c) => (c, true),
                Swatch::Line(c, _) => (c, false),
                _ => (BLACK, false),
            };
            let mut pts: Vec<(f64, f64)> = points.iter().filter(|(x, y)| x.is_finite() && y.is_finite()).map(|&(x, y)| (pos(x), unit.of(y))).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if dashed {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, color.stroke_width(2)))?;
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
            }
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        if let Some(b) = budget {
            let y = unit.of(b as f64);
            chart.draw_series(DashedLineSeries::new(vec![(plo - pad, y), (phi + pad, y)], 9, 6, canvas::BUDGET_RED.stroke_width(2)))?;
        }
        let axis_y = chart.backend_coord(&(plo, 0.0)).1;
        let ticks_px: Vec<(i32, String)> = ticks.iter().zip(&tick_labels).map(|(x, l)| (chart.backend_coord(&(pos(*x), 0.0)).0, l.clone())).collect();
        x_labels.draw(page, &ticks_px, axis_y, canvas::centre_px(&chart))?;
        legend.draw(legend_area)
    })
}

/// Series `i`'s line: the palette's colours solid, then again dashed.
fn series_style(i: usize) -> Swatch {
    let color = PALETTE[i % PALETTE.len()];
    if (i / PALETTE.len()).is_multiple_of(2) { Swatch::Line(color, 2) } else { Swatch::Dashed(color) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{assert_xmlish, texts};

    const MIB: f64 = 1048576.0;

    fn series() -> Vec<(String, Vec<(f64, f64)>)> {
        vec![
            ("precision=f32".into(), vec![(1.0, 100.0 * MIB), (2.0, 180.0 * MIB), (4.0, 340.0 * MIB), (8.0, 660.0 * MIB)]),
            ("precision=bf16".into(), vec![(1.0, 60.0 * MIB), (2.0, 100.0 * MIB), (4.0, 180.0 * MIB), (8.0, 340.0 * MIB)]),
        ]
    }

    #[test]
    fn one_line_per_series_with_legend_and_ticks_at_the_data() {
        let svg = sweep_peak_vs_batch("sweep", "batch_size", "", &series(), None).unwrap();
        assert_xmlish(&svg);
        let t = texts(&svg);
        for want in ["sweep", "precision=f32", "precision=bf16", "batch_size (log scale)", "peak allocated (MiB)", "1", "2", "4", "8"] {
            assert!(t.iter().any(|x| x == want), "missing {want:?} in {t:?}");
        }
        assert_eq!(svg.matches("<circle").count(), 8);
        assert!(!t.iter().any(|x| x.starts_with("budget")));
    }

    #[test]
    fn the_budget_is_a_line_with_its_value() {
        let svg = sweep_peak_vs_batch("sweep", "batch_size", "precision", &series(), Some(512 << 20)).unwrap();
        assert_xmlish(&svg);
        assert!(texts(&svg).iter().any(|x| x == "budget 512 MiB"));
        assert!(svg.contains("#C80000"), "no budget-red stroke");
    }

    #[test]
    fn many_series_grow_the_page_and_dash_the_repeated_colours() {
        let many: Vec<(String, Vec<(f64, f64)>)> =
            (0..18).map(|i| (format!("off, ultra_lightweight, f32 #{i}"), vec![(1.0, (i + 1) as f64 * MIB), (2.0, (i + 2) as f64 * MIB)])).collect();
        let svg = sweep_peak_vs_batch("sweep", "batch_size", "gradient_checkpointing, preset, precision", &many, None).unwrap();
        assert_xmlish(&svg);
        let height: u32 = svg.split("height=\"").nth(1).and_then(|h| h.split('"').next()).and_then(|h| h.parse().ok()).unwrap();
        assert!(height > canvas::HEIGHT, "18 legend rows need a taller page, got {height}");
        let t = texts(&svg);
        assert!(t.iter().any(|x| x.starts_with("gradient_checkpointing")));
        assert_eq!(t.iter().filter(|x| x.starts_with("off, ultra_lightweight")).count(), 18);
    }

    #[test]
    fn a_narrow_range_stays_linear_and_empty_is_an_error() {
        let s = vec![("a".to_string(), vec![(2.0, MIB), (3.0, 2.0 * MIB)])];
        let t = texts(&sweep_peak_vs_batch("t", "point", "", &s, None).unwrap());
        assert!(t.iter().any(|x| x == "point"));
        assert!(matches!(sweep_peak_vs_batch("t", "x", "", &[], None), Err(PlotError::Empty(_))));
    }
}
