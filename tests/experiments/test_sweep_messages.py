"""Issue 25 item 20: errors of a sweep run name sweep-file fields for run options only; options that
are no run field (--resume, --out, --overwrite) are not turned into fields that do not exist
('attack.resume')."""

from __future__ import annotations

from datarecon.experiments.sweep.runs import sweep_message


def test_only_run_options_become_sweep_fields() -> None:
    text = sweep_message("pass --lr-x 0.1 or --steps 10; pass --resume to continue, or a new --out (--overwrite)")
    assert text == "set attack.lr_x 0.1 or steps 10; pass --resume to continue, or a new --out (--overwrite)"
    assert "attack.resume" not in text and "attack.out" not in text and "attack.overwrite" not in text
