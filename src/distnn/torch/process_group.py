"""A torch.distributed process group made from the MPI world, so that PyTorch's own
distributed code (FSDP2's ``fully_shard``, ``torch.distributed.pipelining``, DDP,
``ZeroRedundancyOptimizer``, DTensor) runs under ``mpiexec`` and ``distnn launch``
unchanged but for one call::

    import distnn.torch
    distnn.torch.init_process_group(backend="gloo")   # was: dist.init_process_group("gloo")

Ranks and the world size are the MPI communicator's; the rendezvous needs no launcher:
rank 0 opens torch's key-value store (a ``TCPStore``) on a port the system picks, so no
two jobs on one host collide, and sends its address and port to the others through MPI.
The address is 127.0.0.1 when every rank is on rank 0's host, else rank 0's host name
resolved on rank 0 (what the emulated cluster's and a real cluster's hosts files give),
else the address of ``GLOO_SOCKET_IFNAME``'s interface. ``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are set as torchrun sets
them, for code that reads them.
"""
from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
from typing import Any

import torch.distributed as tdist

from ..distributed import Communicator
from .basics import init

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def _interface_address(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def rendezvous_address(hostnames: list[str]) -> str:
    """The address the other ranks reach rank 0 at (called on rank 0 with every rank's
    host name, rank 0's first); raises RuntimeError when there is none to find."""
    if all(h == hostnames[0] for h in hostnames):
        return "127.0.0.1"
    try:
        found = socket.gethostbyname(hostnames[0])
    except OSError:
        found = None
    if found and not found.startswith("127."):
        return found
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    found = _interface_address(ifname) if ifname else None
    if found:
        return found
    raise RuntimeError(f"init_process_group: the ranks run on {len(set(hostnames))} hosts "
                       f"and rank 0's host name {hostnames[0]!r} resolves to no address the "
                       "others can reach; pass master_addr= (rank 0's address on the "
                       "network the hosts share) or set GLOO_SOCKET_IFNAME to its interface")


def init_process_group(backend: str = "gloo", *, comm: Communicator | None = None,
                       timeout: datetime.timedelta | None = None,
                       master_addr: str | None = None, master_port: int = 0,
                       **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` with the rank, world size and rendezvous
    taken from MPI (collective: every rank calls it).

    Args:
        backend: the torch.distributed backend ("gloo" on CPUs).
        comm: the distnn Communicator whose ranks form the group (default: the MPI
            world, ``distnn.torch.init()``).
        timeout: torch's timeout for the store and the group's operations (default:
            torch's).
        master_addr: the address of rank 0 the others connect to (default: found as
            the module says).
        master_port: the store's port on rank 0 (default 0: one the system picks).
        **kwargs: passed on to ``torch.distributed.init_process_group`` (``device_id``,
            ``pg_options``, ...).

    Example:
        distnn.torch.init_process_group(backend="gloo")
        model = fully_shard(model)   # torch.distributed.fsdp, as under torchrun
    """
    if tdist.is_initialized():
        raise RuntimeError("init_process_group: torch.distributed is already initialized "
                           "(call torch.distributed.destroy_process_group() first)")
    for key in ("rank", "world_size", "store", "init_method"):
        if key in kwargs:
            raise ValueError(f"init_process_group: {key}= comes from MPI here; drop it (or "
                             "call torch.distributed.init_process_group yourself)")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or \
            not 0 <= master_port < 65536:
        raise ValueError(f"init_process_group: master_port must be a port number 0..65535 "
                         f"(0: the system picks one), got {master_port!r}")
    c = comm if comm is not None else init()
    wait = timeout if timeout is not None else datetime.timedelta(minutes=30)
    hosts = c.allgather_obj(socket.gethostname())
    store, found = None, None
    if c.rank == 0:
        try:
            addr = master_addr or rendezvous_address(hosts)
            store = tdist.TCPStore(addr, master_port, c.size, True, timeout=wait,
                                   wait_for_workers=False)
            found = (addr, store.port)
        except Exception as e:  # every rank raises it, none waits for a store never made
            found = f"{type(e).__name__}: {e}"
    found = c.bcast_obj(found, 0)
    if isinstance(found, str):
        raise RuntimeError(f"init_process_group: rank 0 could not open the rendezvous: "
                           f"{found}")
    addr, port = found
    failed = None
    if store is None:
        try:
            store = tdist.TCPStore(addr, port, c.size, False, timeout=wait)
        except Exception as e:  # every rank raises the first failure, none waits for it
            failed = f"rank {c.rank} could not reach {addr}:{port}: {type(e).__name__}: {e}"
    failures = [f for f in c.allgather_obj(failed) if f]
    if failures:
        raise RuntimeError(f"init_process_group: {failures[0]}; pass master_addr= (rank 0's "
                           "address on the network the hosts share)")
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(c.rank),
                      WORLD_SIZE=str(c.size), LOCAL_RANK=str(c.local_rank),
                      LOCAL_WORLD_SIZE=str(c.local_size))
    tdist.init_process_group(backend, store=store, rank=c.rank, world_size=c.size,
                             timeout=timeout, **kwargs)
