"""The rule file format (Prometheus's shape; docs/alerts.md): parsing and checking, with
every input bounded. A rule file is hostile until checked: its size, its YAML nesting and
alias expansion are capped before anything is built from it, every value's type is
checked, and an error is one line quoting at most a short excerpt of what was given."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmdare.wire.units import duration_seconds

from ..db import AnalyticsError, read_text_file

DEFAULT_INTERVAL = 15.0
DEFAULT_WINDOW = 900.0
SEVERITIES = ("info", "warning", "critical")
FINDING_LABELS = ("kind", "job", "node", "rank", "subject", "severity")
FINDING_FILTERS = ("job", "node", "min_severity", "min_confidence")
# bounds on a rule (or rule test) file
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_NODES = 100_000  # YAML nodes after alias expansion (a "billion laughs" file is refused)
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_RULES = 2_000
MAX_DURATION = 30 * 86400.0
MAX_TEXT = 4096  # a label or annotation template
_RULE_KEYS = {"alert", "expr", "finding", "filters", "window", "for", "keep_firing_for", "labels", "annotations",
              "inhibit_on_revocation"}
_GROUP_KEYS = {"name", "interval", "rules"}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
T_LABEL = re.compile(r"^\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*$")
T_VALUE = re.compile(r"^\s*\$value\s*$")
# one conversion of the value, width and precision at most two digits ("%%" converts nothing)
T_PRINTF = re.compile(r'^\s*printf\s+"(%[-+ 0#]*\d{0,2}(?:\.\d{1,2})?[dfeEgGs])"\s+\$value\s*$')
T_SUMMARY = re.compile(r"^\s*\$summary\s*$")


class RuleError(AnalyticsError):
    """A rule file that cannot be used: one line naming the file, group, rule and problem."""


def short(v: Any, n: int = 40) -> str:
    """At most ``n`` characters of ``repr(v)``: what an error may quote of the input."""
    try:
        text = repr(v) if not isinstance(v, (dict, list)) else _shallow(v)
    except Exception:  # a hostile object's repr
        text = f"<{type(v).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _shallow(v: Any) -> str:
    """A container's repr without walking it (an alias bomb has billions of leaves)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: ..." for k in list(v)[:3]) + (", ..." if len(v) > 3 else "") + "}"
    return f"[a list of {len(v)}]"


@dataclass
class Rule:
    name: str
    group: str
    file: str
    expr: str | None = None
    finding: str | None = None
    filters: dict[str, Any] = field(default_factory=dict)
    window: float = DEFAULT_WINDOW
    for_: float = 0.0
    keep_firing_for: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    inhibit_on_revocation: bool = False

    @property
    def id(self) -> str:
        return f"{self.group}/{self.name}"

    def where(self) -> str:
        return f"{self.file}: group {self.group!r}: rule {self.name!r}"


@dataclass
class Group:
    name: str
    file: str
    interval: float
    rules: list[Rule]


# -- reading ---------------------------------------------------------------------------------
def resolve_paths(given: Iterable[str | Path]) -> list[Path]:
    """``default`` names the shipped pack (analytics/rules/cmdare.yml)."""
    from importlib import resources

    return [Path(str(resources.files("cmdare.analytics") / "rules" / "cmdare.yml")) if str(g) == "default"
            else Path(g) for g in given]


def read_files(paths: Iterable[str | Path]) -> list[tuple[str, str]]:
    """(name, text) of each rule file (``default``: the shipped pack), each at most
    MAX_FILE_BYTES."""
    out = []
    for path in resolve_paths(paths):
        out.append((str(path), read_text(path)))
    return out


def read_text(path: Path, limit: int = MAX_FILE_BYTES, what: str = "a rule file", where: str = "") -> str:
    """A text file of at most ``limit`` bytes; RuleError (``where``: what the error starts
    with, default the path) that never quotes the file's content."""
    return read_text_file(path, limit, what, where, RuleError)


