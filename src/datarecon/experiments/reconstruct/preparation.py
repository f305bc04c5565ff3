"""What an attack receives for a :class:`~datarecon.experiments.reconstruct.settings.ReconstructionRun`:
the attacker's view of the target, the attacker prior and x₀ (:func:`prepare`), and the checks of a run
against its target before anything is written."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datarecon.attacks.base import (
    ATTACKS,
    AttackerPrior,
    AttackSetup,
    Target,
    check_weight_scale,
)
from datarecon.attacks.init import INITS, CandidateSpec, InitSources, init_labels, make_init
from datarecon.attacks.knowledge import RESTORED_NEEDS_INIT as _RESTORED_NEEDS_INIT
from datarecon.attacks.knowledge import PRETRAINED, KnowledgeSettings, attacker_knowledge, check_known_n
from datarecon.attacks import priors
from datarecon.attacks.priors import weighted_priors
from datarecon.attacks.public import public_subspace
from datarecon.config import (
    build_record,
)
from datarecon.data import DataSpec, Normalisation, load_task
from datarecon.data.selection import check_fingerprint
from datarecon.data.draw import train_count
from datarecon.errors import DataReconError
from datarecon.models.checkpoint import EXTRAS, read_model_meta
from datarecon.utils.device import parse_device
from datarecon.utils.io import load_tensors
from datarecon.utils.memory import refuse_if_too_large
from datarecon.experiments.reconstruct.settings import STEP_PROBE_STEPS, ReconstructionRun, make_attack


DATA_INITS_NOTE = ("initialisation (experimenter's choice): loading {init} images through the model's data spec; "
                   "the attack itself never sees them")


def default_candidates(data: Mapping[str, Any], num_outputs: int, *, data_init: bool) -> int:
    """Default m: n for data-dependent inits and attacks of one candidate per image (``data_init``), else 2n
    (Haim et al.); n from the model's data spec."""
    n = train_count(data, num_classes=2 if num_outputs == 1 else num_outputs)
    if n <= 0:
        raise DataReconError("the model's data spec has no n_per_class; pass candidates (--candidates M)")
    return n if data_init else 2 * n


def init_sources(model_dir: str | Path, *, data_dir: str | Path | None = None) -> Any:
    """Training and partition images of the model's data spec in model input space (experimenter side)."""
    meta = read_model_meta(model_dir)
    where = f"data spec of {Path(model_dir) / 'model.json'}"
    task = load_task(build_record(DataSpec, meta["data"], where=where).checked(where), data_dir=data_dir)
    check_fingerprint(task, meta.get("data_fingerprint"), where=str(model_dir), splits=("train", "partition"))
    norm = Normalisation.from_mean(meta.get("normalisation", "unit"),
                                   load_tensors(Path(model_dir) / EXTRAS)["input_mean"])
    has_part = task.partition.x.shape[0] > 0
    return InitSources(ground_truth=norm.to_model(task.train.x).double(), ground_truth_labels=task.train.y,
                       partition=norm.to_model(task.partition.x).double() if has_part else None,
                       partition_labels=task.partition.y if has_part else None)


def _check_knowledge(knowledge: KnowledgeSettings, requires: tuple[str, ...], *, cli: bool = True) -> None:
    """Refuse an attack that needs knowledge (the recipe, θ_init) the run does not give; the fix names the flags
    (``cli``) or a file's fields."""
    if "recipe" in requires and knowledge.recipe is None:
        raise DataReconError("this attack replays the training: it needs the training recipe; " + (
            "pass --known-recipe model (knowledge.recipe in a run file)" if cli else
            "set knowledge: {recipe: {source: model}}"))
    if "known_init" in requires and knowledge.known_init is None:
        raise DataReconError("this attack needs the initialisation θ_init: " + (
            "pass --known-init seed:N (model directories) or --known-init FILE.safetensors (knowledge.known_init in "
            "a run file)" if cli else "set knowledge: {known_init: seed} (the seed the model records), seed:N or the "
            "path of a safetensors file"))


@dataclass(frozen=True)
class TargetRecord:
    """What a run can be checked against before its target exists (an experiment, before it trains): whether the
    target is fine-tuned, its training-set size and its input shape (None: not known)."""

    fine_tuned: bool
    n_train: int | None = None
    input_shape: tuple[int, ...] | None = None
    batch_norm: bool | None = None


