"""The training subspace of the first dense layer: spectrum, rank, basis and distances (attacker side).

A dense layer W (h × d) trained by gradient descent only ever moves by combinations of its
inputs: ∂L/∂W = Σ_i δ_i u_iᵀ with u_i the layer's input for training example i, so

    W − W_init = A U,    U (n × d) the n training inputs of the layer, A (h × n).

For the first layer of an MLP the inputs are the images themselves, so the row space of
W − W_init is the span of the training images: an image of the training set lies in it, an
unseen image of the same distribution does not. From the weights alone (no W_init) the same holds
up to the initialisation, which is small for the Haim et al. (2022) targets (first layer
N(0, 1)·1e-4) and of the order of the change for a standard initialisation. With a known
initialisation (``known_init``) the matrix analysed is W − a·W_init (a = 1 without weight decay;
with weight decay GD shrinks W_init by a factor a < 1, fitted in closed form by
:func:`init_coefficient`).

Convolutions: the first layer of a CNN sees 3×3×C patches, which span all of ℝ^{9C} once a few
images are seen, so the test does not carry over to it. :func:`first_dense_layer` therefore picks
the first ``nn.Linear`` of the model, whose inputs for a CNN are the flattened convolution features;
distances are then measured between features, not images.

Pure functions (no files, no state): :func:`first_dense_layer`, :func:`layer_matrix`,
:func:`layer_spectrum`, :func:`estimate_rank`, :func:`relative_distance`, and :func:`analyse`,
which combines them into a :class:`SubspaceAnalysis`; :func:`save_analysis` / :func:`load_analysis`
store one beside a run (``subspace.safetensors``).

References:
    Haim et al. (2022) (small first-layer initialisation); Loo et al. (2023) (known
    initialisation); Zhu & Ghodsi (2006), "Automatic dimensionality selection from the scree plot
    via the use of profile likelihood" (rank estimate); Marchenko & Pastur (1967) (the noise edge
    s(√h + √d) of an i.i.d. h × d matrix of standard deviation s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from datarecon.errors import DataReconError
from datarecon.kernel.files import SUBSPACE_FILE
from datarecon.utils.io import load_tensors, save_tensors

__all__ = ["DenseLayer", "RankEstimate", "Spectrum", "SubspaceAnalysis", "SUBSPACE_FILE", "analyse",
           "estimate_rank", "first_dense_layer", "init_coefficient", "layer_features", "layer_matrix",
           "layer_spectrum", "load_analysis", "noise_edge", "relative_distance", "save_analysis",
           "subspace_scores"]

#: File of a run directory holding the analysis of its target (singular values and basis).

#: Width of the likelihood interval of the rank estimate (log-likelihood units; 2 ≈ 95 %).
LIKELIHOOD_INTERVAL = 2.0

#: Singular values computed first when n is not known (doubled until the elbow is inside).
INITIAL_SEARCH = 64

#: From the weights alone with n known, at least this many times n singular directions are computed
#: and used (with W_init known: n).
WEIGHTS_ONLY_FACTOR = 2

#: The search stops once the last computed singular value is at least this fraction of the one
#: halfway: the spectrum has reached its flat floor (noise, or what training left outside the span)...
FLAT_TAIL = 0.6

#: ... and that floor lies at most this fraction below the largest value: a well-conditioned
#: training span (singular values within a factor of 2 of each other) is flat too, but not a floor.
FLOOR_DROP = 0.1


class _Stop(Exception):
    """Raised by the capture hook once the dense layer's input is known (the rest is not run)."""


@dataclass(frozen=True)
class DenseLayer:
    """The first ``nn.Linear`` of a model.

    Attributes:
        module: its module name in the model (``"1"`` for ``Sequential(Flatten, Linear, ...)``).
        weight: the parameter name of its weight (a key of ``Target.params``).
        in_features, out_features: d and h.
        on_input: True when its input is the flattened model input itself (MLP, affine); False
            when layers with parameters (convolutions) come before it.
    """

    module: str
    weight: str
    in_features: int
    out_features: int
    on_input: bool


