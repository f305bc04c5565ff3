"""Sample splitting for the KKT attack (Shen et al. 2026): every N steps the candidates whose splitting matrix
S_i = ∇²_x⟨r, ∇_θ out_i(x_i)⟩ (r = goal − g) has the largest positive eigenvalue (times λ_i) are split into
x_i ± δ·v_i with λ_i/2 each; the copy replaces the candidate of the same label with the smallest λ. To second
order the residual falls by (λ_i/m)·μ_i·‖δ‖², μ_i the eigenvalue, found by power iteration on finite-difference
Hessian-vector products of the surrogate network.

The functions take the KKT attack (``attack``: its prepared target, formulation, labels, subspace projection
and ``split_*`` settings); :meth:`datarecon.attacks.kkt.KKTAttack.before_step` calls :func:`split`.

References:
    Shen et al. (2026) (sample splitting of the KKT reconstruction).
"""

from __future__ import annotations

from typing import Any

import torch

from datarecon.attacks import kkt_math
from datarecon.attacks.target import AttackerPrior, Target

__all__ = ["split", "splitting_directions"]


def _splitting_gradient(attack: Any, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor,
                        r: dict[str, torch.Tensor]) -> torch.Tensor:
    """∇_x Σ_i ⟨r, ∇_θ out_i(x_i)⟩ (r fixed): row i is ∇h_i(x_i) (the surrogate network)."""
    prep = attack.prepared(target, prior)
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        g = kkt_math.combination_gradient(prep.forward, prep.ref, xg, attack.labels(prior, x.device), lam.detach(),
                                          margin=attack.formulation(target), create_graph=True)
        inner = sum((g[k] * r[k]).sum() for k in r if g[k].requires_grad) * x.shape[0]
        (gx,) = torch.autograd.grad(inner, xg)
    return gx.detach()

def splitting_directions(attack: Any, target: Target, prior: AttackerPrior, x: torch.Tensor, lam: torch.Tensor,
                         *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per candidate, the unit direction v_i and eigenvalue μ_i of S_i = ∇²_x h_i with the largest
    μ_i (power iteration on central finite-difference Hessian-vector products, shifted to the
    positive end when the largest magnitude is negative).

    Returns:
        (v (m, C, H, W) with ‖v_i‖ = 1, μ (m,)).
    """
    prep = attack.prepared(target, prior)
    with torch.enable_grad():
        g = kkt_math.combination_gradient(prep.forward, prep.ref, x.detach(), attack.labels(prior, x.device),
                                          lam.detach(), margin=attack.formulation(target), create_graph=False)
    g = {k: v.detach() for k, v in g.items()}
    goal, _ = kkt_math.matching_goal(prep.params, g, init=prep.init, coefficient=prep.coefficient)
    r = {k: (goal[k] - g[k]).detach() for k in goal}
    m = x.shape[0]
    eps = (1e-3 * x.reshape(m, -1).norm(dim=1).clamp_min(1e-3)).reshape(m, *([1] * (x.dim() - 1)))

    def unit(v: torch.Tensor) -> torch.Tensor:
        return v / v.reshape(m, -1).norm(dim=1).clamp_min(1e-30).reshape(eps.shape)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        plus = _splitting_gradient(attack, target, prior, x + eps * v, lam, r)
        minus = _splitting_gradient(attack, target, prior, x - eps * v, lam, r)
        return (plus - minus) / (2 * eps)

    gen = torch.Generator().manual_seed(seed)
    start = unit(torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device=x.device, dtype=x.dtype))
    subspace = attack.uses_subspace(prior)
    if subspace:
        start = unit(attack.project(prior, start))

    def power(shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = start
        mu = torch.zeros(m, dtype=x.dtype, device=x.device)
        for _ in range(attack.config.split_iters):
            hv = hvp(v)
            if subspace:
                hv = attack.project(prior, hv)
            mu = (hv * v).reshape(m, -1).sum(1)
            v = unit(hv - shift.reshape(eps.shape) * v)
        return v, mu

    v, mu = power(torch.zeros(m, dtype=x.dtype, device=x.device))
    neg = mu < 0  # the dominant eigenvalue is negative: shift it away to reach the positive end
    if bool(neg.any()):
        v2, mu2 = power(torch.where(neg, mu, torch.zeros_like(mu)))
        v = torch.where(neg.reshape(eps.shape), v2, v)
        mu = torch.where(neg, mu2, mu)
    return v, mu


def split(attack: Any, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor], index: int) -> int:
    """Split the candidates with the largest λ_i·μ_i > 0 (the module docstring), in ``state``; returns how many."""
    c = attack.config
    x, lam = state["x"], state["lambda"]
    m = x.shape[0]
    v, mu = splitting_directions(attack, target, prior, x, lam, seed=index)
    gain = lam.abs() * mu
    labels = prior.labels.to(x.device)
    count = max(1, int(c.split_fraction * m))
    order = torch.argsort(gain, descending=True).tolist()
    taken: set[int] = set()
    done = 0
    for i in order:
        if done >= count or float(gain[i]) <= 0:
            break
        if i in taken:
            continue
        same = [j for j in torch.argsort(lam.abs()).tolist()
                if j != i and j not in taken and bool(labels[j] == labels[i])]
        if not same:
            continue
        j = same[0]
        delta = c.split_scale * float(x[i].norm()) * v[i]
        with torch.no_grad():
            x[j] = x[i] - delta
            x[i] = x[i] + delta
            lam[i] = lam[i] / 2
            lam[j] = lam[i]
            for key, buf in state.items():
                if key.startswith("opt.") and buf.shape[:1] == (m,):
                    buf[i] = 0
                    buf[j] = 0
        taken.update((i, j))
        done += 1
    return done
