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

A frame is guarded before anything of it is kept: the header line is at most
``HEADER_MAX`` bytes and must be a JSON object with exactly ``op`` ("put", "get" or
"poll"), ``token`` (a string) and ``size`` (an integer from 0 to the store's maximum
commit); the token is compared in constant time (``hmac.compare_digest``) before a byte
of the payload is read, so a client without the token costs the supervisor a header's
worth of memory however much it declares or sends. A connection that has not sent a good
first frame within ``AUTH_TIMEOUT`` seconds is closed, and at most ``MAX_STRANGERS``
connections wait for theirs at once. Every refusal is one line (the peer and why), never a
traceback; after ``REPORTED`` of them the rest are counted, not printed.

A commit is at most ``DISTNN_ELASTIC_MAX_COMMIT`` bytes (default ``MAX_COMMIT``, 1 GiB:
the supervisor holds the last one in memory; a larger state belongs in a checkpoint). The
supervisor's value reaches the ranks in the same variable, and rank 0 refuses a larger
commit with a line that says so before sending anything.

The job finds the store through the environment: ``DISTNN_ELASTIC_STORE`` (host:port),
``DISTNN_ELASTIC_TOKEN``, ``DISTNN_ELASTIC_HOSTS_VERSION`` (the host-set version the world
was started with), ``DISTNN_ELASTIC_WORLD`` (0 for the first world, +1 per restart) and
``DISTNN_ELASTIC_MAX_COMMIT``.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import sys
import threading
from typing import Callable

__all__ = ["CommitStore", "StoreClient", "FrameError", "ENV_STORE", "ENV_TOKEN",
           "ENV_VERSION", "ENV_WORLD", "ENV_MAX_COMMIT", "EXIT_RESET", "MAX_COMMIT", "commit_limit",
           "HEADER_MAX"]

ENV_STORE, ENV_TOKEN = "DISTNN_ELASTIC_STORE", "DISTNN_ELASTIC_TOKEN"
ENV_VERSION, ENV_WORLD = "DISTNN_ELASTIC_HOSTS_VERSION", "DISTNN_ELASTIC_WORLD"
ENV_MAX_COMMIT = "DISTNN_ELASTIC_MAX_COMMIT"
EXIT_RESET = 76  # every rank exits with it when the world must restart on new hosts
MAX_COMMIT = 1 << 30
HEADER_MAX = 4096  # a real header is under 100 bytes
AUTH_TIMEOUT = 10.0
MAX_STRANGERS = 64
REPORTED = 20
_CHUNK = 1 << 20
_OPS = ("put", "get", "poll")
_REQUEST = {"op": str, "token": str, "size": int}
_REPLY = {"version": int, "kind": str, "size": int}


class FrameError(ValueError):
    """A frame that breaks the protocol (the message says how), or one too large."""


def commit_limit(env: dict | None = None) -> int:
    """The largest commit (bytes): ``DISTNN_ELASTIC_MAX_COMMIT``, else ``MAX_COMMIT``."""
    text = (os.environ if env is None else env).get(ENV_MAX_COMMIT, "")
    try:
        value = int(text) if text else MAX_COMMIT
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(f"{ENV_MAX_COMMIT} must be a positive number of bytes, got "
                         f"{text!r}")
    return value


