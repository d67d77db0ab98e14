"""distnn's benchmark suite: ``python -m benchmarks --help``.

Every measurement runs in its own subprocess (``benchmarks/workers/*_worker.py``); the
harness in ``__main__`` alternates distnn and its peers (PyTorch eager, PyTorch DDP over
gloo, PyDTNN) on the same work, takes medians and prints a Markdown table of ratios.
"""
