"""Bilevel reconstruction (Runkel et al. 2024, eq. 2 / update 7).

* :mod:`.problem`: flat parameters, the lower-level energy, upper losses (``UPPER_LOSSES``),
  first inner iterates (``THETA0``), Hessian-vector products.
* :mod:`.lbfgs`: the inner L-BFGS solver with line searches; curvature pairs; two-loop recursion.
* :mod:`.linear_solve`: inverse-Hessian strategies (``LINEAR_SOLVERS``: qn, cg, neumann).
* :mod:`.hypergrad`: the implicit-function hypergradient (sign derived there).
* :mod:`.attack`: ``BilevelAttack`` / ``BilevelConfig`` (IterativeAttack), registered as ``bilevel``.
"""

from datarecon.attacks.base import ATTACKS
from datarecon.attacks.bilevel.attack import BilevelAttack, BilevelConfig
from datarecon.attacks.bilevel.hypergrad import Hypergradient, hypergradient, implicit_gradient
from datarecon.attacks.bilevel.lbfgs import LBFGSMemory, LBFGSResult, lbfgs_minimize, two_loop
from datarecon.attacks.bilevel.linear_solve import (
    LINEAR_SOLVERS,
    SolveOptions,
    SolveResult,
    solve_cg,
    solve_neumann,
    solve_qn,
)
from datarecon.attacks.bilevel.problem import THETA0, UPPER_LOSSES, FlatLayout, make_energy, resolve_weight_decay

if "bilevel" not in ATTACKS:
    ATTACKS.register("bilevel", BilevelAttack)

__all__ = ["LINEAR_SOLVERS", "THETA0", "UPPER_LOSSES", "BilevelAttack", "BilevelConfig", "FlatLayout", "Hypergradient",
           "LBFGSMemory", "LBFGSResult", "SolveOptions", "SolveResult", "hypergradient", "implicit_gradient",
           "lbfgs_minimize", "make_energy", "resolve_weight_decay", "solve_cg", "solve_neumann", "solve_qn",
           "two_loop"]
