"""The zoo's transformers: gpt_mini, vit_tiny and encoder_classifier build with the
parameter count of their architecture, give the documented output shapes, and a few Adam
steps on a small real input (this repository's own text, Fashion-MNIST images) bring
their training loss down."""
import math
from pathlib import Path

import numpy as np
import pytest

from distnn.models import get_model
from distnn.nn import Embedding, PaddingMask, TiedDense, TransformerDecoderBlock
from distnn.nn.losses import CategoricalCrossEntropy
from distnn.optim import Adam

ROOT = Path(__file__).resolve().parents[2]
FASHION = "/usr/share/datasets/fashion-mnist"


def block_params(e, ff):
    return 4 * e * e + 4 * e + 4 * e + 2 * e * ff + ff + e


def train(model, x, labels, steps, lr):
    """Adam steps on one batch; the losses before each step. Logits of any rank: the
    cross-entropy is over the last axis (every token of a sequence is a prediction)."""
    loss_fn = CategoricalCrossEntropy()
    opt = Adam(model, lr=lr)
    losses = []
    for _ in range(steps):
        y = model.forward(x, training=True)
        loss, dy = loss_fn(y.reshape(-1, y.shape[-1]), labels.reshape(-1))
        model.backward(dy.reshape(y.shape))
        opt.step()
        losses.append(loss)
    return losses


def text_bytes(*paths):
    return np.frombuffer(b"".join((ROOT / p).read_bytes() for p in paths), np.uint8)


def test_gpt_mini_architecture_and_shape():
    model = get_model("gpt_mini", rng=0)
    assert model.input_shape == (64,) and model.output_shape == (64, 256)
    e = 128
    assert model.parameters_flat().size == (256 * e + 64 * e + 4 * block_params(e, 4 * e)
                                            + 2 * e)
    blocks = [l for l in model.layers if isinstance(l, TransformerDecoderBlock)]
    assert len(blocks) == 4 and all(b.attn.num_heads == 4 and b.attn.causal for b in blocks)
    emb, head = model.layers[0], model.layers[-1]
    assert isinstance(emb, Embedding) and isinstance(head, TiedDense) and head.embedding is emb
    x = np.random.default_rng(0).integers(0, 256, (2, 64))
    assert model.forward(x).shape == (2, 64, 256)
    small = get_model("gpt_mini", input_shape=(16,), num_classes=65, rng=0)
    assert small.output_shape == (16, 65)
    assert small.layers[1].params["w"].shape == (16, e)  # the context is the input length


def test_gpt_mini_learns_this_repository_text():
    data = text_bytes("docs/design.md")
    t, n = 32, 8
    starts = np.random.default_rng(1).integers(0, data.size - t - 1, n)
    x = np.stack([data[s:s + t] for s in starts]).astype(np.float32)
    targets = np.stack([data[s + 1:s + t + 1] for s in starts]).astype(np.int64)
    model = get_model("gpt_mini", input_shape=(t,), rng=0)
    losses = train(model, x, targets, steps=8, lr=3e-3)
    # N(0, 0.02) embeddings: the first logits are near 0, the loss near log(vocab)
    assert abs(losses[0] - math.log(256)) < 0.1
    assert losses[-1] < losses[0] - 1.0, losses


def test_gpt_mini_dropout_option():
    from distnn.models import gpt_mini
    from distnn.nn import Sequential
    model = Sequential(gpt_mini(dropout=0.1), input_shape=(8,), rng=0)
    assert all(b.dropout == 0.1 for b in model.layers if isinstance(b, TransformerDecoderBlock))
    x = np.random.default_rng(0).integers(0, 256, (2, 8))
    assert not np.allclose(model.forward(x, training=True), model.forward(x))


@pytest.mark.skipif(not Path(FASHION).is_dir(), reason="Fashion-MNIST not found")
def test_vit_tiny_learns_fashion_mnist_images():
    from distnn.data import load_dataset
    train_split = load_dataset("fashion_mnist", path=FASHION, download=False).train
    x = (train_split.x[:32].astype(np.float32) / 255.0).reshape(32, 1, 28, 28)
    y = np.asarray(train_split.y[:32])
    model = get_model("vit_tiny", rng=0)
    assert model.input_shape == (1, 28, 28) and model.output_shape == (10,)
    e, tokens = 64, 16 + 1
    assert model.parameters_flat().size == (49 * e + e + e + tokens * e
                                            + 4 * block_params(e, 2 * e) + 2 * e + e * 10 + 10)
    losses = train(model, x, y, steps=8, lr=2e-3)
    assert losses[-1] < 0.7 * losses[0], losses


def test_encoder_classifier_learns_prose_from_code_with_padding():
    t = 64
    rows, labels = [], []
    for label, path in enumerate(("docs/design.md", "src/distnn/nn/core.py")):
        lines = [ln for ln in (ROOT / path).read_bytes().splitlines() if len(ln.strip()) > 8]
        for ln in lines[:12]:
            ids = np.frombuffer(ln[:t], np.uint8)
            rows.append(np.pad(ids, (0, t - ids.size)))  # 0 is the padding byte
            labels.append(label)
    x, y = np.stack(rows).astype(np.float32), np.array(labels)
    assert np.any(x == 0)  # some lines are padded
    model = get_model("encoder_classifier", rng=0)
    assert model.input_shape == (64,) and model.output_shape == (2,)
    assert isinstance(model.layers[0], PaddingMask) and model.layers[0].padding_idx == 0
    losses = train(model, x, y, steps=10, lr=5e-4)
    assert losses[-1] < 0.5 * losses[0], losses