def parse_yaml(name: str, text: str) -> Any:
    """The YAML document in ``text``, refused (one line) past MAX_FILE_BYTES, MAX_DEPTH
    levels of nesting, MAX_NODES nodes once aliases are expanded, or a recursive alias:
    checked on the composed node graph, before any object is built."""
    import yaml

    if len(text) > MAX_FILE_BYTES:
        raise RuleError(f"{name}: larger than {MAX_FILE_BYTES >> 20} MiB: not a rule file")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise RuleError(f"{name}: nested more than {MAX_DEPTH} levels deep") from None
        if node is None:
            return None
        _bound(name, node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RuleError(f"{name}: not valid YAML{at}: {short(problem, 80)[1:-1]}") from None
    finally:
        loader.dispose()


def _bound(name: str, root: Any) -> None:
    import yaml

    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise RuleError(f"{name}: nested more than {MAX_DEPTH} levels deep")
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise RuleError(f"{name}: an alias refers to itself (a recursive structure)")
        if isinstance(node, yaml.ScalarNode):
            return 1
        open_.add(key)
        children = [x for kv in node.value for x in kv] if isinstance(node, yaml.MappingNode) else node.value
        n = 1
        for c in children:
            n += size(c, depth + 1)
            if n > MAX_NODES:
                raise RuleError(f"{name}: more than {MAX_NODES:,} values once its aliases are expanded")
        open_.discard(key)
        sizes[key] = n
        return n

    size(root, 0)


# -- checking ----------------------------------------------------------------------------------
def load_files(paths: Iterable[str | Path]) -> list[Group]:
    """Parse and check the files' structure (not yet against a database: ``validate``)."""
    return load_texts(read_files(paths))


def load_texts(files: Iterable[tuple[str, str]]) -> list[Group]:
    """``load_files`` on (name, text) pairs: what the HTTP API is sent."""
    groups: list[Group] = []
    seen: dict[str, str] = {}
    for path, text in files:
        path = short(str(path), 200)[1:-1]
        tree = parse_yaml(path, text)
        if tree is None:
            continue
        if not isinstance(tree, dict) or set(map(str, tree)) - {"groups"}:
            raise RuleError(f"{path}: expected a mapping with one key, groups")
        gl = tree.get("groups") or []
        if not isinstance(gl, list):
            raise RuleError(f"{path}: groups must be a list, not {short(gl)}")
        for i, g in enumerate(gl):
            groups.append(_group(path, i, g, seen))
    if sum(len(g.rules) for g in groups) > MAX_RULES:
        raise RuleError(f"more than {MAX_RULES} rules: split them over collectors")
    return groups


def _unknown(where: str, given: Any, known: set[str] | tuple[str, ...]) -> None:
    extra = sorted(short(k) if not isinstance(k, str) else repr(k[:40]) for k in given if k not in known)
    if extra:
        raise RuleError(f"{where}: unknown key {extra[0]} (known: {', '.join(sorted(known))})")


def _group(file: str, i: int, g: Any, seen: dict[str, str]) -> Group:
    if not isinstance(g, dict):
        raise RuleError(f"{file}: group {i + 1}: expected a mapping with name, interval, rules, not {short(g)}")
    name = g.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise RuleError(f"{file}: group {i + 1}: needs a name (text of at most 200 characters)")
    where = f"{file}: group {short(name, 60)}"
    _unknown(where, g, _GROUP_KEYS)
    if name in seen:
        raise RuleError(f"{where}: a group of this name is already in {seen[name]}")
    seen[name] = file
    interval = duration(where, "interval", g.get("interval", DEFAULT_INTERVAL))
    if interval < 1:
        raise RuleError(f"{where}: interval must be at least 1s")
    rules_raw = g.get("rules") or []
    if not isinstance(rules_raw, list):
        raise RuleError(f"{where}: rules must be a list, not {short(rules_raw)}")
    rules: list[Rule] = []
    names: set[str] = set()
    for j, r in enumerate(rules_raw):
        rule = _rule(file, name, j, r)
        if rule.name in names:
            raise RuleError(f"{rule.where()}: two rules of this name in the group")
        names.add(rule.name)
        rules.append(rule)
    return Group(name, file, interval, rules)


def duration(where: str, key: str, v: Any) -> float:
    """Seconds from ``10s`` / ``5m`` / a number: finite, 0 to 30 days."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise RuleError(f"{where}: {key}: expected a duration like 10s, got {short(v)}")
    s = float(v) if isinstance(v, (int, float)) else duration_seconds(v[:64])
    if s is None or not math.isfinite(s) or s < 0 or s > MAX_DURATION:
        raise RuleError(f"{where}: {key}: expected a duration like 500ms, 10s, 5m or 24h (at most 30d), "
                        f"got {short(v)}")
    return s


def _strings(where: str, key: str, v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RuleError(f"{where}: {key} must be a mapping, not {short(v)}")
    out = {}
    for k, x in v.items():
        if not (isinstance(k, str) and _LABEL.match(k)):
            raise RuleError(f"{where}: {key}: {short(k)} is not a valid label name")
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise RuleError(f"{where}: {key}.{k} must be a string, not {short(x)}")
        if len(str(x)) > MAX_TEXT:
            raise RuleError(f"{where}: {key}.{k}: longer than {MAX_TEXT} characters")
        out[k] = str(x)
    return out


def _rule(file: str, group: str, j: int, r: Any) -> Rule:
    if not isinstance(r, dict):
        raise RuleError(f"{file}: group {group!r}: rule {j + 1}: expected a mapping, not {short(r)}")
    name = r.get("alert")
    if not isinstance(name, str) or not _LABEL.match(name) or len(name) > 200:
        raise RuleError(f"{file}: group {group!r}: rule {j + 1}: alert must be a name (letters, digits, _)")
    rule = Rule(name, group, file)
    where = rule.where()
    _unknown(where, r, _RULE_KEYS)
    if ("expr" in r) == ("finding" in r):
        raise RuleError(f"{where}: give exactly one of expr (SQL) or finding (a detector's name)")
    if "expr" in r:
        if not isinstance(r["expr"], str) or not r["expr"].strip():
            raise RuleError(f"{where}: expr must be a SELECT statement, not {short(r['expr'])}")
        if len(r["expr"]) > 100_000:
            raise RuleError(f"{where}: expr longer than 100,000 characters")
        rule.expr = r["expr"].strip().rstrip(";")
        if "filters" in r or "window" in r:
            raise RuleError(f"{where}: filters and window apply to finding rules only")
    else:
        from ..detectors import DETECTORS

        kind = r["finding"]
        if not isinstance(kind, str) or kind not in DETECTORS:
            raise RuleError(f"{where}: finding {short(kind)} is not a detector (known: {', '.join(sorted(DETECTORS))})")
        rule.finding = kind
        f = r.get("filters") or {}
        if not isinstance(f, dict):
            raise RuleError(f"{where}: filters must be a mapping, not {short(f)}")
        _unknown(f"{where}: filters", f, FINDING_FILTERS)
        for k in ("job", "node"):
            if k in f and not (isinstance(f[k], str) and 0 < len(f[k]) <= 200):
                raise RuleError(f"{where}: filters.{k} must be a name, not {short(f[k])}")
        if "min_severity" in f and f["min_severity"] not in SEVERITIES:
            raise RuleError(f"{where}: filters.min_severity must be one of {', '.join(SEVERITIES)}")
        if "min_confidence" in f:
            c = f["min_confidence"]
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1:
                raise RuleError(f"{where}: filters.min_confidence must be a number from 0 to 1")
        rule.filters = dict(f)
        rule.window = duration(where, "window", r.get("window", DEFAULT_WINDOW))
        if rule.window <= 0:
            raise RuleError(f"{where}: window must be positive")
    rule.for_ = duration(where, "for", r.get("for", 0))
    rule.keep_firing_for = duration(where, "keep_firing_for", r.get("keep_firing_for", 0))
    rule.labels = _strings(where, "labels", r.get("labels"))
    rule.annotations = _strings(where, "annotations", r.get("annotations"))
    inh = r.get("inhibit_on_revocation", False)
    if not isinstance(inh, bool):
        raise RuleError(f"{where}: inhibit_on_revocation must be true or false")
    rule.inhibit_on_revocation = inh
    for k, text in {**rule.labels, **rule.annotations}.items():
        for m in TEMPLATE.finditer(text):
            body = m.group(1)
            if not (T_LABEL.match(body) or T_VALUE.match(body) or T_PRINTF.match(body)
                    or (T_SUMMARY.match(body) and rule.finding)):
                raise RuleError(f"{where}: {k}: unsupported template {short('{{' + body + '}}')} "
                                "(use {{ $labels.NAME }}, {{ $value }} or {{ printf \"%.2f\" $value }})")
    return rule
