#!/usr/bin/env bash
# Installs what corefarm needs on a fresh Debian/Ubuntu machine, skipping
# whatever is already there: a C/C++ toolchain and Verilator (apt), the Python
# packages for the bindings, tests and plots (pip), and checks for Rust.
set -euo pipefail

need_apt=()
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v verilator >/dev/null 2>&1 || need_apt+=(verilator)
# A private one-host Slurm cluster for deploy/slurm's test (tests/deploy).
command -v sbatch >/dev/null 2>&1 || need_apt+=(slurm-client)
[ -x /usr/sbin/slurmctld ] || need_apt+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need_apt+=(slurmd)
[ -x /usr/sbin/munged ] || need_apt+=(munge)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
# Images for ARM boards (image build --arch), checked under qemu-user.
command -v arm-linux-gnueabihf-g++ >/dev/null 2>&1 || need_apt+=(g++-arm-linux-gnueabihf)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need_apt+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need_apt+=(qemu-user)
# promtool checks the /metrics output; tmux drives `corefarm top` in a test.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
# Open MPI: the reference of the collectives benchmark (bench/mpi/README.md).
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
# The TLS tests make their certificates with the commands of docs/operations.md.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
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
rustup component add rustfmt clippy >/dev/null 2>&1 || true

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
