//! Byte sizes, one convention for the whole project: binary units (KiB/MiB/GiB/TiB = 1024ⁿ)
//! everywhere vramlab prints, decimal ones (KB/MB/GB/TB) only where a user types them.
//!
//! | need | function | example |
//! |---|---|---|
//! | a size the user typed (`--budget`, `VRAMLAB_PROBE_BUDGET`) | [`parse`] | `"24GiB"` → 25,769,803,776 |
//! | a size in prose (summaries, progress, errors) | [`human`] | `1.25 GiB`, `312.4 MiB`, `3.0 KiB`, `12 B` |
//! | a MiB table column | [`mib`], [`mib_text`] | `312.4` |
//! | a chart axis whose unit follows the data | [`Unit`] | `1.5 GiB`, `312 MiB` |
//!
//! [`human`] gives GiB two decimals (a 24 GiB card's headroom is read in tens of MiB) and the
//! smaller units one.

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// `24GiB`, `1.5 GiB`, `512MiB`, `100MB`, `2e9`, `1000000` → bytes (GiB/MiB/KiB and a bare
/// `G`/`M`/`K` binary, GB/MB/KB decimal, a bare number is bytes). `None` for anything else,
/// for less than one byte and for more than `u64` holds.
pub fn parse(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.trim().parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => KIB as f64,
        "m" | "mib" => MIB as f64,
        "g" | "gib" => GIB as f64,
        "t" | "tib" => TIB as f64,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = v * mult;
    (bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64).then_some(bytes.round() as u64)
}

/// Bytes for people: GiB with two decimals, MiB and KiB with one, plain bytes below 1 KiB.
pub fn human(b: u64) -> String {
    let f = b as f64;
    if b >= GIB {
        format!("{:.2} GiB", f / GIB as f64)
    } else if b >= MIB {
        format!("{:.1} MiB", f / MIB as f64)
    } else if b >= KIB {
        format!("{:.1} KiB", f / KIB as f64)
    } else {
        format!("{b} B")
    }
}

/// Bytes in MiB.
pub fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

/// Bytes in MiB with one decimal, for table columns whose header names the unit.
pub fn mib_text(b: u64) -> String {
    format!("{:.1}", mib(b))
}

/// A byte unit chosen so that the largest value reads as 1–1023 of it (chart axes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    pub bytes: f64,
}

impl Unit {
    /// The unit for data whose largest value is `max_bytes`.
    pub fn for_max(max_bytes: f64) -> Self {
        const UNITS: [(&str, u64); 4] = [("GiB", GIB), ("MiB", MIB), ("KiB", KIB), ("B", 1)];
        let (name, bytes) = UNITS.into_iter().find(|(_, b)| max_bytes >= *b as f64).unwrap_or(UNITS[3]);
        Self { name, bytes: bytes as f64 }
    }

    /// `bytes` in this unit.
    pub fn of(&self, bytes: f64) -> f64 {
        bytes / self.bytes
    }

    /// `bytes` as text in this unit: three significant digits (`1.25 GiB`, `312 MiB`).
    pub fn fmt(&self, bytes: f64) -> String {
        format!("{} {}", fmt_number(self.of(bytes)), self.name)
    }
}

/// Three significant digits, no trailing zeros after the point: `0.125`, `1.5`, `42.3`, `512`.
pub fn fmt_number(v: f64) -> String {
    let a = v.abs();
    let decimals = if a == 0.0 || a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_bare_sizes() {
        assert_eq!(parse("24GiB"), Some(24 * GIB));
        assert_eq!(parse("1.5 GiB"), Some(3 * GIB / 2));
        assert_eq!(parse("512MiB"), Some(512 * MIB));
        assert_eq!(parse("512m"), Some(512 * MIB));
        assert_eq!(parse("100MB"), Some(100_000_000));
        assert_eq!(parse("2e9"), Some(2_000_000_000));
        assert_eq!(parse("1000000"), Some(1_000_000));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("12 parsecs"), None);
        assert_eq!(parse("-3GiB"), None);
        assert_eq!(parse("inf"), None);
    }

    #[test]
    fn human_sizes_use_one_convention() {
        assert_eq!(human(12), "12 B");
        assert_eq!(human(3 * KIB), "3.0 KiB");
        assert_eq!(human(312 * MIB + 400 * KIB), "312.4 MiB");
        assert_eq!(human(5 * GIB / 4), "1.25 GiB");
        assert_eq!(mib_text(3 * MIB / 2), "1.5");
    }
    // `Unit` and `fmt_number` are tested where the charts use them (vramlab-plot).
}
