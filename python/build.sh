#!/usr/bin/env bash
# Builds the corefarm Python wheel with maturin (cargo profile
# $COREFARM_PROFILE, default release) and installs it into the current
# Python (`python3`, or $PYTHON).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -m maturin --version >/dev/null 2>&1; then
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet "maturin>=1.5,<2"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$py" -m maturin build --profile "${COREFARM_PROFILE:-release}" --manifest-path "$here/Cargo.toml" --interpreter "$py" --out "$out" ${MATURIN_ARGS:-}
PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --force-reinstall --no-deps "$out"/corefarm-*.whl
(cd / && "$py" -c 'import corefarm, sys; print("installed corefarm from", corefarm.__file__, file=sys.stderr)')
