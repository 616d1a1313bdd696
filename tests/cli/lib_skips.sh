#!/usr/bin/env bash
# lib_skips.sh — the skips of tests/cli/lib/producers.sh: need_exporter skips
# (77, "skip: built without libmicrohttpd") when `gpumem exporter` says it was
# built without libmicrohttpd, though it says so with a failing exit status,
# under the tests' `set -o pipefail`; a gpumem that says anything else does not
# skip. need skips for a missing command only. Runs stand-in gpumem scripts.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
export GPUMEM_SHM_TAG="skips$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, need, need_exporter

fail() { echo "FAIL: $*"; exit 1; }
stub() {   # stub NAME EXIT MESSAGE: a gpumem that writes MESSAGE to stderr and exits EXIT
    printf '#!/bin/sh\necho "%s" >&2\nexit %s\n' "$3" "$2" >"$tmp/$1"
    chmod +x "$tmp/$1"
}
stub nomhd 1 "gpumem exporter: this gpumem was built without libmicrohttpd (install libmicrohttpd-dev and rebuild)"
stub badlisten 2 "gpumem exporter: bad --listen 'nowhere': expected ADDR:PORT"

rc=0; said=$(GPUMEM=$tmp/nomhd; need_exporter) || rc=$?
[ "$rc" = 77 ] && [ "$said" = "skip: built without libmicrohttpd" ] ||
    fail "need_exporter with a gpumem built without libmicrohttpd: exit $rc, said '$said'"
echo "ok: built without libmicrohttpd: skipped"
rc=0; said=$(GPUMEM=$tmp/badlisten; need_exporter) || rc=$?
[ "$rc" = 0 ] && [ -z "$said" ] || fail "need_exporter with libmicrohttpd: exit $rc, said '$said'"
echo "ok: built with libmicrohttpd: not skipped"

rc=0; said=$(need sh no-such-command-here) || rc=$?
[ "$rc" = 77 ] && [ "$said" = "skip: no-such-command-here not installed" ] || fail "need: exit $rc, said '$said'"
rc=0; said=$(need sh) || rc=$?
[ "$rc" = 0 ] && [ -z "$said" ] || fail "need sh: exit $rc, said '$said'"
echo "ok: need skips for a missing command only"
