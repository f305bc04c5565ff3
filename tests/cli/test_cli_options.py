"""Every command's options read the same way: help on each, flags shown as flags, one progress flag."""

from __future__ import annotations

import pytest

from datarecon.cli.main import build_command, main


def _commands():
    def walk(cmd, path):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return [(" ".join(p), c) for p, c in walk(build_command(), ()) if not getattr(c, "commands", None)]


COMMANDS = _commands()


@pytest.mark.parametrize("name, cmd", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_visible_option_has_help_and_flags_take_no_value(name, cmd) -> None:
    assert cmd.help, f"datarecon {name} has no help text"
    for p in cmd.params:
        if getattr(p, "hidden", False) or p.param_type_name != "option":
            continue
        assert (p.help or "").strip(), f"datarecon {name} {p.opts[0]} has no help text"
        if p.is_flag:
            assert p.metavar == "", f"datarecon {name} {p.opts[0]} is a flag but shows a value type"


@pytest.mark.parametrize("name, cmd", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_progress_is_one_convention(name, cmd) -> None:
    opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if not getattr(p, "hidden", False)}
    assert "--quiet" not in opts, f"datarecon {name}: use --progress/--no-progress (--quiet is a hidden alias)"
    if "--progress" in opts:
        assert "--no-progress" in opts


def test_flags_are_refused_with_a_value_and_the_quiet_alias_still_works(tmp_path, capsys) -> None:
    assert main(["reconstruct", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--resume", "true"]) == 2
    assert "unexpected extra argument" in capsys.readouterr().err
    cmd = dict(COMMANDS)["evaluate"]
    quiet = [p for p in cmd.params if "--quiet" in p.opts]
    assert quiet and quiet[0].hidden
