#!/usr/bin/env bash
# help_all.sh — every command's help and errors, walked from the command list
# of `gpumem --help` (one table: src/cli/cli.h's GM_CLI_COMMANDS):
#   - `gpumem CMD --help` has the same sections: usage, what it does,
#     options, Exit status; and `gpumem help CMD` prints exactly the same;
#   - no option line runs into its description;
#   - a near-miss option or command gets "did you mean" with the right name,
#     and so does a near-miss settings key;
#   - every output agrees on the default policy (gpumem run's, install()'s):
#     config --list (text and JSON), run --help, doctor, python's
#     gpumem.torch.DEFAULT_POLICY; and on the version (CMake, setup.py, the
#     package, gpumem --version).
set -u
: "${GPUMEM:?}" "${GPUMEM_SOURCE:?}"
fail() { echo "FAIL: $*"; exit 1; }
cmds=$("$GPUMEM" --help | awk '/^commands:/{on=1; next} on && /^  [a-z]/ {print $1} on && /^$/ {exit}')
[ "$(echo "$cmds" | wc -w)" -ge 14 ] || fail "gpumem --help lists too few commands: $cmds"
"$GPUMEM" --help | grep -q "^Exit status:" || fail "gpumem --help has no Exit status"
for c in $cmds; do
    h=$("$GPUMEM" "$c" --help) || fail "$c --help exit $?"
    [ "$h" = "$("$GPUMEM" help "$c")" ] || fail "gpumem help $c differs from gpumem $c --help"
    # the sections, in this order
    echo "$h" | awk -v c="$c" '
        NR == 1 && index($0, "usage: gpumem " c) == 1 { s = 1 }
        s == 1 && NR == 3 && NF { s = 2 }                  # what the command does
        s == 2 && /^options:$/ { s = 3 }
        s == 3 && /^  -h, --help / { s = 4 }
        s == 4 && /^Exit status: / { s = 5 }
        END { exit s == 5 ? 0 : 1 }' || fail "$c --help lacks a section (usage, about, options, Exit status):
$h"
    # an option line is "  -x, --name METAVAR   text": two spaces at least between
    # the option and its text, or the text alone on the next line
    bad=$(echo "$h" | awk '/^options:$/ {on = 1; next} on && /^$/ {on = 0}
        on && /^  (-[a-zA-Z], |    )--/ && $0 !~ /^  (-[a-zA-Z], |    )--[a-z0-9-]+( [^ ]+)?(  +[^ ].*)?$/ {print}')
    [ -z "$bad" ] || fail "$c: option runs into its description: $bad"
    # did you mean: the first long option with its last letter dropped
    opt=$(echo "$h" | sed -n 's/^  \(-., \)\{0,1\} *--\([a-z][a-z0-9-]*\).*/\2/p' | grep -v '^help$' | head -1)
    if [ -n "$opt" ] && [ ${#opt} -ge 4 ]; then
        err=$("$GPUMEM" "$c" "--${opt%?}" 2>&1 >/dev/null); rc=$?
        [ $rc = 2 ] || fail "$c --${opt%?}: exit $rc"
        case "$err" in *"did you mean '--$opt'?"*) ;; *) fail "$c --${opt%?}: no 'did you mean --$opt': $err" ;; esac
    fi
    # did you mean: the command with its last letter dropped
    if [ ${#c} -ge 4 ]; then
        err=$("$GPUMEM" "${c%?}" 2>&1 >/dev/null); rc=$?
        [ $rc = 2 ] || fail "gpumem ${c%?}: exit $rc"
        case "$err" in *"did you mean '$c'?"*) ;; *) fail "gpumem ${c%?}: no 'did you mean $c': $err" ;; esac
    fi
done
err=$("$GPUMEM" help nosuchcommand 2>&1); [ $? = 2 ] || fail "help of an unknown command: exit not 2"
err=$("$GPUMEM" config expandable_segment:True 2>&1); [ $? = 2 ] || fail "a bad key is not exit 2"
case "$err" in *"did you mean 'expandable_segments'?"*) ;; *) fail "bad key: no did you mean: $err" ;; esac

