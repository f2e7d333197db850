"""Each recommend command's options are its recommender's option table (issue 31): every
entry is an option of the command, with the table's bounds and default; nothing restated."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cmdare.analytics import api
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


@pytest.mark.parametrize("kind", sorted(api.PREDICTIONS))
def test_every_prediction_option_comes_from_its_table_and_the_api_takes_the_same_names(kind: str, tmp_path) -> None:
    cmd = cli.commands["predict"].commands[kind]
    params = {p.name: p for p in cmd.params}
    table = api.PREDICTIONS[kind]
    assert set(table) <= set(params) and set(params) - set(table) <= {"db", "as_json_"}
    for name, opt in table.items():
        if opt.kind in ("int", "float") and (opt.lo is not None or opt.hi is not None):
            assert (params[name].type.min, params[name].type.max) == (opt.lo, opt.hi), name
    # the HTTP resource takes the same names (cluster's gpu_type and workers travel inside
    # gpus, TYPE:COUNT, as the CLI sends them)
    from cmdare.analytics.db import Database
    from cmdare.analytics.server.http import create_app

    spec = create_app(Database(tmp_path / "x.duckdb")).openapi()
    names = {p["name"] for p in spec["paths"][f"/api/v1/predictions/{kind}"]["get"]["parameters"]}
    assert names == set(table) - ({"gpu_type", "workers"} if kind == "cluster" else set()), names


def test_a_prediction_bound_is_enforced_on_the_command_line() -> None:
    r = CliRunner().invoke(cli, ["predict", "cluster", "--gpus", "k80:2", "--ps", "5000", "--from-job", "j"])
    assert r.exit_code == 2 and "--ps" in r.output and "1<=x<=4096" in r.output


# -- the recommend commands are made from the units (issue 67: the registry is the only list) ---


@pytest.mark.parametrize("kind", sorted(RECOMMENDERS))
def test_each_recommend_commands_help_is_its_units_docstring(kind: str) -> None:
    import inspect

    cmd = cli.commands["recommend"].commands[kind.replace("_", "-")]
    assert cmd.help == inspect.cleandoc(RECOMMENDERS.get(kind).__doc__)


def test_a_new_recommender_gets_its_command_with_no_cli_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit registered with its OPTIONS, DATABASE, NEEDS and TERMINAL is a command with
    those flags, that help, that database rule and that check; nothing in the CLI names it."""
    from cmdare.analytics.cli import recommend as rc
    from cmdare.analytics.units import Recommendation, Recommender
    from cmdare.wire.plugin import Option

    class Spare(Recommender):
        """Spare capacity: how many GPUs sit unused.

        \b
        Example:
          analyze recommend spare --gpus 8
        """

        name = "spare"
        DATABASE = "job"
        NEEDS = {"price": "gpus"}
        TERMINAL = {"gpus": {"metavar": "N"}}
        OPTIONS = {"gpus": Option("int", 0, "GPUs in the pool", lo=0), "price": Option("float", 0.0, "$/GPU-hour"),
                   "job": Option("str", "", "a job in the database")}

        def run(self, con, scope):
            return [Recommendation("spare", {"gpus": self.options["gpus"]}, {}, f"db={con is not None}")]

    monkeypatch.setitem(RECOMMENDERS._units, "spare", Spare)
    group = cli.commands["recommend"]
    monkeypatch.setattr(group, "commands", dict(group.commands))
    rc._command(Spare)
    r = CliRunner().invoke(cli, ["recommend", "spare", "--help"])
    assert r.exit_code == 0 and "Spare capacity" in r.stdout and "--gpus N" in r.stdout and "--db" in r.stdout
    r = CliRunner().invoke(cli, ["recommend", "spare", "--gpus", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert '"gpus": 3' in r.stdout and "db=False" in r.stdout  # DATABASE "job": no database without --job
    r = CliRunner().invoke(cli, ["recommend", "spare", "--price", "2"])
    assert r.exit_code == 2 and "--price needs --gpus" in r.output
    r = CliRunner().invoke(cli, ["recommend", "spare", "--gpus", "-1"])
    assert r.exit_code == 2 and "--gpus" in r.output  # the table's bound
