#!/usr/bin/env bash
# install_pkgconfig.sh — `cmake --install` puts the library (SONAME
# libgpumem.so.0), headers, CLI, gpumem.pc and the CMake package under a
# prefix; a C program built with `pkg-config --cflags --libs gpumem` (nothing
# else) runs as installed, without LD_LIBRARY_PATH (the .pc's RPATH): a sim
# device, an allocation, the stats; and a CMake project's
# find_package(gpumem) + gpumem::gpumem builds and runs the same program.
set -u
: "${GPUMEM:?}"
fail() { echo "FAIL: $*"; exit 1; }
command -v pkg-config >/dev/null || { echo "skip: pkg-config not installed"; exit 77; }
command -v cc >/dev/null || { echo "skip: no C compiler (cc)"; exit 77; }
build=$(dirname "$GPUMEM")
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cmake --install "$build" --prefix "$T/prefix" >"$T/install.log" 2>&1 || { cat "$T/install.log"; fail "cmake --install"; }
for f in bin/gpumem include/gpumem/gpumem.h; do [ -e "$T/prefix/$f" ] || fail "$f not installed"; done
pc=$(find "$T/prefix" -name gpumem.pc | head -1)
[ -n "$pc" ] || fail "gpumem.pc not installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs gpumem) || fail "pkg-config --cflags --libs gpumem"
cat >"$T/user.c" <<'C'
#include <gpumem/gpumem.h>
#include <stdio.h>
int main(void) {
    gm_backend *b; gm_allocator *a; gm_devptr p;
    gm_sim_options o; gm_sim_options_init(&o);
    if (gm_sim_create(&b, &o) || gm_allocator_create(&a, b, NULL)) return 1;
    if (gm_malloc(a, 0, 1 << 20, 0, &p)) return 2;
    gm_stats s = {.size = sizeof s};
    if (gm_get_stats(a, 0, &s) || s.allocated_bytes[0].current != 1 << 20) return 3;
    gm_free(a, p);
    gm_allocator_destroy(a); gm_backend_destroy(b);
    printf("ok %s\n", gm_version());
    return 0;
}
C
# a sanitized build's library needs the sanitizer runtime in the program too
san=""
if nm -D "$(dirname "$pc")/../libgpumem.so" 2>/dev/null | grep -q __asan_; then san="-fsanitize=address,undefined"; fi
# shellcheck disable=SC2086
cc $san "$T/user.c" -o "$T/user" $flags 2>"$T/cc.log" || { cat "$T/cc.log"; fail "compile with pkg-config flags: $flags"; }
lib=$(dirname "$pc")/..
soname=$(readelf -d "$lib/libgpumem.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libgpumem.so.0 ] || fail "SONAME is '$soname', not libgpumem.so.0"
[ -L "$lib/libgpumem.so.0" ] && [ -f "$(readlink -f "$lib/libgpumem.so.0")" ] || fail "libgpumem.so.0 link missing"
out=$(env -u LD_LIBRARY_PATH ASAN_OPTIONS=detect_leaks=0 "$T/user") || fail "installed program exit $? (without LD_LIBRARY_PATH)"
echo "$out" | grep -q "^ok " || fail "unexpected output: $out"
"$T/prefix/bin/gpumem" --version >/dev/null || fail "installed CLI"
# the installed gpumem run finds the installed Python package (share/gpumem/python), no pip
"$T/prefix/bin/gpumem" run --native -- sh -c 'case "$PYTHONPATH" in "$0"/share/gpumem/python/gpumem/_boot:*) exit 4 ;; esac; exit 9' "$T/prefix"
rc=$?; [ $rc = 4 ] || fail "installed gpumem run: exit $rc (PYTHONPATH not the installed package's)"
# find_package(gpumem): a CMake project against the install prefix
mkdir -p "$T/proj"
cp "$T/user.c" "$T/proj/user.c"
cat >"$T/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(user C)
find_package(gpumem 0.1 REQUIRED)
add_executable(user user.c)
target_link_libraries(user PRIVATE gpumem::gpumem)
add_executable(user_static user.c)
target_link_libraries(user_static PRIVATE gpumem::gpumem_static)
CM
cmake -S "$T/proj" -B "$T/proj/b" -DCMAKE_PREFIX_PATH="$T/prefix" -DCMAKE_C_FLAGS="$san" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" >"$T/cmake.log" 2>&1 && cmake --build "$T/proj/b" >>"$T/cmake.log" 2>&1 ||
    { cat "$T/cmake.log"; fail "find_package(gpumem) project did not build"; }
for p in user user_static; do
    out=$(ASAN_OPTIONS=detect_leaks=0 "$T/proj/b/$p") || fail "find_package-built $p exit $?"
    echo "$out" | grep -q "^ok " || fail "$p: unexpected output: $out"
done
# libgpumem.a with pkg-config's --static flags: the policy table (src/policy/
# table.c) lends the core its policies and nothing calls it, so only the
# flags' -u keeps it; without it the allocator says what is missing
sflags=$(pkg-config --static --libs gpumem | sed 's/-lgpumem\b/-l:libgpumem.a/')
# shellcheck disable=SC2086
cc $san "$T/user.c" -o "$T/user_a" $(pkg-config --cflags gpumem) $sflags 2>"$T/cc.log" ||
    { cat "$T/cc.log"; fail "static link with pkg-config --static: $sflags"; }
out=$(ASAN_OPTIONS=detect_leaks=0 "$T/user_a") || fail "statically linked program exit $?"
echo "$out" | grep -q "^ok " || fail "static: unexpected output: $out"
cat >"$T/none.c" <<'C'
#include <gpumem/gpumem.h>
#include <stdio.h>
int main(void) {
    gm_backend *b; gm_allocator *a;
    gm_sim_options o; gm_sim_options_init(&o);
    if (gm_sim_create(&b, &o)) return 1;
    if (gm_allocator_create(&a, b, NULL) == GM_OK) return 2;
    printf("%s\n", gm_last_error_detail());
    gm_backend_destroy(b);
    return 0;
}
C
# shellcheck disable=SC2086
cc $san "$T/none.c" -o "$T/none" $(pkg-config --cflags gpumem) ${sflags//-Wl,-u,gm__policy_table/} 2>"$T/cc.log" ||
    { cat "$T/cc.log"; fail "static link without -u"; }
out=$(ASAN_OPTIONS=detect_leaks=0 "$T/none") || fail "without the policy table: exit $? (want an error, then 0)"
echo "$out" | grep -q "no policy is linked in.*-u,gm__policy_table" || fail "without the policy table: '$out'"
echo "ok: cmake --install; pkg-config ($flags), pkg-config --static and find_package(gpumem) build C programs that run as installed"
