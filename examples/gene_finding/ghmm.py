"""A generalised-HMM gene finder (no neural network) on the semi-CRF engine, against the same split.

Every part is estimated by counting on genes.gb.train (torch_semimarkov.genomics.ghmm / .sensors):
interpolated Markov chains (coding per codon position, intron, intergenic), weight array models
(donor, acceptor with its branch-point region, start and stop contexts), smoothed empirical exon
and intron lengths, a geometric intergenic length and the gold parses' transitions; decoding is
the library's Viterbi (the compiled CPU engine) over GeneGrammar. Each model is a named feature
component with weight 1 (the generative GHMM).

Model selection is 5-fold cross-validation over the 486 training loci only: first the chains'
order and smoothing at ``--base-k``, then K at the best of those (selection score: mean over folds
of exon F1 + gene F1, AUGUSTUS definitions). Ablations run in cross-validation at the selected
configuration. Then the selected configuration is fitted on all training loci and predicts
genes.gb.test once; no test score is looked at before that.

    python examples/gene_finding/ghmm.py                 # everything (about 80 minutes on one CPU core)
    python examples/gene_finding/ghmm.py --quick --out /tmp/ghmm_quick    # smoke run (seconds; no test data)
    # intron tails (GHMMConfig.intron_tail = K) at the selected order / smoothing, CV only:
    python examples/gene_finding/ghmm.py --intron-tail --orders 3 --smoothings 2 --ks 960,2000 \
        --no-ablations --no-test --json ghmm_cv_tail.json

A sensor search (``--grid``): CV of the base configuration (the first of ``--orders`` /
``--smoothings`` at ``--base-k``, ``--intron-tail``) and of each entry of a JSON list of
``{"tag": ..., "config": {GHMMConfig field: value}}`` overriding it, written to ``--json`` under
``"grid"`` (``--append`` keeps the entries already there and skips their tags); nothing else runs:

    python examples/gene_finding/ghmm.py --intron-tail --orders 3 --smoothings 2 --base-k 960 \
        --grid examples/gene_finding/ghmm_sensor_grid.json --json ghmm_cv_sensor_search.json

Outputs in ``--out`` (default examples/gene_finding/results): ``ghmm_cv.json`` (fold scores of every
configuration, ablations, the chosen configuration, test metrics, timings) and ``test_ghmm.gff3``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from torch_semimarkov.genomics.evaluate import evaluate_predictions, format_table
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
from torch_semimarkov.genomics.gff import write_gff3
from torch_semimarkov.genomics.records import Gene, GenomicRecord, records_summary

HERE = os.path.dirname(os.path.abspath(__file__))
SIGNAL_COMPONENTS = ("donor", "acceptor", "start", "stop")
LEVELS = ("nuc", "exon", "gene")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(HERE, "data"), help="folder holding (or receiving) the augustus-doc files")
    p.add_argument("--download", action="store_true", help="fetch augustus-doc with apt-get download if the data are missing")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    p.add_argument("--orders", default="3,4,5,6", help="Markov chain orders tried")
    p.add_argument("--smoothings", default="2,10", help="Markov chain smoothing weights tried")
    p.add_argument("--base-k", type=int, default=960, help="K of the order / smoothing search")
    p.add_argument("--ks", default="960,2000,4000,8000", help="K values tried at the best order / smoothing")
    p.add_argument("--threads", type=int, default=1, help="numba and torch threads")
    p.add_argument("--no-test", action="store_true", help="skip the test prediction")
    p.add_argument("--no-ablations", action="store_true", help="skip the ablations")
    p.add_argument("--intron-tail", action="store_true",
                   help="every configuration with GHMMConfig.intron_tail = K (geometric intron lengths from K on, "
                        "long introns as tail pieces: no per-piece cost)")
    p.add_argument("--json", default="ghmm_cv.json", help="name of the report in --out")
    p.add_argument("--grid", default=None,
                   help="sensor search: a JSON file (or inline JSON) with a list of {\"tag\": ..., \"config\": {...}} "
                        "overriding the base configuration; runs the base and every entry in CV, nothing else")
    p.add_argument("--append", action="store_true", help="with --grid: keep the entries of an existing --json "
                                                         "report and skip the tags already there")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 40 short training loci, 2 folds, orders 2,3, K 120,240; 20 other training loci "
                        "stand in for the test set")
    return p.parse_args(argv)


def fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    """(n,) fold of each locus: a seeded permutation dealt round-robin."""
    perm = np.random.default_rng(seed).permutation(n)
    out = np.empty(n, dtype=np.int64)
    out[perm] = np.arange(n) % folds
    return out


def cv_table(rows: List[dict]) -> str:
    """Markdown: one row per cross-validated configuration, mean (std over folds) and pooled F1."""
    lines = ["| configuration | exon F1 mean (std) | gene F1 mean (std) | nucleotide F1 | pooled exon / gene F1 | seconds |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        m, s, p = r["mean"], r["std"], r["pooled"]
        lines.append(f"| {r['tag']} | {m['exon_f1']:.3f} ({s['exon_f1']:.3f}) | {m['gene_f1']:.3f} ({s['gene_f1']:.3f}) | "
                     f"{m['nuc_f1']:.3f} | {p['exon_f1']:.3f} / {p['gene_f1']:.3f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def short(m: Dict[str, float]) -> Dict[str, float]:
    return {k: round(float(v), 4) for k, v in m.items() if k.endswith(("sens", "spec", "f1"))}


def inframe_stops(record: GenomicRecord, gene: Gene) -> int:
    """Stop codons in a predicted gene's reading frame (spliced CDS, stop codon after it excluded)."""
    comp = {"A": "T", "C": "G", "G": "C", "T": "A"}
    cds = "".join(record.sequence[e.start:e.end] for e in gene.exons)
    if gene.strand == "-":
        cds = "".join(comp.get(b, "N") for b in reversed(cds))
    cds = cds[(3 - gene.first_phase) % 3:]
    return sum(cds[i:i + 3] in ("TAA", "TAG", "TGA") for i in range(0, len(cds) - 2, 3))


