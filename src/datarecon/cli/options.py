"""Command-line options generated from a typed config: one flag per field, help from its docs.

A command lists how each field of its config model is spelled on the command line (a
:class:`Flag` per field path; names follow the path unless a flag says otherwise) and decorates its
hand-written body with :func:`config_options`. The decorator adds one typer option per field (type
from the field's annotation; help from the field's description, else the ``Attributes:`` entry of
the model's docstring; choices from a ``Literal`` or a registry), and hands the body a nested
``overrides`` mapping with only the fields the user gave. Validation stays in one place, the
pydantic model the mapping is built into, so a bad value gets the same one-line error from a flag,
a config file or the Python API.

    TRAIN_FLAGS = flags(TrainConfig, rename={"arch.name": "--arch"}, prefix={"data": "", ...})

    @config_options(TRAIN_FLAGS)
    def train_cmd(out: ..., *, overrides: dict) -> None: ...

:func:`flags` refuses a table that leaves a field of the model without a flag, so a field added to
the config cannot be forgotten on the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel

from datarecon.cli._common import DEFAULT_THREADS, ThreadsOption, set_threads
from datarecon.errors import DataReconError
from datarecon.experiments.backends import BACKENDS, check_ray_address
from datarecon.experiments.execution import Execution
from datarecon.kernel.outdir import check_out_file

_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class Flag:
    """One config field on the command line.

    Attributes:
        path: dotted field path in the config (``"data.seed"``).
        decls: the option's names (``("--data-seed",)``); a boolean gets ``--x/--no-x``.
        kind: the scalar type typer parses the text into (bool, int, float or str).
        help: the option's help (the field's description).
        parse: text → value for fields whose type is not a scalar (tuples, "none"); None: as typed.
        hidden: hidden from ``--help`` (still accepted).
        owners: for a field of alternative models (:func:`union_flags`): the alternatives that have it.
    """

    path: str
    decls: tuple[str, ...]
    kind: type
    help: str
    parse: Callable[[Any], Any] | None = None
    hidden: bool = False
    owners: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        """The python name of the option's parameter (``data__seed``)."""
        return self.path.replace(".", "__")

    @property
    def metavar(self) -> str | None:
        """What ``--help`` shows as the value of a parsed field (``<float|none>``); None: its type."""
        return getattr(self.parse, "metavar", None)


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X | None, m...]`` → (X, [m...]) with ``None`` dropped from a union."""
    meta: list[Any] = []
    while typing.get_origin(annotation) is Annotated:
        annotation, *more = typing.get_args(annotation)
        meta += more
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])[0], meta + _unwrap(args[0])[1]
    return annotation, meta


def _submodel(annotation: Any) -> type[BaseModel] | None:
    inner, _ = _unwrap(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


_ATTR = re.compile(r"^(\s+)(\w+(?:, \w+)*): (.*)$")


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """``{field: text}`` from the ``Attributes:`` sections of the docstrings of ``model`` and its bases
    (Google style; a subclass's entry wins; ``a, b: text`` documents both), continuation lines
    joined, reST markup (````x````, ``:class:`x```) reduced to plain text."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel and "__doc__" in vars(cls):
            out.update(_attributes(cls.__doc__ or ""))
    return out


def _attributes(doc: str) -> dict[str, str]:
    doc = inspect.cleandoc(doc)
    entries: list[tuple[list[str], str]] = []
    lines = doc.split("Attributes:", 1)[1].splitlines() if "Attributes:" in doc else []
    indent = None
    for line in lines:
        m = _ATTR.match(line)
        depth = len(line) - len(line.lstrip())
        if m and (indent is None or len(m.group(1)) == indent):
            indent = len(m.group(1))
            entries.append((m.group(2).split(", "), m.group(3).strip()))
        elif entries and line.strip() and depth > (indent or 0):
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
        elif line.strip() and indent is not None and depth < indent:
            break
    return {name: _plain(text) for names, text in entries for name in names}


def field_description(model: type[BaseModel], name: str) -> str:
    """The field's ``description``, from ``model`` or the nearest base declaring one, else its docstring entry."""
    for cls in model.__mro__:
        info = getattr(cls, "model_fields", {}).get(name) if isinstance(cls, type) else None
        if info is not None and info.description:
            return info.description
    return field_docs(model).get(name, "")


def _plain(text: str) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "")


