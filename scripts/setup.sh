#!/usr/bin/env bash
# Installs what one job needs on a Debian/Ubuntu machine, skipping whatever is
# already there, and checks for Rust.
#
#   scripts/setup.sh demo [DEMO ARGS]   what `corefarm demo` needs: a C++ compiler
#                                       and make; Verilator only with `--target rtl`
#   scripts/setup.sh test               what the whole test suite needs (scripts/test.sh)
#
# SETUP_DRY_RUN=1 prints the apt packages it would install and stops.
set -euo pipefail

job="${1:-}"
shift || true

need_apt=()
want() { # want COMMAND-OR-PATH PACKAGE
    if [[ "$1" == /* ]]; then [ -x "$1" ] || need_apt+=("$2"); else command -v "$1" >/dev/null 2>&1 || need_apt+=("$2"); fi
}

demo_tools() {
    want c++ g++
    want make make
    local prev=""
    for a in "$@"; do
        if [[ "$a" == "--target=rtl" || ( "$prev" == "--target" && "$a" == "rtl" ) ]]; then
            want verilator verilator
        fi
        prev="$a"
    done
}

test_tools() {
    want c++ g++
    want make make
    want verilator verilator
    # A private one-host Slurm cluster for deploy/slurm's test (tests/deploy).
    want sbatch slurm-client
    want /usr/sbin/slurmctld slurmctld
    want /usr/sbin/slurmd slurmd
    want /usr/sbin/munged munge
    want systemd-analyze systemd
    # Images for ARM boards (image build --arch), checked under qemu-user.
    want arm-linux-gnueabihf-g++ g++-arm-linux-gnueabihf
    want aarch64-linux-gnu-g++ g++-aarch64-linux-gnu
    want qemu-aarch64 qemu-user
    # promtool checks the /metrics output; tmux drives `corefarm top` in a test.
    want promtool prometheus
    want tmux tmux
    # Open MPI: the reference of the collectives benchmark (bench/mpi/README.md).
    want mpirun openmpi-bin
    want mpicc libopenmpi-dev
    # The TLS tests make their certificates with the commands of docs/operations.md.
    want openssl openssl
}

case "$job" in
    demo) demo_tools "$@" ;;
    test) test_tools ;;
    *) echo "usage: scripts/setup.sh demo [DEMO ARGS] | test" >&2; exit 2 ;;
esac

if [ -n "${SETUP_DRY_RUN:-}" ]; then
    echo "${need_apt[*]}"
    exit 0
fi
if ((${#need_apt[@]})); then
    echo "setup: installing ${need_apt[*]} with apt-get" >&2
    sudo_=""
    [ "$(id -u)" -eq 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: Rust (stable, with cargo) is required: see https://rustup.rs" >&2
    exit 1
fi

[ "$job" = test ] || exit 0

rustup component add rustfmt clippy >/dev/null 2>&1 || true
# The board crate's tests are cross-built for aarch64 (scripts/test.sh).
rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || true

# The Python packages for the bindings, the tests, the plots and the API reference.
py="${PYTHON:-python3}"
missing=$("$py" - <<'PY'
import importlib.util
mods = {"maturin": "maturin>=1.5,<2", "numpy": "numpy", "pytest": "pytest",
        "matplotlib": "matplotlib", "hypothesis": "hypothesis", "pdoc": "pdoc",
        "kubernetes_validate": "kubernetes-validate"}
print(" ".join(spec for m, spec in mods.items() if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
    echo "setup: pip installing $missing" >&2
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet $missing
fi
