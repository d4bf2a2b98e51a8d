"""Resolve a small Maven pom's runtime jars into a cache, once.

Why Maven and not a tarball: this project's machines reach Maven Central and no download site,
and a pom pins exact versions that `mvn dependency:copy-dependencies` resolves with checksums.
The result is cached per pom content, so a second start costs a directory listing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import structlog

__all__ = ["MAVEN_SETTINGS", "OPS_DIR", "ProvisionError", "resolve_jars"]

log = structlog.get_logger(__name__)

#: Where resolved jars live; survives across data dirs so every Kafka start after the first is fast.
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "apexps"

#: Resolving a Kafka broker's ~80 jars takes about a minute on a cold Maven repository.
MAVEN_TIMEOUT_S = 900


class ProvisionError(RuntimeError):
    """Maven is missing or could not resolve the jars; the message says what to do."""


#: The Maven files (poms, settings) stay in ops/ beside the other build files; the installed
#: package reads them from the checkout it was installed from (`pip install -e`, as ops/bootstrap
#: and the Dockerfile do). APEXPS_OPS_DIR names another copy.
OPS_DIR = Path(os.environ.get("APEXPS_OPS_DIR") or Path(__file__).resolve().parents[2] / "ops")
MAVEN_SETTINGS = OPS_DIR / "maven-settings.xml"


def _settings_args() -> list[str]:
    """$APEXPS_MAVEN_SETTINGS, else the user's own ~/.m2/settings.xml, else ours."""
    given = os.environ.get("APEXPS_MAVEN_SETTINGS")
    if given:
        return ["-s", given]
    if (Path.home() / ".m2" / "settings.xml").exists():
        return []
    return ["-s", str(MAVEN_SETTINGS)]


def resolve_jars(pom: Path, name: str, cache_dir: Path | None = None) -> list[Path]:
    """Return the runtime classpath of `pom`, resolving it with Maven on first use."""
    if not pom.is_file():
        raise ProvisionError(
            f"{pom} not found: the Maven poms are read from the apexps checkout (install it with "
            "`pip install -e CHECKOUT`) or from APEXPS_OPS_DIR"
        )
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    target = (cache_dir or DEFAULT_CACHE) / f"{name}-{digest}"
    stamp = target / ".complete"
    if not stamp.exists():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ProvisionError(
                "Maven (mvn) is needed to fetch the jars from Maven Central: "
                "install it (e.g. `apt-get install maven`) and retry"
            )
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log.info("resolving jars from Maven Central (first run only)", what=name, into=str(target))
        cmd = [
            mvn, "-B", "-q", *_settings_args(), "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp / 'lib'}", "-DincludeScope=runtime",
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ProvisionError(
                f"mvn timed out after {MAVEN_TIMEOUT_S}s resolving {name}") from exc
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise ProvisionError(
                f"mvn could not resolve {name} (exit {proc.returncode}); is Maven Central "
                "reachable? Last lines:\n" + "\n".join(tail)
            )
        (tmp / ".complete").write_text(digest)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return sorted((target / "lib").glob("*.jar"))
