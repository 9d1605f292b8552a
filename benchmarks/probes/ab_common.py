"""Shared by the GPU A/B probes (``blocked_tile_ab.py``, ``beta_early_ab.py``): a random model at a
genomics shape, and interleaved timings of the public log Z (forward, forward+backward) under
several settings with their outputs kept for a bitwise comparison."""

import statistics
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward


def random_model(B, T, K, C, seed=0):
    """``(cum_scores, transition, duration_bias, lengths)`` on the GPU, the first three leaves."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, T, C, device="cuda", generator=g) * 0.5
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0)).requires_grad_()
    tr = (torch.randn(C, C, device="cuda", generator=g) * 0.3).requires_grad_()
    db = (torch.randn(K, C, device="cuda", generator=g) * 0.3).requires_grad_()
    return cum, tr, db, torch.full((B,), T, device="cuda")


def interleaved(settings, model, K, runs, detached_forward=True):
    """``settings``: ``{name: callable}`` that switches the code under test to that setting. Two
    warm-up calls per setting (the second's log Z and gradients kept), then ``runs`` rounds of a
    forward and a forward+backward per setting in turn. Returns ``(outputs, times_s, median_ms)``."""
    cum, tr, db, lengths = model
    times = {n: {"fwd": [], "fwdbwd": []} for n in settings}

    def step(name, back):
        settings[name]()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        args = (cum, tr, db) if back or not detached_forward else (cum.detach(), tr.detach(), db.detach())
        z = semi_crf_streaming_forward(*args, lengths, K)
        grads = torch.autograd.grad(z.sum(), (cum, tr, db)) if back else None
        torch.cuda.synchronize()
        return time.perf_counter() - t0, z.detach(), grads

    out = {}
    for n in settings:
        step(n, True)
        out[n] = step(n, True)[1:]
    for _ in range(runs):
        for n in settings:
            times[n]["fwd"].append(step(n, False)[0])
            times[n]["fwdbwd"].append(step(n, True)[0])
    med = {n: {k: 1e3 * statistics.median(v) for k, v in d.items()} for n, d in times.items()}
    return out, times, med
