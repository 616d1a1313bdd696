# tests/gpu/pip_install.sh — sourced by tests/gpu/lib.sh for the GPU run
# scripts (dropin_run.sh, alloc_suite.sh, graphs_run.sh, ...): install the
# package as a user does, offline, from a fresh state, and say how long it took.
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

# gpumem_device_run_start SRC OUT T0: what a device run of the drop-in tests
# does first (graphs_run.sh, interop_run.sh): say torch's, the GPU's and the
# commit's versions, install the package fresh (OUT/pip.log), then leave
# the source tree so the installed package must stand alone. Returns 1 if the
# install or the import fails.
gpumem_device_run_start() {
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  git -C "$1" log --oneline -1 2>/dev/null || true
  gpumem_pip_install "$1" "$2/pip.log" "$3" || return 1
  cd /tmp && python3 -c 'import torch, gpumem, gpumem._C'
}

# gpumem_suite_start SRC TXT T0: what a one-call GPU suite (alloc_suite.sh,
# estimate_tracer.sh) does first: copy everything the script prints to TXT
# too, say the commit and the GPU, install the package, keeping an install
# that already imports (/tmp/pip.log), then leave the source tree. Returns 1
# if the install fails.
gpumem_suite_start() {
  exec > >(tee "$2") 2>&1
  git -C "$1" log --oneline -1 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  GPUMEM_PIP_REUSE=1 gpumem_pip_install "$1" /tmp/pip.log "$3" || return 1
  cd /tmp
}
