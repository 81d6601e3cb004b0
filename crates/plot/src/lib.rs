//! vramlab's pictures: SVG charts from plain numbers (bytes, steps, labels), so a run directory
//! or a sweep shows its memory at a glance next to the tables.
//!
//! Every chart is a `String` of SVG text (900×500 px; text is SVG `<text>` in the viewer's
//! sans-serif font, so no font file is needed). Memory axes pick their unit (B/KiB/MiB/GiB) from
//! the data; long category labels are turned to read upwards, cut, or thinned out rather than
//! overlap. The crate knows nothing of the trainer: callers convert their records.
//!
//! | chart | for | function |
//! |---|---|---|
//! | peak allocated per phase + reserved, per step | a run's `memory.svg` | [`memory_per_step`] |
//! | parameters / gradients / optimizer state / activations / other, per step | a run's `memory_breakdown.svg` | [`stacked_breakdown`] |
//! | peak vs batch size, one line per setting | `sweep_peak.svg` | [`sweep_peak_vs_batch`] |
//! | the same breakdown, one bar per labelled point | `sweep_breakdown.svg` | [`stacked_bars`] |
//! | candidates against a memory budget | `fit` | [`fit_candidates`] |

mod canvas;
mod fit;
mod memory;
mod sweep;

pub use fit::{Candidate, fit_candidates};
pub use memory::{Breakdown, StepMemory, memory_per_step, stacked_bars, stacked_breakdown};
pub use sweep::sweep_peak_vs_batch;

/// Why a chart could not be drawn.
#[derive(Debug)]
pub enum PlotError {
    /// Nothing to draw (no steps, no points, no candidates).
    Empty(&'static str),
    /// The drawing backend failed.
    Draw(String),
}

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty(what) => write!(f, "nothing to plot: no {what}"),
            Self::Draw(msg) => write!(f, "drawing the chart failed: {msg}"),
        }
    }
}

impl std::error::Error for PlotError {}

pub type Result<T> = std::result::Result<T, PlotError>;

/// Chart units and number text: vramlab's one byte convention ([`vramlab_bytes`]).
pub use vramlab_bytes::{Unit, fmt_number};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A well-formed XML subset: every tag closed in order, one `<svg>` root, no stray `<`/`&`.
    pub(crate) fn assert_xmlish(svg: &str) {
        assert!(svg.trim_start().starts_with("<svg"), "does not start with <svg");
        assert!(svg.trim_end().ends_with("</svg>"), "does not end with </svg>");
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            let text = &rest[..i];
            for (j, _) in text.match_indices('&') {
                let entity = &text[j..];
                assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| entity.starts_with(e)), "bare & in text: {text}");
            }
            let end = rest[i..].find('>').expect("unterminated tag") + i;
            let tag = &rest[i + 1..end];
            assert!(!tag.contains('<'), "'<' inside tag {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
                stack.push(tag.split_whitespace().next().unwrap_or(""));
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "unclosed tags {stack:?}");
    }

    /// Every text element's content, unescaped.
    pub(crate) fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = t[t.find('>')? + 1..t.find("</text>")?].trim();
                Some(body.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
            })
            .collect()
    }

    #[test]
    fn units_follow_the_largest_value() {
        assert_eq!(Unit::for_max(512.0).name, "B");
        assert_eq!(Unit::for_max(4096.0).name, "KiB");
        assert_eq!(Unit::for_max(300.0 * 1024.0 * 1024.0).name, "MiB");
        assert_eq!(Unit::for_max(3.0 * 1024.0 * 1024.0 * 1024.0).name, "GiB");
        assert_eq!(Unit::for_max(0.0).name, "B");
        assert_eq!(Unit::for_max(3.0 * 1024.0 * 1024.0 * 1024.0).fmt(1.5 * 1024.0 * 1024.0 * 1024.0), "1.5 GiB");
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(fmt_number(0.0), "0");
        assert_eq!(fmt_number(1.0), "1");
        assert_eq!(fmt_number(1.256), "1.26");
        assert_eq!(fmt_number(42.34), "42.3");
        assert_eq!(fmt_number(512.4), "512");
        assert_eq!(fmt_number(0.125), "0.125");
    }

    #[test]
    fn the_checker_rejects_broken_svg() {
        assert!(std::panic::catch_unwind(|| assert_xmlish("<svg><g></svg>")).is_err());
        assert!(std::panic::catch_unwind(|| assert_xmlish("<svg><text>a & b</text></svg>")).is_err());
        assert_xmlish("<svg a=\"1\"><g><rect/></g><text>a &amp; b</text></svg>");
    }
}
