//! What every chart shares: the page, fonts, colours, the legend column, labels under the x axis
//! and bar drawing.
//!
//! Layout is planned from an estimate of text width (per-glyph widths of DejaVu Sans, the
//! usual `sans-serif`) because an SVG has no fonts to measure; labels keep a few pixels apart
//! for wider fonts.

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::PlotError;

pub const WIDTH: u32 = 900;
pub const HEIGHT: u32 = 500;
const FONT: &str = "sans-serif";
/// Average advance of a sans-serif glyph, in em (DejaVu Sans digits and lower case: ~0.6).
const CHAR_EM: f64 = 0.6;
/// Size of axis and legend labels, px.
pub const LABEL_PX: f64 = 13.0;
/// Width of the y-axis label area: tick labels and the rotated axis name.
pub const Y_LABEL_AREA: u32 = 78;
/// Margin around the plotting area, px.
pub const MARGIN: u32 = 12;
/// Longest label under the x axis once turned upwards, in characters.
const MAX_ROTATED_CHARS: usize = 36;

pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Tableau 10: distinct, readable on white, tolerable for colour-blind readers.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
pub const GREY: RGBColor = RGBColor(127, 127, 127);
pub const LIGHT_GREY: RGBColor = RGBColor(199, 199, 199);
pub const BUDGET_RED: RGBColor = RGBColor(200, 0, 0);

/// Text of `px` pixels in `color` (plotters writes `font-size` = size / 1.24).
pub fn font(px: f64, color: RGBColor) -> TextStyle<'static> {
    let mut style = TextStyle::from((FONT, px * 1.24).into_font());
    style.color = color.to_backend_color();
    style
}

/// Estimated width of `text` at `px` pixels (DejaVu Sans advances, in em, by glyph class).
pub fn text_width(text: &str, px: f64) -> f64 {
    let em: f64 = text
        .chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | ' ' => 0.3,
            'f' | 't' | 'r' | '(' | ')' | '[' | ']' | '-' => 0.4,
            'c' | 's' | 'z' | 'v' | 'x' | 'y' | 'k' | '_' => 0.54,
            '=' | '+' | '<' | '>' | '~' | '−' | '×' => 0.84,
            'm' | 'w' | 'M' | 'W' | '%' => 0.98,
            '0'..='9' => 0.64,
            c if c.is_uppercase() => 0.72,
            _ => 0.62,
        })
        .sum();
    em * px
}

/// `text` cut to `max_chars` characters, the cut marked with `…`.
pub fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// Height of a page whose x labels need `x_label_px` under the axis: the plot keeps its
/// height when long labels are turned upwards.
pub fn page_height(x_label_px: u32) -> u32 {
    HEIGHT + x_label_px.saturating_sub(60)
}

/// An SVG page `height` px tall with `title` on top and a legend column `legend_width` px wide
/// on the right; `draw` gets the whole page (for absolute positions), the plotting part and
/// the legend column.
pub fn svg(title: &str, height: u32, legend_width: u32, draw: impl FnOnce(&Area, &Area, &Area) -> DrawResult) -> crate::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        let result: DrawResult = (|| {
            root.fill(&WHITE)?;
            let title_px = 19.0;
            let max_chars = ((WIDTH as f64 - 40.0) / (title_px * CHAR_EM)) as usize;
            let body = root.titled(&truncate(title, max_chars), font(title_px, BLACK))?;
            let (plot, legend) = body.split_horizontally(WIDTH - legend_width);
            draw(&root, &plot, &legend)?;
            root.present()?;
            Ok(())
        })();
        result.map_err(|e| PlotError::Draw(e.to_string()))?;
    }
    Ok(buf)
}

/// How a legend entry looks.
#[derive(Clone, Copy)]
pub enum Swatch {
    /// A line of this width.
    Line(RGBColor, u32),
    Dashed(RGBColor),
    /// A filled box.
    Fill(RGBColor),
    /// A box outlined and hatched.
    Hatched(RGBColor),
    /// A short dark tick, the peak marker on bars.
    PeakTick,
}

/// Longest legend line, in characters: longer labels wrap onto more lines.
const LEGEND_CHARS: usize = 30;

/// Width of the legend column for `items`: the longest label up to `LEGEND_CHARS` characters.
pub fn legend_width(items: &[(String, Swatch)]) -> u32 {
    let longest = items.iter().map(|(l, _)| l.chars().count().min(LEGEND_CHARS)).max().unwrap_or(0);
    (longest as f64 * LABEL_PX * CHAR_EM + 48.0).clamp(130.0, 300.0) as u32
}

