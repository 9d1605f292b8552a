"""Probe (issue 23): where the numba engine's cold compilation goes. As a pytest plugin it records
numba's compile events (each function and signature compiled, its seconds, its nesting level) and
writes them per process; run as a script it sums them.

    rm -rf /tmp/nbcache && NUMBA_CACHE_DIR=/tmp/nbcache PYTHONPATH=benchmarks/probes \\
        python -m pytest -q -p no:xdist -p numba_compile_profile -o addopts="" -k numba tests
    python benchmarks/probes/numba_compile_profile.py        # the totals, the top-level kernels,
                                                              # and numba's own error paths compiled

Measured on this 2-core machine (one process, cold cache): 10 top-level kernels, 63.3 s of
compilation, of which numba's shape-error path of array assignments and transposes
(``ol_raise_with_shape_context_cpu``, formatted messages) was compiled once per signature;
after the engine copied rows element by element (``common.put``): 51.5 s, none of them.
"""
import atexit
import glob
import json
import os
import sys
import time

OUT = os.environ.get("NUMBA_COMPILE_PROFILE_DIR", "/tmp")
_recs = []


def _install():
    from numba.core import event

    class Recorder(event.Listener):
        def __init__(self):
            self.started = []

        def on_start(self, ev):
            self.started.append(time.perf_counter())

        def on_end(self, ev):
            t0 = self.started.pop()
            data = ev.data or {}
            disp = data.get("dispatcher")
            name = getattr(getattr(disp, "py_func", None), "__qualname__", None) or str(disp)
            _recs.append((name, str(data.get("args")), time.perf_counter() - t0, len(self.started)))

    event.register("numba:compile", Recorder())
    atexit.register(lambda: json.dump(_recs, open(os.path.join(OUT, f"numba_compile_{os.getpid()}.json"), "w")))


def pytest_configure(config):
    _install()


def main():
    for path in sorted(glob.glob(os.path.join(OUT, "numba_compile_*.json"))):
        recs = json.load(open(path))
        top = [r for r in recs if r[3] == 0]
        if not top:
            continue
        errors = [(n, round(d, 2)) for n, _, d, _ in recs if "raise_with_shape" in n or "ol_str" in n]
        print(f"{path}: {len(top)} top-level compilations, {sum(r[2] for r in top):.1f} s")
        for n, _, d, _ in sorted(top, key=lambda r: -r[2]):
            print(f"  {d:6.2f} s  {n}")
        print("  numba error paths compiled:", errors or "none")


if __name__ == "__main__":
    sys.exit(main())
