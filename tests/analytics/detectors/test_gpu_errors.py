from __future__ import annotations

from .conftest import found


def test_xid_and_ecc_bursts_with_the_job_they_hit(fleet) -> None:
    def build(s):
        s.sim_job(kind="xid", xids=((0.2, 79), (0.21, 79), (0.7, 13)))
        s.sim_job(kind="app", xids=((0.5, 43),))  # an application fault: ignored by default
        s.sim_job(kind="ecc", ecc_corrected=300)
        s.sim_job(kind="fewecc", ecc_corrected=20)

    con, _ = fleet(build)
    f = found(con, "gpu_errors")
    assert set(f) == {"sim-xid-1", "sim-ecc-3"}
    x = f["sim-xid-1"][0]
    assert x.severity == "critical" and x.node == "sim-xid-1-n0" and x.subject == "0:GPU-sim-xid-1-n0-0"
    assert x.evidence["xid_events"] == 3 and x.evidence["xid_codes"] == "13,79" and x.evidence["bursts"] == 2
    assert "hitting job sim-xid-1" in x.summary
    e = f["sim-ecc-3"][0]
    assert e.severity == "warning" and e.evidence["ecc_corrected"] == 300
    assert set(found(con, "gpu_errors", ignore_xids=[], min_corrected="10")) == {"sim-xid-1", "sim-app-2", "sim-ecc-3", "sim-fewecc-4"}


T0 = 1.75e9 - (1.75e9 % 300)


def _utc(ts: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).replace(tzinfo=None)


def test_each_gpus_errors_are_counted_in_bursts_exactly(fleet) -> None:
    """Errors 600 s apart are one burst (burst_gap is "closer than or exactly"), 601 s two;
    corrected ECC counts from exactly min_corrected; uncorrected ECC, a lost GPU and a
    critical Xid make it critical; an ignored Xid is left out of the counts."""
    from cmdare.analytics.units import Scope
    from cmdare.wire.events import EventFactory

    def build(s):
        ej = EventFactory("e-n0", "worker", "ej")
        for ts in range(int(T0) + 60, int(T0) + 3601, 60):
            s.events.append(ej.make("train_steps", {"run": "r", "steps": 60, "steps_per_second": 1.0,
                                                   "interval_seconds": 60.0}, float(ts)))

        def ev(f, at, index, kind, count=1, xid=None, uuid=True):
            data = {"index": index, "kind": kind, "count": count}
            if uuid:
                data["uuid"] = f"GPU-{f.node}-{index}"
            if xid is not None:
                data["xid"] = xid
            s.events.append(f.make("gpu_event", data, T0 + at))

        agent = EventFactory("e-n0", "worker", "agent-n0")  # the agent's own job label: the stepping job wins
        ev(agent, 100, 0, "xid", xid=13)
        ev(agent, 700, 0, "xid", xid=13)  # 600 s later: the same burst
        ev(agent, 1301, 0, "xid", xid=31)  # 601 s later: a new one
        ev(agent, 2000, 0, "ecc_corrected", 99)
        ev(agent, 200, 1, "ecc_corrected", 60, uuid=False)
        ev(agent, 260, 1, "ecc_corrected", 40, uuid=False)
        ev(agent, 300, 2, "ecc_uncorrected", 1)
        ev(EventFactory("a-n9", "worker", "zz"), 600, 0, "lost")  # listed first (by node)
        ev(EventFactory("e-n1", "worker"), 400, 0, "lost")
        other = EventFactory("e-n2", "worker", "agent-job")
        ev(other, 500, 0, "xid", xid=43)
        ev(other, 510, 0, "xid", xid=79)

    con, _ = fleet(build)
    got = {(f.node, f.subject): f for fs in found(con, "gpu_errors").values() for f in fs}
    assert {k: (f.job, f.summary, f.severity) for k, f in got.items()} == {
        ("e-n0", "0:GPU-e-n0-0"): ("ej", "GPU 0 on e-n0: 3 Xid 13,31, 99 corrected ECC in 3 bursts, hitting job ej",
                                   "warning"),
        ("e-n0", "1"): ("ej", "GPU 1 on e-n0: 100 corrected ECC in 1 burst, hitting job ej", "warning"),
        ("e-n0", "2:GPU-e-n0-2"): ("ej", "GPU 2 on e-n0: 1 uncorrected ECC in 1 burst, hitting job ej", "critical"),
        ("e-n1", "0:GPU-e-n1-0"): (None, "GPU 0 on e-n1: fell off the bus in 1 burst (no job stepping on it)",
                                   "critical"),
        ("e-n2", "0:GPU-e-n2-0"): ("agent-job", "GPU 0 on e-n2: 1 Xid 79 in 1 burst, hitting job agent-job",
                                   "critical"),
        ("a-n9", "0:GPU-a-n9-0"): ("zz", "GPU 0 on a-n9: fell off the bus in 1 burst, hitting job zz", "critical"),
    }
    g0 = got[("e-n0", "0:GPU-e-n0-0")]
    assert g0.evidence == {"xid_events": 3, "xid_codes": "13,31", "ecc_corrected": 99, "ecc_uncorrected": 0,
                           "lost": 0, "row_remap_pending": 0, "row_remap_failed": 0, "retired_pages_pending": 0,
                           "bursts": 3}
    assert (g0.window_start, g0.window_end, g0.confidence) == (_utc(T0 + 100), _utc(T0 + 2000), 1.0)
    assert got[("e-n1", "0:GPU-e-n1-0")].evidence["lost"] == 1
    # options: a Xid made critical, corrected ECC from 101, 43 no longer ignored, a shorter gap
    opts = found(con, "gpu_errors", critical_xids=["13", "x"], min_corrected="101", ignore_xids=[" "],
                 burst_gap="599s")
    got = {(f.node, f.subject): f for fs in opts.values() for f in fs}
    assert ("e-n0", "1") not in got and got[("e-n0", "0:GPU-e-n0-0")].severity == "critical"
    assert got[("e-n0", "0:GPU-e-n0-0")].evidence["bursts"] == 4
    assert got[("e-n2", "0:GPU-e-n2-0")].evidence["xid_codes"] == "43,79"
    assert set(found(con, "gpu_errors", Scope(job="ej"))) == {"ej"}


