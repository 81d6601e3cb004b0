//! A [`Recording`] as the snapshot PyTorch's memory visualizer opens
//! (<https://pytorch.org/memory_viz>, `torch.cuda.memory._memory_viz`): the pickled dict that
//! `torch.cuda.memory._dump_snapshot()` writes.
//!
//! ```text
//! {"segments": [segment, ...],            # what is alive when the snapshot is taken
//!  "device_traces": [[entry, ...]],       # one device (0): every event of the window
//!  "allocator_settings": {},
//!  "vramlab": {...}}                      # what the window was (ignored by the viewers)
//! segment = {"device": 0, "address", "total_size", "allocated_size", "active_size",
//!            "requested_size", "stream": 0, "segment_type": "small"|"large",
//!            "segment_pool_id": (0, 0), "is_expandable": False, "frames",
//!            "blocks": [{"address", "size", "requested_size", "state": "active_allocated", "frames"}]}
//! entry   = {"action", "addr", "size", "stream": 0, "time_us", "frames"}
//! frames  = [{"filename": "vramlab", "line": 0, "name": <scope label>}]
//! ```
//!
//! The CPU heap has no caching allocator: every block is its own `malloc`. So, as PyTorch
//! does with its caching allocator turned off, every block is its own segment: an allocation
//! is `segment_alloc` + `alloc`, a free is `free_requested` + `free_completed` +
//! `segment_free`, and each block alive at the end is a segment holding that one block. Blocks
//! alive before recording started have no recorded address: those freed during the window
//! appear through their free (the viewers treat them as allocated from the start); the bytes
//! of those still alive at the end are one segment at address 0 whose frame says so, so the
//! timeline starts at the live bytes of the start, as the trainer's figures do.
//!
//! [`SnapshotOptions::min_block_bytes`] leaves the events of smaller blocks out of the file
//! (most heap blocks are a few bytes of bookkeeping, not tensors): the timeline then differs
//! from the live bytes by the net bytes of the left-out blocks, at most
//! `vramlab.left_out_max_net_bytes`, which the file records with their count.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use crate::pickle::{Memo, Pickler};
use crate::timeline::{Action, Event, Recording};

/// `filename` of every frame.
pub const FRAME_FILE: &str = "vramlab";
/// Frame name of the blocks alive before recording started.
pub const PREEXISTING: &str = "live before recording (addresses not recorded)";
/// Frame name suffix of events from a thread other than the recording one.
pub const OTHER_THREAD: &str = " [other thread]";
/// torch's caching allocator puts blocks above 1 MiB into its large pool.
const SMALL_SIZE: u64 = 1 << 20;

/// What goes into a snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotOptions {
    /// Leave out the events of blocks smaller than this (0: every event).
    pub min_block_bytes: u64,
}

/// The pickled snapshot of `rec` (`title`: a line naming the window, kept under `vramlab`).
pub fn snapshot_pickle(rec: &Recording, title: &str, opts: &SnapshotOptions) -> Vec<u8> {
    let mut w = Writer { p: Pickler::new(), frames: HashMap::new() };
    let (kept, left_out): (Vec<&Event>, Vec<&Event>) = rec.events.iter().partition(|e| e.size >= opts.min_block_bytes);
    let alive = alive_at_end(rec, &kept);
    // The left-out blocks' net bytes over the window: how far the file's timeline can be off.
    let net = left_out.iter().scan(0i128, |net, e| {
        *net += if e.action == Action::Alloc { e.size as i128 } else { -(e.size as i128) };
        Some(net.abs())
    });
    let left_out_max_net = net.max().unwrap_or(0);
    w.p.dict(|d| {
        d.key("segments").list(alive.segments.iter(), |p, seg| write_segment(p, &mut w.frames, rec, seg));
        d.key("device_traces").list([()], |p, ()| p.list(kept.iter(), |p, e| write_event(p, &mut w.frames, rec, e)));
        d.key("allocator_settings").dict(|_| {});
        d.key("vramlab").dict(|d| {
            d.str("title", title);
            d.int("events", rec.events.len() as i128);
            d.int("dropped_events", rec.dropped as i128);
            d.int("min_block_bytes", opts.min_block_bytes as i128);
            d.int("left_out_events", left_out.len() as i128);
            d.int("left_out_max_net_bytes", left_out_max_net);
            d.int("live_bytes_at_start", rec.live_at_start as i128);
            d.int("live_bytes_at_end", rec.live_at_end as i128);
            d.int("peak_live_bytes_replayed", rec.peak_live() as i128);
            d.int("duration_us", rec.duration_us as i128);
            d.str("segments", "one per block: the CPU heap is the system allocator, without a cache");
        });
    });
    w.p.finish()
}

