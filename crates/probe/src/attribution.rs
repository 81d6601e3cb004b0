//! Where a recorded step's memory went, per scope (phase and stage): what each forward stage
//! allocated, what of it was still held when the backward began (what autodiff keeps for the
//! backward, plus the stage's output), and how far each scope rose above where it started (its
//! transient workspaces: im2col columns, casts, temporaries).
//!
//! Everything here is replayed from a [`Recording`]: exact on the counting allocator, in bytes
//! of blocks (no shapes: the estimator names the tensors, `vramlab estimate`).

use std::collections::HashMap;

use crate::timeline::{Action, Recording};

/// One scope's share of the step.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScopeRow {
    pub scope: String,
    /// Bytes and blocks allocated while the scope was current.
    pub allocated: u64,
    pub blocks: u64,
    /// Live bytes when the scope was first entered, and the highest live bytes while it was
    /// current, minus that: the scope's own rise, transients included.
    pub rise: u64,
    /// Live bytes when the scope was left for the last time minus when it was first entered.
    pub net: i64,
    /// Of its blocks, bytes and count still live when the backward began.
    pub kept_at_backward: u64,
    pub kept_blocks: u64,
    /// The largest of those blocks, largest first (at most 4).
    pub largest_kept: Vec<u64>,
    /// Of its blocks, bytes and count live at the step's peak, and the largest (at most 4).
    pub at_peak: u64,
    pub at_peak_blocks: u64,
    pub largest_at_peak: Vec<u64>,
}

/// A recorded step, attributed.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Attribution {
    pub live_at_start: u64,
    /// Live bytes when the first backward event happened (the forward's end).
    pub live_at_backward: u64,
    pub peak: u64,
    /// The scope current at the peak.
    pub peak_scope: String,
    /// Scopes in the order they were first entered.
    pub rows: Vec<ScopeRow>,
}

struct Block {
    size: u64,
    row: usize,
}

/// Attribute the events of `rec` to their scopes.
pub fn attribute(rec: &Recording) -> Attribution {
    let mut rows: Vec<ScopeRow> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut entered_at: Vec<u64> = Vec::new();
    let mut blocks: HashMap<u64, Block> = HashMap::new();
    let mut live = rec.live_at_start as i128;
    let (mut peak, mut peak_scope, mut peak_event) = (rec.live_at_start, String::new(), None);
    let mut at_backward: Option<u64> = None;
    for (i, e) in rec.events.iter().enumerate() {
        let label = rec.label(e.scope);
        let label = if label.is_empty() { "(no scope)" } else { label };
        if at_backward.is_none() && label.starts_with("backward") {
            at_backward = Some(live.max(0) as u64);
            for b in blocks.values() {
                let r = &mut rows[b.row];
                r.kept_at_backward += b.size;
                r.kept_blocks += 1;
                r.largest_kept.push(b.size);
            }
        }
        let row = *index.entry(label.to_string()).or_insert_with(|| {
            rows.push(ScopeRow { scope: label.to_string(), ..Default::default() });
            entered_at.push(live.max(0) as u64);
            rows.len() - 1
        });
        match e.action {
            Action::Alloc => {
                live += e.size as i128;
                rows[row].allocated += e.size;
                rows[row].blocks += 1;
                blocks.insert(e.addr, Block { size: e.size, row });
            }
            Action::Free => {
                live -= e.size as i128;
                blocks.remove(&e.addr);
            }
        }
        let now = live.max(0) as u64;
        rows[row].rise = rows[row].rise.max(now.saturating_sub(entered_at[row]));
        rows[row].net = now as i64 - entered_at[row] as i64;
        if now > peak {
            peak = now;
            peak_scope = label.to_string();
            peak_event = Some(i);
        }
    }
    // Replay again up to the peak: which scopes' blocks make it up.
    if let Some(end) = peak_event {
        let mut live_blocks: HashMap<u64, (u64, &str)> = HashMap::new();
        for e in &rec.events[..=end] {
            match e.action {
                Action::Alloc => {
                    let label = rec.label(e.scope);
                    live_blocks.insert(e.addr, (e.size, if label.is_empty() { "(no scope)" } else { label }));
                }
                Action::Free => {
                    live_blocks.remove(&e.addr);
                }
            }
        }
        for (size, label) in live_blocks.into_values() {
            let r = &mut rows[index[label]];
            r.at_peak += size;
            r.at_peak_blocks += 1;
            r.largest_at_peak.push(size);
        }
    }
    for r in &mut rows {
        r.largest_kept.sort_unstable_by(|a, b| b.cmp(a));
        r.largest_kept.truncate(4);
        r.largest_at_peak.sort_unstable_by(|a, b| b.cmp(a));
        r.largest_at_peak.truncate(4);
    }
    Attribution { live_at_start: rec.live_at_start, live_at_backward: at_backward.unwrap_or(live.max(0) as u64), peak, peak_scope, rows }
}

