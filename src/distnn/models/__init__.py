"""Model zoo: builders that return an unbuilt or built ``Sequential``.

``get_model(name, input_shape=..., num_classes=...)`` resolves names like ``"simplecnn"``,
``"vgg16bn"``, ``"resnet20"``, ``"resnet50"``, ``"alexnet_cifar"``, ``"densenet121"``,
``"mobilenet_v2"`` (``_x0_5``, ``_x0_25``: width multipliers), and
the transformers ``"gpt_mini"`` (a byte/character language model: input (T,) token ids,
output (T, vocab) logits; ``num_classes`` is the vocabulary), ``"vit_tiny"`` and
``"encoder_classifier"`` (byte sequences padded with 0).
Models end in logits (no softmax): pair them with ``CategoricalCrossEntropy(from_logits=True)``.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from ..nn import (Add, AvgPool2D, BatchNormalization, ClassToken, Concat, Conv2D, Dense, Dropout,
                  Embedding, Flatten, GlobalAvgPool2D, LayerNormalization, MaxPool2D,
                  PaddingMask, Patchify, PositionalEmbedding, ReLU, ReLU6, Sequential,
                  SequencePool, TiedDense, TransformerDecoderBlock, TransformerEncoderBlock)


def simplemlp(num_classes=10):
    """Flatten, three hidden Dense(512)+ReLU layers, Dense(classes)."""
    return [Flatten(), Dense(512), ReLU(), Dense(512), ReLU(), Dense(512), ReLU(),
            Dense(num_classes)]


def simplecnn(num_classes=10):
    """The seed's: Conv(4,3x3) ReLU Conv(8,3x3) ReLU MaxPool(2) Flatten Dense(128) ReLU Dense."""
    return [Conv2D(4, 3), ReLU(), Conv2D(8, 3), ReLU(), MaxPool2D(2), Flatten(),
            Dense(128), ReLU(), Dense(num_classes)]


def simplecnn_pydtnn(num_classes=10):
    """PyDTNN 3.11's own simplecnn (padding 1, dropout 0.5), for engine comparisons."""
    return [Conv2D(4, 3, padding=1), ReLU(), Conv2D(8, 3, padding=1), ReLU(), MaxPool2D(2),
            Flatten(), Dense(128), ReLU(), Dropout(0.5), Dense(num_classes)]


def lenet(num_classes=10):
    """LeNet-5 with ReLU and max pooling (for 1x28x28 input)."""
    return [Conv2D(6, 5, padding=2), ReLU(), MaxPool2D(2), Conv2D(16, 5), ReLU(), MaxPool2D(2),
            Flatten(), Dense(120), ReLU(), Dense(84), ReLU(), Dense(num_classes)]


def alexnet_cifar(num_classes=10):
    """AlexNet sized for 3x32x32 input."""
    return [Conv2D(64, 3, padding=1), ReLU(), MaxPool2D(2),
            Conv2D(192, 3, padding=1), ReLU(), MaxPool2D(2),
            Conv2D(384, 3, padding=1), ReLU(), Conv2D(256, 3, padding=1), ReLU(),
            Conv2D(256, 3, padding=1), ReLU(), MaxPool2D(2), Flatten(),
            Dropout(0.5), Dense(1024), ReLU(), Dropout(0.5), Dense(1024), ReLU(),
            Dense(num_classes)]


def alexnet_cifar10(num_classes=10):
    """PyDTNN's AlexNet for CIFAR-10 (its ``alexnet_cifar10``): first convolution with
    stride 2, three max pools, a 4096-4096 head, for 3x32x32 input."""
    return [Conv2D(64, 3, strides=2, padding=1), ReLU(), MaxPool2D(2),
            Conv2D(192, 3, padding=1), ReLU(), MaxPool2D(2),
            Conv2D(384, 3, padding=1), ReLU(), Conv2D(256, 3, padding=1), ReLU(),
            Conv2D(256, 3, padding=1), ReLU(), MaxPool2D(2), Flatten(),
            Dense(4096), ReLU(), Dropout(0.5), Dense(4096), ReLU(), Dropout(0.5),
            Dense(num_classes)]


