#!/usr/bin/env bash
# The GPU checks for a lent GPU machine (the `device` tool: see docs/sources.md, "On a real
# GPU"). Runs without installing cmdare: the package is laid out under $TMP/pkg by symlinks.
# Writes its findings to $OUT (or ./device-out). Usage: bench/device/gpu_check.sh [OLD_GPU_PY]
#   OLD_GPU_PY: an older agent/sources/gpu.py to time against the current GPU package.
set -uo pipefail
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; TMP="$(mktemp -d)"
mkdir -p "$TMP/pkg/cmdare"; touch "$TMP/pkg/cmdare/__init__.py"
ln -s "$ROOT/wire" "$TMP/pkg/cmdare/wire"; cp -r "$ROOT/agent" "$TMP/pkg/cmdare/agent"
if [ -n "${1:-}" ]; then  # the old module beside the new package, unregistered
  sed 's/^@SOURCES.register$//; s/^from \.\.config import ConfigError$/from cmdare.wire.units import ConfigError/' "$1" \
    > "$TMP/pkg/cmdare/agent/sources/_gpu_old.py"
fi
export PYTHONPATH="$TMP/pkg:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader
python3 -c "import pynvml, psutil, sys; print('python', sys.version.split()[0], 'nvidia-ml-py', pynvml.__version__ if hasattr(pynvml,'__version__') else '?')"
echo "== load: a matrix product loop on the GPU for the checks below"
python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + 150
while time.time() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
PY
LOAD=$!; sleep 8
echo "== pytest -m gpu"
python3 -m pytest -q -p no:cacheprovider -m gpu "$ROOT/tests/agent/test_gpu_real.py" --rootdir "$ROOT" 2>&1 | tail -5
echo "== the GPU source on this GPU: three ticks"
python3 - <<'PY' > "$OUT/gpu_sample.json"
import json, time
from cmdare.agent.sources.gpu import GpuSource
from cmdare.wire.events import encode_row_data
src = GpuSource(GpuSource.parse_config("sources.gpu", {"backend": __import__("os").environ.get("GPU_BACKEND", "pynvml")}))
ticks = []
for i in range(3):
    ev = []
    src.collect(lambda t, d, **k: ev.append((t, d)))
    ticks.append(ev)
    time.sleep(1)
gpus = [d for t, d in ticks[-1] if t == "gpu"]
rows_ok = all(d.row == encode_row_data("gpu", dict(d)) for ev in ticks for t, d in ev if t == "gpu")
absent = {g.index: sorted(g.absent) for g in src.gpus}
print(json.dumps({"gpus": [dict(d) for d in gpus], "rows_equal_encoding": rows_ok, "absent": absent,
                  "events": [[t, dict(d)] for ev in ticks for t, d in ev if t != "gpu"]}, default=str, indent=1))
src.close()
PY
python3 - "$OUT/gpu_sample.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for g in j["gpus"]:
    keys = sorted(g)
    print("gpu", g["index"], g["name"], "fields:", len(keys))
    print("  util", g.get("util_gpu_ratio"), "gr_engine", g.get("gr_engine_active_ratio"), "sm_active", g.get("sm_active_ratio"),
          "tensor", g.get("tensor_active_ratio"), "dram", g.get("dram_active_ratio"), "energy_J", g.get("energy_joules_total"))
    print("  nvlink links", len(g.get("nvlink", [])), "errors", g.get("nvlink_errors_total"), "processes", g.get("processes"))
    print("  missing:", [k for k in ("gr_engine_active_ratio", "energy_joules_total", "remapped_rows_correctable",
                                      "power_watts", "pcie_tx_bytes_per_second", "ecc_corrected_total", "processes") if k not in g])
print("rows equal their encoding:", j["rows_equal_encoding"], "absent calls:", j["absent"])
print("events:", j["events"][:5])
PY
echo "== agent cost on this GPU: CPU per tick, old module vs the package, interleaved"
python3 - <<'PY'
import time, importlib
from cmdare.agent.sources.gpu import GpuSource as New
classes = [("package", New)]
try:
    classes.insert(0, ("old", importlib.import_module("cmdare.agent.sources._gpu_old").GpuSource))
except ImportError as e:
    print("no old module:", e)
emit = lambda *a, **k: None
srcs = []
for name, cls in classes:
    s = cls(cls.parse_config("sources.gpu", {"backend": __import__("os").environ.get("GPU_BACKEND", "pynvml")})); s.start()
    for _ in range(20):
        s.collect(emit)
    srcs.append((name, s))
res = {name: [] for name, _ in srcs}
for rnd in range(6):
    for name, s in srcs:
        t0, w0 = time.process_time(), time.perf_counter()
        for _ in range(200):
            s.collect(emit)
        res[name].append(((time.process_time() - t0) / 200 * 1e6, (time.perf_counter() - w0) / 200 * 1e6))
for name, r in res.items():
    cpu = sorted(x for x, _ in r); wall = sorted(y for _, y in r)
    print(f"{name:8s} CPU us/tick median {cpu[len(cpu)//2]:.0f} (min {cpu[0]:.0f}), wall median {wall[len(wall)//2]:.0f}")
PY
kill $LOAD 2>/dev/null; wait 2>/dev/null
echo "== done"