def _check_step_controls(run: ReconstructionRun, *, cli: bool = True) -> None:
    """Refuse the step-size probe and the retry of a diverged run for an attack without step sizes to scale
    (dynamics matching: Adam bounds its step; bilevel: a line search): there they would do nothing (a retry would
    repeat the same run). The probe's default runs for every method and is a no-op there; only another length
    asked for is refused."""
    if ATTACKS.get(run.method).step_size_fields:
        return
    if run.retry_diverged:
        raise DataReconError(f"attack {run.method!r} has no step sizes a retry could lower, so a retry would diverge "
                             "the same way; " + ("drop --retry-diverged" if cli else "set retry_diverged to 0"))
    if run.step_probe not in (0, STEP_PROBE_STEPS):
        raise DataReconError(f"attack {run.method!r} has no step sizes to probe (it chooses or bounds its own step); "
                             + ("drop --step-probe" if cli else "leave step_probe out"))


def check_before_target(run: ReconstructionRun, target: TargetRecord, *, cli: bool = True) -> None:
    """The checks of :func:`prepare` that need no weights, for a caller that checks a single run before its target
    exists (an experiment, before it trains; a sweep, before its first run): the steps, the device, the attack built
    from its config (no prior coupling runs), the knowledge its method requires (θ_init for restored labels), a
    known n and pretrained start that fit the target, the feature-statistics prior only with batch norm, the
    candidates' memory. ``cli``: fixes name the flags, else the run's fields.

    Raises:
        DataReconError: one line naming the problem.
    """
    if run.steps < 1:
        raise DataReconError(f"steps must be at least 1, got {run.steps}; set attack.steps (--steps N) to N >= 1")
    parse_device(run.device)
    attack = make_attack(run.method, run.method_config())
    if attack.coupled():  # an experiment's run and a sweep's runs are stepped alone
        raise DataReconError("group consistency pulls restarts stepped together toward their consensus (datarecon "
                             "reconstruct --runs K) and this run is stepped alone; set group_weight to 0")
    _check_knowledge(run.knowledge, ATTACKS.get(run.method).requires, cli=cli)
    _check_step_controls(run, cli=cli)
    if run.knowledge.labels == "restored" and run.knowledge.known_init is None:
        raise DataReconError(_RESTORED_NEEDS_INIT)
    if target.batch_norm is False and "feature_stats" in weighted_priors(attack.config):
        raise DataReconError(priors.NO_BATCH_NORM)
    known = run.knowledge.known_init
    if known is not None and (known == PRETRAINED or known.startswith(f"{PRETRAINED}:")) and not target.fine_tuned:
        raise DataReconError(f"known_init {known}: this model was not fine-tuned from a pretrained model; pass seed, "
                             "seed:N or a safetensors file of θ_init")
    check_known_n(run.knowledge.n, {"metrics": {"n_train": target.n_train}})
    if run.candidates is not None and target.input_shape is not None:
        refuse_candidates_beyond_memory(int(run.candidates), target.input_shape, run.dtype,
                                         option="--candidates" if cli else "candidates:")


@dataclass(frozen=True)
class _InputSpace:
    """The attacked model on the run's device and dtype, and its input space.

    Attributes:
        target: the attacker's view of the model.
        mean: (C, H, W) float64 mean that maps display space [0, 1] to model input space.
        lower, upper: the pixel box of model input space (tensors of the input shape, or floats).
        m: the candidate count.
        meta: the model directory's metadata (None for a user's own model).
        sources: the data-dependent initialisations' images (None when the init needs none).
    """

    target: Target
    mean: torch.Tensor
    lower: Any
    upper: Any
    m: int
    meta: dict[str, Any] | None
    sources: Any


