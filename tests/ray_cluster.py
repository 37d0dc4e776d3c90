"""A real Ray cluster for the cluster tests and bench/batch.py: a head and more nodes as separate processes on
127.0.0.1, inside a network and PID namespace of their own (`unshare -n -p`), so that Ray can advertise no
address but loopback and every process it starts ends with the namespace."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 6379  # the namespace has its own ports: nothing else listens there


def unusable() -> str | None:
    """Why a cluster cannot run here, or None."""
    if importlib.util.find_spec("ray") is None:
        return "needs the cluster extra (pip install 'aie-apps[cluster]')"
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (Debian util-linux, iproute2)"
    if os.geteuid() != 0:
        return "needs root for `unshare -n -p` (a private network namespace)"
    return None


class LocalCluster:
    """`nodes`: one dict per node, {"cpus": n, "resources": {...}}; the first is the head."""

    def __init__(self, nodes: list[dict]):
        self.nodes = nodes
        self.tmp = Path(tempfile.mkdtemp(prefix="aie-ray-"))  # short: Ray's socket paths must fit 107 bytes
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                    "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        self.holder = None
        self.init_pid = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{PORT}"

    def start(self) -> "LocalCluster":
        # unshare's own complaint when its child is killed at stop() is noise
        self.holder = subprocess.Popen(["unshare", "-n", "-p", "-f", "--mount-proc", "sleep", "infinity"],
                                       stderr=subprocess.DEVNULL)
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children")
        for _ in range(200):
            text = children.read_text().split() if children.exists() else []
            if text:
                self.init_pid = int(text[0])
                break
            time.sleep(0.01)
        else:
            self.stop()
            raise RuntimeError("unshare did not start its namespace")
        self.run(["ip", "link", "set", "lo", "up"])
        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--object-store-memory=200000000"]
        for i, node in enumerate(self.nodes):
            where = (["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={self.tmp}"] if i == 0
                     else [f"--address={self.address}"])
            resources = [f"--resources={json.dumps(node['resources'])}"] if node.get("resources") else []
            self.run([ray, "start", *where, *common, f"--num-cpus={node['cpus']}", *resources])
        return self

    def command(self, args: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--", *args]

    def run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("check", True)
        return subprocess.run(self.command(args), env=self.env, cwd=ROOT, capture_output=True, text=True, **kw)

    def cli(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """`aie-apps ARGS` inside the namespace (a new driver process)."""
        return self.run([sys.executable, "-m", "apps.main", *args], check=False, **kw)

    def cli_popen(self, *args: str) -> subprocess.Popen:
        """The command as a job a test may interrupt (SIGINT, as Ctrl-C does): a suite run in the background
        (`cmd &` without job control) has SIGINT ignored, which exec passes on, so the job gets it back."""
        return subprocess.Popen(self.command([sys.executable, "-m", "apps.main", *args]), env=self.env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def pids(self, needle: str) -> list[int]:
        """Processes of this namespace whose command line contains `needle` (pids as seen from outside)."""
        ours = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if os.readlink(proc / "ns/pid") == ours and needle in (proc / "cmdline").read_text():
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    def stop(self):
        """Kill the namespace's init: the kernel then ends every process in it, Ray's daemons and workers
        included, at once (what `ray stop --force` does, in ~25 s on a loaded 2-core machine)."""
        if self.init_pid:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.holder is not None:
            self.holder.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)
