#!/usr/bin/env bash
# torchtitan VERSION's own config manager on every plan's export (tests/clients/torchtitan_check.py) of
# plans.txt and torchtitan-plans.txt:
#   tests/clients/torchtitan.sh 0.3|0.2 PARALLAX
# The environment comes from scripts/clients.sh (torchtitan03 / torchtitan02); 77 (skipped)
# when it cannot be installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:?usage: torchtitan.sh 0.3|0.2 PARALLAX}
parallax=${2:?usage: torchtitan.sh 0.3|0.2 PARALLAX}
py=$("$here/../../scripts/clients.sh" "torchtitan${version/./}") || exit $?
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0
"$py" "$here/torchtitan_check.py" "$version" "$parallax" "$here/plans.txt" "$work" || rc=$?
# and the plans of models only torchtitan's fixtures cover (GPT-OSS)
"$py" "$here/torchtitan_check.py" "$version" "$parallax" "$here/torchtitan-plans.txt" "$work" || rc=$?
exit $rc
