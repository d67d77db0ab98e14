"""``import theano`` served by PyTensor, for Theano-MPI's model classes.

Theano is no longer maintained (and does not import on current Python and NumPy);
PyTensor is its successor with the same graph API. ``theano_names()`` installs an import
hook for the module names ``theano`` and ``theano.*`` only: nothing lands in
``sys.modules`` until a model file imports theano, and the hook is removed on exit.

Each ``theano...`` module is PyTensor's module of the same path, with the names PyTensor
moved or dropped added (``theano_ops`` builds them):

=================================================  ==========================================
Theano                                             served as
=================================================  ==========================================
``theano.tensor.nnet.{softmax, relu, sigmoid,``    ``theano_ops`` (softmax over the last axis,
``categorical_crossentropy, conv2d, ...}``          conv2d by im2col slices)
``theano.tensor.nnet.conv.conv2d``                 the same conv2d
``theano.tensor.signal.pool.pool_2d``              ``theano_ops.pool_2d``
``theano.tensor.signal.downsample.max_pool_2d``    ``theano_ops.max_pool_2d``
``theano.tensor.shared_randomstreams.RandomStreams``, ``theano.sandbox.rng_mrg.MRG_RandomStreams``
                                                   PyTensor's ``RandomStream``
``theano.config.floatX``, ``.device``              PyTensor's config; ``device`` reads "cpu"
=================================================  ==========================================

What has no CPU counterpart (``theano.gpuarray``, ``theano.sandbox.cuda``) is refused with
one line saying so.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Iterator

GPU_MODULES = ("theano.gpuarray", "theano.sandbox.cuda")


class _Extras:
    """Names added to (or replacing) PyTensor's in each served module."""

    @staticmethod
    def get(name: str) -> dict:
        from pytensor.tensor.random.utils import RandomStream

        from . import theano_ops
        table = {
            "theano.tensor": {"nnet": "theano.tensor.nnet", "signal": "theano.tensor.signal",
                              "shared_randomstreams": "theano.tensor.shared_randomstreams"},
            "theano.tensor.nnet": dict(theano_ops.NNET, conv="theano.tensor.nnet.conv",
                                       nnet="theano.tensor.nnet.nnet"),
            "theano.tensor.nnet.conv": {"conv2d": theano_ops.conv2d},
            "theano.tensor.signal": {"pool": "theano.tensor.signal.pool",
                                     "downsample": "theano.tensor.signal.downsample"},
            "theano.tensor.signal.pool": {"pool_2d": theano_ops.pool_2d},
            "theano.tensor.signal.downsample": {"max_pool_2d": theano_ops.max_pool_2d},
            "theano.tensor.shared_randomstreams": {"RandomStreams": RandomStream},
            "theano.sandbox": {"rng_mrg": "theano.sandbox.rng_mrg"},
            "theano.sandbox.rng_mrg": {"MRG_RandomStreams": RandomStream},
        }
        return table.get(name, {})


# served modules that PyTensor does not have under the same path
_OWN = ("theano.tensor.nnet", "theano.tensor.nnet.conv", "theano.tensor.signal.pool",
        "theano.tensor.signal.downsample", "theano.tensor.shared_randomstreams",
        "theano.sandbox", "theano.sandbox.rng_mrg", "theano.tensor.nnet.nnet")


class _Config:
    """``theano.config``: PyTensor's, with Theano's ``device`` (this build runs on CPU)."""

    def __init__(self, config):
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name):
        if name == "device":
            return "cpu"
        return getattr(self._config, name)

    def __setattr__(self, name, value):
        if name == "device":
            return
        setattr(self._config, name, value)


def _module(name: str) -> types.ModuleType:
    """The module ``theano...`` served as: PyTensor's ``pytensor...`` with the extras."""
    for gpu in GPU_MODULES:
        if name == gpu or name.startswith(gpu + "."):
            raise ImportError(f"{name}: no GPU backend here; distnn runs Theano-MPI models "
                              "on CPU (one MPI rank per process): drop the GPU imports and "
                              "device names from the model file")
    target = "pytensor" + name[len("theano"):]
    base = None
    if name not in _OWN:
        try:
            base = importlib.import_module(target)
        except ImportError:
            raise ImportError(f"{name}: PyTensor has no {target}, and distnn does not map "
                              "it (see distnn.models.theano_shim for the names it maps)"
                              ) from None
    module = types.ModuleType(name, getattr(base, "__doc__", None))
    module.__path__ = []  # a package, so that its served submodules import
    extras = _Extras.get("theano.tensor.nnet" if name == "theano.tensor.nnet.nnet" else name)
    submodules = {k: v for k, v in extras.items() if isinstance(v, str)}
    module.__dict__.update({k: v for k, v in extras.items() if not isinstance(v, str)})

    def attribute(attr: str):
        # submodules import when first read: the module is not in sys.modules yet here
        if attr in submodules:
            return importlib.import_module(submodules[attr])
        if base is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        return getattr(base, attr)

    module.__getattr__ = attribute
    if name == "theano":
        import pytensor
        module.config = _Config(pytensor.config)
        module.__version__ = f"pytensor {pytensor.__version__}"
    return module


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return _module(spec.name)

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Serves ``theano`` and ``theano.*``; every other name is left to the next finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "theano" or fullname.startswith("theano."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


@contextlib.contextmanager
def theano_names() -> Iterator[None]:
    """Within it ``import theano`` (and its submodules) gives PyTensor under Theano's names.

    Example:
        with theano_names():
            model = load_model_class("mycnn.py", "CNN")(config)
    """
    try:
        import pytensor  # noqa: F401
    except ImportError:
        raise ImportError("a Theano-MPI model class needs PyTensor for its theano imports: "
                          "pip install 'distnn[theano]' (or pip install pytensor)") from None
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def theano_names_if_installed():
    """``theano_names()`` where PyTensor is installed, else a context that does nothing:
    a model file that imports theano then fails on its own ``import theano``."""
    if importlib.util.find_spec("pytensor") is None:
        return contextlib.nullcontext()
    return theano_names()
