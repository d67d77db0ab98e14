"""Secure aggregation by pairwise additive masks (Bonawitz et al. 2017, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", its masking round).

Every pair of clients (i, j) agrees on a seed with an X25519 key agreement (RFC 7748):
each client publishes only its public key (one all-gather), and both ends of a pair derive
the same shared secret from their own private key and the other's public key; nothing
else about it crosses the communicator. Each round, client i adds to its update the masks
``+PRG(s_ij, round)`` for every j > i and ``-PRG(s_ij, round)`` for every j < i, so the
masks cancel in the sum over the clients, and what leaves a process is its clients'
updates plus masks that only the pair knows.

Exactness: the updates are carried in fixed point, as 64-bit integers of 2**-32 units
(``FRACTION_BITS``), and masks and sums are computed modulo 2**64 (NumPy's and MPI's
unsigned arithmetic wraps). The masks then cancel exactly, and the secure sum is exactly
the sum of the clients' fixed-point values: bit for bit the float64 sum for values on that
grid, else within 2**-33 per client and element. The fixed-point sum must stay below
2**(63 - 32) in magnitude; larger values are refused (``SecureAggregationError``).

Dropped clients: the set of clients taking part in a round is agreed before masking
(clients that fail during local training are left out of it), so the masks are drawn among
the survivors only. Recovering the masks of a client that drops after it sent its masked
update (Bonawitz's secret-shared seeds) is not built.

``CKKSAggregator``: the other way to keep the payload unreadable on the wire, homomorphic
encryption with TenSEAL's CKKS (an optional extra; refused by name when not installed).
"""
from __future__ import annotations

import hashlib
import os
from typing import Mapping, Sequence

import numpy as np

__all__ = ["FRACTION_BITS", "SecureAggregationError", "SecureAggregator", "x25519",
           "public_key", "encode", "decode", "ENCRYPTIONS", "CKKSAggregator", "check_ckks",
           "load_tenseal"]

FRACTION_BITS = 32
_SCALE = float(2 ** FRACTION_BITS)
_LIMIT = float(2 ** (63 - FRACTION_BITS))
_P = 2 ** 255 - 19
_A24 = 121665
_BASE = 9


class SecureAggregationError(ValueError):
    """An update that the fixed-point encoding cannot hold, or clients that disagree."""


def _clamp(secret: bytes) -> int:
    k = bytearray(secret)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    return int.from_bytes(k, "little")


def x25519(secret: bytes, u: int) -> int:
    """RFC 7748's X25519: the u-coordinate of ``secret`` times the point ``u`` on
    Curve25519 (Montgomery ladder, constant sequence of operations)."""
    k = _clamp(secret)
    x1, x2, z2, x3, z3, swap = u % _P, 1, 0, u % _P, 1, 0
    for t in reversed(range(255)):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3 = (da + cb) ** 2 % _P
        z3 = x1 * (da - cb) ** 2 % _P
        x2 = aa * bb % _P
        z2 = e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return x2 * pow(z2, _P - 2, _P) % _P


def public_key(secret: bytes) -> int:
    """The public key of a 32-byte private key."""
    return x25519(secret, _BASE)


def encode(x: np.ndarray) -> np.ndarray:
    """float64 values as 64-bit fixed point (units of 2**-FRACTION_BITS), as uint64."""
    x = np.asarray(x, np.float64)
    if x.size and not np.isfinite(x).all():
        raise SecureAggregationError("the update holds NaN or infinite values")
    if x.size and np.abs(x).max() >= _LIMIT:
        raise SecureAggregationError(f"an update value of magnitude {np.abs(x).max():.3g} does "
                                     f"not fit the fixed point (below {_LIMIT:.3g})")
    return np.rint(x * _SCALE).astype(np.int64).view(np.uint64)


def decode(s: np.ndarray) -> np.ndarray:
    """The float64 values of a fixed-point (uint64) array."""
    return np.ascontiguousarray(s).view(np.int64).astype(np.float64) / _SCALE


