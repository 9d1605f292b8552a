"""CPU probe: does a model's forward state forget where it started? (float64, no GPU)

For chunk starts a (multiples of ``--chunk``), log Z of the prefix ending at a + o (the true
forward) minus log Z of the same stretch started fresh at a ("the sequence starts here", as a
spec run starts a chunk), for offsets o up to one chunk. A model that forgets its start within m
positions makes this difference constant from a + m on; the time-parallel engine's fix-ups need
that (GPU_NOTES 57). Inputs: a file of ``probes/make_gene_inputs.py``.

    python benchmarks/probes/forward_memory.py --inputs gene_inputs.pt --locus 0 --starts 2,5,8 --out memory.json
"""

import argparse
import json
import time

import torch

from torch_semimarkov import semi_crf_streaming_forward

OFFSETS = (240, 480, 960, 1440, 1920, 2880, 3840)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--locus", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=3840)
    ap.add_argument("--starts", default="2,5,8", help="chunk indices j (start a = j * chunk)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    g = torch.load(args.inputs)
    b, K = args.locus, g["K"]
    cum, tr, db, ps, pe = (g[k].double() for k in ("cum_scores", "transition", "duration_bias", "proj_start", "proj_end"))
    offs = [o for o in OFFSETS if o <= args.chunk]
    rows = []
    for j in (int(x) for x in args.starts.split(",")):
        a, t0 = j * args.chunk, time.perf_counter()
        ends = [a + o for o in offs]
        T = ends[-1]
        if T > int(g["lengths"][b]):
            break
        n = len(ends)

        def rep(x):
            return x.expand(n, -1, -1).contiguous()

        full = semi_crf_streaming_forward(rep(cum[b:b + 1, :T + 1]), tr, db, torch.tensor(ends), K,
                                          proj_start=rep(ps[b:b + 1, :T]), proj_end=rep(pe[b:b + 1, :T]),
                                          backend="numba", validate=False)
        sub = semi_crf_streaming_forward(rep(cum[b:b + 1, a:T + 1] - cum[b:b + 1, a:a + 1]), tr, db, torch.tensor(offs),
                                         K, proj_start=rep(ps[b:b + 1, a:T]), proj_end=rep(pe[b:b + 1, a:T]),
                                         backend="numba", validate=False)
        d = (full - sub).tolist()
        rows.append({"start": a, "offsets": offs, "difference_minus_last": [x - d[-1] for x in d],
                     "seconds": time.perf_counter() - t0})
        print(f"start {a}: log Z(true) - log Z(fresh) - its value at +{offs[-1]}, at +{offs}:",
              [round(x - d[-1], 4) for x in d], flush=True)
    json.dump({"inputs": args.inputs, "model": g.get("model"), "locus": g["names"][b], "K": K, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
