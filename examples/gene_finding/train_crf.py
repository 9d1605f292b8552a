"""Train the feature semi-CRF gene finder (GHMM components + learned weights) with 5-fold CV.

1. Split ``genes.gb.train`` into folds (fixed seed). Fit the generative GHMM
   (:class:`torch_semimarkov.genomics.ghmm.GHMM`) once without each fold and once on everything.
2. Features: each training locus is scored by the GHMM fitted without its fold (honest, out-of-fold
   sensor scores); the test loci by the GHMM fitted on everything.
3. Cross-validation: for each fold j, a :class:`~torch_semimarkov.genomics.feature_crf.FeatureCRF`
   over the GHMM fitted without j learns its weights by the exact NLL of the gold labellings of the
   other folds' loci (L-BFGS, full batch, an L2 pull towards the GHMM); fold j is decoded by it and
   by the generative GHMM (weights 1): exon / gene F1 per fold, AUGUSTUS's definitions.
   With ``--thresholds``, both models are also decoded by their posteriors (``mea_cv.py``) at each
   threshold.
4. The model and decoder with the best mean CV exon F1 predict ``genes.gb.test`` once (both
   models' Viterbi predictions are written too, the table's rows): GFF3 with per-exon posterior
   scores, metrics.

(Note: a training locus's out-of-fold sensors saw the held-out fold's genes when the weights for
that fold are learned; the held-out fold's own scores never come from sensors that saw it.)

Usage (GPU; about 8 minutes on an H200):
    python examples/gene_finding/train_crf.py --data DIR --out OUT
    python examples/gene_finding/train_crf.py --data DIR --out OUT --stage final   # step 4 only
    python examples/gene_finding/train_crf.py --smoke --out /tmp/crf_smoke         # CPU, a few loci
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from multiprocessing import get_context
from typing import Dict, List

import numpy as np
import torch

from torch_semimarkov.genomics.evaluate import evaluate_predictions
from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
from torch_semimarkov.genomics.genbank import load_genbank, tutorial_data
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
from torch_semimarkov.genomics.gff import write_gff3

_WORK: Dict = {}  # what forked workers read (the fitted GHMMs and the records)


def _features(args):
    model_key, idx = args
    return idx, _WORK["models"][model_key].features(_WORK["records"][idx])


def _fit(args):
    key, config = args
    folds = _WORK["folds"]
    records = [r for r, f in zip(_WORK["records"], folds) if key == "all" or f != key]
    return key, GHMM.fit(records, config)


def fit_ghmms(records: List, folds: np.ndarray, config: GHMMConfig, procs: int) -> Dict:
    """The GHMM fitted without each fold and on everything, in parallel (fork) when procs > 1."""
    _WORK.update(records=records, folds=folds)
    keys = [(j, config) for j in range(int(folds.max()) + 1)] + [("all", config)]
    if procs > 1:
        with get_context("fork").Pool(min(procs, len(keys))) as pool:
            return dict(pool.map(_fit, keys))
    return dict(map(_fit, keys))


def features_for(models: Dict, records: List, assign: List, procs: int) -> List:
    """``assign[i]`` names the model that scores record i; in parallel (fork) when procs > 1."""
    _WORK.update(models=models, records=records)
    jobs = [(assign[i], i) for i in range(len(records))]
    out = [None] * len(records)
    if procs > 1:
        with get_context("fork").Pool(procs) as pool:
            for i, f in pool.imap_unordered(_features, jobs, chunksize=4):
                out[i] = f
    else:
        for i, f in map(_features, jobs):
            out[i] = f
    return out


def batches(indices: List[int], lengths: List[int], max_batch: int) -> List[List[int]]:
    """Loci sorted by length in groups of at most ``max_batch`` (one engine program each)."""
    order = sorted(indices, key=lambda i: lengths[i])
    return [order[i:i + max_batch] for i in range(0, len(order), max_batch)]


def train(crf: FeatureCRF, packed: List, reg: float, max_iter: int, budget_s: float, dtype, log,
          margin: float = 0.0) -> Dict:
    """L-BFGS on the mean per-locus NLL of the gold labellings (with ``margin``, the softmax-margin
    loss) + reg * penalty (full batch)."""
    loci = float(sum(b.batch for b in packed))
    # max_iter=1 per step() (the time budget is checked between iterations); max_eval bounds the line search
    opt = torch.optim.LBFGS([p for p in crf.parameters() if p.requires_grad], lr=1.0, max_iter=1, max_eval=20, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-10, tolerance_change=1e-12)
    state = {"evals": 0, "dropped": 0}

    def closure():
        opt.zero_grad()
        total = 0.0
        dropped = 0
        for b in packed:
            nll = crf.nll(b, dtype, margin=margin)
            ok = torch.isfinite(nll)
            dropped += int((~ok).sum())
            loss = torch.where(ok, nll, torch.zeros_like(nll)).sum().double() / loci
            loss.backward()
            total += float(loss.detach())
        pen = reg * crf.penalty()
        pen.backward()
        state["evals"] += 1
        state["dropped"] = dropped
        return torch.tensor(total + float(pen.detach()))

    t0 = time.perf_counter()
    history = []
    for it in range(max_iter):
        loss = float(opt.step(closure))
        history.append(loss)
        log(f"    iteration {it + 1}: loss {loss:.4f} per locus ({state['evals']} evaluations, "
            f"{time.perf_counter() - t0:.0f} s)")
        if time.perf_counter() - t0 > budget_s or (len(history) > 2 and abs(history[-2] - history[-1]) < 1e-5):
            break
    return {"loss": history, "evaluations": state["evals"], "seconds": time.perf_counter() - t0,
            "loci_with_forbidden_gold": state["dropped"]}


def decode(model, feats, records, grammar, device, dtype, max_batch, posteriors=False, thresholds=()):
    """``{decoder: ({name: genes}, {name: exon scores})}`` of records from their features: decoder
    ``"viterbi"``, and ``"mea:KAPPA"`` (posterior decoding, :meth:`FeatureCRF.decode_mea`) for each
    threshold; exon scores (posterior upper bounds) only with ``posteriors``."""
    names = ["viterbi"] + [f"mea:{k:g}" for k in thresholds]
    preds, scores = {n: {} for n in names}, {n: {} for n in names}
    lengths = [f.T for f in feats]
    for group in batches(list(range(len(feats))), lengths, max_batch):
        batch = pack([feats[i] for i in group], device=device, dtype=dtype)
        found = {"viterbi": model.decode(batch, dtype)}
        # one forward-backward pass a batch, shared by the posterior decoders and the exon scores
        m = model.marginals(batch, dtype) if posteriors or thresholds else None
        if thresholds:
            found.update({f"mea:{k:g}": v
                          for k, v in model.decode_mea(batch, list(thresholds), dtype, marginals=m).items()})
        for name, segs in found.items():
            post = model.exon_posteriors(batch, segs, dtype, marginals=m) if posteriors else [None] * len(group)
            for i, s, p in zip(group, segs, post):
                genes = grammar.decode(s, prefix=f"{records[i].name}.g")
                preds[name][records[i].name] = genes
                if p is not None:
                    scores[name][records[i].name] = [[p.get((e.start, e.end)) for e in gene.exons] for gene in genes]
    return {n: (preds[n], scores[n]) for n in names}


def parse_thresholds(text: str, ap: argparse.ArgumentParser) -> List[float]:
    """The finite numbers of a comma-separated ``--thresholds`` (the parser's error otherwise)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = [float("nan")]
    if not all(np.isfinite(v) for v in values):
        ap.error(f"--thresholds takes numbers separated by commas, got {text!r}")
    return values


def cv_means(rows: List[Dict]) -> Dict[str, Dict[str, float]]:
    """``{candidate: {metric: mean over folds}}`` of per-fold ``{candidate: metrics}`` rows."""
    return {k: {m: float(np.mean([r[k][m] for r in rows])) for m in ("exon_f1", "gene_f1", "nuc_f1")}
            for k in rows[0]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="examples/gene_finding/data", help="folder with (or to receive) the data")
    ap.add_argument("--download", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", choices=("all", "cv", "final"), default="all")
    ap.add_argument("--only-folds", default=None, metavar="J,J",
                    help="cv: run only these folds (1-based), keeping the others already in OUT/crf_cv.json "
                         "with the same configuration (a CV over several device calls); '' runs none")
    ap.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                    help="cv / final: take the folds (and a test result) of these crf_cv.json files, runs of the "
                         "same configuration (e.g. folds run at once on several GPUs, each with its own --out)")
    ap.add_argument("--ghmm-config", default=None, help="JSON of GHMMConfig fields (e.g. the CV-selected one)")
    ap.add_argument("--max-duration", type=int, default=None)
    ap.add_argument("--reg", type=float, default=0.05, help="L2 pull towards the GHMM (per locus of data)")
    ap.add_argument("--max-iter", type=int, default=25)
    ap.add_argument("--params", default="weights,offset",
                    help="the parameters learned (of weights, offset, duration_delta, transition_delta, and "
                         "site_bases with a --ghmm-config of signal_bases true); the others stay at the GHMM's values")
    ap.add_argument("--margin", type=float, default=0.0,
                    help="softmax-margin training: log Z over scores raised by this many nats per wrong exon "
                         "boundary (FeatureCRF.boundary_cost); 0: the plain NLL")
    ap.add_argument("--then", default="", metavar="PARAMS",
                    help="after the fit of --params, fit these parameters alone (the others fixed) for --then-iter "
                         "iterations: e.g. site_bases, whose curvature (~0.5) is thousands of times below the "
                         "offsets', so that a joint L-BFGS hardly moves them")
    ap.add_argument("--then-iter", type=int, default=15)
    ap.add_argument("--budget", type=float, default=75.0, help="seconds of L-BFGS per fit (per stage)")
    ap.add_argument("--model", default=None,
                    help="final: the feature_crf.pt of a final fit of this configuration (e.g. run beside the "
                         "CV folds, before the selection was known) instead of fitting again")
    ap.add_argument("--thresholds", default="", metavar="K,K",
                    help="also decode by posteriors (mea_cv.py) with these thresholds, for both models; the CV then "
                         "selects among every model and decoder (e.g. 0.5,0.6,0.7)")
    ap.add_argument("--max-train-length", type=int, default=20000, help="longest locus the weights train on")
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--procs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="CUDA: allow PyTorch's atomic (run-to-run varying) sums; by default deterministic algorithms")
    ap.add_argument("--smoke", action="store_true", help="CPU, a few loci, small K: a check that everything runs")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, f"train_crf_{args.stage}.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    if device.type == "cuda" and not args.nondeterministic:
        # index_add / gather / index_put backward sum with atomics on CUDA: two fits of one configuration
        # drifted apart from L-BFGS's 7th iteration (test exon F1 0.804 and 0.825); the deterministic
        # kernels (and cuBLAS's fixed workspace) make a fit repeat exactly
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    paths = tutorial_data(args.data, download=args.download)
    train_recs = load_genbank(paths["train"])
    test_recs = load_genbank(paths["test"])
    cfg_fields = json.load(open(args.ghmm_config)) if args.ghmm_config else {}
    if args.max_duration:
        cfg_fields["max_duration"] = args.max_duration
    if args.smoke:
        rng = np.random.default_rng(args.seed)
        train_recs = [train_recs[i] for i in rng.permutation(len(train_recs))[:25]]
        test_recs = sorted(test_recs, key=len)[:4]
        cfg_fields.update(max_duration=cfg_fields.get("max_duration", 240), order=2)
        args.max_iter, args.max_train_length, args.folds = min(args.max_iter, 2), min(args.max_train_length, 4000), 2
    config = GHMMConfig(**cfg_fields)
    thresholds = parse_thresholds(args.thresholds, ap)
    groups = {"weights", "offset", "duration_delta", "transition_delta"} | ({"site_bases"} if config.signal_bases else set())
    if not args.margin >= 0:
        ap.error(f"--margin must be >= 0, got {args.margin}")
    for option, text in (("--params", args.params), ("--then", args.then)):
        unknown = {x for x in text.split(",") if x} - groups
        if unknown or (option == "--params" and not text):
            ap.error(f"{option}: no parameters {sorted(unknown)} in this model (it has {sorted(groups)}; site_bases "
                     "needs a --ghmm-config with signal_bases true)")
    log(f"train_crf: {len(train_recs)} training loci, {len(test_recs)} test loci, K = {config.max_duration}, "
        f"device {device}, stage {args.stage}")
    folds = np.random.default_rng(args.seed).permutation(len(train_recs)) % args.folds
    result_path = os.path.join(args.out, "crf_cv.json")
    results = json.load(open(result_path)) if os.path.exists(result_path) else {}
    setup = dict(config=config.to_dict(), folds=folds.tolist(), reg=args.reg, params=args.params,
                 **({"then": args.then, "then_iter": args.then_iter} if args.then else {}),
                 **({"margin": args.margin} if args.margin else {}),
                 max_train_length=args.max_train_length, budget=args.budget, max_iter=args.max_iter,
                 thresholds=thresholds)
    same = all(results.get(k) == v for k, v in setup.items())
    merged = {}
    for path in args.merge:
        other = json.load(open(path))
        if not all(other.get(k) == v for k, v in setup.items()):
            raise ValueError(f"--merge {path}: a run of another configuration (compare its {', '.join(setup)} "
                             "with this run's)")
        merged.update({r["fold"]: r for r in other.get("cv", [])})
        if "test" in other:
            results["test"] = other["test"]
    todo = range(args.folds) if args.only_folds is None else [int(x) - 1 for x in args.only_folds.split(",") if x]
    results.update(**setup)
    if args.stage != "cv" or todo:  # (a cv stage with no folds to run only merges)
        t0 = time.perf_counter()
        models = fit_ghmms(train_recs, folds, config, args.procs)
        log(f"  {args.folds + 1} GHMM fits: {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        feats = features_for(models, train_recs, [int(f) for f in folds], args.procs)
        log(f"  out-of-fold features of {len(feats)} training loci: {time.perf_counter() - t0:.1f} s")
        grammar = models["all"].grammar
        lengths = [f.T for f in feats]
        results.update(device=str(device), gpu=torch.cuda.get_device_name() if device.type == "cuda" else None)

    def fit(model_key, train_idx):
        crf = FeatureCRF(models[model_key]).to(device)
        def learn(text):
            learned = set(text.split(","))
            for name, p in crf.named_parameters():
                p.requires_grad_(name.split(".")[0] in learned)  # (site_bases.donor: one of site_bases)

        learn(args.params)
        usable = [i for i in train_idx if lengths[i] <= args.max_train_length]
        packed = [pack([feats[i] for i in g], [train_recs[i].genes for i in g], device=device, dtype=dtype,
                       grammar=grammar) for g in batches(usable, lengths, args.max_batch)]
        info = train(crf, packed, args.reg, args.max_iter, args.budget, dtype, log, args.margin)
        if args.then:
            learn(args.then)
            log(f"    then {args.then} alone:")
            info["then"] = train(crf, packed, args.reg, args.then_iter, args.budget, dtype, log, args.margin)
        info.update(train_loci=len(usable), train_bases=int(sum(lengths[i] for i in usable)))
        return crf, info

    if args.stage in ("all", "cv"):
        # folds already in OUT/crf_cv.json (same config) are kept: a CV can span several runs
        done = {r["fold"]: r for r in results.get("cv", [])} if same else {}
        done.update(merged)
        for j in todo:
            done.pop(j, None)
        cv = [done[j] for j in sorted(done)]
        results["cv"] = cv  # (a run that only merges records the folds too)
        for j in todo:
            held = [i for i in range(len(train_recs)) if folds[i] == j]
            rest = [i for i in range(len(train_recs)) if folds[i] != j]
            log(f"  fold {j + 1}/{args.folds}: training on {len(rest)} loci")
            crf, info = fit(j, rest)
            recs = [train_recs[i] for i in held]
            fj = [feats[i] for i in held]
            t1 = time.perf_counter()
            ghmm = FeatureCRF(models[j]).to(device)  # weights 1, corrections 0: the generative GHMM
            found = {kind: decode(model, fj, recs, grammar, device, dtype, args.max_batch, thresholds=thresholds)
                     for kind, model in (("crf", crf), ("ghmm", ghmm))}
            metrics = {kind: {name: evaluate_predictions(recs, p) for name, (p, _) in d.items()}
                       for kind, d in found.items()}
            m_crf, m_ghmm = metrics["crf"].pop("viterbi"), metrics["ghmm"].pop("viterbi")
            row = {"fold": j, "crf": m_crf, "ghmm": m_ghmm, "train": info, "decode_seconds": time.perf_counter() - t1,
                   "weights": dict(zip(crf.components, crf.weights.detach().cpu().tolist()))}
            if len(crf.site_bases):
                row["site_bases"] = {k: v.detach().cpu().tolist() for k, v in crf.site_bases.items()}
            if thresholds:  # "crf+mea:0.6": metrics, ...
                row["posterior_decoding"] = {f"{kind}+{name}": m for kind, d in metrics.items() for name, m in d.items()}
            cv = sorted(cv + [row], key=lambda r: r["fold"])
            log(f"    fold {j + 1}: exon F1 CRF {m_crf['exon_f1']:.3f} / GHMM {m_ghmm['exon_f1']:.3f}, gene F1 "
                f"{m_crf['gene_f1']:.3f} / {m_ghmm['gene_f1']:.3f}")
            results["cv"] = cv
            json.dump(results, open(result_path, "w"), indent=1)
        if len(cv) < args.folds:
            json.dump(results, open(result_path, "w"), indent=1)
            log(f"  folds {sorted(r['fold'] + 1 for r in cv)} of {args.folds} done: run the others with --only-folds")
            log("done")
            return
        rows = [{"crf": r["crf"], "ghmm": r["ghmm"], **r.get("posterior_decoding", {})} for r in cv]
        mean = cv_means(rows)
        results["cv_mean"] = mean
        # the best mean CV exon F1; ties go to the CRF, then to Viterbi
        results["selected"] = max(mean, key=lambda k: (mean[k]["exon_f1"], k.startswith("crf"), "+" not in k))
        log("  CV mean exon / gene F1: " + ", ".join(f"{k} {v['exon_f1']:.3f} / {v['gene_f1']:.3f}"
                                                     for k, v in mean.items()) + f"; selected: {results['selected']}")
        json.dump(results, open(result_path, "w"), indent=1)

    if args.stage in ("all", "final"):
        selected = results.get("selected", "crf")
        log(f"  final: {selected} trained on all {len(train_recs)} training loci, predicting the test set once")
        test_feats = features_for(models, test_recs, ["all"] * len(test_recs), args.procs)
        out = {}
        for kind in ("crf", "ghmm"):
            if kind == "crf" and args.model:
                try:
                    model = FeatureCRF.load(args.model, models["all"]).to(device)
                except ValueError as err:
                    raise ValueError(f"--model {args.model}: fitted with another GHMM configuration") from err
                out["train"] = dict(results.get("test", {}).get("train", {}), loaded=args.model)
            elif kind == "crf":
                model, info = fit("all", list(range(len(train_recs))))
                out["train"] = info
                model.save(os.path.join(args.out, "feature_crf.pt"))
            else:
                model = FeatureCRF(models["all"]).to(device)
            if kind == "crf":
                out["weights"] = dict(zip(model.components, model.weights.detach().cpu().tolist()))
                if len(model.site_bases):
                    out["site_bases"] = {k: v.detach().cpu().tolist() for k, v in model.site_bases.items()}
            # Viterbi for both models (the table's rows); posterior decoding where CV selected it
            mea = [float(selected.split(":")[1])] if selected.startswith(kind + "+mea:") else []
            t1 = time.perf_counter()
            found = decode(model, test_feats, test_recs, grammar, device, dtype, args.max_batch, posteriors=True,
                           thresholds=mea)
            seconds = time.perf_counter() - t1
            for decoder, (pred, scores) in found.items():
                key = kind if decoder == "viterbi" else f"{kind}+{decoder}"
                metrics = evaluate_predictions(test_recs, pred)
                out[key] = {"metrics": metrics, "predict_seconds": seconds}
                name = {"crf": "test_feature_crf", "ghmm": "test_ghmm_gpu"}[kind] + \
                    ("" if decoder == "viterbi" else "_" + decoder.replace(":", "")) + ".gff3"
                write_gff3(os.path.join(args.out, name), pred, sequences={r.name: r.sequence for r in test_recs},
                           exon_scores=scores, source=f"torch-semimarkov-{kind}",
                           header=[f"{kind} ({decoder} decoding) trained on genes.gb.train: python {' '.join(sys.argv)}",
                                   "column 6 of exon / CDS lines: the exon's posterior upper bound "
                                   "(min of its start and end marginals)"])
                log(f"    test {key}: exon F1 {metrics['exon_f1']:.3f}, gene F1 {metrics['gene_f1']:.3f} "
                    f"(predicted in {seconds:.1f} s)")
        results["test"] = out
        json.dump(results, open(result_path, "w"), indent=1)
    log("done")


if __name__ == "__main__":
    main()
