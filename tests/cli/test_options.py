"""The CLI generated from typed configs (datarecon.cli.options): one flag per field, help from its docs."""

from __future__ import annotations

from typing import Literal

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from datarecon.cli.options import (Common, Output, backend_options, comma_ints, common_options, config_options,
                                   field_docs, flags, leaf_fields, output_options, overrides_from)
from datarecon.config import merge
from datarecon.experiments.execution import Execution
from datarecon.errors import DataReconError


class _Inner(BaseModel):
    """An inner model.

    Attributes:
        width: a width,
            over two lines.
        kind: ``a`` or ``b``; see :class:`datarecon.Thing`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    width: int = Field(default=1, ge=1)
    kind: Literal["a", "b"] = "a"


class _Outer(BaseModel):
    """An outer model.

    Attributes:
        inner: the inner part.
        rate: a rate > 0.
        on: a switch.
        sizes: sizes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    inner: _Inner = _Inner()
    rate: float = Field(default=0.5, gt=0)
    on: bool = False
    sizes: tuple[int, ...] | None = None


def test_field_docs_joins_continuation_lines_and_drops_markup():
    assert field_docs(_Inner) == {"width": "a width, over two lines.", "kind": "a or b; see Thing."}


def test_flags_cover_every_leaf_field_and_follow_the_path():
    table = flags(_Outer, parse={"sizes": comma_ints("--sizes")})
    assert [f.path for f in table] == ["inner.width", "inner.kind", "rate", "on", "sizes"]
    by = {f.path: f for f in table}
    assert by["inner.width"].decls == ("--inner-width",)
    assert by["on"].decls == ("--on/--no-on",)
    # every choice named: nothing appended but the default (the flag itself defaults to "not given", so
    # typer cannot show the field's default)
    assert by["inner.kind"].help == "a or b; see Thing.  [default: a]"
    assert by["rate"].help.endswith("[default: 0.5]") and by["on"].help.endswith("[default: --no-on]")
    assert "[default" not in by["sizes"].help  # None: nothing to show
    assert by["rate"].kind is float and by["sizes"].kind is str and by["sizes"].metavar == "<int,...>"


def test_flags_refuse_what_would_leave_a_field_off_or_unparsed():
    with pytest.raises(TypeError, match="needs a parse"):
        flags(_Outer)  # sizes is a tuple: no scalar option without a parse
    with pytest.raises(TypeError, match="no such field"):
        flags(_Outer, parse={"sizes": comma_ints("--sizes")}, rename={"nope": "--nope"})

    class Undocumented(BaseModel):
        """No attributes section."""

        x: int = 0

    with pytest.raises(TypeError, match="no description"):
        flags(Undocumented)


def _app():
    table = flags(_Outer, prefix={"inner": ""}, rename={"rate": "--lr"}, parse={"sizes": comma_ints("--sizes")})
    seen = {}

    @config_options(table)
    @common_options()
    def cmd(name: str = typer.Option("x", "--name"), *, common: Common, overrides: dict) -> None:
        seen.update(name=name, common=common, overrides=overrides, config=_Outer.model_validate(overrides))

    app = typer.Typer()
    app.command()(cmd)
    app.command("other")(lambda: None)
    return app, seen


