"""CURVE keys for a bus bound beyond loopback.

On the machine the bus is a pair of ipc sockets in a private directory (see
:mod:`prism_debug.bus.socket_dir`), so it runs in the clear.  Bound to an address
beyond loopback, the controller adds TCP endpoints and requires CURVE: one
server and one client key pair per user, created once by ``prism-debug keys``
in ZeroMQ's certificate format (``NAME.key`` public, ``NAME.key_secret``
secret, readable by the owner only).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import shutil
import tempfile
from pathlib import Path

import zmq
import zmq.auth

from prism_debug.errors import KeysError

log = logging.getLogger(__name__)

ENV_VAR = "PRISM_DEBUG_KEYS"
_LOCAL_TRANSPORTS = ("ipc", "inproc")  # never leave the machine (or the process)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyPaths:
    directory: Path
    server_public: Path
    server_secret: Path
    client_public: Path
    client_secret: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientCurve:
    """What a client needs to connect to a CURVE server: its own pair and the server's
    public key (all Z85, 40 bytes)."""

    public: bytes
    secret: bytes
    server_public: bytes


def keys_dir() -> Path:
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "prism-debug" / "curve"


def key_paths(directory: Path | None = None) -> KeyPaths:
    d = keys_dir() if directory is None else Path(directory)
    return KeyPaths(directory=d, server_public=d / "server.key",
                    server_secret=d / "server.key_secret", client_public=d / "client.key",
                    client_secret=d / "client.key_secret")


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise KeysError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE: bind "
                        "the bus to 127.0.0.1 or install a pyzmq wheel with CURVE")


def ensure_keys(directory: Path | None = None) -> KeyPaths:
    """Create whichever key pair is missing (idempotent: existing pairs are kept)."""
    _require_curve()
    paths = key_paths(directory)
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(paths.directory, 0o700)  # mkdir's mode is masked by umask, and skipped if it existed
    for name, public, secret in (("server", paths.server_public, paths.server_secret),
                                 ("client", paths.client_public, paths.client_secret)):
        if public.is_file() and secret.is_file():
            continue
        # Made in a private staging directory and renamed into place, so the secret is
        # never readable by others and a half-made pair is never seen.
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=paths.directory))
        try:
            made_public, made_secret = (Path(p) for p in
                                        zmq.auth.create_certificates(staging, name))
            os.chmod(made_secret, 0o600)
            os.chmod(made_public, 0o644)
            os.replace(made_secret, secret)
            os.replace(made_public, public)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("created CURVE %s keys in %s", name, paths.directory)
    return paths


def _load(secret: Path, name: str) -> tuple[bytes, bytes]:
    try:
        public_key, secret_key = zmq.auth.load_certificate(secret)
    except (OSError, ValueError) as exc:
        raise KeysError(f"no usable CURVE {name} keys in {secret.parent} ({exc}): run "
                        "prism-debug keys to create them") from exc
    if not secret_key:
        raise KeysError(f"{secret} holds no secret key: run prism-debug keys to create "
                        "the keys again")
    return public_key, secret_key


def load_server(directory: Path | None = None) -> tuple[bytes, bytes]:
    """``(public, secret)`` of the server pair."""
    return _load(key_paths(directory).server_secret, "server")


def load_client(directory: Path | None = None) -> tuple[bytes, bytes]:
    """``(public, secret)`` of the client pair."""
    return _load(key_paths(directory).client_secret, "client")


def _host(endpoint_or_host: str) -> str | None:
    """The host part of ``tcp://HOST:PORT``, ``HOST:PORT``, ``[V6]:PORT`` or a bare host;
    None for a transport that never leaves the machine."""
    text = endpoint_or_host.strip()
    if "://" in text:
        transport, text = text.split("://", 1)
        if transport.lower() in _LOCAL_TRANSPORTS:
            return None
        text = text.rsplit(";", 1)[-1]  # tcp://SOURCE;HOST:PORT connects from SOURCE
        if text.startswith("["):
            return text[1:text.find("]")] if "]" in text else text[1:]
        return text.rsplit(":", 1)[0]
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text[1:]
    if text.count(":") == 1:  # HOST:PORT; more colons make it a bare IPv6 address
        return text.split(":", 1)[0]
    return text


def is_loopback(endpoint_or_host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (and ipc/inproc endpoints), the addresses
    no other machine can reach.  A wildcard or an interface name is not loopback."""
    host = _host(endpoint_or_host)
    if host is None:
        return True
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1
    return address.is_loopback


def server_keys_for(endpoint: str, directory: Path | None = None
                    ) -> tuple[bytes, bytes] | None:
    """The server pair a bind to ``endpoint`` must use: None on loopback (no CURVE), the
    stored pair elsewhere, :class:`KeysError` when there is none."""
    if is_loopback(endpoint):
        return None
    _require_curve()
    paths = key_paths(directory)
    if not paths.server_secret.is_file():
        raise KeysError(f"binding the bus to {endpoint} (not loopback) needs CURVE keys and "
                        f"{paths.directory} has none: run prism-debug keys to create them")
    return load_server(directory)


def apply_server(socket: zmq.Socket, keys: tuple[bytes, bytes]) -> None:
    """Make ``socket`` a CURVE server with ``keys`` = ``(public, secret)``; before bind."""
    public, secret = keys
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True


def apply_client(socket: zmq.Socket, keys: tuple[bytes, bytes],
                 server_public: bytes | str) -> None:
    """Make ``socket`` a CURVE client of the server whose public key is ``server_public``;
    before connect."""
    public, secret = keys
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = (server_public.encode("ascii") if isinstance(server_public, str)
                              else server_public)


def connect_curve(endpoint: str, server_key: str | None) -> ClientCurve | None:
    """What ``attach --connect`` uses: the user's client pair and the server key it
    expects (``server_key``: Z85 text or a ``.key`` file; default the user's own server
    key, which the controller runs with).  None for a local endpoint named without a
    key (ipc needs no CURVE)."""
    if not endpoint.startswith("tcp://") and server_key is None:
        return None
    _require_curve()
    if server_key is not None and len(server_key) == 40 and not Path(server_key).exists():
        expected = server_key.encode("ascii")
    else:
        path = key_paths().server_public if server_key is None else Path(server_key)
        try:
            expected, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise KeysError(f"cannot read the server's CURVE key from {path} ({exc}): pass "
                            "--server-key, or run prism-debug keys") from None
        if not expected:
            raise KeysError(f"{path} holds no CURVE public key: pass --server-key")
    public, secret = load_client()
    return ClientCurve(public=public, secret=secret, server_public=expected)
