"""torch.compile of an encoder + semi-CRF head: first-call time, recompilations, step time.

A Conv1d encoder and ``SemiMarkovCRFHead(validate=False)``; ``torch.compile(model, fullgraph=True,
dynamic=True)`` with inductor, in a fresh inductor cache (a cold first call). Reports the first
call (compile + run, forward and backward), the graphs compiled after new lengths and a new T,
the largest difference to eager, and the median training step (forward + backward) eager and
compiled, in the same run. CPU: B = 4, T = 80 (as the issue measured); CUDA (when present):
also B = 4, T = 10^5, K = 500, C = 12.

Usage: ``python benchmarks/bench_compile.py [--out bench_compile.json] [--device cpu|cuda]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))

import torch  # noqa: E402  (the cache directory must be set before torch reads it)


def _model(C, K, device):
    from torch_semimarkov import SemiMarkovCRFHead

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Conv1d(8, 32, 9, padding=4)
            self.head = SemiMarkovCRFHead(num_classes=C, max_duration=K, hidden_dim=32, validate=False)

        def forward(self, x, lengths, labels):
            return self.head.compute_loss(self.enc(x.transpose(1, 2)).transpose(1, 2), lengths, labels)

    return Model().to(device)


def _batch(B, T, C, device, seed, ragged=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((B,), T)
    if ragged:
        lengths[1:] = torch.randint(T // 2, T + 1, (B - 1,), generator=g)
    x = torch.randn(B, T, 8, generator=g)
    # segments of 1..40 positions with random labels
    labels = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        t = 0
        while t < T:
            d = int(torch.randint(1, 41, (1,), generator=g))
            labels[b, t:t + d] = int(torch.randint(0, C, (1,), generator=g))
            t += d
        labels[b, int(lengths[b]):] = -100
    return x.to(device), lengths.to(device), labels.to(device)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _step(fn, model, batch, device):
    model.zero_grad(set_to_none=True)
    loss = fn(*batch)
    loss.backward()
    _sync(device)
    return loss


def _median_ms(fn, model, batch, device, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        _step(fn, model, batch, device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(device, B, T, K, C, repeat):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = _model(C, K, device)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    batch = _batch(B, T, C, device, seed=0)
    t0 = time.perf_counter()
    loss_c = _step(compiled, model, batch, device)
    first_s = time.perf_counter() - t0
    grads_c = [p.grad.clone() for p in model.parameters()]
    loss_e = _step(model, model, batch, device)
    diff = max(float((a - p.grad).abs().max()) for a, p in zip(grads_c, model.parameters()))
    diff = max(diff, float((loss_c - loss_e).detach().abs()))
    # new lengths, then a new T
    for i, t in enumerate((T, T + T // 7 + 1)):
        _step(compiled, model, _batch(B, t, C, device, seed=1 + i), device)
    graphs = counters["stats"]["unique_graphs"]
    eager_ms = _median_ms(model, model, batch, device, repeat)
    compiled_ms = _median_ms(compiled, model, batch, device, repeat)
    row = dict(device=device, B=B, T=T, K=K, C=C, first_call_s=first_s, graphs_after_new_lengths_and_T=graphs,
               max_abs_diff_to_eager=diff, eager_step_ms=eager_ms, compiled_step_ms=compiled_ms)
    print(f"{device} B={B} T={T} K={K} C={C}: first call {first_s:.1f} s, {graphs} graph(s) after new lengths "
          f"and T, |compiled - eager| <= {diff:.2e}, step eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms",
          flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_compile.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    rows = []
    if args.device == "cpu":
        rows.append(run("cpu", 4, 80, 8, 4, args.repeat))
    else:
        rows.append(run("cuda", 4, 1000, 32, 6, args.repeat))
        rows.append(run("cuda", 4, 100_000, 500, 12, args.repeat))
    with open(args.out, "w") as f:
        json.dump(dict(torch=torch.__version__, inductor_cache=os.environ["TORCHINDUCTOR_CACHE_DIR"], rows=rows), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