def _choices(inner: Any, meta: list[Any]) -> tuple[str, ...]:
    if typing.get_origin(inner) is Literal:
        return tuple(str(a) for a in typing.get_args(inner))
    for m in meta:
        registry = getattr(getattr(m, "func", None), "registry", None)
        if registry is not None:
            return tuple(registry.names())
    return ()


def leaf_fields(model: type[BaseModel], prefix: str = "",
                atoms: tuple[str, ...] = ()) -> Iterator[tuple[str, Any, type[BaseModel]]]:
    """``(path, annotation, owning model)`` of every scalar field of ``model``, nested models walked
    (but for the paths in ``atoms``, taken whole)."""
    for name, info in model.model_fields.items():
        sub = _submodel(info.annotation)
        if sub is not None and f"{prefix}{name}" not in atoms:
            yield from leaf_fields(sub, f"{prefix}{name}.", atoms)
        else:
            yield f"{prefix}{name}", info.rebuild_annotation(), model


def _help(model: type[BaseModel], name: str, choices: tuple[str, ...]) -> str:
    text = field_description(model, name)
    if not text:
        raise TypeError(f"{model.__name__}.{name} has no description (docstring Attributes: entry)")
    if choices and not all(c in text for c in choices):
        text = text.rstrip(".") + f". One of: {', '.join(choices)}."
    return text


def default_text(model: type[BaseModel], name: str) -> str:
    """`` [default: X]`` for a field whose default is a plain value (the flag itself defaults to "not
    given", so typer cannot show it), else ""."""
    default = model.model_fields[name].default
    if isinstance(default, bool):
        return f"  [default: {'--' if default else '--no-'}{name.replace('_', '-')}]"
    if isinstance(default, (int, float, str)) and default != "":
        return f"  [default: {default:g}]" if isinstance(default, float) else f"  [default: {default}]"
    return ""


def flags(model: type[BaseModel], *, prefix: dict[str, str] | None = None, rename: dict[str, Any] | None = None,
          parse: dict[str, Callable[[Any], Any]] | None = None, skip: tuple[str, ...] = (),
          hidden: tuple[str, ...] = ()) -> tuple[Flag, ...]:
    """The command-line flags of every leaf field of ``model``.

    Args:
        model: the config model.
        prefix: option-name prefix per nested model (default: its field name, ``dp`` → ``--dp-x``;
            ``""`` drops it, ``data.task`` → ``--task``).
        rename: path → option name (or tuple of names) where the path rule does not apply.
        parse: path → function of the option's text for fields of non-scalar type (given as str).
        skip: paths the command sets itself (no flag).
        hidden: paths whose flags ``--help`` does not show.

    Raises:
        TypeError: a field of non-scalar type without a ``parse``, a name in ``rename`` / ``parse``
            that is no field, or a field without a description (a programming error, not user input).
    """
    prefix, rename, parse = prefix or {}, rename or {}, parse or {}
    out = []
    leaves = list(leaf_fields(model, atoms=tuple(parse)))
    for path, annotation, owner in leaves:
        if path in skip:
            continue
        inner, meta = _unwrap(annotation)
        head, _, last = path.rpartition(".")
        pre = prefix.get(head, head.replace(".", "-") + "-" if head else "")
        decls = rename.get(path, f"--{pre}{last}".replace("_", "-"))
        decls = (decls,) if isinstance(decls, str) else tuple(decls)
        kind = str if path in parse else (str if typing.get_origin(inner) is Literal else inner)
        if kind not in _SCALARS:
            raise TypeError(f"{path}: type {annotation!r} needs a parse function")
        if kind is bool:
            decls = tuple(f"{d}/--no-{d[2:]}" for d in decls)
        out.append(Flag(path, decls, kind, _help(owner, last, _choices(inner, meta)) + default_text(owner, last),
                        parse.get(path), hidden=path in hidden))
    unknown = (set(rename) | set(parse) | set(skip) | set(hidden)) - {p for p, _, _ in leaves}
    if unknown:
        raise TypeError(f"no such field in {model.__name__}: {sorted(unknown)}")
    return tuple(out)


