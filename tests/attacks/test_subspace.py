"""The first dense layer's training subspace: planted solutions, rank estimate, distances, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from datarecon.attacks.subspace import (
    analyse,
    estimate_rank,
    first_dense_layer,
    init_coefficient,
    layer_features,
    layer_spectrum,
    noise_edge,
    relative_distance,
    subspace_scores,
)
from datarecon.errors import DataReconError


def _mlp(d: int, h: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(d, h, bias=False), nn.ReLU(), nn.Linear(h, 1, bias=False)).double()


def _planted(n: int = 12, d: int = 96, h: int = 64, noise: float = 0.0, seed: int = 0):
    """W1 = A X + noise·E, the setting of a first layer trained from a small initialisation."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    a = torch.randn(h, n, generator=g, dtype=torch.float64)
    e = torch.randn(h, d, generator=g, dtype=torch.float64)
    return x, a @ x + noise * e, e


@pytest.mark.parametrize("q", [None, 30], ids=["full", "randomized"])
def test_planted_subspace_recovers_n_and_the_span(q):
    x, w, _ = _planted(noise=1e-3)
    spec = layer_spectrum(w, q=q, generator=torch.Generator().manual_seed(0))
    rank = estimate_rank(spec, noise_std=1e-3)
    assert rank.n_hat == 12 and rank.low <= 12 <= rank.high
    assert rank.above_noise == 12  # 1e-3·(√64 + √96) ≈ 0.018 splits signal from noise
    basis = spec.basis[:, :12]
    # every planted row lies in the recovered span; a random direction does not
    assert float(relative_distance(x, basis).max()) < 1e-2
    other = torch.randn(20, 96, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert float(relative_distance(other, basis).min()) > 0.8


def test_known_initialisation_is_subtracted_exactly():
    x, w, e = _planted(noise=3.0)  # an initialisation as large as the change: W alone hides the span
    model = _mlp(96, 64)
    params = {"1.weight": w, "3.weight": torch.ones(1, 64, dtype=torch.float64)}
    init = {"1.weight": 3.0 * e, "3.weight": torch.zeros(1, 64, dtype=torch.float64)}
    weights_only = analyse(model, params, n=12)
    known = analyse(model, params, known_init=init, n=12)
    assert known.rank.n_hat == 12 and known.coefficient == 1.0
    assert float(relative_distance(x, known.basis).max()) < 1e-10
    assert float(relative_distance(x, weights_only.basis).max()) > 0.1


def test_init_coefficient_recovers_a_decayed_initialisation():
    x, w, e = _planted(noise=0.0)
    decayed = w + 0.7 * e  # weight decay shrank the initialisation to 0.7 of its size
    assert init_coefficient(decayed, e) == pytest.approx(0.7, abs=0.05)
    model = _mlp(96, 64)
    params = {"1.weight": decayed, "3.weight": torch.ones(1, 64, dtype=torch.float64)}
    an = analyse(model, params, known_init={"1.weight": e, "3.weight": params["3.weight"]}, n=12,
                 fit_coefficient=True)
    assert an.coefficient == pytest.approx(0.7, abs=0.05)


def test_rank_search_without_n_grows_until_the_elbow_is_inside():
    x, w, _ = _planted(n=40, d=300, h=260, noise=1e-4)
    model = _mlp(300, 260)
    an = analyse(model, {"1.weight": w, "3.weight": torch.ones(1, 260, dtype=torch.float64)})
    assert an.rank.n_hat == 40 and an.k >= 40
    assert an.rank.searched >= 80  # 64 values did not contain the elbow with room: doubled


def test_noise_edge_is_the_largest_singular_value_of_noise():
    e = torch.randn(400, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.5
    top = float(torch.linalg.svdvals(e)[0])
    assert top == pytest.approx(noise_edge(0.5, (400, 300)), rel=0.05)


def test_relative_distance_edge_cases():
    basis = torch.eye(4, dtype=torch.float64)[:, :2]
    f = torch.tensor([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]],
                     dtype=torch.float64)
    d = relative_distance(f, basis)
    assert d.tolist() == pytest.approx([0.0, 1.0, 1.0, 1 / math.sqrt(2)])


def test_cnn_is_analysed_at_its_linear_read_out():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 4 * 4, 1, bias=False)).double()
    params = {k: v.detach() for k, v in cnn.named_parameters()}
    layer = first_dense_layer(cnn, params)
    assert layer.module == "3" and not layer.on_input and layer.in_features == 64
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    feats = layer_features(cnn, params, layer, x)
    assert torch.allclose(feats, cnn[:3](x))


