#!/bin/sh
# libumprov_managed.so from this folder's C (docs/managed-memory.md): the image's build, the
# tests' and the benchmarks'. No CUDA header or library: the runtime's functions come from
# the libcudart torch loaded, so one build serves CUDA 12 and 13.
#
#   sh build.sh OUT [GCC_FLAGS ...]     # e.g. -Wextra -Werror
set -eu
out=$1
shift
exec gcc -O2 -Wall "$@" -shared -fPIC -o "$out" "$(dirname "$0")/umprov_managed.c" -lpthread
