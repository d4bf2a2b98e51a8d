"""A real Spark standalone cluster for tests: one master and one worker, started from pyspark's
own scripts on loopback, and a way to run a job against it.

`spark_cluster` (session-wide) starts `$SPARK_HOME/bin/spark-class ...deploy.master.Master` and
`...deploy.worker.Worker` (SPARK_HOME is pyspark's package directory: a pip-installed pyspark is
a whole Spark distribution), each on port 0. It learns the master's URL and web UI port from
the master's log line, then polls the master's JSON status (`/json/`) until the worker shows
ALIVE; the test never sleeps for a fixed time. Both are stopped at the end of the session.

The executors must not find apexps where the test runner does, or the test could not tell
whether the job shipped its Python: their interpreter (`executor_python`) is a venv with
apexps's dependencies (a plain path to the test venv's site-packages, in which the editable
install's finder is not run) but not apexps itself, like a cluster node with pyspark and the
libraries from its image. So `broker` is importable there only if `adapters.local.spark`
shipped it.

A job runs in a driver process of its own (`run_on_cluster`): one Python process holds one
SparkContext, and the test session's own is the local[2] `spark` fixture. The child imports a
function by name, calls it with a session on the cluster and the given keyword arguments, and
hands back its (pickled) result.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import venv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: How long a daemon may take to say it is up, and a worker to register (JVM starts on a
#: loaded two-core machine take seconds, not minutes).
START_TIMEOUT_S = 120.0
#: A job on the cluster: JVM start, jar upload, the job itself.
JOB_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: where to submit, where its status is, who runs Python."""

    master_url: str          #: spark://127.0.0.1:PORT
    ui_url: str              #: http://127.0.0.1:PORT (the master's web UI and /json/)
    executor_python: Path    #: the executors' interpreter (apexps's dependencies, not apexps)

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, their state, cores, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=10) as r:
            return dict(json.load(r))


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _daemon_env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_CONF_DIR")}
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(log_dir),
               # Small daemons: the machine is shared; master and worker only coordinate.
               SPARK_DAEMON_MEMORY="512m")
    return env


class _Daemon:
    """One spark-class process in the foreground, its output in a log file."""

    def __init__(self, name: str, cls: str, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), cls, *args], stdout=out,
                stderr=subprocess.STDOUT, env=_daemon_env(log_dir), start_new_session=True)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, pattern: str) -> re.Match[str]:
        """Poll the log until `pattern` appears (or the process dies, or time runs out)."""
        regex = re.compile(pattern)
        found: list[re.Match[str]] = []

        def seen() -> bool:
            m = regex.search(self.log.read_text(errors="replace"))
            if m:
                found.append(m)
            return m is not None

        _await(seen, f"{self.name} to log {pattern!r}", self)
        return found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _await(condition: Callable[[], bool], what: str, daemon: _Daemon) -> None:
    """Poll `condition` until true; fail with the daemon's log if it dies or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if daemon.proc.poll() is not None:
            pytest.fail(f"{daemon.name} exited ({daemon.proc.returncode}) while waiting for "
                        f"{what}:\n{daemon.tail()}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{daemon.tail()}", pytrace=False)
        time.sleep(0.2)  # a poll interval, not a wait for the event


def deps_only_python(where: Path) -> Path:
    """A venv whose Python sees this one's site-packages as a plain path: apexps's dependencies
    import, apexps does not (the editable install's .pth finder is not run there)."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    site = next((where / "lib").glob("python3*/site-packages"))
    (site / "apexps_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "bin" / "python"


def _alive_workers(cluster: SparkCluster) -> int:
    try:
        return sum(w.get("state") == "ALIVE" for w in cluster.status().get("workers", []))
    except OSError:
        return 0


@pytest.fixture(scope="session", name="spark_cluster")
def _spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and one two-core worker on loopback, up until the session ends."""
    base = tmp_path_factory.mktemp("spark-cluster")
    python = deps_only_python(base / "executor-venv")
    master = _Daemon("master", "org.apache.spark.deploy.master.Master",
                     ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"], base)
    worker: _Daemon | None = None
    try:
        url = master.wait_for(r"Starting Spark master at (spark://\S+)").group(1)
        ui_port = master.wait_for(r"MasterWebUI: Bound MasterWebUI .* started at "
                                  r"http://\S+:(\d+)").group(1)
        cluster = SparkCluster(url, f"http://127.0.0.1:{ui_port}", python)
        (base / "work").mkdir()
        worker = _Daemon("worker", "org.apache.spark.deploy.worker.Worker",
                         ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                          "--cores", "2", "--memory", "2g", "--work-dir", str(base / "work"),
                          url], base)
        _await(lambda: _alive_workers(cluster) == 1, "the worker to be ALIVE at the master",
               worker)
        yield cluster
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


def run_on_cluster(cluster: SparkCluster, target: str, workdir: Path, **kwargs: Any) -> Any:
    """Run `target` ("module:function", called as function(spark, **kwargs)) in a driver of its
    own against `cluster`; return what it returned. Fails with the driver's output if it fails."""
    out = workdir / "result.pickle"
    job = json.dumps({"master": cluster.master_url, "target": target, "kwargs": kwargs,
                      "out": str(out)})
    env = {**os.environ, "PYSPARK_PYTHON": str(cluster.executor_python),
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-m", "tests.spark_cluster", job], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"the job on the cluster failed ({proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}", pytrace=False)
    return pickle.loads(out.read_bytes())


def _child(job: dict[str, Any]) -> None:
    from adapters.local.spark import session

    module, _, name = job["target"].partition(":")
    function = getattr(importlib.import_module(module), name)
    spark = session(app_name="apexps-cluster-test", master=job["master"])
    try:
        result = function(spark, **job["kwargs"])
    finally:
        spark.stop()
    Path(job["out"]).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
