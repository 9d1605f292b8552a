"""The engine's sampling walk (``kernels/traceback.py`` with ``SAMPLE``, ``kernels/parallel.py``
``sample_chunked``) against a step-by-step reference and against the enumerated distribution.

Three links make the kernel exact:

1. the two-stage step (label of the previous segment, then its duration) from the forward's stored
   rows gives every segmentation exactly its model probability (the product of the step
   probabilities along the path equals exp(score - log Z), checked for every segmentation);
2. the kernel draws exactly the steps of a plain float64 walk with the same uniforms, with one
   chunk and with chunks short enough that every walk runs fix-ups and repairs;
3. the public function returns each sample's exact score and log-probability.

The chi-square test of the kernel's samples runs on the GPU (``test_distribution.py`` on CUDA).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_close, make_inputs
from kernel_cases import DEVICE, adversarial, cpu, validated
from torch_semimarkov import semi_crf_streaming_sample
from torch_semimarkov.core.gold import gold_score
from torch_semimarkov.engines import select
from torch_semimarkov.oracle import enumerate_segmentations
from torch_semimarkov.engines.triton import launch, parallel, plan as plan_mod

F64 = torch.float64

CASES = [
    dict(B=2, T=7, K=3, C=3, proj="none", lengths=None),
    dict(B=3, T=6, K=4, C=2, proj="both", lengths="ragged"),
    dict(B=2, T=5, K=7, C=3, proj="end", lengths=None),  # K > T
    dict(B=2, T=6, K=1, C=3, proj="start", lengths=None),  # K = 1
]


def _case(i, seed=0):
    c = dict(CASES[i])
    inp = make_inputs(c.pop("B"), c.pop("T"), c.pop("K"), c.pop("C"), dtype=torch.float32, seed=seed, **c)
    return validated(inp)


def _state(v):
    """The forward's every-position rows (alpha_hat, U_hat), frames and log Z, as float64 on the CPU."""
    log_z, (saved, frames) = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                   proj_start=v.proj_start, proj_end=v.proj_end, save="all")
    return cpu(saved).double(), cpu(frames), cpu(log_z)


def _step_logits(v, saved, frames, b, s, c, c1=None):
    """Log weights of the two draws from start node (s, c): the previous label (C,) and, given
    that label c1, its duration k = 1..min(K, s)."""
    C, K = v.C, min(v.K, v.T)
    tr = cpu(v.transition).double()
    z_label = saved[0, b, s] + (tr[:, c] if c < C else 0.0)
    if c1 is None:
        return z_label
    k = torch.arange(1, min(K, s) + 1)
    cum = cpu(v.cum_scores).double()
    z_dur = (saved[1, b, s - k, c1] + frames[b, s - k] - frames[b, s] + cum[b, s, c1] - cum[b, s - k, c1]
             + cpu(v.duration_bias).double()[k - 1, c1])
    return z_label, z_dur


def _inverse_cdf(z, u):
    p = torch.exp(z - z.max())
    cs = torch.cumsum(p, 0)
    hit = ((cs > u * p.sum()) & (p > 0)).nonzero()
    return int(hit[0]) if hit.numel() else int((p > 0).nonzero()[-1])


def _reference_walk(v, saved, frames, lengths, uniforms):
    """labels (R, T), starts (R, T) of the plain sequential walk, row r on sequence r % B."""
    R, B, T, C = uniforms.shape[0], v.batch, v.T, v.C
    labels = torch.full((R, T), -1, dtype=torch.long)
    starts = torch.zeros((R, T), dtype=torch.bool)
    for r in range(R):
        b = r % B
        s, c = int(lengths[b]), C
        while s > 0:
            c1 = _inverse_cdf(_step_logits(v, saved, frames, b, s, c), float(uniforms[r, s, 0]))
            _, z_dur = _step_logits(v, saved, frames, b, s, c, c1)
            k = _inverse_cdf(z_dur, float(uniforms[r, s, 1])) + 1
            labels[r, s - k:s] = c1
            starts[r, s - k] = True
            s, c = s - k, c1
    return labels, starts


