#!/usr/bin/env bash
# Download, HERE (a machine with PyPI), the wheels runbot's CLI needs on the GPU machine and
# that the GPU machine lacks (it has torch, transformers, tqdm, typing-extensions but no
# registry). Target: CPython 3.12, x86-64 manylinux. Versions follow .venv (what the tests
# ran with). Output: .whl/ at the repo root (git-ignored: pass `carry: [".whl"]` to the
# device run so it travels with the tree).
#
#   bash bench/gpu/make_wheels.sh              # the pydantic-settings stack and google-re2 (config.validate)
#   bash bench/gpu/make_wheels.sh --with-ssh   # + asyncssh, cryptography, cffi, pycparser
#                                              #   (only if bot.cli imports asyncssh at top level)
#   EXTRA="name==1.2 other" bash bench/gpu/make_wheels.sh   # anything else, same platform rules
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
DEST=${DEST:-.whl}
VENV_PY=${VENV_PY:-$REPO/.venv/bin/python}

names=(pydantic pydantic-core pydantic-settings python-dotenv typing-inspection annotated-types typing-extensions google-re2)
[ "${1:-}" = --with-ssh ] && names+=(asyncssh cryptography cffi pycparser)
# shellcheck disable=SC2206
extra=(${EXTRA:-})

version_of() {  # the version installed in .venv, from its metadata
    "$VENV_PY" - "$1" <<'EOF'
import sys
from importlib.metadata import version
print(version(sys.argv[1]))
EOF
}

specs=()
for n in "${names[@]}"; do
    v=$(version_of "$n") || { echo "make_wheels: $n is not in .venv ($VENV_PY)" >&2; exit 1; }
    specs+=("$n==$v")
done
specs+=("${extra[@]}")

rm -rf "$DEST"
mkdir -p "$DEST"
for s in "${specs[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$DEST" "$s"
done

echo "make_wheels: $(ls "$DEST" | wc -l) wheels in $DEST, $(du -sh "$DEST" | cut -f1)"
ls -l "$DEST"
size_kb=$(du -sk "$DEST" | cut -f1)
if [ "$size_kb" -ge 10240 ]; then
    echo "make_wheels: WARNING: $DEST is ${size_kb} KB (>= 10 MB)" >&2
    exit 1
fi
# one version of each distribution
dupes=$(ls "$DEST" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "make_wheels: more than one version of: $dupes" >&2; exit 1; }
