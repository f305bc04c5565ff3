"""Non-gradient unmixing from the ReLU structure of the first layer (attacker side, weights only).

For a bias-free ReLU MLP with one output, trained by gradient descent on a margin loss, the change
of the first layer is a sum over training images of outer products (``attacks/subspace.py``):

    W − W_init = Σ_i c_i x_iᵀ,   c_i ∈ ℝ^h,   c_ji = 0 where unit j is inactive on x_i,

and the sign of c_ji is y_i·s_j, s_j the sign of unit j's effect on the output (for the
D-1000-1000-1 targets of Haim et al. (2022) 99 % of the units keep one sign and 99.5 % of the
coefficient mass agrees with it; ``benchmarks/bench_unmixing_structure.py``). With the rows
sign-adjusted, R = diag(s)·(W − W_init) = C X̃ with C ≥ 0 and X̃ = diag(y) X: every row is a
non-negative combination of the sign-adjusted training images, and each column of C is a
non-negative vector of the column space of R with zeros on the units the image does not activate.

:func:`conic_columns` finds such vectors as vertices of {v ∈ col(R): v ≥ 0} (one linear program
per chosen unit: minimise 1ᵀv with v_j = 1), :func:`unmix_candidates` turns k of them into k images
by least squares (R ≈ C B) and picks each image's sign from the activation pattern its column
implies. The columns found are vertices of the cone, which the true columns only approach (they
are not exactly sparse: ~9 % of their energy sits on inactive units after finite training), so
the images are approximations; they serve as candidates and as a KKT initialisation
(``--init unmix``), measured in docs/RESULTS.md.

References:
    Spielman, Wang & Wright (2012), "Exact recovery of sparsely-used dictionaries"; Qu, Sun &
    Wright (2014), "Finding a sparse vector in a subspace" (sparse vectors in a subspace by
    linear programs / ℓ1); Haim et al. (2022) (the targets).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from datarecon.errors import DataReconError

__all__ = ["conic_columns", "covering_columns", "downstream_signs", "unmix_candidates"]


def downstream_signs(model: nn.Module, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """s_j = sign of first-layer unit j's effect on the output with every later unit active.

    The product w_L·W_{L−1}···W_2 of the later layers' weights (biases and masks ignored), for a
    ``Sequential`` of Linear/ReLU/Flatten layers with one output.

    Raises:
        DataReconError: not such an MLP, or more than one output.
    """
    linears = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    others = [mod for _, mod in model.named_modules()
              if not isinstance(mod, (nn.Linear, nn.ReLU, nn.Flatten, nn.Sequential))]
    if len(linears) < 2 or others:
        raise DataReconError("the unmix initialisation needs a ReLU MLP (Linear/ReLU layers, at least one hidden "
                             "layer); use gaussian or uniform for this model")
    if linears[-1][1].out_features != 1:
        raise DataReconError("the unmix initialisation needs a single-output (binary) model; this one has "
                             f"{linears[-1][1].out_features} outputs")
    vec = params[f"{linears[-1][0]}.weight"].detach().to(torch.float64)  # (1, h_{L-1})
    for name, _ in reversed(linears[1:-1]):
        vec = vec @ params[f"{name}.weight"].detach().to(torch.float64)
    return torch.sign(vec.reshape(-1))


def conic_columns(rows: np.ndarray, units: np.ndarray) -> list[np.ndarray]:
    """Vertices of {v = R a ≥ 0}: for each unit j, argmin 1ᵀv s.t. v ≥ 0, v_j = 1 (HiGHS).

    Args:
        rows: R (h, k), the sign-adjusted rows in subspace coordinates.
        units: the units j to pin.

    Returns:
        The solutions v (h,) of the feasible programs (an infeasible unit gives none).
    """
    from scipy.optimize import linprog

    h, k = rows.shape
    cost = rows.sum(0)
    out = []
    for j in units:
        res = linprog(cost, A_ub=-rows, b_ub=np.zeros(h), A_eq=rows[j:j + 1], b_eq=[1.0],
                      bounds=[(None, None)] * k, method="highs")
        if res.status == 0:
            out.append(rows @ res.x)
    return out


def covering_columns(rows: np.ndarray, k: int, rng: np.random.Generator, *, tries: int | None = None,
                     duplicate: float = 0.999) -> list[np.ndarray]:
    """Up to k distinct vertices of {v = R a ≥ 0}, each LP pinned at the unit the columns found so
    far cover least (a new column must be non-zero there); ties broken at random.

    Args:
        rows: R (h, k_sub).
        k: columns wanted.
        rng: tie-breaking randomness.
        tries: LPs at most (default 3k).
        duplicate: cosine above which a solution repeats a column already found.
    """
    h = rows.shape[0]
    found: list[np.ndarray] = []
    cover = np.zeros(h)
    tried = np.zeros(h, dtype=bool)
    for _ in range(tries or 3 * k):
        if len(found) >= k or tried.all():
            break
        key = np.where(tried, np.inf, cover + 1e-9 * rng.random(h))
        j = int(np.argmin(key))
        tried[j] = True
        sols = conic_columns(rows, np.array([j]))
        if not sols:
            continue
        v = sols[0] / max(np.linalg.norm(sols[0]), 1e-300)
        if any(float(v @ f) > duplicate for f in found):
            continue
        found.append(v)
        cover += v / max(v.max(), 1e-300)
    return found


def _distinct(columns: list[np.ndarray], k: int) -> np.ndarray:
    """k columns chosen greedily for diversity (pivoted Gram–Schmidt on the unit columns), (h, k')."""
    unit = np.stack([c / max(np.linalg.norm(c), 1e-300) for c in columns], axis=1)
    chosen: list[int] = []
    resid = unit.copy()
    for _ in range(min(k, unit.shape[1])):
        norms = np.linalg.norm(resid, axis=0)
        norms[chosen] = -1.0
        i = int(np.argmax(norms))
        if norms[i] <= 1e-8:
            break
        chosen.append(i)
        q = resid[:, i] / norms[i]
        resid -= np.outer(q, q @ resid)
    return np.stack([columns[i] for i in chosen], axis=1)


def unmix_candidates(model: nn.Module, params: Mapping[str, torch.Tensor], analysis: object, *, m: int,
                     generator: torch.Generator, known_init: Mapping[str, torch.Tensor] | None = None,
                     lower: torch.Tensor | float = 0.0, upper: torch.Tensor | float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """m candidate images (model input space) and their ±1 labels from the first layer's cone.

    Batches of k = dim(subspace) columns (each from k LPs pinned at random units) give k images
    each by least squares; a candidate's label y is the sign whose activation pattern of the first
    layer agrees best with its column's support; it is scaled to the largest multiple that stays in
    the pixel box.

    Returns:
        (x (m, C, H, W) float64, labels (m,) float64 ±1), the first ⌈m/2⌉ labelled +1 (the
        balanced layout of :meth:`AttackerPrior.balanced`).

    Raises:
        DataReconError: a model the method does not apply to (see :func:`downstream_signs`), or no
            subspace analysis on the model input.
    """
    layer = getattr(analysis, "layer", None)
    if layer is None or not layer.on_input:
        raise DataReconError("the unmix initialisation needs the subspace of a first dense layer on the input (an MLP)")
    s = downstream_signs(model, params)
    w = params[layer.weight].detach().to(torch.float64)
    if known_init is not None:
        w = w - float(analysis.coefficient or 1.0) * known_init[layer.weight].detach().to(torch.float64)
    basis = analysis.basis.detach().to(torch.float64)  # (d, k)
    rows = ((s[:, None] * w) @ basis).numpy()  # (h, k)
    h, k = rows.shape
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    rng = np.random.default_rng(seed)
    images, signs, agree = [], [], []
    full_w = params[layer.weight].detach().to(torch.float64)
    while len(images) < m:
        cols = covering_columns(rows, k, rng)
        if len(cols) < 2:
            raise DataReconError("the unmix initialisation found no non-negative columns in the first layer; "
                                 "this model does not have the structure it uses (use gaussian)")
        cmat = _distinct(cols, k)  # (h, k')
        coords, *_ = np.linalg.lstsq(cmat, rows, rcond=None)  # (k', k): R ≈ C B
        xt = torch.from_numpy(coords) @ basis.T  # (k', d) sign-adjusted images
        for i in range(xt.shape[0]):
            support = torch.from_numpy(cmat[:, i]).clamp_min(0)
            best = None
            for y in (1.0, -1.0):
                active = (full_w @ (y * xt[i])) > 0
                score = float((support * active).sum() / support.sum().clamp_min(1e-300))
                if best is None or score > best[0]:
                    best = (score, y)
            images.append(best[1] * xt[i])
            signs.append(best[1])
            agree.append(best[0])
    x = torch.stack(images[:m])
    y = torch.tensor(signs[:m], dtype=torch.float64)
    conf = torch.tensor(agree[:m], dtype=torch.float64)
    # balanced layout: the ⌈m/2⌉ most confident +1 first, then −1; flip the least confident to balance
    half = (m + 1) // 2
    order_pos = [i for i in torch.argsort(-conf).tolist() if y[i] > 0]
    order_neg = [i for i in torch.argsort(-conf).tolist() if y[i] < 0]
    while len(order_pos) < half:
        i = order_neg.pop()
        x[i], y[i] = -x[i], 1.0
        order_pos.append(i)
    while len(order_pos) > half:
        i = order_pos.pop()
        x[i], y[i] = -x[i], -1.0
        order_neg.append(i)
    order = order_pos + order_neg
    x, y = x[order], y[order]
    lo = torch.as_tensor(lower, dtype=torch.float64).reshape(-1)
    hi = torch.as_tensor(upper, dtype=torch.float64).reshape(-1)
    flat = x.reshape(m, -1)
    with torch.no_grad():
        up = torch.where(flat > 0, hi.expand_as(flat) / flat.clamp_min(1e-300), torch.full_like(flat, float("inf")))
        down = torch.where(flat < 0, lo.expand_as(flat) / flat.clamp_max(-1e-300), torch.full_like(flat, float("inf")))
        scale = torch.minimum(up.min(1).values, down.min(1).values)
        scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return flat.mul(scale[:, None]).reshape(x.shape), y