class Runner:
    def __init__(self, records: List[GenomicRecord], folds: np.ndarray, log):
        self.records, self.folds, self.log = records, folds, log
        self.nfolds = int(folds.max()) + 1

    def cv(self, tag: str, config: GHMMConfig, weights: Optional[Dict[str, float]] = None) -> dict:
        """Fit on all folds but one, predict the held-out fold, for every fold."""
        t0 = time.perf_counter()
        per_fold, preds, fit_s, pred_s = [], {}, 0.0, 0.0
        for f in range(self.nfolds):
            train = [r for r, k in zip(self.records, self.folds) if k != f]
            held = [r for r, k in zip(self.records, self.folds) if k == f]
            t = time.perf_counter()
            model = GHMM.fit(train, config)
            fit_s += time.perf_counter() - t
            t = time.perf_counter()
            pred = model.predict(held, weights)
            pred_s += time.perf_counter() - t
            preds.update(pred)
            per_fold.append(short(evaluate_predictions(held, pred)))
        pooled = evaluate_predictions(self.records, preds)
        mean = {k: float(np.mean([m[k] for m in per_fold])) for k in per_fold[0]}
        res = {"tag": tag, "config": config.to_dict(), "weights": dict(weights or {}), "folds": per_fold,
               "mean": {k: round(v, 4) for k, v in mean.items()},
               "std": {k: round(float(np.std([m[k] for m in per_fold])), 4) for k in per_fold[0]},
               "pooled": short(pooled), "score": round(mean["exon_f1"] + mean["gene_f1"], 4),
               "fit_seconds": round(fit_s, 1), "predict_seconds": round(pred_s, 1),
               "seconds": round(time.perf_counter() - t0, 1),
               "inframe_stop_genes": sum(inframe_stops(r, g) > 0 for r in self.records for g in preds[r.name])}
        folds_txt = " ".join(f"{m['exon_f1']:.3f}/{m['gene_f1']:.3f}" for m in per_fold)
        self.log(f"  {tag:<34} exon F1 {mean['exon_f1']:.3f} gene F1 {mean['gene_f1']:.3f} "
                 f"(folds exon/gene: {folds_txt}) fit {fit_s:.1f}s predict {pred_s:.0f}s")
        return res


