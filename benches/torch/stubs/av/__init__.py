"""A stand-in for PyAV, only so that `import lerobot...` succeeds where PyAV is not installed.

lerobot 0.4.4's `lerobot.datasets.video_utils` imports `av` at module level and reads
`av.logging.WARNING` in a default argument; the benches never decode or encode video. Anything
that would do real video I/O raises a RuntimeError saying so. benches/torch/baseline.py puts
this directory on sys.path only when the real `import av` fails (or VRAMLAB_BENCH_AV_STUB=1).
"""

import sys
import types

__version__ = "0+vramlab.stub"
IS_VRAMLAB_STUB = True


class _Unavailable(RuntimeError):
    pass


def _unavailable(*_args, **_kwargs):
    raise _Unavailable("PyAV is not installed; this is vramlab's import-only stand-in (benches/torch/stubs/av)")


open = _unavailable  # noqa: A001  (PyAV's own name)

# FFmpeg's log levels, as PyAV exposes them.
logging = types.ModuleType("av.logging")
for _name, _level in [("PANIC", 0), ("FATAL", 8), ("ERROR", 16), ("WARNING", 24), ("INFO", 32),
                      ("VERBOSE", 40), ("DEBUG", 48), ("TRACE", 56)]:
    setattr(logging, _name, _level)
logging.set_level = lambda *_a, **_k: None
logging.get_level = lambda: logging.WARNING
logging.restore_default_callback = lambda *_a, **_k: None
sys.modules["av.logging"] = logging


def __getattr__(name):
    # av.codec, av.video, av.VideoFrame, av.time_base, ...: reached by real video I/O, or by a
    # library probing PyAV (torchvision.io reads av.video inside `try: ... except ImportError`),
    # hence ImportError: "PyAV is not available".
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"av.{name}: PyAV is not installed; this is vramlab's import-only stand-in (benches/torch/stubs/av)")
