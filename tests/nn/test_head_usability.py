"""What a user coming from pytorch-crf or pytorch-struct runs into: argument habits, errors that
name the user's own tensors, one calling convention and one result type per concept, ``backend=``
honoured everywhere, and the debug flag on every backend."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_semimarkov as tsm
from torch_semimarkov import MarginalsResult, SemiMarkovCRFHead
from torch_semimarkov.api import entropy as entropy_mod
from torch_semimarkov.api import topk as topk_mod
from torch_semimarkov.engines import interface, select

from conftest import CPU_BACKENDS

H = 5


def head_and_batch(**kw):
    torch.manual_seed(0)
    head = SemiMarkovCRFHead(3, 4, hidden_dim=H, **kw)
    h = torch.randn(2, 10, H)
    lengths = torch.tensor([10, 7])
    mask = torch.arange(10)[None, :] < lengths[:, None]
    tags = torch.randint(0, 3, (2, 10))
    return head, h, lengths, mask, tags


# ---------------------------------------------------------------- pytorch-crf habits


def test_tags_in_the_place_of_lengths_point_to_labels_and_mask():
    head, h, _, mask, tags = head_and_batch()
    with pytest.raises(ValueError, match=r"lengths must be a \(batch,\) tensor.*labels=tags, mask=mask"):
        head.compute_loss(h, tags, mask=mask)  # pytorch-crf: crf(emissions, tags, mask=mask)
    with pytest.raises(ValueError, match="labels=.*mask="):
        head.compute_loss(h, tags)
    tags = tags.masked_fill(~mask, -100)
    assert torch.isfinite(head.compute_loss(h, labels=tags, mask=mask))


def test_time_first_inputs_are_refused_with_both_shapes():
    head, h, lengths, mask, tags = head_and_batch()
    # time-first (T, B, H) features and a (T, B) mask, ragged lengths in any order
    mask2 = torch.arange(10)[None, :] < torch.tensor([7, 10])[:, None]
    with pytest.raises(ValueError, match="its transpose is: time-first"):
        head.compute_loss(h.transpose(0, 1), labels=tags.t(), mask=mask2.t())
    # batch-first features with a time-first mask or labels
    with pytest.raises(ValueError, match=r"\(10, 2\).*time-first"):
        head.decode(h, mask=mask.t())
    with pytest.raises(ValueError, match=r"labels must have shape \(batch, T\) = \(2, 10\).*\(10, 2\).*time-first"):
        head.compute_loss(h, lengths, labels=tags.t())


# ---------------------------------------------------------------- errors in the user's words


@pytest.mark.parametrize("method", ["forward", "compute_loss", "decode", "marginals", "topk", "sample", "entropy",
                                    "distribution"])
@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_non_finite_features_are_reported_as_hidden_states_with_sequence_and_position(method, kind):
    head, h, lengths, _, tags = head_and_batch(boundary_scores=True)
    h[1, 3, 2] = float("nan") if kind == "nan" else float("inf")
    call = {
        "forward": lambda: head(h, lengths),
        "compute_loss": lambda: head.compute_loss(h, lengths, labels=tags.masked_fill(tags < -1, 0).masked_fill(
            torch.arange(10)[None, :] >= lengths[:, None], -100)),
        "decode": lambda: head.decode(h, lengths),
        "marginals": lambda: head.marginals(h, lengths),
        "topk": lambda: head.topk(h, lengths, k=2),
        "sample": lambda: head.sample(h, lengths, num_samples=2),
        "entropy": lambda: head.entropy(h, lengths),
        "distribution": lambda: head.distribution(h, lengths),
    }[method]
    with pytest.raises(ValueError, match=r"hidden_states contains .*sequence 1, position 3"):
        call()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_debug_flag_catches_nan_on_every_backend_without_validation(backend, monkeypatch):
    cum = torch.randn(2, 11, 3).cumsum(1)
    cum[1, 4, 1] = float("nan")
    args = (cum, torch.zeros(3, 3), torch.zeros(4, 3), torch.tensor([10, 8]), 4)
    monkeypatch.setenv("TORCH_SEMIMARKOV_DEBUG", "1")
    for fn in (tsm.semi_crf_streaming_forward, tsm.semi_crf_streaming_viterbi, tsm.semi_crf_streaming_marginals):
        with pytest.raises(ValueError, match="cum_scores contains non-finite values .* sequence 1, cumulative position 4"):
            fn(*args, backend=backend, validate=False)
    with pytest.raises(ValueError, match="cum_scores contains"):
        tsm.semi_crf_streaming_entropy(*args, backend=backend, validate=False)


# ---------------------------------------------------------------- one convention


ARGS = (torch.nn.functional.pad(torch.randn(2, 8, 3).cumsum(1), (0, 0, 1, 0)), torch.zeros(3, 3), torch.zeros(4, 3),
        torch.tensor([8, 5]), 4)


@pytest.mark.parametrize("name", ["semi_crf_streaming_forward", "semi_crf_streaming_viterbi",
                                  "semi_crf_streaming_marginals", "semi_crf_streaming_topk",
                                  "semi_crf_streaming_sample", "semi_crf_streaming_entropy"])
def test_every_public_function_takes_keyword_options_and_backend(name):
    fn = getattr(tsm, name)
    extra = {"semi_crf_streaming_topk": {"k": 2}}.get(name, {})
    lm = torch.ones(2, 8, 3, dtype=torch.bool)
    lm[0, 2, 0] = False
    for backend in ("auto", "torch") + tuple(b for b in CPU_BACKENDS if b != "torch"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn(*ARGS, **extra, backend=backend, validate=True)
            fn(*ARGS, **extra, backend=backend, label_mask=lm)
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        fn(*ARGS, **extra, backend="triton", label_mask=lm)


def test_old_positional_forms_keep_working_and_show_the_keyword_form():
    with pytest.warns(FutureWarning, match=r"semi_crf_streaming_topk\(cum_scores, transition, duration_bias, "
                                           r"lengths, K, k=3\)"):
        old = tsm.semi_crf_streaming_topk(*ARGS, 3)
    assert torch.equal(old.scores, tsm.semi_crf_streaming_topk(*ARGS, k=3).scores)
    with pytest.warns(FutureWarning, match="semiring='max'"):
        best = tsm.semi_crf_streaming_forward(*ARGS, "max")
    assert torch.equal(best, tsm.semi_crf_streaming_forward(*ARGS, semiring="max"))
    with pytest.raises(TypeError, match="multiple values for argument 'k'"):
        tsm.semi_crf_streaming_topk(*ARGS, 3, k=2)


def test_backend_torch_keeps_masks_and_beyond_paths_off_the_engine(monkeypatch):
    """With the engine's kernels allowed on CPU tensors (the interpreter), "auto" takes them and
    "torch" does not: the masked log Z, top-k and the entropy honour ``backend=``."""
    monkeypatch.setattr(select, "ENGINE_ON_CPU", True)
    calls = []

    class Taken(Exception):
        pass

    def spy(name):
        def f(*a, **kw):
            calls.append(name)
            raise Taken(name)
        return f

    monkeypatch.setattr(topk_mod, "_topk_on_engine", spy("topk"))
    monkeypatch.setattr(entropy_mod, "_entropy_on_engine", spy("entropy"))
    monkeypatch.setattr(interface._TritonMaskedLogZ, "apply", spy("masked log Z"))
    lm = torch.ones(2, 8, 3, dtype=torch.bool)
    lm[1, 3, 2] = False
    calls_of = {}
    for backend in ("torch", "auto"):
        calls.clear()
        for run in (lambda: tsm.semi_crf_streaming_topk(*ARGS, k=2, backend=backend),
                    lambda: tsm.semi_crf_streaming_entropy(*ARGS, backend=backend),
                    lambda: tsm.semi_crf_streaming_forward(*ARGS, label_mask=lm, backend=backend)):
            try:
                with torch.no_grad():
                    run()
            except Taken:
                pass
        calls_of[backend] = list(calls)
    assert calls_of["torch"] == []
    assert calls_of["auto"] == ["topk", "entropy", "masked log Z"]


def test_one_result_type_per_concept():
    head, h, lengths, _, _ = head_and_batch()
    post = head.marginals(h, lengths)
    assert isinstance(post, MarginalsResult)
    fn = tsm.semi_crf_streaming_marginals(*head.distribution(h, lengths)._args())
    torch.testing.assert_close(post.position, fn.position)
    assert post.position_entropy.shape == (2, 10)
    with pytest.warns(FutureWarning, match="position_entropy"):
        torch.testing.assert_close(post.entropy, post.position_entropy)
    s = head.sample(h, lengths, num_samples=3, generator=torch.Generator().manual_seed(0))
    assert s.segments_of(2, 1) == s.segments[2 * 2 + 1]
    assert head.decode(h, lengths).segments_of(1) == head.decode(h, lengths).segments[1]


# ---------------------------------------------------------------- defaults that lead to good models


def test_same_label_neighbours_can_be_forbidden_for_all_or_some_labels():
    head, h, lengths, _, _ = head_and_batch(allow_same_label_transitions=False)
    assert bool(torch.isneginf(head.effective_transition().diagonal()).all())
    s = head.sample(h, lengths, num_samples=6, generator=torch.Generator().manual_seed(0))
    assert all(a.label != b.label for segs in s.segments for a, b in zip(segs, segs[1:]))
    # a gold run longer than K needs c -> c: the error says which option
    labels = torch.tensor([[0] * 6 + [1] * 4, [2] * 7 + [-100] * 3])
    with pytest.raises(ValueError, match="same-label moves of label 0 are forbidden .*allow_same_label_transitions"):
        head.compute_loss(h, lengths, labels)
    # per label: only label 0 (a long background label) may follow itself
    head, h, lengths, _, _ = head_and_batch(allow_same_label_transitions=[True, False, False])
    tr = head.effective_transition()
    assert torch.isfinite(tr[0, 0]) and torch.isneginf(tr[1, 1]) and torch.isneginf(tr[2, 2])
    assert torch.isfinite(head.compute_loss(h, lengths, torch.tensor([[0] * 6 + [1] * 4, [0] * 7 + [-100] * 3])))
    assert "allow_same_label_transitions=[True, False, False]" in repr(head)
    with pytest.raises(ValueError, match="C = 3 bools"):
        SemiMarkovCRFHead(3, 4, allow_same_label_transitions=[True, False])


def test_param_groups_put_the_crf_parameters_apart():
    head, *_ = head_and_batch(duration="poisson", start_end_scores=True)
    encoder = torch.nn.Linear(4, H)
    model = torch.nn.ModuleDict({"encoder": encoder, "head": head})
    groups = head.param_groups(1e-3, model=model)
    assert [g["lr"] for g in groups] == [1e-3, 1e-2]
    crf = {id(p) for p in groups[1]["params"]}
    assert crf == {id(p) for p in head.crf_parameters()} and id(head.transition) in crf
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in model.parameters()} - crf
    assert head.param_groups(1e-3, crf_lr=5e-2)[1]["lr"] == 5e-2
    torch.optim.Adam(groups)  # a valid optimiser configuration
