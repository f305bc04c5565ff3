"""Membership: is an image in the training set of a model? (``datarecon membership``)

Every signal of :data:`datarecon.attacks.mia.SIGNALS` on the same members and non-members:

* black-box: the loss (the threshold attack every membership paper compares with) and LiRA's
  logit-scaled confidence;
* white-box: the per-example gradient norm, and the first dense layer's training subspace
  (:func:`datarecon.attacks.subspace.subspace_scores`; not applicable where that layer does not read
  the images, e.g. the read-out of a CNN);
* reference models: LiRA offline and online, RMIA offline and online, from models trained with the
  target's recipe, by default as many as a time budget allows (``references.count: auto``, estimated
  from the first models trained), or a skip line with their cost;
* any signal an installed package registers (entry-point group ``datarecon.membership_signals``).

Each signal is one registry entry that declares what it needs and its rank, so the package gathers inputs and
never names a signal. The modules, each one responsibility, lowest first:

* :mod:`.settings`: the settings, one-to-one with the flags (one :class:`~.settings.ReferenceSettings`);
* :mod:`.trainers`: how one reference model trains (a model directory's recipe, a user's function);
* :mod:`.reference_store`, :mod:`.reference_training`: what a folder keeps of its reference models, and their
  training and resume (one piece per model);
* :mod:`.candidates`: members, non-members, the population and LiRA's half-in pool;
* :mod:`.case`: the model as the attacker sees it, and what one evaluation measures;
* :mod:`.signals`: every signal's scores, from the registry (the target, and reference models playing it);
* :mod:`.references`: how many reference models (a checked K, or a time budget), trained or reused;
* :mod:`.choice`: the strongest signal, chosen where its headline is not measured, and the ε bound;
* :mod:`.folder`: the membership folder (one model per folder) and what is written into it;
* :mod:`.evaluate`: one evaluation of a model directory or of any case, and a run's membership card;
* :mod:`.images`: a user's images scored against a null they can see;
* :mod:`.own`: a user's own ``nn.Module`` (Python and ``--model package.module:factory``).

The evaluation measures the signals on the model's own training images (members) against **non-members drawn
from the unused part of its training split** (by default 2000, so that a TPR at 0.1 % FPR is estimable), with
RMIA's population samples from the test split. The reference models follow LiRA's design: they train on the
members and as many non-members of each class (the *half-in pool*), each on a random half, so that each of these
candidates is IN for about half of them; the signals that need IN models (LiRA and RMIA online) are measured on
that pool, every other signal on every candidate. The **strongest signal** is chosen where its headline is not
measured (on reference models playing the target, else on a calibration part of the candidates), and it is the
headline only when it is not weaker than the loss threshold on the same images
(:func:`~datarecon.evaluation.membership.headline_verdict`); else the loss threshold is, with the reason.
"""
