#!/usr/bin/env bash
# Run ends on a real GPU machine (issue 51): the agent's train source beside three real
# PyTorch processes on the GPU, tracked with cmdare.agent.track: one finishes, one dies of a
# CUDA out-of-memory error, one is killed with SIGKILL mid-run. Writes what the source
# emitted to $OUT/run_end.json, and runs tests/agent/test_run_end.py there.
set -uo pipefail
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"; TMP="$(mktemp -d)"
mkdir -p "$TMP/pkg/cmdare"; touch "$TMP/pkg/cmdare/__init__.py"
ln -s "$ROOT/wire" "$TMP/pkg/cmdare/wire"; ln -s "$ROOT/agent" "$TMP/pkg/cmdare/agent"
export PYTHONPATH="$TMP/pkg:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L
cat > "$TMP/train.py" <<'PY'
import sys, time, torch
from cmdare.agent import track
how = sys.argv[2]
with track.init("gpu-" + how, socket_path=sys.argv[1], accelerator=torch.cuda.get_device_name(0)) as run:
    a = torch.randn(4096, 4096, device="cuda"); b = torch.randn_like(a)
    for i in range(40 if how != "killed" else 100000):
        c = a @ b; torch.cuda.synchronize(); run.step(examples=64)
        if how == "oom" and i == 10:
            torch.empty(1 << 40, device="cuda")  # 4 TiB of floats: CUDA out of memory
        if how == "killed" and i == 20:
            print("ready", flush=True)
PY
timeout 120 python3 - "$TMP" "$OUT" <<'PY'
import json, os, signal, subprocess, sys, time
from pathlib import Path
from cmdare.agent.sources.train import TrainSource
tmp, out = Path(sys.argv[1]), Path(sys.argv[2])
sock = tmp / "t.sock"
src = TrainSource(TrainSource.parse_config("sources.train", {"socket": str(sock)}))
src.start()
evs = []
def collect():
    src.collect(lambda t, d, ts=None, job=None: evs.append({"type": t, "job": job, "ts": ts, **d}))
procs = {how: subprocess.Popen([sys.executable, str(tmp / "train.py"), str(sock), how], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for how in ("finished", "oom", "killed")}
assert procs["killed"].stdout.readline().strip() == "ready"
t_kill = time.time()
procs["killed"].send_signal(signal.SIGKILL)
for how, p in procs.items():
    p.wait(60)
    print(how, "exit", p.returncode, (p.stderr.read() or "").strip().splitlines()[-1:] )
for _ in range(4):
    collect(); time.sleep(1.0)
src.close()
ends = [e for e in evs if e["type"] == "train_end"]
steps = {e["job"]: e["steps"] for e in evs if e["type"] == "train_steps"}
(out / "run_end.json").write_text(json.dumps({"ends": ends, "step_events": steps, "killed_at": t_kill}, indent=1))
for e in ends:
    print(json.dumps({k: e.get(k) for k in ("job", "state", "error", "steps", "pid")})[:300])
want = {"gpu-finished": "finished", "gpu-oom": "failed", "gpu-killed": "crashed"}
got = {e["job"]: e["state"] for e in ends}
print("OK" if got == want else f"MISMATCH {got}")
PY
echo "== pytest tests/agent/test_run_end.py"
python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/agent/test_run_end.py" --rootdir "$ROOT" 2>&1 | tail -4
