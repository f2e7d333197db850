"""The 1-minute and 5-minute rollups per GPU, per host and per (job, rank) (collector/rollup.py):
each equals the same aggregation over every raw row, before a run (the views), after it
(the tables) and after late rows, re-deliveries and a rank moving node; retention deletes
raw samples only behind their rollups and never changes a rollup row it cannot rebuild."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import duckdb
import pytest

from cmdare.collector import rollup
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.columns import encode
from cmdare.wire.events import EventFactory

T0 = 1.75e9 + 17  # not on a minute boundary


def _depth(i: int) -> dict:
    """GPU 1's GPU-depth fields (GPM activity, counters): GPU 0 has none, as an older GPU."""
    return {"gr_engine_active_ratio": (i * 3 % 10) / 10, "sm_active_ratio": (i * 5 % 10) / 10,
            "tensor_active_ratio": (i % 4) / 4, "fp32_active_ratio": (i % 3) / 3, "dram_active_ratio": (i % 6) / 6,
            "energy_joules_total": 1000.0 + 300 * i, "nvlink_errors_total": i // 7, "mig_slice_ratio": 1 / 7,
            "parent_index": 0}


def gpu(node: str, start: float, n: int, every: float = 10.0, rows: bool = False) -> bytes:
    f = EventFactory(node, "worker", "job-1", {}, rows=rows)
    return b"".join(
        f.line("gpu", {"index": g, "uuid": f"GPU-{node}-{g}", "name": "A100", "util_gpu_ratio": (i * 7 % 10) / 10,
                       "temp_celsius": 50.0 + i % 9, "power_watts": 200.0 + g + i % 3,
                       "throttle_mask": 4 if i % 5 == 0 else 1 if i % 7 == 0 else 0,
                       "mem_used_bytes": (1 << 30) + 4096 * i + g, **(_depth(i) if g else {})}, start + every * i)
        for i in range(n) for g in range(2))


def host(node: str, start: float, n: int, every: float = 10.0, rows: bool = False) -> bytes:
    f = EventFactory(node, "worker", "job-1", {}, rows=rows)
    return b"".join(
        f.line("host", {"cpu_util_ratio": (i * 3 % 11) / 10, "load1": 1.0 + i % 4, "mem_total_bytes": 1 << 34,
                        "mem_used_bytes": (1 << 32) + 1000 * i,
                        "net": [{"nic": "eth0", "rx_bytes_total": 10**9 + 7_000_000 * i, "tx_bytes_total": 3_000 * i},
                                {"nic": "ib0", "rx_bytes_total": 5_000_000 * i * i, "tx_bytes_total": 11 * i}],
                        "disk": [{"disk": "nvme0n1", "read_bytes_total": 9_000_000 * i,
                                  "write_bytes_total": 2**40 + 13 * i}]} if i % 7 else
               {"cpu_util_ratio": 0.5, "mem_used_bytes": 1 << 32}, start + every * i)  # (some samples without)
        for i in range(n))


def steps(node: str, rank: int, start: float, n: int, every: float = 10.0, slow: float = 1.0,
          rows: bool = False, job: str = "job-1") -> bytes:
    f = EventFactory(node, "worker", job, {}, rows=rows)
    out = []
    for i in range(n):
        k = 0 if i % 11 == 3 else 5 + i % 3  # some intervals without a step
        t = (0.2 + 0.01 * (i % 6)) * slow
        out.append(f.line("train_steps", {
            "run": "r1", "rank": rank, "interval_seconds": every, "steps": k, "first_step": 10 * i,
            "last_step": 10 * i + k, "examples": 32.0 * k, "step_mean_seconds": t if k else None,
            "wait_mean_seconds": (0.02 * (i % 4)) if k and i % 6 else None,
            "steps_per_second": (k / (t * k)) if k and i % 2 else None}, start + every * i))
    return b"".join(out)


def raw(con: duckdb.DuckDBPyConnection, r: rollup.Rollup) -> list[tuple]:
    return norm(con.execute(f"{r.from_raw()} GROUP BY ALL").fetchall())


def norm(rows: list[tuple]) -> list[tuple]:
    """Sorted, floats to 9 significant digits (sums of partial sums differ in the last bits)."""
    def v(x: object) -> object:
        if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x):
            return float(f"{x:.9g}")  # a sum of integers is an integer raw, a DOUBLE rolled
        return x
    return sorted((tuple(v(x) for x in row) for row in rows), key=repr)


def cols(con: duckdb.DuckDBPyConnection, r: rollup.Rollup, source: str) -> list[tuple]:
    names = ", ".join(f'"{c}"' for c in ("bucket", *(k for k, _ in r.key), *(c for c, *_ in r.columns)))
    return norm(con.execute(f"SELECT {names} FROM {source}").fetchall())


