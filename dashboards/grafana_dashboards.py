"""Grafana dashboards for the Prometheus path (the agent's and the collector's ``/metrics``),
built here and written to ``dashboards/grafana/*.json`` (``python -m
cmdare.dashboards.grafana_dashboards --write``; a test checks the files are what this
builds, and runs every panel's PromQL against a real Prometheus scraping a real agent and
collector).

Three dashboards, in the shape Grafana users copy from "Node Exporter Full": a stat strip,
then collapsed rows of detail, variables for the data source and what to look at:

- ``cmdare-fleet``: every GPU (variables: datasource, job, node);
- ``cmdare-node``: one node's GPUs, host and agent (datasource, node, gpu);
- ``cmdare-job``: one training job's speed, step time, input wait, GPUs, findings and
  goodput (datasource, job).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
HERE = Path(__file__).resolve().parent / "grafana"


def _var(name: str, query: str, label: str, multi: bool = True) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "refresh": 2, "sort": 1,
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "includeAll": multi,
            "multi": multi, "allValue": ".*" if multi else None, "current": {}}


DATASOURCE = {"name": "datasource", "label": "data source", "type": "datasource", "query": "prometheus",
              "current": {}, "hide": 0}


class Layout:
    """Panels placed left to right, 24 columns a line; rows collapse what follows them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row: dict[str, Any] | None = None
        self.next_id = 1

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + h
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        return pos

    def add(self, kind: str, title: str, exprs: list[tuple[str, str]], w: int = 12, h: int = 8, unit: str = "",
            instant: bool = False, description: str = "", **options: Any) -> None:
        p: dict[str, Any] = {
            "id": self.next_id, "type": kind, "title": title, "datasource": DS, "gridPos": self._place(w, h),
            "description": description,
            "targets": [{"datasource": DS, "expr": e, "legendFormat": legend, "refId": chr(65 + i),
                         "instant": instant, "range": not instant} for i, (e, legend) in enumerate(exprs)],
            "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
            "options": options,
        }
        self.next_id += 1
        (self.row["panels"] if self.row is not None else self.panels).append(p)

    def section(self, title: str, collapsed: bool = True) -> None:
        self.x, self.y = 0, self.y + 8
        self.row = {"id": self.next_id, "type": "row", "title": title, "collapsed": collapsed,
                    "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []}
        self.next_id += 1
        self.panels.append(self.row)
        self.y += 1


def _dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]], lay: Layout) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["cmdare"], "editable": True,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "timezone": "utc", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": [DATASOURCE, *variables]},
        "annotations": {"list": []},
        "links": [{"title": "cmdare pages", "type": "link", "url": "/ui", "targetBlank": True,
                   "tooltip": "the collector's own pages (set the collector's address in the link)"}],
        "panels": lay.panels,
    }


