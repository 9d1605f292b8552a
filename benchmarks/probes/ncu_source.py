"""Where a kernel's time goes by source line, from Nsight Compute's source page (PC sampling):
the share of warp-stall samples per line of the blocked kernel, the address ranges of its phase A
(``blocked.py`` lines LO_A-HI_A) and phase B (LO_B-HI_B) and each phase's share, with the
reductions and conversions Triton inlines there (``standard.py``) counted in the phase whose
address range holds them.

    ncu --clock-control none --import-source yes --section SourceCounters -k regex:_blk_chunks_kernel \\
        -c 1 -o prof python3 benchmarks/probes/one_call.py 4,20000,960,47 log
    ncu -i prof.ncu-rep --page source --csv --print-source cuda,sass > src.csv
    python benchmarks/probes/ncu_source.py src.csv OUT.json [LO_A HI_A LO_B HI_B]
"""
import collections
import csv
import json
import sys


def parse(path):
    """SASS instructions of the first kernel in the CSV: ``(address, file, line, samples, stalls, sass)``."""
    ins, f, cur, cols, kernels = [], None, None, [], 0
    for r in csv.reader(open(path)):
        if not r:
            continue
        if r[0] == "File Path":
            f = r[1].rsplit("/", 1)[-1]
            if f == "standard.py" and ins and kernels:
                break  # the next kernel's listing starts
            continue
        if r[0] == "Function Name":
            kernels = 1
            continue
        if r[0] == "Line No":
            cols = [(i, h) for i, h in enumerate(r) if h.startswith("stall_") and "Not Issued" not in h]
            continue
        if r[0] and r[0].isdigit():
            cur = int(r[0])
            continue
        if r[0] == "" and len(r) > 4 and r[2].startswith("0x"):
            stalls = {h[6:]: int(r[i]) for i, h in cols if r[i].isdigit()}
            ins.append((int(r[2], 16), f, cur, int(r[4]) if r[4].isdigit() else 0, stalls, r[3].strip()))
    return sorted(ins)


def main():
    path, out = sys.argv[1], sys.argv[2]
    lo_a, hi_a, lo_b, hi_b = (int(x) for x in sys.argv[3:7]) if len(sys.argv) > 6 else (160, 182, 521, 592)
    ins = parse(path)
    total = sum(x[3] for x in ins)
    rep = {"samples": total, "phases": {}, "lines": []}
    for name, lo, hi in (("A", lo_a, hi_a), ("B", lo_b, hi_b)):
        addr = [x[0] for x in ins if x[1] == "blocked.py" and lo <= x[2] <= hi]
        a, b = min(addr), max(addr)
        sel = [x for x in ins if a <= x[0] <= b]
        stalls = collections.Counter()
        for x in sel:
            stalls.update(x[4])
        s = sum(x[3] for x in sel)
        rep["phases"][name] = {"blocked.py lines": [lo, hi], "share": s / total, "instructions": len(sel),
                               "barriers": sum("BAR" in x[5] for x in sel),
                               "stalls": {k: v / max(s, 1) for k, v in stalls.most_common(6)}}
    per = collections.Counter()
    for x in ins:
        per[(x[1], x[2])] += x[3]
    rep["lines"] = [{"file": f, "line": ln, "share": v / total} for (f, ln), v in per.most_common(30)]
    json.dump(rep, open(out, "w"), indent=1)
    print(json.dumps(rep["phases"], indent=1))


if __name__ == "__main__":
    main()