def test_scores_are_minus_distances_of_the_layer_input():
    x, w, _ = _planted(noise=1e-6)
    model = _mlp(96, 64)
    params = {"1.weight": w, "3.weight": torch.ones(1, 64, dtype=torch.float64)}
    an = analyse(model, params, n=12)
    s = subspace_scores(model, params, an, x)
    assert float(s.min()) > -1e-4
    other = torch.randn(7, 96, dtype=torch.float64)
    assert torch.allclose(subspace_scores(model, params, an, other), -relative_distance(other, an.basis))


def test_bad_ranks_and_models_are_one_line_errors():
    x, w, _ = _planted()
    model = _mlp(96, 64)
    params = {"1.weight": w, "3.weight": torch.ones(1, 64, dtype=torch.float64)}
    with pytest.raises(DataReconError, match="subspace rank k=65 is not possible for the 64 x 96 layer"):
        analyse(model, params, k=65)
    # n is a training-set size, not a rank: more images than the layer is wide span the whole layer
    wide = analyse(model, params, n=65, known_init={k: torch.zeros_like(v) for k, v in params.items()})
    assert wide.k == 64 and wide.n_known == 65
    with pytest.raises(DataReconError, match="choose a rank between 1 and 64"):
        layer_spectrum(w, q=0)
    conv_only = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False)).double()
    with pytest.raises(DataReconError, match="no nn.Linear"):
        first_dense_layer(conv_only, {k: v for k, v in conv_only.named_parameters()})


def test_rank_search_does_not_stop_inside_a_well_conditioned_span():
    """A span whose singular values lie within a factor of 2 of each other (random images mixed by
    random coefficients) is flat over the first 64 values without being the floor: the search
    doubles until the floor is reached and finds n (it stopped at 64 with n_hat 33 for n = 100)."""
    x, w, _ = _planted(n=100, d=400, h=500, noise=1e-4)
    model = _mlp(400, 500)
    an = analyse(model, {"1.weight": w, "3.weight": torch.ones(1, 500, dtype=torch.float64)})
    assert an.rank.n_hat == 100 and an.rank.searched >= 128
    assert float(relative_distance(x, an.basis[:, :100]).max()) < 1e-2


@pytest.mark.parametrize("noise", [1e-2, 3e-2])
def test_the_weights_only_range_holds_n_when_the_elbow_falls_short(noise):
    """From the weights alone the elbow sits below n (weak training directions hide among the
    initialisation's); the likelihood interval around it excluded n, the range up to the spectrum's
    floor holds it. With W_init subtracted the elbow is exact."""
    g = torch.Generator().manual_seed(0)
    n, d, h = 20, 300, 100
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    a = torch.randn(h, n, dtype=torch.float64, generator=g) * torch.logspace(-2, 0, n, dtype=torch.float64)
    e = noise * torch.randn(h, d, dtype=torch.float64, generator=g)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(d, h, bias=False)).double()
    analysis = analyse(model, {"1.weight": e + a @ x}, init_std=noise, generator=torch.Generator().manual_seed(0))
    rank = analysis.rank
    assert rank.n_hat < n and rank.low <= n <= rank.high and rank.high == analysis.k
    exact = analyse(model, {"1.weight": e + a @ x}, known_init={"1.weight": e},
                    generator=torch.Generator().manual_seed(0)).rank
    assert exact.low <= n <= exact.high and exact.n_hat == n
