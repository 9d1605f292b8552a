"""Shared by the GPU A/B probes (``blocked_tile_ab.py``, ``beta_early_ab.py``, ``repair_helpers_ab.py``, the
tile probes): a random model at a genomics shape, the gene model of ``make_gene_inputs.py`` on the GPU,
and interleaved timings of the public log Z (forward, forward+backward) under several settings with
their outputs kept for a bitwise comparison."""

import statistics
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi


def random_model(B, T, K, C, seed=0, kcc=False):
    """``(cum_scores, transition, duration_bias, lengths)`` on the GPU, the first three leaves
    (``kcc``: a (K, C, C) transition)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, T, C, device="cuda", generator=g) * 0.5
    cum = torch.nn.functional.pad(x.cumsum(1), (0, 0, 1, 0)).requires_grad_()
    tr = (torch.randn(*((K,) if kcc else ()), C, C, device="cuda", generator=g) * 0.3).requires_grad_()
    db = (torch.randn(K, C, device="cuda", generator=g) * 0.3).requires_grad_()
    return cum, tr, db, torch.full((B,), T, device="cuda")


def public_calls(shape, kcc=False):
    """``(fwdbwd, viterbi, model)`` on a random model at ``shape`` "B,T,K,C" (``kcc``: a (K, C, C)
    transition): the public log Z and its gradient with respect to the three leaves, the public
    Viterbi (the profiling probes), and the model ``(cum_scores, transition, duration_bias, lengths, K)``."""
    B, T, K, C = (int(x) for x in shape.split(","))
    cum, tr, db, lengths = random_model(B, T, K, C, kcc=kcc)

    def fwdbwd():
        z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
        torch.autograd.grad(z.sum(), (cum, tr, db))

    def viterbi():
        semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K)

    return fwdbwd, viterbi, (cum, tr, db, lengths, K)


def gene_model(path):
    """The gene model of ``probes/make_gene_inputs.py`` (file ``path``) on the GPU:
    ``((cum_scores, transition, duration_bias, lengths), {proj_start, proj_end}, K)``, the first three
    leaves."""
    g = torch.load(path)
    leaves = [g[k].cuda().requires_grad_() for k in ("cum_scores", "transition", "duration_bias")]
    return ((*leaves, g["lengths"].cuda()), dict(proj_start=g["proj_start"].cuda(), proj_end=g["proj_end"].cuda()),
            g["K"])


def interleaved(settings, model, K, runs, detached_forward=True, viterbi=False):
    """``settings``: ``{name: callable}`` that switches the code under test to that setting. Two
    warm-up calls per setting (the second's log Z and gradients kept), then ``runs`` rounds of a
    forward and a forward+backward (and with ``viterbi`` a Viterbi decode) per setting in turn.
    Returns ``(outputs, times_s, median_ms)``; with ``viterbi`` each setting's outputs also hold
    its Viterbi scores and labels."""
    cum, tr, db, lengths = model
    times = {n: {"fwd": [], "fwdbwd": [], **({"viterbi": []} if viterbi else {})} for n in settings}

    def step(name, back):
        settings[name]()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        args = (cum, tr, db) if back or not detached_forward else (cum.detach(), tr.detach(), db.detach())
        z = semi_crf_streaming_forward(*args, lengths, K)
        grads = torch.autograd.grad(z.sum(), (cum, tr, db)) if back else None
        torch.cuda.synchronize()
        return time.perf_counter() - t0, z.detach(), grads

    def decode(name):
        settings[name]()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, (r.scores, r.labels)

    out = {}
    for n in settings:
        step(n, True)
        out[n] = step(n, True)[1:]
        if viterbi:
            decode(n)
            out[n] = out[n] + decode(n)[1]
    for _ in range(runs):
        for n in settings:
            times[n]["fwd"].append(step(n, False)[0])
            times[n]["fwdbwd"].append(step(n, True)[0])
            if viterbi:
                times[n]["viterbi"].append(decode(n)[0])
    med = {n: {k: 1e3 * statistics.median(v) for k, v in d.items()} for n, d in times.items()}
    return out, times, med


def plan_flag_ab(flag, values, shapes, out_path, runs=7, viterbi=False):
    """A/B of a ``plan`` module flag through the public API on random models at ``shapes``:
    ``values`` ``{setting name: flag value}`` (the first the baseline), the plan each setting makes
    for a differentiated forward, interleaved medians (:func:`interleaved`), whether log Z and the
    gradients are bitwise equal and, where not, their largest differences relative to the
    baseline's largest value. Writes the report to ``out_path`` and leaves the flag at its value
    before the call."""
    import json

    from torch_semimarkov.engines.triton import launch
    from torch_semimarkov.engines.triton import plan as plan_mod

    before = getattr(plan_mod, flag)
    settings = {name: (lambda v=v: setattr(plan_mod, flag, v)) for name, v in values.items()}
    base, other = list(values)[:2]
    res = {"device": torch.cuda.get_device_name(), "runs": runs, "flag": flag, "values": values, "shapes": {}}
    rel = lambda x, y: float((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30))  # noqa: E731
    for (B, T, K, C) in shapes:
        model = random_model(B, T, K, C)
        plans = {}
        for name, switch in settings.items():
            switch()
            p = launch.plan_for(model[0], model[1], K, "log", backward=True)
            pv = launch.plan_for(model[0], model[1], K, "max")
            plans[name] = {"chunk": p.chunk, "n_chunks": p.n_chunks, "beta_early": p.beta_early,
                           "helpers": p.helpers, "viterbi_helpers": pv.helpers}
        out, times, med = interleaved(settings, model, K, runs, viterbi=viterbi)
        a, b = out[base], out[other]
        same = bool(torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[1], b[1])))
        diff = {"log_z": rel(b[0], a[0]), **{n: rel(p, q) for n, p, q in zip(("cum", "tr", "db"), b[1], a[1])}}
        if viterbi:
            same = same and bool(torch.equal(a[2], b[2]) and torch.equal(a[3], b[3]))
            diff.update(viterbi_score=rel(b[2], a[2]), viterbi_labels_equal=float((a[3] == b[3]).double().mean()))
        key = f"{B},{T},{K},{C}"
        res["shapes"][key] = {"plans": plans, "median_ms": med, "times_s": times, "max_rel_diff": diff,
                              "bitwise_equal": same}
        print(key, plans, med, diff, "bitwise equal:", same, flush=True)
    setattr(plan_mod, flag, before)
    json.dump(res, open(out_path, "w"), indent=1)
    return res


def plan_flag_cli(flag, values, shapes, viterbi=False):
    """``plan_flag_ab`` from a probe's command line: ``OUT.json ["B,T,K,C;B,T,K,C"]``."""
    import sys

    if len(sys.argv) > 2:
        shapes = [tuple(int(x) for x in shape.split(",")) for shape in sys.argv[2].split(";")]
    return plan_flag_ab(flag, values, shapes, sys.argv[1], viterbi=viterbi)
