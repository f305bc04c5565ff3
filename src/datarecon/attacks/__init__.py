"""Reconstruction attacks: what an attacker has (:mod:`.base`), the attacks, and how they run.

* :mod:`.base`: Target, AttackerPrior, Reconstruction, the IterativeAttack protocol, ATTACKS.
* :mod:`.init`: initialisations of the candidates (INITS, make_init, InitSources).
* :mod:`.runner`: run_attack (logging, checkpoints, bit-identical resume, run directory).
* :mod:`.kkt_math`, :mod:`.surrogate`, :mod:`.optim`, :mod:`.selection`: pure pieces.
* :mod:`.kkt`: ``kkt``, ``decoreco``, ``gradnorm``; :mod:`.bilevel`: ``bilevel``.

Importing this package registers every attack in ATTACKS.
"""

from __future__ import annotations

import importlib

from datarecon.attacks import kkt as _kkt  # noqa: F401  (registers kkt, decoreco, gradnorm)
from datarecon.attacks.base import ATTACKS, AttackerPrior, IterativeAttack, Reconstruction, Target
from datarecon.attacks.init import INITS, InitSources, init_labels, make_init
from datarecon.attacks.runner import run_attack


def _load_optional(module: str) -> None:
    """Import an attack package that may still be missing (registers itself in ATTACKS)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise


_load_optional("datarecon.attacks.bilevel")

__all__ = ["ATTACKS", "INITS", "AttackerPrior", "InitSources", "IterativeAttack", "Reconstruction", "Target",
           "init_labels", "make_init", "run_attack"]