/// Write [`snapshot_pickle`] to `path` atomically (a temporary file, then a rename).
pub fn write_snapshot(rec: &Recording, title: &str, opts: &SnapshotOptions, path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("pickle.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&snapshot_pickle(rec, title, opts))?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

struct Writer {
    p: Pickler,
    frames: FrameMemo,
}

/// The frames list of each (scope, other thread), written once and shared.
type FrameMemo = HashMap<(usize, bool), Memo>;

/// A block alive at the end of the window.
struct Segment {
    addr: u64,
    size: u64,
    /// (scope index, other thread) of its allocation; `None`: alive before recording.
    context: Option<(usize, bool)>,
}

struct Alive {
    segments: Vec<Segment>,
}

/// Replay the kept events: the blocks allocated in the window and not freed, by address, and
/// one segment at address 0 for the bytes alive since before the window (and not freed in it).
fn alive_at_end(rec: &Recording, kept: &[&Event]) -> Alive {
    let mut blocks: BTreeMap<u64, (u64, (usize, bool))> = BTreeMap::new();
    let mut freed_preexisting = 0u64;
    for e in kept {
        match e.action {
            Action::Alloc => {
                blocks.insert(e.addr, (e.size, (e.scope.index(), e.other_thread)));
            }
            Action::Free => {
                if blocks.remove(&e.addr).is_none() {
                    freed_preexisting += e.size;
                }
            }
        }
    }
    let preexisting = rec.live_at_start.saturating_sub(freed_preexisting);
    let mut segments = Vec::with_capacity(blocks.len() + 1);
    if preexisting > 0 {
        segments.push(Segment { addr: 0, size: preexisting, context: None });
    }
    segments.extend(blocks.into_iter().map(|(addr, (size, ctx))| Segment { addr, size, context: Some(ctx) }));
    Alive { segments }
}

fn write_frames(p: &mut Pickler, memo: &mut FrameMemo, rec: &Recording, context: Option<(usize, bool)>) {
    let key = context.unwrap_or((usize::MAX, false));
    if let Some(&m) = memo.get(&key) {
        p.get(m);
        return;
    }
    let name = match context {
        None => PREEXISTING.to_string(),
        Some((scope, other)) => {
            let label = rec.labels.get(scope).map_or("", String::as_str);
            let label = if label.is_empty() { "(no scope)" } else { label };
            if other { format!("{label}{OTHER_THREAD}") } else { label.to_string() }
        }
    };
    p.list([()], |p, ()| {
        p.dict(|d| {
            d.str("filename", FRAME_FILE);
            d.int("line", 0);
            d.str("name", &name);
        })
    });
    let m = p.put();
    memo.insert(key, m);
}

fn write_segment(p: &mut Pickler, memo: &mut FrameMemo, rec: &Recording, seg: &Segment) {
    let size = seg.size as i128;
    p.dict(|d| {
        d.int("device", 0);
        d.int("address", seg.addr as i128);
        d.int("total_size", size);
        d.int("allocated_size", size);
        d.int("active_size", size);
        d.int("requested_size", size);
        d.int("stream", 0);
        d.str("segment_type", if seg.size > SMALL_SIZE { "large" } else { "small" });
        d.key("segment_pool_id").tuple2(0, 0);
        d.key("is_expandable").bool(false);
        write_frames(d.key("frames"), memo, rec, seg.context);
        d.key("blocks").list([()], |p, ()| {
            p.dict(|d| {
                d.int("address", seg.addr as i128);
                d.int("size", size);
                d.int("requested_size", size);
                d.str("state", "active_allocated");
                write_frames(d.key("frames"), memo, rec, seg.context);
            })
        });
    });
}

/// One event as torch's trace entries: `segment_alloc` + `alloc`, or `free_requested` +
/// `free_completed` + `segment_free`.
fn write_event(p: &mut Pickler, memo: &mut FrameMemo, rec: &Recording, e: &Event) {
    let actions: &[&str] = match e.action {
        Action::Alloc => &["segment_alloc", "alloc"],
        Action::Free => &["free_requested", "free_completed", "segment_free"],
    };
    let ctx = Some((e.scope.index(), e.other_thread));
    // A list holds its items directly: the entries of one event follow each other in it.
    for action in actions {
        p.dict(|d| {
            d.str("action", action);
            d.int("addr", e.addr as i128);
            d.int("size", e.size as i128);
            d.int("stream", 0);
            d.int("time_us", e.time_us as i128);
            write_frames(d.key("frames"), memo, rec, ctx);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::scope::ScopeId;

    /// Labels: 1 forward, 2 backward, 3 optimizer (indices into `labels`).
    fn recording() -> Recording {
        let scope = |i: usize| {
            let labels = ["", "forward", "backward", "optimizer"];
            // ScopeIds are made by interning; a hand-made recording maps them by index.
            let id = crate::scope::intern(&format!("memory_viz-test/{}", labels[i]));
            (id, labels[i])
        };
        let ids: Vec<(ScopeId, &str)> = (0..4).map(scope).collect();
        let mut labels = vec![String::new(); ids.iter().map(|(id, _)| id.index() + 1).max().unwrap_or(1)];
        for (id, l) in &ids {
            labels[id.index()] = l.to_string();
        }
        let ev = |action, addr: u64, size: u64, t: u64, s: usize, other: bool| Event { addr, size, time_us: t, scope: ids[s].0, action, other_thread: other };
        Recording {
            events: vec![
                ev(Action::Alloc, 0x7f12_3400_1000, 4096, 1, 1, false),
                ev(Action::Alloc, 0x7f12_3500_0000, 3 << 20, 2, 2, false),
                ev(Action::Free, 0x7f12_3400_1000, 4096, 3, 3, false),
                ev(Action::Free, 0x5555_0000_0010, 100, 4, 3, true), // alive before the window
            ],
            dropped: 0,
            live_at_start: 1000,
            live_at_end: 1000 - 100 + (3 << 20),
            duration_us: 5,
            labels,
        }
    }

    #[test]
    fn the_snapshot_replays_to_the_blocks_alive_at_the_end() {
        let rec = recording();
        let alive = alive_at_end(&rec, &rec.events.iter().collect::<Vec<_>>());
        let segs: Vec<(u64, u64, bool)> = alive.segments.iter().map(|s| (s.addr, s.size, s.context.is_none())).collect();
        assert_eq!(segs, [(0, 900, true), (0x7f12_3500_0000, 3 << 20, false)]);
        assert_eq!(rec.peak_live(), 1000 + 4096 + (3 << 20));
        // Blocks under 1000 bytes left out: the 100-byte free stays in the baseline.
        let kept: Vec<&Event> = rec.events.iter().filter(|e| e.size >= 1000).collect();
        let segs: Vec<(u64, u64)> = alive_at_end(&rec, &kept).segments.iter().map(|s| (s.addr, s.size)).collect();
        assert_eq!(segs, [(0, 1000), (0x7f12_3500_0000, 3 << 20)]);
        let small = snapshot_pickle(&rec, "test", &SnapshotOptions { min_block_bytes: 1000 });
        let has = |b: &[u8], s: &str| b.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has(&small, "left_out_max_net_bytes") && !has(&small, "[other thread]"));
        let bytes = snapshot_pickle(&rec, "test", &SnapshotOptions::default());
        assert!(has(&bytes, "optimizer [other thread]"));
        assert_eq!(&bytes[..4], &[0x80, 4, b'}', b'('], "protocol 4, a dict");
        assert_eq!(bytes.last(), Some(&b'.'));
    }

    /// Loads the snapshot with Python's `pickle` (and, where `torch` imports, runs
    /// `torch.cuda._memory_viz`'s readers on it). Python: `$VRAMLAB_PYTHON`, else `python3`.
    #[test]
    fn python_pickle_reads_the_snapshot() {
        let dir = vramlab_testkit::temp_dir("memory-viz");
        let path = dir.join("snapshot.pickle");
        write_snapshot(&recording(), "test", &SnapshotOptions::default(), &path).unwrap();
        assert!(!path.with_extension("pickle.tmp").exists());
        let python = std::env::var("VRAMLAB_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = r#"
import pickle, pickletools, sys, json
data = open(sys.argv[1], "rb").read()
# The opcodes the memory_viz page's own unpickler (MemoryViz.js) handles.
page_reads = {"PROTO", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST", "TUPLE",
              "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "NONE", "NEWTRUE",
              "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
              "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MEMOIZE", "FRAME"}
used = {op.name for op, _, _ in pickletools.genops(data)}
assert used <= page_reads, used - page_reads
s = pickle.loads(data)
assert set(s) == {"segments", "device_traces", "allocator_settings", "vramlab"}, list(s)
segs, trace = s["segments"], s["device_traces"]
assert len(trace) == 1
seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
            "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
for seg in segs:
    assert set(seg) == seg_keys, sorted(seg)
    (b,) = seg["blocks"]
    assert set(b) == {"address", "size", "requested_size", "state", "frames"}
    assert b["address"] == seg["address"] and b["size"] == seg["total_size"]
out = {
    "segments": [(g["address"], g["total_size"], g["segment_type"], g["frames"][0]["name"]) for g in segs],
    "actions": [e["action"] for e in trace[0]],
    "names": [e["frames"][0]["name"] for e in trace[0]],
    "first": trace[0][0],
    "vramlab": s["vramlab"],
}
checked = ["pickle"]
try:
    from torch.cuda import _memory_viz as mv
except Exception:
    mv = None
if mv is not None:
    mv.segsum(s)
    mv.trace(s)
    mv.segments(s, format_flamegraph=lambda lines: lines)
    mv.memory(s, format_flamegraph=lambda lines: lines)
    assert "snapshot.pickle" in mv.trace_plot(s) and "snapshot.pickle" in mv.segment_plot(s)
    checked.append("torch.cuda._memory_viz")
out["checked"] = checked
print(json.dumps(out))
"#;
        let out = match std::process::Command::new(&python).arg("-c").arg(script).arg(&path).output() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("checked the pickle's bytes only: cannot run {python} ({e})");
                return;
            }
        };
        assert!(out.status.success(), "{python}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("{python} read the snapshot: {stdout}");
        let big = 0x7f12_3500_0000u64;
        let expect_segments = format!(r#""segments": [[0, 900, "small", "{PREEXISTING}"], [{big}, 3145728, "large", "backward"]]"#);
        assert!(stdout.contains(&expect_segments), "{stdout}");
        let actions = r#""actions": ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed", "segment_free", "free_requested", "free_completed", "segment_free"]"#;
        assert!(stdout.contains(actions), "{stdout}");
        assert!(stdout.contains(r#""names": ["forward", "forward", "backward", "backward", "optimizer", "optimizer", "optimizer", "optimizer [other thread]""#), "{stdout}");
        let first = format!(r#""first": {{"action": "segment_alloc", "addr": {}, "size": 4096, "stream": 0, "time_us": 1, "frames": [{{"filename": "vramlab", "line": 0, "name": "forward"}}]}}"#, 0x7f12_3400_1000u64);
        assert!(stdout.contains(&first), "{stdout}");
        assert!(stdout.contains(r#""peak_live_bytes_replayed": 3150824"#), "{stdout}");
    }
}