def fleet() -> dict[str, Any]:
    sel = 'job=~"$job",node=~"$node"'
    lay = Layout()
    lay.add("stat", "GPUs reporting", [(f"count(cmdare_gpu_util_gpu_ratio{{{sel}}}) or vector(0)", "")], w=4, h=4,
            instant=True)
    lay.add("stat", "mean GPU utilisation", [(f"avg(cmdare_gpu_util_gpu_ratio{{{sel}}})", "")], w=4, h=4,
            unit="percentunit", instant=True)
    lay.add("stat", "idle GPUs (< 10 %)", [(f"count(cmdare_gpu_util_gpu_ratio{{{sel}}} < 0.1) or vector(0)", "")],
            w=4, h=4, instant=True)
    lay.add("stat", "throttled GPUs", [(f"count(cmdare_gpu_throttle_mask{{{sel}}} > 1) or vector(0)", "")], w=4, h=4,
            instant=True, description="a clocks-event reason other than GPU idle (bit 0) is set")
    lay.add("stat", "active findings", [('sum(cmdare_finding_active{job=~"$job"}) or vector(0)', "")], w=4, h=4,
            instant=True, description="stored findings whose window ended within the last hour (the collector's)")
    lay.add("stat", "alerts firing", [('sum(cmdare_collector_alerts{state="firing"}) or vector(0)', "")], w=4, h=4,
            instant=True)
    lay.section("GPU utilisation", collapsed=False)
    lay.add("timeseries", "GPU utilisation per GPU", [(f"cmdare_gpu_util_gpu_ratio{{{sel}}}", "{{node}} GPU {{gpu}}")],
            w=24, h=10, unit="percentunit")
    lay.add("table", "GPUs now", [
        (f"cmdare_gpu_util_gpu_ratio{{{sel}}}", "util"), (f"cmdare_gpu_power_watts{{{sel}}}", "power"),
        (f"cmdare_gpu_temp_celsius{{{sel}}}", "temperature")], w=24, h=10, instant=True)
    lay.section("Profiling activity (GPM: Hopper and later; MIG instances as GPUs)")
    lay.add("timeseries", "busy: graphics engine where profiled, else GPU_UTIL", [
        (f"cmdare_gpu_gr_engine_active_ratio{{{sel}}} or cmdare_gpu_util_gpu_ratio{{{sel}}}", "{{node}} GPU {{gpu}}")],
        unit="percentunit", description="GPU_UTIL counts a GPU busy while one tiny kernel runs and reads nothing on "
        "MIG; the graphics-engine activity (DCGM's GR_ENGINE_ACTIVE) does not")
    lay.add("timeseries", "tensor pipes active", [(f"cmdare_gpu_tensor_active_ratio{{{sel}}}", "{{node}} GPU {{gpu}}")],
            unit="percentunit", description="near zero on a busy GPU: the model trains without mixed precision")
    lay.add("timeseries", "SM active and occupancy", [
        (f"cmdare_gpu_sm_active_ratio{{{sel}}}", "{{node}} GPU {{gpu}} SM active"),
        (f"cmdare_gpu_sm_occupancy_ratio{{{sel}}}", "{{node}} GPU {{gpu}} occupancy")], unit="percentunit")
    lay.add("timeseries", "DRAM bandwidth used", [(f"cmdare_gpu_dram_active_ratio{{{sel}}}", "{{node}} GPU {{gpu}}")],
            unit="percentunit", description="high while the engine is busy: memory-bandwidth bound")
    lay.add("timeseries", "MIG instances' SM activity, in whole GPUs per node", [
        (f"sum by (node) (cmdare_gpu_sm_active_ratio{{{sel}}} * on (node, gpu, instance) "
         f"cmdare_gpu_mig_slice_ratio{{{sel}}})", "{{node}}")],
        description="each MIG instance's SM activity weighted by its share of its parent's SMs: what the node's MIG "
        "GPUs really did, comparable with whole GPUs")
    lay.add("timeseries", "NVLink errors", [
        (f"sum by (node, gpu) (increase(cmdare_gpu_nvlink_errors_total{{{sel}}}[$__rate_interval]))",
         "{{node}} GPU {{gpu}}")], description="replay, recovery and CRC errors, all links")
    lay.section("Memory, power, temperature")
    lay.add("timeseries", "GPU memory used", [(f"cmdare_gpu_mem_used_bytes{{{sel}}}", "{{node}} GPU {{gpu}}")],
            unit="bytes")
    lay.add("timeseries", "GPU power", [(f"cmdare_gpu_power_watts{{{sel}}}", "{{node}} GPU {{gpu}}")], unit="watt")
    lay.add("timeseries", "GPU temperature", [(f"cmdare_gpu_temp_celsius{{{sel}}}", "{{node}} GPU {{gpu}}")],
            unit="celsius")
    lay.add("timeseries", "Xid and ECC events", [
        (f"sum by (node, kind) (increase(cmdare_gpu_events_total{{{sel}}}[$__rate_interval])) or vector(0)",
         "{{node}} {{kind}}")])
    lay.section("cmdare's conclusions")
    lay.add("table", "active findings", [('cmdare_finding_active{job=~"$job"}', "")], w=12, h=8, instant=True)
    lay.add("bargauge", "goodput of running jobs", [('cmdare_job_goodput_ratio{job=~"$job"}', "{{job}}")], w=12,
            h=8, unit="percentunit", instant=True)
    lay.section("Collector")
    lay.add("timeseries", "events stored per second", [("rate(cmdare_collector_events_stored_total[$__rate_interval])",
                                                          "{{instance}}")])
    lay.add("timeseries", "Kafka lag (records)", [("sum by (instance) (cmdare_collector_kafka_lag_messages)",
                                                   "{{instance}}")])
    variables = [_var("job", "label_values(cmdare_gpu_util_gpu_ratio, job)", "training job"),
                 _var("node", 'label_values(cmdare_gpu_util_gpu_ratio{job=~"$job"}, node)', "node")]
    return _dashboard("cmdare-fleet", "cmdare / fleet GPUs", "Every GPU the agents report, and cmdare's findings.",
                      variables, lay)


