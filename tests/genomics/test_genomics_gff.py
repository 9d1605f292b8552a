"""The gene finder's GFF3: every feature inside its parent and its sequence, partial genes marked,
per-exon scores, the round trip through ``read_cds``, GenomeTools' validator, and predict.py's
input checks.

``gt gff3validator`` runs where GenomeTools' ``gt`` is found: ``$GT_BIN``, ``gt`` on the PATH, or
``.ci/cache/genometools/gt`` (the wrapper ``.ci/run`` makes from Debian's packages, no root); the
test says why it is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import random
import shutil
import subprocess
from collections import defaultdict

import numpy as np
import pytest
import torch

from torch_semimarkov.genomics.gff import read_cds, write_gff3
from torch_semimarkov.genomics.labels import CodonLabels
from torch_semimarkov.genomics.records import STOP_CODONS, Exon, Gene, GenomicRecord

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PREDICT = os.path.join(ROOT, "examples", "gene_finding", "predict.py")
COMP = str.maketrans("ACGT", "TGCA")
SENSE = [a + b + c for a in "ACGT" for b in "ACGT" for c in "ACGT" if a + b + c not in STOP_CODONS and a + b + c != "ATG"]


def _rc(s: str) -> str:
    return s.translate(COMP)[::-1]


# ------------------------------------------------------------------------------------ a GFF3 checker


def parse(text: str):
    """(features, regions): features as dicts, regions ``{seqid: (start, end)}`` (1-based)."""
    feats, regions = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("##sequence-region"):
            _, sid, a, b = line.split()
            assert sid not in regions, f"line {n}: a second ##sequence-region for {sid}"
            regions[sid] = (int(a), int(b))
            continue
        if not line.strip() or line.startswith("#"):
            continue
        c = line.split("\t")
        assert len(c) == 9, f"line {n}: {len(c)} columns"
        attrs = dict(kv.split("=", 1) for kv in c[8].split(";"))
        feats.append(dict(n=n, seqid=c[0], type=c[2], start=int(c[3]), end=int(c[4]), score=c[5], strand=c[6],
                          phase=c[7], attrs=attrs))
    return feats, regions


def problems(text: str):
    """Semantic problems of a GFF3 text: children outside parents or regions, IDs, CDS phases."""
    feats, regions = parse(text)
    out = []
    by_id = defaultdict(list)
    for f in feats:
        if "ID" in f["attrs"]:
            by_id[f["attrs"]["ID"]].append(f)
    for fid, fs in by_id.items():
        if len({(f["type"], f["seqid"], f["strand"], f["attrs"].get("Parent")) for f in fs}) > 1:
            out.append(f"ID {fid} names features of different types, seqids, strands or parents")
    children = defaultdict(list)
    for f in feats:
        if not 1 <= f["start"] <= f["end"]:
            out.append(f"line {f['n']}: bad range {f['start']}..{f['end']}")
        if f["seqid"] in regions:
            a, b = regions[f["seqid"]]
            if not a <= f["start"] <= f["end"] <= b:
                out.append(f"line {f['n']}: {f['type']} {f['start']}..{f['end']} outside the sequence region {a}..{b}")
        if f["type"] == "CDS" and f["phase"] not in ("0", "1", "2"):
            out.append(f"line {f['n']}: CDS phase {f['phase']!r}")
        parent = f["attrs"].get("Parent")
        if parent is None:
            if f["type"] != "gene":
                out.append(f"line {f['n']}: {f['type']} without a Parent")
            continue
        if parent not in by_id:
            out.append(f"line {f['n']}: Parent {parent} is not an ID in the file")
            continue
        children[parent].append(f)
        for p in by_id[parent]:  # inside the parent's span (a multi-line parent: its lines' hull)
            lo = min(x["start"] for x in by_id[parent])
            hi = max(x["end"] for x in by_id[parent])
            if not lo <= f["start"] <= f["end"] <= hi or p["strand"] != f["strand"] or p["seqid"] != f["seqid"]:
                out.append(f"line {f['n']}: {f['type']} {f['start']}..{f['end']} outside its parent "
                           f"{parent} {lo}..{hi}")
                break
    for tid, kids in children.items():
        cds = sorted((k for k in kids if k["type"] == "CDS"), key=lambda k: k["start"])
        exons = [k for k in kids if k["type"] == "exon"]
        for c in cds:  # every CDS piece inside an exon of its transcript
            if not any(e["start"] <= c["start"] <= c["end"] <= e["end"] for e in exons):
                out.append(f"line {c['n']}: CDS {c['start']}..{c['end']} in no exon of {tid}")
        if cds:  # phases agree along the transcript (what gt checks for one multi-line CDS)
            order = cds if cds[0]["strand"] == "+" else cds[::-1]
            done = (3 - int(order[0]["phase"])) % 3
            for c in order:
                if int(c["phase"]) != (3 - done % 3) % 3:
                    out.append(f"line {c['n']}: CDS phase {c['phase']}, expected {(3 - done % 3) % 3}")
                done += c["end"] - c["start"] + 1
    return out


def gene_lines(text: str):
    """{gene ID: (gene feature, its mRNA's children by type)}."""
    feats, _ = parse(text)
    genes = {f["attrs"]["ID"]: f for f in feats if f["type"] == "gene"}
    mrna = {f["attrs"]["ID"]: f["attrs"]["Parent"] for f in feats if f["type"] == "mRNA"}
    kids = {g: defaultdict(list) for g in genes}
    for f in feats:
        if f["attrs"].get("Parent") in mrna:
            kids[mrna[f["attrs"]["Parent"]]][f["type"]].append(f)
    return {g: (genes[g], kids[g]) for g in genes}


def write(pred, **kw) -> str:
    buf = io.StringIO()
    write_gff3(buf, pred, **kw)
    return buf.getvalue()


# ------------------------------------------------------------------------------ genes and sequences

L = 300


def cases():
    """(name, strand, gene, expected (5' open, 3' open)) on a sequence of length L, no sequence given."""
    out = []
    for strand in "+-":
        def g(name, exons, first=0, partial=False):
            return Gene(name, strand, tuple(Exon(a, b) for a, b in exons), first, partial)

        mirror = (lambda ex: [(L - b, L - a) for a, b in ex][::-1]) if strand == "-" else (lambda ex: ex)
        # complete: 3 exons, CDS 30 + 31 + 23 = 84 bases, stop codon inside the sequence
        out.append(("complete", strand, g("c", mirror([(50, 80), (120, 151), (200, 223)])), (False, False)))
        # 5'-partial at the sequence's 5' edge: begins mid-codon (first_phase 1), ends with a stop
        out.append(("five", strand, g("f", mirror([(0, 20), (60, 90)]), first=1, partial=True), (True, False)))
        # 3'-partial at the 3' edge: 37 bases, not whole codons
        out.append(("three", strand, g("t", mirror([(240, 260), (283, L)]), partial=True), (False, True)))
        # 3'-partial: whole codons, but the stop codon would lie past the sequence's end
        out.append(("three_edge", strand, g("e", mirror([(250, L)]), partial=True), (False, True)))
        # both ends open: a gene spanning the whole sequence, mid-codon at both ends
        out.append(("both", strand, g("b", mirror([(0, 100), (150, L)]), first=2, partial=True), (True, True)))
        # flagged partial, whole codons, touches the 5' edge: the 5' end is the open one
        out.append(("flag5", strand, g("p", mirror([(0, 30)]), partial=True), (True, False)))
        # flagged partial with nothing telling which end: both are marked open
        out.append(("flag", strand, g("q", mirror([(100, 130)]), partial=True), (True, True)))
    return out


CASES = cases()


@pytest.mark.parametrize("name,strand,gene,expected", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_each_gene_inside_parents_and_marked(name, strand, gene, expected):
    text = write({"s1": [gene]}, lengths={"s1": L})
    assert problems(text) == []
    (gid, (gf, kids)), = gene_lines(text).items()
    five, three = expected
    left, right = (five, three) if strand == "+" else (three, five)
    # the partial marks on the gene and the mRNA, exactly when open
    mrna = [f for f in parse(text)[0] if f["type"] == "mRNA"][0]
    for f in (gf, mrna):
        assert (f["attrs"].get("partial") == "true") == (five or three)
        assert ("start_range" in f["attrs"]) == left and ("end_range" in f["attrs"]) == right
        if left:
            assert f["attrs"]["start_range"] == f".,{f['start']}"
        if right:
            assert f["attrs"]["end_range"] == f"{f['end']},."
    for c in kids["CDS"]:
        assert (c["attrs"].get("partial") == "true") == (five or three)
        assert c["attrs"]["ID"] == kids["CDS"][0]["attrs"]["ID"]  # one multi-line CDS feature
    # codon features exactly on the complete ends; the stop codon inside the gene and the mRNA
    assert bool(kids["start_codon"]) == (not five) and bool(kids["stop_codon"]) == (not three)
    if not three:
        (stop,) = kids["stop_codon"]
        assert stop["end"] - stop["start"] == 2
        assert gf["start"] <= stop["start"] and stop["end"] <= gf["end"] and mrna["start"] <= stop["start"] <= stop["end"] <= mrna["end"]
        cds_lo = min(c["start"] for c in kids["CDS"])
        cds_hi = max(c["end"] for c in kids["CDS"])
        assert (stop["start"] == cds_hi + 1) if strand == "+" else (stop["end"] == cds_lo - 1)
    # the gene spans exactly its exons
    assert gf["start"] == min(e["start"] for e in kids["exon"]) and gf["end"] == max(e["end"] for e in kids["exon"])
    # the round trip
    (back,) = read_cds(io.StringIO(text))["s1"]
    assert (back.strand, back.exons, back.first_phase, back.partial) == (gene.strand, gene.exons, gene.first_phase,
                                                                         five or three)


def test_all_cases_in_one_file_round_trip():
    pred = {f"seq{i}": [gene] for i, (_, _, gene, _) in enumerate(CASES)}
    text = write(pred, lengths={k: L for k in pred})
    assert problems(text) == []
    back = read_cds(io.StringIO(text))
    assert {k: [(g.strand, g.exons, g.first_phase, g.partial) for g in v] for k, v in back.items()} == \
        {k: [(g.strand, g.exons, g.first_phase, g.partial) for g in v] for k, v in pred.items()}
    _, regions = parse(text)
    assert regions == {k: (1, L) for k in pred}


def planted(strand: str, rng: random.Random, start="ATG", stop="TAA"):
    """A sequence of length L with a 2-exon gene (GT..AG intron) whose codons can be replaced."""
    n1, n2 = 31, 35  # 66 coding bases: start + 20 sense codons + ... ; intron of 40
    cds = start + "".join(rng.choice(SENSE) for _ in range((n1 + n2) // 3 - 1))
    intron = "GT" + "".join(rng.choice("ACGT") for _ in range(36)) + "AG"
    body = cds[:n1] + intron + cds[n1:] + stop
    left = "".join(rng.choice("ACGT") for _ in range(60))
    seq = left + body
    seq += "".join(rng.choice("ACGT") for _ in range(L - len(seq)))
    exons = [(60, 60 + n1), (60 + n1 + 40, 60 + n1 + 40 + n2)]
    if strand == "-":
        seq = _rc(seq)
        exons = [(L - b, L - a) for a, b in exons][::-1]
    return seq, Gene("g", strand, tuple(Exon(a, b) for a, b in exons))


@pytest.mark.parametrize("strand", "+-")
def test_sequences_check_the_codons(strand):
    rng = random.Random(1)
    for start, stop, expected in (("ATG", "TAA", (False, False)), ("CTG", "TGA", (True, False)),
                                  ("ATG", "TTA", (False, True)), ("GTG", "CAA", (True, True))):
        seq, gene = planted(strand, rng, start, stop)
        text = write({"s": [gene]}, sequences={"s": seq})
        assert problems(text) == []
        _, regions = parse(text)
        assert regions == {"s": (1, len(seq))}  # the sequence's length stands in for lengths
        (gf, kids), = gene_lines(text).values()
        assert (gf["attrs"].get("partial") == "true") == any(expected)
        assert bool(kids["start_codon"]) == (not expected[0]) and bool(kids["stop_codon"]) == (not expected[1])
        (back,) = read_cds(io.StringIO(text))["s"]
        assert back.partial == any(expected) and back.exons == gene.exons
        if not expected[1]:
            (sc,) = kids["stop_codon"]
            codon = seq[sc["start"] - 1:sc["end"]]
            assert (codon if strand == "+" else _rc(codon)) in STOP_CODONS


@pytest.mark.parametrize("strand", "+-")
def test_start_codon_split_by_an_intron(strand):
    # a 2-base 5'-most exon: the start codon's third base is in the next exon (33 coding bases)
    exons = [(50, 52), (100, 131)] if strand == "+" else [(49, 80), (128, 130)]
    gene = Gene("g", strand, tuple(Exon(a, b) for a, b in exons))
    text = write({"s": [gene]}, lengths={"s": L})
    assert problems(text) == []
    (_, kids), = gene_lines(text).values()
    pieces = sorted((f["start"], f["end"], f["phase"]) for f in kids["start_codon"])
    assert len(pieces) == 2 and len({f["attrs"]["ID"] for f in kids["start_codon"]}) == 1
    assert sum(b - a + 1 for a, b, _ in pieces) == 3
    five_piece = pieces[0] if strand == "+" else pieces[1]
    assert five_piece[2] == "0" and (pieces[1] if strand == "+" else pieces[0])[2] == "1"


def test_exon_scores_in_column_six():
    genes = [Gene("a", "+", (Exon(10, 40), Exon(60, 93))), Gene("b", "-", (Exon(120, 150), Exon(170, 203))),
             Gene("c", "+", (Exon(220, 250),))]
    scores = [[0.25, 0.987654321], [0.5, float("nan")], None]
    text = write({"s": genes}, lengths={"s": L}, exon_scores={"s": scores})
    assert problems(text) == []
    got = {}
    for f in parse(text)[0]:
        if f["type"] in ("CDS", "exon"):
            got.setdefault((f["attrs"]["Parent"], f["type"]), {})[f["start"] if f["type"] == "CDS" else None] = f["score"]
    cds = {k[0]: v for k, v in got.items() if k[1] == "CDS"}
    assert cds["s.a.t1"] == {11: "0.25", 61: "0.987654"}
    assert cds["s.b.t1"] == {121: "0.5", 171: "."}
    assert cds["s.c.t1"] == {221: "."}
    for f in parse(text)[0]:  # exon lines carry the same score as their CDS; other lines none
        if f["type"] == "exon":
            c = [x for x in parse(text)[0] if x["type"] == "CDS" and x["attrs"]["Parent"] == f["attrs"]["Parent"]
                 and f["start"] <= x["start"] <= x["end"] <= f["end"]]
            assert f["score"] == c[0]["score"]
        elif f["type"] != "CDS":
            assert f["score"] == "."
    # without scores, or with none for the sequence: '.' everywhere, as before
    for kw in ({}, {"exon_scores": {}}, {"exon_scores": {"other": []}}):
        assert {f["score"] for f in parse(write({"s": genes}, **kw))[0]} == {"."}
    with pytest.raises(ValueError, match="2 scores for the 1 exons"):
        write({"s": genes}, exon_scores={"s": [None, None, [0.1, 0.2]]})
    with pytest.raises(ValueError, match="2 entries for 3 genes"):
        write({"s": genes}, exon_scores={"s": [None, None]})


def test_ids_escaping_and_errors():
    # a seqid and ids with characters GFF3 reserves round-trip through %-escapes
    name = "contig 1;x=y,z%"
    text = write({name: [Gene("g1", "+", (Exon(3, 33),))]}, lengths={name: 100})
    assert problems(text) == []
    assert "contig%201%3Bx%3Dy%2Cz%25\t" in text
    assert list(read_cds(io.StringIO(text))) == [name]
    # the old call signature still works (positional source, lengths, header)
    buf = io.StringIO()
    write_gff3(buf, {"s": [Gene("g1", "+", (Exon(3, 33),))]}, "me", {"s": 100}, ["line one", "two\nlines"])
    text = buf.getvalue()
    assert text.splitlines()[1:4] == ["# line one", "# two", "# lines"] and "\tme\tgene\t" in text
    # feature IDs must be unique: two genes with one id
    with pytest.raises(ValueError, match="already used"):
        write({"s": [Gene("g1", "+", (Exon(3, 33),)), Gene("g1", "+", (Exon(50, 80),))]})
    # a gene past its sequence's end
    with pytest.raises(ValueError, match="outside sequence"):
        write({"s": [Gene("g1", "+", (Exon(3, 33),))]}, lengths={"s": 20})
    # no sequence-region line for an empty sequence
    assert "##sequence-region" not in write({"s": []}, lengths={"s": 0})


def test_decoded_genes_validate():
    """Genes as the K = 1 baselines decode them from arbitrary labels (many cut by the edges)."""
    rng = np.random.default_rng(0)
    cl = CodonLabels()
    pred, lengths, n_partial = {}, {}, 0
    for i in range(20):
        n = int(rng.integers(50, 400))
        runs = np.repeat(rng.integers(0, 13, size=n // 10 + 1), 10)[:n]
        genes = cl.decode(runs, prefix="g")
        pred[f"r{i}"], lengths[f"r{i}"] = genes, n
        n_partial += sum(g.partial for g in genes)
    assert n_partial > 10
    text = write(pred, lengths=lengths)
    assert problems(text) == []
    back = read_cds(io.StringIO(text))
    assert {k: [(g.strand, g.exons, g.partial) for g in v] for k, v in back.items()} == \
        {k: [(g.strand, g.exons, g.partial) for g in v] for k, v in pred.items() if v}


# ------------------------------------------------------------------------------- GenomeTools' validator


def find_gt():
    """(path to GenomeTools' gt, None) or (None, why it is not there)."""
    env = os.environ.get("GT_BIN")
    candidates = [env] if env else []
    candidates += [shutil.which("gt"), os.path.join(ROOT, ".ci", "cache", "genometools", "gt")]
    tried = []
    for c in candidates:
        if not c or not os.path.exists(c):
            continue
        try:
            res = subprocess.run([c, "-version"], capture_output=True, text=True, timeout=30)
        except OSError as err:
            tried.append(f"{c}: {err}")
            continue
        if res.returncode == 0 and "GenomeTools" in res.stdout:
            return c, None
        tried.append(f"{c}: not GenomeTools ({(res.stdout + res.stderr).strip()[:120]!r})")
    if env and not os.path.exists(env):
        tried.append(f"GT_BIN={env} does not exist")
    why = ("GenomeTools' gt was not found: set GT_BIN to a gt that runs, put gt on the PATH, or run .ci/run, "
           "which unpacks Debian's genometools (apt-get download genometools libgenometools0 ... && dpkg -x) "
           "into .ci/cache/genometools")
    return None, why + (f" (tried: {'; '.join(tried)})" if tried else "")


@pytest.fixture(scope="module")
def gt():
    path, why = find_gt()
    if path is None:
        pytest.skip(why)
    return path


def gt_validate(gt, path):
    res = subprocess.run([gt, "gff3validator", "-typecheck", "so", str(path)], capture_output=True, text=True,
                         timeout=60)
    return res.returncode, res.stdout + res.stderr


def test_gt_gff3validator_accepts_the_output(gt, tmp_path):
    rng = random.Random(2)
    pred = {f"seq{i}": [gene] for i, (_, _, gene, _) in enumerate(CASES)}
    lengths = {k: L for k in pred}
    scores = {k: [[0.5] * len(v[0].exons)] for k, v in pred.items()}
    for strand in "+-":
        seq, gene = planted(strand, rng, "ATG", "TAG")
        pred[f"planted{strand}"], lengths[f"planted{strand}"] = [gene], L
    split = Gene("g", "+", (Exon(50, 52), Exon(100, 131)))
    pred["split"], lengths["split"] = [split], L
    path = tmp_path / "out.gff3"
    write_gff3(str(path), pred, lengths=lengths, header=["test"], exon_scores=scores)
    rc, out = gt_validate(gt, path)
    assert rc == 0 and "input is valid GFF3" in out, out
    # the validator does check what it can: a CDS phase that disagrees with the one before it fails
    bad = tmp_path / "bad.gff3"
    lines = path.read_text().splitlines(True)
    i = max(k for k, line in enumerate(lines) if "\tCDS\t" in line and "seq0." in line)
    cols = lines[i].split("\t")
    cols[7] = str((int(cols[7]) + 1) % 3)
    lines[i] = "\t".join(cols)
    bad.write_text("".join(lines))
    rc, out = gt_validate(gt, bad)
    assert rc != 0 and "phase" in out, out


# ------------------------------------------------------------------------------- predict.py's input checks


@pytest.fixture(scope="module")
def predict():
    spec = importlib.util.spec_from_file_location("gene_finding_predict", PREDICT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PROTEIN = "MVLSPADKTNVKAAWGKVGAHAGEYGAEALERMFLSFPTTKTYFPHFDLSHGSAQVKGHGKKVADALTNAVAHVDDMPNALSALSDLHAHKL"


def test_usable_records(predict):
    recs = [GenomicRecord("dna", "ACGTNNACGTRY" * 5), GenomicRecord("prot", PROTEIN), GenomicRecord("empty", ""),
            GenomicRecord("dna", "ACGT" * 10), GenomicRecord("allN", "N" * 30),
            GenomicRecord("odd", "ACGT" * 10 + "**12")]
    good, warns = predict.usable_records(recs, "in.fa")
    assert [r.name for r in good] == ["dna", "odd"]
    assert len(warns) == 5 and all(w.startswith("in.fa: record ") for w in warns)
    text = "\n".join(warns)
    assert "record 2 ('prot'): not DNA" in text and "protein" in text
    assert "record 3 ('empty'): the record is empty" in text
    assert "record 4 ('dna'): the name was already used" in text
    assert "record 5 ('allN'): no A, C, G or T" in text
    assert "record 6 ('odd'): 4 characters that are not nucleotide codes" in text


def test_predict_main_warns_and_keeps_going(predict, tmp_path, capsys):
    from torch_semimarkov.genomics.models import build_model
    from torch_semimarkov.genomics.pipeline import save_checkpoint

    threads = torch.get_num_threads()
    torch.manual_seed(0)
    ckpt = tmp_path / "softmax.pt"
    cfg = {"kind": "softmax", "hidden": 8}
    save_checkpoint(str(ckpt), build_model(**cfg), cfg)  # untrained: argmax labels cut many genes
    rng = random.Random(0)
    dna = lambda n: "".join(rng.choice("ACGT") for _ in range(n))
    fasta = tmp_path / "mixed.fa"
    fasta.write_text(f">dna1 first\n{dna(500)}\n>prot protein\n{PROTEIN}\n>empty\n>dna2\n{dna(300)}\n")
    out = tmp_path / "mixed.gff3"
    try:
        rc = predict.main(["--checkpoint", str(ckpt), "--input", str(fasta), "--out", str(out), "--device", "cpu"])
        err = capsys.readouterr().err
        assert rc == 0
        assert f"warning: {fasta}: record 2 ('prot'): not DNA" in err
        assert f"warning: {fasta}: record 3 ('empty'): the record is empty" in err
        text = out.read_text()
        assert problems(text) == []
        assert parse(text)[1] == {"dna1": (1, 500), "dna2": (1, 300)}
        assert {f["seqid"] for f in parse(text)[0]} <= {"dna1", "dna2"}
        # protein only: nothing to predict, an empty GFF3 and exit status 1
        prot = tmp_path / "prot.fa"
        prot.write_text(f">p1\n{PROTEIN}\n>p2\n{PROTEIN[::-1]}\n")
        rc = predict.main(["--checkpoint", str(ckpt), "--input", str(prot), "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 1 and "('p1'): not DNA" in err and "('p2'): not DNA" in err and "none of its 2 records" in err
        assert parse(out.read_text()) == ([], {})
        # an empty file: a warning, an empty GFF3, exit status 0
        empty = tmp_path / "empty.fa"
        empty.write_text("\n")
        rc = predict.main(["--checkpoint", str(ckpt), "--input", str(empty), "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 0 and f"warning: {empty}: the file is empty" in err
        assert out.read_text().startswith("##gff-version 3") and parse(out.read_text()) == ([], {})
    finally:
        torch.set_num_threads(threads)
    path, _ = find_gt()
    if path is not None:
        fasta_out = tmp_path / "mixed.gff3"
        predict.main(["--checkpoint", str(ckpt), "--input", str(fasta), "--out", str(fasta_out), "--device", "cpu"])
        rc, msg = gt_validate(path, fasta_out)
        assert rc == 0, msg
