#!/usr/bin/env bash
# Prints the Python of a cached virtual environment that holds a real client of parallax's
# exports (Megatron-LM, NeMo, Megatron-Bridge, DeepSpeed, torchtitan, transformers), creating
# or updating it first from tests/clients/NAME.txt, pinned requirements from PyPI.
#
#   py=$(scripts/clients.sh deepspeed) && "$py" tests/clients/deepspeed_check.py ...
#
# A requirements file whose first line is "# needs: torch" shares one torch install
# (tests/clients/torch.txt, a few GB) through a .pth file instead of downloading its own. One
# with a line "# no-deps" is installed with pip --no-deps: it pins every package the client
# needs, for a client whose declared dependencies include GPU builds that do not install here.
# "# ignore-requires-python" installs a client that declares a newer Python than the cached
# environments' (its config code runs on this one; the check stubs what differs), and each
# "# unpack: NAME==VERSION" line puts that wheel's files into the environment as they are,
# for a wheel built only for that newer Python (its pure-Python modules are what is used).
# Environments live in $PARALLAX_CLIENTS_DIR (default ~/.cache/parallax/clients) and are
# rebuilt when their requirements change. Exit 77 (ctest's "skipped") when PyPI cannot be
# reached and nothing is cached, 1 when it can and the install still fails; progress goes to
# standard error. Installs run one at a time (a lock in the folder): tests started together
# would otherwise build the shared torch environment over each other.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=${1:?usage: scripts/clients.sh NAME}
req="$root/tests/clients/$name.txt"
[ -f "$req" ] || { echo "clients.sh: no requirements file $req" >&2; exit 2; }
dir=${PARALLAX_CLIENTS_DIR:-$HOME/.cache/parallax/clients}
mkdir -p "$dir"
python=${PARALLAX_PYTHON:-python3}
exec 9>"$dir/.lock"
flock 9

# venv NAME REQ: the environment, (re)built in place when REQ's content differs from what built
# it; .requirements is written last, so an interrupted install is started over
venv() {
    local n=$1 r=$2 v="$dir/$1" sum
    sum=$(sha256sum "$r" | cut -d' ' -f1)
    if [ -x "$v/bin/python" ] && [ "$(cat "$v/.requirements" 2>/dev/null)" = "$sum" ]; then
        return 0
    fi
    echo "clients.sh: installing $n from $(basename "$r") into $v" >&2
    rm -rf "$v"
    "$python" -m venv "$v" >&2
    if head -1 "$r" | grep -q '^# needs: torch'; then
        venv torch "$root/tests/clients/torch.txt"
        local site
        site=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$dir/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/_parallax_torch.pth"
    fi
    local nodeps= pyreq=
    if grep -qx '# no-deps' "$r"; then nodeps=--no-deps; fi
    if grep -qx '# ignore-requires-python' "$r"; then pyreq=--ignore-requires-python; fi
    local spec wheels
    for spec in $(sed -n 's/^# unpack: *//p' "$r"); do
        wheels=$(mktemp -d)
        "$v/bin/pip" download --disable-pip-version-check -q --no-deps --only-binary=:all: \
            --python-version 3.12 -d "$wheels" "$spec" >&2 || { rm -rf "$wheels"; exit 1; }
        "$v/bin/python" -c 'import sys, sysconfig, zipfile; [zipfile.ZipFile(w).extractall(sysconfig.get_paths()["purelib"]) for w in sys.argv[1:]]' "$wheels"/*.whl
        rm -rf "$wheels"
    done
    if ! "$v/bin/pip" install --disable-pip-version-check -q $nodeps $pyreq -r "$r" >&2; then
        if ! "$python" -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=20)' 2>/dev/null; then
            echo "clients.sh: could not install $n: PyPI cannot be reached" >&2
            exit 77
        fi
        echo "clients.sh: could not install $n from $r (PyPI answers: see pip's message above)" >&2
        exit 1
    fi
    echo "$sum" >"$v/.requirements"
}
venv "$name" "$req"
echo "$dir/$name/bin/python"
