"""Check a vramlab memory-timeline snapshot with Python's pickle and torch's own reader.

usage: python check_snapshot.py SNAPSHOT.pickle [OUT_DIR]

Loads the file with `pickle`, checks that it only uses opcodes the memory_viz page's unpickler
(MemoryViz.js) reads, replays the trace to its highest live bytes, and runs the readers of
`torch.cuda._memory_viz` on it (`segsum`, `trace`, `segments`, `memory`, `trace_plot`,
`segment_plot`); with OUT_DIR, writes the two HTML views there (they load the page's script
from a CDN when opened).
"""

import pickle
import pickletools
import sys

PAGE_READS = {
    "PROTO", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST", "TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "NONE", "NEWTRUE",
    "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE",
    "BINUNICODE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MEMOIZE", "FRAME",
}


def main(path, out_dir=None):
    data = open(path, "rb").read()
    used = {op.name for op, _, _ in pickletools.genops(data)}
    assert used <= PAGE_READS, f"opcodes the page cannot read: {used - PAGE_READS}"
    snap = pickle.loads(data)
    meta = snap["vramlab"]
    trace = snap["device_traces"][0]
    counts = {}
    for e in trace:
        counts[e["action"]] = counts.get(e["action"], 0) + 1
    print(f"{path}: {len(data)} bytes, opcodes {sorted(used)}")
    print(f"segments {len(snap['segments'])}, trace entries {len(trace)}: {counts}")

    # Replay: the live bytes at the start, then every alloc / free_completed of the file.
    live = peak = meta["live_bytes_at_start"]
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    print(f"replayed from the file: peak {peak}, end {live}; recorded: {meta}")

    from torch.cuda import _memory_viz as mv

    flame = lambda lines: lines  # noqa: E731  (no flamegraph.pl download)
    stats = mv.segsum(snap)
    print("segsum:", " | ".join(l for l in stats.splitlines() if l.startswith(("segments:", "total_"))))
    print("trace:", mv.trace(snap).splitlines()[1:4], "...")
    print("segments:", len(mv.segments(snap, format_flamegraph=flame).splitlines()), "flamegraph lines")
    print("memory:", len(mv.memory(snap, format_flamegraph=flame).splitlines()), "flamegraph lines")
    views = {"trace_plot": mv.trace_plot(snap), "segment_plot": mv.segment_plot(snap)}
    for name, html in views.items():
        assert "snapshot.pickle" in html
        print(f"{name}: {len(html)} bytes of HTML")
        if out_dir:
            with open(f"{out_dir}/{name}.html", "w") as f:
                f.write(html)


if __name__ == "__main__":
    main(*sys.argv[1:])