def alexnet_imagenet(num_classes=1000):
    """AlexNet for 3x227x227 (or 3x224x224) input."""
    return [Conv2D(96, 11, strides=4), ReLU(), MaxPool2D(3, strides=2),
            Conv2D(256, 5, padding=2), ReLU(), MaxPool2D(3, strides=2),
            Conv2D(384, 3, padding=1), ReLU(), Conv2D(384, 3, padding=1), ReLU(),
            Conv2D(256, 3, padding=1), ReLU(), MaxPool2D(3, strides=2), Flatten(),
            Dropout(0.5), Dense(4096), ReLU(), Dropout(0.5), Dense(4096), ReLU(),
            Dense(num_classes)]


_VGG_CFG = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
         512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"],
}


def vgg(depth=16, batch_norm=False, num_classes=10, imagenet=False):
    """VGG-11/13/16/19; CIFAR head (Dense 512) by default, the 4096-wide head for ImageNet."""
    if depth not in _VGG_CFG:
        raise ValueError(f"vgg: depth must be one of {sorted(_VGG_CFG)}, got {depth!r}")
    layers = []
    for v in _VGG_CFG[depth]:
        if v == "M":
            layers.append(MaxPool2D(2))
        else:
            layers.append(Conv2D(v, 3, padding=1, use_bias=not batch_norm))
            layers += [BatchNormalization(), ReLU()] if batch_norm else [ReLU()]
    layers.append(Flatten())
    width = 4096 if imagenet else 512
    layers += [Dense(width), ReLU(), Dropout(0.5), Dense(width), ReLU(), Dropout(0.5),
               Dense(num_classes)]
    return layers


def _conv_bn(filters, k, stride=1, relu=True):
    out = [Conv2D(filters, k, strides=stride, padding="same", use_bias=False),
           BatchNormalization()]
    return out + [ReLU()] if relu else out


def _basic_block(filters, stride, downsample):
    branch = _conv_bn(filters, 3, stride) + _conv_bn(filters, 3, relu=False)
    shortcut = _conv_bn(filters, 1, stride, relu=False) if downsample else []
    return [Add(branch, shortcut), ReLU()]


def _bottleneck_block(filters, stride, downsample):
    branch = (_conv_bn(filters, 1) + _conv_bn(filters, 3, stride)
              + _conv_bn(4 * filters, 1, relu=False))
    shortcut = _conv_bn(4 * filters, 1, stride, relu=False) if downsample else []
    return [Add(branch, shortcut), ReLU()]


