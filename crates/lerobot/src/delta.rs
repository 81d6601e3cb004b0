//! Delta timestamps → delta indices, query indices and padding masks (lerobot semantics).

use std::collections::BTreeMap;

use crate::error::DatasetError;
use crate::info::Info;

/// Per-key frame offsets (e.g. `action: [0, 1, ..., 99]`).
pub type DeltaIndices = BTreeMap<String, Vec<i64>>;

/// lerobot's `check_delta_timestamps`: every delta must be a multiple of 1/fps ± tolerance.
pub fn check_delta_timestamps(
    delta_timestamps: &BTreeMap<String, Vec<f64>>,
    fps: f64,
    tolerance_s: f64,
) -> Result<(), DatasetError> {
    let mut bad = Vec::new();
    for (key, ts) in delta_timestamps {
        for &t in ts {
            let x = t * fps;
            if !(x.is_finite() && (x - x.round_ties_even()).abs() / fps <= tolerance_s) {
                bad.push(format!("{key}: {t}"));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(DatasetError::arg(format!(
            "delta_timestamps not multiples of 1/{fps} (± {tolerance_s} s): {}",
            bad.join(", ")
        )))
    }
}

/// lerobot's `get_delta_indices`: `round(d * fps)` (Python rounds half to even).
pub fn delta_timestamps_to_indices(
    delta_timestamps: &BTreeMap<String, Vec<f64>>,
    fps: f64,
    tolerance_s: f64,
) -> Result<DeltaIndices, DatasetError> {
    check_delta_timestamps(delta_timestamps, fps, tolerance_s)?;
    Ok(delta_timestamps
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().map(|d| (d * fps).round_ties_even() as i64).collect()))
        .collect())
}

/// lerobot's `resolve_delta_timestamps` on a policy's `*_delta_indices`: observation
/// offsets go to every `observation.*` feature, action offsets to `action`, reward
/// offsets to `next.reward`.
pub fn resolve_delta_indices(
    info: &Info,
    observation: Option<&[i64]>,
    action: Option<&[i64]>,
    reward: Option<&[i64]>,
) -> DeltaIndices {
    let mut out = DeltaIndices::new();
    for key in info.features.keys() {
        if key == "next.reward"
            && let Some(r) = reward {
                out.insert(key.clone(), r.to_vec());
            }
        if key == "action"
            && let Some(a) = action {
                out.insert(key.clone(), a.to_vec());
            }
        if key.starts_with("observation.")
            && let Some(o) = observation {
                out.insert(key.clone(), o.to_vec());
            }
    }
    out
}

/// lerobot's `_get_query_indices` for one key: indices clamped to `[ep_start, ep_end)` and
/// the `{key}_is_pad` mask (true where the unclamped index falls outside the episode).
pub fn query_indices(abs_idx: usize, ep_start: usize, ep_end: usize, deltas: &[i64]) -> (Vec<usize>, Vec<bool>) {
    let (a, s, e) = (abs_idx as i64, ep_start as i64, ep_end as i64);
    let idx = deltas.iter().map(|&d| (a + d).min(e - 1).max(s) as usize).collect();
    let pad = deltas.iter().map(|&d| a + d < s || a + d >= e).collect();
    (idx, pad)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn query_and_pad() {
        let (i, p) = query_indices(11, 10, 15, &[-2, -1, 0, 3, 4, 5]);
        assert_eq!(i, vec![10, 10, 11, 14, 14, 14]);
        assert_eq!(p, vec![true, false, false, false, true, true]);
    }
    #[test]
    fn timestamps_to_indices() {
        let mut m = BTreeMap::new();
        m.insert("action".to_string(), vec![-0.1, 0.0, 0.1, 0.2]);
        let d = delta_timestamps_to_indices(&m, 10.0, 1e-4).unwrap();
        assert_eq!(d["action"], vec![-1, 0, 1, 2]);
        m.insert("x".to_string(), vec![0.05]);
        assert!(delta_timestamps_to_indices(&m, 10.0, 1e-4).is_err());
    }
}
