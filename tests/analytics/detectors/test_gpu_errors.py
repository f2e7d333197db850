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