class SecureAggregator:
    """Pairwise-masked sums over clients spread over the ranks of ``comm``.

    Collective: every rank builds it with the list of all clients' owners (``owner[k]``:
    the rank client k lives on); each rank's clients draw private keys, the public keys
    are all-gathered and every pair's seed is derived where its clients live.

    Args:
        comm: the communicator (every rank calls the collectives in the same order).
        owners: owners[k] is the rank that holds client k.
        secrets: optional 32-byte private keys of this rank's clients (default: os.urandom).

    Example:
        agg = SecureAggregator(comm, owners=[0, 1, 0, 1])
        total = agg.sum({k: update_k for k in my_clients}, survivors=[0, 1, 3], round=0)
    """

    def __init__(self, comm, owners: Sequence[int], secrets: Mapping[int, bytes] | None = None):
        self.comm = comm
        self.owners = [int(r) for r in owners]
        self.mine = [k for k, r in enumerate(self.owners) if r == comm.rank]
        secrets = dict(secrets or {})
        keys = {k: secrets.get(k) or os.urandom(32) for k in self.mine}
        published = {k: public_key(s) for k, s in keys.items()}
        self.public = {}
        for part in comm.allgather_obj(published):
            self.public.update(part)
        if sorted(self.public) != list(range(len(self.owners))):
            raise SecureAggregationError(f"public keys of clients {sorted(self.public)} for "
                                         f"{len(self.owners)} clients")
        self._seeds = {}
        for i in self.mine:
            for j in range(len(self.owners)):
                if j != i:
                    shared = x25519(keys[i], self.public[j]).to_bytes(32, "little")
                    pair = f"{min(i, j)}-{max(i, j)}".encode()
                    self._seeds[i, j] = int.from_bytes(
                        hashlib.sha256(b"distnn-secagg" + pair + shared).digest(), "little")

    def mask(self, client: int, survivors: Sequence[int], round: int, n: int) -> np.ndarray:
        """Client ``client``'s mask of ``n`` uint64 values in round ``round``: the sum of
        +PRG for the survivors after it and -PRG for those before it."""
        out = np.zeros(n, np.uint64)
        for j in survivors:
            if j == client:
                continue
            gen = np.random.PCG64(np.random.SeedSequence(self._seeds[client, j],
                                                         spawn_key=(int(round),)))
            prg = gen.random_raw(n).astype(np.uint64)
            if client < j:
                out += prg
            else:
                out -= prg
        return out

    def masked(self, updates: Mapping[int, np.ndarray], survivors: Sequence[int],
               round: int, n: int) -> np.ndarray:
        """What this rank sends: the sum (mod 2**64) of its surviving clients' masked
        fixed-point updates (zeros where it has none)."""
        out = np.zeros(n, np.uint64)
        for k, update in updates.items():
            if k not in survivors:
                continue
            if self.owners[k] != self.comm.rank:
                raise SecureAggregationError(f"client {k} lives on rank {self.owners[k]}, "
                                             f"not on rank {self.comm.rank}")
            out += encode(update) + self.mask(k, survivors, round, n)
        return out

    def sum(self, updates: Mapping[int, np.ndarray], survivors: Sequence[int], round: int,
            n: int | None = None) -> np.ndarray:
        """The sum over the survivors of their updates (float64; collective): each rank
        all-reduces only masked values."""
        if n is None:
            n = len(next(iter(updates.values())))
        buf = self.masked(updates, sorted(int(k) for k in survivors), round, n)
        self.comm.allreduce_(buf, "sum")
        return decode(buf)


# -- homomorphic encryption of the sum (TenSEAL's CKKS, an optional extra) -------------------
ENCRYPTIONS = ("none", "ckks", "tenseal")  # tenseal: PyDTNN's name of the same backend


def load_tenseal(option: str = "--encryption"):
    """TenSEAL, or an ImportError naming ``option`` and how to install it."""
    try:
        import tenseal
    except ImportError as exc:
        raise ImportError(f"CKKS needs TenSEAL (python -m pip install tenseal), which "
                          f"is not installed here ({exc}); drop {option}") from None
    return tenseal


def check_ckks(slots: int, scale: float, security: int) -> int:
    """The bits of ``scale``; ValueError naming the CKKS parameter that does not fit."""
    bits = float(np.log2(scale))
    if slots not in (4096, 8192):
        raise ValueError(f"encryption_slots must be 4096 or 8192, got {slots!r}")
    if bits != int(bits) or not 20 <= bits <= 50:
        raise ValueError(f"encryption_scale must be a power of two from 2**20 to 2**50, got "
                         f"{scale!r}")
    if security != 128:
        raise ValueError(f"encryption_security: SEAL's parameters here give 128 bits, got "
                         f"{security!r}")
    return int(bits)


class CKKSAggregator:
    """Sums of float64 vectors over the ranks as CKKS ciphertexts (TenSEAL): each rank
    encrypts its vector in chunks of ``slots`` values, the ciphertexts are all-gathered and
    added homomorphically, and the sum is decrypted. Rank 0 makes the context (its keys)
    and broadcasts it once, secret key included: every rank can decrypt (the payload is
    encrypted on the wire, as PyDTNN's encrypted averaging; the ranks trust each other).
    CKKS is approximate: the sum is exact to about 1e-7 relative at the default scale.

    Args:
        comm: the communicator.
        slots: values per ciphertext (4096 or 8192: polynomial degree 2 x slots).
        scale: CKKS's scale, a power of two from 2**20 to 2**50.
        security: bits of security (128, SEAL's default; others are refused).
    """

    def __init__(self, comm, slots: int = 4096, scale: float = 2.0 ** 40, security: int = 128):
        ts = load_tenseal()
        bits = check_ckks(slots, scale, security)
        self.comm, self.slots, self._ts = comm, int(slots), ts
        middle = [int(bits)] * (2 if slots == 4096 else 4)
        blob = None
        if comm.rank == 0:
            ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=2 * self.slots,
                             coeff_mod_bit_sizes=[60, *middle, 60])
            ctx.global_scale = float(scale)
            blob = ctx.serialize(save_secret_key=True)
        self.context = ts.context_from(comm.bcast_obj(blob, root=0))
        self.bytes_sent = 0

    def sum(self, x: np.ndarray) -> np.ndarray:
        """The sum over the ranks of ``x`` (collective)."""
        x = np.asarray(x, np.float64)
        chunks = [self._ts.ckks_vector(self.context, x[lo:lo + self.slots].tolist()).serialize()
                  for lo in range(0, len(x), self.slots)]
        self.bytes_sent += sum(len(c) for c in chunks)
        total = None
        for part in self.comm.allgather_obj(chunks):
            vecs = [self._ts.ckks_vector_from(self.context, c) for c in part]
            total = vecs if total is None else [a + b for a, b in zip(total, vecs)]
        return np.concatenate([np.asarray(v.decrypt(), np.float64) for v in total])[:len(x)]
