"""A real single-node Apache Kafka (KRaft, broker+controller in one JVM), without Docker.

Theory of operation
-------------------
`kafka-storage.sh` and `kafka-server-start.sh` are thin wrappers: they run `kafka.tools.StorageTool`
and `kafka.Kafka` from the `kafka_2.13` artifact. So the runtime classpath of `ops/kafka/pom.xml`
(resolved once from Maven Central, see adapters/local/provision.py) is a complete broker, and this
module does what the scripts do: write `server.properties`, format the storage once, start the JVM
detached, wait until the broker answers a metadata request, and stop it with SIGTERM (a
controlled shutdown) before falling back to SIGKILL.

Everything about one Kafka lives in its data directory:

    DATA/server.properties   generated config
    DATA/kafka.json          pid, ports, cluster id: what `status` and a restart read
    DATA/kafka-logs/         the log segments (the journal's durable home)
    DATA/logs/server.log     the broker's own log
    DATA/logs/gc.log         the JVM's collections, one line per pause (rotated, 5 x 10 MB)

A restart on the same data directory keeps the ports (clients reconnect to the address they
knew) and the cluster id, and so every topic and record.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from adapters.local.provision import OPS_DIR, resolve_jars
from broker.kafka_io import answers
from broker.kafka_producer import warm

__all__ = ["COLLECTORS", "DEFAULT_GC", "DEFAULT_HEAP", "DEFAULT_JIT", "JITS", "KAFKA_POM",
           "KafkaLaunchError", "KafkaState", "LocalKafka"]

log = structlog.get_logger(__name__)

KAFKA_POM = OPS_DIR / "kafka" / "pom.xml"

#: A cold JVM formats and elects itself controller in ~10 s on two cores; leave room for a
#: loaded CI machine.
DEFAULT_START_TIMEOUT_S = 120.0
#: A controlled shutdown of one node normally takes 2-5 s.
DEFAULT_STOP_TIMEOUT_S = 60.0
#: Enough for the journal's batches; the machine has 24 GiB but tests also run Spark.
DEFAULT_HEAP = "1g"

#: The collectors `apexps kafka start --gc` offers (all in OpenJDK 17); bench_kafka_gc.py
#: compares them (a fresh Kafka each, W2 of bench_peers three times, the JVM's safepoints from
#: DATA/logs/gc.log, which logs every one whatever the collector). 2026-11-26, load 9-12:
#:   G1:         its pauses mean 41 ms, max 124 (8 in 3 W2 runs: young collections and a
#:               remark); Kafka 193-406 µs CPU per message
#:   ZGC:        mean 0.38 ms, max 2.0 (ZMarkEnd); Kafka 207-221 µs
#:   Shenandoah: mean 0.29 ms, max 1.2; Kafka 212-284 µs
#: (an earlier sitting, load 8-12: G1 max 205 ms, ZGC's longest 2.1 ms.) W2's p99 could not
#: tell them apart that evening: the machine's load put p50 itself at 50-300 ms; issue 21's
#: quieter table read p99 36 ms on G1, 9.3 on ZGC. So ZGC: no pause of its own above 2 ms,
#: no more CPU than G1, Shenandoah's pauses as short but its CPU less steady. Earlier G1
#: tuning (young pauses, two bench_pubsub runs each): as is, mean 23 ms, max 57;
#: MaxGCPauseMillis=20, mean 25, max 230; SerialGC, mean 30, max 57.
#: ZGC without its proactive cycles (2026-11-27): on a fresh Kafka ZGC ran one every 7-20 s
#: whatever the heap's use (30-50 %), each a core's worth of concurrent marking for a moment,
#: and W2's stalls of 100-125 ms fell on them in three sittings (`bench_peers --timeline`
#: beside DATA/logs/gc.log). Without, it collects on its warm-up thresholds, the allocation
#: rate and high usage: 1-2 cycles in a 3-run W2 against 4-6, and in three alternated rounds
#: of `bench_kafka_gc --collectors ZGC --jits C1 --runs 3` (proactive on, then off) W2's p99
#: by run read 8.7, 4.0, 3.2 | 5.8, 3.4, 2.7 | 3.5, 3.8, 3.1 ms on, 4.3, 3.7, 3.7 | 2.5, 3.0,
#: 3.8 | 3.3, 3.8, 6.3 ms off. The price: the heap fills further before a cycle, so the JVM
#: holds up to its -Xmx (1 GiB) under load where it held about half.
COLLECTORS: dict[str, tuple[str, ...]] = {
    "G1": ("-XX:+UseG1GC",),
    "ZGC": ("-XX:+UseZGC", "-XX:-ZProactive"),
    "Shenandoah": ("-XX:+UseShenandoahGC",),
}
#: How the JVM compiles Kafka: "C1", its quick compiler alone (`-XX:TieredStopAtLevel=1`), or
#: "tiered", C1 then C2 on the hot paths (the JVM's own default). Measured on fresh Kafkas, W2
#: of bench_peers as the first load after the start (2026-11-27; docs/bench-peers.md, "A fresh
#: Kafka's first minute"): tiered, the first run read p99 24-223 ms (11 Kafkas), its Kafka CPU
#: 545-664 µs a message against 185-270 once compiled: C2 compiling Kafka's hot paths through
#: the first minute of load, a core's worth at moments, on two cores beside the broker and its
#: clients. Renicing the compiler threads or a 30,000-record warm-up still left 6-185 ms. C1:
#: first runs 3.2-10.6 ms (8 Kafkas), no W2 run over 10.6 ms; the price is Kafka's CPU at
#: 1,000 msgs/s, 276-340 µs a message against tiered's 185-270, and nothing measurable flat out
#: (W1, W3: Kafka spends 9-16 µs a message there either way). In one `bench_kafka_gc --jits
#: C1,tiered --runs 2 --rounds 2`: C1 3.7, 4.2 | 3.8, 3.3 ms; tiered 53.5, 5.4 | 223, 4.1 ms.
#: A Kafka that runs for weeks on more cores should keep tiered (docs/operations.md).
JITS: dict[str, tuple[str, ...]] = {
    "C1": ("-XX:TieredStopAtLevel=1",),
    "tiered": (),
}
DEFAULT_JIT = "C1"
#: The default collector (above). An operator may set KAFKA_JVM_PERFORMANCE_OPTS as for
#: Kafka's own scripts, which replaces these options.
DEFAULT_GC = "ZGC"

LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={log}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=3
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.controller=INFO
"""


