"""TLS and SASL options shared by the server commands (`up`, `broker`) and the client commands
(`send`, `listen`), and `apexps users add`, which writes the users file the server reads.

The users file holds one `name:SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` line
per user (PostgreSQL's format; PBKDF2-HMAC-SHA-256 underneath): it serves SASL SCRAM-SHA-256 and,
over TLS, SASL PLAIN, and holds no password. Passwords reach the commands through stdin or the
`APEXPS_PASSWORD` environment variable, never through argv (which `ps` shows to everyone).
"""

from __future__ import annotations

import argparse
import getpass
import os
import ssl
import sys
import tempfile
from pathlib import Path
from typing import Any

from adapters.beep import DEFAULT_ITERATIONS, MECHANISMS, Users
from common.errors import ConfigError

__all__ = [
    "PASSWORD_ENV",
    "add_client_options",
    "add_server_options",
    "client_security",
    "load_users",
    "register",
    "server_security",
]

#: Where client commands take the password from when set (scripts, CI).
PASSWORD_ENV = "APEXPS_PASSWORD"


# --- server side ------------------------------------------------------------------------------


def add_server_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("security (RFC 3080 tuning profiles)")
    group.add_argument("--tls-cert", metavar="FILE",
                       help="PEM certificate chain: offer TLS (http://iana.org/beep/TLS)")
    group.add_argument("--tls-key", metavar="FILE",
                       help="PEM private key of --tls-cert (default: inside --tls-cert)")
    group.add_argument("--require-tls", action="store_true",
                       help="offer nothing but TLS until TLS is in effect")
    group.add_argument("--users", metavar="FILE",
                       help="users file (see `apexps users add`): offer SASL SCRAM-SHA-256, and"
                            " PLAIN over TLS; an authenticated user attaches only as itself")
    group.add_argument("--require-auth", action="store_true",
                       help="refuse APEX channels until the peer authenticated (needs --users)")


def load_users(path: str) -> Users:
    """Read a users file; ConfigError says which file and line is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read users file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"users file {path} is not UTF-8") from None
    try:
        return Users.parse(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def server_security(args: argparse.Namespace) -> dict[str, Any]:
    """`ApexServer` keyword arguments from the options of `add_server_options`."""
    if args.tls_key and not args.tls_cert:
        raise ConfigError("--tls-key needs --tls-cert")
    if args.require_tls and not args.tls_cert:
        raise ConfigError("--require-tls needs --tls-cert (and --tls-key)")
    if args.require_auth and not args.users:
        raise ConfigError("--require-auth needs --users")
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS certificate/key: {exc}") from None
    return {"tls": tls, "require_tls": args.require_tls,
            "sasl": load_users(args.users) if args.users else None,
            "require_auth": args.require_auth}


# --- client side ------------------------------------------------------------------------------


def add_client_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("security (RFC 3080 tuning profiles)")
    group.add_argument("--tls", action="store_true",
                       help="negotiate TLS before anything else and check the relay's"
                            " certificate")
    group.add_argument("--ca", metavar="FILE",
                       help="PEM CA certificates to trust instead of the system's (implies"
                            " --tls)")
    group.add_argument("--user", metavar="NAME",
                       help=f"authenticate with SASL; the password comes from ${PASSWORD_ENV}"
                            " or a prompt")
    group.add_argument("--mechanism", choices=[m for m in MECHANISMS if m != "ANONYMOUS"],
                       default="SCRAM-SHA-256",
                       help="SASL mechanism (default: %(default)s; PLAIN needs --tls)")


def _password(user: str) -> str:
    password = os.environ.get(PASSWORD_ENV)
    if password is not None:
        return password
    try:
        return getpass.getpass(f"password for {user}: ")
    except EOFError:
        raise ConfigError(f"no password: set ${PASSWORD_ENV} or run on a terminal") from None


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """`ApexClient.connect` keyword arguments from the options of `add_client_options`."""
    tls = None
    if args.tls or args.ca:
        try:
            tls = ssl.create_default_context(cafile=args.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA certificates from {args.ca}: {exc}") from None
    sasl = (args.user, _password(args.user)) if args.user else None
    return {"tls": tls, "sasl": sasl, "mechanism": args.mechanism}


# --- apexps users add -------------------------------------------------------------------------


def _read_new_password(name: str) -> str:
    if sys.stdin.isatty():
        first = getpass.getpass(f"new password for {name}: ")
        if getpass.getpass("again: ") != first:
            raise ConfigError("the passwords differ")
        return first
    line = sys.stdin.readline()
    return line.removesuffix("\n").removesuffix("\r")


def _write_atomically(path: Path, text: str) -> None:
    # Readable by the owner only, and never half-written: a crash leaves the old file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _users_add(args: argparse.Namespace) -> int:
    path = Path(args.file)
    users = load_users(str(path)) if path.exists() else Users()
    name = Users.check_name(args.name)
    existed = name in users
    users.add(name, _read_new_password(name), iterations=args.iterations)
    _write_atomically(path, "# apexps users: name:SCRAM-SHA-256$iterations:salt$StoredKey:"
                            "ServerKey\n" + users.format())
    print(f"{'updated' if existed else 'added'} {name} in {path}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    users = sub.add_parser("users", help="manage the users file of --users",
                           description="Manage the users file the broker's --users reads.")
    verbs = users.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser(
        "add", help="add a user or change its password",
        description="Add NAME (or replace its password). The password is read from the"
                    " terminal, or from the first line of stdin when that is not a terminal;"
                    " only salted SCRAM-SHA-256 keys are stored.")
    add.add_argument("name", metavar="NAME", help="the user name (its APEX endpoint is"
                                                  " NAME@DOMAIN, or NAME itself if it has '@')")
    add.add_argument("--file", default="users", metavar="FILE",
                     help="the users file (default: ./%(default)s)")
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, metavar="N",
                     help="PBKDF2 iterations (default: %(default)s; at least 4096)")
    add.set_defaults(func=_users_add)
