"""distnn's NumPy layer engine."""
from .activations import (ACTIVATIONS, GELU, LeakyReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax,
                          Tanh)
from .allocator import reuse_freed_memory
from .attention import MultiHeadAttention
from .base import Layer
from .containers import Add, Concat, Sequential
from .conv import Conv2D
from .core import Dense, Dropout, Flatten
from .fusion import set_add_relu_fusion, set_bn_relu_fusion
from .embedding import Embedding, PositionalEmbedding, SinusoidalPositionalEmbedding, TiedDense
from .model import Model, ModelMethods
from .normalization import BatchNormalization, LayerNormalization, RMSNorm
from .pooling import AvgPool2D, GlobalAvgPool2D, MaxPool2D
from .sequence import ClassToken, PaddingMask, Patchify, SequencePool
from .transformer import TransformerDecoderBlock, TransformerEncoderBlock

reuse_freed_memory()

__all__ = ["reuse_freed_memory", "Layer", "Model", "ModelMethods", "Sequential", "Add",
           "Concat", "Dense", "Flatten",
           "Dropout", "Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D",
           "BatchNormalization", "LayerNormalization", "RMSNorm", "ReLU", "ReLU6",
           "LeakyReLU", "Sigmoid", "Tanh", "Softmax", "GELU", "SiLU", "ACTIVATIONS",
           "Embedding", "PositionalEmbedding", "SinusoidalPositionalEmbedding", "TiedDense",
           "MultiHeadAttention", "TransformerEncoderBlock", "TransformerDecoderBlock",
           "Patchify", "ClassToken", "SequencePool", "PaddingMask",
           "set_bn_relu_fusion", "set_add_relu_fusion"]