@pytest.mark.parametrize("i", range(len(CASES)))
def test_walk_steps_give_every_segmentation_its_probability(i):
    v = _case(i, seed=i)
    saved, frames, log_z = _state(v)
    per_seq = enumerate_segmentations(cpu(v.cum_scores).double(), cpu(v.transition).double(),
                                      cpu(v.duration_bias).double(), cpu(v.lengths), v.K,
                                      None if v.proj_start is None else cpu(v.proj_start).double(),
                                      None if v.proj_end is None else cpu(v.proj_end).double())
    # a step's log-probabilities depend only on (b, s, c, c1) and are shared by thousands of
    # segmentations: computed once per step (the same float64 values, summed in the same order)
    steps = {}

    def step(b, s, c, c1):
        if (b, s, c, c1) not in steps:
            z_label, z_dur = _step_logits(v, saved, frames, b, s, c, c1)
            steps[b, s, c, c1] = (torch.log_softmax(z_label, 0)[c1], torch.log_softmax(z_dur, 0))
        return steps[b, s, c, c1]

    for b, (segs, scores) in enumerate(per_seq):
        assert_close(log_z[b].reshape(1), torch.logsumexp(scores, 0).reshape(1), atol=1e-4, rtol=1e-5)
        exact = torch.log_softmax(scores.detach(), 0)
        walked = torch.zeros(len(segs), dtype=F64)
        for j, seg in enumerate(segs):
            s, c = int(v.lengths[b]), v.C
            for sg in reversed(seg):
                assert sg.end == s
                label_lp, dur_lp = step(b, s, c, sg.label)
                walked[j] += label_lp + dur_lp[s - sg.start - 1]
                s, c = sg.start, sg.label
        assert_close(walked, exact, atol=2e-5, rtol=0)


def _kernel_walk(v, uniforms, chunk):
    log_z, (saved, frames) = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths, v.K,
                                                   proj_start=v.proj_start, proj_end=v.proj_end, save="all")
    traced = torch.where(torch.isfinite(log_z), v.lengths, torch.zeros_like(v.lengths))
    K = min(v.K, v.T)
    return parallel.sample_chunked(saved, frames, v.cum_scores, v.transition, v.duration_bias, traced,
                                   uniforms.to(DEVICE), K, max(chunk, K))


@pytest.mark.parametrize("i", range(len(CASES)))
@pytest.mark.parametrize("chunk", [3, 4, 1000])
def test_kernel_walk_equals_the_reference_walk(i, chunk):
    v = _case(i, seed=10 + i)
    saved, frames, _ = _state(v)
    g = torch.Generator().manual_seed(i)
    uniforms = torch.rand((3 * v.batch, v.T + 1, 2), generator=g)
    labels, starts, merged = _kernel_walk(v, uniforms, chunk)
    ref_labels, ref_starts = _reference_walk(v, saved, frames, cpu(v.lengths), uniforms)
    assert torch.equal(cpu(labels), ref_labels)
    assert torch.equal(cpu(starts), ref_starts)
    assert merged.shape[0] == 3 * v.batch


@pytest.mark.parametrize("kind", ["cyclic", "frame"])
def test_kernel_walk_on_models_whose_walks_do_not_merge(kind):
    """Grammars with long memory: fix-ups that never merge hand on to the repair, and the result
    is still the plain walk's."""
    v = validated(adversarial(kind, 2, 40, 6, 3, seed=5))
    saved, frames, log_z = _state(v)
    g = torch.Generator().manual_seed(2)
    uniforms = torch.rand((4, v.T + 1, 2), generator=g)
    labels, starts, merged = _kernel_walk(v, uniforms, 8)
    traced = torch.where(torch.isfinite(log_z), cpu(v.lengths), torch.zeros_like(cpu(v.lengths)))
    ref_labels, ref_starts = _reference_walk(v, saved, frames, traced, uniforms)
    assert torch.equal(cpu(labels), ref_labels) and torch.equal(cpu(starts), ref_starts)


