"""Gene finding: the gene grammar, frame and signal scores, GFF3, evaluation, and a CPU smoke run.

The tests on the AUGUSTUS tutorial data fetch Debian's augustus-doc package with
``apt-get download`` (into ``examples/gene_finding/data``, ignored by git, or
``$TORCH_SEMIMARKOV_GENE_DATA``) and are skipped, saying why, where that fails.
"""

from __future__ import annotations

import io
import json
import os
import random
import runpy
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_semimarkov.genomics.batches import prepare_loci, window_batches
from torch_semimarkov.genomics.evaluate import evaluate_predictions
from torch_semimarkov.genomics.gff import read_cds, write_gff3
from torch_semimarkov.genomics.labels import MIN_INTRON, CodonLabels, GeneGrammar
from torch_semimarkov.genomics.models import GeneStructureHead, SemiCRFGeneFinder, build_model
from torch_semimarkov.genomics.records import (
    STOP_CODONS, Exon, Gene, GenomicRecord, encode_dna, signal_violations, stop_codon_tracks,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "gene_finding")
SENSE = [a + b + c for a in "ACGT" for b in "ACGT" for c in "ACGT" if a + b + c not in STOP_CODONS]
COMP = str.maketrans("ACGT", "TGCA")


def _rc(s: str) -> str:
    return s.translate(COMP)[::-1]


