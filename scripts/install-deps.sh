#!/usr/bin/env bash
# scripts/install-deps.sh — install what gpumem's build and tests need on
# Debian/Ubuntu (run as root, or it uses sudo). Safe to run again.
set -euo pipefail
# libclang-rt-dev: clang's sanitizer and libFuzzer runtimes (tests/fuzz). Debian
# only recommends it with clang, and --no-install-recommends leaves it out.
# python3-torch: Debian's torch 1.13 (CPU only) for the tests of gpumem.estimate's tracer
# (python/tests/test_estimate_trace.py: meta tensors, no GPU); 175 packages, 607 MiB, 32 s
# to install on the development machine (2026-12-07); the tests take 3 s. python3-torchvision
# (0.14): torchvision's models for python/tests/test_estimate_blocks.py (a few MiB more).
pkgs=(cmake make gcc g++ clang libclang-rt-dev pkg-config zlib1g-dev libcmocka-dev libcjson-dev
      libncurses-dev libmicrohttpd-dev tmux prometheus python3 python3-pytest python3-torch
      python3-torchvision curl procps ca-certificates)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: everything is installed"; exit 0; }
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
