"""A one-node Slurm on this machine, for the dask-jobqueue tests.

:func:`local_slurm` installs Debian's ``slurmctld slurmd munge slurm-client``
with apt-get when ``slurmctld`` is missing (root only, non-interactive, with a
time limit), writes a munge key and a ``slurm.conf`` for this host under a
private folder, starts ``munged``, ``slurmctld`` and ``slurmd`` in the
foreground as children, waits for ``sinfo`` to show the node idle, and stops
exactly those processes by PID afterwards. Every step that cannot be done
raises :class:`SlurmUnavailable` with the reason, which the fixture turns into
a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

PACKAGES = ["slurmctld", "slurmd", "munge", "slurm-client"]
INSTALL_TIMEOUT = 240


class SlurmUnavailable(Exception):
    pass


def _run(cmd: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def ensure_installed() -> None:
    """Install the Slurm and munge packages when ``slurmctld`` is missing (root with apt-get only)."""
    if all(shutil.which(p) or os.path.exists(f"/usr/sbin/{p}") for p in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm is not installed and installing it needs root")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it with")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        r = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], INSTALL_TIMEOUT, env)
        if r.returncode != 0:  # a stale package index: update once and try again
            _run(["apt-get", "update", "-q"], INSTALL_TIMEOUT, env)
            r = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], INSTALL_TIMEOUT, env)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"installing {' '.join(PACKAGES)} took more than {INSTALL_TIMEOUT} s") from None
    if r.returncode != 0:
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {r.stderr.strip()[-500:]}")


def _sbin(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if found is None:
        raise SlurmUnavailable(f"{name} not found after installation")
    return found


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def write_config(root: str, host: str, cpus: int, memory_mb: int, port: int) -> str:
    """A ``slurm.conf`` for one node ``host`` under ``root``; returns its path."""
    for d in ("state", "spool", "log"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""\
ClusterName=gpuzarr-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort={port}
SlurmdPort={port + 1}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
InactiveLimit=0
KillWait=5
MinJobAge=30
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={host} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    return conf


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise SlurmUnavailable("no two free ports next to each other")


def _start_munge(root: str) -> subprocess.Popen:
    key = os.path.join(root, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = os.path.join(root, "munge.socket")
    munged = _sbin("munged")
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, exist_ok=True)
    proc = subprocess.Popen(
        [munged, "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
         f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed", f"--log-file={root}/log/munged.log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    for _ in range(100):
        if os.path.exists(sock):
            return proc
        if proc.poll() is not None:
            raise SlurmUnavailable(f"munged exited: {proc.stderr.read().decode(errors='replace')[-500:]}")
        time.sleep(0.1)
    proc.kill()
    raise SlurmUnavailable("munged did not create its socket")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@contextlib.contextmanager
def local_slurm(root: str) -> Iterator[dict[str, str]]:
    """Run munged, slurmctld and slurmd for this host under ``root``; yield the environment for Slurm commands.

    The yielded mapping (``SLURM_CONF``, and munge's socket through the
    config) is what ``sbatch``/``squeue``/``scancel`` and dask-jobqueue need.
    """
    ensure_installed()
    os.makedirs(root, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    port = _free_port_pair()
    conf = write_config(root, host, os.cpu_count() or 1, max(512, _memory_mb() - 512), port)
    procs: list[subprocess.Popen] = []
    try:
        munge = _start_munge(root)
        procs.append(munge)
        sock = os.path.join(root, "munge.socket")
        with open(conf, "a") as f:
            f.write(f"AuthInfo=socket={sock}\n")
        env = dict(os.environ, SLURM_CONF=conf)
        procs.append(subprocess.Popen([_sbin("slurmctld"), "-D", "-i", "-f", conf], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        procs.append(subprocess.Popen([_sbin("slurmd"), "-D", "-f", conf], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        sinfo = shutil.which("sinfo") or "/usr/bin/sinfo"
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            for p, name in zip(procs, ("munged", "slurmctld", "slurmd")):
                if p.poll() is not None:
                    log = p.stderr.read().decode(errors="replace")[-800:] if p.stderr else ""
                    raise SlurmUnavailable(f"{name} exited with status {p.returncode}: {log}")
            r = _run([sinfo, "-h", "-N", "-o", "%T"], 10, env)
            state = r.stdout.strip()
            if r.returncode == 0 and state.startswith("idle"):
                break
            time.sleep(0.5)
        else:
            raise SlurmUnavailable(f"the Slurm node did not become idle in 60 s (state {state!r})")
        yield {"SLURM_CONF": conf}
    finally:
        _stop(procs)
