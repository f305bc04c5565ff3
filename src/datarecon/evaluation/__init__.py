"""Evaluation: where ground truth enters, and only here.

Pure functions on display-space image tensors ``(N, C, H, W)`` in ``[0, 1]``;
nothing here mutates or reorders its inputs.

* :mod:`~datarecon.evaluation.similarity`: SSIM (scikit-image conventions),
  L2 and NCC matrices, downsampling, min-max rescale.
* :mod:`~datarecon.evaluation.neighbours`: nearest neighbours with a cheap
  prefilter and exact SSIM on the shortlist; ranks.
* :mod:`~datarecon.evaluation.protocol`: the Haim et al. (2022) protocol,
  collapse detection, parameter distance (Runkel et al. 2024, eq. 2).
* :mod:`~datarecon.evaluation.baselines`: held-out and noise null baselines.
* :mod:`~datarecon.evaluation.privacy`: real/fake rule, ROC AUC, TPR at low FPR.
* :mod:`~datarecon.evaluation.reports`: the pure reports an evaluation assembles (neighbours,
  protocol, baselines, privacy, collapse) and their :class:`EvaluationConfig`.
* :mod:`~datarecon.evaluation.images`: :func:`evaluation_of` and :func:`evaluation_against` (tensors in,
  an :class:`Evaluation` out, no model directory).
* :mod:`~datarecon.evaluation.run_eval`: :func:`run_metrics` (a run directory in, the content of its
  ``metrics.json`` out, written beside its candidates).
"""

from datarecon.evaluation.baselines import (
    NULL_RATE,
    Baselines,
    NullCalibrated,
    best_similarity_to,
    haim_ssim_against,
    noise_images,
    null_baselines,
    null_calibrated,
    summarise,
)
from datarecon.evaluation.neighbours import (
    METRICS,
    Metric,
    NeighbourSearch,
    Neighbours,
    match_rank,
    nearest_neighbours,
    reference_rank,
    similarity_matrix,
)
from datarecon.evaluation.privacy import (
    LOW_FPRS,
    PrivacyScore,
    RealLabels,
    label_candidates,
    privacy_report,
    real_labels,
    roc_auc,
    roc_curve,
    score_privacy,
    tpr_at_fpr,
)
from datarecon.evaluation.protocol import (
    ASSIGNMENTS,
    DEFAULT_THRESHOLDS,
    Collapse,
    HaimResult,
    HaimSettings,
    assign,
    collapse,
    counts_at,
    haim_protocol,
    param_distance,
)
from datarecon.evaluation.images import Evaluation, RunRecord, evaluation_against, evaluation_of
from datarecon.evaluation.run_eval import (
    CANDIDATES_CSV,
    METRICS_FILE,
    NEIGHBOURS_FILE,
    RunEvaluationSettings,
    run_metrics,
    write_evaluation,
)
from datarecon.evaluation.reports import (
    REAL_RULE,
    EvaluationConfig,
    baseline_report,
    collapse_report,
    neighbour_report,
    privacy_section,
    protocol_report,
)
from datarecon.evaluation.similarity import (
    WINDOWS,
    Window,
    downsample2x,
    effective_window_size,
    l2_matrix,
    local_ncc_matrix,
    local_standardise,
    minmax_rescale,
    ncc_matrix,
    ssim_matrix,
    ssim_pairs,
    standardise,
    window_kernel,
)

__all__ = [
    "ASSIGNMENTS", "Baselines", "CANDIDATES_CSV", "Collapse", "DEFAULT_THRESHOLDS", "Evaluation",
    "HaimResult", "HaimSettings", "LOW_FPRS", "METRICS", "METRICS_FILE", "Metric", "NEIGHBOURS_FILE", "NeighbourSearch", "Neighbours",
    "PrivacyScore", "REAL_RULE", "RealLabels", "RunEvaluationSettings", "RunRecord", "WINDOWS", "Window", "assign", "best_similarity_to",
    "collapse", "counts_at", "downsample2x", "effective_window_size", "evaluation_against", "evaluation_of",
    "EvaluationConfig", "baseline_report", "collapse_report", "neighbour_report", "privacy_section", "protocol_report",
    "run_metrics", "write_evaluation", "haim_protocol", "haim_ssim_against", "l2_matrix", "label_candidates", "local_ncc_matrix", "local_standardise",
    "match_rank", "minmax_rescale", "ncc_matrix", "nearest_neighbours", "noise_images",
    "NULL_RATE", "NullCalibrated", "null_baselines", "null_calibrated", "param_distance", "privacy_report",
    "real_labels", "reference_rank",
    "roc_auc", "roc_curve", "score_privacy", "similarity_matrix", "ssim_matrix", "ssim_pairs",
    "standardise", "summarise", "tpr_at_fpr", "window_kernel",
]
