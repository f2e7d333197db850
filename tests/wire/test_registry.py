"""The event type registry (wire/registry.py): one declaration per type, each name once."""

from __future__ import annotations

import ast
from pathlib import Path

from cmdare.wire import registry


def _declared(source: str) -> list[str]:
    """The names of the ``EventType(...)`` declarations in ``source``, in order."""
    return [c.args[0].value for c in ast.walk(ast.parse(source))
            if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "EventType"
            and c.args and isinstance(c.args[0], ast.Constant)]


def test_each_event_type_is_declared_once_and_every_declaration_is_a_type() -> None:
    """TYPES is built by name: a second declaration of a name would silently replace the
    first (its table and fields gone from the collector and the schema)."""
    names = _declared(Path(registry.__file__).read_text())
    assert len(names) == len(set(names)) == len(registry.TYPES) and names == list(registry.TYPES)


def test_the_declaration_check_sees_a_repeated_name() -> None:
    src = 'T = {t.name: t for t in (EventType("gpu", "a", fields={}), EventType("gpu", "b", fields={}))}'
    names = _declared(src)
    assert names == ["gpu", "gpu"] and len(set(names)) != len(names)
