"""Source checks of the Triton kernels that neither the interpreter nor a compile can make.

Triton's ``while`` carries through the loop only the names whose value the body changes: its code
generator runs the body once and keeps a name whose new value differs from the one before the loop.
A plain copy ``x = y`` at a point of the body where ``y`` still holds its value from before the loop
(``y`` is reassigned later in the body), with ``x = y`` before the loop too, looks unchanged, so the
compiled loop keeps ``x`` at its first value while the interpreter, which runs the Python, updates it.
That shifted every helper's sum of the blocked engine by the first block's frame on the GPU only
(``benchmarks/GPU_NOTES.md`` 78); ``x = y + 0`` makes a new value."""

from __future__ import annotations

import ast
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "src", "torch_semimarkov", "engines",
                       "triton")


def _copy(stmt):
    """``(target, source)`` of a plain ``x = y``, else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
            and isinstance(stmt.value, ast.Name):
        return stmt.targets[0].id, stmt.value.id
    return None


def _assigned(stmt):
    return {t.id for node in ast.walk(stmt) if isinstance(node, (ast.Assign, ast.AugAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}


def stale_copies(source: str):
    """Lines of plain copies in a ``while`` body that Triton would not carry (see the module)."""
    found = []

    def scan(stmts, before):
        before = dict(before)
        for st in stmts:
            if isinstance(st, ast.While):
                changed = set()
                for inner in st.body:
                    c = _copy(inner)
                    if c and before.get(c[0]) == c[1] and c[1] not in changed:
                        found.append(inner.lineno)
                    changed |= _assigned(inner)
                scan(st.body, before)
                continue
            c = _copy(st)
            if c:
                before[c[0]] = c[1]
            else:
                for name in _assigned(st):
                    before.pop(name, None)
            for field in ("body", "orelse"):
                if isinstance(getattr(st, field, None), list):
                    scan(getattr(st, field), before)

    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            scan(fn.body, {})
    return found


def test_the_check_finds_a_copy_the_loop_would_not_carry():
    bad = "def f(q0, H):\n    qp = q0\n    while q0 < 9:\n        qp = q0\n        q0 = q0 + 1\n"
    good = "def f(q0, H):\n    qp = q0\n    while q0 < 9:\n        qp = q0 + 0\n        q0 = q0 + 1\n"
    after = "def f(q0, F):\n    H = F\n    while q0 < 9:\n        F = H + 1.0\n        H = F\n        q0 = q0 + 1\n"
    assert stale_copies(bad) == [4] and stale_copies(good) == [] and stale_copies(after) == []


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(KERNELS) if f.endswith(".py")))
def test_no_kernel_loop_copies_a_value_it_would_not_carry(name):
    with open(os.path.join(KERNELS, name)) as fh:
        assert stale_copies(fh.read()) == [], name
