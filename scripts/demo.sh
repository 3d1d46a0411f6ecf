#!/usr/bin/env bash
# The main job: builds corefarm and runs `corefarm demo` — an embedded local
# cluster multiplying 64×64 matrices on native soft cores, every result checked.
# Extra arguments go to `corefarm demo` (try --help, --target rtl, --nodes 4).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cargo build --release -p corefarm-cli
exec "$root/target/release/corefarm" demo "$@"