def _input_space(model: str | Path | Target, run: ReconstructionRun, *, data_dir: str | Path | None,
                 sources: Any) -> _InputSpace:
    """The target, pixel box, m and init images of ``run`` against ``model`` (a model directory or a Target)."""
    device, dtype, init, candidates = parse_device(run.device), run.dtype, run.init.name, run.candidates  # type: ignore[attr-defined]
    data_init = INITS.get(init).data
    if isinstance(model, Target):
        target, mean, lower, upper = _own_model(model, candidates=candidates, init=init, data_init=data_init,
                                                sources=sources, device=device, dtype=dtype)
        check_weight_scale(target)
        return _InputSpace(target, mean, lower, upper, int(candidates), None, sources)  # type: ignore[arg-type]
    meta = read_model_meta(model)
    if meta.get("data"):  # the record's data spec, checked before it sizes the candidates or loads data
        where = f"data spec of {Path(model) / 'model.json'}"
        build_record(DataSpec, meta["data"], where=where).checked(where)
    target = Target.from_model_dir(model, device=device, dtype=dtype)
    check_weight_scale(target)
    mean = load_tensors(Path(model) / EXTRAS)["input_mean"].to(torch.float64)
    lower, upper = (-mean).to(device=device, dtype=dtype), (1.0 - mean).to(device=device, dtype=dtype)
    per_image = data_init or ATTACKS.get(run.method).one_candidate_per_image
    m = candidates if candidates is not None else default_candidates(meta.get("data", {}), target.num_outputs,
                                                                     data_init=per_image)
    if data_init and sources is None:
        sources = init_sources(model, data_dir=data_dir)
    return _InputSpace(target, mean, lower, upper, m, meta, sources)


def _prior(space: _InputSpace, run: ReconstructionRun) -> AttackerPrior:
    """The prior of ``run``: m labels (from the init when it brings them, else in the model's class
    proportions) and the pixel box."""
    target, m, sources, params = space.target, space.m, space.sources, run.init_params()
    labels = init_labels(run.init.name, m=m, sources=sources, **params)  # type: ignore[attr-defined]
    if labels is None:
        prior = AttackerPrior.balanced(m=m, num_outputs=target.num_outputs, input_shape=target.input_shape,
                                       lower=space.lower, upper=space.upper)
    else:
        labels = labels.to(torch.float64) if target.num_outputs == 1 else labels.long()
        prior = AttackerPrior(labels=labels.to(parse_device(run.device)), input_shape=target.input_shape,
                              lower=space.lower, upper=space.upper)
    prior.check(target)
    return prior


def _x0(space: _InputSpace, run: ReconstructionRun, prior: AttackerPrior, generator: torch.Generator) -> torch.Tensor:
    """x₀ (m, C, H, W) of ``run``'s initialisation (an init computed from the attacker's view gets that view)."""
    target, lower, upper, m, mean, sources = space.target, space.lower, space.upper, space.m, space.mean, space.sources
    init, params, dtype, device = run.init.name, run.init_params(), run.dtype, parse_device(run.device)  # type: ignore[attr-defined]
    attacker = None
    if "weights" in INITS.get(init).needs:  # an init computed from the attacker's view (never from images)
        attacker = types.SimpleNamespace(model=target.model, params=target.params, subspace=prior.subspace,
                                         known_init=None if prior.known_init is None else prior.known_init.params,
                                         lower=lower, upper=upper)
    x0 = make_init(init, CandidateSpec(m=m, input_shape=target.input_shape, mean=mean, dtype=dtype, device=device),
                   generator=generator, sources=sources, attacker=attacker, **params)
    return x0


#: copies of the candidates an attack holds at once: x, its gradient and two optimiser moments (Adam)
CANDIDATE_COPIES = 4


#: the most runs ``reconstruct --runs K`` takes: every run is a folder with its checkpoint, all K are
#: stepped together (their states in memory at once); more runs of one target are a sweep with a budget
MAX_BATCH_RUNS = 10_000


def refuse_candidates_beyond_memory(m: int, input_shape: tuple[int, ...], dtype: torch.dtype, *,
                                     runs: int = 1, option: str = "--candidates") -> None:
    """One line, before anything is allocated, when m candidates (in each of ``runs`` runs stepped
    together) cannot fit in this machine's memory: :data:`CANDIDATE_COPIES` copies of the candidates,
    plus the m × m cosine matrix of the candidates' selection scores
    (``attacks.selection.candidate_scores``, computed at the end of every run; 3·10⁶ candidates
    passed the first term and failed there after the whole run). ``option``: how messages name the count."""
    need = runs * (CANDIDATE_COPIES * float(m) * float(torch.Size(input_shape).numel()) + float(m) * float(m))
    what = f"{option} {m} of {tuple(input_shape)} inputs" + (f" in each of --runs {runs}" if runs > 1 else "")
    refuse_if_too_large(need * dtype.itemsize, what=what,
                        fix=f"reduce {option} (its default is 2n)" + (" or --runs" if runs > 1 else ""))


