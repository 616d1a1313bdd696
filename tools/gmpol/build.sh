#!/bin/sh
# build.sh — build tools/gmpol/replay.c against an optimised copy of the core
# and backend sources (no sanitizers), into ${GMPOL_OUT:-/tmp/gmpol}. Run from the repo root.
set -e
mkdir -p ${GMPOL_OUT:-/tmp/gmpol}
gcc $GMPOL_CFLAGS -std=gnu11 -O2 -DNDEBUG -DGM_BUILDING_LIBRARY -Iinclude -Isrc -Isrc/core \
    tools/gmpol/replay.c src/core/*.c src/backend/*.c src/monitor/*.c \
    -o ${GMPOL_OUT:-/tmp/gmpol}/replay -lz -lpthread -ldl -lm $(pkg-config --libs libcjson 2>/dev/null) \
    $(pkg-config --exists libcjson && echo -DGM_HAVE_CJSON=1)
