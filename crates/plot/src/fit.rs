//! Candidates (settings that might fit a memory budget) against that budget.

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::canvas::{self, PALETTE, Swatch, XLabels};
use crate::{PlotError, Result, Unit};

/// One candidate setting of a `fit` search.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Shown under its bar (on up to three lines, or turned upwards and cut at 36 characters).
    pub label: String,
    /// Peak allocated bytes, measured or estimated. For an out-of-memory candidate, what was
    /// reached before it failed, or 0 when unknown (the bar then stands just over the budget).
    pub peak_bytes: u64,
    /// Within the budget: drawn green.
    pub fits: bool,
    /// Ran out of memory: drawn red and hatched, labelled "OOM at >budget".
    pub oom: bool,
    /// Training throughput when measured: written above the bar.
    pub samples_per_s: Option<f64>,
}

/// One bar per candidate, in the given order, against a dashed horizontal line at
/// `budget_bytes`.
///
/// - `fits`: green bar, its peak (and samples/s when known) above it;
/// - `oom`: red hatched bar, labelled `OOM at >{budget}`, reaching over the budget line;
/// - neither (over the budget but did not run, e.g. an estimate): orange bar.
///
/// The memory axis picks its unit from the largest of the peaks and the budget. Returns the SVG
/// text (900×500); an empty candidate list is an error.
pub fn fit_candidates(title: &str, cands: &[Candidate], budget_bytes: u64) -> Result<String> {
    if cands.is_empty() {
        return Err(PlotError::Empty("candidates"));
    }
    let budget = budget_bytes as f64;
    let height = |c: &Candidate| if c.oom && c.peak_bytes == 0 { (budget * 1.06).max(1.0) } else { c.peak_bytes as f64 };
    let max = cands.iter().map(height).fold(budget, f64::max);
    let unit = Unit::for_max(max);
    let y_max = unit.of(max.max(1.0)) * 1.18;
    let (green, red, orange) = (PALETTE[2], PALETTE[3], PALETTE[1]);
    let mut items = vec![("fits".to_string(), Swatch::Fill(green))];
    if cands.iter().any(|c| c.oom) {
        items.push(("out of memory".to_string(), Swatch::Hatched(red)));
    }
    if cands.iter().any(|c| !c.fits && !c.oom) {
        items.push(("over budget".to_string(), Swatch::Fill(orange)));
    }
    items.push((format!("budget {}", unit.fmt(budget)), Swatch::Dashed(canvas::BUDGET_RED)));
    let labels: Vec<String> = cands.iter().map(|c| c.label.clone()).collect();
    let legend_width = canvas::legend_width(&items);
    let x_labels = XLabels::plan(&labels, canvas::axis_px(legend_width), "");
    let legend = canvas::Legend { heading: "", items: &items, notes: &[] };
    let page_height = legend.page_height(canvas::page_height(x_labels.area_px), legend_width);
    canvas::svg(title, page_height, legend_width, |page, plot, legend_area| {
        let mut chart = canvas::category_chart(plot, cands.len(), y_max, &format!("peak allocated ({})", unit.name), &x_labels)?;
        let slot = canvas::slot_width(&chart);
        for (i, c) in cands.iter().enumerate() {
            let (x0, x1) = (i as f64 - canvas::BAR_HALF, i as f64 + canvas::BAR_HALF);
            let top = unit.of(height(c));
            let (cx, ty) = chart.backend_coord(&(i as f64, top));
            if c.oom {
                let a = chart.backend_coord(&(x0, 0.0));
                let b = chart.backend_coord(&(x1, top));
                canvas::hatched_rect(page, a, b, red)?;
                // Above the bar, which stands over the budget line.
                canvas::label_above(page, (cx, ty), &format!("OOM at >{}", unit.fmt(budget)), "OOM", slot, red)?;
                continue;
            }
            let color = if c.fits { green } else { orange };
            chart.draw_series(std::iter::once(Rectangle::new([(x0, 0.0), (x1, top)], color.filled())))?;
            // Peak and throughput inside the top of the bar (clear of the budget line), or
            // above a bar too short to hold them.
            let mut lines = vec![(unit.fmt(c.peak_bytes as f64), crate::fmt_number(top))];
            if let Some(sps) = c.samples_per_s {
                lines.push((format!("{} samples/s", crate::fmt_number(sps)), format!("{}/s", crate::fmt_number(sps))));
            }
            let bar_px = chart.backend_coord(&(0.0, 0.0)).1 - ty;
            let inside = bar_px as f64 >= lines.len() as f64 * 17.0 + 8.0;
            for (k, (text, short)) in lines.iter().enumerate() {
                if inside {
                    canvas::label_below(page, (cx, ty + 4 + 17 * k as i32), text, short, slot * 2.0 * canvas::BAR_HALF - 4.0, WHITE)?;
                } else {
                    let up = 17 * (lines.len() - 1 - k) as i32;
                    canvas::label_above(page, (cx, ty - up), text, short, slot, BLACK)?;
                }
            }
        }
        let y = unit.of(budget);
        chart.plotting_area().draw(&DashedPathElement::new(vec![(-0.5, y), (cands.len() as f64 - 0.5, y)], 9, 6, canvas::BUDGET_RED.stroke_width(2)))?;
        let ticks: Vec<(i32, String)> = labels.iter().enumerate().map(|(i, l)| (canvas::slot_px(&chart, i).0, l.clone())).collect();
        x_labels.draw(page, &ticks, canvas::slot_px(&chart, 0).1, canvas::centre_px(&chart))?;
        legend.draw(legend_area)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{assert_xmlish, texts};

    const GIB: u64 = 1 << 30;

    fn cand(label: &str, peak: u64, fits: bool, oom: bool, sps: Option<f64>) -> Candidate {
        Candidate { label: label.into(), peak_bytes: peak, fits, oom, samples_per_s: sps }
    }

    #[test]
    fn one_bar_per_candidate_against_the_budget() {
        let cands = vec![
            cand("bs=8 bf16", 20 * GIB, true, false, Some(412.0)),
            cand("bs=16 bf16", 35 * GIB, true, false, Some(700.5)),
            cand("bs=32 bf16", 0, false, true, None),
            cand("bs=32 bf16 ckpt", 44 * GIB, false, false, None),
        ];
        let svg = fit_candidates("fit: 40 GiB", &cands, 40 * GIB).unwrap();
        assert_xmlish(&svg);
        let t = texts(&svg);
        for want in [
            "fit: 40 GiB",
            "fits",
            "out of memory",
            "over budget",
            "budget 40 GiB",
            "OOM at >40 GiB",
            "20 GiB",
            "35 GiB",
            "412 samples/s",
            "peak allocated (GiB)",
        ] {
            assert!(t.iter().any(|x| x == want), "missing {want:?} in {t:?}");
        }
        for c in &cands {
            assert_eq!(t.iter().filter(|x| **x == c.label).count(), 1, "label {}", c.label);
        }
        let rects_of = |c: RGBColor| {
            svg.lines()
                .filter(|l| l.contains("<rect") && l.contains(&format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2)) && !l.contains("opacity=\"0.12\""))
                .count()
        };
        // Bars plus one legend swatch each.
        assert_eq!(rects_of(PALETTE[2]), 2 + 1, "green bars");
        assert_eq!(rects_of(PALETTE[1]), 1 + 1, "orange bars");
        // The budget line: dashed red segments across the chart.
        assert!(svg.lines().filter(|l| l.contains("#C80000")).count() > 5);
    }

    #[test]
    fn an_all_fitting_list_has_no_oom_legend_and_empty_is_an_error() {
        let svg = fit_candidates("t", &[cand("a", 1 << 20, true, false, None)], 2 << 20).unwrap();
        assert_xmlish(&svg);
        assert!(!texts(&svg).iter().any(|x| x == "out of memory"));
        assert!(matches!(fit_candidates("t", &[], 1), Err(PlotError::Empty(_))));
    }
}
