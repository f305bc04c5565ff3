"""Reading typed configs from YAML/TOML files.

Every config in datarecon is a frozen pydantic model; a config file maps
one-to-one to its fields (nested models are nested mappings). The CLI and the
Python API build configs through :func:`load_config_file` / ``Model(**fields)``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, model_serializer

from datarecon.errors import DataReconError

M = TypeVar("M", bound=BaseModel)

#: the largest seed a ``torch.Generator`` takes on every platform (a signed 64-bit integer)
MAX_SEED = 2**63 - 1
#: a seed field of any config: 0 .. :data:`MAX_SEED`
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
#: the largest config file read (a config is kilobytes; a sweep grid of a few thousand values fits easily)
MAX_CONFIG_BYTES = 64 * 2**20
#: the largest step or epoch count a config accepts: a billion full-batch steps is days of compute at
#: a millisecond each; larger values are typos (``1e23``) that would run forever
MAX_STEPS = 10**9


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently,
    so ``steps: 100`` above ``steps: 5`` in a run file would run 5 steps without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            if isinstance(key_node, (yaml.MappingNode, yaml.SequenceNode)):
                raise yaml.constructor.ConstructorError(None, None, _collection_key(key_node), key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if not isinstance(key, str):  # YAML reads `null:`, `~:`, `1:` or `yes:` as no name at all
                line = key_node.start_mark.line + 1
                what = "null (no name)" if key is None else f"the {type(key).__name__} {key!r}"
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key_node.value or 'null'!r} on line {line} is read as {what}, not as a "
                    f"field name; quote it ('{key_node.value}':) or fix the name", key_node.start_mark)
            try:
                twice = key in seen
            except TypeError:  # an unhashable key: PyYAML's own error follows
                twice = False
            if twice:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            if not twice and not isinstance(key, (list, dict)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _collection_key(node: yaml.Node) -> str:
    """Why a mapping or a list standing where a field name should be cannot be read, and what to write instead.

    The usual cause is doubled braces (``attack: {{method: kkt}}``, as templating engines write them): YAML reads
    the outer pair as a mapping whose one key is the inner mapping. The fix shown is the same line with single
    braces where that line reads as YAML; quoting would not help (the key would be the text ``{method: kkt}``).
    """
    mark = node.start_mark
    lines = str(mark.buffer or "").rstrip("\0").splitlines()
    text = lines[mark.line].strip() if mark.line < len(lines) else ""
    what = "a mapping {...}" if isinstance(node, yaml.MappingNode) else "a list [...]"
    where = f"line {mark.line + 1} (`{text[:80]}`) has {what} where a field name should be"
    if "{{" not in text and "[[" not in text:
        return f"{where}; a key is a field name: write `name: value`, with the mapping or list as the value"
    single = text.replace("{{", "{").replace("}}", "}").replace("[[", "[").replace("]]", "]")
    try:
        yaml.load(single, Loader=_UniqueKeyLoader)
        fix = f"write single braces: `{single}`"
    except yaml.YAMLError:
        fix = "write single braces, and fill in a template's {{ placeholder }} before the file is read"
    return f"{where}: YAML reads doubled braces as a mapping whose key is the inner mapping; {fix}"


#: the most values (mappings, lists and scalars, each alias counted where it is used) a config may
#: expand to: YAML aliases nest (``b: [*a, *a, ...]``), so a file of a few lines can stand for 10⁹ values
MAX_CONFIG_VALUES = 1_000_000


def _expanded_size(data: Any, limit: int) -> int:
    """How many values ``data`` expands to, counting aliases where they are used (stops past ``limit``)."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


