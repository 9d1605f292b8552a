"""GPU probe: two source trees of the package A/B in one run (a kernel change that also changes its
host side, which a swapped kernel cannot test). Each tree runs in its own process, in turns
(A, B, A, B, ...), timing the public forward, forward+backward and Viterbi on random models
(medians after a warm-up); then log Z, the gradients and the Viterbi results of B are compared
with A's (bitwise, else the largest difference relative to A's largest value).

    python benchmarks/probes/src_ab.py OUT.json SRC_A SRC_B ["B,T,K,C;..."] [rounds]
    python benchmarks/probes/src_ab.py OUT.json SRC_A SRC_B,SRC_C,... ["B,T,K,C;..."] [rounds]

With several trees after A (B, C, ...) each is compared with A (``max_rel_diff`` then holds one
entry per tree). ``AB_PARTS`` (default ``fwd,fwdbwd,viterbi``) leaves out what a change cannot
touch (its cold compilation costs device time). ``AB_KCC=1``: a (K, C, C) transition; ``AB_RUNS``
(default 5) and ``AB_WARM`` (default 2): timed and warm-up calls a part and round.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = "4,100000,960,47;16,20000,960,47;32,3000,960,47"


def worker(shapes, runs, out):
    import time

    import torch

    sys.path.insert(0, HERE)
    from ab_common import random_model

    from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi

    res, outs = {}, {}
    for shape in shapes.split(";"):
        B, T, K, C = (int(x) for x in shape.split(","))
        cum, tr, db, lengths = random_model(B, T, K, C, kcc=os.environ.get("AB_KCC") == "1")

        def timed(fn):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = fn()
            torch.cuda.synchronize()
            return time.perf_counter() - t0, r

        fwd = lambda: semi_crf_streaming_forward(cum.detach(), tr.detach(), db.detach(), lengths, K)  # noqa: E731

        def fb():
            z = semi_crf_streaming_forward(cum, tr, db, lengths, K)
            return (z.detach(), *torch.autograd.grad(z.sum(), (cum, tr, db)))

        vit = lambda: semi_crf_streaming_viterbi(cum.detach(), tr.detach(), db.detach(), lengths, K)  # noqa: E731
        parts = {"fwd": fwd, "fwdbwd": fb, "viterbi": vit}
        parts = {k: parts[k] for k in os.environ.get("AB_PARTS", "fwd,fwdbwd,viterbi").split(",")}
        t = {k: [] for k in parts}
        for _ in range(int(os.environ.get("AB_WARM", "2"))):
            last = {k: fn() for k, fn in parts.items()}
        for _ in range(runs):
            for k, fn in parts.items():
                t[k].append(timed(fn)[0])
        res[shape] = t
        outs[shape] = {}
        if "fwdbwd" in last:
            g = last["fwdbwd"]
            outs[shape].update(log_z=g[0].cpu(), g_cum=g[1].cpu(), g_tr=g[2].cpu(), g_db=g[3].cpu())
        if "viterbi" in last:
            outs[shape].update(vit_scores=last["viterbi"].scores.cpu(), vit_labels=last["viterbi"].labels.cpu())
    torch.save({"times": res, "outs": outs}, out)


def main():
    out_path, src_a, src_b = sys.argv[1:4]
    shapes = sys.argv[4] if len(sys.argv) > 4 else SHAPES
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    import torch

    trees = [("A", src_a)] + [(chr(ord("B") + i), s) for i, s in enumerate(src_b.split(","))]
    times = {name: {} for name, _ in trees}
    last = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, src in trees:
                path = os.path.join(tmp, f"{name}{r}.pt")
                env = dict(os.environ, PYTHONPATH=os.path.abspath(src) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                subprocess.run([sys.executable, __file__, "--worker", shapes, os.environ.get("AB_RUNS", "5"), path], env=env, check=True)
                d = torch.load(path)
                for shape, t in d["times"].items():
                    for k, v in t.items():
                        times[name].setdefault(shape, {}).setdefault(k, []).extend(v)
                last[name] = d["outs"]
                print(name, r, {s: {k: round(1e3 * statistics.median(v), 2) for k, v in t.items()}
                                for s, t in d["times"].items()}, flush=True)
    rep = {"device": torch.cuda.get_device_name(), "src": dict(trees), "shapes": {}}
    for shape in times["A"]:
        diffs = {}
        for name, _ in trees[1:]:
            a, b = last["A"][shape], last[name][shape]
            diff = {}
            for k in a:
                x, y = a[k].double(), b[k].double()
                diff[k] = 0.0 if torch.equal(a[k], b[k]) else float((y - x).abs().max() / x.abs().max().clamp_min(1e-30))
            if "vit_labels" in a:
                diff["vit_labels_equal"] = float((a["vit_labels"] == b["vit_labels"]).double().mean())
            diffs[name] = diff
        med = {n: {k: 1e3 * statistics.median(v) for k, v in times[n][shape].items()} for n, _ in trees}
        rep["shapes"][shape] = {"median_ms": med, "times_s": {n: times[n][shape] for n, _ in trees},
                                "max_rel_diff": diffs["B"] if len(trees) == 2 else diffs}
        print(shape, med, diffs, flush=True)
    json.dump(rep, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
