"""One case list and the helpers every Triton-kernel test shares (``tests/test_kernels_*.py``).

The tests run through Triton's interpreter on the CPU when there is no GPU (CI; ``conftest.py``
sets ``TRITON_INTERPRET=1`` before anything imports Triton) and compiled on CUDA when there is one:
``DEVICE`` is where the inputs live. Sizes are small: the interpreter runs every tile operation in
NumPy. Each case runs through the sequential engine and, where it applies, the time-parallel one
with short chunks (several chunks, fix-ups and repairs even at T = 20).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import case_id, make_inputs

pytest.importorskip("triton")

from torch_semimarkov.engines.triton import launch, plan as plan_mod  # noqa: E402
from torch_semimarkov.core.validation import validate_streaming_inputs  # noqa: E402
from torch_semimarkov.engines import select  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (B, T, K, C, lengths, proj, duration_transitions)
CASES = [
    (2, 7, 3, 3, None, "none", False),
    (3, 9, 4, 5, "ragged", "both", False),
    (2, 6, 8, 3, None, "none", False),  # K > T
    (2, 7, 1, 3, None, "start", False),  # K = 1
    (3, 12, 2, 7, "ragged", "end", False),  # K = 2, C = 7
    (1, 1, 3, 2, None, "none", False),  # T = 1
    (4, 20, 5, 6, [20, 1, 13, 7], "both", False),  # a length-1 sequence in the batch
    (2, 8, 3, 3, "ragged", "both", True),  # (K, C, C)
    (2, 5, 7, 2, None, "none", True),  # (K, C, C), K > T
    (2, 6, 1, 5, None, "none", True),  # (K, C, C), K = 1
    (3, 14, 5, 3, [14, 1, 4], "both", True),  # (K, C, C), a length-1 sequence and one shorter than K
]
IDS = [case_id(B, T, K, C, "ragged" if lens else "", proj if proj != "none" else "", "KCC" if kcc else "")
       for B, T, K, C, lens, proj, kcc in CASES]


def to_device(inp):
    return {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}


def inputs(case, dtype=torch.float32, seed=0, **kw):
    B, T, K, C, lens, proj, kcc = case
    return make_inputs(B, T, K, C, dtype=dtype, seed=seed, lengths=lens, proj=proj, duration_transitions=kcc, **kw)


def validated(inp, semiring="log"):
    return validate_streaming_inputs(**to_device(inp), semiring=semiring)


def plan_of(v, semiring, engine, **kw):
    """The plan for an engine fixture value, ``"sequential"`` or ``"parallel"``; skips the cases
    the time-parallel engine does not run (one chunk, or no register ring)."""
    parallel = engine == "parallel"
    try:
        p = launch.plan_for(v.cum_scores, v.transition, v.K, semiring, time_parallel=parallel, **kw)
    except ValueError as exc:
        pytest.skip(str(exc))
    if parallel and not p.time_parallel:
        pytest.skip("a single chunk: the time-parallel engine is the sequential one here")
    if p.kind == "dur" and (plan_mod.FORCE_MEMORY_RING or plan_mod.K_BLOCK_OVERRIDE is not None):
        pytest.skip("(K, C, C) transitions run the same kernels whatever the ring fixture says")
    return p


def cpu(t):
    return None if t is None else t.detach().cpu()


def run_forward(v, semiring="log", engine="sequential", **kw):
    plan = plan_of(v, semiring, engine)
    z, state = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, semiring,
                                     v.proj_start, v.proj_end, plan=plan, **kw)
    return z, state, plan


def run_backward(v, engine="sequential"):
    z, state, plan = run_forward(v, "log", engine)
    out = launch.launch_backward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                 v.proj_end, plan=plan, state=state)
    return z, out


def run_viterbi(v, engine="sequential"):
    plan = plan_of(v, "max", engine)
    return launch.launch_viterbi(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K, v.proj_start,
                                 v.proj_end, plan=plan)


def adversarial(kind: str, B: int, T: int, K: int, C: int, seed: int = 0, dtype=torch.float32, kcc: bool = False):
    """Models the fix-up cannot rely on converging.

    * ``"cyclic"``: only c -> c+1 (mod C) is allowed and long segments are preferred;
    * ``"frame"``: a reading-frame grammar, label 0 only in multiples of 3, 0 -> 1 -> 2 -> 0 and
      0 -> 0, every other move -inf.

    ``kcc``: a (K, C, C) transition, the same grammar for every duration with duration-dependent
    scores on its allowed moves.
    """
    inp = make_inputs(B, T, K, C, lengths="ragged", proj="none", seed=seed, dtype=dtype, scale=0.3)
    tr = torch.full((C, C), -math.inf, dtype=dtype)
    if kind == "cyclic":
        for c in range(C):
            tr[c, (c + 1) % C] = 0.0
        inp["duration_bias"] = (torch.arange(1, K + 1, dtype=dtype)[:, None] * 0.5).expand(K, C).contiguous()
    else:
        assert kind == "frame" and C >= 3
        tr[0, 1] = tr[1, 2] = tr[2, 0] = tr[0, 0] = 0.0
        db = torch.zeros(K, C, dtype=dtype)
        for k in range(1, K + 1):
            if k % 3:
                db[k - 1, 0] = -math.inf
        inp["duration_bias"] = db
    if kcc:
        k = torch.arange(1, K + 1, dtype=dtype)[:, None, None]
        tr = torch.where(torch.isfinite(tr)[None], 0.1 * (k % 3), tr[None]).contiguous()
    inp["transition"] = tr
    return inp


def recording_engine(monkeypatch, chunk: int, module, name: str) -> list:
    """Let the engine paths beyond log Z run on CPU tensors (the interpreter), with chunks of
    ``chunk`` positions, and record whether ``module.<name>`` (a function of an API module, as
    that module calls it) took each call (its result is not None): the list it returns grows by
    one bool per call."""

    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", chunk)
    calls = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(module, name, recording)
    return calls


def record_outputs(monkeypatch, module, name: str) -> list:
    """Wrap ``module.<name>`` (a function as that module calls it, e.g. ``launch.forward_chunked``)
    so that the output of each call is appended to the list returned: a test reads what a launcher
    computed internally (the fix-up's :class:`~.parallel.ChunkStats`, every position's state)
    instead of running the same kernels a second time to get it."""
    outputs = []
    real = getattr(module, name)

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        outputs.append(out)
        return out

    monkeypatch.setattr(module, name, recording)
    return outputs