def node() -> dict[str, Any]:
    n = 'node="$node"'
    g = 'node="$node",gpu=~"$gpu"'
    lay = Layout()
    lay.add("stat", "CPU", [(f"cmdare_host_cpu_util_ratio{{{n}}}", "")], w=4, h=4, unit="percentunit", instant=True)
    lay.add("stat", "memory used", [(f"cmdare_host_mem_used_bytes{{{n}}}", "")], w=4, h=4, unit="bytes", instant=True)
    lay.add("stat", "GPUs", [(f"count(cmdare_gpu_util_gpu_ratio{{{n}}}) or vector(0)", "")], w=4, h=4, instant=True)
    lay.add("stat", "mean GPU utilisation", [(f"avg(cmdare_gpu_util_gpu_ratio{{{g}}})", "")], w=4, h=4,
            unit="percentunit", instant=True)
    lay.add("stat", "agent up", [(f"cmdare_agent_uptime_seconds{{{n}}}", "")], w=4, h=4, unit="s", instant=True)
    lay.add("stat", "spool pending", [(f"cmdare_agent_spool_pending{{{n}}}", "")], w=4, h=4, instant=True)
    lay.section("GPU", collapsed=False)
    lay.add("timeseries", "utilisation", [(f"cmdare_gpu_util_gpu_ratio{{{g}}}", "GPU {{gpu}}")], unit="percentunit")
    lay.add("timeseries", "memory used", [(f"cmdare_gpu_mem_used_bytes{{{g}}}", "GPU {{gpu}}")], unit="bytes")
    lay.add("timeseries", "power", [(f"cmdare_gpu_power_watts{{{g}}}", "GPU {{gpu}}")], unit="watt")
    lay.add("timeseries", "SM clock", [(f"cmdare_gpu_sm_clock_hertz{{{g}}}", "GPU {{gpu}}")], unit="hertz")
    lay.section("Profiling activity and links (GPM: Hopper and later)")
    lay.add("timeseries", "graphics engine, SMs, tensor pipes, DRAM", [
        (f"cmdare_gpu_gr_engine_active_ratio{{{g}}}", "GPU {{gpu}} engine"),
        (f"cmdare_gpu_sm_active_ratio{{{g}}}", "GPU {{gpu}} SM"),
        (f"cmdare_gpu_tensor_active_ratio{{{g}}}", "GPU {{gpu}} tensor"),
        (f"cmdare_gpu_dram_active_ratio{{{g}}}", "GPU {{gpu}} DRAM")], unit="percentunit")
    lay.add("timeseries", "energy (power from the energy counter)", [
        (f"rate(cmdare_gpu_energy_joules_total{{{g}}}[$__rate_interval])", "GPU {{gpu}}")], unit="watt")
    lay.add("timeseries", "NVLink throughput per link", [
        (f"cmdare_gpu_nvlink_rx_bytes_per_second{{{g}}}", "GPU {{gpu}} link {{link}} rx"),
        (f"cmdare_gpu_nvlink_tx_bytes_per_second{{{g}}}", "GPU {{gpu}} link {{link}} tx")], unit="Bps")
    lay.add("timeseries", "NVLink errors per link", [
        (f"increase(cmdare_gpu_nvlink_replay_errors_total{{{g}}}[$__rate_interval]) + "
         f"increase(cmdare_gpu_nvlink_crc_flit_errors_total{{{g}}}[$__rate_interval])", "GPU {{gpu}} link {{link}}")])
    lay.section("Host")
    lay.add("timeseries", "CPU", [(f"cmdare_host_cpu_util_ratio{{{n}}}", "cpu")], unit="percentunit")
    lay.add("timeseries", "network", [
        (f"sum by (nic) (rate(cmdare_host_net_rx_bytes_total{{{n}}}[$__rate_interval]))", "rx {{nic}}")], unit="Bps")
    lay.section("Agent")
    lay.add("timeseries", "events spooled and shipped per second", [
        (f"rate(cmdare_agent_spooled_total{{{n}}}[$__rate_interval])", "spooled"),
        (f"rate(cmdare_agent_shipped_total{{{n}}}[$__rate_interval])", "shipped")])
    lay.add("state-timeline", "sources up", [(f"cmdare_agent_source_up{{{n}}}", "{{source}}")])
    variables = [_var("node", "label_values(cmdare_agent_uptime_seconds, node)", "node", multi=False),
                 _var("gpu", 'label_values(cmdare_gpu_util_gpu_ratio{node="$node"}, gpu)', "GPU")]
    return _dashboard("cmdare-node", "cmdare / node", "One node: its GPUs, host and agent.", variables, lay)


