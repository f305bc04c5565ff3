"""A file or folder option given twice is refused with one line (issue 25, item 10: ``evaluate --train``
repeated 255 times was accepted, and the last file silently won). Numbers keep last-one-wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from datarecon.cli.main import build_command, main


def test_evaluate_train_repeated_255_times_is_refused(tmp_path: Path, capsys) -> None:
    argv = ["evaluate", str(tmp_path / "run"), "--no-progress"]
    for i in range(255):
        argv += ["--train", str(tmp_path / f"train{i}.safetensors")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --train given 255 times; give it once. See 'datarecon evaluate --help'."]


def _leaves(cmd, path=()):
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from _leaves(sub, (*path, name))


def _value_options(cmd):
    from datarecon.cli._repeats import is_path_option

    return [p for p in cmd.params if getattr(p, "param_type_name", "") == "option" and not p.multiple
            and not p.is_flag and not p.count and is_path_option(p)]


LEAVES = [(path, cmd) for path, cmd in _leaves(build_command()) if _value_options(cmd)]


@pytest.mark.parametrize("path, cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_refuses_a_repeated_file_or_folder_option(path, cmd, capsys, tmp_path, monkeypatch) -> None:
    """Before anything runs: the refusal comes from parsing, so no folder is read or written (the
    command runs in an empty folder, with paths inside it, and that folder stays empty)."""
    monkeypatch.chdir(tmp_path)
    opt = _value_options(cmd)[0]
    name = max(opt.opts, key=len)
    assert main([*path, name, str(tmp_path / "a"), f"{name}={tmp_path / 'b'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {name} given 2 times; give it once."), err
    assert list(tmp_path.iterdir()) == []


def test_flags_and_separated_values_are_not_repeats() -> None:
    from datarecon.cli._repeats import repeated_options

    params = {c.name: c for c in build_command().commands["evaluate"].params}
    ps = list(params.values())
    assert repeated_options(ps, ["--no-progress", "--no-progress"]) == []  # a flag: idempotent
    assert repeated_options(ps, ["--train", "a", "--", "--train", "b"]) == []  # after --: arguments
    assert repeated_options(ps, ["--train", "a", "--train=b"]) == [("--train", 2)]
    assert repeated_options(ps, ["--seed", "1", "--seed", "2"]) == []  # a number: the last one wins, as usual