def synthetic_record(rng: random.Random, name: str = "s", n_genes: int = 2, long_exon: int = 0) -> GenomicRecord:
    """Random DNA with genes planted on both strands: ATG ... stop, GT...AG introns, no in-frame stop."""
    parts, genes, pos = [], [], 0

    def add(seq):
        nonlocal pos
        parts.append(seq)
        pos += len(seq)

    add("".join(rng.choice("ACGT") for _ in range(rng.randint(40, 80))))
    for g in range(n_genes):
        n_ex = rng.randint(1, 4)
        lens = [rng.randint(3, 60) for _ in range(n_ex)]
        if long_exon:
            lens[0] = long_exon
        total = sum(lens)
        lens[-1] += (-total) % 3 + (3 if lens[-1] + (-total) % 3 < 3 else 0)
        cds = "ATG" + "".join(rng.choice(SENSE) for _ in range(sum(lens) // 3 - 1))
        strand = "+" if g % 2 == 0 else "-"
        pieces, a = [], 0
        for L in lens:
            pieces.append(cds[a:a + L])
            a += L
        introns = ["GT" + "".join(rng.choice("ACGT") for _ in range(rng.randint(MIN_INTRON, 70))) + "AG" for _ in lens[1:]]
        stop = rng.choice(STOP_CODONS)
        transcript = [pieces[0]]
        for intr, piece in zip(introns, pieces[1:]):
            transcript += [intr, piece]
        genomic = "".join(transcript) + stop
        start = pos
        exons, off = [], 0
        for i, part in enumerate(transcript):
            if i % 2 == 0:
                exons.append((off, off + len(part)))
            off += len(part)
        if strand == "-":
            genomic = _rc(genomic)
            G = len(genomic)
            exons = [(G - e, G - s) for s, e in exons]
            exons = [(s, e) for s, e in exons]
            add(genomic)
            genes.append(Gene(f"{name}g{g}", "-", tuple(Exon(start + s, start + e) for s, e in exons)))
        else:
            add(genomic)
            genes.append(Gene(f"{name}g{g}", "+", tuple(Exon(start + s, start + e) for s, e in exons)))
        add("".join(rng.choice("ACGT") for _ in range(rng.randint(40, 80))))
    return GenomicRecord(name, "".join(parts), genes)


@pytest.fixture(scope="module")
def records():
    rng = random.Random(0)
    return [synthetic_record(rng, f"s{i}", n_genes=2, long_exon=150 if i % 2 else 0) for i in range(6)]


# ---------------------------------------------------------------------------- labels


@pytest.mark.parametrize("K", [60, 61, 96, 300])
def test_grammar_encode_decode_roundtrip(records, K):
    g = GeneGrammar()
    kinds = set()
    for rec in records:
        segs = g.encode(rec.genes, len(rec), K)
        g.check(segs, len(rec), K)
        genes = g.decode(segs)
        assert [(x.strand, x.exons) for x in genes] == [(x.strand, x.exons) for x in rec.genes]
        assert not any(x.partial for x in genes)
        kinds |= {(g.labels[c].kind, g.labels[c].strand) for _, _, c in segs}
    if K < 150:  # exons of 150 bases on both strands became continuation pieces
        assert {("cont", "+"), ("cont", "-")} <= kinds


def test_grammar_transitions_and_durations():
    g = GeneGrammar()
    ok = g.allowed_transitions()
    i = g.index
    assert ok[i["N"], i["+initial(1)"]] and ok[i["+initial(1)"], i["+intron(1)"]]
    assert not ok[i["+initial(1)"], i["+intron(0)"]]
    assert ok[i["+intron(2)"], i["+internal(2,0)"]] and not ok[i["+intron(2)"], i["+internal(1,0)"]]
    assert not ok[i["N"], i["+internal(0,0)"]] and not ok[i["+single"], i["-single"]]
    # the - strand reads right to left: terminal exon first, phase of the intron = its entry phase
    assert ok[i["N"], i["-terminal(1)"]] and ok[i["-terminal(1)"], i["-intron(1)"]]
    assert ok[i["-intron(1)"], i["-internal(2,1)"]] and ok[i["-initial(2)"], i["N"]]
    assert ok[i["-initial(2)"], i["-cont[N]"]] and ok[i["-cont[N]"], i["N"]]
    assert ok[i["+cont[intron 1]"], i["+internal(1,2)"]] and not ok[i["+cont[intron 1]"], i["+internal(0,2)"]]
    mask = g.duration_mask(60)
    assert mask[3, i["+internal(1,2)"]] and not mask[4, i["+internal(1,2)"]] and not mask[0, i["+internal(1,2)"]]
    assert not mask[MIN_INTRON - 2, i["+intron(0)"]] and mask[MIN_INTRON - 1, i["+intron(0)"]]
    with pytest.raises(ValueError, match="forbids"):
        g.check([(0, 10, i["N"]), (10, 16, i["+internal(0,0)"]), (16, 20, i["N"])], 20, 60)


def test_codon_labels_roundtrip(records):
    cl = CodonLabels()
    ok = cl.allowed_transitions()
    for rec in records:
        lab = cl.encode(rec.genes, len(rec))
        assert all(bool(ok[a, b]) for a, b in zip(lab[:-1], lab[1:]))
        genes = cl.decode(lab)
        assert [(x.strand, x.exons) for x in genes] == [(x.strand, x.exons) for x in rec.genes]
        assert not any(x.partial for x in genes)


# ---------------------------------------------------------------------------- head


def test_frame_scores_match_brute_force():
    """proj_start + proj_end of every coding segment = its frame's codon-position scores (relative to
    their mean), in-frame stops penalised except a codon that runs past a true exon's 3' end."""
    torch.manual_seed(0)
    rng = random.Random(1)
    H, T, K = 4, 27, 60
    head = GeneStructureHead(K, H, cumsum_dtype=torch.float64, signal_penalty=0.0)
    with torch.no_grad():
        for lin in (head.proj_start, head.proj_end):
            for param in lin.parameters():
                param.zero_()
    seq = "".join(rng.choice("ACGT") for _ in range(T))
    seq = seq[:4] + "TAA" + seq[7:13] + "TTA" + seq[16:]
    codes = torch.as_tensor(encode_dna(seq)).long()[None]
    feats = torch.randn(1, T, H)
    x = torch.cat([feats, stop_codon_tracks(codes), signal_violations(codes)], -1)
    with torch.no_grad():
        out = head.build(x, torch.tensor([T]))
        q = head.frame_proj(feats).double()[0]
        pen = torch.nn.functional.softplus(head.raw_stop_penalty).double()

    q = torch.cat([q[:, :3] - q[:, :3].mean(1, keepdim=True), q[:, 3:] - q[:, 3:].mean(1, keepdim=True)], 1)

    def F(strand, r, t):
        if strand == "+":
            cp = (t - r) % 3
            return q[t, cp] - (pen[0] if cp == 0 and seq[t:t + 3] in STOP_CODONS else 0)
        cp = (r - t) % 3
        return q[t, 3 + cp] - (pen[1] if cp == 0 and t >= 2 and _rc(seq[t - 2:t + 1]) in STOP_CODONS else 0)

    mean = {(st, r): 0.0 for st in "+-" for r in range(3)}
    worst = 0.0
    for c, lab in enumerate(head.grammar.labels):
        if not lab.coding:
            continue
        i, j = lab.entry, lab.exit
        for s in range(T):
            for e in range(s + 2, T):
                if (i + e - s + 1) % 3 != j:
                    continue
                if lab.strand == "+":
                    r = (s - i) % 3
                    want = sum(F("+", r, t) - mean[("+", r)] for t in range(s, e + 1))
                    runs_past = [t for t in (e - 1, e) if (t - r) % 3 == 0 and seq[t:t + 3] in STOP_CODONS]
                    want += pen[0] * len(runs_past) * (lab.kind == "exon")
                else:
                    r = (e + i) % 3
                    want = sum(F("-", r, t) - mean[("-", r)] for t in range(s, e + 1))
                    runs_past = [t for t in (s, s + 1) if (r - t) % 3 == 0 and t >= 2 and _rc(seq[t - 2:t + 1]) in STOP_CODONS]
                    want += pen[1] * len(runs_past) * (lab.kind == "exon")
                got = out.proj_start[0, s, c] + out.proj_end[0, e, c]
                worst = max(worst, abs(float(got) - float(want)))
    assert worst < 1e-5  # float32 parameters, float64 sums


@pytest.mark.parametrize("K", [60, 300])
def test_signal_penalties_only_at_true_exon_ends(records, K):
    """Gold genes with canonical signals pay no signal penalty, long exons' continuation pieces included;
    a gene moved off its start codon pays it."""
    torch.manual_seed(0)
    model = SemiCRFGeneFinder(max_duration=K, hidden=4)
    g = model.grammar
    for rec in records:
        codes = torch.as_tensor(encode_dna(rec.sequence)).long()[None]
        L = torch.tensor([len(rec)])
        x = model.head_inputs(codes)
        segs = g.encode(rec.genes, len(rec), K)
        with torch.no_grad():
            model.head.signal_penalty = 20.0
            a = model.head.gold_score(x, L, segments=[segs])
            model.head.signal_penalty = 0.0
            b = model.head.gold_score(x, L, segments=[segs])
        assert abs(float(a - b)) < 1e-3
    rec = records[0]
    gene = rec.genes[0]
    shifted = Gene("x", gene.strand, tuple(Exon(e.start + 3, e.end + 3) for e in gene.exons))
    segs = g.encode([shifted] + rec.genes[1:], len(rec), K)
    codes = torch.as_tensor(encode_dna(rec.sequence)).long()[None]
    with torch.no_grad():
        x = model.head_inputs(codes)
        model.head.signal_penalty = 20.0
        a = model.head.gold_score(x, torch.tensor([len(rec)]), segments=[segs])
        model.head.signal_penalty = 0.0
        b = model.head.gold_score(x, torch.tensor([len(rec)]), segments=[segs])
    assert float(b - a) >= 20.0 - 1e-3


@pytest.mark.parametrize("kind", ["semicrf", "crf", "softmax"])
def test_models_loss_and_predict(records, kind):
    torch.manual_seed(0)
    model = build_model(kind, max_duration=60, hidden=8) if kind == "semicrf" else build_model(kind, hidden=8)
    K = 60 if kind == "semicrf" else 10_000
    loci = prepare_loci(records, K)
    if kind == "semicrf":
        model.head.init_from_gold([model.grammar.split_runs(l.runs, K) for l in loci])
    batch = next(window_batches(loci, 300, 3, np.random.default_rng(0)))
    for b, segs in enumerate(batch["segments"]):
        GeneGrammar().check(segs, int(batch["lengths"][b]), K)
    loss = model.loss(batch)
    assert torch.isfinite(loss) and float(loss.detach()) >= 0
    loss.backward()
    genes = model.predict_genes(batch["codes"], batch["lengths"])
    assert len(genes) == len(batch["lengths"])
    for gs, L in zip(genes, batch["lengths"].tolist()):
        assert all(0 <= gene.start < gene.end <= L for gene in gs)


# ---------------------------------------------------------------------------- GFF3 and evaluation


def test_gff3_roundtrip_and_evaluation(records):
    pred = {r.name: list(r.genes) for r in records}
    partial = Gene("p", "+", (Exon(1, 10),), first_phase=1, partial=True)
    pred[records[0].name] = pred[records[0].name] + [partial]
    buf = io.StringIO()
    write_gff3(buf, pred, lengths={r.name: len(r) for r in records})
    text = buf.getvalue()
    assert text.startswith("##gff-version 3")
    back = read_cds(io.StringIO(text))
    assert {k: [(g.strand, g.exons, g.partial) for g in v] for k, v in back.items()} == \
        {k: [(g.strand, g.exons, g.partial) for g in v] for k, v in pred.items()}
    m = evaluate_predictions(records, back)
    n_exons = sum(len(g.exons) for r in records for g in r.genes)
    assert m["exon_tp"] == m["exon_anno"] == n_exons and m["exon_pred"] == n_exons + 1
    assert m["gene_tp"] == m["gene_anno"] and m["gene_pred"] == m["gene_anno"] + 1
    assert m["nuc_sens"] == 1.0 and m["nuc_spec"] < 1.0


# ---------------------------------------------------------------------------- the tutorial data


@pytest.fixture(scope="module")
def tutorial_paths():
    from torch_semimarkov.genomics.genbank import tutorial_data

    pytest.importorskip("Bio", reason="the GenBank loader needs Biopython: pip install 'torch-semimarkov[genomics]'")
    root = os.environ.get("TORCH_SEMIMARKOV_GENE_DATA", os.path.join(EXAMPLE, "data"))
    try:
        return tutorial_data(root, download=True), root
    except (FileNotFoundError, subprocess.CalledProcessError, OSError) as err:
        pytest.skip(f"the AUGUSTUS tutorial data could not be fetched with apt-get download augustus-doc: {err}")


def test_tutorial_data_loads_and_encodes(tutorial_paths):
    from torch_semimarkov.genomics.genbank import load_genbank

    paths, _ = tutorial_paths
    train, test = load_genbank(paths["train"]), load_genbank(paths["test"])
    assert (len(train), len(test)) == (486, 100)
    assert sum(len(g.exons) for r in test for g in r.genes) == 472
    g = GeneGrammar()
    for rec in train + test:
        segs = g.encode(rec.genes, len(rec), 960)
        assert [(x.strand, x.exons) for x in g.decode(segs)] == [(x.strand, x.exons) for x in rec.genes]


def test_evaluation_reproduces_augustus_report(tutorial_paths):
    """Our evaluator on AUGUSTUS's own GTF output gives the numbers AUGUSTUS printed for it."""
    from torch_semimarkov.genomics.genbank import load_genbank

    paths, _ = tutorial_paths
    test = load_genbank(paths["test"])
    reported = {  # augustus_{bug,fly}_report.txt: nucleotide sens/spec, exon TP/pred/anno, gene TP/pred
        "bug": (0.975, 0.89, 396, 511, 472, 53, 118),
        "fly": (0.987, 0.895, 427, 512, 472, 67, 105),
    }
    for sp, (ns, nsp, etp, epred, eanno, gtp, gpred) in reported.items():
        pred = read_cds(os.path.join(EXAMPLE, "augustus", f"augustus_{sp}.gtf.gz"), sources=["AUGUSTUS"])
        m = evaluate_predictions(test, pred)
        assert round(m["nuc_sens"], 3) == ns and abs(m["nuc_spec"] - nsp) < 5e-4
        assert (m["exon_tp"], m["exon_pred"], m["exon_anno"]) == (etp, epred, eanno)
        assert (m["gene_tp"], m["gene_pred"], m["gene_anno"]) == (gtp, gpred, 100)


@pytest.mark.integration
def test_smoke_train_predict_evaluate(tutorial_paths, tmp_path, monkeypatch, capsys):
    """The example end to end on the CPU: a few short loci, a few steps, GFF3 out, evaluation runs.
    train.py and predict.py run as subprocesses; evaluate.py (no torch state of its own) runs as
    ``__main__`` in this process through runpy, its command line in sys.argv: the same script and
    exit code without a third interpreter start (issue 23)."""
    _, root = tutorial_paths
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "run"
    run = lambda *a: subprocess.run([sys.executable, *a], env=env, check=True, capture_output=True, text=True, timeout=120)
    run(os.path.join(EXAMPLE, "train.py"), "--smoke", "--data", root, "--out", str(out))
    for kind in ("semicrf", "crf", "softmax"):
        gff = out / f"test_{kind}.gff3"
        assert gff.exists() and gff.read_text().startswith("##gff-version 3")
    evaluate = os.path.join(EXAMPLE, "evaluate.py")
    monkeypatch.setattr(sys, "argv", [evaluate, "--data", root, "--pred", f"semi-CRF={out / 'test_semicrf.gff3'}",
                                      "--augustus", f"AUGUSTUS={os.path.join(EXAMPLE, 'augustus', 'augustus_bug.gtf.gz')}"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        runpy.run_path(evaluate, run_name="__main__")
    assert done.value.code == 0
    stdout = capsys.readouterr().out
    assert "| semi-CRF |" in stdout and "| AUGUSTUS | 0.975 / 0.890" in stdout
    fasta = tmp_path / "x.fa"
    fasta.write_text(">seq1 test\nATGAAACCCGGGTTTTAA\nCCCATGGGGTAA\n")
    run(os.path.join(EXAMPLE, "predict.py"), "--checkpoint", str(out / "semicrf.pt"), "--input", str(fasta), "--out", str(tmp_path / "x.gff3"))
    assert (tmp_path / "x.gff3").read_text().startswith("##gff-version 3")


@pytest.mark.integration
def test_feature_crf_smoke_cv_over_two_runs_then_test(tutorial_paths, tmp_path, capsys):
    """train_crf.py on the CPU with intron tails: fold 1 in one run, fold 2 and the final stage in
    a second that takes the first's fold with ``--merge`` (folds run apart, e.g. one per GPU; a run of
    another configuration is refused), then the selected model predicts the
    test loci (GFF3 with posterior scores) and both test rows are recorded. The weights train on the
    loci of at most 2,000 bases (6 of the smoke's 25; 4,000 gave 18 and three times the test's
    time): the same stages, files and checks, and every fit still has loci to train on. Batches of
    at most 2 loci (sorted by length): decoding a held-out fold in one batch padded every locus to
    the longest (18,030 bases) and took two thirds of the time; pairs still pad a shorter locus."""
    _, root = tutorial_paths
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "crf"
    cfg = tmp_path / "tail.json"
    cfg.write_text(json.dumps({"max_duration": 120, "intron_tail": 120, "signal_bases": True}))
    base = [sys.executable, os.path.join(EXAMPLE, "train_crf.py"), "--smoke", "--data", root, "--out", str(out),
            "--procs", "1", "--budget", "1", "--max-iter", "1", "--max-train-length", "2000", "--max-batch", "2",
            "--ghmm-config", str(cfg), "--thresholds", "0.5", "--params", "weights,offset",
            "--then", "site_bases", "--then-iter", "1", "--margin", "0.5"]
    run = lambda *a: subprocess.run([*base, *a], env=env, check=True, capture_output=True, text=True, timeout=300)
    # the runs that fit little or nothing in this process (no interpreter start, no torch import)
    main = runpy.run_path(os.path.join(EXAMPLE, "train_crf.py"))["main"]
    here = lambda *a: main([*base[2:], *a])  # noqa: E731
    first = run("--stage", "cv", "--only-folds", "1", "--out", str(tmp_path / "fold1"))
    assert "run the others with --only-folds" in first.stdout
    res = json.loads((tmp_path / "fold1" / "crf_cv.json").read_text())
    assert [r["fold"] for r in res["cv"]] == [0] and "cv_mean" not in res
    with pytest.raises(ValueError, match="a run of another configuration"):  # another configuration's folds
        here("--stage", "cv", "--only-folds", "", "--reg", "0.5", "--merge", str(tmp_path / "fold1" / "crf_cv.json"))
    here("--stage", "cv", "--only-folds", "", "--out", str(tmp_path / "merged"), "--merge", str(tmp_path / "fold1" / "crf_cv.json"))
    res = json.loads((tmp_path / "merged" / "crf_cv.json").read_text())  # a run that only merges keeps the folds
    assert [r["fold"] for r in res["cv"]] == [0] and res["cv"][0] == json.loads((tmp_path / "fold1" / "crf_cv.json").read_text())["cv"][0]
    run("--stage", "all", "--only-folds", "2", "--merge", str(tmp_path / "fold1" / "crf_cv.json"))
    res = json.loads((out / "crf_cv.json").read_text())
    assert [r["fold"] for r in res["cv"]] == [0, 1]
    # both models by Viterbi and by their posteriors (--thresholds 0.5), the best CV exon F1 selected
    assert set(res["cv_mean"]) == {"crf", "ghmm", "crf+mea:0.5", "ghmm+mea:0.5"}
    best = max(v["exon_f1"] for v in res["cv_mean"].values())
    assert res["cv_mean"][res["selected"]]["exon_f1"] == best
    assert res["selected"] in res["test"]  # the selected model and decoder predicted the test loci
    assert res["config"]["intron_tail"] == 120 and res["config"]["signal_bases"] and res["margin"] == 0.5
    # the site scores fitted alone after the weights (--then): they moved, and were recorded
    assert res["test"]["train"]["then"]["evaluations"] >= 1 and res["cv"][0]["train"]["then"]["evaluations"] >= 1
    assert set(res["test"]["site_bases"]) == {"donor", "acceptor", "start", "stop"}
    assert max(abs(x) for rows in res["test"]["site_bases"]["donor"] for x in rows) > 0
    with pytest.raises(SystemExit):  # (the parser's error, before anything is fitted)
        here("--stage", "final", "--then", "site_base", "--out", str(tmp_path / "bad"))
    assert "--then: no parameters ['site_base']" in capsys.readouterr().err
    for kind in ("crf", "ghmm"):
        assert 0.0 <= res["test"][kind]["metrics"]["exon_f1"] <= 1.0
    gff = (out / "test_feature_crf.gff3").read_text()
    assert gff.startswith("##gff-version 3") and "##sequence-region" in gff
    # the final stage again from the saved fit (--model): the same CRF, the same test metrics
    here("--stage", "final", "--model", str(out / "feature_crf.pt"), "--out", str(tmp_path / "again"),
         "--merge", str(out / "crf_cv.json"))
    again = json.loads((tmp_path / "again" / "crf_cv.json").read_text())
    assert again["test"]["crf"]["metrics"] == res["test"]["crf"]["metrics"]
    assert again["test"]["weights"] == res["test"]["weights"] and again["test"]["train"]["loaded"]
    assert again["test"]["site_bases"] == res["test"]["site_bases"]


@pytest.mark.integration
def test_mea_cv_smoke_selects_a_decoder_by_cv_then_predicts_test(tutorial_paths, tmp_path):
    """mea_cv.py on the CPU: every fold decoded by Viterbi and each threshold, the decoder with the
    best mean CV exon F1 selected, the test loci decoded once by it (GFF3 and metrics)."""
    _, root = tutorial_paths
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "mea"
    subprocess.run([sys.executable, os.path.join(EXAMPLE, "mea_cv.py"), "--smoke", "--data", root, "--out", str(out),
                    "--procs", "1", "--thresholds", "0.3,0.5"], env=env, check=True, capture_output=True, text=True,
                   timeout=300)
    res = json.loads((out / "mea_cv.json").read_text())
    assert [r["fold"] for r in res["cv"]] == [0, 1]
    assert set(res["cv_mean"]) == {"viterbi", "mea:0.3", "mea:0.5"}
    best = max(v["exon_f1"] for v in res["cv_mean"].values())
    assert res["cv_mean"][res["selected"]]["exon_f1"] == best and res["test"]["decoder"] == res["selected"]
    assert 0.0 <= res["test"]["metrics"]["exon_f1"] <= 1.0
    gff = (out / "test_ghmm_mea.gff3").read_text()
    assert gff.startswith("##gff-version 3")
    scores = [float(line.split("\t")[5]) for line in gff.splitlines() if "\texon\t" in line]
    assert scores and all(0 < s <= 1 + 1e-9 for s in scores)  # the exons' posterior bounds
