"""The Triton kernel variants that a set of small calls launches compile for a GPU (sm_90) on this
CPU machine.

The interpreter runs a kernel's Python and lets through what the compiler rejects (a variable that
changes type inside a branch, which an H200 run of the chunk-sweep refactor found, GPU_NOTES 53).
This test records the launches of a set of small calls that reach every kernel family (forward,
beta and Viterbi on the register and memory rings, sequential and time-parallel, with 32- and
64-bit offsets; (K, C, C) transitions; the blocked engine with linear, residue-class and log-space
block sums, its helper programs (32- and 64-bit offsets), its marginal tiles and the max semiring's tile bounds; masks, entropy, samples, k-best; the dense recurrences) and
compiles each distinct variant for ``cuda:90`` in a process without the interpreter
(``compile_kernels.py``): to Triton IR, where type and shape errors surface, or with
``TSM_COMPILE_FULL=1`` down to the cubin (LLVM and Triton's ptxas run on the CPU too)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from compile_kernels import record_launches  # noqa: E402
from kernel_cases import adversarial, inputs, validated  # noqa: E402
from torch_semimarkov import (  # noqa: E402
    semi_crf_streaming_entropy,
    semi_crf_streaming_forward,
    semi_crf_streaming_sample,
    semi_crf_streaming_topk,
    semi_crf_streaming_viterbi,
)
from torch_semimarkov.engines import select  # noqa: E402
from torch_semimarkov.engines.triton import launch  # noqa: E402
from torch_semimarkov.engines.triton import plan as plan_mod  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records the interpreter's launches"),
]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
def _launch_all(v, semiring_list=("log", "max"), time_parallel=True, wide=False):
    """Forward and beta (log), forward and Viterbi (max); ``wide``: with 64-bit offsets (``idx64``,
    the plan of (T+1)·C near 2^31), whose integer types the interpreter does not check."""
    for sr in semiring_list:
        p = launch.plan_for(v.cum_scores, v.transition, v.K, sr, time_parallel=time_parallel)
        if wide:
            p = dataclasses.replace(p, idx64=True)
        z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, sr,
                                         v.proj_start, v.proj_end, plan=p)
        if sr == "log":
            launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                   v.proj_end, plan=p, state=state)
        else:
            launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                  v.proj_end, plan=p)


def test_every_kernel_variant_compiles_for_sm90(monkeypatch, tmp_path):
    """One sequence per call, as short as still takes several chunks (blocks): a variant is its
    kernel, argument types, constexprs and warps, none of which depends on B or T, so these
    calls recorded the same 155 variants, in the same order, as calls of 2-3 sequences of 12-17
    positions did (checked by comparing the two records, before the helper programs' variants were
    added), and the compile check is the same; the interpreter's part took 19.6 s with those and
    8 s with these."""
    records = record_launches(monkeypatch.setattr)
    cc = (1, 7, 4, 5, "ragged", "both", False)
    kcc = (1, 7, 3, 3, "ragged", "both", True)
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 5)
    for case in (cc, kcc):
        for wide in (False, True):
            _launch_all(validated(inputs(case, seed=1)), time_parallel=False, wide=wide)  # sequential
            _launch_all(validated(inputs(case, seed=1)), wide=wide)                         # time-parallel
    monkeypatch.setattr(plan_mod, "FORCE_MEMORY_RING", True)
    _launch_all(validated(inputs(cc, seed=2)), time_parallel=False)
    monkeypatch.setattr(plan_mod, "K_BLOCK_OVERRIDE", 2)
    _launch_all(validated(inputs(cc, seed=2)), time_parallel=False)
    monkeypatch.setattr(plan_mod, "FORCE_MEMORY_RING", False)
    monkeypatch.setattr(plan_mod, "K_BLOCK_OVERRIDE", None)
    # the blocked engine: linear (one shift, residue classes) and log-space block sums, both marginals
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    monkeypatch.setattr(plan_mod, "BLOCK_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "MARG_OVERRIDE", (4, 4, 2))
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 6)
    for linear, marg, semirings in ((None, "tiled", ("log", "max")), (3, "tiled", ("log",)), (False, "position", ("log",))):
        # the max semiring sums term by term whatever the block-sum setting: its variants once
        monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", linear)
        monkeypatch.setattr(plan_mod, "BLOCKED_MARGINALS", marg)
        _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), semirings)
        if linear is None:
            _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), semirings, wide=True)
    # the blocked engine's runs with helper programs (the GPU's handshake, not the interpreter's inline part)
    monkeypatch.setattr(plan_mod, "BLOCKED_LINEAR", None)
    monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", 2)
    monkeypatch.setattr(plan_mod, "HELP_INLINE", False)
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("log", "max"))
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("log", "max"), wide=True)
    # and helpers that split the rows as well (two parts of 4 rows, each helper every label tile)
    monkeypatch.setattr(plan_mod, "HELPER_SPLIT_OVERRIDE", (1, 2, 4))
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("log", "max"))
    # the max semiring's tile bounds (plan.MAX_BOUNDS), with helpers and without, 32- and 64-bit
    monkeypatch.setattr(plan_mod, "MAX_BOUNDS", True)
    monkeypatch.setattr(plan_mod, "MAX_BOUND_PHASES", (1, 2, 3))
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("max",))
    monkeypatch.setattr(plan_mod, "HELPER_SPLIT_OVERRIDE", None)
    monkeypatch.setattr(plan_mod, "HELPERS_OVERRIDE", None)
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("max",))
    _launch_all(validated(adversarial("frame", 1, 9, 4, 3, seed=5)), ("max",), wide=True)
    monkeypatch.setattr(plan_mod, "MAX_BOUNDS", False)
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", False)
    # masks, entropy, samples and k-best on the engine's kernels
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    inp = inputs((1, 8, 4, 3, "ragged", "both", False), seed=3)
    lm = torch.ones(1, 8, 3, dtype=torch.bool)
    lm[:, 5, 0] = False
    semi_crf_streaming_viterbi(**inp, label_mask=lm, backend="triton")
    semi_crf_streaming_entropy(**inp, backend="triton")
    semi_crf_streaming_entropy(**inp, label_mask=lm, backend="triton")
    semi_crf_streaming_sample(**inp, num_samples=2, backend="triton", generator=torch.Generator().manual_seed(0))
    semi_crf_streaming_topk(**inp, k=2, backend="triton")
    semi_crf_streaming_topk(**inp, k=5, backend="triton")
    grad_inp = dict(inp, cum_scores=inp["cum_scores"].clone().requires_grad_(True))
    semi_crf_streaming_entropy(**grad_inp, backend="triton").sum().backward()  # the entropy kernels
    # the entropy's gradient of a ring too large for registers: the blocked engine's rows, then the
    # recurrences with their ring in memory (MEM), masked too
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", True)
    semi_crf_streaming_entropy(**grad_inp, backend="triton").sum().backward()
    semi_crf_streaming_entropy(**grad_inp, label_mask=lm, backend="triton").sum().backward()
    monkeypatch.setattr(plan_mod, "FORCE_BLOCKED", False)
    # a (K, C, C) transition: masks on the direct recurrence (forward, beta, marginals, Viterbi), the
    # entropy's value (masked too) and its gradient (the ENT variants of the chunk, anchor and
    # marginal kernels), two chunks each (chunks of 6)
    kin = inputs((1, 8, 3, 3, "ragged", "both", True), seed=4)
    kgrad = dict(kin, cum_scores=kin["cum_scores"].clone().requires_grad_(True))
    semi_crf_streaming_viterbi(**kin, label_mask=lm, backend="triton")
    semi_crf_streaming_forward(**kgrad, label_mask=lm, backend="triton").sum().backward()
    with torch.no_grad():
        semi_crf_streaming_entropy(**kin, backend="triton")
        semi_crf_streaming_entropy(**kin, label_mask=lm, backend="triton")
    semi_crf_streaming_entropy(**kgrad, backend="triton").sum().backward()
    semi_crf_streaming_entropy(**kgrad, label_mask=lm, backend="triton").sum().backward()
    # the dense recurrences (CUDA's path for the float64 model of masked calls)
    from test_kernels_dense import _model
    from torch_semimarkov.engines.triton.dense import run_dense

    for direct, masked in ((False, True), (True, False)):
        m = _model(1, 6, 3, 3, direct, True, masked, 0, "cpu")
        for direction in ("alpha", "beta"):
            run_dense(m, direction, expect=True)
            run_dense(m, direction, expect=True, factored_off=True)
    assert len(records) >= 20, [r["name"] for r in records]
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(records))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, os.path.join(HERE, "compile_kernels.py"), str(path)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"compiled {len(records)} of {len(records)}" in res.stdout, res.stdout[-2000:]
