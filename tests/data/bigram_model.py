"""A bigram language model as a ``--model`` file for the text tests: (N, T) token ids ->
(N, T, V) next-token logits, a table row per id. The layers of a transformer are tested
where they are built; this one is the smallest model whose output is (N, T, vocab)."""
import numpy as np

from distnn.nn import Sequential
from distnn.nn.base import Layer


class Bigram(Layer):
    """logits[n, t] = w[ids[n, t]]; ``w`` is (V, V), zeros at first."""

    def __init__(self, vocab: int, name=None):
        super().__init__(name)
        self.vocab = int(vocab)

    def _build(self, input_shape, rng):
        self.add_param("w", (self.vocab, self.vocab), "zeros", rng, fan_in=self.vocab,
                       fan_out=self.vocab)
        return (*input_shape, self.vocab)

    def forward(self, x, training=False):
        self._ids = x.astype(np.intp)
        return self.params["w"][self._ids]

    def backward(self, dy):
        g = self.grads["w"]
        g[...] = 0
        np.add.at(g, self._ids.reshape(-1), dy.reshape(-1, self.vocab))
        return None


def build_model(input_shape, num_classes, vocab=None):
    """A bigram model over ``vocab`` tokens (default: the data's, ``num_classes``)."""
    return Sequential([Bigram(num_classes if vocab is None else vocab)])
