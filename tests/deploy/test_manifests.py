"""The static deployment files: systemd units pass `systemd-analyze verify`
without a warning, the Kubernetes manifests pass the API schemas offline
(kubernetes-validate, strict), and every corefarm flag any of them (or the
Slurm batch script) passes exists in the binary's --help, so the files cannot
drift from the command line."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import find_binary  # noqa: E402


@pytest.fixture(scope="module")
def corefarm_bin():
    b = find_binary()
    if b is None:
        pytest.skip("no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
    return b


def test_systemd_units_verify_cleanly(corefarm_bin, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert len(units) == 2
    for unit in units:
        # verify checks that ExecStart's program exists: point it at the build.
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/local/bin/corefarm", corefarm_bin))
    p = subprocess.run([analyze, "verify", *sorted(map(str, tmp_path.glob("*.service")))],
                       capture_output=True, text=True)
    # verify exits 0 on unknown keys and bad values: any output is a defect.
    assert p.returncode == 0 and (p.stdout + p.stderr).strip() == "", p.stdout + p.stderr


def test_kubernetes_manifests_match_the_api_schemas():
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        pytest.skip("kubernetes-validate not installed (pip install kubernetes-validate)")
    files = sorted(map(str, (DEPLOY / "kubernetes").glob("*.yaml")))
    assert files
    p = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *files],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def flags_used():
    """(subcommand, flag) pairs the deployment files pass to corefarm."""
    used = set()
    for f in (DEPLOY / "kubernetes").glob("*.yaml"):
        for m in re.finditer(r'args: \["(server|node)"(.*?)\]', f.read_text(), re.S):
            used |= {(m[1], flag) for flag in re.findall(r'"(--[a-z-]+)"', m[2])}
    for f in (DEPLOY / "systemd").glob("*.service"):
        cmd = "server" if "server" in f.name else "node"
        for line in f.read_text().splitlines():
            if line.startswith("#") and "_ARGS=" in line:
                used |= {(cmd, flag) for flag in re.findall(r"(--[a-z-]+)", line)}
    text = (DEPLOY / "slurm" / "corefarm.sbatch").read_text()
    for cmd in ("server", "node", "status"):
        for m in re.finditer(rf'"\$(?:bin|0)" {cmd} ([^\n]*)', text):
            used |= {(cmd, flag) for flag in re.findall(r"(--[a-z-]+)", m[1])}
    return used


def test_every_flag_the_deployment_files_pass_exists(corefarm_bin):
    used = flags_used()
    # The scan must find the flags it is meant to guard.
    assert {("server", "--nodes-listen"), ("node", "--server"), ("status", "--json")} <= used
    helps = {}
    for cmd, flag in sorted(used):
        if cmd not in helps:
            helps[cmd] = subprocess.run([corefarm_bin, cmd, "--help"], capture_output=True, text=True,
                                        check=True).stdout
        assert re.search(rf"{re.escape(flag)}\b", helps[cmd]), f"`corefarm {cmd}` has no {flag}"


def test_prolog_and_batch_script_parse():
    for script in ("corefarm.sbatch", "prolog.sh"):
        subprocess.run(["bash", "-n", str(DEPLOY / "slurm" / script)], check=True)
        assert os.access(DEPLOY / "slurm" / script, os.X_OK)
