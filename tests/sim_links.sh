#!/usr/bin/env bash
# The simulator and the front end link only cJSON and libm (and the C library), and the front end
# cmark-gfm, which renders report.html: planning must work on a laptop without MPI, CUDA, NCCL
# or BLAS. Checks the shared libraries each given
# program needs (readelf -d), allowing the sanitizer runtimes of a PARALLAX_SANITIZE build.
# Usage: sim_links.sh PROGRAM...
set -u
command -v readelf >/dev/null || { echo "sim_links: readelf not found, skipping"; exit 77; }
fails=0
for prog in "$@"; do
  libs=$(readelf -d "$prog" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  for lib in $libs; do
    case $lib in
      libcjson.so* | libm.so* | libc.so* | ld-linux*) ;;
      libcmark-gfm.so* | libcmark-gfm-extensions.so*) ;;
      libasan.so* | libubsan.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so*) ;;
      *) echo "FAILED: $prog needs $lib; the simulator links only cJSON and libm (and cmark-gfm for the report)"; fails=1 ;;
    esac
  done
  echo "$(basename "$prog"): $(echo $libs)"
done
exit $fails