/// Pixels along the x axis of a chart on a page with a legend column `legend_width` wide.
pub fn axis_px(legend_width: u32) -> f64 {
    (WIDTH - legend_width - Y_LABEL_AREA - 2 * MARGIN) as f64
}

/// A legend: an optional heading, the entries, then notes in grey.
pub struct Legend<'a> {
    pub heading: &'a str,
    pub items: &'a [(String, Swatch)],
    pub notes: &'a [&'a str],
}

const LEGEND_ROW: i32 = 22;
const LEGEND_LINE: i32 = 16;
const NOTE_PX: f64 = LABEL_PX - 1.5;

impl Legend<'_> {
    /// Characters per line of entries and of notes in a column `width` px wide.
    fn chars(width: u32) -> (usize, usize) {
        let item = ((width as f64 - 44.0) / (LABEL_PX * CHAR_EM)).max(4.0) as usize;
        let note = ((width as f64 - 12.0) / (NOTE_PX * CHAR_EM)).max(4.0) as usize;
        (item, note)
    }

    /// Height the legend needs in a column `width` px wide.
    pub fn height(&self, width: u32) -> u32 {
        let (item_chars, note_chars) = Self::chars(width);
        let heading = if self.heading.is_empty() { 0 } else { wrap(self.heading, note_chars).len() as i32 * LEGEND_LINE + 6 };
        let items: i32 = self.items.iter().map(|(l, _)| LEGEND_ROW + (wrap(l, item_chars).len() as i32 - 1) * LEGEND_LINE).sum();
        let notes: i32 = self.notes.iter().map(|n| wrap(n, note_chars).len() as i32 * LEGEND_LINE + 4).sum();
        (MARGIN as i32 + heading + items + 6 + notes + MARGIN as i32).max(0) as u32
    }

    /// A page height of at least `height` that holds this legend under the title.
    pub fn page_height(&self, height: u32, width: u32) -> u32 {
        height.max(self.height(width) + 40)
    }

    /// Draw the legend from the top of `area`.
    pub fn draw(&self, area: &Area) -> DrawResult {
        let (w, _) = area.dim_in_pixel();
        let (item_chars, note_chars) = Self::chars(w);
        let mut y = MARGIN as i32;
        if !self.heading.is_empty() {
            for line in wrap(self.heading, note_chars) {
                area.draw(&Text::new(line, (6, y), font(LABEL_PX, BLACK).pos(Pos::new(HPos::Left, VPos::Top))))?;
                y += LEGEND_LINE;
            }
            y += 6;
        }
        y += 8;
        for (label, swatch) in self.items {
            let (x0, x1, yc) = (6, 30, y);
            match *swatch {
                Swatch::Line(c, width) => area.draw(&PathElement::new(vec![(x0, yc), (x1, yc)], c.stroke_width(width)))?,
                Swatch::Dashed(c) => {
                    for x in [x0, x0 + 9, x0 + 18] {
                        area.draw(&PathElement::new(vec![(x, yc), (x + 6, yc)], c.stroke_width(2)))?;
                    }
                }
                Swatch::Fill(c) => area.draw(&Rectangle::new([(x0, yc - 7), (x1, yc + 7)], c.filled()))?,
                Swatch::Hatched(c) => hatched_rect(area, (x0, yc - 7), (x1, yc + 7), c)?,
                Swatch::PeakTick => area.draw(&PathElement::new(vec![(x0, yc), (x1, yc)], BLACK.stroke_width(3)))?,
            }
            let lines = wrap(label, item_chars);
            for (i, l) in lines.iter().enumerate() {
                let style = font(LABEL_PX, BLACK).pos(Pos::new(HPos::Left, VPos::Center));
                area.draw(&Text::new(l.clone(), (x1 + 8, yc + i as i32 * LEGEND_LINE), style))?;
            }
            y += LEGEND_ROW + (lines.len() as i32 - 1) * LEGEND_LINE;
        }
        y += 6;
        for note in self.notes {
            for line in wrap(note, note_chars) {
                area.draw(&Text::new(line, (6, y), font(NOTE_PX, GREY).pos(Pos::new(HPos::Left, VPos::Center))))?;
                y += LEGEND_LINE;
            }
            y += 4;
        }
        Ok(())
    }
}

