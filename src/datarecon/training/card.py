"""The model card: a model directory rendered for humans (``datarecon info``, ``datarecon train``, the demo)."""

from __future__ import annotations

from typing import Any

from datarecon.models.checkpoint import ModelBundle
from datarecon.models.records import AscentPoint
from datarecon.models.spec import ARCHITECTURES, count_parameters, is_homogeneous

__all__ = ["ascent_curve_lines", "model_card"]

def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def ascent_curve_lines(metrics: dict[str, Any]) -> list[str]:
    """The margin-ascent curve a model directory records (``margin_ascent_curve`` of its metrics, checked when the
    model directory was read: :class:`~datarecon.models.records.AscentPoint`), one line per point where the
    identifiability gap was measured (the start, 1, 2, 4, ... windows, the end); without gaps, the margin at the
    start, the middle and the end. A value the probe could not define is shown as such. Empty for a model without
    the curve."""
    points = [AscentPoint.model_validate(p) for p in metrics.get("margin_ascent_curve") or []]
    if not points:
        return []
    probed = [p for p in points if "kkt_gap" in p.model_fields_set]
    shown = probed or [points[i] for i in sorted({0, len(points) // 2, len(points) - 1})]
    head = "ascent curve (step: normalised margin" + (", KKT weights-only residual truth / best fake, gap" if probed
                                                       else "")
    lines = [f"{head}; {len(points)} points)"]
    for p in shown:
        text = f"  {p.step:>7}: {_format_value(p.normalised_margin)}"
        if "kkt_gap" in p.model_fields_set:
            gap = "undefined" if p.kkt_gap is None else f"{p.kkt_gap:+.3f}"
            text += f", {_defined(p.kkt_truth)} / {_defined(p.kkt_best_fake)}, gap {gap}"
        lines.append(text)
    return lines


def _defined(value: float | None) -> str:
    """A probe's value as the card shows it (None: undefined, recorded as text)."""
    return "undefined" if value is None else _format_value(value)


def _subset_lines(data: dict[str, Any]) -> list[str]:
    """The card's line for a model trained on part of its pool (``n_train`` / ``train_indices``); none otherwise."""
    named = data.get("train_indices")
    if not named:
        return []
    how = (f", drawn across the classes (n_train {data['n_train']}, seed {data.get('seed')})" if data.get("n_train")
           else ", named (train_indices)")
    shown = ", ".join(str(i) for i in named[:12]) + (", ..." if len(named) > 12 else "")
    return [f"            trains on {len(named)} of them{how}: train indices {shown}"]


def model_card(bundle: ModelBundle) -> str:
    """A human-readable summary of a model directory (used by ``datarecon info`` and the demo).

    Shows the architecture and parameter count, the data spec, loss and weight decay, the training
    settings and metrics, the versions and the config hash.
    """
    meta, arch = bundle.meta, bundle.arch
    if ARCHITECTURES.get(arch.name).convolutional:
        shape = f"channels {'-'.join(map(str, arch.resolved_hidden()))}, kernel {arch.resolved_kernel()}, outputs {arch.num_outputs}"
    else:
        shape = "-".join(map(str, [arch.input_dim, *arch.resolved_hidden(), arch.num_outputs]))
    data, tr, m = bundle.data, meta.get("training", {}) or {}, meta.get("metrics", {}) or {}
    dtype = str(next(iter(bundle.params.values())).dtype).replace("torch.", "") if bundle.params else "?"
    lines = [
        f"model       {bundle.path if bundle.path is not None else '(in memory)'}",
        f"arch        {arch.name} {shape}, bias {_format_value(arch.bias)}, " + ("batch norm, " if arch.batch_norm else "") +
        f"init_scale {arch.init_scale if arch.init_scale is not None else 'default'}, "
        f"input {'x'.join(map(str, arch.input_shape))}",
        f"parameters  {count_parameters(arch):,} ({dtype}); homogeneous {_format_value(is_homogeneous(arch))}",
        f"data        {data.get('dataset')} / {data.get('task')}, {data.get('n_per_class')} per class "
        f"({data.get('selection')}, seed {data.get('seed')}), normalisation {bundle.normalisation}",
        *_subset_lines(data),
        f"loss        {bundle.loss}, weight decay {bundle.weight_decay:g}",
    ]
    if tr:
        lines.append(
            f"training    {tr.get('optimizer')} lr {tr.get('lr')} momentum {tr.get('momentum')} "
            f"schedule {tr.get('schedule')}, epochs {m.get('epochs_done', '?')}/{tr.get('epochs')}, "
            f"seed {meta.get('seed')}"
            + (f", mini-batches of {tr['batch_size']} (order drawn from the seed)" if tr.get("batch_size") else "")
        )
        if m.get("margin_ascent_status") == "skipped":
            lines.append(f"            margin ascent skipped ({m.get('margin_ascent_stop_reason')})")
        elif "margin_ascent_steps" in m:
            lines.append(f"            then margin ascent: {m['margin_ascent_steps']} steps "
                         f"({m.get('margin_ascent_stop_reason') or m.get('margin_ascent_status')}), normalised margin "
                         f"{m.get('normalised_margin_before_ascent', float('nan')):.4g} -> "
                         f"{m.get('normalised_margin', float('nan')):.4g}")
            lines += [f"            {line}" for line in ascent_curve_lines(m)]
    pre = meta.get("pretrained")
    if isinstance(pre, dict):
        lines.append(f"pretrained  {pre.get('path')} (weights sha256 {str(pre.get('weights_sha256'))[:12]}), head "
                     f"{'drawn anew from the seed' if pre.get('head') == 'new' else 'kept'}"
                     + (", batch norm in eval mode (statistics frozen)" if arch.batch_norm else ""))
    if "dp_epsilon" in m:
        eps = m["dp_epsilon"]
        lines.append(f"privacy     DP-SGD (opacus {m.get('dp_opacus')}, {m.get('dp_accountant')} accountant): "
                     f"epsilon {_format_value(float(eps)) if eps is not None else 'inf'} at delta {m.get('dp_delta'):.3g}; "
                     f"noise {m.get('dp_noise_multiplier'):.4g}, clip {m.get('dp_max_grad_norm'):g}, "
                     f"sample rate {m.get('dp_sample_rate'):.3g}, {m.get('dp_steps')} steps")
    if m:
        lines.append(f"status      {m.get('status', '?')}" + (f" ({m['stop_reason']})" if m.get("stop_reason") not in (None, "", m.get("status")) else "")
                     + (f", {m['wall_time_s']:.1f} s" if isinstance(m.get("wall_time_s"), (int, float)) else ""))
        keys = [("train_loss", "train loss"), ("train_accuracy", "train acc"), ("heldout_accuracy", "held-out acc"),
                ("min_margin", "min margin"), ("normalised_margin", "normalised margin"),
                ("weight_norm", "‖θ‖"), ("kkt_regime_score", "KKT-regime score")]
        shown = [f"{label} {_format_value(m[k])}" for k, label in keys if k in m]
        for i in range(0, len(shown), 4):
            lines.append(("metrics     " if i == 0 else "            ") + ", ".join(shown[i:i + 4]))
    vers = meta.get("versions", {})
    if vers:
        lines.append("versions    " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    if meta.get("config_hash"):
        lines.append(f"config hash {meta['config_hash']}")
    return "\n".join(lines)