@pytest.fixture
def engine_sampling(monkeypatch):
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    monkeypatch.setattr(plan_mod, "CHUNK_OVERRIDE", 4)


def _public_inputs(v):
    return dict(cum_scores=v.cum_scores, transition=v.transition, duration_bias=v.duration_bias,
                lengths=v.lengths, K=v.K, proj_start=v.proj_start, proj_end=v.proj_end)


def test_public_sampling_on_the_engine_scores_its_samples(engine_sampling):
    v = _case(1, seed=3)
    kw = _public_inputs(v)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    out = semi_crf_streaming_sample(**kw, num_samples=4, generator=g)
    S, B, T = out.labels.shape
    assert (S, B, T) == (4, v.batch, v.T)
    lengths = cpu(v.lengths)
    assert ((cpu(out.labels) >= 0).sum(-1) == lengths).all()
    starts = torch.zeros(S * B, T, dtype=torch.bool)
    starts[torch.repeat_interleave(torch.arange(S * B), cpu(out.segment_offsets).diff()), cpu(out.segment_starts)] = True
    rows = cpu(out.labels).reshape(S * B, T)
    ref = gold_score(cpu(v.cum_scores).double().repeat(S, 1, 1), cpu(v.transition).double(),
                     cpu(v.duration_bias).double(), lengths.repeat(S), rows.clamp(min=0), starts,
                     *(None if p is None else cpu(p).double().repeat(S, 1, 1) for p in (v.proj_start, v.proj_end)))
    assert_close(cpu(out.scores).double().reshape(-1), ref, atol=1e-4, rtol=1e-6)
    log_z = _state(v)[2]
    assert_close(cpu(out.log_prob).double(), cpu(out.scores).double() - log_z[None, :], atol=1e-4, rtol=1e-6)
    again = semi_crf_streaming_sample(**kw, num_samples=4, generator=torch.Generator(device=DEVICE).manual_seed(5))
    assert torch.equal(cpu(again.labels), cpu(out.labels))


def test_public_sampling_on_the_engine_without_a_segmentation(engine_sampling):
    """A sequence with no allowed segmentation: labels -1, no segments, score and log_prob -inf."""
    inp = make_inputs(2, 5, 2, 2, dtype=torch.float32, seed=1)
    inp["duration_bias"] = torch.tensor([[-math.inf, -math.inf], [0.0, 0.0]])  # duration 2 only
    inp["lengths"] = torch.tensor([4, 5])  # 5 is odd: impossible
    v = validated(inp)
    out = semi_crf_streaming_sample(**_public_inputs(v), num_samples=3,
                                    generator=torch.Generator(device=DEVICE).manual_seed(0))
    assert (cpu(out.labels)[:, 1] == -1).all()
    assert torch.isinf(cpu(out.log_prob)[:, 1]).all() and torch.isfinite(cpu(out.log_prob)[:, 0]).all()
    assert (cpu(out.num_segments)[:, 0] == 2).all() and (cpu(out.num_segments)[:, 1] == 0).all()


# ------------------------------------------------------------- a (K, C, C) transition: end nodes

KCC_CASES = [
    dict(B=2, T=7, K=3, C=3, proj="both", lengths=None),
    dict(B=3, T=6, K=4, C=2, proj="start", lengths="ragged"),
    dict(B=2, T=5, K=7, C=3, proj="none", lengths=None),  # K > T
    dict(B=2, T=6, K=1, C=3, proj="end", lengths=None),  # K = 1
]


def _kcc_case(i, seed=0):
    c = dict(KCC_CASES[i])
    inp = make_inputs(c.pop("B"), c.pop("T"), c.pop("K"), c.pop("C"), dtype=torch.float32, seed=seed,
                      duration_transitions=True, **c)
    return validated(inp)