def job() -> dict[str, Any]:
    j = 'job="$job"'
    lay = Layout()
    lay.add("stat", "steps/s (all ranks)", [(f"sum(cmdare_train_steps_per_second{{{j}}})", "")], w=6, h=4,
            instant=True)
    lay.add("stat", "input wait", [(f"avg(cmdare_train_wait_share_ratio{{{j}}})", "")], w=6, h=4,
            unit="percentunit", instant=True, description="share of step time waiting for input (all ranks)")
    lay.add("stat", "goodput", [(f"cmdare_job_goodput_ratio{{{j}}}", "")], w=6, h=4, unit="percentunit",
            instant=True, description="productive share of the job's wall time (the collector's figure)")
    lay.add("stat", "active findings", [(f"sum(cmdare_finding_active{{{j}}}) or vector(0)", "")], w=6, h=4,
            instant=True)
    lay.section("Speed", collapsed=False)
    lay.add("timeseries", "steps/s per rank", [(f"cmdare_train_steps_per_second{{{j}}}", "rank {{rank}}")])
    lay.add("timeseries", "step time per rank", [(f"cmdare_train_step_mean_seconds{{{j}}}", "rank {{rank}}")],
            unit="s")
    lay.add("timeseries", "input wait", [(f"cmdare_train_wait_share_ratio{{{j}}}", "rank {{rank}}")],
            unit="percentunit")
    lay.add("timeseries", "the job's GPUs", [(f"cmdare_gpu_util_gpu_ratio{{{j}}}", "{{node}} GPU {{gpu}}")],
            unit="percentunit")
    lay.section("cmdare's conclusions")
    lay.add("table", "findings", [(f"cmdare_finding_active{{{j}}}", "")], instant=True)
    lay.add("bargauge", "badput by cause", [(f"cmdare_job_badput_seconds{{{j}}}", "{{category}}")], unit="s",
            instant=True)
    variables = [_var("job", "label_values(cmdare_train_steps_per_second, job)", "training job", multi=False)]
    return _dashboard("cmdare-job", "cmdare / job", "One training job: speed, step time, input wait, GPUs, findings "
                      "and goodput.", variables, lay)


DASHBOARDS = {"cmdare-fleet": fleet, "cmdare-node": node, "cmdare-job": job}


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' collapsed panels included."""
    out = []
    for p in d["panels"]:
        if p["type"] == "row":
            out += p["panels"]
        else:
            out.append(p)
    return out


def text(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=1, sort_keys=True) + "\n"


def main() -> None:
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m cmdare.dashboards.grafana_dashboards --write   (writes dashboards/grafana/*.json)")
    HERE.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        (HERE / f"{name}.json").write_text(text(build()))
        print(f"wrote {HERE / name}.json")


if __name__ == "__main__":
    main()
