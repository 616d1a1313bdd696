#!/usr/bin/env bash
# monitor_job.sh — issue 27: four local processes started with torchrun's
# environment (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID) on the sim
# backend publish who they are; `gpumem smi` groups them as one job (table:
# one "Jobs" line with 4/4 ranks; JSON: run_id and ranks 0-3), and the
# exporter's /metrics carries run_id, rank, local_rank and world_size labels
# for each, never Prometheus's own job or instance. A fifth process outside
# the job stays apart.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v python3 >/dev/null || { echo "skip: python3 needed to parse the output"; exit 77; }
export GPUMEM_SHM_TAG="job$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter

run="elastic-$$"
for r in 0 1 2 3; do
    env RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 TORCHELASTIC_RUN_ID="$run" MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        "$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --device "$r" --model $(( (r + 1) * 8 ))MiB \
        >"$tmp/r$r.json" 2>/dev/null &
    pids+=($!)
done
env -u RANK -u TORCHELASTIC_RUN_ID -u SLURM_JOB_ID -u GPUMEM_RUN_ID "$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 8MiB --label loner \
    >"$tmp/loner.json" 2>/dev/null &
pids+=($!)
for f in r0 r1 r2 r3 loner; do
    wait_for 30 test -s "$tmp/$f.json" || { echo "FAIL: producer $f did not report"; exit 1; }
done

"$GPUMEM" smi --no-nvml --format json >"$tmp/smi.json"
"$GPUMEM" smi --no-nvml >"$tmp/smi.txt"
grep -Eq "^$run +4/4 " "$tmp/smi.txt" || { echo "FAIL: no jobs line with 4/4 ranks"; cat "$tmp/smi.txt"; exit 1; }

start_exporter --interval 0.1 --no-nvml   # url
scrape_all() { curl -fsS "$url" >"$tmp/m.txt" && [ "$(grep -c "^gpumem_process_info{.*run_id=\"$run\"" "$tmp/m.txt")" = 4 ]; }
wait_for 20 scrape_all || { echo "FAIL: not every rank scraped"; cat "$tmp/m.txt"; exit 1; }

python3 - "$tmp" "$run" <<'PY'
import json, re, sys
tmp, run = sys.argv[1], sys.argv[2]
s = json.load(open(f"{tmp}/smi.json"))
procs = s["processes"]
ranks = [p for p in procs if p["run_id"] == run]
assert sorted(p["rank"] for p in ranks) == [0, 1, 2, 3], ranks
assert all(p["world_size"] == 4 and p["local_rank"] == p["rank"] for p in ranks), ranks
# grouped: the job's rows come together, in rank order
idx = [i for i, p in enumerate(procs) if p["run_id"] == run]
assert idx == list(range(idx[0], idx[0] + 4)) and [procs[i]["rank"] for i in idx] == [0, 1, 2, 3], procs
for r in range(4):
    w = json.loads(open(f"{tmp}/r{r}.json").readline())
    (p,) = [p for p in ranks if p["rank"] == r]
    assert p["reserved"] == w["reserved"] and p["gpu"] == r, (p, w)
(loner,) = [p for p in procs if p["label"] == "loner"]
assert loner["run_id"] is None and loner["rank"] is None, loner

text = open(f"{tmp}/m.txt").read()
seen = set()
for line in text.splitlines():
    if line.startswith("#"):
        continue
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("} ")[0]))
    assert "job" not in labels and "instance" not in labels, line
    if line.startswith("gpumem_process_info{") and labels.get("run_id") == run:
        assert labels["world_size"] == "4" and labels["local_rank"] == labels["rank"], line
        seen.add(int(labels["rank"]))
    elif line.startswith("gpumem_process_") and not line.startswith("gpumem_process_info{"):
        # the per-sample series carry their key only: bounded at any number of ranks
        assert set(labels) <= {"gpu", "UUID", "pid", "category"}, line
assert seen == {0, 1, 2, 3}, seen
print("ok: smi groups the 4 ranks as one job; gpumem_process_info names each with run_id and rank, "
      "the other series carry gpu and pid only")
PY
echo PASS