def _kcc_step_logits(v, saved, frames, b, t, c, k=None):
    """Log weights of the two draws from end node (t, c) of a (K, C, C) transition: the segment's
    duration k = 1..min(K, t) (each summed over the label before it) and, given k, that label (C,)."""
    tr = cpu(v.transition).double()
    cum = cpu(v.cum_scores).double()
    ks = torch.arange(1, min(v.K, v.T, t) + 1)
    prev = saved[0, b, t - ks] + frames[b, t - ks, None]  # (k, c') alpha of the segment's start
    x = prev + tr[ks - 1, :, c]
    z_dur = (torch.logsumexp(x, 1) + cpu(v.duration_bias).double()[ks - 1, c] + cum[b, t, c] - cum[b, t - ks, c])
    if v.proj_start is not None:
        z_dur = z_dur + cpu(v.proj_start).double()[b, t - ks, c]
    if k is None:
        return z_dur
    return z_dur, x[k - 1]


def _kcc_reference_walk(v, saved, frames, lengths, uniforms):
    """labels (R, T), starts (R, T) of the plain sequential walk over end nodes, the PyTorch path's
    draws: the last label with u1 of the end, each duration with u2 of its segment's end, each
    label before it with u1 of the segment's start."""
    R, B, T = uniforms.shape[0], v.batch, v.T
    labels = torch.full((R, T), -1, dtype=torch.long)
    starts = torch.zeros((R, T), dtype=torch.bool)
    for r in range(R):
        b = r % B
        t = int(lengths[b])
        if t == 0:
            continue
        c = _inverse_cdf(saved[0, b, t], float(uniforms[r, t, 0]))
        while t > 0:
            k = _inverse_cdf(_kcc_step_logits(v, saved, frames, b, t, c), float(uniforms[r, t, 1])) + 1
            _, z_label = _kcc_step_logits(v, saved, frames, b, t, c, k)
            c_prev = _inverse_cdf(z_label, float(uniforms[r, t - k, 0]))
            labels[r, t - k:t] = c
            starts[r, t - k] = True
            t, c = t - k, c_prev
    return labels, starts


@pytest.mark.parametrize("i", range(len(KCC_CASES)))
def test_kcc_walk_steps_give_every_segmentation_its_probability(i):
    """The end-node steps (last label; then duration, label before) from the direct forward's
    stored rows give every segmentation its model probability."""
    v = _kcc_case(i, seed=20 + i)
    saved, frames, log_z = _state(v)
    assert saved.shape[0] == 1  # the direct recurrence keeps alpha_hat only
    per_seq = enumerate_segmentations(cpu(v.cum_scores).double(), cpu(v.transition).double(),
                                      cpu(v.duration_bias).double(), cpu(v.lengths), v.K,
                                      None if v.proj_start is None else cpu(v.proj_start).double(),
                                      None if v.proj_end is None else cpu(v.proj_end).double())
    steps = {}

    def step(b, t, c, k):
        if (b, t, c) not in steps:
            steps[b, t, c] = torch.log_softmax(_kcc_step_logits(v, saved, frames, b, t, c), 0)
        _, z_label = _kcc_step_logits(v, saved, frames, b, t, c, k)
        return steps[b, t, c][k - 1], torch.log_softmax(z_label, 0)

    for b, (segs, scores) in enumerate(per_seq):
        assert_close(log_z[b].reshape(1), torch.logsumexp(scores, 0).reshape(1), atol=1e-4, rtol=1e-5)
        exact = torch.log_softmax(scores.detach(), 0)
        walked = torch.zeros(len(segs), dtype=F64)
        L = int(v.lengths[b])
        last = torch.log_softmax(saved[0, b, L], 0)
        for j, seg in enumerate(segs):
            walked[j] = last[seg[-1].label]
            for n in range(len(seg) - 1, -1, -1):
                sg = seg[n]
                dur_lp, label_lp = step(b, sg.end, sg.label, sg.end - sg.start)
                walked[j] += dur_lp
                if n > 0:  # the first segment's "label before" is the phantom start: no draw counts
                    walked[j] += label_lp[seg[n - 1].label]
        assert_close(walked, exact, atol=2e-5, rtol=0)


