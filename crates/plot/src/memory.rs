//! A run's memory: peaks per phase over the steps, and what each peak is made of.

use plotters::prelude::*;

use crate::canvas::{self, LABEL_PX, MARGIN, PALETTE, Swatch, XLabels, Y_LABEL_AREA};
use crate::{PlotError, Result, Unit};

/// One optimizer step's memory, in bytes (the trainer's `StepRecord` fields of the same names).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepMemory {
    pub step: u64,
    /// Highest allocated bytes during the forward pass.
    pub peak_forward: u64,
    pub peak_backward: u64,
    pub peak_optimizer: u64,
    /// Highest allocated bytes over the whole step.
    pub peak_step: u64,
    /// Highest reserved bytes (allocator pools, or process RSS on CPU).
    pub peak_reserved: u64,
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub activations: u64,
}

impl StepMemory {
    /// The step's peak split into its parts.
    pub fn breakdown(&self) -> Breakdown {
        Breakdown {
            parameters: self.parameters,
            gradients: self.gradients,
            optimizer_state: self.optimizer_state,
            activations: self.activations,
            peak: self.peak_step,
        }
    }
}

/// What a peak is made of, in bytes.
///
/// The parts need not all be alive at the peak (activations are freed while gradients are
/// made), so they can add up to more than `peak`; [`Breakdown::other`] is what the peak holds
/// beyond them (inputs, workspace, fragmentation), zero in that case.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub activations: u64,
    /// Peak allocated bytes.
    pub peak: u64,
}

impl Breakdown {
    fn parts_sum(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer_state + self.activations
    }

    /// Peak bytes not accounted for by the four parts.
    pub fn other(&self) -> u64 {
        self.peak.saturating_sub(self.parts_sum())
    }

