"""Bilevel reconstruction (Runkel et al. 2024, eq. 2 / update 7).

* :mod:`.problem`: flat parameters, the lower-level energy, upper losses (``UPPER_LOSSES``),
  first inner iterates (``THETA0``), Hessian and Gauss–Newton products (``CURVATURES``),
  surrogate inner activations (``INNER_ACTIVATIONS``).
* :mod:`.lbfgs`: the inner L-BFGS solver with line searches; curvature pairs; two-loop recursion.
* :mod:`.linear_solve`: inverse-Hessian strategies (``LINEAR_SOLVERS``: pcg, cg, neumann, qn),
  each reporting its relative residual.
* :mod:`.hypergrad`: the implicit-function hypergradient (sign derived there).
* :mod:`.config`: ``BilevelConfig`` (an AttackConfig) and the kink treatments.
* :mod:`.attack`: ``BilevelAttack`` (an Attack), registered as ``bilevel``.
"""

from datarecon.attacks.bilevel.attack import BilevelAttack
from datarecon.attacks.bilevel.config import NONSMOOTH, SMOOTH, BilevelConfig, KinkTreatment
from datarecon.attacks.bilevel.hypergrad import Hypergradient, HypergradientSettings, hypergradient, implicit_gradient
from datarecon.attacks.bilevel.lbfgs import (
    LBFGSMemory,
    LBFGSResult,
    LBFGSSettings,
    LineSearchSettings,
    lbfgs_minimize,
    two_loop,
)
from datarecon.attacks.bilevel.linear_solve import (
    LINEAR_SOLVERS,
    SolveOptions,
    SolveResult,
    estimate_lambda_max,
    lbfgs_preconditioner,
    relative_residuals,
    solve_cg,
    solve_neumann,
    solve_qn,
)
from datarecon.attacks.bilevel.problem import (
    CURVATURES,
    INNER_ACTIVATIONS,
    THETA0,
    UPPER_LOSSES,
    Energy,
    FlatLayout,
    GaussNewtonOperator,
    HessianOperator,
    has_kinks,
    make_energy,
    resolve_weight_decay,
)

__all__ = ["CURVATURES", "INNER_ACTIVATIONS", "LINEAR_SOLVERS", "NONSMOOTH", "SMOOTH", "THETA0", "UPPER_LOSSES",
           "BilevelAttack", "BilevelConfig", "Energy", "FlatLayout", "GaussNewtonOperator", "HessianOperator",
           "Hypergradient", "HypergradientSettings", "KinkTreatment", "LBFGSMemory", "LBFGSResult", "LBFGSSettings",
           "LineSearchSettings", "SolveOptions", "SolveResult",
           "estimate_lambda_max", "has_kinks", "hypergradient", "implicit_gradient", "lbfgs_minimize",
           "lbfgs_preconditioner", "make_energy", "relative_residuals", "resolve_weight_decay", "solve_cg",
           "solve_neumann", "solve_qn", "two_loop"]
