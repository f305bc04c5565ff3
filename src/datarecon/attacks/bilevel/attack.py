"""The bilevel reconstruction attack as an IterativeAttack (Runkel et al. 2024, eq. 2 / update 7).

Each outer step k (``BilevelAttack.step``):

1. θ^{k+1} = argmin_θ E(x^k, y; θ) by L-BFGS (:mod:`.lbfgs`), warm-started from θ^k and from
   the stored curvature pairs; gradient-norm tolerance ``inner_tol``, cap ``inner_max_iter``
   (``inner_max_iter_first`` for the first solve from θ⁰);
2. p^{k+1} = H⁻¹ ∇_θ l(θ*, θ^{k+1}) by the strategy ``hessian`` (:mod:`.linear_solve`:
   "qn" two-loop over the inner pairs, "cg" exact-HVP conjugate gradients, "neumann");
3. x^{k+1} = optimiser step on x with gradient −∇_x⟨∇_θE(x^k, θ^{k+1}), p^{k+1}⟩ (= ∇_x l by the
   implicit function theorem, sign derived in :mod:`.hypergrad`) plus ``box_weight`` × the
   gradient of the pixel-box prior.

All mutable state lives in the flat state dict (so the shared runner checkpoints it and a
resumed run is bit-identical on CPU):

    x                  (m, C, H, W) candidates, model input space
    theta              (P,) current inner solution θ^k (flat, the target's parameter order)
    p                  (P,) previous H⁻¹∇l (CG warm start)
    lbfgs.s, lbfgs.y   (history, P) curvature pairs; lbfgs.meta int64 [count, head]
    opt.x.*, opt.step  optimiser buffers (:mod:`datarecon.attacks.optim`)
    bilevel.counts     int64 [outer steps, inner iterations, inner evaluations, HVPs]
    bilevel.residuals  float64 [last, max, sum] of the inner gradient norms

Memory: θ, p and 2·history vectors of P numbers (one-hidden CIFAR target, P = 18.9 M,
float32, history 10: ≈ 1.7 GB, saved in every checkpoint); no dense Hessian.
"""

from __future__ import annotations

import math
import warnings
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from datarecon.registry import registered
from datarecon.attacks.base import AttackerPrior, Target
from datarecon.attacks.bilevel.hypergrad import hypergradient
from datarecon.attacks.bilevel.lbfgs import LINE_SEARCHES, LBFGSMemory, lbfgs_minimize
from datarecon.attacks.bilevel.linear_solve import LINEAR_SOLVERS, SolveOptions
from datarecon.attacks.bilevel.problem import (
    THETA0,
    UPPER_LOSSES,
    FlatLayout,
    box_penalty,
    make_energy,
    resolve_weight_decay,
    value_and_grad,
)
from datarecon.attacks.optim import OPTIMIZERS, OptimizerSettings, init_optimizer_state, optimizer_step
from datarecon.training.losses import margins

COUNTS, RESIDUALS = "bilevel.counts", "bilevel.residuals"
DIST_X0 = "bilevel.param_distance_x0"  # ‖θ* − θ(x⁰)‖²: the first inner solve, before any x update
_C_STEPS, _C_INNER, _C_EVALS, _C_HVPS = range(4)


