"""Compile every Triton kernel the launchers use for an H100/H200 (sm_90), without a GPU.

Triton's interpreter (how CI runs the kernels) accepts code that the compiler rejects (a global
that is not a constexpr, a loop-carried variable that changes type). This runs the launchers on
CPU tensors with a stand-in driver that compiles each kernel variant to a cubin with the ptxas
that ships with Triton and launches nothing, so such errors show up without device time.

    python scripts/compile_check.py      # exit 1 if any kernel fails to compile
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback

os.environ.pop("TRITON_INTERPRET", None)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


class _CompileOnlyDriver:
    """Just enough of a driver for JITFunction.run to compile: device 0, stream 0, sm_90."""

    def __init__(self, real):
        self._real = real

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(self._real, name)


compiled, failed = [], []


def _run(self, *args, grid, warmup, **kwargs):
    name = self.fn.__name__
    try:
        _orig_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(name)
    except Exception as exc:  # noqa: BLE001 - collected and reported
        failed.append((name, exc))
        traceback.print_exc(limit=1)
    return None


def args_of(v):
    return (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)


def main():
    global _orig_run
    try:
        real = driver.active
    except Exception:  # noqa: BLE001 - no CUDA driver on this machine
        real = None
    driver.set_active(_CompileOnlyDriver(real))
    _orig_run = JITFunction.run
    JITFunction.run = _run

    from torch_semimarkov.engines.triton import launch, plan as plan_mod
    from torch_semimarkov.core.validation import validate_streaming_inputs

    # (B, T, K, C, (K, C, C) transition, projections); the (K, C, C) ones compile the sequential and the
    # time-parallel direct recurrence (K = 1, every projection variant)
    cases = [(2, 300, 12, 6, False, "both"), (1, 5000, 64, 24, False, "none"), (2, 400, 200, 9, False, "end"),
             (2, 80, 6, 5, True, "both"), (3, 200, 1, 5, False, "start"), (2, 300, 1, 3, True, "none"),
             (1, 500, 20, 8, True, "start"), (1, 400, 12, 24, True, "end")]
    for B, T, K, C, kcc, proj in cases:
        cum = torch.nn.functional.pad(torch.randn(B, T, C).cumsum(1), (0, 0, 1, 0))
        tr = torch.randn((K, C, C) if kcc else (C, C))
        ps = torch.randn(B, T, C) if proj in ("start", "both") else None
        pe = torch.randn(B, T, C) if proj in ("end", "both") else None
        lengths = torch.tensor([T] + [max(1, T // 2)] * (B - 1))
        v = validate_streaming_inputs(cum, tr, torch.randn(K, C), lengths, K, proj_start=ps, proj_end=pe)
        args = (v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K)
        # the ring setting does not change the (K, C, C) kernels
        for force_mem in (False,) if kcc else (False, True):
            plan_mod.FORCE_MEMORY_RING = force_mem
            for parallel in (False, True):
                for semiring in ("log", "max"):
                    try:
                        p = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=parallel)
                    except ValueError:
                        continue
                    # int32 indexing, and the int64 variant that sequences past 2^31 / C need
                    for plan in (p, dataclasses.replace(p, idx64=True)):
                        with torch.no_grad():
                            if semiring == "max":
                                launch.launch_viterbi(*args, v.proj_start, v.proj_end, plan=plan)
                                continue
                            z, state = launch.launch_forward(*args, "log", v.proj_start, v.proj_end, plan=plan)
                            launch.launch_backward(*args, v.proj_start, v.proj_end, plan=plan, state=state)
        plan_mod.FORCE_MEMORY_RING = False
    # partial labels and constraints: the time-parallel kernels with segment limits
    from torch_semimarkov.engines import select
    select.ENGINE_ON_CPU = True
    for B, T, K, C in [(2, 300, 12, 6), (1, 5000, 64, 24)]:
        cum = torch.nn.functional.pad(torch.randn(B, T, C).cumsum(1), (0, 0, 1, 0))
        v = validate_streaming_inputs(cum, torch.randn(C, C), torch.randn(K, C), torch.tensor([T] * B), K)
        lm = torch.rand(B, T, C) < 0.9
        bm = torch.zeros(B, T, dtype=torch.int8)
        bm[:, ::7] = -1
        for semiring in ("log", "max"):
            plan, masks, ps = select.engine_masks(v, lm, bm, semiring)
            with torch.no_grad():
                if semiring == "max":
                    launch.launch_viterbi(*args_of(v), ps, None, plan=plan, masks=masks)
                    continue
                z, state = launch.launch_forward(*args_of(v), "log", ps, None, plan=plan, masks=masks)
                launch.launch_backward(*args_of(v), ps, None, plan=plan, state=state, masks=masks)
        # the limits kernel with one of the two masks
        from torch_semimarkov.engines.triton.limits import engine_limits
        for only in ((lm, None), (None, bm)):
            engine_limits(*only, B, T, C, K, "cpu")
    select.ENGINE_ON_CPU = False
    # the sampling walk (the traceback kernel with drawn steps)
    from torch_semimarkov.engines.triton import parallel
    for B, T, K, C in [(2, 300, 12, 6), (1, 5000, 64, 24), (2, 400, 200, 9)]:
        cum = torch.nn.functional.pad(torch.randn(B, T, C).cumsum(1), (0, 0, 1, 0))
        v = validate_streaming_inputs(cum, torch.randn(C, C), torch.randn(K, C), torch.tensor([T] * B), K)
        saved = torch.zeros(2, B, T + 1, C)
        frames = torch.zeros(B, T + 1, dtype=torch.float64)
        with torch.no_grad():
            parallel.sample_chunked(saved, frames, v.cum_scores, v.transition, v.duration_bias, v.lengths,
                                    torch.rand(3 * B, T + 1, 2), v.K, max(v.K, 64))
    # the k-best in-edge selection (streaming/kbest.py)
    from torch_semimarkov.engines.triton.kbest import in_edges
    for B, T, K, C, k, proj in [(2, 300, 12, 6, 5, True), (1, 5000, 64, 24, 5, False)]:
        a = torch.randn(B, T + 1, C).double()
        p = torch.randn(B, T, C).double() if proj else None
        in_edges(a, a.clone(), p, p, torch.randn(C, C).double(), torch.randn(K, C).double(),
                 torch.zeros(B, T + 1, C, dtype=torch.int32), torch.full((B,), T), K, k)
    # the dense recurrences of engines/torch/dense.py (k-best, samples, entropy, masks)
    from torch_semimarkov.streaming import distribution as dist
    from torch_semimarkov.engines.triton.dense import run_dense
    for B, T, K, C, kcc, masked in [(2, 50, 12, 6, False, False), (2, 50, 100, 24, True, True)]:
        cum = torch.nn.functional.pad(torch.randn(B, T, C).cumsum(1), (0, 0, 1, 0)).double()
        tr = torch.randn((K, C, C) if kcc else (C, C)).double()
        v = validate_streaming_inputs(cum, tr, torch.randn(K, C).double(), torch.tensor([T, T // 2]), K)
        masks = dist.check_masks(torch.rand(B, T, C) < 0.9, torch.zeros(B, T, dtype=torch.long), B, T, C, "cpu") \
            if masked else (None, None)
        model = dist._Model(v, *masks)
        for which in ("alpha", "beta"):
            for expect in (False, True):
                run_dense(model, which, expect)
    print(f"{len(compiled)} kernel launches compiled for {TARGET}; {len(failed)} failed")
    for name, exc in failed:
        print(f"FAILED {name}: {type(exc).__name__}: {str(exc)[:2000]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