def test_the_generated_command_parses_into_the_nested_config_and_passes_only_given_fields():
    app, seen = _app()
    r = CliRunner().invoke(app, ["cmd", "--width", "3", "--kind", "b", "--lr", "2", "--on", "--sizes", "4,5",
                                 "--name", "y", "--no-progress", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert seen["overrides"] == {"inner": {"width": 3, "kind": "b"}, "rate": 2.0, "on": True, "sizes": [4, 5]}
    assert seen["config"] == _Outer(inner=_Inner(width=3, kind="b"), rate=2.0, on=True, sizes=(4, 5))
    assert seen["name"] == "y" and seen["common"] == Common(progress=False, quiet=False, threads=1)
    r = CliRunner().invoke(app, ["cmd", "--quiet"])
    assert r.exit_code == 0 and seen["overrides"] == {} and seen["common"].progress is False


def test_help_comes_from_the_field_docs():
    app, _ = _app()
    out = CliRunner().invoke(app, ["cmd", "--help"], env={"COLUMNS": "200"}).output
    assert "a width, over two lines." in out and "a rate > 0." in out and "--quiet" not in out


def test_every_train_config_field_has_its_flag_and_reaches_the_config():
    """A value on every generated flag of `train` lands in its own field of TrainConfig (and nowhere else)."""
    from datarecon.cli.train import _flags
    from datarecon.training.target import TrainConfig, build_train_config

    table = _flags()
    assert sorted(f.path for f in table) == sorted(p for p, _, _ in leaf_fields(TrainConfig))
    decls = [d for f in table for d in f.decls]
    assert len(decls) == len(set(decls))
    base = {"data": {"dataset": "mnist", "task": "odd-even", "n_per_class": 2}}
    samples = {int: "3", float: "0.05", bool: True}
    texts = {"arch.name": "cnn", "arch.hidden": "4,5", "max_lr_factor": "2", "data.selection": "random",
             "data.normalisation": "unit", "loss": "mse", "optimizer": "gd", "schedule": "increasing",
             "dtype": "float64", "device": "cpu", "data.dataset": "mnist", "data.task": "odd-even",
             "dp.accountant": "prv", "momentum": "0.5", "margin_ascent.growth": "1.5",
             "pretrained.path": "runs/pre", "pretrained.sha256": "ab" * 32, "norm_mode": "train",
             "margin_ascent.min_step": "1e-7",  # below the step size: a larger one could never step
             "data.train_indices": "4,5"}
    for flag in table:
        value = texts.get(flag.path, samples.get(flag.kind))
        merged = merge(base, overrides_from(table, {flag.param: value}))
        if flag.path.startswith("dp."):
            merged.setdefault("dp", {}).setdefault("noise_multiplier" if flag.path != "dp.noise_multiplier"
                                                    else "max_grad_norm", 1.0)
            if flag.path == "dp.target_epsilon":
                del merged["dp"]["noise_multiplier"]
        if flag.path == "arch.batch_norm":  # the ResNets' only
            merged.setdefault("arch", {})["name"] = "resnet8"
        if flag.path == "norm_mode":  # networks with batch norm only
            merged.setdefault("arch", {}).update(name="resnet8", batch_norm=True)
        if flag.path == "pretrained.sha256":
            merged["pretrained"]["path"] = "runs/pre"
        if flag.path.startswith("margin_ascent.") and flag.path != "margin_ascent.steps":
            merged["margin_ascent"]["steps"] = 1000  # the ascent's settings need steps (a stop rule: a window's budget)
        cfg = build_train_config(merged)
        got = cfg
        for part in flag.path.split("."):
            got = getattr(got, part)
        parsed = flag.parse(value) if flag.parse else flag.kind(value)
        assert got == (tuple(parsed) if isinstance(parsed, list) else parsed), flag.path


def test_bad_list_text_is_a_one_line_error():
    with pytest.raises(DataReconError, match="--hidden must be a comma-separated list of widths"):
        comma_ints("--hidden", "widths")("a,b")


#: what a flag needs beside it to act (alone it would change nothing, and is refused): the other settings
NEEDS = {"attack.adam_beta1": {"optimizer": "adam"}, "attack.adam_beta2": {"optimizer": "adam"},
         "attack.adam_eps": {"optimizer": "adam"}, "early_stop.rel_tol": {"early_stop": {"patience": 1}},
         "attack.pca_components": {"pca_weight": 1.0}, "attack.cosine_t_max": {"lr_schedule": "cosine"},
         **{f"attack.split_{f}": {"split_every": 1} for f in ("fraction", "scale", "iters")}}


def _another(flag, model, name):
    """A valid value of ``name`` other than its default (as the command line would give it)."""
    from datarecon.cli.options import _choices, _unwrap

    info = model.model_fields[name]
    default = info.get_default(call_default_factory=True)
    inner, meta = _unwrap(info.rebuild_annotation())
    choices = [c for c in _choices(inner, meta) if c != default]
    if choices:
        return choices[0]
    if flag.kind is bool:
        return not default
    if flag.kind is int:
        return (default or 0) + 1
    if flag.kind is float:
        return default * 0.5 if isinstance(default, float) and default > 0 else 0.5
    return {"attack.init_coefficient": "0.5", "attack.formulation": "binary", "attack.curvature": "hessian",
            "attack.inner_activation": "softplus",
            "knowledge.known_init": "seed:3", "device": "cuda:1", "knowledge.recipe": "model:-lr"}[flag.path]


def test_every_reconstruct_flag_reaches_its_field_and_a_foreign_one_is_refused():
    """Each generated flag of `reconstruct` (run settings, every method's attack fields, every init's
    parameters) lands in its own field of the run; an attack or init field is refused for an
    alternative that lacks it."""
    from datarecon.attacks import ATTACKS
    from datarecon.attacks.init import INITS
    from datarecon.cli.reconstruct import FLAGS, ModelOptions, RunSource, _run
    from datarecon.experiments.reconstruct import ReconstructionRun, RunLayers, build_run, run_from_layers

    model = ModelOptions(model="m", weights=None, input_shape=None, value_range="0,1", loss=None, weight_decay=0.0)

    heads = {f.path.split(".")[0] for f in FLAGS}
    assert {"attack", "init", "candidates", "seed", "device", "early_stop", "checkpoint", "knowledge"} <= heads
    names = {ATTACKS.get(m).config_cls: m for m in ATTACKS.names()}
    attack_fields = {f for cls in names for f in cls.model_fields}
    assert {f.path for f in FLAGS if f.path.startswith("attack.")} == {f"attack.{f}" for f in attack_fields}
    for flag in FLAGS:
        head, _, name = flag.path.partition(".")
        if head == "attack":
            method = flag.owners[0]
            value = _another(flag, ATTACKS.get(method).config_cls, name)
            given = {**NEEDS.get(flag.path, {}), **overrides_from(FLAGS, {flag.param: value})["attack"]}
            run = run_from_layers(RunLayers(flags={"attack": given}, method=method, model="m"))
            assert run.attack.model_dump()[name] == given[name], flag.path
            foreign = [m for m in ATTACKS.names() if m not in flag.owners]
            if foreign:
                with pytest.raises(DataReconError, match=f"does not apply to method {foreign[0]!r}"):
                    run_from_layers(RunLayers(flags={"attack": given}, method=foreign[0], model="m"))
        elif head == "init":
            init = flag.owners[0]
            value = _another(flag, INITS.get(init).params_cls, name)
            given = overrides_from(FLAGS, {flag.param: value})["init"]
            run = run_from_layers(RunLayers(flags={"init": given}, init=init, model="m"))
            assert run.init.name == init and run.init_params()[name] == given[name], flag.path
            foreign = [i for i in INITS.names() if i not in flag.owners]
            if foreign:
                with pytest.raises(DataReconError, match=f"{flag.decls[0]} applies to .* inits, not {foreign[0]!r}"):
                    _run(model, RunSource(method=None, init=foreign[0], config_file=None, sets=None, preset=None), {"init": given})
        else:
            owner = ReconstructionRun
            for part in flag.path.split(".")[:-1]:
                owner = owner.model_fields[part].annotation
                owner = [a for a in getattr(owner, "__args__", (owner,)) if a is not type(None)][0]
            last = flag.path.split(".")[-1]
            value = _another(flag, owner, last)
            run = build_run(merge({"model": "m", **NEEDS.get(flag.path, {})}, overrides_from(FLAGS, {flag.param: value})))
            got = run
            for part in flag.path.split("."):
                got = getattr(got, part)
            expected = flag.parse(value) if flag.parse else value
            if isinstance(got, BaseModel):
                expected = type(got).model_validate(expected)
            assert got == expected, flag.path


def test_output_options_come_first_and_refuse_resume_with_overwrite(tmp_path):
    seen = {}

    @output_options(out="Where.", resume="Go on.", overwrite="Replace.")
    def cmd(name: str = typer.Option("x", "--name"), *, output: Output) -> None:
        seen["output"] = output

    app = typer.Typer()
    app.command()(cmd)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["cmd", "--out", str(tmp_path), "--resume"])
    assert r.exit_code == 0 and seen["output"] == Output(out=tmp_path, resume=True, overwrite=False)
    help_text = CliRunner().invoke(app, ["cmd", "--help"], env={"COLUMNS": "200"}).output
    assert help_text.index("--out") < help_text.index("--resume") < help_text.index("--overwrite") < help_text.index("--name")
    r = CliRunner().invoke(app, ["cmd", "--out", str(tmp_path), "--resume", "--overwrite"])
    assert isinstance(r.exception, DataReconError) and "not both" in str(r.exception)


def test_backend_options_build_the_backend_and_refuse_an_unknown_one():
    seen = {}

    @backend_options(workers="Units.", default_workers=1)
    def cmd(*, backend: Execution) -> None:
        seen["backend"] = backend

    app = typer.Typer()
    app.command()(cmd)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["cmd", "-j", "3", "--ray-address", "auto"])
    assert r.exit_code == 1 and "--ray-address needs --backend ray" in str(r.exception)
    r = CliRunner().invoke(app, ["cmd", "--backend", "ray", "-j", "3", "--ray-address", "auto"])
    assert r.exit_code == 0 and seen["backend"] == Execution(backend="ray", workers=3, ray_address="auto")
    assert seen["backend"].backend_options() == {"address": "auto"}
    r = CliRunner().invoke(app, ["cmd", "--backend", "slurm"])
    assert isinstance(r.exception, DataReconError) and "valid names: local, ray" in str(r.exception)


def test_every_threads_option_shows_its_default():
    """Every command's --threads says its default in its help (issue 50: `demo --help` showed none, its option
    defaulting to "not given" so that a --config file's value applies); a command with --steps does so too."""
    from datarecon.cli.main import _walk_commands, build_command

    missing = []
    for cmd in _walk_commands(build_command()):
        for param in getattr(cmd, "params", []):
            if "--threads" in getattr(param, "opts", ()) or (cmd.name == "demo" and "--steps" in param.opts):
                shown = param.show_default not in (False, None) and param.default is not None
                if not (shown or "[default: " in (param.help or "")):
                    missing.append(f"{cmd.name} {param.opts[0]}")
    assert not missing, missing