def run_grid(args, runner: "Runner", report: dict, out_json: str, order: int, smoothing: float, base_k: int,
             intron_tail: int, log) -> None:
    """CV of the base configuration and of every grid entry (overrides of it), saved as they finish."""
    spec = args.grid
    entries = json.load(open(spec)) if os.path.exists(spec) else json.loads(spec)
    base = GHMMConfig(order=order, smoothing=smoothing, max_duration=base_k, intron_tail=intron_tail).to_dict()
    report.update({"base_config": base, "grid_spec": entries, "grid": []})
    for key in ("search", "k_search", "ablations"):
        report.pop(key, None)
    if args.append and os.path.exists(out_json):
        old = json.load(open(out_json))
        report["grid"] = old.get("grid", [])
        report["commands"] = old.get("commands", [old.get("command")]) + [report["command"]]
        report["grid_spec"] = old.get("grid_spec", []) + [e for e in entries if e not in old.get("grid_spec", [])]
    done = {r["tag"] for r in report["grid"]}

    def save():
        with open(out_json, "w") as f:
            json.dump(report, f, indent=1)

    log(f"[grid] {args.folds}-fold CV of the base configuration and {len(entries)} variants")
    for tag, over in [("baseline", {})] + [(e["tag"], e.get("config", {})) for e in entries]:
        if tag in done:
            log(f"  {tag:<34} (in the report already)")
            continue
        unknown = set(over) - set(base)
        if unknown:
            raise SystemExit(f"grid entry {tag!r}: no such GHMMConfig fields {sorted(unknown)}")
        res = runner.cv(tag, GHMMConfig(**{**base, **over}))
        res["overrides"] = over
        report["grid"].append(res)
        done.add(tag)
        save()
    ref = next((r for r in report["grid"] if r["tag"] == "baseline"), None)
    if ref is not None:
        for r in report["grid"]:
            r["delta_vs_baseline"] = {k: round(r["mean"][k] - ref["mean"][k], 4) for k in ("exon_f1", "gene_f1")}
            r["delta_vs_baseline"]["score"] = round(r["score"] - ref["score"], 4)
    best = max(report["grid"], key=lambda r: r["score"])
    report["best"] = {"tag": best["tag"], "config": best["config"], "score": best["score"], "cv_mean": best["mean"]}
    save()
    log("\nsensor search:\n" + cv_table(report["grid"]))
    log(f"best: {best['tag']} (score {best['score']}); wrote {out_json}")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        import numba
        numba.set_num_threads(args.threads)
    except ImportError:  # the script needs the compiled CPU engine (pip install -e ".[cpu]")
        sys.exit("this script decodes with the numba engine: pip install -e '.[cpu]'")
    os.makedirs(args.out, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    argv_used = argv if argv is not None else sys.argv[1:]
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + list(argv_used))
    t_start = time.perf_counter()
    paths = tutorial_data(args.data, download=args.download)
    t = time.perf_counter()
    train = load_genbank(paths["train"])
    # the smoke run and the sensor search (--grid) never read genes.gb.test
    test = [] if args.quick or args.grid else load_genbank(paths["test"])
    load_s = time.perf_counter() - t
    orders = [int(x) for x in args.orders.split(",")]
    smoothings = [float(x) for x in args.smoothings.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    base_k = args.base_k
    if args.quick:
        # 20 more training loci stand in for the test set
        by_len = sorted(train, key=len)
        train, test = by_len[:40], by_len[40:60]
        args.folds, orders, smoothings, ks, base_k = 2, [2, 3], [5.0], [120, 240], 120
    log(f"train: {records_summary(train)}; test: {records_summary(test)} (loaded in {load_s:.1f}s)")
    folds = fold_ids(len(train), args.folds, args.seed)
    runner = Runner(train, folds, log)
    out_json = os.path.join(args.out, args.json)
    tail = (lambda K: K) if args.intron_tail else (lambda K: 0)
    sfx = ", intron tail = K" if args.intron_tail else ""
    report = {"command": command, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                                             f"{args.threads} thread(s)",
              "folds": args.folds, "seed": args.seed, "fold_of_locus": {r.name: int(f) for r, f in zip(train, folds)},
              "selection": "mean over folds of exon F1 + gene F1", "search": [], "k_search": [], "ablations": []}

    def save():
        with open(out_json, "w") as f:
            json.dump(report, f, indent=1)

    if args.grid:
        run_grid(args, runner, report, out_json, orders[0], smoothings[0], base_k, tail(base_k), log)
        return

    # 1. the chains' order and smoothing at the base K
    log(f"[1] {args.folds}-fold CV over the Markov chains' order x smoothing (K = {base_k})")
    for order in orders:
        for sm in smoothings:
            report["search"].append(runner.cv(f"order {order}, smoothing {sm:g}, K {base_k}{sfx}",
                                              GHMMConfig(order=order, smoothing=sm, max_duration=base_k,
                                                         intron_tail=tail(base_k))))
            save()
    best = max(report["search"], key=lambda r: r["score"])
    log(f"    best: {best['tag']} (score {best['score']})")

    # 2. K at the best order / smoothing
    log(f"[2] K at order {best['config']['order']}, smoothing {best['config']['smoothing']:g}")
    report["k_search"].append(best)
    for K in ks:
        if K == base_k:
            continue
        cfg = GHMMConfig(**{**best["config"], "max_duration": K, "intron_tail": tail(K)})
        report["k_search"].append(runner.cv(f"order {cfg.order}, smoothing {cfg.smoothing:g}, K {K}{sfx}", cfg))
        save()
    chosen = max(report["k_search"], key=lambda r: r["score"])
    report["chosen"] = {"tag": chosen["tag"], "config": chosen["config"], "cv_mean": chosen["mean"]}
    log(f"    chosen: {chosen['tag']} (score {chosen['score']})")
    save()

    # 3. ablations at the chosen configuration
    log("[3] ablations at the chosen configuration")
    base_cfg = chosen["config"]
    report["ablations"].append({**chosen, "tag": "selected GHMM"})
    for tag, cfg, w in () if args.no_ablations else (
        ("no signal models (WAM weights 0)", base_cfg, {c: 0.0 for c in SIGNAL_COMPONENTS}),
        ("geometric exon and intron lengths", {**base_cfg, "length_kind": "geometric"}, None),
        ("order-0 content chains", {**base_cfg, "order": 0}, None),
        ("signals against the replaced content", {**base_cfg, "signal_contrast": "content"}, None),
    ):
        report["ablations"].append(runner.cv(tag, GHMMConfig(**cfg), w))
        save()

    # 4. fit on every training locus, predict the test set once
    if not args.no_test:
        log("[4] fit on all training loci, predict " + ("20 other training loci (smoke run)" if args.quick else "genes.gb.test once"))
        cfg = GHMMConfig(**base_cfg)
        t = time.perf_counter()
        model = GHMM.fit(train, cfg)
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        pred = model.predict(test)
        pred_s = time.perf_counter() - t
        metrics = evaluate_predictions(test, pred)
        gff = os.path.join(args.out, "test_ghmm.gff3")
        write_gff3(gff, pred, source="torch-semimarkov-ghmm", lengths={r.name: len(r) for r in test},
                   header=[f"GHMM (generative sensors, weights 1), config {cfg.to_dict()}; made by:", command])
        report["test"] = {"metrics": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()},
                          "fit_seconds": round(fit_s, 2), "predict_seconds": round(pred_s, 1),
                          "test_bases": sum(len(r) for r in test), "gff3": os.path.relpath(gff, args.out),
                          "inframe_stop_genes": sum(inframe_stops(r, g) > 0 for r in test for g in pred[r.name]),
                          "predicted_genes": sum(len(v) for v in pred.values())}
        save()
        log(format_table({"GHMM (this script)": metrics}))
        log(f"    fit {fit_s:.1f}s, predict {pred_s:.1f}s for {report['test']['test_bases']} bases")
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    save()
    for title, key in (("order x smoothing", "search"), ("K", "k_search"), ("ablations", "ablations")):
        log(f"\n{title}:\n" + cv_table(report[key]))
    log(f"wrote {out_json} ({report['total_seconds']:.0f}s in all)")


if __name__ == "__main__":
    main()