class BilevelConfig(BaseModel):
    """Hyper-parameters of the bilevel attack (frozen; one-to-one with a config file).

    Attributes:
        steps: outer steps.
        lr_x: step size η on x (problem-dependent; 0.01–0.1 was stable on the planted affine tests,
            1.0 overshot).
        optimizer: ``datarecon.attacks.optim.OPTIMIZERS`` name ("sgd", "adam"). METHODS §7: Adam
            moves even a ground-truth initialisation; plain gradient steps keep it in place.
        momentum: SGD momentum (0: plain gradient descent).
        hessian: inverse-Hessian strategy (``LINEAR_SOLVERS``: "cg", "qn", "neumann"). Default "cg":
            on the affine CIFAR benchmark it matches a tight reference to ~5e-7 for ~8 HVPs per step
            (a few ms), while "qn" (the paper's choice, no HVPs) is ~46 % off (cosine 0.89).
        solve_tol: CG relative residual tolerance.
        solve_max_iter: CG iteration cap / number of Neumann terms.
        damping: μ, solve (H + μI) p = ∇l (cg, neumann); biases the hypergradient when > 0. ReLU
            targets need it: their inner solve stalls on kinks where ∇²E is indefinite (CG meets
            negative curvature at μ ≤ 0.1 on the one-hidden benchmark; μ = 1 converges).
        neumann_alpha: Neumann step size α (needs α·λ_max(H) < 2).
        warm_start_p: start CG from the previous p.
        inner_tol: inner L-BFGS stops at ‖∇_θE‖₂ ≤ inner_tol (with ``inner_tol_schedule``
            "distance": the floor of the schedule).
        inner_tol_schedule: "fixed" (``inner_tol`` at every step) or "distance": tie the inner
            tolerance to outer progress, tol_k = clip(inner_tol_factor · wd · ‖θ* − θ_{k−1}‖,
            inner_tol, inner_tol_max). E is wd-strongly convex for affine targets, so the inner error
            ‖θ̂ − θ(x)‖ ≤ tol/wd stays below inner_tol_factor × the current distance: no accuracy is
            spent on θ(x) while x is still far from a solution.
        inner_tol_factor, inner_tol_max: of the "distance" schedule.
        inner_max_iter: inner iteration cap per outer step.
        inner_max_iter_first: cap for the first inner solve (from θ⁰).
        lbfgs_history: curvature pairs kept (inner model and "qn" strategy).
        line_search: ``LINE_SEARCHES`` name ("strong-wolfe", "armijo").
        theta0: first inner iterate (``THETA0``: "uniform" U(0,1) as in the paper, "target", "default").
        upper_loss: ``UPPER_LOSSES`` name ("sq" = ‖θ* − θ‖², "normalised").
        weight_decay_override: weight decay of the lower-level energy instead of the target's
            (required for logistic / cross-entropy targets trained without weight decay).
        box_weight: weight of the pixel-box prior Σ relu(x − upper)² + relu(lower − x)² (0: off).
        dtype: float32 | float64 of the attack (θ*, θ, x and all solves).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=200, ge=0)
    lr_x: float = Field(default=0.05, gt=0)
    optimizer: Annotated[str, registered(OPTIMIZERS)] = "sgd"
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    hessian: Annotated[str, registered(LINEAR_SOLVERS)] = "cg"
    solve_tol: float = Field(default=1e-6, gt=0)
    solve_max_iter: int = Field(default=100, ge=1)
    damping: float = Field(default=0.0, ge=0)
    neumann_alpha: float = Field(default=1.0, gt=0)
    warm_start_p: bool = True
    inner_tol: float = Field(default=1e-6, gt=0)
    inner_tol_schedule: Literal["fixed", "distance"] = "fixed"
    inner_tol_factor: float = Field(default=0.1, gt=0)
    inner_tol_max: float = Field(default=1e-2, gt=0)
    inner_max_iter: int = Field(default=50, ge=0)
    inner_max_iter_first: int = Field(default=1000, ge=0)
    lbfgs_history: int = Field(default=10, ge=0)
    line_search: Annotated[str, registered(LINE_SEARCHES)] = "strong-wolfe"
    theta0: Annotated[str, registered(THETA0)] = "uniform"
    upper_loss: Annotated[str, registered(UPPER_LOSSES)] = "sq"
    weight_decay_override: float | None = Field(default=None, ge=0)
    box_weight: float = Field(default=0.0, ge=0)
    dtype: Literal["float32", "float64"] = "float64"






    def solve_options(self) -> SolveOptions:
        return SolveOptions(tol=self.solve_tol, max_iter=self.solve_max_iter, damping=self.damping,
                            neumann_alpha=self.neumann_alpha, warm_start=self.warm_start_p)

    def optimizer_settings(self) -> OptimizerSettings:
        return OptimizerSettings(momentum=self.momentum)


class BilevelAttack:
    """Runkel et al. (2024) bilevel reconstruction, stepping form for the shared runner.

    Args:
        config: the frozen :class:`BilevelConfig`.
    """

    name = "bilevel"
    config_cls = BilevelConfig
    divergence_hint = ("lower lr_x, raise weight_decay_override or damping, or use --hessian cg "
                       "with a tighter solve_tol")
    resume_ignore = ("steps",)

    def __init__(self, config: BilevelConfig | None = None) -> None:
        self.config = config if config is not None else BilevelConfig()
        if not isinstance(self.config, BilevelConfig):
            raise TypeError(f"BilevelAttack needs a BilevelConfig, got {type(self.config).__name__}")
        self._cache: tuple | None = None  # (target, prior, layout, energy, θ*) of the last call

    @classmethod
    def from_config(cls, config: BilevelConfig) -> BilevelAttack:
        """Build the attack from its config (used by the CLI through the ATTACKS registry)."""
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self.config.dtype == "float64" else torch.float32

    # ------------------------------------------------------------------ helpers

    def weight_decay(self, target: Target) -> float:
        """The lower-level weight decay (refuses energies without a finite minimiser)."""
        return resolve_weight_decay(target.loss, target.weight_decay, self.config.weight_decay_override)

    def _problem(self, target: Target, prior: AttackerPrior):
        """(layout, E(x, θ), θ*) in the attack's dtype, cached per (target, prior)."""
        cached = self._cache
        if cached is None or cached[0] is not target or cached[1] is not prior:
            params = {k: v.detach().to(self.dtype) for k, v in target.params.items()}
            layout = FlatLayout(params)
            labels = prior.labels.to(layout.device)
            if labels.is_floating_point():
                labels = labels.to(layout.dtype)
            # functional_call replaces every parameter, so the module's own dtype does not matter
            energy_fn = make_energy(target.model, layout, labels, loss=target.loss,
                                    weight_decay=self.weight_decay(target))
            self._cache = (target, prior, layout, energy_fn, layout.flatten(params).detach())
        return self._cache[2:]

    @staticmethod
    def _on(state: dict[str, torch.Tensor], layout: FlatLayout) -> None:
        """Move floating state to the target's device (a checkpoint is loaded on CPU)."""
        for k, v in list(state.items()):
            if v.is_floating_point() and v.device != layout.device and k not in (RESIDUALS, DIST_X0):
                state[k] = v.to(layout.device)

    def inner_tolerance(self, *, theta: torch.Tensor, theta_star: torch.Tensor, weight_decay: float) -> float:
        """The inner L-BFGS tolerance of this step (see ``inner_tol_schedule``)."""
        cfg = self.config
        if cfg.inner_tol_schedule == "fixed":
            return cfg.inner_tol
        dist = float(torch.linalg.vector_norm(theta_star - theta))
        return min(max(cfg.inner_tol_factor * weight_decay * dist, cfg.inner_tol), cfg.inner_tol_max)

    def _inner(self, energy_fn, x, theta, memory: LBFGSMemory, *, first: bool, tol: float | None = None):
        cfg = self.config
        return lbfgs_minimize(value_and_grad(energy_fn, x), theta, pairs=memory.pairs(),
                              history=cfg.lbfgs_history, tol=cfg.inner_tol if tol is None else tol,
                              max_iter=cfg.inner_max_iter_first if first else cfg.inner_max_iter,
                              line_search=cfg.line_search)

    # ------------------------------------------------------------------ protocol

    def init_state(self, target: Target, prior: AttackerPrior, *, x0: torch.Tensor,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
        """x = x0, θ = θ⁰ (``theta0``), p = 0, no curvature pairs, zero optimiser buffers.

        Raises:
            DataReconError: the energy has no finite minimiser (see ``weight_decay_override``).
        """
        layout, _, theta_star = self._problem(target, prior)
        theta = THETA0.get(self.config.theta0)(target.model, layout, theta_star, generator=generator)
        x = x0.detach().to(device=layout.device, dtype=layout.dtype).clone()
        mem = LBFGSMemory.empty(self.config.lbfgs_history, layout.size, dtype=layout.dtype, device=layout.device)
        state = {
            "x": x, "theta": theta, "p": torch.zeros_like(theta),
            "lbfgs.s": mem.s, "lbfgs.y": mem.y, "lbfgs.meta": mem.meta,
            COUNTS: torch.zeros(4, dtype=torch.int64),
            RESIDUALS: torch.zeros(3, dtype=torch.float64),
            DIST_X0: torch.full((), float("nan"), dtype=torch.float64),
        }
        state.update(init_optimizer_state(self.config.optimizer, {"x": x}))
        return state

    def step(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor],
             index: int) -> dict[str, float]:
        """One outer step (inner solve, linear solve, x update); the state changes only if finite."""
        cfg = self.config
        layout, energy_fn, theta_star = self._problem(target, prior)
        self._on(state, layout)
        x = state["x"]
        memory = LBFGSMemory(state["lbfgs.s"], state["lbfgs.y"], state["lbfgs.meta"])
        counts = state[COUNTS]
        tol = self.inner_tolerance(theta=state["theta"], theta_star=theta_star, weight_decay=self.weight_decay(target))
        inner = self._inner(energy_fn, x, state["theta"], memory, first=int(counts[_C_STEPS]) == 0, tol=tol)
        pairs = (memory.pairs() + inner.new_pairs)[-cfg.lbfgs_history:] if cfg.lbfgs_history else []
        hg = hypergradient(energy_fn, x, inner.theta, theta_star, upper=cfg.upper_loss, strategy=cfg.hessian,
                           options=cfg.solve_options(), pairs=pairs, previous_p=state["p"])
        grad_x = hg.grad_x
        box = torch.zeros((), dtype=x.dtype)
        if cfg.box_weight > 0:
            box, box_grad = box_penalty(x, prior.lower, prior.upper)
            grad_x = grad_x + cfg.box_weight * box_grad
        new = optimizer_step(cfg.optimizer, state, {"x": grad_x}, lrs={"x": cfg.lr_x},
                             settings=cfg.optimizer_settings())
        if hg.solve.negative_curvature and cfg.damping == 0 and cfg.hessian in ("cg", "neumann"):
            warnings.warn(
                f"bilevel: the linear solve met negative curvature at step {index} (the lower-level energy is "
                "not convex there, e.g. a ReLU target's kinks); the hypergradient is unreliable: set damping "
                "(e.g. --set damping=1.0)", RuntimeWarning, stacklevel=2)
        dist = float(((inner.theta - theta_star) ** 2).sum())
        metrics = {
            "loss": float(hg.upper),
            "param_distance": dist,
            "energy": float(hg.energy),
            "residual": inner.grad_norm,
            "inner_iters": float(inner.iterations),
            "inner_tol": tol,
            "inner_evals": float(inner.evaluations),
            "hvps": float(hg.solve.hvps),
            "negative_curvature": float(hg.solve.negative_curvature),
            "grad_x_norm": float(torch.linalg.vector_norm(grad_x)),
            "box": float(box),
        }
        if math.isfinite(hg.solve.residual):
            metrics["solve_residual"] = hg.solve.residual
        finite = (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_x_norm"])
                  and math.isfinite(inner.grad_norm) and all(bool(torch.isfinite(v).all()) for v in new.values()
                                                             if v.is_floating_point())
                  and bool(torch.isfinite(hg.p).all()))
        if not finite:
            metrics["loss"] = float("nan")
            return metrics
        # commit
        state["theta"] = inner.theta
        state["p"] = hg.p
        memory.extend(inner.new_pairs)
        state.update(new)
        if int(counts[_C_STEPS]) == 0:
            state[DIST_X0] = torch.tensor(dist, dtype=torch.float64)
        counts += torch.tensor([1, inner.iterations, inner.evaluations, hg.solve.hvps], dtype=torch.int64)
        res = state[RESIDUALS]
        res[0] = inner.grad_norm
        res[1] = max(float(res[1]), inner.grad_norm)
        res[2] += inner.grad_norm
        return metrics

    def final_inner(self, target: Target, prior: AttackerPrior, state: dict[str, torch.Tensor]):
        """θ(x_final) by a warm-started inner solve (the state is not modified)."""
        layout, energy_fn, theta_star = self._problem(target, prior)
        self._on(state, layout)
        memory = LBFGSMemory(state["lbfgs.s"].clone(), state["lbfgs.y"].clone(), state["lbfgs.meta"].clone())
        first = int(state[COUNTS][_C_STEPS]) == 0
        return self._inner(energy_fn, state["x"], state["theta"], memory, first=first), theta_star

    def finish(self, target: Target, prior: AttackerPrior,
               state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Scores and the run record's ``extra``.

        Scores (attacker-side, higher = more trusted): ``margin`` y·Φ(x; θ*) (binary) or the
        multiclass margin under θ*.

        ``extra``: ``param_distance`` ‖θ* − θ(x_final)‖² (Runkel Table 1), its normalised form
        (÷ ‖θ*‖²) and per-parameter form (÷ P, the reading under which the paper's values match),
        ``param_distance_x0`` ‖θ* − θ(x⁰)‖² after the first inner solve, before any x update (the
        no-attack reference: a Table 1 value at this level says nothing about x),
        the final inner residual and residual statistics over the run, total HVPs, inner
        iterations and evaluations, the weight decay and strategy used.
        """
        inner, theta_star = self.final_inner(target, prior, state)
        dist = float(((inner.theta - theta_star) ** 2).sum())
        counts, res = state[COUNTS], state[RESIDUALS].double()
        steps_done = int(counts[_C_STEPS])
        layout, _, _ = self._problem(target, prior)
        with torch.no_grad():
            out = target.forward(state["x"], layout.unflatten(theta_star))
            score = margins(out, prior.labels.to(out.device)).detach().cpu()
        n_params = int(theta_star.numel())
        dist_x0 = float(state[DIST_X0]) if DIST_X0 in state else float("nan")
        extra = {
            "param_distance": dist,
            "param_distance_normalised": dist / float((theta_star * theta_star).sum()),
            "param_distance_per_parameter": dist / n_params,
            "param_distance_x0": dist_x0,
            "param_distance_x0_per_parameter": dist_x0 / n_params,
            "inner_residual_final": inner.grad_norm,
            "inner_converged_final": inner.converged,
            "inner_residual_last_step": float(res[0]),
            "inner_residual_max": float(res[1]),
            "inner_residual_mean": float(res[2]) / steps_done if steps_done else float("nan"),
            "hvp_count": int(counts[_C_HVPS]),
            "inner_iterations": int(counts[_C_INNER]),
            "inner_evaluations": int(counts[_C_EVALS]),
            "outer_steps": steps_done,
            "weight_decay": self.weight_decay(target),
            "hessian": self.config.hessian,
            "num_parameters": n_params,
        }
        summary = {"param_distance": dist, "selection": {"param_distance": dist}, "extra": extra}
        return {"margin": score}, summary