impl Attribution {
    /// A markdown section for step `step`.
    pub fn markdown(&self, step: u64) -> String {
        let mib = |b: u64| format!("{:.2}", vramlab_bytes::mib(b));
        let kept: u64 = self.rows.iter().map(|r| r.kept_at_backward).sum();
        let mut s = format!(
            "## Step {step}\n\n- live at the start of the step (parameters, optimizer state, anything held across steps): {} MiB\n\
             - live when the backward began: {} MiB, of which {} MiB allocated during this step (what autodiff keeps for the backward, the loss, the batch)\n\
             - step peak: {} MiB, reached in `{}`; **live at peak**: the blocks live at that moment by the scope that allocated them (the rest of the peak was live before the step)\n\n\
             | scope | allocated MiB | blocks | rise above entry MiB | net MiB | kept at backward MiB | kept blocks | largest kept blocks MiB | live at peak MiB | largest live at peak MiB |\n\
             |---|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
            mib(self.live_at_start),
            mib(self.live_at_backward),
            mib(kept),
            mib(self.peak),
            self.peak_scope
        );
        for r in &self.rows {
            let net = if r.net < 0 { format!("−{}", mib(r.net.unsigned_abs())) } else { mib(r.net as u64) };
            let largest: Vec<String> = r.largest_kept.iter().map(|&b| mib(b)).collect();
            let at_peak: Vec<String> = r.largest_at_peak.iter().map(|&b| mib(b)).collect();
            s.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.scope,
                mib(r.allocated),
                r.blocks,
                mib(r.rise),
                net,
                mib(r.kept_at_backward),
                r.kept_blocks,
                largest.join(", "),
                mib(r.at_peak),
                at_peak.join(", ")
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Event, scope::ScopeId};

    fn ev(addr: u64, size: u64, scope: u32, action: Action) -> Event {
        Event { addr, size, time_us: 0, scope: scope_id(scope), action, other_thread: false }
    }

    fn scope_id(i: u32) -> ScopeId {
        ScopeId::from_index(i)
    }

    #[test]
    fn kept_blocks_and_transients_are_attributed_to_their_stage() {
        let labels = vec![String::new(), "forward/a".into(), "forward/b".into(), "backward".into()];
        let m = 1u64 << 20;
        let events = vec![
            ev(1, 4 * m, 1, Action::Alloc),  // a keeps 4
            ev(2, 10 * m, 1, Action::Alloc), // a's workspace
            ev(2, 10 * m, 1, Action::Free),
            ev(3, 2 * m, 2, Action::Alloc), // b keeps 2
            ev(4, 6 * m, 3, Action::Alloc), // backward
            ev(1, 4 * m, 3, Action::Free),
            ev(4, 6 * m, 3, Action::Free),
        ];
        let rec = Recording { events, dropped: 0, live_at_start: 100 * m, live_at_end: 102 * m, duration_us: 1, labels };
        let a = attribute(&rec);
        assert_eq!(a.live_at_backward, 106 * m);
        assert_eq!(a.peak, 114 * m);
        assert_eq!(a.peak_scope, "forward/a");
        let fa = &a.rows[0];
        assert_eq!((fa.scope.as_str(), fa.allocated, fa.blocks, fa.rise, fa.net, fa.kept_at_backward), ("forward/a", 14 * m, 2, 14 * m, 4 * m as i64, 4 * m));
        let fb = &a.rows[1];
        assert_eq!((fb.kept_at_backward, fb.kept_blocks, fb.largest_kept.clone()), (2 * m, 1, vec![2 * m]));
        let bw = &a.rows[2];
        assert_eq!((bw.rise, bw.kept_at_backward), (6 * m, 0));
        // At the peak (a's workspace live): a's 4 + 10.
        assert_eq!((fa.at_peak, fa.at_peak_blocks, fa.largest_at_peak.clone()), (14 * m, 2, vec![10 * m, 4 * m]));
        assert_eq!((fb.at_peak, bw.at_peak), (0, 0));
        assert!(a.markdown(3).contains("| `forward/a` | 14.00 | 2 | 14.00 | 4.00 | 4.00 | 1 | 4.00 | 14.00 | 10.00, 4.00 |"), "{}", a.markdown(3));
    }
}
