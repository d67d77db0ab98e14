"""Atomic operations on int64 flag arrays, for compiled code that threads share, and the
waits built on them (a thread team's handshakes: ``_threads._Team``, ``_team_jobs``).

numba has no atomics: each is an LLVM instruction emitted by an ``intrinsic``, so a load in
a wait loop is not hoisted out of it and a store is seen in order by the other threads.
"""
from __future__ import annotations

import numba as nb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _load_acquire(typingctx, flags, i):
    """flags[i] (int64) as an atomic acquire load: a plain load in a loop would be hoisted
    out of it."""
    sig = types.int64(flags, i)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.load_atomic(builder.gep(data, [args[1]]), "acquire", 8)
    return sig, codegen


def _add_one(ordering: str):
    """The intrinsic counters[i] += 1 (int64) as one atomic step with LLVM's ``ordering``,
    returning the value before."""
    @intrinsic
    def add(typingctx, counters, i):
        sig = types.int64(counters, types.int64)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.atomic_rmw("add", builder.gep(data, [args[1]]),
                                      ir.Constant(ir.IntType(64), 1), ordering)
        return sig, codegen
    return add


# counters[i] += 1, returning the value before: compiled threads that each take the next
# block number from a shared counter take each once
fetch_add = _add_one("monotonic")
# flags[i] += 1 as one sequentially consistent step, returning the old value
_post_add = _add_one("seq_cst")


@intrinsic
def _store_release(typingctx, flags, i, value):
    """flags[i] = value (int64) as an atomic release store: what this thread wrote before
    is seen by a thread that then loads flags[i] with acquire."""
    sig = types.void(flags, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        builder.store_atomic(args[2], builder.gep(data, [args[1]]), "release", 8)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _exchange(typingctx, flags, i, value):
    """flags[i] = value (int64) as one sequentially consistent step, returning the old
    value: with ``_post`` the handshake by which a helper goes to sleep (``_Team``)."""
    sig = types.int64(flags, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("xchg", builder.gep(data, [args[1]]), args[2], "seq_cst")
    return sig, codegen


@intrinsic
def _load_seq_cst(typingctx, flags, i):
    """flags[i] (int64), a sequentially consistent load."""
    sig = types.int64(flags, types.int64)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.load_atomic(builder.gep(data, [args[1]]), "seq_cst", 8)
    return sig, codegen


@nb.njit(cache=True, nogil=True)
def _wait_done(flags, i, value, looks):
    """Wait (without the GIL, giving the core away at each look) until flags[i] == value,
    a compiled job's completion, which its helper stores with release; at most ``looks``
    looks: whether it came."""
    for _ in range(looks):
        if _load_acquire(flags, i) == value:
            return True
        _sched_yield()
    return _load_acquire(flags, i) == value


@intrinsic
def _sched_yield(typingctx):
    """libc's sched_yield() (by name, so the compiled function can be cached)."""
    sig = types.int32()

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(ir.IntType(32), []), "sched_yield")
        return builder.call(fn, [])
    return sig, codegen


@nb.njit(cache=True, nogil=True)
def _spin_while(flags, i, value, yields):
    """Wait (without the GIL) while flags[i] == value, giving the core to any other thread
    that wants it at each look, for at most ``yields`` looks; whether it changed."""
    for _ in range(yields):
        if _load_acquire(flags, i) != value:
            return True
        _sched_yield()
    return False