def first_dense_layer(model: nn.Module, params: Mapping[str, torch.Tensor]) -> DenseLayer:
    """The first ``nn.Linear`` of ``model`` in module order.

    Raises:
        DataReconError: the model has no ``nn.Linear``.
    """
    earlier_params = False
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            key = f"{name}.weight" if name else "weight"
            if key not in params:
                raise DataReconError(f"the first dense layer {name!r} has no weight in the target's parameters")
            return DenseLayer(module=name, weight=key, in_features=module.in_features,
                              out_features=module.out_features, on_input=not earlier_params)
        if name and any(True for _ in module.parameters(recurse=False)):
            earlier_params = True
    raise DataReconError("the model has no nn.Linear layer; the subspace analysis needs a dense layer "
                         "(for a CNN, the linear read-out after the convolutions)")


def layer_features(model: nn.Module, params: Mapping[str, torch.Tensor], layer: DenseLayer,
                   x: torch.Tensor) -> torch.Tensor:
    """The input of ``layer`` for inputs x: (m, *input_shape) → (m, d), flattened.

    For an MLP this is ``x.flatten(1)``; for a CNN the convolution features. Only the layers
    before the dense layer are run.
    """
    module = model.get_submodule(layer.module)
    captured: list[torch.Tensor] = []

    def hook(_mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        captured.append(args[0].detach().reshape(args[0].shape[0], -1))
        raise _Stop

    handle = module.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            functional_call(model, dict(params), (x,))
    except _Stop:
        pass
    finally:
        handle.remove()
    if not captured:
        raise DataReconError(f"the dense layer {layer.module!r} was not reached by the model's forward")
    return captured[0]


def init_coefficient(weight: torch.Tensor, init: torch.Tensor) -> float:
    """a = ⟨W, W_init⟩ / ‖W_init‖², the least-squares factor of W_init in W.

    Without weight decay training leaves a = 1 (use it); with weight decay GD multiplies W_init
    by Π_t (1 − η_t·wd) < 1, which this recovers when the change W − a·W_init is nearly
    orthogonal to W_init (the change lies in the data's span, W_init is isotropic).
    """
    den = float((init.double() * init.double()).sum())
    return float((weight.double() * init.double()).sum()) / den if den > 0 else 1.0


def layer_matrix(params: Mapping[str, torch.Tensor], layer: DenseLayer, *,
                 known_init: Mapping[str, torch.Tensor] | None = None, coefficient: float | None = None
                 ) -> tuple[torch.Tensor, float | None]:
    """The matrix analysed: W (weights only) or W − a·W_init (known initialisation).

    Args:
        params: θ* (name → tensor).
        layer: from :func:`first_dense_layer`.
        known_init: θ_init (same keys), or None.
        coefficient: a; None: 1 (the default of :func:`analyse` decides when to fit it).

    Returns:
        ((h, d) matrix, a or None without ``known_init``).
    """
    w = params[layer.weight].detach()
    if known_init is None:
        return w, None
    a = 1.0 if coefficient is None else float(coefficient)
    return w - a * known_init[layer.weight].to(device=w.device, dtype=w.dtype), a


@dataclass(frozen=True)
class Spectrum:
    """Leading singular values and right singular vectors of a layer matrix.

    Attributes:
        values: (q,) singular values, descending.
        basis: (d, q) the right singular vectors (orthonormal columns), in the layer's input space.
        shape: (h, d) of the matrix.
        method: ``full`` (``torch.linalg.svd``) or ``randomized`` (``torch.svd_lowrank``).
    """

    values: torch.Tensor
    basis: torch.Tensor
    shape: tuple[int, int]
    method: str


def layer_spectrum(matrix: torch.Tensor, *, q: int | None = None, niter: int = 2, oversample: int = 10,
                   generator: torch.Generator | None = None) -> Spectrum:
    """The top-``q`` singular values and right singular vectors of ``matrix`` (h × d).

    ``q`` None or ≥ min(h, d)/2: a full SVD; else ``torch.svd_lowrank`` with ``q + oversample``
    columns and ``niter`` power iterations, truncated to q (seeded by ``generator`` through the
    global RNG state, which is restored).

    Raises:
        DataReconError: q < 1 or q > min(h, d) (names the largest q the layer allows).
    """
    h, d = matrix.shape
    full_rank = min(h, d)
    if q is not None and not 1 <= q <= full_rank:
        raise DataReconError(f"subspace rank {q} is not possible for a {h} x {d} layer; choose a rank "
                             f"between 1 and {full_rank}")
    if q is None or 2 * q >= full_rank:
        _, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        k = full_rank if q is None else q
        return Spectrum(values=s[:k].clone(), basis=vh[:k].T.contiguous(), shape=(h, d), method="full")
    cols = min(full_rank, q + oversample)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _, s, v = torch.svd_lowrank(matrix, q=cols, niter=niter)
    return Spectrum(values=s[:q].clone(), basis=v[:, :q].contiguous(), shape=(h, d), method="randomized")


def noise_edge(std: float, shape: tuple[int, int]) -> float:
    """Largest singular value of an i.i.d. h × d matrix of standard deviation ``std``: s(√h + √d)."""
    h, d = shape
    return float(std) * (math.sqrt(h) + math.sqrt(d))


@dataclass(frozen=True)
class RankEstimate:
    """An estimate of n (the number of training inputs behind a layer) with its uncertainty.

    Attributes:
        n_hat: the profile-likelihood elbow of the log singular values (Zhu & Ghodsi 2006).
        low, high: the range n is expected in. With W_init subtracted (an exact span): the elbows whose
            profile log-likelihood is within ``LIKELIHOOD_INTERVAL`` of the best. From the weights
            alone the weakest training directions sit among the initialisation's, below the elbow, so
            the elbow is a lower estimate: the range then runs from the likelihood interval's lower
            end to the number of directions above the spectrum's floor (the subspace dimension k).
            The likelihood interval alone excluded the true n on every weights-only layer measured
            (docs/RESULTS.md, "How good is the n estimate").
        above_noise: singular values above the initialisation's noise edge (None when the
            initialisation's scale is not known or the initialisation was subtracted).
        searched: how many singular values the estimate looked at.
    """

    n_hat: int
    low: int
    high: int
    above_noise: int | None
    searched: int

    def as_dict(self) -> dict[str, Any]:
        return {"n_hat": self.n_hat, "interval": [self.low, self.high], "above_noise": self.above_noise,
                "searched": self.searched}


def profile_likelihood(values: torch.Tensor) -> torch.Tensor:
    """Profile log-likelihood of each elbow k = 1..q−1 of log σ (two Gaussian groups, one variance).

    Returns:
        (q − 1,) log-likelihoods, entry k−1 for an elbow after the k-th value.
    """
    s = values.detach().double().cpu().clamp_min(1e-300).log()  # q numbers: on the CPU, whatever the device
    q = s.numel()
    if q < 2:
        return torch.zeros(0, dtype=torch.float64)
    ks = torch.arange(1, q, dtype=torch.float64)
    c1, c2 = torch.cumsum(s, 0)[:-1], torch.cumsum(s * s, 0)[:-1]
    t1, t2 = s.sum(), (s * s).sum()
    ss_a = c2 - c1 * c1 / ks
    ss_b = (t2 - c2) - (t1 - c1) ** 2 / (q - ks)
    var = ((ss_a + ss_b) / q).clamp_min(1e-300)
    return -0.5 * q * var.log()


def estimate_rank(spectrum: Spectrum, *, noise_std: float | None = None) -> RankEstimate:
    """n̂ from the elbow of the spectrum, its likelihood interval and the count above the noise edge.

    Args:
        spectrum: from :func:`layer_spectrum` (ideally well beyond n values).
        noise_std: standard deviation of the i.i.d. initialisation still in the matrix (weights
            only), for the count above :func:`noise_edge`; None to skip it.
    """
    values = spectrum.values.detach().cpu()
    q = int(values.numel())
    if q < 2:
        return RankEstimate(n_hat=q, low=q, high=q, above_noise=None, searched=q)
    ll = profile_likelihood(values)
    best = int(ll.argmax()) + 1
    within = torch.nonzero(ll >= ll.max() - LIKELIHOOD_INTERVAL).flatten() + 1
    above = None
    if noise_std is not None:
        above = int((values > noise_edge(noise_std, spectrum.shape)).sum())
    return RankEstimate(n_hat=best, low=int(within.min()), high=int(within.max()), above_noise=above, searched=q)


def relative_distance(features: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """‖u − V Vᵀ u‖ / ‖u‖ for each row u of ``features`` (m, d); V = ``basis`` (d, k) orthonormal.

    0: in the span; 1: orthogonal to it. Rows of norm 0 give 1.
    """
    f = features.to(basis.dtype)
    proj = (f @ basis) @ basis.T
    norm = f.norm(dim=1)
    return (f - proj).norm(dim=1) / norm.clamp_min(torch.finfo(f.dtype).tiny) * (norm > 0) + (norm == 0)


@dataclass(frozen=True)
class SubspaceAnalysis:
    """What the attacker learns from the first dense layer.

    Attributes:
        layer: the layer analysed.
        spectrum: singular values (beyond the rank, for the scree plot) and basis.
        rank: the n estimate.
        k: the dimension of the subspace used: n (or the estimate's upper end) with W_init subtracted;
            from the weights alone every direction computed down to the spectrum's floor (≥ 2n with n known).
        known_init: True when W_init was subtracted.
        coefficient: a in W − a·W_init (None without a known initialisation).
        n_known: the attacker's prior n, if given.
    """

    layer: DenseLayer
    spectrum: Spectrum
    rank: RankEstimate
    k: int
    known_init: bool
    coefficient: float | None
    n_known: int | None

    @property
    def basis(self) -> torch.Tensor:
        """(d, k) orthonormal basis of the subspace."""
        return self.spectrum.basis[:, : self.k]

    def summary(self) -> dict[str, Any]:
        """JSON-able record (run.json, reports)."""
        return {"layer": self.layer.module, "weight": self.layer.weight, "shape": list(self.spectrum.shape),
                "on_input": self.layer.on_input, "matrix": "W - a*W_init" if self.known_init else "W",
                "coefficient": self.coefficient, "rank": self.rank.as_dict(), "k": self.k, "n_known": self.n_known,
                "method": self.spectrum.method}


def analyse(model: nn.Module, params: Mapping[str, torch.Tensor], *,
            known_init: Mapping[str, torch.Tensor] | None = None, n: int | None = None, k: int | None = None,
            fit_coefficient: bool = False, init_std: float | None = None,
            generator: torch.Generator | None = None) -> SubspaceAnalysis:
    """Spectrum, n estimate and basis of the first dense layer (W or W − a·W_init).

    Args:
        model, params: the target's architecture and θ*.
        known_init: θ_init, when the attacker knows it.
        n: the attacker's prior n (training-set size), if known: the subspace has k = n with a known
            initialisation; from the weights alone the 2n + max(16, n/2) leading directions
            (:data:`WEIGHTS_ONLY_FACTOR`); both at most the layer's rank (a layer narrower than n spans
            at most its rank).
        k: force the subspace dimension (overrides n and the estimate).
        fit_coefficient: fit a in W − a·W_init (:func:`init_coefficient`; for targets trained with
            weight decay); else a = 1.
        init_std: std of the first layer's i.i.d. initialisation (weights-only: the noise edge).
        generator: seeds the randomized SVD.

    Returns:
        :class:`SubspaceAnalysis`; its spectrum holds at least k + max(16, k/4) values (for the scree
        plot and the estimate) when the layer has that many.

    Raises:
        DataReconError: no dense layer; k larger than the layer allows; n below 1.
    """
    layer = first_dense_layer(model, params)
    full_rank = min(layer.out_features, layer.in_features)
    if k is not None and not 1 <= k <= full_rank:
        raise DataReconError(f"subspace rank k={k} is not possible for the {layer.out_features} x "
                             f"{layer.in_features} layer {layer.module!r}; choose 1..{full_rank}")
    if n is not None and n < 1:
        raise DataReconError(f"the training-set size n must be at least 1, got {n}")
    coefficient = None
    if known_init is not None and fit_coefficient:
        coefficient = init_coefficient(params[layer.weight], known_init[layer.weight])
    matrix, a = layer_matrix(params, layer, known_init=known_init, coefficient=coefficient)
    exact = known_init is not None
    # the subspace dimension: n (or the estimate) when W_init was subtracted (the span is exact); from the
    # weights alone every direction computed down to the spectrum's floor (at least 2n), because the
    # weakest training directions sit among the initialisation's and an overestimate costs little (its
    # extra directions are the initialisation's, nearly orthogonal to natural images; measured in
    # docs/RESULTS.md)
    factor = 1 if exact else WEIGHTS_ONLY_FACTOR
    want = k if k is not None else (None if n is None else factor * n)
    # n known: the dimension + a margin (the randomized SVD's cost grows with the values computed,
    # benchmarks/bench_subspace.py); else start with 64 and double until the computed spectrum ends in
    # its flat floor (σ_q ≥ FLAT_TAIL·σ_{q/2} and σ_q ≤ FLOOR_DROP·σ_1)
    q: int | None = min(full_rank, want + max(16, want // 4) if want is not None else INITIAL_SEARCH)
    while True:
        spec = layer_spectrum(matrix, q=q, generator=generator)
        rank = estimate_rank(spec, noise_std=None if exact else init_std)
        vals = spec.values
        flat = vals.numel() < 2 or (float(vals[-1]) >= FLAT_TAIL * float(vals[(vals.numel() - 1) // 2])
                                    and float(vals[-1]) <= FLOOR_DROP * float(vals[0]))
        if want is not None or q is None or q >= full_rank or flat:
            break
        q = min(full_rank, 2 * q)
    if k is not None:
        dim = k
    elif exact:
        dim = n if n is not None else rank.high
    else:
        dim = int(spec.values.numel())
    dim = max(1, min(dim, int(spec.values.numel())))
    if not exact:  # the elbow is a lower estimate: n may lie anywhere up to the floor of the spectrum
        rank = dataclasses.replace(rank, high=max(rank.high, int(spec.values.numel())))
    return SubspaceAnalysis(layer=layer, spectrum=spec, rank=rank, k=dim, known_init=exact,
                            coefficient=a, n_known=n)


def subspace_scores(model: nn.Module, params: Mapping[str, torch.Tensor], analysis: SubspaceAnalysis,
                    x: torch.Tensor, *, batch: int = 1024) -> torch.Tensor:
    """Membership score of inputs x (m, *input_shape): −(relative distance of the dense layer's
    input to the subspace), higher = closer = more likely a training input. (m,) float64."""
    out = []
    basis = analysis.basis
    for i in range(0, x.shape[0], batch):
        chunk = x[i:i + batch].to(device=basis.device, dtype=basis.dtype)
        feats = layer_features(model, params, analysis.layer, chunk)
        out.append(-relative_distance(feats, basis).double())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def save_analysis(path: str | Path, analysis: SubspaceAnalysis) -> None:
    """Write the singular values and the k basis vectors (``subspace.safetensors``), atomically."""
    save_tensors(Path(path), {"values": analysis.spectrum.values.detach().cpu().contiguous(),
                              "basis": analysis.basis.detach().cpu().contiguous()})


def load_analysis(path: str | Path) -> dict[str, torch.Tensor]:
    """``{"values": (q,), "basis": (d, k)}`` of a saved analysis (safetensors, no code executed)."""
    return load_tensors(Path(path))
