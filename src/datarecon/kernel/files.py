"""The names of the files datarecon writes, defined once.

Every module that writes or reads one of these files imports its name from here, so a folder's
layout (docs/dev/CONTRACTS.md) and the output-folder bookkeeping (:mod:`datarecon.kernel.outdir`)
cannot drift apart from the writers.
"""

from __future__ import annotations

# run directories (attacks)
RUN_JSON = "run.json"
CANDIDATES = "candidates.safetensors"
HISTORY = "history.jsonl"
INIT_FILE = "init.safetensors"
SUBSPACE_FILE = "subspace.safetensors"

# model directories (training)
WEIGHTS = "weights.safetensors"
EXTRAS = "extras.safetensors"
MODEL_JSON = "model.json"

# checkpoints (every resumable loop): the folder in a model or run directory, the margin ascent's folder
# in a model directory, the state file, its readable copy, and the state before it that the runs of a
# coupled group keep (they roll back to a step every run of the group has)
STATE_FILE = "state.safetensors"
PROGRESS_FILE = "progress.json"
PREVIOUS_STATE_FILE = "previous.safetensors"
CHECKPOINT_DIR = "checkpoint"
ASCENT_CHECKPOINT_DIR = "checkpoint-margin-ascent"

# evaluations
METRICS_FILE = "metrics.json"
CANDIDATES_CSV = "candidates.csv"
NEIGHBOURS_FILE = "neighbours.safetensors"
PRIVACY_CSV = "privacy.csv"
REPORT_HTML = "report.html"
RECONSTRUCTIONS_PNG = "reconstructions.png"

# experiments, reproductions, stores, audits
EXPERIMENT_JSON = "experiment.json"
DONE_MARKER = "DONE.json"
REPRODUCTION_JSON = "reproduction.json"
TIMINGS_JSON = "timings.json"
TASK_FILE = "task.json"
AUDIT_JSON = "audit.json"

# membership folders: the model the folder measures (written first), the result, the per-candidate scores, the most
# exposed members (ranked table; images of the first ones)
MEMBERSHIP_TARGET = "target.json"
MEMBERSHIP_RESULT = "membership.json"
MEMBERSHIP_SCORES = "scores.safetensors"
MEMBERSHIP_EXPOSED = "exposed.safetensors"
MEMBERSHIP_EXPOSED_CSV = "exposed.csv"
MEMBERSHIP_SIGNALS_CSV = "signals.csv"
MEMBERSHIP_ROC = "roc.png"
#: the result of ``membership --images`` (the images' scores and calls)
MEMBERSHIP_IMAGES = "images.json"
# a membership folder's reference models: the pool they train on and are queried on, their folder, one folder per
# model (``ref-00007``: ``REFERENCE_PREFIX`` and the index in 5 digits, its completion marker ``DONE_MARKER``), its
# statistics and its weights
MEMBERSHIP_POOL = "pool.safetensors"
MEMBERSHIP_REFERENCES = "references"
REFERENCE_PREFIX = "ref-"
REFERENCE_STATS = "stats.safetensors"
REFERENCE_WEIGHTS = WEIGHTS
