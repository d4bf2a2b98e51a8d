"""`apexps users add`, and `apexps send`/`listen` with --tls/--ca/--user against a relay that
requires TLS and authentication, as separate processes over real TCP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import trustme

from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer
from adapters.cli.main import build_parser
from adapters.cli.security import load_users, server_security

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]


def _users_add(path: Path, name: str, password: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APEXPS, "users", "add", name, "--file", str(path),
                           "--iterations", "4096"], input=password + "\n", text=True,
                          capture_output=True, timeout=60)


def test_users_add_writes_only_salted_keys(tmp_path: Path) -> None:
    """users add reads the password from stdin, stores SCRAM keys (never the password), and
    replaces an existing user's."""
    path = tmp_path / "users"
    assert _users_add(path, "fred", "yabba dabba doo").returncode == 0
    done = _users_add(path, "fred", "new secret")
    assert done.returncode == 0 and "updated fred" in done.stderr
    assert _users_add(path, "barney", "betty").returncode == 0
    text = path.read_text()
    assert "secret" not in text and "betty" not in text
    assert path.stat().st_mode & 0o077 == 0
    users = load_users(str(path))
    assert users.verify("fred", "new secret") and not users.verify("fred", "yabba dabba doo")
    assert users.verify("barney", "betty")
    bad = _users_add(path, "a:b", "x")
    assert bad.returncode == 1 and "user name" in bad.stderr


def test_server_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    """--require-tls without a certificate, or a missing users file, fail with a clear error."""
    done = subprocess.run([*APEXPS, "broker", "--bootstrap", "127.0.0.1:1", "--require-tls"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "--require-tls needs --tls-cert" in done.stderr
    done = subprocess.run([*APEXPS, "broker", "--bootstrap", "127.0.0.1:1", "--users",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot read users file" in done.stderr


async def _exchange(tmp_path: Path) -> tuple[dict[str, object], int, int, str]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    users = tmp_path / "users"
    assert _users_add(users, "fred", "yabba dabba doo").returncode == 0
    assert _users_add(users, "barney", "betty").returncode == 0
    args = build_parser().parse_args([
        "broker", "--bootstrap", "unused:1", "--tls-cert", str(tmp_path / "server.pem"),
        "--require-tls", "--users", str(users), "--require-auth"])
    async with ApexServer(Relay("example.com"), **server_security(args)) as server:
        where = f"127.0.0.1:{server.port}"
        tls = ["--tls", "--ca", str(tmp_path / "ca.pem")]
        listener = await asyncio.create_subprocess_exec(
            *APEXPS, "listen", "--server", where, "--as", "barney@example.com", "--count", "1",
            *tls, "--user", "barney", "--mechanism", "PLAIN",
            env={**os.environ, "APEXPS_PASSWORD": "betty"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert listener.stderr is not None and listener.stdout is not None
        while b"attached as" not in await asyncio.wait_for(listener.stderr.readline(), 30):
            pass
        sender = await asyncio.create_subprocess_exec(
            *APEXPS, "send", "--server", where, "--as", "fred@example.com", *tls,
            "--user", "fred", "--to", "barney@example.com", "-",
            env={**os.environ, "APEXPS_PASSWORD": "yabba dabba doo"},
            stdin=asyncio.subprocess.PIPE)
        await asyncio.wait_for(sender.communicate(b"over TLS, authenticated"), 30)
        line = await asyncio.wait_for(listener.stdout.readline(), 30)
        await asyncio.wait_for(listener.wait(), 30)
        impostor = await asyncio.create_subprocess_exec(
            *APEXPS, "send", "--server", where, "--as", "barney@example.com", *tls,
            "--user", "fred", "--to", "barney@example.com", "-",
            env={**os.environ, "APEXPS_PASSWORD": "yabba dabba doo"},
            stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(impostor.communicate(b"x"), 30)
        assert sender.returncode is not None and impostor.returncode is not None
        return json.loads(line), sender.returncode, impostor.returncode, err.decode()


def test_send_and_listen_over_tls_with_users(tmp_path: Path) -> None:
    """fred (SCRAM) reaches barney (PLAIN) under TLS; fred attaching as barney exits 1, 537."""
    record, sent, impostor, err = asyncio.run(_exchange(tmp_path))
    assert record["content"] == "over TLS, authenticated"
    assert record["originator"] == "fred@example.com"
    assert sent == 0
    assert impostor == 1 and "error 537" in err
