"""Reconstruction attacks: what an attacker has (:mod:`.base`), the attacks, and how they run.

* :mod:`.base`: Target, AttackerPrior, Reconstruction, the Attack base class, ATTACKS.
* :mod:`.init`: initialisations of the candidates (INITS, make_init, InitSources).
* :mod:`.runner`: run_attack (logging, checkpoints, bit-identical resume, run directory).
* :mod:`.kkt_math`, :mod:`.surrogate`, :mod:`.optim`, :mod:`.selection`: pure pieces.
* :mod:`.kkt`: ``kkt``, ``decoreco``, ``loo``; :mod:`.gradnorm`: ``gradnorm``; :mod:`.bilevel`: ``bilevel``;
  :mod:`.dynamics`: ``dynamics`` (SimuDy's dynamics matching).
* :mod:`.knowledge`: what the attacker knows beyond θ* (known θ_init, n): the run's threat model.
* :mod:`.subspace`: the training subspace of the first dense layer (spectrum, n, basis, distances).

Importing this package registers every attack in ATTACKS, here and only here: the registry
feeds the CLI's ``--method`` errors, the run file's attack union
(:mod:`datarecon.experiments.reconstruct`) and sweep workers (which import this package). Attacks of
installed packages join through the ``datarecon.attacks`` entry-point group (:data:`ATTACK_PLUGINS`;
:meth:`datarecon.registry.Registry.load_entry_points`), after the built-in ones.
"""

from __future__ import annotations

from datarecon.attacks.base import ATTACK_LOOP, ATTACKS, Attack, AttackConfig, AttackerPrior, AttackSetup, Reconstruction, Target
from datarecon.attacks.bilevel import BilevelAttack
from datarecon.attacks.dynamics import DynamicsAttack
from datarecon.attacks.init import INITS, CandidateSpec, InitSources, init_labels, make_init
from datarecon.attacks.gradnorm import GradNormAttack
from datarecon.attacks.kkt import DecoRecoAttack, KKTAttack, LooAttack
from datarecon.attacks.runner import run_attack

# the one place attacks are registered (a new attack adds its line here)
ATTACKS.register("kkt", KKTAttack)
ATTACKS.register("decoreco", DecoRecoAttack)
ATTACKS.register("gradnorm", GradNormAttack)
ATTACKS.register("bilevel", BilevelAttack)
ATTACKS.register("loo", LooAttack)
ATTACKS.register("dynamics", DynamicsAttack)

#: the entry-point group of attack plug-ins: ``name = "package.module:AttackClass"``
ATTACK_PLUGINS = "datarecon.attacks"


def _plugin_attack(name: str, obj: object) -> str:
    """Why an entry point's object cannot be the attack ``name`` ("" when it can; the registry then checks its
    declarations, :func:`datarecon.attacks.base.check_attack`)."""
    if not (isinstance(obj, type) and issubclass(obj, Attack)):
        return f"{obj!r} is not a subclass of datarecon.attacks.base.Attack"
    if obj.name != name:
        return f"its class declares name = {obj.name!r}; name the entry point {obj.name!r}"
    return ""


ATTACKS.use_entry_points(ATTACK_PLUGINS, check=_plugin_attack)

__all__ = ["ATTACKS", "ATTACK_LOOP", "ATTACK_PLUGINS", "INITS", "AttackSetup", "AttackerPrior", "CandidateSpec", "InitSources",
           "Attack", "AttackConfig", "Reconstruction", "Target", "init_labels", "make_init", "run_attack"]
