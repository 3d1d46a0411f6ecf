#!/usr/bin/env bash
# The main job: builds corefarm and runs `corefarm demo` — an embedded local
# cluster multiplying 64×64 matrices on native soft cores, every result checked.
# Extra arguments go to `corefarm demo` (try --help, --target rtl, --nodes 4).
# Installs only what the demo needs: a C++ compiler and make, and Verilator
# when the arguments ask for `--target rtl`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh demo "$@"
cargo build --release -p corefarm-cli
exec "$root/target/release/corefarm" demo "$@"
