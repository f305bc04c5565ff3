"""The kernel below the victim's side (``training``) and the attacker's (``attacks``).

The one optimisation loop with its hooks (:mod:`.engine`), the losses and margins both sides
evaluate (:mod:`.losses`), the one checkpoint format (:mod:`.checkpoint`), the status words
(:mod:`.status`), the names of the files datarecon writes (:mod:`.files`) and the output-folder
claim (:mod:`.outdir`). It imports only ``utils``, ``registry``, ``config`` and ``errors``.

Importing it applies datarecon's one CPU-thread default (:mod:`datarecon.utils.threads`) once, so that the
Python API runs as the command line does.
"""

from datarecon.utils.threads import apply_default_threads

apply_default_threads()