@pytest.mark.parametrize("i", range(len(KCC_CASES)))
@pytest.mark.parametrize("chunk", [3, 4, 1000])
def test_kcc_kernel_walk_equals_the_reference_walk(i, chunk):
    v = _kcc_case(i, seed=30 + i)
    saved, frames, _ = _state(v)
    g = torch.Generator().manual_seed(i)
    uniforms = torch.rand((3 * v.batch, v.T + 1, 2), generator=g)
    log_z, (dev_saved, dev_frames) = launch.launch_forward(v.cum_scores, v.transition, v.duration_bias, v.lengths,
                                                           v.K, proj_start=v.proj_start, proj_end=v.proj_end,
                                                           save="all")
    K = min(v.K, v.T)
    labels, starts, _ = parallel.sample_chunked(dev_saved, dev_frames, v.cum_scores, v.transition, v.duration_bias,
                                                v.lengths, uniforms.to(DEVICE), K, max(chunk, K), v.proj_start)
    ref_labels, ref_starts = _kcc_reference_walk(v, saved, frames, cpu(v.lengths), uniforms)
    assert torch.equal(cpu(labels), ref_labels)
    assert torch.equal(cpu(starts), ref_starts)


def test_public_kcc_sampling_on_the_engine_scores_its_samples(engine_sampling, monkeypatch):
    """A (K, C, C) transition samples on the engine: lengths, exact scores and log-probabilities,
    reproducible with a seeded generator, and the same samples as the PyTorch path's walk when both
    read the same uniforms (float32 values; the PyTorch path draws in float64)."""
    v = _kcc_case(1, seed=3)
    kw = _public_inputs(v)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    out = semi_crf_streaming_sample(**kw, num_samples=4, generator=g)
    S, B, T = out.labels.shape
    lengths = cpu(v.lengths)
    assert ((cpu(out.labels) >= 0).sum(-1) == lengths).all()
    starts = torch.zeros(S * B, T, dtype=torch.bool)
    starts[torch.repeat_interleave(torch.arange(S * B), cpu(out.segment_offsets).diff()), cpu(out.segment_starts)] = True
    rows = cpu(out.labels).reshape(S * B, T)
    ref = gold_score(cpu(v.cum_scores).double().repeat(S, 1, 1), cpu(v.transition).double(),
                     cpu(v.duration_bias).double(), lengths.repeat(S), rows.clamp(min=0), starts,
                     *(None if p is None else cpu(p).double().repeat(S, 1, 1) for p in (v.proj_start, v.proj_end)))
    assert_close(cpu(out.scores).double().reshape(-1), ref, atol=1e-4, rtol=1e-6)
    log_z = _state(v)[2]
    assert_close(cpu(out.log_prob).double(), cpu(out.scores).double() - log_z[None, :], atol=1e-4, rtol=1e-6)
    again = semi_crf_streaming_sample(**kw, num_samples=4, generator=torch.Generator(device=DEVICE).manual_seed(5))
    assert torch.equal(cpu(again.labels), cpu(out.labels))
    # the engine's uniforms, read again, through the PyTorch path's walk (float64 model)
    uniforms = torch.rand((S * B, T + 1, 2), generator=torch.Generator(device=DEVICE).manual_seed(5),
                          device=DEVICE, dtype=torch.float32)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: uniforms.double())
    f64 = {k: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for k, x in kw.items()}
    torch_out = semi_crf_streaming_sample(**f64, num_samples=4, backend="torch")
    assert torch.equal(cpu(torch_out.labels), cpu(out.labels))
