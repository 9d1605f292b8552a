"""The interpreter's covering subset of the kernel tests' product (``conftest.covering_subset``):
every case and option and every kernel path that applies runs, deterministically, in fewer runs."""

import itertools

import pytest

from conftest import covering_array, covering_subset, path_applies

RINGS = ["register-ring", "memory-ring", "memory-ring-kblock2"]
ENGINES = ["sequential", "parallel"]


def _product(cases, semirings=("log", "max")):
    return [dict(case=c, semiring=s, ring=r, engine=e)
            for c, s, r, e in itertools.product(cases, semirings, RINGS, ENGINES)]


def _cases():
    pytest.importorskip("triton")
    from kernel_cases import CASES

    return CASES


def test_every_case_and_every_applicable_path_runs():
    params = _product(_cases())
    keep = covering_subset(params)
    kept = [params[i] for i in keep]
    assert len(keep) < len(params) // 2
    assert all(path_applies(p) for p in kept)  # nothing kept that only skips
    for case, semiring in itertools.product(_cases(), ("log", "max")):
        assert any(p["case"] == case and p["semiring"] == semiring for p in kept), (case, semiring)
    for p in params:
        if path_applies(p):
            path = (p["ring"], p["engine"], p["case"][6], p["semiring"])
            assert any((q["ring"], q["engine"], q["case"][6], q["semiring"]) == path for q in kept), path


def test_the_subset_is_deterministic_and_keeps_a_lone_group_whole():
    params = _product(_cases())
    assert covering_subset(params) == covering_subset([dict(p) for p in params])
    lone = [dict(ring=r, engine=e) for r, e in itertools.product(RINGS, ENGINES)]
    assert [lone[i] for i in covering_subset(lone)] == [p for p in lone if path_applies(p)]
    assert len(covering_subset(lone)) == 4  # the parallel engine runs the register ring only


def test_what_never_runs_is_known():
    assert not path_applies(dict(ring="memory-ring", engine="parallel"))
    assert not path_applies(dict(ring="memory-ring", engine="sequential", kcc=True))
    assert not path_applies(dict(ring="register-ring", engine="parallel", case=(1, 1, 3, 2, None, "none", False)))
    assert path_applies(dict(ring="register-ring", engine="parallel", case=(2, 7, 3, 3, None, "none", False)))


@pytest.mark.parametrize("strength", [1, 2])
def test_covering_array_covers_every_value_or_pair(strength):
    """The ``covering`` mark's subset: three two-valued axes (the never-converging models' kind x
    semiring x transition shape) need 2 runs for every value and 4 (not 8) for every pair; a
    three-valued axis next to a two-valued one keeps all 6 pairs."""
    axes = dict(kind=["cyclic", "frame"], semiring=["log", "max"], kcc=[False, True])
    params = [dict(zip(axes, v)) for v in itertools.product(*axes.values())]
    kept = [params[i] for i in covering_array(params, strength)]
    assert len(kept) == (2 if strength == 1 else 4)
    for a, b in itertools.combinations(axes, strength) if strength == 2 else ((a, a) for a in axes):
        for va, vb in itertools.product(axes[a], axes[b]):
            if a == b and va != vb:
                continue
            assert any(p[a] == va and p[b] == vb for p in kept), (a, va, b, vb)
    assert covering_array(params, strength) == covering_array([dict(p) for p in params], strength)
    mixed = [dict(x=x, y=y) for x, y in itertools.product("abc", [0, 1])]
    assert len(covering_array(mixed, 2)) == 6 and len(covering_array(mixed, 1)) == 3
    with pytest.raises(ValueError, match="strength"):
        covering_array(params, 3)