def check_all(con: duckdb.DuckDBPyConnection, tables: bool) -> None:
    for r in rollup.ROLLUPS:
        want = raw(con, r)
        assert want, r.view
        assert cols(con, r, r.view) == want, r.view
        if tables:
            assert cols(con, r, r.table) == want, r.table


@pytest.fixture()
def con(tmp_path: Path):
    c = connect(tmp_path / "w.duckdb")
    yield c
    c.close()


def test_every_rollup_equals_the_raw_rows_on_every_write_path_late_rows_and_redelivery(con) -> None:
    w = Writer(con, max_skew=None, rollup_every=None)
    first = gpu("a", T0, 50) + host("a", T0, 50) + steps("a", 0, T0, 50)
    w.write([("j", first)])  # JSON lines
    w.write([("r", gpu("b", T0 + 5, 50, rows=True) + host("b", T0 + 5, 50, rows=True)
              + steps("b", 1, T0 + 5, 50, slow=2.0, rows=True))])  # row lines
    w.write([("c", encode(gpu("c", T0 + 7, 50, rows=True) + host("c", T0 + 7, 50, rows=True)
                          + steps("c", 2, T0 + 7, 50, rows=True)))])  # column blocks
    pending = {s for (s,) in con.execute("SELECT DISTINCT src FROM rollup_dirty").fetchall()}
    assert pending == {"gpu_samples", "host_samples", "steps"}
    check_all(con, tables=False)  # exact before any run
    written = rollup.run(con)
    assert set(written) == set(rollup.TABLES) and all(written.values())
    check_all(con, tables=True)
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
    # late rows into rolled buckets, and the same events again (stored once, nothing pending)
    assert w.write([("j", first)]).inserted == 0
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
    w.write([("late", gpu("a", T0 + 3, 4, every=37) + host("c", T0 + 2, 3, every=71) + steps("a", 0, T0 + 1, 3, every=97))])
    check_all(con, tables=False)
    rollup.run(con)
    check_all(con, tables=True)


def test_a_rank_that_moves_node_inside_a_bucket_has_a_row_per_node_and_the_medians_stay_exact(con) -> None:
    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", steps("a", 3, T0, 12) + steps("b", 3, T0 + 125, 12, slow=3.0))])  # rank 3 restarted on b
    rollup.run(con)
    check_all_steps = [r for r in rollup.ROLLUPS if r.source == "steps"]
    for r in check_all_steps:
        assert cols(con, r, r.table) == raw(con, r)
    nodes = con.execute("SELECT count(DISTINCT node) FROM step_rollup_5m WHERE rank = 3").fetchone()
    assert nodes == (2,)


def test_five_minute_rows_combined_from_minutes_equal_those_from_the_raw_rows(con) -> None:
    """gpu_5m and host_5m are built from the 1-minute rows: a wrong combining aggregate (a
    sum of maxima, a count of counts) differs from the raw aggregation."""
    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", gpu("a", T0, 90, every=7.3) + host("a", T0, 90, every=7.3))])
    rollup.run(con)
    for view in ("gpu_5m", "host_5m"):
        r = rollup.BY_VIEW[view]
        assert r.finer is not None
        assert cols(con, r, r.table) == raw(con, r)


def at(x: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(x, dt.timezone.utc).replace(tzinfo=None)


def test_retention_deletes_raw_samples_behind_their_rollups_and_keeps_the_rollup_rows(con) -> None:
    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", gpu("a", T0, 180) + host("a", T0, 180) + steps("a", 0, T0, 180))])  # 30 minutes
    before = {r.table: cols(con, r, r.view) for r in rollup.ROLLUPS}  # nothing rolled yet: views from raw
    newest = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]
    out = rollup.retain(con, 900, None)  # keep the last 15 minutes (whole 5-minute windows)
    floor = rollup._floor(newest - dt.timedelta(seconds=900))
    assert at(T0 + 600) < floor < at(T0 + 1200)
    assert out["gpu_samples"] > 0 and out["host_samples"] > 0
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE ts < ?", [floor]).fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE ts >= ?", [floor]).fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM steps WHERE ts < ?", [floor]).fetchone()[0] > 0  # steps are kept
    for r in rollup.ROLLUPS:  # every rollup row is still there, the same
        assert cols(con, r, r.table) == before[r.table], r.table
        assert cols(con, r, r.view) == before[r.table], r.view
    # a late sample before the horizon: stored, but its (already rolled) bucket is not rebuilt
    # from the few raw rows left; after the horizon: rebuilt as usual
    w.write([("late", gpu("a", T0 + 1, 1) + gpu("a", T0 + 1201, 1))])
    g5 = rollup.BY_VIEW["gpu_5m"]
    old = [row for row in before["gpu_rollup_5m"] if row[0] < floor]
    assert [row for row in cols(con, g5, "gpu_5m") if row[0] < floor] == old
    rollup.run(con)
    assert [row for row in cols(con, g5, g5.table) if row[0] < floor] == old
    newer = [row for row in cols(con, g5, g5.table) if row[0] >= floor]
    assert newer == [row for row in raw(con, g5) if row[0] >= floor]
    # rollups past their own retention go, whole buckets only
    newest = con.execute("SELECT max(bucket) FROM gpu_rollup_5m").fetchone()[0]
    out = rollup.retain(con, None, 1500)
    assert out["gpu_rollup_5m"] > 0
    assert con.execute("SELECT min(bucket) FROM gpu_rollup_5m").fetchone() == (newest - dt.timedelta(seconds=1500),)


