"""Alternative transcripts (``predict.py --alternatives N``) and the posteriors of the gene-finding example.

CPU smoke tests: a GHMM fitted on 30 short loci of the AUGUSTUS tutorial's genes.gb.train (small K,
order 2) predicts three test loci with ``--alternatives 2``; the GFF3 passes the semantic checks of
``test_genomics_gff`` and, where GenomeTools' ``gt`` is found, ``gt gff3validator``; an untrained
semi-CRF checkpoint does the same on random DNA. The tutorial data are fetched as
``test_genomics`` fetches them, and the tests that need them are skipped, saying why, where that
fails. The writer's ``alternatives`` and ``read_cds``'s handling of them are tested on their own.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import random
import re
import subprocess

import numpy as np
import pytest
import torch
from test_genomics_gff import SENSE, find_gt, gt_validate, parse, problems

from torch_semimarkov.genomics.gff import Alternative, read_cds, write_gff3
from torch_semimarkov.genomics.records import Exon, Gene

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "gene_finding")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"gene_finding_{name}", os.path.join(EXAMPLE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def predict():
    return _load("predict")


@pytest.fixture(scope="module")
def post():
    return _load("posteriors")


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _genbank_records(path):
    """The raw GenBank records of a file, shortest first."""
    with open(path) as f:
        text = f.read()
    parts = [p.strip("\n") + "\n//\n" for p in text.split("\n//") if p.strip()]
    return sorted(parts, key=lambda p: (int(re.search(r"LOCUS\s+\S+\s+(\d+)", p).group(1)), p))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """(train.gb with 30 short training loci, test.gb with 3 test loci of 1.8-1.9 kb, one.gb with one
    test locus of 1.2 kb)."""
    pytest.importorskip("Bio", reason="the GenBank loader needs Biopython: pip install 'torch-semimarkov[genomics]'")
    from torch_semimarkov.genomics.genbank import tutorial_data

    root = os.environ.get("TORCH_SEMIMARKOV_GENE_DATA", os.path.join(EXAMPLE, "data"))
    try:
        paths = tutorial_data(root, download=True)
    except (FileNotFoundError, subprocess.CalledProcessError, OSError) as err:
        pytest.skip(f"the AUGUSTUS tutorial data could not be fetched with apt-get download augustus-doc: {err}")
    d = tmp_path_factory.mktemp("tiny")
    train, test = d / "train.gb", d / "test.gb"
    train.write_text("".join(_genbank_records(paths["train"])[:30]))
    test.write_text("".join(_genbank_records(paths["test"])[20:23]))
    one = d / "one.gb"  # the k-best lists run on the PyTorch path on the CPU: one short locus
    one.write_text(_genbank_records(paths["test"])[5])
    return str(train), str(test), str(one)


def _mrnas(text):
    feats, _ = parse(text)
    return [f for f in feats if f["type"] == "mRNA"]


def _check_alternatives(text, n, primary):
    """The alternatives of a GFF3 text: at most n per sequence, distinct IDs, probabilities, not a
    primary transcript; returns their number."""
    assert problems(text) == []
    feats, _ = parse(text)
    alts = [f for f in _mrnas(text) if f["attrs"].get("alternative") == "true"]
    ids = [f["attrs"]["ID"] for f in _mrnas(text)]
    assert len(ids) == len(set(ids))
    per_seq = {}
    for f in alts:
        per_seq[f["seqid"]] = per_seq.get(f["seqid"], 0) + 1
        p = float(f["attrs"]["probability"])
        assert 0 < p <= 1 and float(f["score"]) == p
        assert f["attrs"]["probability_from"]
        # its exon chain is not a primary transcript's
        cds = sorted((c["start"] - 1, c["end"]) for c in feats
                     if c["type"] == "CDS" and c["attrs"]["Parent"] == f["attrs"]["ID"])
        assert cds, f
        assert (f["strand"], tuple(cds)) not in {(g.strand, tuple((e.start, e.end) for e in g.exons))
                                                  for g in primary.get(f["seqid"], [])}
    assert all(v <= n for v in per_seq.values()), per_seq
    # ranks run 1.. per sequence
    for seqid in per_seq:
        ranks = sorted(int(f["attrs"]["rank"]) for f in alts if f["seqid"] == seqid)
        assert ranks == list(range(1, len(ranks) + 1))
    return len(alts)


def _gt_ok(path):
    gt, why = find_gt()
    if gt is None:
        return why
    rc, out = gt_validate(gt, path)
    assert rc == 0 and "input is valid GFF3" in out, out
    return None


# ------------------------------------------------------------------------------ predict.py --alternatives


def test_ghmm_alternatives_from_samples_validate(predict, tiny_data, tmp_path, capsys):
    train, test, _ = tiny_data
    common = ["--ghmm", train, "--input", test, "--max-duration", "200", "--order", "2"]
    plain, alt = tmp_path / "plain.gff3", tmp_path / "alt.gff3"
    assert predict.main(common + ["--out", str(plain)]) == 0
    assert predict.main(common + ["--out", str(alt), "--alternatives", "2", "--samples", "50"]) == 0
    text = alt.read_text()
    primary = read_cds(str(plain))
    n = _check_alternatives(text, 2, primary)
    assert n >= 1  # this weak model (order 2, 30 loci) is unsure of these loci: alternatives exist
    # read_cds (the evaluator's reader) sees the primary predictions only, unless asked
    as_read = read_cds(str(alt))
    assert {k: [(g.strand, g.exons) for g in v] for k, v in as_read.items()} == \
        {k: [(g.strand, g.exons) for g in v] for k, v in primary.items()}
    assert sum(len(v) for v in read_cds(str(alt), alternatives=True).values()) == \
        sum(len(v) for v in primary.values()) + n
    # the primary exons carry a score in (0, 1] (the marginals' bound)
    feats, _ = parse(text)
    exon_scores = [float(f["score"]) for f in feats if f["type"] == "exon"]
    assert exon_scores and all(0 < s <= 1 + 1e-9 for s in exon_scores)
    why = _gt_ok(alt)
    if why:
        pytest.skip(f"semantic checks passed; {why}")


def test_ghmm_alternatives_from_topk(predict, tiny_data, tmp_path):
    train, _, test = tiny_data
    out = tmp_path / "topk.gff3"
    assert predict.main(["--ghmm", train, "--input", test, "--max-duration", "120", "--order", "2", "--out", str(out),
                         "--alternatives", "2", "--alternatives-from", "topk", "--k", "4"]) == 0
    plain = tmp_path / "plain.gff3"
    predict.main(["--ghmm", train, "--input", test, "--max-duration", "120", "--order", "2", "--out", str(plain)])
    n = _check_alternatives(out.read_text(), 2, read_cds(str(plain)))
    assert n >= 1
    # a top-k probability is a parse probability sum: a lower bound of the transcript's, and < 1 with the primary
    probs = [float(f["attrs"]["probability"]) for f in _mrnas(out.read_text()) if f["attrs"].get("alternative")]
    assert all(p < 1 for p in probs)
    _gt_ok(out)


def test_semicrf_checkpoint_alternatives(predict, tmp_path):
    from torch_semimarkov.genomics.models import build_model
    from torch_semimarkov.genomics.pipeline import save_checkpoint

    torch.manual_seed(0)
    cfg = {"kind": "semicrf", "hidden": 8, "max_duration": 60}
    ckpt = tmp_path / "semicrf.pt"
    save_checkpoint(str(ckpt), build_model(**cfg), cfg)  # untrained: a flat, unsure distribution
    rng = random.Random(1)
    dna = lambda n: "".join(rng.choice("ACGT") for _ in range(n))  # noqa: E731
    # random DNA around an open reading frame: the untrained model samples a gene there now and then
    orf = lambda: "ATG" + "".join(rng.choice(SENSE) for _ in range(15)) + "TAA"  # noqa: E731
    fasta = tmp_path / "x.fa"
    fasta.write_text("".join(f">s{i}\n{dna(100) + orf() + dna(100)}\n" for i in range(2)))
    out, plain = tmp_path / "alt.gff3", tmp_path / "plain.gff3"
    assert predict.main(["--checkpoint", str(ckpt), "--input", str(fasta), "--out", str(plain), "--device", "cpu"]) == 0
    assert predict.main(["--checkpoint", str(ckpt), "--input", str(fasta), "--out", str(out), "--device", "cpu",
                         "--alternatives", "2", "--samples", "200"]) == 0
    assert _check_alternatives(out.read_text(), 2, read_cds(str(plain))) >= 1
    _gt_ok(out)
    # a softmax checkpoint has no distribution over segmentations: a clear error
    cfg = {"kind": "softmax", "hidden": 8}
    soft = tmp_path / "softmax.pt"
    save_checkpoint(str(soft), build_model(**cfg), cfg)
    with pytest.raises(SystemExit):
        predict.main(["--checkpoint", str(soft), "--input", str(fasta), "--out", str(out), "--alternatives", "1"])


# ------------------------------------------------------------------------------ the posteriors module


def test_ghmm_inputs_one_segmentation_per_labelling(post, tiny_data):
    """Same best labelling and score as the GHMM's own inputs, a smaller log Z (fewer duplicate
    cuts), and samples that agree with the marginals."""
    from torch_semimarkov import semi_crf_streaming_forward, semi_crf_streaming_viterbi
    from torch_semimarkov.genomics.genbank import load_genbank
    from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig, assemble

    train, test, _ = tiny_data
    model = GHMM.fit(load_genbank(train), GHMMConfig(order=2, max_duration=2000))
    rec = load_genbank(test)[2]
    assert len(rec) <= model.K  # no intron needs splitting: one segmentation per labelling
    segs, score = model.decode_segments(rec)
    inp = post.ghmm_inputs(model, rec)
    kw = dict(proj_start=inp.proj_start, proj_end=inp.proj_end, backend="numba")
    v = semi_crf_streaming_viterbi(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K, **kw)
    assert math.isclose(float(v.scores[0]), score, rel_tol=0, abs_tol=1e-6)
    assert model.grammar.decode(segs) == model.grammar.decode(
        list(zip(v.segment_starts.tolist(), v.segment_ends.tolist(), v.segment_labels.tolist())))
    orig = assemble(model.features(rec))
    log_z_orig = float(semi_crf_streaming_forward(orig.cum_scores, orig.transition, orig.duration_bias, orig.lengths,
                                                  orig.K, proj_start=orig.proj_start, proj_end=orig.proj_end,
                                                  backend="numba")[0])
    m = post.marginals(inp)
    log_z = float(m.log_Z[0])
    assert score <= log_z < log_z_orig - 1.0  # the plain inputs count every cut of the intergenic runs
    kinds = post.kind_posteriors(m.position[0], model.grammar)
    assert np.allclose(sum(kinds.values()), 1.0, atol=1e-6)
    # exact samples agree with the marginals (4 standard errors)
    S = 400
    parses, weights = post.sample_parses(inp, S, seed=3)
    sampled = [model.grammar.decode(p) for p in parses]
    freq = post.exon_frequencies(sampled, weights)
    bounds = post.exon_bounds(m, segs, model.grammar)
    for key, b in bounds.items():  # the bound is an upper bound of the exon's posterior
        assert freq.get(key, 0.0) <= b + 4 * math.sqrt(max(b * (1 - b), 1e-4) / S), (key, freq.get(key), b)
    coding = np.zeros(len(rec))
    for genes in sampled:
        for g in genes:
            for e in g.exons:
                coding[e.start:e.end] += 1.0 / S
    p = kinds["coding +"] + kinds["coding -"]
    assert np.all(np.abs(coding - p) <= 4 * np.sqrt(np.maximum(p * (1 - p), 1e-4) / S) + 1e-9)


# ------------------------------------------------------------------------------ the writer


def test_write_gff3_alternatives_and_read_cds():
    g = Gene("g1", "+", (Exon(10, 40), Exon(60, 90)))
    alt_in = Alternative(Gene("x", "+", (Exon(10, 40), Exon(70, 121))), parent=0, probability=0.25,
                         exon_scores=(0.9, 0.3), attributes={"rank": 1, "note": "a;b"})
    alt_own = Alternative(Gene("alt1", "-", (Exon(150, 180),)), parent=None, probability=0.125)
    buf = io.StringIO()
    write_gff3(buf, {"s": [g]}, lengths={"s": 300}, alternatives={"s": [alt_in, alt_own]})
    text = buf.getvalue()
    assert problems(text) == []
    feats, _ = parse(text)
    gene = next(f for f in feats if f["type"] == "gene" and f["attrs"]["ID"] == "s.g1")
    assert (gene["start"], gene["end"]) == (11, 124)  # grows to hold the alternative (and its stop codon)
    m = {f["attrs"]["ID"]: f for f in feats if f["type"] == "mRNA"}
    assert set(m) == {"s.g1.t1", "s.g1.t2", "s.alt1.t1"}
    assert m["s.g1.t2"]["attrs"]["Parent"] == "s.g1" and m["s.g1.t2"]["score"] == "0.25"
    assert m["s.g1.t2"]["attrs"]["note"] == "a%3Bb" and m["s.g1.t2"]["attrs"]["alternative"] == "true"
    assert "alternative" not in m["s.g1.t1"]["attrs"] and m["s.g1.t1"]["score"] == "."
    assert [f["score"] for f in feats if f["type"] == "exon" and f["attrs"]["Parent"] == "s.g1.t2"] == ["0.9", "0.3"]
    assert [g.exons for g in read_cds(io.StringIO(text))["s"]] == [g.exons]
    back = read_cds(io.StringIO(text), alternatives=True)["s"]
    assert sorted(x.exons for x in back) == sorted([g.exons, alt_in.gene.exons, alt_own.gene.exons])
    for bad in (Alternative(alt_in.gene, parent=1), Alternative(Gene("y", "-", (Exon(10, 40),)), parent=0),
                Alternative(alt_in.gene, parent=0, exon_scores=(0.5,))):
        with pytest.raises(ValueError):
            write_gff3(io.StringIO(), {"s": [g]}, alternatives={"s": [bad]})
    path, _ = find_gt()
    if path is not None:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".gff3", delete=False) as f:
            f.write(text)
        try:
            rc, out = gt_validate(path, f.name)
            assert rc == 0, out
        finally:
            os.unlink(f.name)


def test_ghmm_posterior_decoding_threshold(predict, tiny_data, tmp_path):
    """``--mea KAPPA``: above 1 no exon's boundary posteriors can beat the threshold, so no gene is
    predicted where Viterbi predicts some; at 0.6 the genes are valid GFF3 with scored exons, and
    never more exons than at 0.3 (a higher threshold keeps fewer); without --ghmm it is refused."""
    train, test, _ = tiny_data
    common = ["--ghmm", train, "--input", test, "--max-duration", "200", "--order", "2"]
    outs = {}
    for name, extra in (("viterbi", []), ("0.3", ["--mea", "0.3"]), ("0.6", ["--mea", "0.6"]), ("1.5", ["--mea", "1.5"])):
        outs[name] = tmp_path / f"{name}.gff3"
        assert predict.main(common + ["--out", str(outs[name])] + extra) == 0
    exons = {k: sum(len(g.exons) for gs in read_cds(str(v)).values() for g in gs) for k, v in outs.items()}
    assert exons["viterbi"] > 0 and exons["1.5"] == 0 and exons["0.6"] <= exons["0.3"]
    feats, _ = parse(outs["0.6"].read_text())
    scores = [float(f["score"]) for f in feats if f["type"] == "exon"]
    assert all(0 < s <= 1 + 1e-9 for s in scores)
    with pytest.raises(SystemExit):
        predict.main(["--checkpoint", train, "--input", test, "--out", str(tmp_path / "x.gff3"), "--mea", "0.6"])
    _gt_ok(outs["0.6"])


# ------------------------------------------------------------------------------ predict.py --feature-crf


def test_predict_with_saved_feature_crf(predict, tiny_data, tmp_path):
    """``--feature-crf MODEL.pt --ghmm TRAIN``: a FeatureCRF saved at the GHMM (weights 1, nothing
    learned) predicts exactly the GHMM's genes (Viterbi and by posteriors) with the GHMM's exon scores;
    a saved model whose site scores favour other sites predicts other genes
    (the saved state is used); a file of another configuration is refused, naming it."""
    from torch_semimarkov.genomics.feature_crf import FeatureCRF
    from torch_semimarkov.genomics.genbank import load_genbank
    from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig

    train, test, _ = tiny_data
    # predict.py --ghmm's GHMM (smoothing 2, E = K), plus the site windows
    cfg = GHMMConfig(order=2, smoothing=2.0, max_duration=200, intron_tail=200, signal_bases=True)
    ghmm = GHMM.fit(load_genbank(train), cfg)
    at_ghmm = tmp_path / "at_ghmm.pt"
    FeatureCRF(ghmm).save(str(at_ghmm))
    assert FeatureCRF.saved_config(str(at_ghmm)) == cfg
    common = ["--ghmm", train, "--input", test, "--max-duration", "200", "--order", "2"]
    for extra in ([], ["--mea", "0.6"]):
        ref, got = tmp_path / "ref.gff3", tmp_path / "got.gff3"
        assert predict.main(common + ["--out", str(ref)] + extra) == 0
        assert predict.main(common + ["--out", str(got), "--feature-crf", str(at_ghmm)] + extra) == 0
        genes = lambda p: {k: [(g.strand, g.exons) for g in v] for k, v in read_cds(str(p)).items()}  # noqa: E731
        assert genes(got) == genes(ref) and sum(map(len, genes(ref).values())) > 0
        scores = lambda p: [float(f["score"]) for f in parse(p.read_text())[0] if f["type"] == "exon"]  # noqa: E731
        assert scores(got) == pytest.approx(scores(ref), abs=2e-6)  # (GFF3 writes 6 decimals)
    # site scores that penalise the consensus dinucleotide of every donor: no GT donor survives
    crf = FeatureCRF(ghmm)
    with torch.no_grad():
        crf.site_bases["donor"].fill_(-50.0)
    changed = tmp_path / "changed.pt"
    crf.save(str(changed))
    out = tmp_path / "changed.gff3"
    assert predict.main(common + ["--out", str(out), "--feature-crf", str(changed)]) == 0
    ref_genes = read_cds(str(tmp_path / "ref.gff3"))
    got_genes = read_cds(str(out))
    introns = lambda d: sum(len(g.exons) - 1 for v in d.values() for g in v)  # noqa: E731
    assert introns(ref_genes) > 0 and introns(got_genes) < introns(ref_genes)
    other = GHMM.fit(load_genbank(train), GHMMConfig(order=2, smoothing=2.0, max_duration=200, intron_tail=200))
    with pytest.raises(ValueError, match="at_ghmm.pt"):
        FeatureCRF.load(str(at_ghmm), other)
    with pytest.raises(SystemExit):
        predict.main(["--input", test, "--out", str(out), "--checkpoint", str(at_ghmm), "--feature-crf", str(at_ghmm)])


def test_plot_locus_draws_the_feature_crfs_own_parse():
    """``plot_locus.py --feature-crf``: the figure's engine inputs and Viterbi parse of a locus are the
    FeatureCRF's own (its :meth:`decode` of the packed locus), its score the max-semiring log Z."""
    from torch_semimarkov import semi_crf_streaming_forward
    from torch_semimarkov.genomics.feature_crf import FeatureCRF, pack
    from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
    from torch_semimarkov.genomics.records import toy_record

    plot = _load("plot_locus")
    rng = np.random.default_rng(1)
    records = [toy_record(rng, f"r{i}") for i in range(5)]
    ghmm = GHMM.fit(records, GHMMConfig(order=2, max_duration=120, signal_bases=True))
    crf = FeatureCRF(ghmm)
    with torch.no_grad():  # a model that is not the GHMM
        for p in crf.site_bases.values():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0), dtype=p.dtype))
    for rec in records[:2]:
        inp = plot.crf_inputs(crf, ghmm, rec)
        segs, score = plot.crf_viterbi(inp)
        assert segs == crf.decode(pack([ghmm.features(rec)], dtype=torch.float64), torch.float64)[0]
        best = semi_crf_streaming_forward(inp.cum_scores, inp.transition, inp.duration_bias, inp.lengths, inp.K,
                                          semiring="max", proj_start=inp.proj_start, proj_end=inp.proj_end)
        assert score == pytest.approx(float(best[0]), abs=1e-9)
        assert segs[0][0] == 0 and segs[-1][1] == len(rec)