def _own_model(target: Target, *, candidates: int | None, init: str, data_init: bool, sources: Any,
               device: str | torch.device, dtype: torch.dtype) -> tuple[Target, torch.Tensor, float, float]:
    """(target on device/dtype, the mean that maps display to model space, lower, upper) of a user's model."""
    if target.value_range is None:
        raise DataReconError("the target has no value_range; build it with Target.from_module(..., value_range=(lo, hi))")
    if candidates is None:
        raise DataReconError("a model without a data spec has no default candidate count; pass candidates "
                             "(--candidates M, e.g. twice the training-set size)")
    if data_init and sources is None:
        raise DataReconError(f"init {init!r} needs training images, which a model without a model directory does not "
                             "name; use gaussian or uniform (or pass sources in Python)")
    lo, hi = target.value_range
    # display space [0, 1] starts at lo: the uniform init draws U(0, 1) − mean = U(lo, lo + 1)
    mean = torch.full(tuple(target.input_shape), -lo, dtype=torch.float64)
    return target.to(device=device, dtype=dtype), mean, lo, hi


def _with_public(space: _InputSpace, run: ReconstructionRun, prior: AttackerPrior, *,
                 data_dir: str | Path | None) -> AttackerPrior:
    """The prior with the public images' principal subspace (:func:`~datarecon.attacks.public.public_subspace`,
    attacker-side: the pretraining data the model records) where the run weighs the public-data prior."""
    if not getattr(run.attack, "pca_weight", 0):
        return prior
    public = public_subspace(space.meta, input_mean=space.mean, components=run.attack.pca_components,
                             data_dir=data_dir)
    return dataclasses.replace(prior, public=public.to(dtype=run.dtype, device=parse_device(run.device)))


def prepare(run: ReconstructionRun, *, data_dir: str | Path | None = None, sources: Any = None,
            target: Target | None = None) -> AttackSetup:
    """Target, prior, x₀ and generator of ``run``: what its attack receives.

    The target is ``run.model`` read from its model directory, or ``target``: a user's own model
    (:meth:`Target.from_module`; ``run.model`` then only labels the run, ``run.candidates`` is
    required, the pixel box is its ``value_range`` and data-dependent inits need ``sources``).
    m defaults to 2n (n for data-dependent inits); the seed seeds x₀ and the attack's generator;
    the attacker's knowledge beyond θ* (known θ_init, n, recipe) is resolved and checked here and
    recorded (the threat model) in ``record["knowledge"]``.

    Args:
        run: the typed run.
        data_dir: data folder (only data-dependent inits read it).
        sources: ready :class:`~datarecon.attacks.init.InitSources` (skips loading the data).
        target: a user's own model attacked instead of ``run.model``.

    Raises:
        DataReconError: unknown init (lists valid names), m < 1, labels inconsistent with the model,
            a known initialisation that does not fit the model or is not the one it was trained from,
            an attack that needs knowledge the run does not give.
    """
    entry = ATTACKS.get(run.method)
    uses, requires = entry.uses, entry.requires
    init, params = run.init.name, run.init_params()  # type: ignore[attr-defined]
    INITS.get(init)
    if run.candidates is not None and run.candidates < 1:
        raise DataReconError(f"candidate count must be at least 1, got {run.candidates}; "
                             "pass --candidates M with M >= 1")
    if target is not None and "recipe" in requires:  # named first: the knowledge it would ask for next cannot exist
        raise DataReconError(f"{run.method} replays the training a model directory records (its recipe), and a "
                             "model of your own records none; attack a model directory from `datarecon train`, or "
                             "choose another --method")
    _check_knowledge(run.knowledge, requires)
    _check_step_controls(run)
    space = _input_space(run.model if target is None else target, run, data_dir=data_dir, sources=sources)
    refuse_candidates_beyond_memory(space.m, space.target.input_shape, run.dtype)
    generator = torch.Generator().manual_seed(int(run.seed))
    prior = _prior(space, run)
    prior, threat = attacker_knowledge(space.target, prior, run.knowledge, model_meta=space.meta, uses=uses,
                                       requires=requires)
    prior = _with_public(space, run, prior, data_dir=data_dir)
    x0 = _x0(space, run, prior, generator)
    record = {"init": {"name": init, "params": params, "experimenter_choice": INITS.get(init).data},
              "candidates": space.m, "device": str(parse_device(run.device)), "knowledge": threat}
    if prior.public is not None:
        record["public_prior"] = prior.public.summary()
    if prior.subspace is not None:
        record["subspace"] = prior.subspace.summary()
    return AttackSetup(target=space.target, prior=prior, x0=x0, generator=generator, record=record)