def test_a_row_remapping_pending_is_a_warning_once_and_a_failed_one_critical(tmp_path) -> None:
    """The agent sends a row remapping that turned pending as one event (not one a tick);
    a failed one makes the finding critical."""

    from tests.fakes.nvml import FakeNvml

    from .conftest import agent_gpus

    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="a100", scenario="row_remap"))
    assert con.execute("SELECT kind, count(*) FROM gpu_events GROUP BY kind").fetchall() == [("row_remap_pending", 2)]
    f = found(con, "gpu_errors")
    assert [(x.subject.split(":")[0], x.severity, x.evidence["row_remap_pending"]) for x in f["j"]] == [
        ("0", "warning", 1), ("1", "warning", 1)]
    assert "row remapping pending (reset the GPU to apply it)" in f["j"][0].summary
    nvml = FakeNvml(gpus=1, model="a100")
    nvml.nvmlDeviceGetRemappedRows = lambda h: (0, 3, 0, 1)  # remapping failed
    bad = agent_gpus(tmp_path, nvml, job="k")
    (x,) = found(bad, "gpu_errors")["k"]
    assert x.severity == "critical" and x.evidence["row_remap_failed"] == 1 and "needs service" in x.summary



def test_a_page_retirement_pending_on_a_volta_gpu_is_a_warning(tmp_path) -> None:
    from tests.fakes.nvml import FakeNvml

    from .conftest import agent_gpus

    con = agent_gpus(tmp_path, FakeNvml(gpus=1, model="v100", scenario="retired_pages"))
    assert con.execute("SELECT max(retired_pages_sbe), max(retired_pages_dbe) FROM gpu_samples").fetchone() == (2, 1)
    (x,) = found(con, "gpu_errors")["j"]
    assert x.severity == "warning" and x.evidence["retired_pages_pending"] == 1
    assert x.summary == "GPU 0 on n0: a memory page retirement pending (reset the GPU to apply it) in 1 burst, hitting job j"
