"""Which registered convolution method the fixed plan picks for every convolution of the zoo
models, on each CPU kind (passed to the planner as a CPU object, so both kinds are answered
on any host), in each dtype, and the path inside the method (Winograd's compiled drivers or
loop, wide planes; the register-tiled kernels' rows, column copies, phases or flat rows);
which registered methods no layer picks; the choices of ``--kernels measure`` from a plan
file; and (``--trace``) which functions of distnn/kernels no training step of the zoo runs
on either kind: the evidence for removing a method (issue 57, item 5).

    python benchmarks/kernel_choices.py [--batch 64] [--threads 1,2] [--models a,b]
        [--dtypes float32,float64] [--measured PLANS.json] [--trace FOLDER]

Prints one table a CPU kind: (family, method, dtype, path) -> the layers (model: C->F HxW
kernel stride, threads) that pick it, then the methods picked by none. The tables run and
time nothing; ``--measured`` reads a plan file of ``distnn info --kernels measure`` (write
one with DISTNN_KERNEL_PLANS=FILE); ``--trace`` runs one training step and one inference
forward of each ``--trace-models`` model in a process per CPU kind (AVX2 as the tests run it
on an AVX-512 host: NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=""), thread count and dtype.
"""
from __future__ import annotations

import sys

if "--trace-one" in sys.argv:  # trace the imports too: every kernel line that runs
    import importlib.util
    import threading
    _FILES: dict = {}
    _DIR = importlib.util.find_spec("distnn").submodule_search_locations[0] + "/kernels/"

    def _local(frame, event, arg):
        if event == "line":
            _FILES[frame.f_code.co_filename].add(frame.f_lineno)
        return _local

    def _call(frame, event, arg):
        if frame.f_code.co_filename.startswith(_DIR):
            _FILES.setdefault(frame.f_code.co_filename, set()).add(frame.f_code.co_firstlineno)
            return _local
        return None

    threading.settrace(_call)
    sys.settrace(_call)

import argparse
from collections import defaultdict

import numpy as np

from distnn.kernels import planner, registry
from distnn.kernels.im2col import conv_geometry
from distnn.models import MODELS, get_model
from distnn.nn import Conv2D

ZOO = ("lenet", "simplecnn", "resnet20", "resnet32", "vgg11bn", "vgg16", "alexnet_cifar",
       "resnet9", "mobilenet_v2", "mobilenet_v2_x0_5", "vit_tiny")


def convolutions(model):
    """Every Conv2D of a built model, through containers."""
    stack = list(model.layers)
    while stack:
        layer = stack.pop(0)
        if isinstance(layer, Conv2D):
            yield layer
        sub = getattr(layer, "sublayers", None)
        if callable(sub):
            stack[:0] = list(sub())


