"""deploy/slurm against a real Slurm: a one-host cluster (munged, slurmctld,
slurmd from Debian's packages) with two `fpga:cyclonev` boards as a generic
resource, the prolog hook programming them, and deploy/slurm/corefarm.sbatch
submitted with the saxpy user program, which checks every result.

Everything runs in a temporary directory with its own munge socket and
configuration (SLURM_CONF), on free loopback ports, and is torn down at the
end: nothing of the host's Slurm (if any) is touched."""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import find_binary  # noqa: E402

TOOLS = ["munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol"]
BOARDS = 2


def need(tool):
    path = shutil.which(tool) or next(
        (p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.skip(f"{tool} not installed (apt-get install slurmctld slurmd slurm-client munge)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_for(what, check, timeout):
    """Polls `check` until it returns a true value (a signal: a file, a
    command's answer), failing with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class SlurmCluster:
    def __init__(self, d: pathlib.Path):
        self.d = d
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
        self.host = socket.gethostname().split(".")[0]

    def write_config(self, prolog):
        d = self.d
        os.chmod(d, 0o755)  # munged requires a socket directory everyone may enter
        (d / "spool").mkdir()
        (d / "state").mkdir()
        (d / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(d / "munge.key", 0o400)
        (d / "gres.conf").write_text(f"Name=fpga Type=cyclonev Count={BOARDS}\n")
        (d / "slurm.conf").write_text(f"""\
ClusterName=corefarmtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
GresTypes=fpga
Prolog={prolog}
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} Gres=fpga:cyclonev:{BOARDS} State=UNKNOWN
PartitionName=fpga Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self):
        d = self.d
        munged = need("munged")
        subprocess.run([munged, f"--socket={d}/munge.sock", f"--key-file={d}/munge.key",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munged.seed", "--force"], check=True, env=self.env)
        wait_for("munged", lambda: (d / "munged.pid").exists(), 20)
        for daemon in ("slurmctld", "slurmd"):
            self.procs.append(subprocess.Popen([need(daemon), "-D"], env=self.env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        wait_for("the Slurm host to be idle", lambda: self.state() in ("idle", "idle~"), 60)

    def state(self):
        p = subprocess.run([need("sinfo"), "-h", "-N", "-o", "%T"], env=self.env,
                           capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else ""

    def stop(self):
        subprocess.run([shutil.which("scancel") or "scancel", "--full", "-u", "root"], env=self.env,
                       capture_output=True)
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        pidfile = self.d / "munged.pid"
        if pidfile.exists():
            try:
                pid = int(pidfile.read_text().strip())
                os.kill(pid, signal.SIGTERM)
                wait_for("munged to exit", lambda: not pid_alive(pid), 20)
            except (ProcessLookupError, ValueError):
                pass

    def logs(self):
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-4000:]}"
                         for f in sorted(self.d.glob("*.log")))


@pytest.fixture
def cluster():
    for t in TOOLS:
        need(t)
    if os.geteuid() != 0:
        pytest.skip("a private Slurm cluster needs root (slurmd runs jobs as their users)")
    with tempfile.TemporaryDirectory(prefix="corefarm-slurm-") as d:
        c = SlurmCluster(pathlib.Path(d))
        # The prolog runs from the temporary directory with a prolog.conf
        # whose "programmer" records each board it programmed.
        prolog = c.d / "prolog.sh"
        shutil.copy(ROOT / "deploy" / "slurm" / "prolog.sh", prolog)
        (c.d / "base.rbf").write_bytes(b"base bitstream")
        (c.d / "prolog.conf").write_text(
            f"BOARDS={BOARDS}\nBASE_BITSTREAM={c.d}/base.rbf\n"
            f"PROGRAMMER='cp {{bitstream}} {c.d}/board{{board}}.programmed'\n")
        c.write_config(prolog)
        try:
            c.start()
            yield c
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.stop()


def test_batch_script_runs_a_checked_job_on_two_boards(cluster):
    corefarm = find_binary()
    if corefarm is None:
        pytest.skip("no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler ($CXX / c++) to build the saxpy image")
    d = cluster.d
    image = d / "saxpy.cfimg"
    subprocess.run([corefarm, "image", "build", "--hls", "examples/saxpy/saxpy.cpp", "--entry", "saxpy",
                    "--cores", "2", "--name", "saxpy", "-o", image], cwd=ROOT, check=True,
                   capture_output=True)
    out = d / "job.out"
    # Authenticated, as a real site would run it: an auth file for the
    # server, the node and user secrets for the job's peers.
    secrets = {"users": os.urandom(24).hex(), "nodes": os.urandom(24).hex()}
    auth = d / "auth.toml"
    auth.write_text("".join(f'[{k}]\nsecret = "{v}"\n' for k, v in secrets.items()))
    for k, v in secrets.items():
        (d / f"{k}.secret").write_text(v)
    for f in (auth, d / "users.secret", d / "nodes.secret"):
        os.chmod(f, 0o600)
    env = dict(cluster.env, COREFARM_BIN=corefarm, COREFARM_NODE_ARGS="--backends native",
               COREFARM_AUTH_FILE=str(auth), COREFARM_NODE_SECRET_FILE=str(d / "nodes.secret"),
               COREFARM_USER_SECRET_FILE=str(d / "users.secret"))
    user = f'exec {sys.executable} examples/saxpy/run.py "$COREFARM_SERVER" {image} --inputs 400'
    p = subprocess.run([need("sbatch"), "--wait", f"--gres=fpga:cyclonev:{BOARDS}", "--chdir", str(ROOT),
                        "-o", str(out), str(ROOT / "deploy" / "slurm" / "corefarm.sbatch"),
                        "sh", "-c", user], env=env, capture_output=True, text=True, timeout=300)
    text = out.read_text() if out.exists() else ""
    assert p.returncode == 0, f"sbatch: {p.stdout}{p.stderr}\njob output:\n{text}\n{cluster.logs()}"
    # Both boards were node managers, and the user program checked every result.
    assert f"cluster ready: {BOARDS} node managers" in text, text
    assert f"400 inputs on {BOARDS} nodes" in text and "all results correct" in text, text
    # The prolog programmed each board with the base bitstream before the job.
    for b in range(BOARDS):
        assert (d / f"board{b}.programmed").read_bytes() == b"base bitstream"
    # The job tore its processes down: nothing of it is left running. Only
    # this job's processes count (their command lines name its secret
    # files): other corefarm processes of the machine are not the job's.
    leftover = subprocess.run(["pgrep", "-f", f"{corefarm} (server|node) .*{d}/"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"left running: {leftover.stdout}"
