#!/bin/sh
# gpumem-epilog.sh — Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/gpumem-epilog.sh, or
# one line of an existing epilog): writes the job's GPU memory summary (gpumem-jobstats) to
# $GPUMEM_JOBSTATS_DIR/<job id>.<node>.txt, where users and `seff`-like tools read it. Never fails the job:
# whatever happens, it exits 0. Needs the node agent's record (gpumem-node-log.service).
dir=${GPUMEM_JOBSTATS_DIR:-/var/log/gpumem/jobs}
log=${GPUMEM_NODE_LOG:-/var/log/gpumem/node.jsonl}
jobstats=${GPUMEM_JOBSTATS:-/usr/local/bin/gpumem-jobstats}
[ -n "$SLURM_JOB_ID" ] || exit 0
mkdir -p "$dir" 2>/dev/null || exit 0
out="$dir/$SLURM_JOB_ID.$(hostname -s).txt"
"$jobstats" --job "$SLURM_JOB_ID" --log "$log" >"$out" 2>&1 || true
# readable by the job's user, not by everyone
[ -n "$SLURM_JOB_UID" ] && chown "$SLURM_JOB_UID" "$out" 2>/dev/null
chmod 0640 "$out" 2>/dev/null
exit 0
