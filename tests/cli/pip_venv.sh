#!/usr/bin/env bash
# pip_venv.sh — the README's pip install, as a new user runs it: a fresh venv,
# `python3 -m pip install --no-build-isolation ./python` (offline, from a copy
# of this checkout), then the `gpumem` command from PATH, from another
# directory: --version, estimate, doctor, `gpumem run -- python3 -c ...` with
# the child's exit status passed through, and `python3 -m gpumem` the same.
# Without torch, or with a CPU-only one, the install must say +noshim and `gpumem run`
# must still run the child, warning that the shim is missing. Where a python
# with setuptools < 70.1 and no `wheel` is around, its pip install must stop
# with the one line naming what is missing. Slow (a Release build of the
# library): CTest label "long", run by .ci/run and `scripts/test.sh --all`.
set -u
: "${GPUMEM_SOURCE:?}"
fail() { echo "FAIL: $*"; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
# a python whose venv can build a wheel (setuptools >= 70.1, or the wheel package)
can_wheel='import setuptools
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    import wheel.bdist_wheel'
V=""
for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    "$py" -m venv --system-site-packages "$T/venv" 2>/dev/null || continue
    if "$T/venv/bin/python" -c "$can_wheel" 2>/dev/null && "$T/venv/bin/python" -m pip --version >/dev/null 2>&1; then
        V=$T/venv; break
    fi
    rm -rf "$T/venv"
done
[ -n "$V" ] || { echo "skip: no python3 whose venv has pip, setuptools and wheel (apt-get install python3-venv python3-wheel)"; exit 77; }
# a copy of the checkout: pip builds in the source folder (python/build)
mkdir "$T/src"
tar -C "$GPUMEM_SOURCE" --exclude='./build*' --exclude=./python/build --exclude='*.egg-info' --exclude=.git \
    -cf - . | tar -C "$T/src" -xf - || fail "copy the source tree"
env -u PYTHONPATH -u GPUMEM_LIB "$V/bin/python" -m pip install --no-build-isolation --no-index "$T/src/python" \
    >"$T/pip.log" 2>&1 || { tail -30 "$T/pip.log"; fail "pip install"; }
last=$(tail -1 "$T/pip.log")
# the shim is built against a torch with CUDA; without torch, or with a CPU-only one (Debian's python3-torch), +noshim
if "$V/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    want="torch-gpumem-[0-9.]*$"
else
    want="torch-gpumem-[0-9.]*+noshim$"
fi
echo "$last" | grep -q "^Successfully installed $want" || fail "pip's last line does not say what was installed ($want): $last"
[ -x "$V/bin/gpumem" ] || fail "pip put no gpumem command in $V/bin"
cd "$T" || exit 1
export PATH="$V/bin:$PATH"
unset PYTHONPATH GPUMEM_LIB
[ "$(command -v gpumem)" = "$V/bin/gpumem" ] || fail "gpumem on PATH is $(command -v gpumem)"
gpumem --version | grep -q "^gpumem [0-9]" || fail "gpumem --version"
out=$(gpumem estimate --model gpt2 --batch 8 --seq 1024 --capacity 24GiB) || fail "gpumem estimate exit $?"
echo "$out" | grep -q "^peak allocated" || fail "gpumem estimate printed: $out"
gpumem doctor >"$T/doctor.txt"
grep -q "ok   python package  $V/lib/" "$T/doctor.txt" || fail "doctor does not find the installed package: $(cat "$T/doctor.txt")"
grep -q "ok   torch library   $V/lib/" "$T/doctor.txt" || fail "doctor does not find the installed library: $(cat "$T/doctor.txt")"
# gpumem run: the child's exit status passes through; the child sees the installed package
gpumem run -- python3 -c 'import sys; sys.exit(7)' 2>"$T/run.err"; rc=$?
[ $rc = 7 ] || fail "gpumem run -- python3 -c 'sys.exit(7)': exit $rc: $(cat "$T/run.err")"
case "$want" in *noshim*)
    grep -q "WARNING: the C++ shim gpumem._C is not installed" "$T/run.err" || fail "no shim warning: $(cat "$T/run.err")" ;;
