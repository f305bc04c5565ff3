"""Upper bound on reconstruction success under DP-SGD (Hayes, Mahloujifar & Balle, NeurIPS 2023).

Reconstruction robustness (ReRo): an attack succeeds on a training example z when its output
lands within the success region of z (here: best Haim-protocol SSIM at or above the audit's
threshold). Let κ be the success probability of the best guess made *without* the model (the
prior's baseline). Whatever the attack, its output is a test between the training run with z
(distribution μ_z) and the run without z (ν), and on ν the success event has probability ≤ κ.
So the success probability under μ_z is at most the largest power of a test of type-I error κ:

    κ₊ = 1 − f(κ),

f the trade-off function of the mechanism (Hayes et al. 2023 state the bound as the
Neyman–Pearson "blow-up" of κ; Kaissis, Hayes et al. 2023 as 1 − f(κ)). For DP-SGD with noise
multiplier σ, Poisson rate q and T steps, the dominating pair is one-dimensional per step
(the target's clipped gradient at norm C along a fixed direction, everything else known):

    ν = N(0, σ²)^⊗T,   μ = ((1 − q) N(0, σ²) + q N(1, σ²))^⊗T.

For q = 1 both are Gaussian and κ₊ = Φ(Φ⁻¹(κ) + √T/σ) (Dong, Roth & Su 2019: √T/σ-GDP); for
q < 1 the likelihood-ratio test's power is estimated by Monte Carlo, as in Hayes et al.

Not retrieved: the paper's own theorem text (the search tools returned only its abstract), so
this module states and tests the bound in the hypothesis-testing form derived above; the q = 1
case is checked against the closed form and the Monte Carlo estimate against it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from datarecon.errors import DataReconError


def rero_bound_gaussian(kappa: float, *, noise_multiplier: float, steps: int) -> float:
    """κ₊ = Φ(Φ⁻¹(κ) + √T/σ) for full-batch DP-SGD (q = 1).

    Args:
        kappa: prior success probability κ ∈ [0, 1].
        noise_multiplier: σ ≥ 0 (0: no bound, 1 returned unless κ = 0).
        steps: T ≥ 0.

    Returns:
        κ₊ ∈ [κ, 1].
    """
    _check(kappa, noise_multiplier, steps, 1.0)
    if kappa in (0.0, 1.0) or steps == 0:
        return float(kappa)
    if noise_multiplier == 0:
        return 1.0
    return float(stats.norm.cdf(stats.norm.ppf(kappa) + math.sqrt(steps) / noise_multiplier))


def rero_bound(kappa: float, *, noise_multiplier: float, sample_rate: float, steps: int, samples: int = 20_000,
               seed: int = 0) -> float:
    """κ₊ for DP-SGD with Poisson sampling: the most powerful test's power at type-I error κ.

    The log-likelihood ratio of μ to ν at x ∈ R^T is ℓ(x) = Σ_t log(1 − q + q·exp((2x_t − 1)/(2σ²)));
    the Neyman–Pearson test rejects ν when ℓ exceeds γ, the (1 − κ) quantile of ℓ under ν. κ₊ is the
    probability of that event under μ. Both are estimated from ``samples`` draws each (q < 1); q = 1
    uses the closed form.

    Args:
        kappa: prior success probability κ ∈ [0, 1].
        noise_multiplier: σ ≥ 0.
        sample_rate: q ∈ (0, 1].
        steps: T ≥ 0.
        samples: Monte Carlo draws per distribution.
        seed: seed of the draws.

    Returns:
        κ₊ ∈ [κ, 1] (Monte Carlo error about √(κ₊(1 − κ₊)/samples) for q < 1).

    Raises:
        DataReconError: arguments out of range.

    References:
        Hayes, Mahloujifar & Balle 2023 (arXiv 2302.07225), the ReRo bound for DP-SGD;
        Dong, Roth & Su 2019 (Gaussian DP) for q = 1.
    """
    _check(kappa, noise_multiplier, steps, sample_rate)
    if sample_rate >= 1.0 or kappa in (0.0, 1.0) or steps == 0 or noise_multiplier == 0:
        return rero_bound_gaussian(kappa, noise_multiplier=noise_multiplier, steps=steps)
    rng = np.random.default_rng(seed)
    s2 = noise_multiplier ** 2

    def llr(shift_rate: float) -> np.ndarray:
        out = np.zeros(samples)
        for _ in range(steps):  # one step at a time: memory O(samples)
            x = rng.normal(0.0, noise_multiplier, samples)
            if shift_rate:
                x = x + (rng.random(samples) < shift_rate)
            out += np.logaddexp(math.log1p(-sample_rate), math.log(sample_rate) + (2 * x - 1) / (2 * s2))
        return out

    null = llr(0.0)
    alt = llr(sample_rate)
    gamma = float(np.quantile(null, 1.0 - kappa))
    return float(max(kappa, np.mean(alt > gamma)))


def prior_kappa(null_successes: int, n: int, *, confidence: float = 0.95) -> float:
    """Upper confidence bound on κ from a null measurement: ``null_successes`` of ``n`` training images
    "reconstructed" by guesses made without the model (held-out images as candidates).

    Clopper–Pearson: the ``confidence`` upper bound of a binomial proportion (conservative, so that a
    null count of 0 does not claim κ = 0).
    """
    if n <= 0 or not 0 <= null_successes <= n:
        raise DataReconError(f"null successes {null_successes} of {n} training images is not a proportion")
    if null_successes == n:
        return 1.0
    return float(stats.beta.ppf(confidence, null_successes + 1, n - null_successes))


def _check(kappa: float, sigma: float, steps: int, q: float) -> None:
    if not 0.0 <= kappa <= 1.0:
        raise DataReconError(f"kappa must lie in [0, 1], got {kappa}")
    if not sigma >= 0:
        raise DataReconError(f"noise multiplier must be >= 0, got {sigma}")
    if steps < 0:
        raise DataReconError(f"steps must be >= 0, got {steps}")
    if not 0.0 < q <= 1.0:
        raise DataReconError(f"sample rate must lie in (0, 1], got {q}")
