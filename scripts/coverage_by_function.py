"""Which functions of ``src/`` the tests run, from coverage.py's JSON report, and what a change lost.

Reads one or two coverage JSON reports (``pytest --cov=torch_semimarkov --cov-report=json:FILE``),
finds every function and method of the measured source files with :mod:`ast`, and calls a function
*run* when any line of its body executed. With two reports (``--before``, ``--after``) it matches
functions by their qualified name within the package (``Class.method``), since files moved between
the two, and lists the functions the tests ran before and no longer run. Numba-compiled kernels
(``@njit``) never run as Python, so they count as not run in both reports alike.

    python scripts/coverage_by_function.py --before cov_before.json --after cov_after.json \\
        --json benchmarks/results/coverage_by_function.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
from collections import defaultdict
from typing import Dict, List, Set, Tuple


def functions_of(path: str) -> List[Tuple[str, Set[int]]]:
    """``[(qualname, body lines)]`` of every function and method in one source file."""
    tree = ast.parse(open(path).read(), filename=path)
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                body = set()
                for stmt in child.body:
                    body.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
                found.append((name, body))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def function_coverage(report: str, root: str = ".") -> Dict[str, Dict]:
    """``{file: {"lines": (run, statements), "functions": {qualname: run?}}}`` of one coverage report."""
    data = json.load(open(report))
    out = {}
    for path, info in data["files"].items():
        executed = set(info["executed_lines"])
        source = path if os.path.isabs(path) else os.path.join(root, path)
        funcs = {}
        for name, body in functions_of(source):
            # (coverage.py lists no line of a docstring as executed: a function that is only a docstring
            # counts as not run)
            funcs[name] = bool(body & executed)
        key = path.split("torch_semimarkov/", 1)[-1]
        out[key] = {"lines": (info["summary"]["covered_lines"], info["summary"]["num_statements"]),
                    "functions": funcs}
    return out


def summary(cov: Dict[str, Dict]) -> Dict[str, float]:
    """Totals: statement lines run, functions run."""
    run = sum(v["lines"][0] for v in cov.values())
    stmts = sum(v["lines"][1] for v in cov.values())
    fr = sum(sum(f.values()) for f in (v["functions"] for v in cov.values()))
    fn = sum(len(v["functions"]) for v in cov.values())
    return {"files": len(cov), "statements": stmts, "statements_run": run, "line_coverage": run / max(stmts, 1),
            "functions": fn, "functions_run": fr}


def by_folder(cov: Dict[str, Dict]) -> Dict[str, List[int]]:
    """``{folder (or top-level file): [statements run, statements]}``: where the lines not run are."""
    out: Dict[str, List[int]] = {}
    for path, v in cov.items():
        key = path.rsplit("/", 1)[0] if "/" in path else path
        run, stmts = v["lines"]
        total = out.setdefault(key, [0, 0])
        total[0] += run
        total[1] += stmts
    return dict(sorted(out.items()))


def by_name(cov: Dict[str, Dict]) -> Dict[str, bool]:
    """``{qualname: run in any file}`` (files moved between reports; names mostly did not)."""
    names: Dict[str, bool] = defaultdict(bool)
    for v in cov.values():
        for name, ran in v["functions"].items():
            names[name] |= ran
    return dict(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--after", required=True, help="coverage JSON of the current tests")
    ap.add_argument("--before", default=None, help="coverage JSON of an earlier commit's tests")
    ap.add_argument("--after-root", default=".", help="where the --after report's relative paths start")
    ap.add_argument("--before-root", default=".", help="where the --before report's relative paths start")
    ap.add_argument("--json", default=None, help="write the comparison here")
    args = ap.parse_args()
    after = function_coverage(args.after, args.after_root)
    result = {"after": summary(after), "after_by_folder": by_folder(after)}
    print(f"after:  {result['after']}")
    not_run = sorted(f"{k}:{n}" for k, v in after.items() for n, ran in v["functions"].items() if not ran)
    result["after_not_run"] = not_run
    if args.before:
        before = function_coverage(args.before, args.before_root)
        result["before"] = summary(before)
        result["before_by_folder"] = by_folder(before)
        print(f"before: {result['before']}")
        b, a = by_name(before), by_name(after)
        lost = sorted(n for n, ran in a.items() if not ran and b.get(n, False))
        gone = sorted(n for n, ran in b.items() if ran and n not in a)
        result["run_before_not_after"] = lost
        result["run_before_name_gone"] = gone
        print(f"functions the tests ran before and do not run now ({len(lost)}): {lost}")
        print(f"functions run before whose name no longer exists ({len(gone)}; renamed or removed): {gone}")
    print(f"functions not run now: {len(not_run)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