def _send(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    line = json.dumps(dict(header, size=len(payload))).encode() + b"\n"
    if len(payload) < _CHUNK:  # one write: a small frame is not held back by Nagle
        sock.sendall(line + payload)
    else:  # a commit is not copied to be sent
        sock.sendall(line)
        sock.sendall(payload)


def _header(stream, fields: dict, limit: int, token: str | None = None) -> dict:
    """The next frame's header, checked: a JSON object with exactly ``fields`` (name:
    type), then its ``token`` (when one is expected), then a ``size`` within ``limit``.
    Raises ConnectionError at a clean end, FrameError for anything else."""
    line = stream.readline(HEADER_MAX + 1)
    if not line:
        raise ConnectionError("the connection closed")
    if len(line) > HEADER_MAX or not line.endswith(b"\n"):
        raise FrameError(f"a header longer than {HEADER_MAX} bytes" if len(line) > HEADER_MAX
                         else "the connection ended inside a header")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise FrameError("a header that is not JSON") from None
    if not isinstance(header, dict):
        raise FrameError(f"a header that is a JSON {type(header).__name__}, not an object")
    if set(header) != set(fields):
        raise FrameError(f"a header with fields {sorted(header)[:8]}, not "
                         f"{sorted(fields)}")
    for name, kind in fields.items():
        # bool is an int to Python, not to the protocol
        if not isinstance(header[name], kind) or isinstance(header[name], bool):
            raise FrameError(f"a header whose {name!r} is a {type(header[name]).__name__}, "
                             f"not a {kind.__name__}")
    if token is not None and not hmac.compare_digest(header["token"].encode(),
                                                     token.encode()):
        raise FrameError("a wrong token")
    if not 0 <= header["size"] <= limit:
        raise FrameError(f"a frame declaring {header['size']} bytes (at most {limit}: "
                         f"{ENV_MAX_COMMIT})")
    return header


def _payload(stream, size: int) -> bytes:
    """``size`` bytes, read in chunks: memory grows with the bytes that arrive, not with
    the size declared (one read of ``size`` would allocate it all at once)."""
    parts, left = [], size
    while left:
        chunk = stream.read(min(left, _CHUNK))
        if not chunk:
            raise FrameError(f"the connection ended inside a frame ({size - left} of "
                             f"{size} bytes)")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _stderr_say(line: str) -> None:
    sys.stderr.write(f"distnn launch: {line}\n")
    sys.stderr.flush()


class CommitStore:
    """The supervisor's side: holds the last commit and the host-set version.

    Args:
        address: the address to listen on (port chosen by the system).
        max_commit: the largest commit taken, bytes (default: ``commit_limit()``).
        say: where its one-line refusals go (default: stderr, as the supervisor's lines).

    Example:
        store = CommitStore("127.0.0.1"); env.update(store.env()); ...; store.close()
    """

    def __init__(self, address: str = "127.0.0.1", max_commit: int | None = None,
                 say: Callable[[str], None] | None = None):
        self.token = secrets.token_hex(16)
        self.max_commit = max_commit or commit_limit()
        self.say = say or _stderr_say
        self.commit: bytes | None = None
        self.commits = 0  # how many commits arrived (all worlds)
        self.refused = 0  # connections refused (a bad token or frame)
        self.version, self.kind = 0, ""  # kind: "added", "removed" or "added,removed"
        self._lock = threading.Lock()
        self._strangers = threading.BoundedSemaphore(MAX_STRANGERS)
        self._server = socket.create_server((address, 0))
        self.address = f"{address}:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def env(self, world: int = 0) -> dict[str, str]:
        """What a world's ranks need to find the store."""
        return {ENV_STORE: self.address, ENV_TOKEN: self.token,
                ENV_VERSION: str(self.version), ENV_WORLD: str(world),
                ENV_MAX_COMMIT: str(self.max_commit)}

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
                conn, peer = self._server.accept()
            except OSError:
                return
            if not self._strangers.acquire(blocking=False):
                self._refuse(peer, f"more than {MAX_STRANGERS} connections not yet "
                             "authenticated")
                conn.close()
                continue
            threading.Thread(target=self._client, args=(conn, peer), daemon=True).start()

    def _refuse(self, peer, why: str) -> None:
        with self._lock:
            self.refused += 1
            n = self.refused
        if n <= REPORTED:
            more = "; later refusals are counted, not printed" if n == REPORTED else ""
            self.say(f"elastic store: refused a connection from {peer[0]}:{peer[1]}: "
                     f"{why}{more}")

    def _client(self, conn: socket.socket, peer) -> None:
        stranger = True
        try:
            with conn, conn.makefile("rb") as stream:
                conn.settimeout(AUTH_TIMEOUT)
                while True:
                    try:
                        header = _header(stream, _REQUEST, self.max_commit, self.token)
                    except ConnectionError:
                        return
                    except socket.timeout:
                        if stranger:
                            self._refuse(peer, f"no frame within {AUTH_TIMEOUT:g} s")
                        return
                    if header["op"] not in _OPS:
                        raise FrameError(f"an unknown op {header['op'][:40]!r}")
                    if stranger:  # a rank of the job: between its commits it may be quiet
                        stranger = False
                        self._strangers.release()
                        conn.settimeout(None)
                    payload = _payload(stream, header["size"])
                    with self._lock:
                        if header["op"] == "put":
                            self.commit, self.commits = payload, self.commits + 1
                        reply = {"version": self.version, "kind": self.kind}
                        out = (self.commit or b"") if header["op"] == "get" else b""
                    del payload
                    _send(conn, reply, out)
        except FrameError as exc:
            self._refuse(peer, str(exc))
        except OSError:
            pass  # the peer went away (a reset, a broken pipe): nothing to serve
        finally:
            if stranger:
                self._strangers.release()

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

    def __init__(self, address: str, token: str, max_commit: int | None = None):
        host, _, port = address.rpartition(":")
        self.token = token
        self.max_commit = max_commit or commit_limit()
        self._sock = socket.create_connection((host, int(port)), timeout=60)
        self._stream = self._sock.makefile("rb")

    @classmethod
    def from_env(cls) -> "StoreClient | None":
        address, token = os.environ.get(ENV_STORE), os.environ.get(ENV_TOKEN)
        return cls(address, token) if address and token else None

    def _ask(self, op: str, payload: bytes = b"") -> tuple[dict, bytes]:
        if len(payload) > self.max_commit:
            raise FrameError(f"the commit is {len(payload)} bytes, more than the elastic "
                             f"store takes ({ENV_MAX_COMMIT}={self.max_commit}); set "
                             f"{ENV_MAX_COMMIT} higher where distnn launch runs, or commit "
                             "less state (a large model belongs in a checkpoint)")
        _send(self._sock, {"op": op, "token": self.token}, payload)
        try:
            header = _header(self._stream, _REPLY, self.max_commit)
        except ConnectionError:
            raise ConnectionError("the elastic store closed the connection (a wrong "
                                  f"{ENV_TOKEN}, or the supervisor ended)") from None
        return header, _payload(self._stream, header["size"])

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
