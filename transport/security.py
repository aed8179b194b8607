"""CurveZMQ for the run's listening sockets (the trajectory stream, the env service): keys, the
server's allow-list, and a count of the clients it refused.

Used by transport/stream.py (learner rank 0 serves, actors connect) and envs/service.py (the env
service serves, actors connect). Keys are Z85 text, so they travel in a config or a Ray call as
any string does:
- per run: ``generate()`` makes a server pair and a client pair in memory; the driver hands the
  server's (with the client's public key as the one allowed in) to learner rank 0 and the client's
  (with the server's public key) to every actor;
- by file: ``python -m transport.security DIR`` writes ZeroMQ certificates ``server.key`` /
  ``server.key_secret`` and ``client.key`` / ``client.key_secret`` into DIR; ``read_server(DIR)``
  and ``read_client(DIR)`` load them (the env service, which a user starts by hand, takes its keys
  this way, and so may a run: ``transport.curve_keys=DIR``).

Refused and counted: ``CurveServer`` makes a socket a CURVE server whose ZAP handler admits only
the ``allowed`` public keys, and watches the socket's handshake events. A client without keys (a
mechanism mismatch), with a key not on the list, or holding the wrong server key fails its
handshake: nothing it sends reaches the application, and ``refused`` counts the failed
handshakes by reason (``no_curve``, ``unknown_key``, ``bad_handshake``: another server's key, or a
handshake cut off, as when a refused client closes mid-attempt) once ``drain()`` has read the
events. It counts attempts, not clients: a refused client's ZeroMQ socket may try again
(by default every 100 ms while it lives), and each try is counted.

Invariants: a server never starts without an allow-list; secret keys never appear in a repr.
"""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

_MONITORED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MONITORS = itertools.count()


@dataclass(frozen=True)
class ServerKeys:
    """A CURVE server's key pair and the client public keys it lets in (Z85 text)."""

    public: str
    secret: str = field(repr=False)
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class ClientKeys:
    """A CURVE client's key pair and the public key of the server it trusts (Z85 text)."""

    public: str
    secret: str = field(repr=False)
    server_public: str


def generate() -> tuple[ServerKeys, ClientKeys]:
    """A fresh server pair and client pair, each knowing the other's public key."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return (ServerKeys(server_public.decode(), server_secret.decode(), (client_public.decode(),)),
            ClientKeys(client_public.decode(), client_secret.decode(), server_public.decode()))


def write(directory: str | Path) -> Path:
    """Write a server's and a client's certificates into ``directory`` (made if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("server", "client"):
        zmq.auth.create_certificates(str(directory), name)
    return directory


def read_server(directory: str | Path) -> ServerKeys:
    """The server's keys from ``write``'s directory; the allowed clients are every other public
    certificate there (``*.key`` but the server's own)."""
    directory = Path(directory)
    public, secret = _load(directory / "server.key_secret")
    allowed = tuple(sorted(_load(p)[0] for p in directory.glob("*.key") if p.name != "server.key"))
    if not allowed:
        raise ValueError(f"{directory} holds no client certificate (*.key) to allow in")
    return ServerKeys(public, secret, allowed)


def read_client(directory: str | Path, name: str = "client") -> ClientKeys:
    """The client ``name``'s keys and the server's public key, from ``write``'s directory."""
    directory = Path(directory)
    public, secret = _load(directory / f"{name}.key_secret")
    return ClientKeys(public, secret, _load(directory / "server.key")[0])


def _load(path: Path) -> tuple[str, str]:
    if not path.exists():
        raise FileNotFoundError(f"no CurveZMQ certificate {path} (python -m transport.security "
                                f"{path.parent} makes a set)")
    public, secret = zmq.auth.load_certificate(str(path))
    return public.decode(), (secret or b"").decode()


def curve_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``socket`` a CURVE client of the server ``keys`` trusts (before it connects)."""
    socket.curve_publickey = keys.public.encode()
    socket.curve_secretkey = keys.secret.encode()
    socket.curve_serverkey = keys.server_public.encode()


class CurveServer:
    """``socket`` (not yet bound) as a CURVE server admitting ``keys.allowed`` only; ``refused``
    counts the handshakes it failed, by reason, as of the last ``drain()``."""

    def __init__(self, socket: zmq.Socket, keys: ServerKeys) -> None:
        if not keys.allowed:
            raise ValueError("a CurveZMQ server needs the public keys of the clients it lets in")
        # A plain context on the same ZeroMQ context: the ZAP handler and the monitor must share
        # it with the socket (inproc), also when the socket is an asyncio one.
        context = zmq.Context.shadow(socket.context.underlying)
        self.refused: Counter[str] = Counter()
        self._allowed = frozenset(keys.allowed)
        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self)
        socket.curve_server = True
        socket.curve_publickey = keys.public.encode()
        socket.curve_secretkey = keys.secret.encode()
        address = f"inproc://curve-monitor-{id(self)}-{next(_MONITORS)}"
        socket.monitor(address, _MONITORED)
        self._socket = socket
        self._monitor = context.socket(zmq.PAIR)
        self._monitor.connect(address)

    def callback(self, domain: str, key: bytes) -> bool:
        """The ZAP handler's question: may the client with this public key (Z85) in?"""
        return key.decode() in self._allowed

    def drain(self) -> Counter[str]:
        """Read the handshake failures reported since the last call into ``refused``."""
        while self._monitor.poll(0):
            message = recv_monitor_message(self._monitor)
            if message["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refused["unknown_key"] += 1
            elif message["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                self.refused["no_curve"] += 1
            else:  # the wrong server key (a cryptographic error), a handshake cut off
                self.refused["bad_handshake"] += 1
        return self.refused

    def close(self) -> None:
        """Stop the ZAP handler and the monitor (before the socket closes)."""
        self.drain()
        try:
            self._socket.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._auth.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m transport.security",
                                description="Write CurveZMQ certificates: a server's and a client's.")
    p.add_argument("directory", type=Path)
    where = write(p.parse_args(argv).directory)
    print(f"wrote server.key, server.key_secret, client.key, client.key_secret in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