def test_retention_rolls_up_what_is_pending_before_deleting(con) -> None:
    """A deliberate retain() that skips run() would drop samples no rollup row holds."""
    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", gpu("a", T0, 120))])
    want = raw(con, rollup.BY_VIEW["gpu_5m"])
    rollup.retain(con, 0, None)  # every sample before the newest one's 5-minute window
    left = con.execute("SELECT count(*), min(ts) FROM gpu_samples").fetchone()
    assert 0 < left[0] < 240 and left[1] >= rollup._floor(at(T0 + 1190))  # only the newest window's
    con.execute("DELETE FROM gpu_samples_packed")  # the table GPU samples are stored in
    assert cols(con, rollup.BY_VIEW["gpu_5m"], "gpu_5m") == want
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)


def test_the_collector_keeps_raw_samples_for_retain_raw_and_their_rollups_stay(tmp_path: Path) -> None:
    """``cmdare-collector spool --retain-raw 1h``: a 3-hour recording keeps its last hour of
    samples (relative to the newest, not the clock: the recording is from 2025) and every
    5-minute row; the default (7 days) deletes nothing of it; bad values are one line."""
    from click.testing import CliRunner

    from cmdare.collector.cli import cli as collector
    from cmdare.wire.spool import seg_name

    d = tmp_path / "spool"
    d.mkdir()
    (d / seg_name(1)).write_bytes(gpu("a", T0, 1080) + host("a", T0, 1080))  # 3 hours at 10 s
    # 1 hour before the newest, down to 5 minutes: 360-390 ticks of 2 GPUs
    for args, kept in ((["--retain-raw", "1h"], range(720, 781)), ([], range(2160, 2161))):
        db = tmp_path / f"r{len(args)}.duckdb"
        r = CliRunner().invoke(collector, ["spool", str(d), "--db", str(db), "--max-clock-skew", "off", *args])
        assert r.exit_code == 0, r.output
        con = connect(db)
        n = con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
        assert n in kept, (args, n)
        assert con.execute("SELECT sum(samples) FROM gpu_5m").fetchone() == (2160,)  # every sample, rolled
        assert con.execute("SELECT sum(samples) FROM host_1m").fetchone() == (1080,)
        con.close()
    for bad, says in ((["--retain-raw", "1m"], "under 300 s"), (["--retain-rollups", "soon"], "--retain-rollups"),
                      (["--retain-raw", "7d", "--lake", str(tmp_path / "lk")], "cmdare-collector maintain")):
        r = CliRunner().invoke(collector, ["spool", str(d), "--db", str(tmp_path / "x.duckdb"), *bad])
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "x.duckdb").exists()


@pytest.mark.parametrize("every", [300.0, 600.0, 120.0])
def test_every_reads_the_rollups_where_retention_deleted_the_raw_samples(con, every: float) -> None:
    """Issue 51: after retention analyze gpu --every 5m showed 1 bucket where gpu_5m held 7.
    Every bucket that starts before the retention horizon comes from the rollups, whole, with
    the same figures the raw samples gave before they were deleted."""
    from cmdare.analytics import queries

    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", gpu("a", T0, 180) + host("a", T0, 180))])  # 30 minutes
    before_g = queries.gpu(con, every=every)
    before_h = queries.host(con, every=every)
    rollup.retain(con, 900, None)  # raw rows of the first 15 minutes or so are gone
    assert con.execute("SELECT min(ts) FROM gpu_samples").fetchone()[0] > at(T0 + 600)
    after_g = queries.gpu(con, every=every)
    after_h = queries.host(con, every=every)
    c = before_g[0]
    assert after_g[0] == c and after_h[0] == before_h[0]
    key = [c.index(k) for k in ("bucket", "node", "gpu", "samples", "util_pct", "util_max_pct", "power_w",
                                "temp_max_c", "throttled_pct", "mem_used_gib")]
    assert [[r[i] for i in key] for r in after_g[1]] == [[r[i] for i in key] for r in before_g[1]]
    hk = [before_h[0].index(k) for k in ("bucket", "node", "samples", "cpu_pct", "cpu_max_pct", "mem_used_gib")]
    assert [[r[i] for i in hk] for r in after_h[1]] == [[r[i] for i in hk] for r in before_h[1]]
    assert all(len(r[0]) == 19 for r in after_g[1])  # bucket times whole: YYYY-MM-DD HH:MM:SS


