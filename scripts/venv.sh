#!/usr/bin/env bash
# Makes the project's Python virtual environment (git-ignored) and installs into it, from PyPI,
# what python/requirements-dev.txt lists: torch 2.11.0 (a CUDA build that runs on the CPU, about
# 3 GB of downloads, ~5.5 GB installed), transformers, numpy, pytest, mpi4py and the build tools.
# Idempotent: a venv whose requirements are unchanged is left as it is (a few seconds). pip's
# cache (~/.cache/pip) is reused, so a second venv costs no download.
#   scripts/venv.sh [DIR [REQUIREMENTS]]       DIR defaults to .venv
# The interpreter is Debian's /usr/bin/python3 (scripts/setup.sh installs it with python3-venv):
# the one the project's set-up installs, whatever `python3` is first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
requirements=${2:-python/requirements-dev.txt}
base=${A2D_BASE_PYTHON:-/usr/bin/python3}
stamp="$venv/.a2d-requirements"
if [[ -x $venv/bin/python && -f $stamp ]] && cmp -s "$requirements" "$stamp"; then
  echo "venv: $venv is up to date ($(cat "$venv/.a2d-torch-version" 2>/dev/null || echo '?'))"
  exit 0
fi
start=$(date +%s)
[[ -x $venv/bin/python ]] || "$base" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
  -r "$requirements"
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)' > "$venv/.a2d-torch-version"
cp "$requirements" "$stamp"
echo "venv: $venv ready in $(( $(date +%s) - start )) s: $(cat "$venv/.a2d-torch-version"), $(du -sh "$venv" | cut -f1)"
