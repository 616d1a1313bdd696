#!/usr/bin/env bash
# deploy_node.sh — issue 45's deployment, tested as far as this machine can
# (no Kubernetes cluster, no Slurm here):
#  1. deploy/kubernetes/*.yaml parse, and hang together: the DaemonSet runs
#     `gpumem exporter --node` on the exporter's default port, the same port
#     in containerPort, Service and ServiceMonitor, selectors that match,
#     hostPID, a read-only root, limits on every container, and one beacon
#     folder (GPUMEM_SHM_DIR) for the agent's mount and the training pods';
#  2. the agent as the manifest runs it, in a shared folder like the hostPath:
#     a publisher of another user (uid 4242, through setpriv, as root) is seen
#     with --node and its uid, and not without;
#  3. the Slurm epilog: two ranks of job 4711 (one leaking), recorded by the
#     node agent's `gpumem log --all-users`, summarised by gpumem-jobstats
#     (peak, fragmentation, categories, steps, the leak told from the cache),
#     also with a torn line in the record and for a job with no samples; and
#     gpumem-epilog.sh writes the summary file.
# Skips (77) without python3's yaml module or curl.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
SRC=${GPUMEM_SOURCE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
python3 -c 'import yaml' 2>/dev/null || { echo "skip: python3 yaml not installed"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl not installed"; exit 77; }
export GPUMEM_SHM_TAG="deploy$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for

# ---- 1. the manifests ---------------------------------------------------------
default_listen=$("$GPUMEM" exporter --help 2>&1 | sed -n 's/.*--listen .*(default \([0-9.]*:[0-9]*\)).*/\1/p' | head -1)
[ -n "$default_listen" ] || { echo "FAIL: no default address in 'gpumem exporter --help'"; exit 1; }
python3 - "$SRC/deploy/kubernetes" "${default_listen##*:}" >"$tmp/agent.args" <<'PY'
import glob, sys, yaml
folder, port = sys.argv[1], int(sys.argv[2])
docs = {}
for f in sorted(glob.glob(folder + "/*.yaml")):
    for d in yaml.safe_load_all(open(f)):
        if d and "kind" in d:
            docs.setdefault(d["kind"], d)
ds, svc, sm = docs["DaemonSet"], docs["Service"], docs["ServiceMonitor"]
pod = ds["spec"]["template"]["spec"]
labels = ds["spec"]["template"]["metadata"]["labels"]
assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items(), "DaemonSet selector"
assert pod.get("hostPID") is True, "hostPID: the agent opens /proc/<pid>/fd of every pod's processes"
(c,) = pod["containers"]
args = c["args"]
assert args[0] == "exporter" and "--node" in args, args
listen = args[args.index("--listen") + 1]
assert listen.endswith(":%d" % port), "the manifest listens on %s, gpumem's default port is %d" % (listen, port)
(cport,) = [p for p in c["ports"] if p["name"] == "metrics"]
assert cport["containerPort"] == port
(sport,) = svc["spec"]["ports"]
assert sport["port"] == port and sport["targetPort"] == "metrics"
assert svc["spec"]["selector"].items() <= labels.items(), "Service selector"
assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), "ServiceMonitor selector"
assert [e["port"] for e in sm["spec"]["endpoints"]] == [sport["name"]]
for k in pod.get("initContainers", []) + pod["containers"]:
    sc = k["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, k["name"]
    assert sc["capabilities"]["drop"] == ["ALL"], k["name"]
    assert {"cpu", "memory"} <= set(k["resources"]["limits"]), "limits of " + k["name"]
assert set(c["securityContext"]["capabilities"].get("add", [])) <= {"SYS_PTRACE", "DAC_READ_SEARCH"}
env = {e["name"]: e.get("value") for e in c["env"]}
shm = env["GPUMEM_SHM_DIR"]
(m,) = [m for m in c["volumeMounts"] if m["mountPath"] == shm]
assert m.get("readOnly") is True, "the agent only reads the beacons"
(v,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
assert v["hostPath"]["path"] == shm
# the training pods' patch uses the same folder
patch = yaml.safe_load(open(folder + "/training-pod-patch.yaml"))
tp = patch["spec"]["template"]["spec"]
(tc,) = tp["containers"]
assert {e["name"]: e.get("value") for e in tc["env"]}["GPUMEM_SHM_DIR"] == shm
(tv,) = tp["volumes"]
assert tv["hostPath"]["path"] == v["hostPath"]["path"]
print(" ".join(a for a in args if a not in ("--listen", listen)))
print("ok: manifests consistent (port %d, GPUMEM_SHM_DIR %s)" % (port, shm), file=sys.stderr)
PY
read -r -a agent_args <"$tmp/agent.args"

# ---- 2. the agent, in a folder shared like the hostPath -------------------------
shared="$tmp/run-gpumem"
mkdir -m 1777 "$shared"
chmod 755 "$tmp"
export GPUMEM_SHM_DIR="$shared"
other=""
# another user can run the binary only if every folder above it is searchable by
# others (a clone under `mktemp -d`, as tests/readme_order.sh makes, is not)
as_other() { setpriv --reuid 4242 --regid 4242 --clear-groups "$@"; }
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && ! as_other env "$GPUMEM" --help >/dev/null 2>&1; then
    echo "note: uid 4242 cannot run $GPUMEM (a folder above it is private): the other-user case is left to test_monitor_node"
elif [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    setpriv --reuid 4242 --regid 4242 --clear-groups env GPUMEM_RUN_ID=other-job \
        "$GPUMEM" demo --steps 3 --step-ms 0 --hold 60 --model 8MiB --label other >"$tmp/other.json" 2>"$tmp/other.err" &
    other=$!
    pids+=($other)
    wait_for 30 test -s "$tmp/other.json" || { echo "FAIL: uid 4242's producer did not start"; cat "$tmp/other.err"; exit 1; }
fi
"$GPUMEM" "${agent_args[@]}" --listen 127.0.0.1:0 --no-nvml >"$tmp/agent.out" 2>&1 &
pids+=($!)
wait_for 20 grep -q serving "$tmp/agent.out" || { echo "FAIL: agent did not start"; cat "$tmp/agent.out"; exit 1; }
url=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$tmp/agent.out")
if [ -n "$other" ]; then
    opid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$tmp/other.json")
    # output captured before grep: with pipefail, grep -q ending a pipe early fails its writer (SIGPIPE)
    seen() { local m; m=$(curl -fsS "$url") && grep -q "^gpumem_process_info{gpu=\"0\",pid=\"$opid\",uid=\"4242\",.*run_id=\"other-job\"" <<<"$m"; }
    wait_for 20 seen || { echo "FAIL: the node agent does not see uid 4242's process"; curl -sS "$url"; exit 1; }
    grep -q '^gpumem_node_mode 1$' <<<"$(curl -fsS "$url")" || { echo "FAIL: node mode not exported"; exit 1; }
    "$GPUMEM" smi --no-nvml --format json | python3 -c '
import json, sys
assert not [p for p in json.load(sys.stdin)["processes"] if p["uid"] == 4242], "seen without --all-users"'
    echo "ok: the node agent sees uid 4242's process, a plain view does not"
else
    echo "note: not root (or no setpriv): the other-user case is left to test_monitor_node"
fi

# ---- 3. the Slurm epilog --------------------------------------------------------
export SLURM_JOB_ID=4711
for r in 0 1; do
    leak=(); [ "$r" = 0 ] && leak=(--leak 32MiB)
    RANK=$r WORLD_SIZE=2 "$GPUMEM" demo --steps 40 --step-ms 60 --hold 60 --model 64MiB "${leak[@]}" \
        --label "rank$r" >"$tmp/r$r.json" 2>/dev/null &
    pids+=($!)
done
# the node agent's record while the job runs (as gpumem-node-log.service does, faster)
"$GPUMEM" log --all-users --no-nvml --interval 0.25 --count 14 --output "$tmp/node.jsonl" 2>/dev/null
wait_for 30 test -s "$tmp/r0.json" -a -s "$tmp/r1.json" || { echo "FAIL: ranks did not finish"; exit 1; }
"$GPUMEM" log --all-users --no-nvml --count 1 --output "$tmp/node.jsonl" 2>/dev/null
echo '{"time_ns": 1, "processes": [{"run_id": "4711", "rank": 0, "reser' >>"$tmp/node.jsonl"   # cut mid-line
"$SRC/deploy/slurm/gpumem-jobstats" --log "$tmp/node.jsonl" >"$tmp/summary.txt" 2>"$tmp/summary.err"
cat "$tmp/summary.txt"
python3 - "$tmp" <<'PY'
import json, re, sys
tmp = sys.argv[1]
t = open(tmp + "/summary.txt").read()
err = open(tmp + "/summary.err").read()
assert "Job ID: 4711   ranks seen: 2" in t, t
assert "1 unreadable lines skipped" in err, err
for r in (0, 1):
    w = json.loads(open("%s/r%d.json" % (tmp, r)).readline())
    row = [l for l in t.splitlines() if re.match(r"\s+%d\s" % r, l)]
    assert row, "no row for rank %d" % r
    assert " 40 " in row[0], row  # steps
# rank 0 leaks 32 MiB a step: the baseline note; rank 1 only caches
assert re.search(r"rank 0 kept [\d.]+ [MG]iB more at each step's start after \d+ steps \(32\.0 MiB a step\): a leak", t), t
assert "rank 1: its step-start memory stayed flat" in t and "not a leak" in t, t
assert re.search(r"rank 1 +parameters [\d.]+ MiB, optimizer_state [\d.]+ MiB", t), t
assert "largest free block" in t, t
print("ok: the job summary tells rank 0's leak from rank 1's cache")
PY
grep -q "Job 999: no gpumem samples" <<<"$("$SRC/deploy/slurm/gpumem-jobstats" --job 999 --log "$tmp/node.jsonl")" ||
    { echo "FAIL: an empty job is not said so"; exit 1; }
GPUMEM_JOBSTATS_DIR="$tmp/jobs" GPUMEM_NODE_LOG="$tmp/node.jsonl" GPUMEM_JOBSTATS="$SRC/deploy/slurm/gpumem-jobstats" \
    sh "$SRC/deploy/slurm/gpumem-epilog.sh"
grep -q "ranks seen: 2" "$tmp/jobs/4711.$(hostname -s).txt" || { echo "FAIL: the epilog wrote no summary"; exit 1; }
echo PASS
