#!/usr/bin/env bash
# run_cli.sh — 'gpumem run' hands over to python -m gpumem run: the command's
# exit status and signals come back unchanged, the environment it gets sets
# gpumem up, bad options are usage errors. No torch or GPU needed.
set -u
: "${GPUMEM:?}"
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }
export PYTHONPATH="${GPUMEM_SOURCE:?}/python${PYTHONPATH:+:$PYTHONPATH}"
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
GPUMEM_PYTHON=/nonexistent/python "$GPUMEM" run -- true 2>/dev/null; [ $? -eq 127 ] || fail "bad GPUMEM_PYTHON"
echo ok
