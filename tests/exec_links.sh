#!/usr/bin/env bash
# The executor's programs carry no simulator, reports or command-line code: a plan is the whole
# hand-off (its profile and prediction inline), so exec/ never links sim/. Fails when a given
# program defines a sim_, rpt_, val_ or cli_ function.
# Usage: exec_links.sh PROGRAM...
set -u
command -v nm >/dev/null || { echo "exec_links: nm not found, skipping"; exit 77; }
fails=0
for prog in "$@"; do
  found=$(nm "$prog" 2>/dev/null | awk '$2 ~ /^[TtDdRrBb]$/ && $3 ~ /^(sim|rpt|val|cli)_/ {print $3}' | sort -u)
  if [ -n "$found" ]; then
    echo "FAILED: $(basename "$prog") links $(echo "$found" | wc -l) simulator/report/cli functions: $(echo $found | cut -c1-200)"
    fails=1
  else
    echo "$(basename "$prog"): no sim_, rpt_, val_ or cli_ code"
  fi
done
exit $fails
