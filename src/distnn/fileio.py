"""Atomic file writes and checks of the files a run reads and writes.

``atomic_open``: readers never see a half-written file, and a failed or killed write
leaves the previous file (a checkpoint, weights, a download) untouched. The temporary
file is ``.<name>.<host>.<pid>.<random>.part`` next to the target; the next write to the
same target removes those a dead process of this host left behind. A new file gets the
mode the umask allows (like ``open``); a replaced file keeps its mode.

``check_writable`` and ``npz_kind`` let a command find a bad output or input path before
the first training step instead of after hours of training; ``read_npz`` reads an input
``.npz`` as plain arrays only (never a pickle, never more memory than the file holds).
"""
from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile
import time
import zipfile
from contextlib import contextmanager
from typing import IO, Callable, Iterator

__all__ = ["atomic_open", "check_writable", "npz_kind", "read_npz", "describe_os_error",
           "WriteError", "guarded_write", "describe_write_failure"]

_STALE_AGE_S = 24 * 3600.0  # a .part file of another host is removed after a day


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (restored at once)
    os.umask(mask)
    return mask


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace(os.sep, "_") or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_parts(folder: str, base: str) -> None:
    """Remove temporary files of ``base`` left by killed writers (same host and dead pid,
    or older than a day)."""
    prefix = f".{base}."
    host = _host()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".part")]
    except OSError:
        return
    now = time.time()
    for name in names:
        fields = name[len(prefix):-len(".part")].split(".")
        full = os.path.join(folder, name)
        try:
            stale = (len(fields) == 3 and fields[0] == host and fields[1].isdigit()
                     and not _alive(int(fields[1]))) or now - os.path.getmtime(full) > _STALE_AGE_S
            if stale:
                os.unlink(full)
        except OSError:
            pass


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, fsync: bool = False,
                newline: str | None = None,
                before_replace: Callable[[], None] | None = None) -> Iterator[IO]:
    """Open a temporary file in ``path``'s folder (created if missing); when the block ends
    without an exception it is flushed (and fsync'ed if asked) and renamed over ``path``
    with ``os.replace``; on an exception it is removed and the exception propagates.
    ``before_replace()`` runs once the new file is whole, just before the rename (a
    checkpoint keeps the file it replaces as its previous copy there).

    Example:
        with atomic_open("weights.npz") as f:
            np.savez(f, **arrays)
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    os.makedirs(folder, exist_ok=True)
    _remove_stale_parts(folder, base)
    try:
        file_mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        file_mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.{_host()}.{os.getpid()}.",
                               suffix=".part")
    try:
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class WriteError(OSError):
    """An output file could not be written (raised on every rank of a collective write).

    Attributes:
        path: the target file.
        reason: what went wrong and what to do.
    """

    def __init__(self, path: str, reason: str, what: str = ""):
        super().__init__(f"could not write {what + ' ' if what else ''}{path!r}: {reason}")
        self.path, self.reason, self.what = path, reason, what

    def __reduce__(self):  # travels to the other ranks whole
        return (type(self), (self.path, self.reason, self.what))

    @classmethod
    def from_exception(cls, path: str, exc: BaseException, what: str = "") -> "WriteError":
        if isinstance(exc, WriteError):
            return exc
        reason = describe_os_error(exc) if isinstance(exc, OSError) else \
            f"{type(exc).__name__}: {exc}"
        return cls(path, reason, what)


def guarded_write(path: str, write: Callable[[], None], what: str = "") -> None:
    """Call ``write()``; any failure becomes a ``WriteError`` naming ``path`` (run it on
    rank 0 with ``distributed.coordination.on_ranks`` and every rank raises it)."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - every failure is a WriteError for the caller
        raise WriteError.from_exception(os.fspath(path), exc, what) from exc


def describe_os_error(exc: OSError) -> str:
    """A short reason and what to do, for an error met while writing a file."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{reason}; free space on that disk or choose a file on another one"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{reason}; choose a folder you can write to"
    return reason


def describe_write_failure(exc: BaseException) -> str:
    """One line for an error met while writing an output: "could not write 'f': reason and
    what to do" for an OSError, else the error's text."""
    if not isinstance(exc, OSError):
        return str(exc)
    where = f" {exc.filename!r}" if exc.filename else ""
    return f"could not write{where}: {describe_os_error(exc)}"


def check_writable(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as an output file (None if it can): a folder in the
    way, a parent that is a file, a device, a read-only file, or a folder where no file can
    be created. Creates nothing that stays (a probe file is removed at once)."""
    path = os.fspath(path)
    if not path:
        return "the file name is empty"
    if os.path.isdir(path):
        return f"{path!r} is a folder; give a file name"
    if os.path.lexists(path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            return f"{path!r} exists and is not a regular file; choose another name"
        if not os.access(path, os.W_OK):
            return f"{path!r} exists and is read-only; make it writable or choose another name"
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, so folder {folder!r} cannot be created"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".distnn-probe.", suffix=".part")
    except OSError as exc:
        return f"cannot create a file in {existing!r}: {describe_os_error(exc)}"
    os.close(fd)
    os.unlink(probe)
    return None


def npz_kind(path: str | os.PathLike) -> str:
    """What an input ``.npz`` file is: "checkpoint" (distnn training state) or "arrays"
    (e.g. weights).

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is not a complete .npz (zip) archive; the message says which.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder, not an .npz file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] != b"PK":
        return_what = "empty" if not head else "not an .npz file (it is not a zip archive)"
        raise ValueError(f"{path!r} is {return_what}")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ValueError(f"{path!r} is truncated or corrupt ({exc})") from None
    if bad is not None:
        raise ValueError(f"{path!r} is corrupt (entry {bad!r} fails its checksum)")
    return "checkpoint" if "__meta__.npy" in names else "arrays"


def read_npz(path: str | os.PathLike, keys=None, *, finite=()) -> dict:
    """The arrays of an input ``.npz`` file (all, or those named in ``keys``), read as
    plain data: an entry that holds Python objects (a pickle, which could run code) is
    refused, as is one whose header declares more data than the archive holds, before
    anything is allocated. Arrays whose key starts with one of ``finite`` must hold no
    NaN or inf.

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: naming the file, the entry and what is wrong.
    """
    import numpy as np
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder, not an .npz file")
    out = {}  # (each entry read is checked against its CRC by zipfile as it is read)
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                key = info.filename.removesuffix(".npy")
                if keys is not None and key not in keys:
                    continue
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"entry {info.filename!r} is not an array (.npy)")
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read(f)
                    if dtype.hasobject:
                        raise ValueError(f"entry {key!r} holds Python objects (a pickle, "
                                         "which can run code); distnn reads only numeric "
                                         "and text arrays")
                    need = dtype.itemsize
                    for n in shape:
                        need *= n
                    if need > info.file_size:
                        raise ValueError(f"entry {key!r} declares shape {shape} of {dtype} "
                                         f"({need} bytes) but holds {info.file_size} bytes")
                with z.open(info) as f:
                    out[key] = np.lib.format.read_array(f, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path!r} is not a valid .npz file of arrays: {exc}") from None
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as exc:
        raise ValueError(f"{path!r} is truncated or corrupt ({exc})") from None
    missing = sorted(set(keys or ()) - set(out))
    if missing:
        raise KeyError(missing[0])
    for key, value in out.items():
        if finite and key.startswith(tuple(finite)) and value.dtype.kind in "fc" \
                and not np.all(np.isfinite(value)):
            raise ValueError(f"{path!r}: entry {key!r} holds NaN or inf; the file is corrupt "
                             "or comes from a run that diverged")
    return out
