"""Sum pytest's ``--durations=0`` report per test folder (setup, call and teardown of every test),
e.g. to compare two runs of the suite:

    python -m pytest -q --durations=0 > before.log; ...; python -m pytest -q --durations=0 > after.log
    python benchmarks/probes/test_durations.py OUT.json before.log after.log
"""
import collections
import json
import re
import sys


def per_folder(path):
    tot = collections.Counter()
    wall = None
    for line in open(path):
        m = re.match(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+)", line)
        if m:
            file = m.group(3).split("::")[0]
            parts = file.split("/")
            tot["/".join(parts[:3]) if len(parts) > 3 else "/".join(parts[:-1])] += float(m.group(1))
        m = re.search(r"passed.* in ([\d.]+)s", line)
        if m:
            wall = float(m.group(1))
    return {"wall_s": wall, "cpu_s_total": round(sum(tot.values()), 1),
            "cpu_s_by_folder": {k: round(v, 1) for k, v in tot.most_common()}}


if __name__ == "__main__":
    out = {p: per_folder(p) for p in sys.argv[2:]}
    for p, r in out.items():
        print(p, r["wall_s"], r["cpu_s_total"], r["cpu_s_by_folder"])
    json.dump(out, open(sys.argv[1], "w"), indent=1)
