"""Duration distributions: shapes, normalisation, known pmfs, learnability, errors."""

from __future__ import annotations

import math

import pytest
import torch

from torch_semimarkov.durations import (
    DURATION_NAMES,
    CallableDuration,
    GeometricDuration,
    LearnedDuration,
    NegativeBinomialDuration,
    PoissonDuration,
    UniformDuration,
    make_duration,
)


@pytest.mark.parametrize("name", DURATION_NAMES)
def test_shape_and_finite(name):
    d = make_duration(name, max_duration=7, num_classes=3)
    out = d()
    assert out.shape == (7, 3)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("cls", [GeometricDuration, NegativeBinomialDuration, PoissonDuration])
def test_parametric_columns_are_log_distributions(cls):
    d = cls(12, 4, init_mean=[1.5, 3.0, 6.0, 20.0])
    torch.testing.assert_close(d().exp().sum(0), torch.ones(4), atol=1e-6, rtol=0)


def test_uniform_is_log_one_over_k():
    d = UniformDuration(5, 2)
    torch.testing.assert_close(d(), torch.full((5, 2), -math.log(5)))
    assert len(list(d.parameters())) == 0


def test_geometric_matches_closed_form():
    d = GeometricDuration(50, 1, init_mean=4.0, normalize=False)
    p = 0.25
    k = torch.arange(1, 51, dtype=torch.float32)
    torch.testing.assert_close(d()[:, 0], math.log(p) + (k - 1) * math.log(1 - p), atol=1e-5, rtol=1e-5)


def test_poisson_and_negbin_match_torch_distributions():
    n = torch.arange(0, 10, dtype=torch.float32)
    d = PoissonDuration(10, 1, init_mean=3.5, normalize=False)
    ref = torch.distributions.Poisson(torch.tensor(2.5)).log_prob(n)
    torch.testing.assert_close(d()[:, 0], ref, atol=1e-5, rtol=1e-5)
    nb = NegativeBinomialDuration(10, 1, init_mean=5.0, init_shape=3.0, normalize=False)
    r, p = 3.0, 3.0 / (3.0 + 4.0)
    # torch's NegativeBinomial counts successes with probs = P(success): our p is its 1 - probs
    ref = torch.distributions.NegativeBinomial(torch.tensor(r), probs=torch.tensor(1 - p)).log_prob(n)
    torch.testing.assert_close(nb()[:, 0], ref, atol=1e-4, rtol=1e-4)


def test_init_mean_is_respected():
    for cls in (GeometricDuration, PoissonDuration, NegativeBinomialDuration):
        d = cls(400, 2, init_mean=[5.0, 30.0])
        mean = (d().exp() * torch.arange(1, 401)[:, None]).sum(0)
        torch.testing.assert_close(mean, torch.tensor([5.0, 30.0]), atol=0.05, rtol=0.01)


@pytest.mark.parametrize("name", ["geometric", "negative_binomial", "poisson", "learned"])
def test_learnable_by_max_likelihood(name):
    # fit durations drawn around 6 for label 0 and 2 for label 1
    d = make_duration(name, 10, 2)
    data = torch.tensor([[5, 1], [6, 2], [7, 2], [6, 3], [6, 2]]) - 1
    opt = torch.optim.Adam(d.parameters(), lr=0.1)
    for _ in range(200):
        opt.zero_grad()
        logp = torch.log_softmax(d(), 0)
        loss = -(logp[data[:, 0], 0].sum() + logp[data[:, 1], 1].sum())
        loss.backward()
        opt.step()
    mean = (torch.softmax(d(), 0) * torch.arange(1, 11)[:, None]).sum(0)
    mean = mean.detach()
    assert abs(float(mean[0]) - 6.0) < 1.0 and abs(float(mean[1]) - 2.0) < 0.5


def test_callable():
    d = make_duration(lambda k: -0.5 * k, 4, 3)
    assert isinstance(d, CallableDuration)
    torch.testing.assert_close(d()[:, 2], torch.tensor([-0.5, -1.0, -1.5, -2.0]))
    lin = torch.nn.Linear(1, 3)
    d2 = make_duration(lin, 4, 3)
    assert len(list(d2.parameters())) == 2
    with pytest.raises(ValueError, match=r"must return shape \(4, 3\)"):
        make_duration(lambda k: torch.zeros(4, 2), 4, 3)()


def test_errors_and_module_passthrough():
    with pytest.raises(ValueError, match="unknown duration distribution"):
        make_duration("gamma", 4, 3)
    with pytest.raises(ValueError, match="one per class"):
        GeometricDuration(4, 3, init_mean=[1.0, 2.0])
    d = LearnedDuration(4, 3)
    assert make_duration(d, 4, 3) is d
    with pytest.raises(ValueError, match="the head needs"):
        make_duration(d, 5, 3)
    with pytest.raises(TypeError):
        make_duration(3, 4, 3)
    assert isinstance(make_duration("negbin", 4, 3), NegativeBinomialDuration)
