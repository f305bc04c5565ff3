"""The piece machinery every multi-step experiment shares: resumable pieces with an atomic
``DONE.json`` (:mod:`.pieces`), the training, attack, evaluation and figure pieces built on it
(:mod:`.common`) and the memory model of a plan (:mod:`.memory`).

Reproductions (``experiments/reproduce``), audits (``experiments/audit``, ``audit_model``) and the
membership reference models (``experiments/membership/reference_training.py``) are built from these; none of them is
imported here, so a piece never imports a paper's folder.
"""