class KafkaLaunchError(RuntimeError):
    """The local Kafka could not be started or stopped; the message says where to look."""


@dataclass(frozen=True)
class KafkaState:
    """What `kafka.json` records about a local Kafka."""

    pid: int
    port: int
    controller_port: int
    cluster_id: str
    host: str = "127.0.0.1"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists"; reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _new_cluster_id() -> str:
    # Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 bytes, no padding.
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class LocalKafka:
    """One local Kafka, owned by a data directory."""

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 heap: str = DEFAULT_HEAP, gc: str = DEFAULT_GC, jit: str = DEFAULT_JIT) -> None:
        if gc not in COLLECTORS:
            raise ValueError(f"unknown collector {gc!r}: one of {', '.join(COLLECTORS)}")
        if jit not in JITS:
            raise ValueError(f"unknown JIT mode {jit!r}: one of {', '.join(JITS)}")
        self.data_dir = Path(data_dir).absolute()
        self.host = host
        self.requested_port = port
        self.heap, self.gc, self.jit = heap, gc, jit

    # --- paths ----------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.data_dir / "kafka.json"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    @property
    def console_file(self) -> Path:
        return self.data_dir / "logs" / "console.log"

    def read_state(self) -> KafkaState | None:
        try:
            return KafkaState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def status(self) -> tuple[KafkaState | None, bool]:
        """(recorded state or None, whether its process is alive and answering)."""
        state = self.read_state()
        if state is None or not _alive(state.pid):
            return state, False
        return state, answers(state.bootstrap, timeout_s=3.0)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = DEFAULT_START_TIMEOUT_S, *,
              warm_up: bool = True) -> KafkaState:
        """Start Kafka (or return the one already running on this data dir) and wait for it
        to answer and, with `warm_up`, to have served a warm-up load (`kafka_producer.warm`)."""
        old = self.read_state()
        if old is not None and _alive(old.pid):
            if answers(old.bootstrap, timeout_s=10.0):
                log.info("kafka already running", bootstrap=old.bootstrap, pid=old.pid)
                return old
            raise KafkaLaunchError(
                f"a process {old.pid} from {self.state_file} is alive but Kafka does not answer "
                f"at {old.bootstrap}; stop it (`apexps kafka stop --data-dir {self.data_dir}`)"
            )
        jars = resolve_jars(KAFKA_POM, "kafka")
        port, cport = self._choose_ports(old)
        cluster_id = old.cluster_id if old else _new_cluster_id()
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        props = self._write_config(port, cport)
        if not (self.data_dir / "kafka-logs" / "meta.properties").exists():
            self._format(jars, props, cluster_id)
        cmd = [*self._java(jars), "kafka.Kafka", str(props)]
        console = self.console_file.open("ab")
        # A session of its own: Ctrl-C in the terminal goes to apexps, which stops Kafka
        # in order (broker first, then Kafka), rather than killing both at once.
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        console.close()
        state = KafkaState(pid=proc.pid, port=port, controller_port=cport,
                           cluster_id=cluster_id, host=self.host)
        self.state_file.write_text(json.dumps(asdict(state)))
        log.info("kafka starting", bootstrap=state.bootstrap, pid=proc.pid,
                 data_dir=str(self.data_dir))
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise KafkaLaunchError(
                    f"kafka exited with {proc.returncode} while starting; see {self.log_file} "
                    f"and {self.console_file}"
                )
            if answers(state.bootstrap, timeout_s=2.0):
                if warm_up:
                    warm(state.bootstrap)
                log.info("kafka ready", bootstrap=state.bootstrap)
                return state
            time.sleep(delay)  # polling a process we do not control: there is no event to await
            delay = min(delay * 2, 1.0)
        self.stop()
        raise KafkaLaunchError(f"kafka did not answer within {timeout_s:.0f}s; see {self.log_file}")

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """Stop the Kafka of this data dir; True if one was running."""
        state = self.read_state()
        if state is None or not _alive(state.pid):
            return False
        log.info("kafka stopping", pid=state.pid)
        os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(state.pid):
                log.info("kafka stopped", pid=state.pid)
                return True
            time.sleep(0.1)
        log.warning("kafka did not stop in time; killing it", pid=state.pid)
        self.kill()
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would: what failure tests use."""
        state = self.read_state()
        if state is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGKILL)
        while _alive(state.pid):
            time.sleep(0.05)

    # --- internals ------------------------------------------------------------------------

    def _choose_ports(self, old: KafkaState | None) -> tuple[int, int]:
        if self.requested_port is not None:
            port = self.requested_port
        elif old is not None and _port_free(self.host, old.port):
            port = old.port
        else:
            port = _free_port(self.host)
        if old is not None and old.controller_port != port and _port_free(self.host,
                                                                          old.controller_port):
            cport = old.controller_port
        else:
            cport = _free_port(self.host)
            while cport == port:
                cport = _free_port(self.host)
        return port, cport

    def _write_config(self, port: int, cport: int) -> Path:
        h = self.host
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{h}:{cport}",
            "listeners": f"PLAINTEXT://{h}:{port},CONTROLLER://{h}:{cport}",
            "advertised.listeners": f"PLAINTEXT://{h}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "kafka-logs"),
            "num.partitions": "1",
            # One node: every internal topic can only have one replica.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Compacted registries should compact soon after a test or a restart touches them.
            "log.cleaner.backoff.ms": "5000",
            "auto.create.topics.enable": "false",
        }
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.data_dir / "log4j.properties").write_text(
            LOG4J_PROPERTIES.format(log=self.log_file)
        )
        return path

    def _java(self, jars: list[Path]) -> list[str]:
        java = os.environ.get("JAVA_HOME")
        exe = str(Path(java) / "bin" / "java") if java else "java"
        perf = os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS")
        gc_log = self.data_dir / "logs" / "gc.log"
        return [
            exe, f"-Xmx{self.heap}", "-Xms256m",
            *(perf.split() if perf
              else (*COLLECTORS[self.gc], *JITS[self.jit], "-Djava.awt.headless=true")),
            f"-Xlog:gc,safepoint:file={gc_log}:time,uptime:filecount=5,filesize=10M",
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            "-cp", os.pathsep.join(str(j) for j in jars),
        ]

    def _format(self, jars: list[Path], props: Path, cluster_id: str) -> None:
        # --cluster-id=ID, not -t ID: a base64url id may start with "-" and read as an option.
        cmd = [*self._java(jars), "kafka.tools.StorageTool", "format",
               f"--cluster-id={cluster_id}", "-c", str(props), "--ignore-formatted"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise KafkaLaunchError(f"formatting Kafka storage failed: {proc.stderr or proc.stdout}")
        log.info("kafka storage formatted", cluster_id=cluster_id)
