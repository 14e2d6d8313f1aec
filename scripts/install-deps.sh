#!/usr/bin/env bash
# Installs the Debian packages parallax needs, only those missing. Used by both quickstart
# commands and by CI. Needs root or sudo when something is missing.
set -euo pipefail
pkgs=(cmake make gcc clang pkg-config libcjson-dev libopenmpi-dev openmpi-bin libopenblas-dev
      gnuplot-nox zlib1g-dev)
# report.html: the report's Markdown rendered by cmark-gfm and its table extension
pkgs+=(libcmark-gfm-dev libcmark-gfm-extensions-dev)
# the report_browser test loads report.html in headless Chromium (the headless build: no GTK)
pkgs+=(chromium-headless-shell)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "parallax: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "parallax: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