def variant(g, f: int, dtype, kind: str, threads: int, name: str, backward=False) -> str:
    """The fixed plan's path inside a method (what the planner's switches choose):
    Winograd's blocks in the compiled drivers ("drivers", F(4x4) only) or the Python loop,
    F(4x4)'s transforms vectorized over a plane's tiles ("wide", ``_winograd4w``) or tile
    by tile; the register-tiled direct kernels on whole rows ("rows"), column copies
    ("cols"), input phases (stride 2) or flat rows; as ``winograd._plan`` and
    ``direct._Layout`` decide them."""
    cpu = planner.CPU(kind)
    if name.startswith("winograd"):
        tile = int(name[-1])
        th, tw = -(-g.oh // tile), -(-g.ow // tile)
        cols = 0 if backward or tile != 4 else planner.forward_cols(dtype, g.c, f, threads,
                                                                      cpu)
        workers = planner.winograd_blocks(g.n, g.c, f, th, tw, np.dtype(dtype).itemsize,
                                          (tile + 2) ** 2, threads, cols=cols)[2]
        drivers = tile == 4 and planner.winograd_drivers(dtype, g.c, f, workers, threads, cpu)
        from distnn.kernels._winograd4w import WIDE_TILES
        wide = tile == 4 and th * (tw + 1) >= WIDE_TILES
        return "+".join(["drivers" if drivers else "loop"] + (["wide"] if wide else []))
    if name == "vector":
        if planner.vector_cols(g):
            return "cols"
        if (g.sh, g.sw) != (1, 1):
            return "phases"
        return "rows" if planner.vector_rows(g.oh, g.ow) else "flat"
    return ""


def choices(models, batch: int, threads: list[int], dtypes=("float32",)):
    """{kind: {(family, method, dtype, path): [layers]}} of the fixed plan."""
    table = {kind: defaultdict(list) for kind in ("avx512", "avx2")}
    for name in models:
        for dname in dtypes:
            dtype = np.dtype(dname)
            model = get_model(name, dtype=dtype)
            for layer in convolutions(model):
                c, h, w = layer.input_shape
                g = conv_geometry((batch, c, h, w), layer.kernel_size, layer.strides,
                                  layer._pads, layer.dilation)
                groups = getattr(layer, "groups", 1)
                family = "conv2d" if groups == 1 else "conv2d_grouped"
                where = (f"{name}: {c}->{layer.filters} {h}x{w} k{g.kh} s{g.sh}"
                         + (f" g{groups}" if groups > 1 else ""))
                for kind in table:
                    for t in threads:
                        q = registry.Query(g, layer.filters, dtype, planner.CPU(kind), t,
                                           groups=groups)
                        picked = registry.fixed(family, q)
                        path = variant(g, layer.filters, dtype, kind, t, picked)
                        table[kind][(family, picked, dname, path)].append(f"{where} t{t}")
                        if family != "conv2d":
                            continue
                        back = picked
                        if picked in ("winograd2", "winograd4"):
                            bq = registry.BackwardQuery(
                                g, layer.filters, dtype, planner.CPU(kind), t,
                                cache=_winograd_cache(g, picked, kind, layer.filters, dtype))
                            back = registry.fixed("conv2d_backward", bq)
                        elif picked in ("flat", "compact"):
                            back = "reference"
                        path = variant(g, layer.filters, dtype, kind, t, back, backward=True)
                        table[kind][("conv2d_backward", back, dname, path)].append(
                            f"{where} t{t}")
    return table


def _winograd_cache(g, name, kind, f, dtype=np.float32):
    from distnn.kernels.geometry import ConvCache
    back = planner.vector_backward(g, f, dtype, cpu=planner.CPU(kind))
    return ConvCache(g, "winograd", None, tile=int(name[-1]), vector_backward=back)


# -- what one training step of each model runs (--trace) ----------------------------------
TRACED = ("lenet", "simplecnn", "resnet20", "vgg11bn", "mobilenet_v2", "gpt_mini", "vit_tiny")


def measured(path: str) -> None:
    """The choices of a plan file of ``--kernels measure`` (kernels.measure's format), one
    line a layer shape: the measured method, the fixed plan's, the timed ones (ms)."""
    import json
    with open(path) as fh:
        plans = json.load(fh)
    print(f"\n## --kernels measure on this host ({path}): measured vs fixed, ms of each")
    picks = defaultdict(int)
    for key, e in sorted(plans.items(), key=lambda i: i[0].split("|")[2:]):
        cpu, kind, t, backend, dtype, family, shape = key.split("|")
        times = ", ".join(f"{n} {v * 1e3:.2f}" for n, v in sorted(e["seconds"].items(),
                                                                  key=lambda i: i[1]))
        print(f"{kind} {t} {dtype} {family:<15} {shape:<50} {e['method']:<10} "
              f"(fixed {e['fixed']}): {times}")
        picks[(family, e["method"])] += 1
    print("measured picks: " + ", ".join(f"{f} {m} x{n}" for (f, m), n in sorted(picks.items())))


def trace_one(models: list[str], threads: int, dtype: str, batch: int, out: str) -> None:
    """One forward and backward of each model (fixed plan) at ``threads``, with the lines
    of distnn/kernels that ran (traced from the start of this process: ``--trace-one``)
    and the compiled functions called, written to ``out``."""
    import json
    import threading
    from distnn.kernels import planner as plan
    from distnn.models import _DEFAULT_INPUT
    from distnn.run import threads_scope
    rng = np.random.default_rng(0)
    with threads_scope(threads):
        for name in models:
            model = get_model(name, dtype=np.dtype(dtype))
            kind = MODELS[name][1]
            shape = (batch,) + tuple(_DEFAULT_INPUT[kind])
            x = (rng.integers(1, 256, shape) if kind == "text"
                 else rng.standard_normal(shape).astype(dtype))
            y = model.forward(x, training=True)
            model.backward(np.ones_like(y))
            model.forward(x, training=False)  # the inference kernels too
    sys.settrace(None)
    threading.settrace(None)
    compiled = []
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("distnn.kernels."):
            continue
        for value in vars(mod).values():
            for f in (value, getattr(value, "serial", None), getattr(value, "parallel", None)):
                if getattr(f, "signatures", None) and getattr(f, "py_func", None) is not None:
                    code = f.py_func.__code__
                    compiled.append([code.co_filename, code.co_firstlineno, f.py_func.__name__])
    with open(out, "w") as fh:
        json.dump({"kind": plan.target().kind, "threads": threads, "dtype": dtype,
                   "lines": {k: sorted(v) for k, v in _FILES.items()},
                   "compiled": compiled}, fh)


def trace(models: list[str], threads: list[int], dtypes: list[str], batch: int,
          folder: str) -> list[str]:
    """``trace_one`` in a process per (CPU kind, threads, dtype): AVX2 as the tests run it
    on an AVX-512 host (``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=""``, its own numba
    cache), AVX-512 as the host; the result files."""
    import os
    import subprocess
    import sys
    import tempfile
    outs = []
    for kind in ("avx512", "avx2"):
        env = dict(os.environ)
        if kind == "avx2":
            env.update(NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="",
                       NUMBA_CACHE_DIR=os.path.join(tempfile.gettempdir(),
                                                    f"distnn-numba-{os.getuid()}", "haswell"))
        for t in threads:
            for d in dtypes:
                out = os.path.join(folder, f"trace-{kind}-t{t}-{d}.json")
                subprocess.run([sys.executable, __file__, "--trace-one", out, "--threads",
                                str(t), "--dtypes", d, "--batch", str(batch), "--models",
                                ",".join(models)], env=env, check=True)
                outs.append(out)
    return outs


def unreached(outs: list[str]) -> list[str]:
    """The kernel package's functions that no traced step runs, per module (lines of each),
    from ``trace``'s files: Python functions none of whose lines ran; compiled ones (numba
    ``jit``, ``intrinsic``) that no step called and no reached compiled function names (a
    call inside compiled code, from numba's disk cache, leaves no trace)."""
    import ast
    import json
    import os
    ran: dict = {}
    jitted: set = set()
    kinds = []
    for out in outs:
        with open(out) as fh:
            data = json.load(fh)
        kinds.append(f"{data['kind']} t{data['threads']} {data['dtype']}")
        for f, lines in data["lines"].items():
            ran.setdefault(os.path.basename(f), set()).update(lines)
        jitted.update((os.path.basename(f), line) for f, line, _ in data["compiled"])
    import distnn.kernels as pkg
    folder = os.path.dirname(pkg.__file__)
    defs = []  # (file, node, kind, start)
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(folder, name)).read())
        # names bound to a jit decorator at module level (``_plane = nb.njit(...)``)
        aliases = {t.id for a in tree.body if isinstance(a, ast.Assign)
                   and "jit(" in ast.unparse(a.value) for t in a.targets
                   if isinstance(t, ast.Name)}
        inside_compiled = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            text = " ".join(ast.unparse(d) for d in node.decorator_list)
            words = set(text.replace("(", " ").replace(".", " ").split())
            kind = ("intrinsic" if "intrinsic" in text
                    else "jit" if "jit" in text or words & aliases else "py")
            if kind != "py":
                inside_compiled.update(id(n) for n in ast.walk(node) if n is not node)
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            defs.append((name, node, kind, start))
        defs = [d for d in defs if id(d[1]) not in inside_compiled]
    reached = set()
    for name, node, kind, start in defs:
        lines = ran.get(name, set())
        # a body's lines (its def line runs at import)
        if (kind == "py" and lines & set(range(node.body[0].lineno, node.end_lineno + 1))
                or kind == "jit" and (name, start) in jitted):
            reached.add(id(node))
    grew = True
    while grew:  # compiled code's calls of other compiled functions, by name
        named = set()
        for _file, node, kind, _ in defs:
            if id(node) in reached and kind != "py":
                named.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
                named.update(n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute))
        grew = False
        for _file, node, kind, _ in defs:
            if kind != "py" and id(node) not in reached and node.name in named:
                reached.add(id(node))
                grew = True
    report = [f"traced: {', '.join(kinds)}"]
    by_file: dict = {}
    for name, node, kind, start in defs:
        if id(node) not in reached:
            size = node.end_lineno - start + 1
            by_file.setdefault(name, []).append(
                f"{node.name} ({'' if kind == 'py' else kind + ', '}{size})")
    for name, gone in by_file.items():
        report.append(f"{name}: " + ", ".join(gone))
    return report

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default=",".join(m for m in ZOO if m in MODELS))
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--trace", metavar="FOLDER",
                    help="also run one training step of each of --trace-models a process "
                         "per CPU kind, thread count and dtype, and list the kernel "
                         "package's functions none of them runs (result files in FOLDER)")
    ap.add_argument("--trace-models", default=",".join(TRACED))
    ap.add_argument("--measured", metavar="PLANS",
                    help="also list the choices of a plan file written by --kernels "
                         "measure (``distnn info --kernels measure``): each shape's "
                         "method against the fixed plan's")
    ap.add_argument("--trace-one", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    dtypes = args.dtypes.split(",")
    if args.trace_one:
        trace_one(args.models.split(","), threads[0], dtypes[0], args.batch, args.trace_one)
        return
    table = choices(args.models.split(","), args.batch, threads, dtypes)
    picked_anywhere = set()
    for kind, rows in table.items():
        print(f"\n## {kind} (fixed plan, {', '.join(dtypes)}, batch {args.batch}, "
              f"threads {threads})")
        print(f"{'family':<16} {'method':<10} {'dtype':<8} {'path':<13} layers (t: threads)")
        for (family, name, dname, path), layers in sorted(rows.items()):
            picked_anywhere.add((family, name))
            uniq = sorted(set(layers))
            print(f"{family:<16} {name:<10} {dname:<8} {path or '-':<13} {len(uniq):>3}: "
                  f"{'; '.join(uniq[:4])}" + (" ..." if len(uniq) > 4 else ""))
    if args.measured:
        measured(args.measured)
    print(f"\n## registered methods no zoo layer picks on either kind (fixed plan, "
          f"{', '.join(dtypes)})")
    for family, methods in registry.METHODS.items():
        for name, m in methods.items():
            if (family, name) not in picked_anywhere:
                print(f"{family:<16} {name:<10} {'compiled' if m.compiled else 'NumPy'}")
    if args.trace:
        import os
        os.makedirs(args.trace, exist_ok=True)
        outs = trace(args.trace_models.split(","), threads, dtypes, args.batch, args.trace)
        print("\n## functions of distnn/kernels that no traced training step runs "
              f"(models {args.trace_models}, batch {args.batch}, fixed plan)")
        print("\n".join(unreached(outs)))


if __name__ == "__main__":
    main()
