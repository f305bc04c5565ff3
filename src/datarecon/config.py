"""Reading typed configs from YAML/TOML files.

Every config in datarecon is a frozen pydantic model; a config file maps
one-to-one to its fields (nested models are nested mappings). The CLI and the
Python API build configs through :func:`load_config_file` / ``Model(**fields)``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError

from datarecon.errors import DataReconError

M = TypeVar("M", bound=BaseModel)

#: the largest seed a ``torch.Generator`` takes on every platform (a signed 64-bit integer)
MAX_SEED = 2**63 - 1
#: a seed field of any config: 0 .. :data:`MAX_SEED`
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
#: the largest step or epoch count a config accepts: a billion full-batch steps is days of compute at
#: a millisecond each; larger values are typos (``1e23``) that would run forever
MAX_STEPS = 10**9


def read_config_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into a mapping.

    Raises:
        DataReconError: missing file, unknown suffix, or a file that is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise DataReconError(f"config file {path} not found; check the path")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataReconError(f"config file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at position "
                             f"{exc.start}); save it as UTF-8") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise DataReconError(f"config file {path} must end in .yaml, .yml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        first = str(exc).splitlines()[0]
        raise DataReconError(f"config file {path} does not parse: {first}") from None
    except RecursionError:
        raise DataReconError(f"config file {path} is nested too deeply to parse; write it as a plain mapping") from None
    if not isinstance(data, dict):
        raise DataReconError(f"config file {path} must hold a mapping of field: value")
    return data


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic model classes an annotation admits (through Annotated, Optional, unions, tuples)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config class reached by following the error location ``loc`` from ``model`` (None if unknown).

    A step into a union discriminated by a tag (``attack.kkt.lr_x``) picks the member whose
    field default equals the tag.
    """
    current = model
    steps = list(loc)
    while steps and current is not None:
        part = steps.pop(0)
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        members = _models_in(field.annotation)
        if len(members) > 1 and steps:
            tag = steps.pop(0)
            members = [m for m in members if any(f.default == tag for f in m.model_fields.values())]
        current = members[0] if len(members) == 1 else None
    return current


def validation_message(exc: ValidationError, *, where: str, model: type[BaseModel] | None = None) -> str:
    """One line naming each bad field of a pydantic validation error.

    With ``model`` (the validated class), an unknown key also names the keys allowed there.
    """
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        text = f"{loc}: {err['msg']}"
        if err["type"] == "extra_forbidden":
            parent = model_at(model, tuple(err["loc"][:-1]))
            if parent is not None:
                text += f" (allowed keys: {', '.join(parent.model_fields)})"
        parts.append(text)
    return f"invalid {where}: " + "; ".join(parts)


def drop_defaults(model: BaseModel, data: Any, names: tuple[str, ...]) -> Any:
    """``data`` (a model's dump) without the fields ``names`` that hold their default.

    Fields added to a config after folders were written with it are left out of its dumps while at
    their default, so the config hashes of those folders (resume keys, model.json, reproduction
    pieces, sweeps) stay what they were. Used in each such model's ``model_serializer``.
    """
    if isinstance(data, dict):
        for name in names:
            if name in data and getattr(model, name) == type(model).model_fields[name].default:
                data.pop(name)
    return data


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a field annotation admits a value of one of ``kinds`` (through Annotated, Optional, unions)."""
    if annotation is Any or (isinstance(annotation, type) and issubclass(annotation, kinds)):
        return True
    return any(_admits(a, kinds) for a in get_args(annotation) if a is not Ellipsis)


def _items_of(annotation: Any) -> Any:
    """The item annotation of a list or tuple field (None when it is not one)."""
    from typing import Union, get_origin

    origin = get_origin(annotation)
    if origin in (list, tuple):
        return next((a for a in get_args(annotation) if a is not Ellipsis), None)
    if origin is Annotated or origin is Union or str(origin) == "<class 'types.UnionType'>":
        return next((i for a in get_args(annotation) if (i := _items_of(a)) is not None), None)
    return None


def bool_as_number(model: type[BaseModel], data: Any, loc: str = "") -> str | None:
    """The first place where ``data`` gives ``true``/``false`` for a number field of ``model``, else None.

    pydantic reads ``epochs: true`` as 1 epoch; a boolean where a count or a rate belongs is a
    mistake in the file, so the configs refuse it (nested models and lists included).
    """
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        where, ann = f"{loc}{key}", field.annotation
        values = value if isinstance(value, (list, tuple)) else [value]
        item = _items_of(ann) if isinstance(value, (list, tuple)) else ann
        for v in values:
            if isinstance(v, bool) and item is not None and _admits(item, (int, float)) \
                    and not _admits(item, (bool,)):
                return where
            if isinstance(v, dict):
                members = [m for m in _models_in(item) if set(v) <= set(m.model_fields)]
                tag = field.discriminator if isinstance(field.discriminator, str) else None
                if tag is not None and len(members) > 1:  # a union tagged by ``method`` / ``name``
                    members = [m for m in members if tag in m.model_fields and m.model_fields[tag].default == v.get(tag)]
                found = bool_as_number(members[0], v, where + ".") if len(members) == 1 else None
                if found is not None:
                    return found
    return None


def build_config(model: type[M], fields: dict[str, Any], *, where: str = "config") -> M:
    """Validate ``fields`` into ``model`` with a one-line error on failure (a boolean given for a
    number included: :func:`bool_as_number`)."""
    if (loc := bool_as_number(model, fields)) is not None:
        raise DataReconError(f"invalid {where}: {loc}: a number is needed, not true/false; write a number")
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise DataReconError(validation_message(exc, where=where, model=model)) from None


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge of mappings: ``override`` wins; ``None`` values are skipped."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config_file(path: str | Path, model: type[M], *, overrides: dict[str, Any] | None = None) -> M:
    """Read a config file into ``model``, with CLI ``overrides`` applied on top."""
    data = read_config_mapping(path)
    return build_config(model, merge(data, overrides or {}), where=f"config {path}")
