"""The elastic commit store's door (issue 59): the token is checked before any payload is
read, frames are bounded by the largest commit, malformed headers are refused in one line
(never a traceback in the connection's thread), and the store keeps serving its job. The
memory a stranger can make the supervisor hold is measured on a store in a process of its
own (its peak resident memory, VmHWM), as ``distnn launch`` hosts it."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.fuzz import fuzz_settings
from distnn.launch import commits
from distnn.launch.commits import (ENV_MAX_COMMIT, HEADER_MAX, CommitStore, FrameError,
                                    StoreClient)

MiB = 1 << 20


class Door:
    """A store with its refusal lines and its threads' uncaught exceptions recorded."""

    def __init__(self, monkeypatch, **kw):
        self.lines: list[str] = []
        self.crashes: list[str] = []
        monkeypatch.setattr(threading, "excepthook",
                            lambda args: self.crashes.append(repr(args.exc_value)))
        self.store = CommitStore("127.0.0.1", say=self.lines.append, **kw)
        host, port = self.store.address.rsplit(":", 1)
        self.where = (host, int(port))

    def send(self, data: bytes, wait: float = 2.0) -> bytes:
        """Send ``data`` as a stranger, half-close, and return what came back."""
        with socket.create_connection(self.where, timeout=wait) as s:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                return s.recv(1 << 16)
            except OSError:  # reset: the store closed with our bytes unread
                return b""

    def settle(self, refused: int, timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        while self.store.refused < refused and time.monotonic() < end:
            time.sleep(0.005)

    def still_serves(self) -> None:
        client = StoreClient(self.store.address, self.store.token)
        try:
            assert client.put(b"good") == (self.store.version, self.store.kind)
            assert client.get() == b"good"
        finally:
            client.close()


@pytest.fixture
def door(monkeypatch):
    d = Door(monkeypatch)
    yield d
    d.store.close()


def _frame(header, payload: bytes = b"") -> bytes:
    return json.dumps(header).encode() + b"\n" + payload


BAD = {
    "not JSON": b"{op: put}\n",
    "a JSON list": b'["put", "tok", 3]\n',
    "a JSON string": b'"put"\n',
    "a JSON number": b"12\n",
    "null": b"null\n",
    "not UTF-8": b"\xff\xfe{}\n",
    "deep nesting": b"[" * 3000 + b"\n",
    "a field missing": _frame({"op": "put", "size": 0}),
    "an extra field": _frame({"op": "put", "token": "t", "size": 0, "x": 1}),
    "size a string": _frame({"op": "put", "token": "t", "size": "5"}),
    "size a bool": _frame({"op": "put", "token": "t", "size": True}),
    "size a float": _frame({"op": "put", "token": "t", "size": 5.0}),
    "size negative": _frame({"op": "put", "token": "t", "size": -1}),
    "size beyond a commit": "the token, declaring 2**40 bytes",
    "token a number": _frame({"op": "put", "token": 7, "size": 0}),
    "an oversize header": b'{"op": "' + b"p" * (2 * HEADER_MAX) + b'"}\n',
    "no end of line": b'{"op": "put", "token": "t", "size": 0}',
    "a wrong token": _frame({"op": "put", "token": "0" * 32, "size": 5}, b"evil!"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_frame_is_refused_in_one_line(door, case):
    data = BAD[case]
    if isinstance(data, str):  # the right token: the size is what is wrong
        data = _frame({"op": "put", "token": door.store.token, "size": 1 << 40})
    assert door.send(data) == b""
    door.settle(1)
    assert door.store.refused == 1 and len(door.lines) == 1, (case, door.lines)
    line = door.lines[0]
    assert "\n" not in line and "Traceback" not in line and "refused a connection" in line
    assert door.crashes == [] and door.store.commit is None
    door.still_serves()


def test_a_right_token_with_an_unknown_op_or_a_short_payload_is_refused(door):
    token = door.store.token
    assert door.send(_frame({"op": "drop", "token": token, "size": 0})) == b""
    assert door.send(_frame({"op": "put", "token": token, "size": 10}, b"short")) == b""
    door.settle(2)
    assert len(door.lines) == 2, door.lines
    assert "unknown op 'drop'" in door.lines[0] and "ended inside a frame (5 of 10 bytes)" \
        in door.lines[1], door.lines
    assert door.store.commit is None and door.crashes == []
    door.still_serves()


def test_a_silent_stranger_is_closed_and_strangers_are_capped(monkeypatch):
    monkeypatch.setattr(commits, "AUTH_TIMEOUT", 0.3)
    monkeypatch.setattr(commits, "MAX_STRANGERS", 2)
    d = Door(monkeypatch)
    try:
        quiet = [socket.create_connection(d.where) for _ in range(3)]
        d.settle(3)
        assert d.store.refused == 3, d.lines
        assert sum("not yet authenticated" in line for line in d.lines) == 1, d.lines
        assert sum("no frame within 0.3 s" in line for line in d.lines) == 2, d.lines
        for s in quiet:
            s.close()
        d.still_serves()  # the slots came back
        assert d.crashes == []
    finally:
        d.store.close()


def test_refusals_beyond_the_first_ones_are_counted_not_printed(door):
    for _ in range(commits.REPORTED + 5):
        door.send(b"[]\n")
    door.settle(commits.REPORTED + 5)
    assert door.store.refused == commits.REPORTED + 5
    assert len(door.lines) == commits.REPORTED and "counted, not printed" in door.lines[-1]


def test_a_commit_larger_than_the_limit_is_refused_before_it_is_sent(monkeypatch):
    d = Door(monkeypatch, max_commit=1000)
    try:
        client = StoreClient(d.store.address, d.store.token, max_commit=1000)
        with pytest.raises(FrameError, match=f"1001 bytes.*{ENV_MAX_COMMIT}=1000"):
            client.put(b"x" * 1001)
        assert client.put(b"x" * 1000) == (0, "") and d.store.commit == b"x" * 1000
        client.close()
        # a client that does not check (another program) is refused by the store
        assert d.send(_frame({"op": "put", "token": d.store.token, "size": 1001})) == b""
        d.settle(1)
        assert "declaring 1001 bytes (at most 1000" in d.lines[0], d.lines
        assert d.store.env()[ENV_MAX_COMMIT] == "1000"
    finally:
        d.store.close()


# -- fuzzing: the protocol's frames mutated -------------------------------------------------
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)
_FIELD = st.one_of(_JSON, st.sampled_from(["put", "get", "poll"]),
                   st.integers(-2, 1 << 34))


@st.composite
def frames(draw) -> tuple[bytes, bool]:
    """(bytes a client sends, whether they carry the right token)."""
    kind = draw(st.sampled_from(["bytes", "json", "header", "good_header"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)), False
    if kind == "json":
        return json.dumps(draw(_JSON)).encode() + b"\n", False
    header = {"op": draw(_FIELD), "token": draw(_FIELD), "size": draw(_FIELD)}
    for name in draw(st.lists(st.sampled_from(["op", "token", "size", "extra"]),
                              max_size=2)):
        if name in header:
            del header[name]
        else:
            header[name] = draw(_JSON)
    good = kind == "good_header" and "token" in header
    if good:
        header["token"] = "TOKEN"
    payload = draw(st.binary(max_size=64))
    data = json.dumps(header).encode() + b"\n" + payload
    cut = draw(st.integers(0, len(data)))
    return (data[:cut] if draw(st.booleans()) else data), good


def test_fuzzed_frames_give_no_traceback_and_the_store_keeps_serving(door):
    seen = []

    @fuzz_settings(150, derandomize=True)
    @given(frames())
    def one(frame):
        data, good = frame
        if good:
            data = data.replace(b'"TOKEN"', json.dumps(door.store.token).encode(), 1)
        door.send(data, wait=1.0)
        seen.append(good)

    one()
    time.sleep(0.2)
    assert door.crashes == [], door.crashes[:5]
    assert all("\n" not in line and "Traceback" not in line for line in door.lines)
    assert door.store.refused >= len(seen) // 2, (door.store.refused, len(seen))
    door.still_serves()


# -- memory: what a stranger can make the supervisor's process hold -----------------------
HOST = """
import sys
from distnn.launch.commits import CommitStore
store = CommitStore("127.0.0.1")
print(store.address, store.token, flush=True)
sys.stdin.read()
"""


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def _flood(address: str, token: str, declared: int, send: int) -> int:
    """Declare ``declared`` bytes, try to send ``send``; the bytes the kernel took."""
    host, port = address.rsplit(":", 1)
    chunk, sent = b"\0" * MiB, 0
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(_frame({"op": "put", "token": token, "size": declared}))
            while sent < send:
                sent += s.send(chunk)
        except OSError:  # the store closed the connection: what it did not read is gone
            pass
    return sent


@pytest.mark.parametrize("who", ["a wrong token", "the token, beyond the commit limit"])
def test_a_stranger_declaring_2_gib_costs_a_header_of_memory(tmp_path, who):
    from helpers import child_env
    proc = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        address, token = proc.stdout.readline().split()
        time.sleep(0.3)
        before = _status(proc.pid)
        sent = _flood(address, "0" * 32 if who == "a wrong token" else token, 2 << 30,
                      200 * MiB)
        line = proc.stderr.readline()
        time.sleep(0.2)
        after = _status(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(10)
    growth = after["VmHWM"] - before["VmRSS"]
    print(f"{who}: declared 2 GiB, the kernel took {sent / MiB:.1f} MiB of the 200 MiB "
          f"sent; the store's resident memory {before['VmRSS'] / MiB:.1f} MiB before, peak "
          f"{after['VmHWM'] / MiB:.1f} MiB after (+{growth / MiB:.2f} MiB)")
    said = "a wrong token" if who == "a wrong token" else "declaring 2147483648 bytes"
    assert "refused a connection" in line and said in line and line.count("\n") == 1, line
    assert growth < 4 * MiB, (before, after)
