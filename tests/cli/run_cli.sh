#!/usr/bin/env bash
# run_cli.sh — 'gpumem run' (src/cli/cmd_run.c) execs the command: its exit
# status and signals come back unchanged, the environment it gets sets gpumem
# up (the source tree's python/gpumem: no pip needed), bad options and
# settings are usage errors, a missing shim is warned about. No torch or GPU.
set -u
: "${GPUMEM:?}"
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
"$GPUMEM" run -- sh -c 'exit 7'; [ $? -eq 7 ] || fail "exit status not passed through"
"$GPUMEM" run -- sh -c 'kill -TERM $$'; [ $? -eq 143 ] || fail "SIGTERM not passed through"
out=$("$GPUMEM" run --label job1 --no-publish -- sh -c 'echo "$GPUMEM_RUN $GPUMEM_PUBLISH ${PYTHONPATH%%:*}"')
case "$out" in "gpumem 0 "*/gpumem/_boot) ;; *) fail "child environment: $out" ;; esac
out=$("$GPUMEM" run --native -- sh -c 'echo "$GPUMEM_RUN $GPUMEM_PUBLISH_LABEL"')
[ "$out" = "native sh" ] || fail "--native environment: $out"
"$GPUMEM" run --bogus -- true 2>/dev/null; [ $? -eq 2 ] || fail "unknown option not a usage error"
"$GPUMEM" run 2>/dev/null; [ $? -eq 2 ] || fail "missing command not a usage error"
"$GPUMEM" run -- /nonexistent/prog 2>/dev/null; [ $? -eq 127 ] || fail "missing program not 127"
err=$("$GPUMEM" run --conf max_split_sz_mb:64 -- sh -c 'echo ran' 2>&1); [ $? -eq 2 ] || fail "bad --conf ran: $err"
case "$err" in *"did you mean 'max_split_size_mb'"*) ;; *) fail "bad --conf message: $err" ;; esac
err=$(GPUMEM_CONF=bogus:1 "$GPUMEM" run -- true 2>&1); [ $? -eq 2 ] || fail "bad GPUMEM_CONF accepted: $err"
# the source tree has no C++ shim (only pip builds it): run warns, and runs the command anyway
err=$("$GPUMEM" run -- true 2>&1); [ $? -eq 0 ] || fail "run without the shim failed: $err"
case "$err" in *"WARNING: the C++ shim gpumem._C is not installed"*) ;; *) fail "no shim warning: $err" ;; esac
err=$(env -u PYTORCH_CUDA_ALLOC_CONF "$GPUMEM" run --native -- true 2>&1); [ -z "$err" ] || fail "--native warned: $err"
# PYTORCH_CUDA_ALLOC_CONF in the environment: one line on what gpumem does with it
err=$(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$GPUMEM" run -- true 2>&1) || fail "run with PYTORCH_CUDA_ALLOC_CONF: $err"
echo "$err" | grep -q "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is ignored: gpumem's allocator (policy:gpumem).*--conf 'policy:torch,expandable_segments:True'" ||
    fail "no line on PYTORCH_CUDA_ALLOC_CONF: $err"
err=$(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$GPUMEM" run --native -- true 2>&1)
[ "$err" = "gpumem run: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True applies: --native keeps PyTorch's allocator, which reads it" ] ||
    fail "--native line on PYTORCH_CUDA_ALLOC_CONF: $err"
echo ok