esac
out=$(gpumem run --label pipjob -- python3 -c 'import os, gpumem._lib as L; print(os.environ["GPUMEM_RUN"], os.environ["GPUMEM_PUBLISH_LABEL"], L.find_library())' 2>/dev/null) ||
    fail "gpumem run child could not import gpumem: $out"
case "$out" in "gpumem pipjob $V/lib/"*/gpumem/libgpumem_torch.so) ;; *) fail "child environment: $out" ;; esac
python3_venv="$V/bin/python"
"$python3_venv" -m gpumem run -- python3 -c 'import sys; sys.exit(3)' 2>/dev/null; rc=$?
[ $rc = 3 ] || fail "python3 -m gpumem run: exit $rc, not 3"
[ "$("$python3_venv" -m gpumem --version)" = "$(gpumem --version)" ] || fail "python3 -m gpumem differs from gpumem"
# on a GPU machine with torch: the shim is built for that torch and answers torch's memory API under gpumem run
if "$V/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    grep -q "ok   shim " "$T/doctor.txt" || fail "torch is here but doctor reports no shim: $(cat "$T/doctor.txt")"
    grep -q "ok   torch " "$T/doctor.txt" || fail "doctor: torch mismatch: $(cat "$T/doctor.txt")"
    out=$(gpumem run -- python3 -c 'import torch; x = torch.ones(1 << 20, device="cuda"); import gpumem.torch as gt
print(gt.is_installed(), torch.cuda.memory_allocated())' 2>"$T/gpu.err") || fail "CUDA child under gpumem run: $(cat "$T/gpu.err")"
    [ "$out" = "True 4194304" ] || fail "CUDA child under gpumem run printed '$out' (want: True 4194304)"
    echo "ok: GPU: the shim answers torch.cuda.memory_allocated() under gpumem run"
fi
echo "ok: pip install in a fresh venv gives the gpumem command; estimate, doctor and run (exit status passed through) work"

# a python that cannot build a wheel gets one line naming what is missing
for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null || continue
    rm -rf "$T/bare"
    "$py" -m venv "$T/bare" 2>/dev/null || continue
    "$T/bare/bin/python" -c "$can_wheel" 2>/dev/null && continue
    "$T/bare/bin/python" -c 'import setuptools' 2>/dev/null || continue
    "$T/bare/bin/python" -m pip install --no-build-isolation --no-index "$T/src/python" >"$T/bare.log" 2>&1 &&
        fail "pip install without wheel succeeded?"
    grep -q "gpumem setup: pip cannot build gpumem for .*: setuptools .* lacks 'bdist_wheel'" "$T/bare.log" ||
        { tail -20 "$T/bare.log"; fail "no line naming the missing wheel package"; }
    echo "ok: $py's setuptools without wheel: pip stops with the line naming it"
    # the line gives a command that works offline (issue 42: 'pip install wheel' needs the index):
    # with Debian's wheel of it here, run that command, and pip install must then get past metadata
    whl=$(ls /usr/share/python-wheels/wheel-*.whl 2>/dev/null | tail -1)
    if [ -n "$whl" ]; then
        fix=$(sed -n "s/.*install it offline: \(.* -m pip install --no-index [^ ,]*\.whl\), then run pip again.*/\1/p" "$T/bare.log" | head -1)
        [ -n "$fix" ] || { tail -5 "$T/bare.log"; fail "the line gives no offline command for $whl"; }
        $fix >"$T/fix.log" 2>&1 || { cat "$T/fix.log"; fail "the printed fix failed: $fix"; }
        "$T/bare/bin/python" -m pip install --no-build-isolation --no-index "$T/src/python" >"$T/bare2.log" 2>&1 ||
            { tail -20 "$T/bare2.log"; fail "pip install after the printed fix"; }
        echo "ok: the printed offline fix ($fix) makes pip install work"
    else
        grep -q "apt-get install python3-wheel-whl && $T/bare/bin/python -m pip install --no-index /usr/share/python-wheels/wheel-\*.whl" "$T/bare.log" ||
            { tail -5 "$T/bare.log"; fail "no Debian command for the wheel package"; }
    fi
    break
done