    /// The parts bottom to top, with their legend names and colours.
    fn stack(&self) -> [(&'static str, u64, RGBColor); 5] {
        [
            ("parameters", self.parameters, PALETTE[0]),
            ("gradients", self.gradients, PALETTE[1]),
            ("optimizer state", self.optimizer_state, PALETTE[2]),
            ("activations", self.activations, PALETTE[3]),
            ("other (peak − parts)", self.other(), canvas::LIGHT_GREY),
        ]
    }
}

/// Lines of peak allocated bytes per phase (forward, backward, optimizer, whole step) and of
/// peak reserved bytes, against the step number; memory axis in the unit that suits the data.
pub fn memory_per_step(title: &str, steps: &[StepMemory]) -> Result<String> {
    if steps.is_empty() {
        return Err(PlotError::Empty("steps"));
    }
    type Series = (&'static str, fn(&StepMemory) -> u64, Swatch);
    let series: [Series; 5] = [
        ("peak reserved", |s| s.peak_reserved, Swatch::Dashed(canvas::GREY)),
        ("peak allocated, step", |s| s.peak_step, Swatch::Line(BLACK, 5)),
        ("peak allocated, forward", |s| s.peak_forward, Swatch::Line(PALETTE[0], 2)),
        ("peak allocated, backward", |s| s.peak_backward, Swatch::Line(PALETTE[1], 2)),
        ("peak allocated, optimizer", |s| s.peak_optimizer, Swatch::Line(PALETTE[2], 2)),
    ];
    let max = steps.iter().flat_map(|s| series.iter().map(move |(_, f, _)| f(s))).max().unwrap_or(0) as f64;
    let unit = Unit::for_max(max);
    let y_max = unit.of(max.max(1.0)) * 1.1;
    let first = steps.iter().map(|s| s.step).min().unwrap_or(0) as i64;
    let last = steps.iter().map(|s| s.step).max().unwrap_or(0) as i64;
    // A step of room either side, so the first and last markers are not cut by the axes.
    let x_range = first - 1..last + 1;
    let items: Vec<(String, Swatch)> = series.iter().map(|(name, _, sw)| (name.to_string(), *sw)).collect();
    let notes = ["Step 1 includes one-time allocations.", "Peak allocated (step) is the highest of the phases."];
    let legend = canvas::Legend { heading: "", items: &items, notes: &notes };
    let legend_width = canvas::legend_width(&items);
    canvas::svg(title, legend.page_height(canvas::HEIGHT, legend_width), legend_width, |_, plot, legend_area| {
        let mut chart = ChartBuilder::on(plot)
            .margin(MARGIN)
            .x_label_area_size((LABEL_PX * 3.6) as u32)
            .y_label_area_size(Y_LABEL_AREA)
            .build_cartesian_2d(x_range.clone(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc(format!("memory ({})", unit.name))
            .x_labels(10)
            .y_labels(8)
            .y_label_formatter(&|v| crate::fmt_number(*v))
            .label_style(canvas::font(LABEL_PX, BLACK))
            .axis_desc_style(canvas::font(LABEL_PX + 1.0, BLACK))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()?;
        let markers = steps.len() <= 40;
        for (_, f, swatch) in &series {
            let pts: Vec<(i64, f64)> = steps.iter().map(|s| (s.step as i64, unit.of(f(s) as f64))).collect();
            let (color, style) = match *swatch {
                Swatch::Line(c, w) => (c, c.stroke_width(w)),
                Swatch::Dashed(c) => (c, c.stroke_width(2)),
                _ => (BLACK, BLACK.stroke_width(2)),
            };
            match swatch {
                Swatch::Dashed(_) => {
                    chart.draw_series(DashedLineSeries::new(pts.clone(), 7, 5, style))?;
                }
                _ => {
                    chart.draw_series(LineSeries::new(pts.clone(), style))?;
                }
            }
            if markers {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
        }
        legend.draw(legend_area)
    })
}

/// One stacked bar per step (at most 40, evenly picked, first and last kept): parameters,
/// gradients, optimizer state, activations and the rest of the step's peak, with the peak
/// marked on each bar.
pub fn stacked_breakdown(title: &str, steps: &[StepMemory]) -> Result<String> {
    const MAX_BARS: usize = 40;
    let n = steps.len();
    let picked: Vec<&StepMemory> = if n <= MAX_BARS {
        steps.iter().collect()
    } else {
        let mut idx: Vec<usize> = (0..MAX_BARS).map(|i| i * (n - 1) / (MAX_BARS - 1)).collect();
        idx.dedup();
        idx.into_iter().map(|i| &steps[i]).collect()
    };
    let points: Vec<(String, Breakdown)> = picked.iter().map(|s| (s.step.to_string(), s.breakdown())).collect();
    let x_desc = if picked.len() < n { format!("step ({} of {n} shown)", picked.len()) } else { "step".to_string() };
    bars(title, &x_desc, &points)
}

/// One stacked bar per labelled point (e.g. a sweep's settings): parameters, gradients,
/// optimizer state, activations and the rest of the peak, with the peak marked on each bar.
/// Labels break at `\n` onto up to three lines when that fits, else are turned upwards (the
/// breaks as ", ") and cut at 36 characters; `x_desc` names them under the axis (none when
/// empty).
pub fn stacked_bars(title: &str, x_desc: &str, points: &[(String, Breakdown)]) -> Result<String> {
    bars(title, x_desc, points)
}

fn bars(title: &str, x_desc: &str, points: &[(String, Breakdown)]) -> Result<String> {
    if points.is_empty() {
        return Err(PlotError::Empty("points"));
    }
    let tops: Vec<u64> = points.iter().map(|(_, b)| b.parts_sum().max(b.peak)).collect();
    let max = tops.iter().copied().max().unwrap_or(0) as f64;
    let unit = Unit::for_max(max);
    let y_max = unit.of(max.max(1.0)) * 1.12;
    let mut items: Vec<(String, Swatch)> = Breakdown::default().stack().iter().rev().map(|(name, _, c)| (name.to_string(), Swatch::Fill(*c))).collect();
    items.push(("peak allocated".to_string(), Swatch::PeakTick));
    let overshoot = points.iter().any(|(_, b)| b.parts_sum() > b.peak);
    let mut notes = vec![];
    if overshoot {
        notes.push("Parts above the peak mark are not all alive at the peak (activations are freed while gradients are made).");
    }
    let labels: Vec<String> = points.iter().map(|(l, _)| l.clone()).collect();
    let legend_width = canvas::legend_width(&items);
    let x_labels = XLabels::plan(&labels, canvas::axis_px(legend_width), x_desc);
    let legend = canvas::Legend { heading: "", items: &items, notes: &notes };
    let height = legend.page_height(canvas::page_height(x_labels.area_px), legend_width);
    canvas::svg(title, height, legend_width, |page, plot, legend_area| {
        let mut chart = canvas::category_chart(plot, points.len(), y_max, &format!("memory ({})", unit.name), &x_labels)?;
        // Peak values above the bars: all in full, all as bare numbers, or none, so that no
        // bar looks special for having a short enough number.
        let room = canvas::slot_width(&chart) - 2.0;
        let px = LABEL_PX - 1.0;
        let full: Vec<String> = points.iter().map(|(_, b)| unit.fmt(b.peak as f64)).collect();
        let bare: Vec<String> = points.iter().map(|(_, b)| crate::fmt_number(unit.of(b.peak as f64))).collect();
        let fits = |v: &[String]| v.iter().all(|t| canvas::text_width(t, px) <= room);
        let values = if fits(&full) {
            Some(full)
        } else if fits(&bare) {
            Some(bare)
        } else {
            None
        };
        for (i, (_, b)) in points.iter().enumerate() {
            let (x0, x1) = (i as f64 - canvas::BAR_HALF, i as f64 + canvas::BAR_HALF);
            let mut bottom = 0.0;
            for (_, bytes, color) in b.stack() {
                let top = bottom + unit.of(bytes as f64);
                if bytes > 0 {
                    chart.draw_series(std::iter::once(Rectangle::new([(x0, bottom), (x1, top)], color.filled())))?;
                }
                bottom = top;
            }
            let peak = unit.of(b.peak as f64);
            let (px0, py) = chart.backend_coord(&(x0 - 0.06, peak));
            let (px1, _) = chart.backend_coord(&(x1 + 0.06, peak));
            page.draw(&PathElement::new(vec![(px0, py), (px1, py)], BLACK.stroke_width(3)))?;
            let top = bottom.max(peak);
            let (cx, ty) = chart.backend_coord(&(i as f64, top));
            // A failed point (no peak) gets no number.
            if let Some(v) = &values
                && b.peak > 0
            {
                canvas::label_above(page, (cx, ty), &v[i], "", f64::INFINITY, BLACK)?;
            }
        }
        let ticks: Vec<(i32, String)> = labels.iter().enumerate().map(|(i, l)| (canvas::slot_px(&chart, i).0, l.clone())).collect();
        x_labels.draw(page, &ticks, canvas::slot_px(&chart, 0).1, canvas::centre_px(&chart))?;
        legend.draw(legend_area)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{assert_xmlish, texts};

    const MIB: u64 = 1 << 20;

    fn step(step: u64, act: u64) -> StepMemory {
        StepMemory {
            step,
            peak_forward: (40 + act) * MIB,
            peak_backward: (60 + act) * MIB,
            peak_optimizer: 50 * MIB,
            peak_step: (60 + act) * MIB,
            peak_reserved: (90 + act) * MIB,
            parameters: 10 * MIB,
            gradients: 10 * MIB,
            optimizer_state: 20 * MIB,
            activations: act * MIB,
        }
    }

    #[test]
    fn memory_per_step_has_title_axes_and_every_series() {
        let steps: Vec<StepMemory> = (1..=6).map(|s| step(s, 100)).collect();
        let svg = memory_per_step("run: vae3d & friends", &steps).unwrap();
        assert_xmlish(&svg);
        let t = texts(&svg);
        for want in [
            "run: vae3d & friends",
            "memory (MiB)",
            "step",
            "peak reserved",
            "peak allocated, step",
            "peak allocated, forward",
            "peak allocated, backward",
            "peak allocated, optimizer",
        ] {
            assert!(t.iter().any(|x| x == want), "missing text {want:?} in {t:?}");
        }
        // One line per series; the reserved one dashed (many segments).
        assert!(svg.matches("<polyline").count() >= 5);
        // Markers: six steps × five series.
        assert_eq!(svg.matches("<circle").count(), 30);
    }

    #[test]
    fn the_unit_follows_the_data() {
        let mut s = step(1, 0);
        s.peak_reserved = 3 << 30;
        let svg = memory_per_step("t", &[s]).unwrap();
        assert!(texts(&svg).iter().any(|x| x == "memory (GiB)"));
        let tiny = StepMemory { step: 1, peak_step: 3000, peak_reserved: 3000, ..Default::default() };
        assert!(texts(&memory_per_step("t", &[tiny]).unwrap()).iter().any(|x| x == "memory (KiB)"));
    }

    #[test]
    fn empty_input_is_an_error() {
        assert!(matches!(memory_per_step("t", &[]), Err(PlotError::Empty(_))));
        assert!(matches!(stacked_bars("t", "", &[]), Err(PlotError::Empty(_))));
    }

    #[test]
    fn other_is_the_peak_beyond_the_parts() {
        let b = Breakdown { parameters: 1, gradients: 2, optimizer_state: 3, activations: 4, peak: 15 };
        assert_eq!(b.other(), 5);
        assert_eq!(Breakdown { peak: 5, ..b }.other(), 0);
    }

    #[test]
    fn stacked_bars_draw_every_part_of_every_point() {
        let points: Vec<(String, Breakdown)> = (0..4)
            .map(|i| {
                (
                    format!("batch_size={} precision=bf16 gradient_checkpointing=blocks", 1 << i),
                    Breakdown { parameters: MIB, gradients: MIB, optimizer_state: 2 * MIB, activations: (i + 1) * 8 * MIB, peak: (i + 1) * 8 * MIB + 6 * MIB },
                )
            })
            .collect();
        let svg = stacked_bars("sweep", "", &points).unwrap();
        assert_xmlish(&svg);
        let t = texts(&svg);
        for want in ["parameters", "gradients", "optimizer state", "activations", "other (peak − parts)", "peak allocated", "memory (MiB)"] {
            assert!(t.iter().any(|x| x == want), "missing legend {want:?}");
        }
        // Each part's colour: one legend swatch + one block per point.
        for c in [PALETTE[0], PALETTE[2], PALETTE[3], canvas::LIGHT_GREY] {
            let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            assert_eq!(svg.lines().filter(|l| l.contains("<rect") && l.contains(&fill)).count(), 1 + points.len(), "{fill}");
        }
        // Long labels are cut, not dropped.
        assert_eq!(t.iter().filter(|x| x.starts_with("batch_size=") && x.ends_with('…')).count(), 4);
        // No note when the parts fit under the peak.
        assert!(!t.iter().any(|x| x.starts_with("Parts above")));
    }

    #[test]
    fn stacked_breakdown_picks_at_most_40_steps_and_keeps_the_last() {
        // Gradients replace activations: the parts add up to more than the peak.
        let steps: Vec<StepMemory> = (1..=150).map(|s| StepMemory { peak_step: 120 * MIB, ..step(s, 100) }).collect();
        let svg = stacked_breakdown("run", &steps).unwrap();
        assert_xmlish(&svg);
        let t = texts(&svg);
        assert!(t.iter().any(|x| x == "step (40 of 150 shown)"), "{t:?}");
        assert!(t.iter().any(|x| x == "150"));
        // Parts larger than the peak: the note says why.
        assert!(t.iter().any(|x| x.starts_with("Parts above")));
    }
}
