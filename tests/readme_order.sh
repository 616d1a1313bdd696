#!/usr/bin/env bash
# readme_order.sh — the README's two first commands, read from README.md
# itself, run on a fresh clone in the order that used to break (command 2,
# the full test run, then command 1, the Release build and tune), then the
# Python package imports that Release library. Command 2
# used to configure build/ with sanitizers, which command 1 then reused, so
# the library could not be loaded into python. Run by .ci/run (it repeats
# the whole test run, so it is not a CTest test). Last, `build/gpumem run`
# from the source tree, without pip.
#
# usage: tests/readme_order.sh [REPO]   (default: this checkout; committed state)
set -euo pipefail
repo=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
git clone -q "$repo" "$T/gpumem"
cd "$T/gpumem"
# the commands: the non-comment lines of the README's first sh block
mapfile -t cmds < <(awk '/^```sh/ { if (++n == 1) { on = 1; next } } /^```/ { on = 0 }
                          on && NF && !/^#/ { print }' README.md)
[ "${#cmds[@]}" -ge 2 ] || { echo "FAIL: README's first sh block lacks two commands"; exit 1; }
echo "== README command 2: ${cmds[1]}"; bash -c "${cmds[1]}"
echo "== README command 1: ${cmds[0]}"; bash -c "${cmds[0]}"
echo "== Python: import gpumem and load the Release library from build/"
PYTHONPATH=python GPUMEM_LIB="$PWD/build" python3 -c '
import gpumem._lib as L
L.load()
print("ok: loaded", L.library_path(), "status name of -2:", L.status_name(-2))'
echo "== gpumem run from the CMake build, without pip: the child runs, its exit status comes back"
set +e
env -u PYTHONPATH build/gpumem run -- python3 -c 'import gpumem, sys; sys.exit(5)'; rc=$?
set -e
[ "$rc" = 5 ] || { echo "FAIL: build/gpumem run -- python3 -c 'sys.exit(5)' exited $rc"; exit 1; }
echo "ok: README commands 2, 1, the Python import and build/gpumem run work in that order on a fresh clone"
