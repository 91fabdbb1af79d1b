#!/usr/bin/env bash
# Makes a Python virtual environment (git-ignored) with what a requirements file lists, from PyPI:
# by default the project's, .venv/ with python/requirements-dev.txt: torch 2.11.0 (a CUDA build
# that runs on the CPU, about 3 GB of downloads, ~4.5 GB installed), transformers, numpy, pytest,
# mpi4py and the build tools.
#   scripts/venv.sh [DIR [REQUIREMENTS]]     REQUIREMENTS: a file, or one spec such as torch==2.11.0
# Idempotent: a venv whose requirements are unchanged is left as it is (a second).
#
# Three levels, each made once per machine and reused (A2D_PYTHON_CACHE, default
# ~/.cache/attention2d):
#   wheels/          the wheels, downloaded once by `pip download` (also the tools an isolated
#                    build of the package needs). pip's own cache keeps nothing of these downloads
#                    here (the registry's answers are not cacheable), so without it every fresh
#                    venv, and every CI run, would download the 3 GB again.
#   venvs/HASH/      a venv installed by pip from those wheels alone (--no-index; --no-compile:
#                    Python compiles on first import), one per requirements' content and base
#                    interpreter.
#   DIR              a new venv whose site-packages are hard links to that one's (seconds, no
#                    space; console scripts rewritten to DIR's interpreter). Where hard links
#                    cannot be made (another file system) the files are copied.
# The interpreter is Debian's /usr/bin/python3 (scripts/setup.sh installs it with python3-venv):
# the one the project's set-up installs, whatever `python3` is first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
requirements=${2:-python/requirements-dev.txt}
base=${A2D_BASE_PYTHON:-/usr/bin/python3}
cache=${A2D_PYTHON_CACHE:-$HOME/.cache/attention2d}
wheels=$cache/wheels
start=$(date +%s)
if [[ -f $requirements ]]; then
  wanted=$(cat "$requirements")
  pip_args=(-r "$(realpath "$requirements")")
else
  wanted=$requirements
  pip_args=("$requirements")
fi
stamp="$venv/.a2d-requirements"
if [[ -x $venv/bin/python && -f $stamp ]] && [[ "$(cat "$stamp")" == "$wanted" ]]; then
  echo "venv: $venv is up to date ($(cat "$venv/.a2d-torch-version" 2>/dev/null || echo '?'))"
  exit 0
fi
quiet=(--disable-pip-version-check --progress-bar off -q)
key=$( (echo "$wanted"; "$base" --version) | sha256sum | cut -c1-16)
template=$cache/venvs/$key
mkdir -p "$wheels" "$cache/venvs"

# The template, installed by pip from the wheelhouse (what the wheelhouse lacks is downloaded
# into it first). Made beside its place and renamed into it: a half-made one is never used.
if [[ ! -f $template/.a2d-complete ]]; then
  making=$template.making.$$
  rm -rf "$making"
  "$base" -m venv "$making"
  if ! "$making/bin/python" -m pip install "${quiet[@]}" --no-compile --no-index \
       --find-links "$wheels" "${pip_args[@]}" 2>/dev/null; then
    "$making/bin/python" -m pip download "${quiet[@]}" -d "$wheels" "${pip_args[@]}" \
      "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.20" ninja
    echo "venv: the wheelhouse $wheels holds $(du -sh "$wheels" | cut -f1) after $(( $(date +%s) - start )) s"
    "$making/bin/python" -m pip install "${quiet[@]}" --no-compile --no-index \
      --find-links "$wheels" "${pip_args[@]}"
  fi
  touch "$making/.a2d-complete"
  rm -rf "$template"
  mv "$making" "$template"
  # Console scripts name their interpreter by path: the template's own, after the rename.
  grep -lrs --null "^#!$making/bin/python" "$template/bin" |
    xargs -0 -r sed -i "1s|^#!$making/bin/python|#!$template/bin/python|"
fi

# The venv: a fresh one, its site-packages linked from the template's.
rm -rf "$venv"
"$base" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
template_site=${site/#$(realpath -m "$venv")/$template}
cp -al "$template_site/." "$site/" 2>/dev/null || cp -a "$template_site/." "$site/"
for script in "$template"/bin/*; do
  name=$(basename "$script")
  [[ -e $venv/bin/$name || -d $script ]] && continue
  if head -c 64 "$script" | grep -q "^#!$template/bin/python"; then
    sed "1s|^#!$template/bin/python|#!$(realpath -m "$venv")/bin/python|" "$script" > "$venv/bin/$name"
    chmod +x "$venv/bin/$name"
  fi
done
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)' > "$venv/.a2d-torch-version" 2>/dev/null ||
  echo "no torch" > "$venv/.a2d-torch-version"
echo "$wanted" > "$stamp"
echo "venv: $venv ready in $(( $(date +%s) - start )) s: $(cat "$venv/.a2d-torch-version"), $(du -sh "$venv" | cut -f1) (links into $template)"