def test_host_network_and_disk_rates_read_the_same_after_retention(tmp_path) -> None:
    """Issue 66: after --retain-raw, `analyze host --every 5m` lost network and disk (the
    host rollups kept no such columns): 897.9 MB/s became blank. The rollups keep each
    bucket's counters at its first and last sample: the rates read the same."""
    from click.testing import CliRunner

    from cmdare.analytics.cli import cli
    from cmdare.collector.db import connect

    db = tmp_path / "h.duckdb"
    c = connect(db)
    w = Writer(c, max_skew=None, rollup_every=None)
    w.write([("m", host("a", T0, 180) + host("b", T0 + 3, 180, every=7.0))])  # 30 minutes
    c.close()

    def table() -> list[dict]:
        r = CliRunner().invoke(cli, ["host", "--every", "5m", "--since", "2000d", "--json", "--db", str(db)])
        assert r.exit_code == 0, r.output
        import json

        return json.loads(r.output)

    before = table()
    assert len(before) == 12 and all(x["net_rx_mb_s"] and x["disk_read_mb_s"] for x in before)
    c = connect(db)
    rollup.run(c)
    out = rollup.retain(c, 600, None)  # the raw host samples of the first 20 minutes go
    assert out["host_samples"] > 0
    c.close()
    after = table()
    assert len(after) == len(before)
    for x, y in zip(before, after, strict=True):
        for k in ("net_rx_mb_s", "net_tx_mb_s", "disk_read_mb_s", "disk_write_mb_s"):
            assert y[k] == x[k] or abs(y[k] - x[k]) <= 0.0015, (x["bucket"], k, x[k], y[k])


def test_hostile_counters_cost_their_own_bucket_never_the_rollup_run(con) -> None:
    """A broken agent's network list (negative, text, 1e30, 2^70, not a list): the rollup run
    that rebuilds every node's buckets still runs; those counters are empty, others exact."""
    f = EventFactory("n", "worker", "j", {})
    bad = [[{"nic": "a", "rx_bytes_total": -5}], [{"nic": "a", "rx_bytes_total": "abc"}],
           [{"nic": "a", "rx_bytes_total": 1e30}], [{"nic": "a", "rx_bytes_total": 2**70}], {"nic": "a"}, "junk"]
    lines = [f.line("host", {"cpu_util_ratio": 0.5, "net": b}, T0 + 10 * i) for i, b in enumerate(bad)]
    lines += [f.line("host", {"cpu_util_ratio": 0.5, "net": [{"nic": "a", "rx_bytes_total": 100 + k}]}, T0 + 600 + k)
              for k in range(2)]
    Writer(con, max_skew=None, rollup_every=None).write([("x", b"".join(lines))])
    assert rollup.run(con)["host_rollup_5m"] >= 2
    rows = con.execute("SELECT net_rx_first, net_rx_last FROM host_rollup_5m ORDER BY bucket").fetchall()
    assert rows[0] == (None, None) and rows[-1] == (100.0, 101.0)


@pytest.mark.parametrize("kind", ["gpu", "host"])
def test_a_label_filter_holds_in_buckets_read_from_the_rollups(con, kind: str) -> None:
    """Issue 67: the --label filter was dropped for buckets before the retention horizon, so
    another team's node appeared there."""
    from cmdare.analytics import queries

    w = Writer(con, max_skew=None, rollup_every=None)
    tag = [EventFactory(n, "worker", "job-1", {"team": t}).line("heartbeat", {"seq": 1}, T0 + 1795)
           for n, t in (("a", "red"), ("b", "blue"))]
    w.write([("m", gpu("a", T0, 180) + gpu("b", T0, 180) + host("a", T0, 180) + host("b", T0, 180) + b"".join(tag))])
    rollup.retain(con, 900, None)  # the first buckets are now read from the rollups
    read = queries.gpu if kind == "gpu" else queries.host
    cols, rows = read(con, every=300.0, label=("team", "red"))
    nodes = {r[cols.index("node")] for r in rows}
    early = {r[cols.index("node")] for r in rows if r[0] < at(T0 + 600).strftime("%Y-%m-%d %H:%M:%S")}
    assert nodes == {"a"} and early == {"a"}, (nodes, early)
