"""GPU probe: where the host keeps the GPU waiting in one forward+backward (and Viterbi) at a
genomics shape, without the profiler (whose per-op tracing inflates host gaps).

Every Triton launch of the engine's kernels is wrapped: a CUDA event on the launching stream
before and after it, and the host clock at the call. On a GPU that is idle when the call starts,
an event before a launch fires when the host gets there, so ``gpu_start - previous gpu_end``
is time the GPU waited for the host. Prints one iteration's launches (after warm-up) and the
medians over iterations of: the call's time, the time before the first launch, and the sum of
idle gaps between launches.

    python benchmarks/probes/host_gaps.py OUT.json "32,3000,960,47;16,20000,960,47" [iters]

``HOST_MARKS_API=1`` also marks the public call's steps before the operator (the input checks of
``streaming_inputs``, ``route``, the value statistics and their test).
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_common import public_calls  # noqa: E402

from torch_semimarkov.engines.triton import beta, blocked, forward, marginals, traceback  # noqa: E402

RECORDS = []


class _Timed:
    """A Triton kernel whose launches record (name, phase, host ms, event before, event after)."""

    def __init__(self, kernel, name):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kw):
            s = torch.cuda.current_stream()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(s)
            t = time.perf_counter()
            out = launch(*args, **kw)
            e1.record(s)
            RECORDS.append((self.name, kw.get("PHASE", ""), t, e0, e1, s.stream_id))
            return out
        return run


try:
    from torch_semimarkov.engines.triton import tables as _tables
except ImportError:  # a tree before the one-kernel tables
    _tables = None

for mod in (blocked, marginals, forward, beta, traceback, _tables):
    for name in dir(mod) if mod is not None else ():
        if name.startswith("_") and name.endswith("_kernel"):
            setattr(mod, name, _Timed(getattr(mod, name), name))


MARKS = []


def _marked(mod, name):
    """Wrap ``mod.name`` so that each call records (name, host entry, host exit)."""
    real = getattr(mod, name)

    def run(*args, **kw):
        t = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            MARKS.append((name, t, time.perf_counter()))
    setattr(mod, name, run)


def _mark_host():
    """The host-side steps before and between the launches (entry / exit times, ms)."""
    from torch_semimarkov import ops
    from torch_semimarkov.engines.triton import launch, parallel
    try:
        from torch_semimarkov.engines.triton import tables
    except ImportError:  # a tree before the one-kernel tables
        tables = None
    for mod, names in ((ops, ("check_input_values",)),
                       (launch, ("launch_forward", "launch_backward", "plan_for", "_blk_tiles", "_blk_anchors",
                                 "_blk_segments")),
                       (parallel, ("linear_period", "linear_duration_tables", "_blocked_period", "_chunk_state",
                                   "forward_offsets", "backward_offsets")),
                       (tables, ("duration_tables",))):
        for name in names:
            if mod is not None and hasattr(mod, name):
                _marked(mod, name)
    if hasattr(launch, "blocked_forward_beta"):
        _marked(launch, "blocked_forward_beta")
    if os.environ.get("HOST_MARKS_API") == "1":
        # the public call's own steps before the operator (HOST_MARKS_API=1)
        from torch_semimarkov.api import partition
        from torch_semimarkov.core import values
        for mod, names in ((partition, ("streaming_inputs", "route")), (values, ("value_stats", "check_value_stats"))):
            for name in names:
                if hasattr(mod, name):
                    _marked(mod, name)


_mark_host()


def one(fn):
    RECORDS.clear()
    MARKS.clear()
    torch.cuda.synchronize()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    t0 = time.perf_counter()
    fn()
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    t_host = time.perf_counter()
    torch.cuda.synchronize()
    rows = []
    for name, phase, t, e0, e1, sid in RECORDS:
        rows.append([name + (f":{phase}" if phase != "" else ""), sid, round((t - t0) * 1e3, 3),
                     round(ev.elapsed_time(e0), 3), round(ev.elapsed_time(e1), 3)])
    marks = [[name, round((a - t0) * 1e3, 3), round((b - t0) * 1e3, 3)] for name, a, b in MARKS]
    total = ev.elapsed_time(end)
    first = rows[0][3] if rows else total
    # idle: GPU time covered by no launch (the union of [start, end] intervals on all streams)
    spans = sorted((r[3], r[4]) for r in rows)
    covered, cur = 0.0, None
    for a, b in spans:
        if cur is None or a > cur[1]:
            if cur is not None:
                covered += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur is not None:
        covered += cur[1] - cur[0]
    return {"total_ms": total, "host_ms": (t_host - t0) * 1e3, "first_launch_ms": first,
            "idle_ms": total - covered, "launches": rows,
            "host_marks": sorted(marks, key=lambda m: m[1])}


def main():
    out, shapes = sys.argv[1], sys.argv[2]
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 7
    res = {"device": torch.cuda.get_device_name(), "shapes": {}}
    for s in shapes.split(";"):
        fwdbwd, viterbi, _ = public_calls(s)

        res["shapes"][s] = {}
        for name, fn in (("fwdbwd", fwdbwd), ("viterbi", viterbi)):
            for _ in range(2):
                one(fn)
            runs = [one(fn) for _ in range(iters)]
            med = {k: statistics.median(r[k] for r in runs) for k in ("total_ms", "host_ms", "first_launch_ms",
                                                                        "idle_ms")}
            res["shapes"][s][name] = {"median": med, "one": runs[len(runs) // 2]}
            print(s, name, {k: round(v, 3) for k, v in med.items()}, flush=True)
            for r in runs[len(runs) // 2]["launches"]:
                print("   ", r, flush=True)
            for r in runs[len(runs) // 2]["host_marks"]:
                print("      host", r, flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
