"""CPU probe (issue 23): one interpreted launch of the blocked engine's forward (Triton's
interpreter, a small forced case) timed from callers at several stack depths, with and without
the test conftest's ``_stack_room`` (a frame that opens a CPython data-stack chunk of its own).
Without it the same launch (the same Python calls) ran 2-3x slower at some depths: a call on a
16 KiB chunk's edge inside a hot loop maps and frees a chunk at every call.

    TRITON_INTERPRET=1 python benchmarks/probes/stack_depth.py [OUT.json]
"""
import json
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "engines", "triton")]
os.environ["TSM_STACK_ROOM"] = "0"  # the conftest's launches as Triton's own; the room is added below

import conftest  # noqa: E402  (the interpreter patches)
from kernel_cases import inputs, validated  # noqa: E402

from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402


def main(out=None):
    plan_mod.FORCE_BLOCKED, plan_mod.BLOCK_OVERRIDE, plan_mod.CHUNK_OVERRIDE = True, (4, 4, 2), 4
    v = validated(inputs((4, 20, 5, 6, "ragged", "both", False), seed=2))
    p = launch.plan_for(v.cum_scores, v.transition, v.K, "log")
    args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, "log", v.proj_start, v.proj_end)
    room = conftest._stack_room()

    def once(use_room):
        t0 = time.perf_counter()
        if use_room:
            room(launch.launch_forward, args, {"plan": p})
        else:
            launch.launch_forward(*args, plan=p)
        return time.perf_counter() - t0

    def nest(n, use_room):
        if n == 0:
            return once(use_room)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = 0.0  # a frame of some size
        return nest(n - 1, use_room) + a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9

    once(False)  # the interpreter's first launch (rewrites) out of the timings
    res = {}
    for use_room in (False, True):
        res["room" if use_room else "plain"] = row = {}
        for depth in (0, 10, 20, 30, 40, 60, 80):
            row[depth] = round(nest(depth, use_room), 3)
        print("room" if use_room else "plain", row, flush=True)
    if out:
        json.dump({"seconds_by_caller_depth": res, "python": sys.version}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