def resnet(depth=20, num_classes=10, imagenet=None):
    """ResNet. CIFAR variants (depth = 6n+2: 20, 32, 44, 56, 110) use 16/32/64 channels;
    ImageNet variants 18, 34 (basic blocks) and 50, 101, 152 (bottlenecks)."""
    imagenet_blocks = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3),
                       101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
    if imagenet is None:
        imagenet = depth in imagenet_blocks
    if not imagenet:
        if (depth - 2) % 6:
            raise ValueError(f"resnet: CIFAR depth must be 6n+2 (20, 32, 56...), got {depth}")
        n = (depth - 2) // 6
        layers = _conv_bn(16, 3)
        for stage, filters in enumerate((16, 32, 64)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                layers += _basic_block(filters, stride, downsample=stride != 1)
        return layers + [GlobalAvgPool2D(), Dense(num_classes)]
    if depth not in imagenet_blocks:
        raise ValueError(f"resnet: ImageNet depth must be one of {sorted(imagenet_blocks)}, "
                         f"got {depth}")
    bottleneck = depth >= 50
    block = _bottleneck_block if bottleneck else _basic_block
    layers = _conv_bn(64, 7, 2) + [MaxPool2D(3, strides=2, padding=1)]
    in_ch = 64
    for stage, (filters, count) in enumerate(zip((64, 128, 256, 512), imagenet_blocks[depth])):
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            out_ch = filters * (4 if bottleneck else 1)
            layers += block(filters, stride, downsample=stride != 1 or in_ch != out_ch)
            in_ch = out_ch
    return layers + [GlobalAvgPool2D(), Dense(num_classes)]


def _needle_conv_bn(filters, k, stride):
    return [Conv2D(filters, k, strides=stride, padding=k // 2), BatchNormalization(), ReLU()]


def resnet9(num_classes=10):
    """Needle's ResNet9 (the model of Needle's apps/ddp): ConvBN blocks (k x k convolution
    with bias and padding k // 2, BatchNorm, ReLU) of 16 (7x7, stride 4) and 32 (stride 2)
    channels, a residual pair of 32, then 64 and 128 (stride 2), a residual pair of 128,
    Flatten, Dense(128), ReLU, Dense(classes). For 3x32x32 input (Flatten sees 128x1x1)."""
    cb = _needle_conv_bn
    return (cb(16, 7, 4) + cb(32, 3, 2) + [Add(cb(32, 3, 1) + cb(32, 3, 1), [])]
            + cb(64, 3, 2) + cb(128, 3, 2) + [Add(cb(128, 3, 1) + cb(128, 3, 1), [])]
            + [Flatten(), Dense(128), ReLU(), Dense(num_classes)])


# MobileNetV2's stages (expansion t, channels c, blocks n, first stride s) for CIFAR-sized
# input: the ImageNet net's table with strides 1 in the stem and the 24-channel stage
# (32x32 in, 4x4 at the end), as the usual CIFAR ports do.
_MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                 (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(c: float, by: int = 8) -> int:
    """c rounded to a multiple of ``by`` and not below 90% of c (torchvision's rule)."""
    out = max(by, int(c + by / 2) // by * by)
    return out + by if out < 0.9 * c else out


def _inverted_residual(c_in, c_out, t, stride):
    hidden = c_in * t
    expand = [] if t == 1 else [Conv2D(hidden, 1, use_bias=False), BatchNormalization(),
                                ReLU6()]
    branch = expand + [Conv2D(hidden, 3, strides=stride, padding=1, groups=hidden,
                              use_bias=False), BatchNormalization(), ReLU6(),
                       Conv2D(c_out, 1, use_bias=False), BatchNormalization()]
    return [Add(branch, [])] if stride == 1 and c_in == c_out else branch


def mobilenet_v2(num_classes=10, width=1.0):
    """MobileNetV2 for CIFAR-sized input: inverted residual blocks (1x1 expansion, depthwise
    3x3, linear 1x1 projection, each with batch norm; ReLU6 after the first two; a residual
    Add where stride 1 keeps the channels), a 1x1 to 1280 (x width when wider) channels,
    global average pooling and Dense. ``width`` multiplies every layer's channels
    (multiples of 8)."""
    c_in = _divisible(32 * width)
    layers = [Conv2D(c_in, 3, padding=1, use_bias=False), BatchNormalization(), ReLU6()]
    for t, c, n, s in _MOBILENET_V2:
        c_out = _divisible(c * width)
        for i in range(n):
            layers += _inverted_residual(c_in, c_out, t, s if i == 0 else 1)
            c_in = c_out
    last = _divisible(1280 * max(1.0, width))
    return layers + [Conv2D(last, 1, use_bias=False), BatchNormalization(), ReLU6(),
                     GlobalAvgPool2D(), Dense(num_classes)]


def densenet(blocks=(6, 12, 24, 16), growth=32, num_classes=1000, imagenet=True):
    """DenseNet-BC with concatenation blocks; densenet121 is blocks (6, 12, 24, 16)."""
    ch = 2 * growth
    if imagenet:
        layers = _conv_bn(ch, 7, 2) + [MaxPool2D(3, strides=2, padding=1)]
    else:
        layers = [Conv2D(ch, 3, padding=1, use_bias=False)]
    for b, count in enumerate(blocks):
        for _ in range(count):
            new = [BatchNormalization(), ReLU(), Conv2D(4 * growth, 1, use_bias=False),
                   BatchNormalization(), ReLU(), Conv2D(growth, 3, padding=1, use_bias=False)]
            layers.append(Concat([], new))
            ch += growth
        if b < len(blocks) - 1:
            ch //= 2
            layers += [BatchNormalization(), ReLU(), Conv2D(ch, 1, use_bias=False),
                       AvgPool2D(2)]
    return layers + [BatchNormalization(), ReLU(), GlobalAvgPool2D(), Dense(num_classes)]


def gpt_mini(num_classes=256, width=128, depth=4, heads=4, dropout=0.0,
             activation="gelu_tanh"):
    """nanoGPT's "baby GPT" for a CPU: token and learned position embeddings, ``depth``
    pre-LN decoder blocks (causal self-attention, a 4x feed-forward), a last layer norm,
    the output projection tied to the token embedding. ``num_classes`` is the vocabulary
    (256: bytes); the context is the input length (default 64). GPT-2's tanh GELU by
    default: NumPy has no erf, and the exact one costs tens of array passes."""
    emb = Embedding(num_classes, width)
    blocks = [TransformerDecoderBlock(heads, 4 * width, dropout=dropout, activation=activation)
              for _ in range(depth)]
    return [emb, PositionalEmbedding(), Dropout(dropout), *blocks, LayerNormalization(),
            TiedDense(emb)]


def vit_tiny(num_classes=10, patch=7, width=64, depth=4, heads=4, dropout=0.0):
    """A small vision transformer for 1x28x28 images: 7x7 patches (16 tokens) through a
    Dense patch embedding, a class token, learned positions, ``depth`` pre-LN encoder blocks
    (GELU, 2x feed-forward), a layer norm, the class token's output to Dense(classes)."""
    blocks = [TransformerEncoderBlock(heads, 2 * width, dropout=dropout, activation="gelu")
              for _ in range(depth)]
    return [Patchify(patch), Dense(width), ClassToken(), PositionalEmbedding(),
            Dropout(dropout), *blocks, LayerNormalization(), SequencePool("cls"),
            Dense(num_classes)]


def encoder_classifier(num_classes=2, vocab=256, width=64, depth=2, heads=4, dropout=0.0):
    """A small transformer classifier of byte sequences padded with 0: the embedding,
    positions and ``depth`` encoder blocks under a ``PaddingMask`` (attention and the mean
    pooling skip the padding), then Dense(classes)."""
    blocks = [TransformerEncoderBlock(heads, 2 * width, dropout=dropout, activation="gelu")
              for _ in range(depth)]
    return [PaddingMask([Embedding(vocab, width, padding_idx=0), PositionalEmbedding(),
                         Dropout(dropout), *blocks, LayerNormalization(),
                         SequencePool("mean")]),
            Dense(num_classes)]


_DEFAULT_INPUT = {"mnist": (1, 28, 28), "cifar": (3, 32, 32), "imagenet": (3, 224, 224),
                  "text": (64,)}


def _spec(builder: Callable, input_kind: str, classes: int = 10, **fixed):
    return builder, input_kind, classes, fixed


MODELS: dict[str, tuple] = {
    "simplemlp": _spec(simplemlp, "mnist"),
    "simplecnn": _spec(simplecnn, "mnist"),
    "simplecnn_pydtnn": _spec(simplecnn_pydtnn, "mnist"),
    "lenet": _spec(lenet, "mnist"),
    "alexnet_cifar": _spec(alexnet_cifar, "cifar"),
    "alexnet": _spec(alexnet_cifar, "cifar"),
    "alexnet_cifar10": _spec(alexnet_cifar10, "cifar"),
    "alexnet_imagenet": _spec(alexnet_imagenet, "imagenet", 1000),
    "resnet9": _spec(resnet9, "cifar"),
    "densenet121": _spec(densenet, "imagenet", 1000, blocks=(6, 12, 24, 16)),
    "mobilenet_v2": _spec(mobilenet_v2, "cifar"),
    "mobilenet_v2_x0_5": _spec(mobilenet_v2, "cifar", width=0.5),
    "mobilenet_v2_x0_25": _spec(mobilenet_v2, "cifar", width=0.25),
    "gpt_mini": _spec(gpt_mini, "text", 256),
    "vit_tiny": _spec(vit_tiny, "mnist"),
    "encoder_classifier": _spec(encoder_classifier, "text", 2),
}
for _d in (11, 13, 16, 19):
    MODELS[f"vgg{_d}"] = _spec(vgg, "cifar", depth=_d)
    MODELS[f"vgg{_d}bn"] = _spec(vgg, "cifar", depth=_d, batch_norm=True)
    MODELS[f"vgg{_d}_imagenet"] = _spec(vgg, "imagenet", 1000, depth=_d, imagenet=True)
    MODELS[f"vgg{_d}bn_imagenet"] = _spec(vgg, "imagenet", 1000, depth=_d, batch_norm=True,
                                           imagenet=True)
for _d in (20, 32, 44, 56, 110):
    MODELS[f"resnet{_d}"] = _spec(resnet, "cifar", depth=_d, imagenet=False)
for _d in (18, 34, 50, 101, 152):
    MODELS[f"resnet{_d}"] = _spec(resnet, "imagenet", 1000, depth=_d, imagenet=True)


# Names with a CIFAR-sized and an ImageNet-sized net: images of at least IMAGENET_SIDE
# pixels a side get the ImageNet one (PyDTNN's alexnet, vgg16 are its ImageNet nets).
IMAGENET_SIDE = 112
BY_INPUT_SIZE = {"alexnet": "alexnet_imagenet",
                 **{f"vgg{d}{bn}": f"vgg{d}{bn}_imagenet" for d in (11, 13, 16, 19)
                    for bn in ("", "bn")}}


def zoo_name(name: str, input_shape=None) -> str:
    """The zoo key ``name`` builds for samples of ``input_shape``: ``alexnet`` and
    ``vggN[bn]`` are the ImageNet nets (``*_imagenet``) for images of at least
    ``IMAGENET_SIDE`` pixels a side, the CIFAR nets below."""
    key = re.sub(r"[-\s]", "_", name.lower())
    if (key in BY_INPUT_SIZE and input_shape is not None and len(input_shape) == 3
            and min(input_shape[1:]) >= IMAGENET_SIDE):
        return BY_INPUT_SIZE[key]
    return key


def get_model(name: str, input_shape=None, num_classes: int | None = None, *,
              dtype=np.float32, rng: np.random.Generator | int | None = 0,
              build: bool = True) -> Sequential:
    """Build a zoo model by name.

    Args:
        name: a key of ``MODELS`` (e.g. "simplecnn", "vgg11bn", "resnet20", "gpt_mini").
        input_shape: per-sample (C, H, W), or (T,) token ids for the text models (64 by
            default; gpt_mini's context); default: the model's usual input. For
            ``alexnet`` and ``vggN[bn]`` an ImageNet-sized shape picks the ImageNet net
            (``zoo_name``).
        num_classes: outputs of the last layer; default 10 (1000 for ImageNet models;
            gpt_mini: its vocabulary, 256).
        dtype, rng: passed to ``Sequential.build``.
        build: build at once (default) or return the unbuilt model.
    """
    key = zoo_name(name, input_shape)
    if key not in MODELS:
        raise ValueError(f"model={name!r} is not in the zoo; choose one of {sorted(MODELS)}")
    builder, kind, classes, fixed = MODELS[key]
    layers = builder(num_classes=num_classes or classes, **fixed)
    model = Sequential(layers, dtype=dtype, name=key)
    if build:
        model.build(tuple(input_shape or _DEFAULT_INPUT[kind]), rng=rng, dtype=dtype)
    return model
