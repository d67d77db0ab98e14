"""The link between an elastic job's rank 0 and ``distnn launch``'s supervisor: the
supervisor keeps the job's last commit in its memory (``CommitStore``), so a world
restarted after a rank or host died, or after hosts were added or removed, starts from it.

The store is a TCP server in the supervisor's process, on an address the ranks reach (the
emulated cluster's bridge, 127.0.0.1 for local hosts). Rank 0 (``StoreClient``) sends
every commit's bytes there (``put``; the reply carries the host-set version, so a commit
also asks whether hosts changed), asks whether hosts changed (``poll``), and, when a new
world starts, fetches the commit the last world left (``get``). A frame is one JSON header
line (with the job's random token, so nothing else on the network can talk to it) and
``size`` bytes of payload. The payload is opaque here (the rank side serializes it).

The job finds the store through the environment: ``DISTNN_ELASTIC_STORE`` (host:port),
``DISTNN_ELASTIC_TOKEN``, ``DISTNN_ELASTIC_HOSTS_VERSION`` (the host-set version the world
was started with) and ``DISTNN_ELASTIC_WORLD`` (0 for the first world, +1 per restart).
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading

__all__ = ["CommitStore", "StoreClient", "ENV_STORE", "ENV_TOKEN", "ENV_VERSION",
           "ENV_WORLD", "EXIT_RESET"]

ENV_STORE, ENV_TOKEN = "DISTNN_ELASTIC_STORE", "DISTNN_ELASTIC_TOKEN"
ENV_VERSION, ENV_WORLD = "DISTNN_ELASTIC_HOSTS_VERSION", "DISTNN_ELASTIC_WORLD"
EXIT_RESET = 76  # every rank exits with it when the world must restart on new hosts


def _send(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    header = dict(header, size=len(payload))
    sock.sendall(json.dumps(header).encode() + b"\n" + payload)


def _recv(stream) -> tuple[dict, bytes]:
    line = stream.readline()
    if not line:
        raise ConnectionError("the elastic store closed the connection")
    header = json.loads(line)
    payload = stream.read(header["size"]) if header["size"] else b""
    if len(payload) != header["size"]:
        raise ConnectionError("the elastic store's connection ended inside a frame")
    return header, payload


class CommitStore:
    """The supervisor's side: holds the last commit and the host-set version.

    Args:
        address: the address to listen on (port chosen by the system).

    Example:
        store = CommitStore("127.0.0.1"); env.update(store.env()); ...; store.close()
    """

    def __init__(self, address: str = "127.0.0.1"):
        self.token = secrets.token_hex(16)
        self.commit: bytes | None = None
        self.commits = 0  # how many commits arrived (all worlds)
        self.version, self.kind = 0, ""  # kind: "added", "removed" or "added,removed"
        self._lock = threading.Lock()
        self._server = socket.create_server((address, 0))
        self.address = f"{address}:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def env(self, world: int = 0) -> dict[str, str]:
        """What a world's ranks need to find the store."""
        return {ENV_STORE: self.address, ENV_TOKEN: self.token,
                ENV_VERSION: str(self.version), ENV_WORLD: str(world)}

    def hosts_changed(self, kind: str) -> None:
        """The supervisor saw hosts ``kind`` ("added"/"removed"): the next poll says so."""
        with self._lock:
            self.version += 1
            kinds = set(filter(None, self.kind.split(","))) | {kind}
            self.kind = ",".join(sorted(kinds))

    def new_world(self) -> None:
        """A world starts on the current hosts: no host change is pending for it."""
        with self._lock:
            self.kind = ""

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            try:
                while True:
                    header, payload = _recv(stream)
                    if header.get("token") != self.token:
                        return
                    with self._lock:
                        if header["op"] == "put":
                            self.commit, self.commits = payload, self.commits + 1
                        reply = {"version": self.version, "kind": self.kind}
                        out = (self.commit or b"") if header["op"] == "get" else b""
                    _send(conn, reply, out)
            except (OSError, ValueError, KeyError, ConnectionError):
                return

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()


class StoreClient:
    """Rank 0's side (one connection, one request at a time).

    Example:
        client = StoreClient.from_env()   # None when not under an elastic launch
    """

    def __init__(self, address: str, token: str):
        host, _, port = address.rpartition(":")
        self.token = token
        self._sock = socket.create_connection((host, int(port)), timeout=60)
        self._stream = self._sock.makefile("rb")

    @classmethod
    def from_env(cls) -> "StoreClient | None":
        address, token = os.environ.get(ENV_STORE), os.environ.get(ENV_TOKEN)
        return cls(address, token) if address and token else None

    def _ask(self, op: str, payload: bytes = b"") -> tuple[dict, bytes]:
        _send(self._sock, {"op": op, "token": self.token}, payload)
        return _recv(self._stream)

    def put(self, payload: bytes) -> tuple[int, str]:
        """Store a commit; returns (host-set version, kind of change)."""
        header, _ = self._ask("put", payload)
        return header["version"], header["kind"]

    def poll(self) -> tuple[int, str]:
        header, _ = self._ask("poll")
        return header["version"], header["kind"]

    def get(self) -> bytes | None:
        """The last commit the store holds (from this world or an earlier one), or None."""
        _, payload = self._ask("get")
        return payload or None

    def close(self) -> None:
        self._stream.close()
        self._sock.close()
