"""How precise is the head's float32 model at T = 10^6? Log Z and gradients against float64.

The head (``SemiMarkovCRFHead``) centres its per-position scores per label by the batch mean and
gives each segment the exact compensation through its duration term (``torch_semimarkov.scores``),
so its model is that of the raw scores. This script measures what float32 costs, against the same
head in float64 (``cumsum_dtype=torch.float64`` and float64 parameters, the same values), on the
compiled CPU engine:

* ``single``: one sequence of T positions, label means far apart (a projection bias of
  (2.5, -1.5, 0.5, 0, ...)): the batch mean is the sequence's own;
* ``mixed``: two sequences whose label means differ (the second's features are shifted), so the
  batch mean is not either sequence's own and each sequence's cumulative scores drift;
* ``uncentred`` (reference, not the head): the same single sequence with the raw scores summed in
  float32 without any centring, what the head would do without ``scores.py``.

For each: log Z relative error, NLL (of a fixed segmentation) absolute error, and the relative
error (max |a - b| / max |b|) of the gradients of the NLL with respect to the projection's weight,
the transition and the duration parameters.

Usage:
    python benchmarks/bench_head_precision.py            # T = 10^6, writes results/cpu_head_precision.json
    python benchmarks/bench_head_precision.py --T 100000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from torch_semimarkov import SemiMarkovCRFHead, semi_crf_streaming_forward
from torch_semimarkov.core.gold import gold_score

C, K, H = 6, 16, 8


def make_head(dtype, seed=0):
    torch.manual_seed(seed)
    head = SemiMarkovCRFHead(C, K, hidden_dim=H, cumsum_dtype=dtype, backend="numba", validate=False)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
        head.projection.bias.copy_(torch.tensor([2.5, -1.5, 0.5, 0.0, 1.0, -0.5]))
    return head.to(dtype)


def gold_segments(T, seed=1):
    """A fixed segmentation of 0..T-1 as (labels, starts) tensors (durations 1..K)."""
    g = torch.Generator().manual_seed(seed)
    durs = torch.randint(1, K + 1, (T // 4 + K,), generator=g)
    ends = durs.cumsum(0)
    ends = ends[ends < T]
    starts = torch.zeros(T, dtype=torch.bool)
    starts[0] = True
    starts[ends] = True
    seg_id = starts.long().cumsum(0) - 1
    labels = torch.randint(0, C, (int(seg_id[-1]) + 1,), generator=g)[seg_id]
    return labels, starts


def nll_and_grads(head, h, lengths, labels, starts, uncentred=False):
    out = head.build(h, lengths)
    if uncentred:  # the raw scores summed in the head's dtype, no centring (reference only)
        x = head.projection(h).to(out.cum_scores.dtype)
        cum = torch.cat([x.new_zeros(x.shape[0], 1, C), x.cumsum(1)], dim=1)
        out = out._replace(cum_scores=cum, duration_bias=head.duration_table(out.cum_scores.dtype))
    log_z = semi_crf_streaming_forward(out.cum_scores, out.transition, out.duration_bias, out.lengths, K,
                                       backend="numba", validate=False)
    gold = gold_score(out.cum_scores, out.transition, out.duration_bias, out.lengths, labels, starts)
    nll = (log_z - gold).sum()
    params = [head.projection.weight, head.transition, head.duration_bias]
    grads = torch.autograd.grad(nll, params)
    return log_z.detach().double(), nll.detach().double(), [g.double() for g in grads]


def compare(name, h32, h64, lengths, labels, starts, uncentred=False):
    t0 = time.perf_counter()
    lz32, nll32, g32 = nll_and_grads(make_head(torch.float32), h32, lengths, labels, starts, uncentred)
    lz64, nll64, g64 = nll_and_grads(make_head(torch.float64), h64, lengths, labels, starts)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    row = {
        "case": name,
        "log_z_float64": lz64.tolist(),
        "log_z_rel_err": float(((lz32 - lz64).abs() / lz64.abs()).max()),
        "nll_float64": float(nll64),
        "nll_abs_err": float((nll32 - nll64).abs()),
        "grad_rel_err": {n: rel(a, b) for n, a, b in zip(("projection.weight", "transition", "duration_bias"),
                                                           g32, g64)},
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpu_head_precision.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    T = args.T
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, T, H, generator=g)
    labels, starts = gold_segments(T)
    lengths = torch.tensor([T])
    rows = [compare("single", h, h.double(), lengths, labels[None], starts[None]),
            compare("uncentred (no scores.py, reference)", h, h.double(), lengths, labels[None], starts[None],
                    uncentred=True)]
    # two sequences with different label means: the second's features are shifted
    h2 = torch.cat([h, h + torch.linspace(-1, 1, H)[None, None, :]])
    rows.append(compare("mixed", h2, h2.double(), torch.tensor([T, T]), labels[None].expand(2, T),
                        starts[None].expand(2, T)))
    Path(args.out).write_text(json.dumps({"T": T, "K": K, "C": C, "H": H, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