def union_flags(models: dict[str, type[BaseModel]], *, head: str, what: str, prefix: str = "",
                rename: dict[str, Any] | None = None,
                parse: dict[str, Callable[[Any], Any]] | None = None) -> tuple[Flag, ...]:
    """One flag per field name of alternative models (the attack methods, the initialisations),
    at the path ``head.field``; a field some alternatives lack says which have it in its help and
    records them in :attr:`Flag.owners` (the command refuses it for another).

    Args:
        models: alternative name → its config model (a registry's configs).
        head: the path the fields sit under (``"attack"``).
        what: the alternatives' plural for the help (``"methods"``).
        prefix: option-name prefix (``"init-"`` → ``--init-scale``).
        rename, parse: as for :func:`flags`, keyed by field name.

    Raises:
        TypeError: a field typed differently by two alternatives, or not scalar without a parse.
    """
    rename, parse = rename or {}, parse or {}
    kinds: dict[str, type] = {}
    owners: dict[str, list[str]] = {}
    for alt, model in models.items():
        for name, info in model.model_fields.items():
            inner, _ = _unwrap(info.rebuild_annotation())
            kind = str if name in parse or typing.get_origin(inner) is Literal else inner
            if kinds.setdefault(name, kind) is not kind or kind not in _SCALARS:
                raise TypeError(f"{head}.{name}: {alt} types it {info.annotation!r}; give a parse or one scalar type")
            owners.setdefault(name, []).append(alt)
    out = []
    for name, alts in owners.items():
        model = models[alts[0]]
        inner, meta = _unwrap(model.model_fields[name].rebuild_annotation())
        text = _help(model, name, _choices(inner, meta))
        if len(alts) < len(models):
            text = text.rstrip(".") + f". [{what}: {', '.join(alts)}]"
        decls = rename.get(name, f"--{prefix}{name}".replace("_", "-"))
        decls = (decls,) if isinstance(decls, str) else tuple(decls)
        if kinds[name] is bool:
            decls = tuple(f"{d}/--no-{d[2:]}" for d in decls)
        out.append(Flag(f"{head}.{name}", decls, kinds[name], text, parse.get(name), owners=tuple(alts)))
    return tuple(out)


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *heads, last = path.split(".")
    for h in heads:
        tree = tree.setdefault(h, {})
    tree[last] = value


def overrides_from(table: tuple[Flag, ...], values: dict[str, Any]) -> dict[str, Any]:
    """The nested mapping of the fields given on the command line (``None``: not given)."""
    tree: dict[str, Any] = {}
    for flag in table:
        value = values.get(flag.param)
        if value is not None:
            _put(tree, flag.path, flag.parse(value) if flag.parse else value)
    return tree


def _extend(body: Callable[..., Any], name: str, params: list[inspect.Parameter],
            build: Callable[[dict[str, Any]], Any], *, first: bool = False) -> Callable[..., Any]:
    """``body`` with its keyword ``name`` replaced by the options ``params`` (after the body's own, or
    before them with ``first``): the command passes ``build({param: value})`` of those options as
    ``name``. typer reads the generated signature."""
    sig = inspect.signature(body, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != name]
    clash = sorted({p.name for p in own} & {p.name for p in params})
    if name not in sig.parameters or clash:
        raise TypeError(f"{body.__name__}: needs a keyword {name!r}; parameters {clash} clash with generated options")
    mine = {p.name for p in params}

    @functools.wraps(body)
    def command(**kwargs: Any) -> Any:
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in mine}
        return body(**kwargs, **{name: build(given)})

    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    params = params + own if first else own + params
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # typer must read the generated signature, not the body's
    return command


