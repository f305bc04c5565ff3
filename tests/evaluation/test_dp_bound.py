"""The DP-SGD reconstruction bound (evaluation.dp_bound) against closed forms derived independently."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from datarecon.errors import DataReconError
from datarecon.evaluation.dp_bound import prior_kappa, rero_bound, rero_bound_gaussian


@pytest.mark.parametrize("kappa,sigma,steps", [(0.05, 1.0, 1), (0.01, 4.0, 100), (0.2, 10.0, 30)])
def test_full_batch_bound_is_the_neyman_pearson_power_of_the_sum(kappa, sigma, steps):
    # N(0, σ²I_T) vs N(1_T, σ²I_T): the sum S is sufficient; reject when S > c, P_ν(S > c) = κ
    c = stats.norm.ppf(1 - kappa, loc=0, scale=math.sqrt(steps) * sigma)
    power = stats.norm.sf(c, loc=steps, scale=math.sqrt(steps) * sigma)
    assert rero_bound_gaussian(kappa, noise_multiplier=sigma, steps=steps) == pytest.approx(power, rel=1e-10)


@pytest.mark.parametrize("q", [0.05, 0.3])
def test_one_subsampled_step_matches_its_closed_form(q):
    # T = 1: the likelihood ratio is increasing in x, so the test is x > c with c = σΦ⁻¹(1 − κ);
    # its power under (1 − q)N(0, σ²) + qN(1, σ²) is (1 − q)κ + q·P(N(1, σ²) > c)
    kappa, sigma = 0.05, 0.5
    c = sigma * stats.norm.ppf(1 - kappa)
    exact = (1 - q) * kappa + q * stats.norm.sf(c, loc=1, scale=sigma)
    mc = rero_bound(kappa, noise_multiplier=sigma, sample_rate=q, steps=1, samples=200_000, seed=1)
    assert mc == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 200_000) + 2e-3)


def test_monte_carlo_tends_to_the_gaussian_bound_and_is_monotone():
    g = rero_bound_gaussian(0.05, noise_multiplier=3.0, steps=10)
    mc = rero_bound(0.05, noise_multiplier=3.0, sample_rate=0.99999, steps=10, samples=100_000)
    assert mc == pytest.approx(g, abs=0.01)
    b = [rero_bound(0.05, noise_multiplier=s, sample_rate=0.2, steps=50, samples=20_000) for s in (0.5, 1.0, 4.0)]
    assert b[0] > b[1] > b[2] >= 0.05
    assert rero_bound(0.05, noise_multiplier=0.0, sample_rate=0.2, steps=5) == 1.0


def test_prior_kappa_is_a_clopper_pearson_upper_bound():
    assert prior_kappa(0, 20) == pytest.approx(1 - 0.05 ** (1 / 20))  # (1 − κ)^n = 0.05 when no success
    assert prior_kappa(20, 20) == 1.0
    with pytest.raises(DataReconError, match="not a proportion"):
        prior_kappa(3, 2)
    with pytest.raises(DataReconError, match="sample rate"):
        rero_bound(0.1, noise_multiplier=1.0, sample_rate=0.0, steps=3)
