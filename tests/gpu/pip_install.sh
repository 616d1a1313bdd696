# tests/gpu/pip_install.sh — sourced by the GPU run scripts (dropin_run.sh, alloc_suite.sh,
# graphs_run.sh): install the package as a user does, offline, from a fresh
# state, and say how long it took.
#   gpumem_pip_install SRC LOG T0    (T0: the script's start, date +%s)
# Prints "pip install: ok (N s)", or the errors and returns 1.
# GPUMEM_PIP_REUSE=1 keeps an install that already imports (one device call
# that runs several of these scripts installs once: see session_checks.sh).
gpumem_pip_install() {
  if [ "${GPUMEM_PIP_REUSE:-0}" = 1 ] && (cd /tmp && python3 -c 'import gpumem._C' 2>/dev/null); then
    echo "pip install: reused"; return 0
  fi
  python3 -m pip uninstall -y torch-gpumem gpumem >/dev/null 2>&1  # the distribution is torch-gpumem now
  if python3 -m pip install -v --no-deps --no-build-isolation --no-index "$1/python" >"$2" 2>&1; then
    echo "pip install: ok ($(( $(date +%s) - $3 )) s)"
  else
    echo "pip install FAILED ($(( $(date +%s) - $3 )) s); errors:"; grep -E "error|Error" "$2" | head -40
    return 1
  fi
}