def config_options(table: tuple[Flag, ...], into: str = "overrides") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking the keyword ``into`` with one typer option per flag of ``table``.

    The command's signature is the body's (``into`` removed) followed by the generated options;
    a flag's option defaults to None (not given), and the body gets :func:`overrides_from` of them.
    """
    params = [
        inspect.Parameter(f.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[f.kind | None, typer.Option(*f.decls, help=f.help, hidden=f.hidden,
                                                                           show_default=False, metavar=f.metavar)])
        for f in table
    ]
    return lambda body: _extend(body, into, params, lambda given: overrides_from(table, given))


def option_group(name: str, cls: type, options: Mapping[str, tuple[Any, Any, Any]], *, first: bool = False
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking the keyword ``name`` with the typer options ``options`` of one
    typed group: ``{field: (type, default, typer.Option(...))}``, one per field of the frozen
    dataclass ``cls``; the body gets ``cls(**values)``. ``first``: the options come before the
    body's own (in ``--help``).

    Raises:
        TypeError: (a programming error) ``options`` and the fields of ``cls`` differ.
    """
    fields = [f.name for f in dataclasses.fields(cls)]
    if sorted(fields) != sorted(options):
        raise TypeError(f"{cls.__name__}: options {sorted(options)} do not match its fields {sorted(fields)}")
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(field, kw, default=default, annotation=Annotated[kind, option])
              for field, (kind, default, option) in options.items()]
    return lambda body: _extend(body, name, params, lambda given: cls(**given), first=first)


@dataclass(frozen=True)
class Common:
    """The options every computing command shares, defined once (:func:`common_options`).

    Attributes:
        progress: show progress (``--progress/--no-progress``; off under the deprecated ``--quiet``).
        quiet: the deprecated ``--quiet`` was given (commands may also drop their summary).
        threads: CPU threads for PyTorch (``--threads``; default 1; 0: its default, all cores), already applied.
    """

    progress: bool
    quiet: bool
    threads: int


def common_options(*, progress: str = "Show progress (a bar on a terminal, plain lines in a log).",
                   quiet: str = "Deprecated: --no-progress.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking ``common`` (keyword, a :class:`Common`) with ``--progress/--no-progress``,
    the hidden deprecated ``--quiet`` and ``--threads`` (applied before the body runs); the helps may differ."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("progress", kw, default=True,
                          annotation=Annotated[bool, typer.Option("--progress/--no-progress", help=progress)]),
        inspect.Parameter("quiet", kw, default=False,
                          annotation=Annotated[bool, typer.Option("--quiet", hidden=True, help=quiet)]),
        inspect.Parameter("threads", kw, default=DEFAULT_THREADS, annotation=ThreadsOption),
    ]

    def build(given: dict[str, Any]) -> Common:
        set_threads(given["threads"])
        return Common(progress=given["progress"] and not given["quiet"], quiet=given["quiet"],
                      threads=given["threads"])

    return lambda body: _extend(body, "common", params, build)


@dataclass(frozen=True)
class Output:
    """Where a command writes and how it treats what is there, defined once (:func:`output_options`).

    Attributes:
        out: the output folder.
        resume: continue the work in ``out``.
        overwrite: replace an ``out`` of another configuration (only what datarecon wrote there).
    """

    out: Path
    resume: bool
    overwrite: bool


def output_options(*, out: str, resume: str, overwrite: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking ``output`` (keyword, an :class:`Output`) with ``--out`` (required),
    ``--resume`` and ``--overwrite`` (helps given per command); both flags together are refused."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("out", kw, annotation=Annotated[Path, typer.Option("--out", help=out)]),
        inspect.Parameter("resume", kw, default=False, annotation=Annotated[bool, typer.Option("--resume", help=resume)]),
        inspect.Parameter("overwrite", kw, default=False,
                          annotation=Annotated[bool, typer.Option("--overwrite", help=overwrite)]),
    ]

    def build(given: dict[str, Any]) -> Output:
        if given["resume"] and given["overwrite"]:
            raise DataReconError("pass either --resume (continue the work in --out) or --overwrite (start afresh), "
                                 "not both")
        return Output(**given)

    return lambda body: _extend(body, "output", params, build, first=True)


