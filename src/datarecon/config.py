"""Reading typed configs from YAML/TOML files.

Every config in datarecon is a frozen pydantic model; a config file maps
one-to-one to its fields (nested models are nested mappings). The CLI and the
Python API build configs through :func:`load_config_file` / ``Model(**fields)``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from datarecon.errors import DataReconError

M = TypeVar("M", bound=BaseModel)


def read_config_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into a mapping.

    Raises:
        DataReconError: missing file, unknown suffix, or a file that is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise DataReconError(f"config file {path} not found; check the path")
    text = path.read_text(encoding="utf-8")
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
    if not isinstance(data, dict):
        raise DataReconError(f"config file {path} must hold a mapping of field: value")
    return data


def validation_message(exc: ValidationError, *, where: str) -> str:
    """One line naming each bad field of a pydantic validation error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return f"invalid {where}: " + "; ".join(parts)


def build_config(model: type[M], fields: dict[str, Any], *, where: str = "config") -> M:
    """Validate ``fields`` into ``model`` with a one-line error on failure."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise DataReconError(validation_message(exc, where=where)) from None


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
