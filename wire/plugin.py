"""The contract every pluggable unit follows: agent sources, analytics detectors and
recommenders (and whatever comes next), the way a Telegraf plugin or a node_exporter
collector is one unit found by its name.

A unit is a class with

- ``name``: the registry name, the module name and the config table (``[sources.host]`` is
  ``agent/sources/host.py``, ``[sources.gpu]`` the package ``agent/sources/gpu/``;
  ``detectors/ps_bound.py`` is the detector ``ps_bound``);
- ``OPTIONS``: typed options with defaults and help (``Option``), validated up front by
  ``parse_options`` with a one-line error naming the key;
- ``REQUIRES``: what it needs to run (``Requirement``: a Python module, a table, a model
  fit...), checked up front by ``Registry.check`` with a one-line error;
- a ``## name`` heading in its docs page and a test file of its own (tests/test_docs.py
  fails for a registered unit without them).

``Registry`` holds one kind of unit by name.  Standard library only (the agent's
dependency rule): checks that need a database are given to ``Registry.check`` by the side
that has one.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from .units import ConfigError, parse_duration, parse_size

KINDS = ("bool", "int", "float", "str", "duration", "size", "list")


@dataclass(frozen=True)
class Option:
    """One typed option of a unit.  ``lo`` / ``hi`` bound int and float options (``lo_open``:
    strictly above ``lo``); ``choices`` limits a str option."""

    kind: str
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise AssertionError(f"option kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def parse(self, key: str, v: Any) -> Any:
        """``v`` as this option's kind; ConfigError naming ``key`` when it is not one."""
        k = self.kind
        if k == "bool":
            return parse_bool(key, v)
        if k == "int":
            lo = 0 if self.lo is None else int(self.lo)
            hi = 1 << 31 if self.hi is None else int(self.hi)
            return parse_int(key, v, lo, hi)
        if k == "float":
            return self._float(key, v)
        if k == "str":
            s = parse_str(key, v)
            if self.choices and s not in self.choices:
                raise ConfigError(f"{key}: must be one of {', '.join(self.choices)}, got {s!r}")
            return s
        if k == "duration":
            return parse_duration(key, v)
        if k == "size":
            return parse_size(key, v)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{key}: expected a list of strings, got {v!r}")
        return list(v)

    def _float(self, key: str, v: Any) -> float:
        try:
            if isinstance(v, bool):
                raise ValueError
            f = float(v)
        except (TypeError, ValueError):
            f = math.nan
        lo, hi = self.lo, self.hi
        ok = math.isfinite(f)
        ok = ok and (lo is None or (f > lo if self.lo_open else f >= lo)) and (hi is None or f <= hi)
        if ok:
            return f
        if lo is None and hi is None:
            raise ConfigError(f"{key}: expected a number, got {v!r}")
        raise ConfigError(f"{key}: must be a number {self.accepts()}, got {v!r}")

    def accepts(self) -> str:
        """The values this option accepts, in words: the docs' option tables show it in
        their ``range`` column (tests/test_docs.py holds the two equal) and a refused float
        says it."""
        k, lo, hi = self.kind, self.lo, self.hi
        if k == "int":
            lo = 0 if lo is None else lo
        elif k != "float":
            return {"bool": "true or false", "duration": "at least 0", "size": "at least 0",
                    "list": "names"}.get(k) or (f"one of {', '.join(self.choices)}" if self.choices else "text")
        if lo is None and hi is None:
            return "any number"
        if hi is None:
            return f"above {lo:g}" if self.lo_open else f"at least {lo:g}"
        if lo is None:
            return f"at most {hi:g}"
        return f"{'above' if self.lo_open else 'from'} {lo:g} {'and at most' if self.lo_open else 'to'} {hi:g}"


def parse_str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{key}: expected a string, got {v!r}")
    return v


def parse_bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise ConfigError(f"{key}: expected true or false, got {v!r}")


def parse_int(key: str, v: Any, lo: int, hi: int) -> int:
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        i = int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected an integer, got {v!r}") from None
    if not lo <= i <= hi:
        raise ConfigError(f"{key}: must be between {lo} and {hi}, got {i}")
    return i