# the default policy, everywhere
def=$("$GPUMEM" config --list --json | sed -n 's/.*"default_policy":"\([a-z]*\)".*/\1/p')
[ -n "$def" ] || fail "config --list --json has no default_policy"
"$GPUMEM" config --list | grep -Eq "^  $def .*\(default\)$" || fail "config --list does not mark $def default"
[ "$("$GPUMEM" config --list | grep -c '(default)$')" = 1 ] || fail "config --list marks more than one policy default"
"$GPUMEM" run --help | grep -q "policy:$def unless" || fail "run --help does not name policy:$def"
"$GPUMEM" doctor | grep -q "default policy  policy:$def " || fail "doctor does not name policy:$def"
# doctor: every check, each ok or with its fix; exit 0 only when all are ok
"$GPUMEM" doctor >"${TMPDIR:-/tmp}/doctor.$$" 2>&1; rc=$?
out=$(cat "${TMPDIR:-/tmp}/doctor.$$"); rm -f "${TMPDIR:-/tmp}/doctor.$$"
for check in library "python package" "torch library" shim torch "cuda driver" nvml publication config.json \
    "default policy"; do
    echo "$out" | grep -Eq "^  (ok|no) +$check " || fail "doctor has no '$check' line: $out"
done
nno=$(echo "$out" | grep -c "^  no ")
[ "$nno" = "$(echo "$out" | grep -c "^ *fix: ")" ] || fail "doctor: a failed check without its fix: $out"
{ [ "$nno" = 0 ] && [ $rc = 0 ]; } || { [ "$nno" -gt 0 ] && [ $rc = 1 ]; } || fail "doctor exit $rc with $nno failed checks"
if command -v python3 >/dev/null; then
    "$GPUMEM" doctor --json | python3 -c 'import json, sys; j = json.load(sys.stdin); assert len(j["checks"]) == 11, j' ||
        fail "doctor --json is not 11 checks of JSON"
    echo "$out" | grep -Eq "^  (ok|no) +pip build " || fail "doctor has no 'pip build' line: $out"
    # a fresh venv whose setuptools cannot build a wheel (issue 42): doctor names the command that
    # installs the wheel package offline, the same one pip install ./python stops with
    V=$(mktemp -d)
    if python3 -m venv "$V/v" 2>/dev/null && ! "$V/v/bin/python" -c 'import wheel' 2>/dev/null &&
        ! "$V/v/bin/python" -c 'from setuptools.command.bdist_wheel import bdist_wheel' 2>/dev/null &&
        "$V/v/bin/python" -c 'import setuptools' 2>/dev/null; then
        dv=$(PATH="$V/v/bin:$PATH" "$GPUMEM" doctor)
        echo "$dv" | grep -q "^  no   pip build .* cannot build gpumem: setuptools .* lacks 'bdist_wheel'" ||
            { rm -rf "$V"; fail "doctor in a venv without wheel: $dv"; }
        echo "$dv" | grep -Eq "fix: install it.* $V/v/bin/python3? -m pip install --no-index /usr/share/python-wheels/wheel-" ||
            { rm -rf "$V"; fail "doctor gives no offline wheel command: $dv"; }
    fi
    rm -rf "$V"
    py=$(PYTHONPATH="$GPUMEM_SOURCE/python" python3 -c 'from gpumem.torch import DEFAULT_POLICY; print(DEFAULT_POLICY)')
    [ "$py" = "policy:$def" ] || fail "python's DEFAULT_POLICY is $py, the CLI's policy:$def"
    pv=$(PYTHONPATH="$GPUMEM_SOURCE/python" python3 -c 'import gpumem; print(gpumem.__version__)')
    cv=$(sed -n 's/^project(gpumem VERSION \([0-9.]*\).*/\1/p' "$GPUMEM_SOURCE/CMakeLists.txt")
    [ "$pv" = "$cv" ] && [ "$("$GPUMEM" --version)" = "gpumem $cv" ] ||
        fail "versions differ: CMake $cv, python $pv, $("$GPUMEM" --version)"
fi
echo "ok: $(echo $cmds | wc -w) commands: same help sections, help CMD = CMD --help, did you mean, default policy $def"