/// Words of `text` in lines of at most `width` characters (a longer word is cut).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines.into_iter().map(|l| truncate(&l, width)).collect()
}

/// A rectangle outlined in `color` and filled with diagonal lines, in page pixels.
pub fn hatched_rect(area: &Area, (x0, y0): (i32, i32), (x1, y1): (i32, i32), color: RGBColor) -> DrawResult {
    let (x0, x1) = (x0.min(x1), x0.max(x1));
    let (y0, y1) = (y0.min(y1), y0.max(y1));
    let (w, h) = (x1 - x0, y1 - y0);
    area.draw(&Rectangle::new([(x0, y0), (x1, y1)], color.mix(0.12).filled()))?;
    // Lines u + v = t, u = x - x0 rightwards, v = y1 - y upwards, cut to the rectangle.
    let spacing = 7;
    let mut t = spacing;
    while t < w + h {
        let (u0, u1) = ((t - h).max(0), t.min(w));
        area.draw(&PathElement::new(vec![(x0 + u0, y1 - (t - u0)), (x0 + u1, y1 - (t - u1))], color.stroke_width(1)))?;
        t += spacing;
    }
    area.draw(&Rectangle::new([(x0, y0), (x1, y1)], color.stroke_width(2)))?;
    Ok(())
}

/// Labels under the x axis, in the first of these that fits each label's share of the axis:
/// level; level on up to three lines (broken at `\n`, then at spaces); turned to read upwards
/// and cut to `MAX_ROTATED_CHARS`. A label that would touch the last one drawn is left out.
pub struct XLabels {
    layout: LabelLayout,
    /// Font size, px: a little smaller before turning labels.
    px: f64,
    /// Height of the label area under the axis, px, the axis name (if any) included.
    pub area_px: u32,
    desc: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LabelLayout {
    /// Lines at most this many pixels wide.
    Level(f64),
    Rotated,
}

/// Room for the axis name under the labels.
const DESC_PX: f64 = LABEL_PX * 2.0;

/// `text` in lines at most `room` px wide at `px` pixels: broken at `\n`, then between words;
/// a word wider than `room` is cut.
fn wrap_px(text: &str, room: f64, px: f64) -> Vec<String> {
    let mut lines = Vec::new();
    for part in text.split('\n') {
        let mut line = String::new();
        for word in part.split_whitespace() {
            let joined = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
            if line.is_empty() || text_width(&joined, px) <= room {
                line = joined;
            } else {
                lines.push(std::mem::replace(&mut line, word.to_string()));
            }
        }
        lines.push(line);
    }
    lines.into_iter().map(|l| cut_px(&l, room, px)).collect()
}

/// `text` cut (with `…`) to at most `room` px at `px` pixels.
fn cut_px(text: &str, room: f64, px: f64) -> String {
    if text_width(text, px) <= room {
        return text.to_string();
    }
    let mut s: String = text.chars().collect();
    while !s.is_empty() && text_width(&format!("{s}…"), px) > room {
        s.pop();
    }
    format!("{s}…")
}

/// A label on one line, for turning upwards.
fn one_line(label: &str) -> String {
    truncate(&label.replace('\n', ", "), MAX_ROTATED_CHARS)
}

impl XLabels {
    /// The layout for `labels` sharing `axis_px` pixels evenly (one slot each), with the axis
    /// named `desc` under them (none when empty).
    pub fn plan(labels: &[String], axis_px: f64, desc: &str) -> Self {
        let room = axis_px / labels.len().max(1) as f64 - 6.0;
        let desc_px = if desc.is_empty() { 0.0 } else { DESC_PX };
        let make = |layout, px, label_px: f64| Self { layout, px, area_px: (label_px + desc_px).ceil() as u32, desc: desc.to_string() };
        for px in [LABEL_PX, LABEL_PX - 1.5] {
            let words_fit = labels.iter().flat_map(|l| l.split('\n').flat_map(str::split_whitespace)).all(|w| text_width(w, px) <= room);
            let lines = labels.iter().map(|l| wrap_px(l, room, px).len()).max().unwrap_or(1);
            if room >= 24.0 && words_fit && lines <= 3 {
                return make(LabelLayout::Level(room), px, lines as f64 * px * 1.25 + 10.0);
            }
        }
        let slot = room + 6.0;
        let widest = labels.iter().map(|l| text_width(&one_line(l), LABEL_PX)).fold(0.0, f64::max);
        // Short one-line labels (step numbers) stay level; every few is drawn.
        if widest <= 4.0 * LABEL_PX && labels.iter().all(|l| !l.contains(['\n', ' '])) {
            return make(LabelLayout::Level(widest), LABEL_PX, LABEL_PX * 1.25 + 10.0);
        }
        // Turned labels stand side by side: a smaller font where the slots are narrow.
        let px = if slot >= LABEL_PX * 1.3 { LABEL_PX } else { LABEL_PX - 2.0 };
        make(LabelLayout::Rotated, px, widest * px / LABEL_PX + 16.0)
    }

