"""Explicit registries whose keys feed error messages.

A :class:`Registry` maps names to objects (classes, functions, factories).
Registering a name twice is refused unless ``force=True``; looking up an
unknown name raises :class:`~datarecon.errors.DataReconError` listing the valid
names taken from the registry itself (never from a hand-kept list).

Installed packages add entries through an entry-point group (:meth:`Registry.load_entry_points`; the
groups datarecon reads are :data:`PLUGIN_GROUPS`): a package that declares, in its ``pyproject.toml``,

.. code-block:: toml

    [project.entry-points."datarecon.attacks"]
    inversion = "mypkg.attacks:InversionAttack"

has its attack registered as ``inversion`` when the attacks registry is first read, so it is a
``--method`` of ``datarecon reconstruct`` like a built-in one.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from pydantic import AfterValidator

from datarecon.errors import DataReconError

T = TypeVar("T")

#: the entry-point groups datarecon reads: group → what its entries are (:meth:`Registry.load_entry_points`)
PLUGIN_GROUPS = {
    "datarecon.attacks": "an Attack subclass (datarecon.attacks.base.Attack): a --method of reconstruct",
    "datarecon.membership_signals": "a SignalDef (datarecon.attacks.mia.SignalDef) with its score function: a "
                                    "membership signal of every evaluation",
}


#: the source file of every plug-in registered so far → how messages name it (entry point, package)
PLUGIN_FILES: dict[str, str] = {}


def plugin_failure(exc: BaseException) -> str | None:
    """One line naming the plug-in whose code raised ``exc`` (the innermost plug-in frame of its traceback), or
    None when no registered plug-in's code is in it: a plug-in's failure is its author's to fix, not datarecon's
    internal error."""
    where, tb = None, exc.__traceback__
    while tb is not None:
        where = PLUGIN_FILES.get(tb.tb_frame.f_code.co_filename, where)
        tb = tb.tb_next
    if where is None:
        return None
    return f"{where} failed: {type(exc).__name__}: {exc}; fix the plug-in, or uninstall its package"


class Registry(Generic[T]):
    """A named collection of ``T`` with clear errors.

    Args:
        kind: What the entries are ("architecture", "loss", ...); used in messages.
        check: ``check(name, obj)`` → why ``obj`` cannot be the entry ``name`` ("" when it can): run on every
            registration (a refusal raises) and on every entry point (a refusal skips it with a warning), so an
            entry's declarations are checked once, when it joins, not when generic code first reads them.
    """

    def __init__(self, kind: str, *, check: Callable[[str, object], str] | None = None) -> None:
        self.kind = kind
        self.check = check
        self._items: dict[str, T] = {}
        self._plugins: list[tuple[str, Callable[[str, object], str] | None]] = []

    def register(self, name: str, obj: T | None = None, *, force: bool = False):
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is None.

        Raises:
            ValueError: ``name`` is already registered and ``force`` is False.
            DataReconError: the registry's ``check`` refuses ``obj`` (one line with the reason).
        """

        def _add(o: T) -> T:
            if name in self._items and not force:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            reason = self.check(name, o) if self.check is not None else ""
            if reason:
                raise DataReconError(f"{self.kind} {name!r} cannot be registered: {reason}")
            self._items[name] = o
            return o

        if obj is None:
            return _add
        return _add(obj)

    def get(self, name: str) -> T:
        """Return the entry for ``name``.

        Raises:
            DataReconError: unknown name; the message lists the valid names.
        """
        self._load_plugins()
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name read from a file (a list, a mapping)
            raise DataReconError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._load_plugins()
        return sorted(self._items)

    def ordered(self) -> list[str]:
        """Registered names, in the order they were registered (e.g. weakest attacker first, for tables)."""
        self._load_plugins()
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its entry (a plug-in registered for a while, e.g. by a test).

        Raises:
            DataReconError: ``name`` is not registered (the message lists the valid names).
        """
        entry = self.get(name)
        del self._items[name]
        return entry

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._items)

    def use_entry_points(self, group: str, *, check: Callable[[str, object], str] | None = None) -> None:
        """Take the entries installed packages declare under the entry-point group ``group``: they are registered
        (:meth:`load_entry_points`) when the registry is first read, not now, so that a plug-in module may import
        the package that declares its registry (its base class, its config types) without an import cycle."""
        self._plugins.append((group, check))

    def _load_plugins(self) -> None:
        while self._plugins:
            group, check = self._plugins.pop(0)  # popped first: a plug-in that reads this registry does not reload
            self.load_entry_points(group, check=check)

    def load_entry_points(self, group: str, *, check: Callable[[str, object], str] | None = None) -> list[str]:
        """Register the objects installed packages declare under the entry-point group ``group``, each under its
        entry point's name, now.

        A plug-in is skipped with a warning (one line naming its package, its entry point and why) when it cannot
        be imported, when ``check(name, obj)`` returns a reason ("" accepts it) or when its name is taken: a broken
        plug-in never stops datarecon itself.

        Returns:
            The names registered now.
        """
        added = []
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            where = f"plug-in {ep.name!r} ({group} = {ep.value}" + (f", package {ep.dist.name}" if ep.dist else "") + ")"
            if ep.name in self._items:
                warnings.warn(f"{where} is not registered: {self.kind} {ep.name!r} exists already; rename its "
                              "entry point", stacklevel=2)
                continue
            try:
                obj = ep.load()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a third-party import's failure (a sys.exit too)
                warnings.warn(f"{where} is not registered: importing it failed ({type(exc).__name__}: {exc})",
                              stacklevel=2)
                continue
            reason = next((r for c in (check, self.check) if c is not None and (r := c(ep.name, obj))), "")
            if reason:
                warnings.warn(f"{where} is not registered: {reason}", stacklevel=2)
                continue
            self._items[ep.name] = obj
            added.append(ep.name)
            source = getattr(sys.modules.get(ep.module), "__file__", None)
            if source:  # several entry points may share a module: the message names them all
                entries = PLUGIN_FILES.get(source, "").split(": ", 1)[-1].removesuffix(")")
                names = ", ".join(n for n in (entries, f"{group} {ep.name!r}") if n)
                PLUGIN_FILES[source] = f"the plug-in module {ep.module} (" + (
                    f"package {ep.dist.name}: " if ep.dist else "entry points: ") + names + ")"
        return added


def registered(registry: Registry) -> object:
    """A pydantic validator marker: the field must name an entry of ``registry``.

    Use as ``optimizer: Annotated[str, registered(OPTIMIZERS)] = "sgd"``; an unknown name raises
    :class:`~datarecon.errors.DataReconError` listing the valid names from the registry.
    """
    def check(value: str) -> str:
        registry.get(value)
        return value

    check.registry = registry  # type: ignore[attr-defined]  (the CLI lists the choices in --help)
    return AfterValidator(check)