@dataclass(frozen=True)
class OutFile:
    """The one output file a command writes (``report``, ``store export``, ``membership``) and whether it
    may replace an existing one, defined once (:func:`out_file_options`).

    Attributes:
        out: the output file (None: the command writes none).
        overwrite: replace an existing ``out`` that datarecon wrote (never another file).
    """

    out: Path | None
    overwrite: bool

    def check(self, *, ours: Callable[[Path], bool], what: str) -> Path | None:
        """The output rule of every command (:func:`datarecon.kernel.outdir.check_out_file`), before any work."""
        return None if self.out is None else check_out_file(self.out, overwrite=self.overwrite, ours=ours, what=what)


def out_file_options(*, out: str, default: Path | None = None, required: bool = False
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking ``output`` (keyword, an :class:`OutFile`) with ``--out`` (``-o``;
    help per command) and ``--overwrite`` (the same help everywhere)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    kind = Path if required or default is not None else Path | None
    params = [
        inspect.Parameter("out", kw, default=inspect.Parameter.empty if required else default,
                          annotation=Annotated[kind, typer.Option("--out", "-o", help=out)]),
        inspect.Parameter("overwrite", kw, default=False, annotation=Annotated[bool, typer.Option(
            "--overwrite", help="Replace an existing --out that datarecon wrote (never another file).")]),
    ]
    return lambda body: _extend(body, "output", params, lambda given: OutFile(**given))


#: what a backend is, in the help of ``--backend`` (a backend without an entry is listed by its name only)
BACKEND_NOTES = {"local": "a process pool; in-process with one worker"}


def backend_help() -> str:
    """The default help of ``--backend``: every registered backend (:data:`BACKENDS`), with its note."""
    names = [f"{name} ({BACKEND_NOTES[name]})" if name in BACKEND_NOTES else name for name in BACKENDS.ordered()]
    return f"Execution backend: {' | '.join(names)}."


def backend_options(*, workers: str, default_workers: int | None, backend: str | None = None,
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body taking ``backend`` (keyword, an
    :class:`~datarecon.experiments.execution.Execution`, the one description of where a sweep's or an
    audit's tasks run) with ``--backend`` (help: ``backend``, default :func:`backend_help`), ``--workers/-j``
    (at least 1) and ``--ray-address``; an unknown backend, and a Ray address for another backend, are
    refused in one line before any work."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("backend", kw, default="local",
                          annotation=Annotated[str, typer.Option("--backend", help=backend or backend_help())]),
        inspect.Parameter("workers", kw, default=default_workers,
                          annotation=Annotated[int | None, typer.Option("--workers", "-j", min=1, help=workers)]),
        inspect.Parameter("ray_address", kw, default=None, annotation=Annotated[str | None, typer.Option(
            "--ray-address", help="Ray cluster address (auto or HOST:PORT); default: embedded Ray.")]),
    ]

    def build(given: dict[str, Any]) -> Any:
        BACKENDS.get(given["backend"])
        execution = Execution(backend=given["backend"], workers=given["workers"], ray_address=given["ray_address"])
        execution.backend_options()  # --ray-address without --backend ray
        check_ray_address(execution.ray_address)  # before any work: an address that does not answer, in seconds
        return execution

    return lambda body: _extend(body, "backend", params, build)


def comma_ints(option: str, what: str = "integers") -> Callable[[str], list[int]]:
    """A parse for tuple-of-int fields: ``"1000,1000"`` → ``[1000, 1000]``; ``""`` / ``none`` → ``[]``."""

    def parse(text: str) -> list[int]:
        text = text.strip()
        if text in ("", "none"):
            return []
        try:
            return [int(s) for s in text.split(",")]
        except ValueError:
            raise DataReconError(f"{option} must be a comma-separated list of {what} like 1000,1000; "
                                 f"got {text!r}") from None

    parse.metavar = "<int,...>"  # type: ignore[attr-defined]
    return parse


def number_or_none(option: str, what: str) -> Callable[[str], float | None]:
    """A parse for optional numbers: ``"2.5"`` → 2.5; ``none`` / ``inf`` / ``off`` → None (explicitly unset)."""

    def parse(text: str) -> float | None:
        if text.strip().lower() in ("none", "inf", "off"):
            return None
        try:
            return float(text)
        except ValueError:
            raise DataReconError(f"{option} must be {what} or 'none'; got {text!r}") from None

    parse.metavar = "<float|none>"  # type: ignore[attr-defined]
    return parse