    /// Draw `ticks` (page x, label) under the axis at page y `axis_y`, a tick mark each, and
    /// the axis name centred at page x `centre`.
    pub fn draw(&self, page: &Area, ticks: &[(i32, String)], axis_y: i32, centre: i32) -> DrawResult {
        let laid: Vec<(i32, i32, Vec<String>)> = ticks
            .iter()
            .map(|(x, label)| {
                let (lines, half) = match self.layout {
                    LabelLayout::Level(room) => {
                        let lines = wrap_px(label, room, self.px);
                        let half = (lines.iter().map(|l| text_width(l, self.px)).fold(0.0, f64::max) / 2.0) as i32;
                        (lines, half)
                    }
                    LabelLayout::Rotated => (vec![one_line(label)], (self.px * 0.6) as i32),
                };
                (*x, half, lines)
            })
            .collect();
        // Keep labels left to right while they stay apart; the last one always (it tells
        // where the axis ends), at the cost of its neighbours.
        let gap = if self.layout == LabelLayout::Rotated { 1 } else { 4 };
        let apart = |a: &(i32, i32, Vec<String>), b: &(i32, i32, Vec<String>)| b.0 - b.1 >= a.0 + a.1 + gap;
        let mut kept: Vec<usize> = Vec::new();
        for i in 0..laid.len() {
            if kept.last().is_none_or(|&k| apart(&laid[k], &laid[i])) {
                kept.push(i);
            }
        }
        if let Some(last) = laid.len().checked_sub(1)
            && kept.last() != Some(&last)
        {
            while kept.last().is_some_and(|&k| !apart(&laid[k], &laid[last])) {
                kept.pop();
            }
            kept.push(last);
        }
        for (x, _, lines) in kept.into_iter().map(|i| &laid[i]) {
            page.draw(&PathElement::new(vec![(*x, axis_y), (*x, axis_y + 5)], BLACK.stroke_width(1)))?;
            let top = axis_y + 8;
            match self.layout {
                LabelLayout::Level(_) => {
                    for (i, l) in lines.iter().enumerate() {
                        let y = top + (i as f64 * self.px * 1.25) as i32;
                        page.draw(&Text::new(l.clone(), (*x, y), font(self.px, BLACK).pos(Pos::new(HPos::Center, VPos::Top))))?;
                    }
                }
                LabelLayout::Rotated => {
                    let style = font(self.px, BLACK).transform(FontTransform::Rotate270).pos(Pos::new(HPos::Right, VPos::Center));
                    page.draw(&Text::new(lines[0].clone(), (*x, top), style))?;
                }
            }
        }
        if !self.desc.is_empty() {
            let style = font(LABEL_PX + 1.0, BLACK).pos(Pos::new(HPos::Center, VPos::Top));
            // At the bottom of the planned area, whichever labels were drawn.
            page.draw(&Text::new(self.desc.clone(), (centre, axis_y + self.area_px as i32 - DESC_PX as i32 + 4), style))?;
        }
        Ok(())
    }
}

/// A category chart in `area`: slot `i` spans `i - 0.5 .. i + 0.5`, y is `0 .. y_max` in the
/// chart's unit named in `y_desc`; grid lines across, no x labels (see [`XLabels`]).
pub fn category_chart<'a, 'b>(
    area: &'a Area<'b>,
    n: usize,
    y_max: f64,
    y_desc: &str,
    x_labels: &XLabels,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .margin(MARGIN)
        .x_label_area_size(x_labels.area_px)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(8)
        .y_desc(y_desc)
        .y_label_formatter(&|v| crate::fmt_number(*v))
        .label_style(font(LABEL_PX, BLACK))
        .axis_desc_style(font(LABEL_PX + 1.0, BLACK))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .draw()?;
    Ok(chart)
}

/// Page x of the middle of a chart's plotting area.
pub fn centre_px<X: Ranged, Y: Ranged>(chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>) -> i32 {
    let (xr, _) = chart.plotting_area().get_pixel_range();
    (xr.start + xr.end) / 2
}

/// Half the width of a bar, in slots.
pub const BAR_HALF: f64 = 0.36;

/// The page x of slot `i` and the page y of the x axis.
pub fn slot_px(chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>, i: usize) -> (i32, i32) {
    chart.backend_coord(&(i as f64, 0.0))
}

/// Pixels per slot.
pub fn slot_width(chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>) -> f64 {
    (chart.backend_coord(&(1.0, 0.0)).0 - chart.backend_coord(&(0.0, 0.0)).0) as f64
}

/// `text` centred just above page point `(x, y)` when it fits in `room` px, else `short` if
/// that fits, else nothing.
pub fn label_above(page: &Area, (x, y): (i32, i32), text: &str, short: &str, room: f64, color: RGBColor) -> DrawResult {
    let px = LABEL_PX - 1.0;
    let chosen = [text, short].into_iter().find(|t| !t.is_empty() && text_width(t, px) <= room);
    if let Some(t) = chosen {
        page.draw(&Text::new(t.to_string(), (x, y - 4), font(px, color).pos(Pos::new(HPos::Center, VPos::Bottom))))?;
    }
    Ok(())
}

/// `text` centred just below page point `(x, y)` (inside the top of a bar) when it fits in
/// `room` px, else `short` if that fits, else nothing.
pub fn label_below(page: &Area, (x, y): (i32, i32), text: &str, short: &str, room: f64, color: RGBColor) -> DrawResult {
    let px = LABEL_PX - 1.0;
    let chosen = [text, short].into_iter().find(|t| !t.is_empty() && text_width(t, px) <= room);
    if let Some(t) = chosen {
        page.draw(&Text::new(t.to_string(), (x, y), font(px, color).pos(Pos::new(HPos::Center, VPos::Top))))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_labels_wrap_or_turn_and_short_ones_stay_level() {
        let short: Vec<String> = (1..=6).map(|i| i.to_string()).collect();
        let plan = XLabels::plan(&short, 600.0, "");
        assert!(matches!(plan.layout, LabelLayout::Level(_)));
        assert!(plan.area_px < 30);
        // Step numbers on narrow slots: level, thinned out when drawn.
        let steps: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
        assert!(matches!(XLabels::plan(&steps, 500.0, "").layout, LabelLayout::Level(_)));
        // Five labels of three words on 600 px: on several lines.
        let words: Vec<String> = (1..=5).map(|i| format!("batch {i}, bf16, checkpointing")).collect();
        let plan = XLabels::plan(&words, 600.0, "");
        assert!(matches!(plan.layout, LabelLayout::Level(_)), "{:?}", plan.layout);
        assert!(plan.area_px > 30);
        // Explicit line breaks are kept.
        assert_eq!(wrap_px("batch_size=1\nprecision=f32", 200.0, LABEL_PX), vec!["batch_size=1", "precision=f32"]);
        let long: Vec<String> = (1..=12).map(|i| format!("batch_size={i} precision=bf16 gradient_checkpointing=blocks")).collect();
        let plan = XLabels::plan(&long, 600.0, "");
        assert_eq!(plan.layout, LabelLayout::Rotated);
        // Room for the cut label, not the whole one; the axis name adds a line.
        assert!(plan.area_px as f64 <= text_width(&one_line(&long[11]), LABEL_PX) + 17.0);
        assert!(XLabels::plan(&long, 600.0, "point").area_px > plan.area_px);
    }

    #[test]
    fn widths_follow_the_glyphs() {
        assert!(text_width("iiii", 10.0) < text_width("0000", 10.0));
        assert!(text_width("mmmm", 10.0) > text_width("0000", 10.0));
        assert!(cut_px("a very long label indeed", 60.0, LABEL_PX).ends_with('…'));
        assert!(text_width(&cut_px("a very long label indeed", 60.0, LABEL_PX), LABEL_PX) <= 60.0);
        // DejaVu Sans at 13 px: "batch_size=1, precision=f32" is 187 px wide.
        assert!((text_width("batch_size=1, precision=f32", 13.0) - 187.0).abs() < 8.0);
    }

    #[test]
    fn truncation_and_wrapping() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(wrap("one two three four", 9), vec!["one two", "three", "four"]);
        assert_eq!(wrap("abcdefghijkl", 5), vec!["abcd…"]);
    }
}
