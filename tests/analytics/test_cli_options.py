"""Each recommend command's options are its recommender's option table (issue 31): every
entry is an option of the command, with the table's bounds and default; nothing restated."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.recommend import RECOMMENDERS


@pytest.mark.parametrize("kind", sorted(RECOMMENDERS))
def test_every_table_entry_is_an_option_with_its_default_and_bounds(kind: str) -> None:
    cmd = cli.commands["recommend"].commands[kind.replace("_", "-")]
    params = {p.name: p for p in cmd.params}
    table = RECOMMENDERS.get(kind).OPTIONS
    assert set(table) <= set(params)
    for name, opt in table.items():
        p = params[name]
        if opt.kind in ("int", "float") and not p.required and opt.default:
            assert p.default == opt.default, name
        if opt.kind in ("int", "float") and (opt.lo is not None or opt.hi is not None):
            assert isinstance(p.type, (click.IntRange, click.FloatRange)), name
            assert (p.type.min, p.type.max) == (opt.lo, opt.hi), name
        if opt.choices:
            assert list(p.type.choices) == list(opt.choices), name
    assert set(params) - set(table) <= {"db", "as_json_"}


def test_a_bound_from_the_table_is_enforced_on_the_command_line() -> None:
    r = CliRunner().invoke(cli, ["recommend", "data-workers", "--knee", "1.5", "--consumer-ms", "10",
                                 "--worker-ms", "40"])
    assert r.exit_code == 2 and "--knee" in r.output and "0<=x<=1" in r.output