@dataclass(frozen=True)
class Requirement:
    """Something a unit needs: ``kind`` is ``module`` (a Python module, checked here) or one
    a registry's owner checks (``table``, ``fit``...); ``why`` completes the error."""

    kind: str
    name: str
    why: str = ""


class Unit:
    """Base of every pluggable unit (see the module docstring)."""

    name: ClassVar[str]
    OPTIONS: ClassVar[Mapping[str, Option]] = {}
    REQUIRES: ClassVar[tuple[Requirement, ...]] = ()

    @classmethod
    def options(cls) -> dict[str, Option]:
        """Every option of the unit (a subclass may add common ones)."""
        return dict(cls.OPTIONS)

    @classmethod
    def parse_options(cls, where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Typed options from user input (config table, flags); defaults filled in.  An
        unknown key or a bad value is a ConfigError naming ``where.key``."""
        options = cls.options()
        unknown = sorted(set(raw) - set(options))
        if unknown:
            raise ConfigError(f"unknown key '{where}.{unknown[0]}' (known: {', '.join(sorted(options))})")
        return {
            key: opt.parse(f"{where}.{key}", raw[key]) if key in raw else opt.default
            for key, opt in options.items()
        }


U = TypeVar("U", bound=type[Unit])
Checker = Callable[[Requirement], str | None]  # a requirement -> None when met, else why not


def _module_missing(r: Requirement) -> str | None:
    return None if importlib.util.find_spec(r.name) is not None else f"Python module {r.name!r} is not installed"


class Registry(Generic[U]):
    """The units of one kind (``source``, ``detector``, ``recommender``), by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._units: dict[str, U] = {}

    def register(self, cls: U) -> U:
        """Class decorator: add ``cls`` under ``cls.name`` (a name once only)."""
        name = getattr(cls, "name", "")
        if not name or not name.replace("_", "").isalnum() or name != name.lower():
            raise AssertionError(f"{self.kind} {cls.__name__}: name {name!r} must be lower_snake_case")
        if name in self._units and self._units[name] is not cls:
            raise AssertionError(f"{self.kind} {name!r} is registered twice")
        for key, opt in cls.OPTIONS.items():
            if not isinstance(opt, Option):
                raise AssertionError(f"{self.kind} {name}: option {key!r} must be an Option")
        self._units[name] = cls
        return cls

    def order(self, names: tuple[str, ...]) -> None:
        """Put these units first, in this order (the order callers iterate them in)."""
        self._units = {**{n: self._units[n] for n in names}, **self._units}

    def get(self, name: str) -> U:
        """The unit called ``name``; ConfigError listing the known ones otherwise."""
        try:
            return self._units[name]
        except KeyError:
            known = ", ".join(sorted(self._units)) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r} (known: {known})") from None

    def check(self, name: str, checkers: Mapping[str, Checker] | None = None) -> None:
        """Every requirement of unit ``name`` met, or ConfigError saying the first that is not.
        ``checkers``: requirement kind -> check, for kinds this package cannot check."""
        cls = self.get(name)
        checks: dict[str, Checker] = {"module": _module_missing, **(checkers or {})}
        for r in cls.REQUIRES:
            check = checks.get(r.kind)
            if check is None:
                raise AssertionError(f"{self.kind} {name}: no check for requirement kind {r.kind!r}")
            why = check(r)
            if why:
                raise ConfigError(f"{self.kind} {name} cannot run: {why}{'; ' + r.why if r.why else ''}")

    def __contains__(self, name: object) -> bool:
        return name in self._units

    def __iter__(self) -> Iterator[str]:
        return iter(self._units)

    def __len__(self) -> int:
        return len(self._units)

    def items(self) -> list[tuple[str, U]]:
        return list(self._units.items())


def load_units(package: str, path: Iterable[str]) -> None:
    """Import every module of a unit package: each registers its unit (one new file is one
    new unit, nothing else to edit; Telegraf's ``all/`` imports, made at run time)."""
    for m in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{m.name}")