def read_config_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into a mapping.

    Raises:
        DataReconError: missing file, unknown suffix, or a file that is not a mapping.
    """
    path = Path(path)
    if path.is_dir():
        raise DataReconError(f"config file {path} is a folder; pass a .yaml, .yml or .toml file")
    if not path.is_file():
        if path.exists():
            raise DataReconError(f"config file {path} is not a regular file (a device or pipe); pass a .yaml, .yml "
                                 "or .toml file")
        raise DataReconError(f"config file {path} not found; check the path")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise DataReconError(f"config file {path} is {path.stat().st_size / 2**20:.0f} MB; a config file is a few "
                             "kB of settings: pass the right file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataReconError(f"config file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at position "
                             f"{exc.start}); save it as UTF-8") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
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
    if _expanded_size(data, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:
        raise DataReconError(f"config file {path} expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases "
                             "nested in aliases); write the values out")
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
    parts: list[str] = []
    unknown: dict[tuple[Any, ...], list[str]] = {}  # parent location -> its unknown keys, named once
    for err in exc.errors():
        if err["type"] == "extra_forbidden" and err["loc"]:
            if tuple(err["loc"][:-1]) not in unknown:
                parts.append(tuple(err["loc"][:-1]))  # type: ignore[arg-type]  # a placeholder, filled below
            unknown.setdefault(tuple(err["loc"][:-1]), []).append(str(err["loc"][-1]))
            continue
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return f"invalid {where}: " + "; ".join(
        _unknown_keys(p, unknown[p], model) if isinstance(p, tuple) else p for p in parts)


def _unknown_keys(parent: tuple[Any, ...], keys: list[str], model: type[BaseModel] | None) -> str:
    """``attack.foo, attack.bar: unknown keys (allowed keys: ...)``, the allowed keys listed once."""
    prefix = "".join(f"{p}." for p in parent)
    text = ", ".join(f"{prefix}{k}" for k in keys) + (": unknown key" if len(keys) == 1 else ": unknown keys")
    known = model_at(model, parent)
    return text + (f" (allowed keys: {', '.join(known.model_fields)})" if known is not None else "")


def added_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``cls`` declared as added after folders were written (``added_fields`` of every class of its
    MRO, base classes first)."""
    return tuple(dict.fromkeys(f for c in reversed(cls.__mro__) for f in c.__dict__.get("added_fields", ())))


class RecordedConfig(BaseModel):
    """The one rule that keeps the hashes of folders written earlier: a config whose dumps identify folders
    (config hashes, resume keys, model.json, run.json, reproduction pieces, sweeps) declares the fields added
    after such folders were written in ``added_fields``; its dumps leave each of them out while it holds its
    default, so a folder written before the field existed keeps its hash, and one written with another value
    records it.

    A field renamed after such folders were written is declared in ``renamed_fields`` (its name → the name folders
    record): dumps write the recorded name, so those folders keep their hashes; the field reads the recorded name too
    (``validation_alias=AliasChoices(name, recorded)``: a folder's record, a config file or keyword written before
    the rename).

    A subclass adds its own names (the classes of its MRO are joined, :func:`added_fields`) and may extend
    :meth:`recorded` (what a dump adds beyond the fields, e.g. the meaning of a weight)."""

    #: fields added after folders were written with this config (this class's; its bases' are added to them)
    added_fields: ClassVar[tuple[str, ...]] = ()
    #: fields renamed after folders were written: the field's name → the name the folders record
    renamed_fields: ClassVar[Mapping[str, str]] = {}

    @model_serializer(mode="wrap")
    def _recorded_dump(self, handler):  # type: ignore[no-untyped-def]
        return self.recorded(handler(self))

    def recorded(self, data: Any) -> Any:
        """``data`` (this config's dump) as recorded: without the added fields that hold their default, renamed
        fields under the names folders record."""
        if isinstance(data, dict):
            fields = type(self).model_fields
            for name in added_fields(type(self)):
                if name in data and getattr(self, name) == fields[name].default:
                    data.pop(name)
            renamed = type(self).renamed_fields
            if renamed:
                data = {renamed.get(k, k): v for k, v in data.items()}
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


def build_record(model: type[M], fields: Any, *, where: str) -> M:
    """:func:`build_config` of a section of a file read back (a model directory's data spec): every
    error, a registry's refusal included, names the file it came from.

    Raises:
        DataReconError: ``invalid <where>: ...`` in one line.
    """
    if not isinstance(fields, dict):
        raise DataReconError(f"invalid {where}: not a mapping")
    try:
        return build_config(model, fields, where=where)
    except DataReconError as exc:
        text = str(exc)
        raise DataReconError(text if text.startswith(f"invalid {where}") else f"invalid {where}: {text}") from None


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


def layered(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged in increasing priority (defaults < file < flags < ``--set``): :func:`merge`
    of each onto the ones before; ``None`` values override nothing."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = merge(out, dict(layer))
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b]... = value`` for the dotted ``key`` ``a.b...``: the nested mappings it touches are
    copied (a mapping shared with another spec is never changed) and created where missing."""
    head, _, rest = key.partition(".")
    if not rest:
        data[head] = value
        return
    inner = dict(data[head]) if isinstance(data.get(head), dict) else {}
    set_dotted(inner, rest, value)
    data[head] = inner


def load_config_file(path: str | Path, model: type[M], *, overrides: dict[str, Any] | None = None) -> M:
    """Read a config file into ``model``, with CLI ``overrides`` applied on top."""
    data = read_config_mapping(path)
    return build_config(model, merge(data, overrides or {}), where=f"config {path}")
