"""distnn's NumPy layer engine.

The layer classes are exported from their family modules as they are defined there: every
public ``Layer`` subclass of a module in ``FAMILIES`` is a name of ``distnn.nn``, so adding a
layer touches its family module only."""
from importlib import import_module

from .activations import ACTIVATIONS
from .allocator import reuse_freed_memory
from .base import Layer, layer_classes
from .fusion import set_add_relu_fusion, set_bn_relu_fusion
from .model import Model, ModelMethods

FAMILIES = ("activations", "attention", "containers", "conv", "core", "embedding",
            "normalization", "pooling", "sequence", "transformer")


def _family_layers() -> dict[str, type]:
    """Name -> class of the public layer classes the family modules define."""
    for family in FAMILIES:
        import_module(f"{__name__}.{family}")
    modules = {f"{__name__}.{family}" for family in FAMILIES}
    return {cls.__name__: cls for cls in layer_classes()
            if cls.__module__ in modules and not cls.__name__.startswith("_")}


_LAYERS = _family_layers()
globals().update(_LAYERS)
import_module(f"{__name__}.inference")  # Model.predict's oneDNN programs (nn/model.py)

reuse_freed_memory()

__all__ = ["reuse_freed_memory", "Layer", "Model", "ModelMethods", "ACTIVATIONS",
           "set_bn_relu_fusion", "set_add_relu_fusion", *sorted(_LAYERS)]
