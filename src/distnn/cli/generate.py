"""``distnn generate --weights W --prompt TEXT``: text sampled from a language model
trained by ``distnn train --model gpt_mini --dataset text`` (one process).

The model is rebuilt from the weights file: its context (the positions it was trained
with) and vocabulary are the shapes of its position and token embeddings, so neither
needs repeating. The tokenizer is not stored with the weights; it is re-derived from the
same dataset options the training used: ``--tokenizer bytes`` (the default) needs none,
``char`` and ``bpe`` learn the training split of ``--dataset_path`` again (the same
corpus, split and ``--vocab_size`` give the same tokenizer; a BPE comes from the cache).

Sampling walks the model once over the prompt and then one position per token with each
decoder block's key/value cache (``MultiHeadAttention.decode``): ``--temperature 0`` (or
``--top_k 1``) is greedy, the argmax of the whole forward's last logits; otherwise the
logits are divided by the temperature, all but the ``--top_k`` largest dropped, and a
token drawn with ``--seed``'s generator. When the text reaches the model's positions,
the caches are rebuilt from its last half (learned positions cannot go further).
A prompt longer than the positions, a character outside the vocabulary, a weights file
that is not a language model's: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ..run import RunError
from .options import at_least

__all__ = ["add_generate_parser", "run_generate", "generate"]

_COUNT = at_least(int, 0)


def add_generate_parser(sub) -> argparse.ArgumentParser:
    """Add the ``generate`` subcommand to the ``distnn`` subparsers."""
    text = "sample text from a trained language model (gpt_mini) with a key/value cache"
    p = sub.add_parser("generate", help=text, allow_abbrev=False,
                       description=text[0].upper() + text[1:] + "; see docs/transformers.md.")
    p.add_argument("--weights_and_bias_filename", "--weights", required=True, metavar="FILE",
                   help="Weights (.npz) written by distnn train --save_weights.")
    p.add_argument("--model", default="gpt_mini", metavar="NAME",
                   help="The zoo language model the weights are of. Default: gpt_mini.")
    p.add_argument("--prompt", default="\n", help="Text to continue. Default: a newline.")
    p.add_argument("--max_tokens", "--max-tokens", type=_COUNT, default=200, metavar="N",
                   help="Tokens to generate. Default: 200.")
    p.add_argument("--temperature", type=at_least(float, 0), default=1.0, metavar="T",
                   help="Divide the logits by T before sampling; 0: greedy. Default: 1.")
    p.add_argument("--top_k", "--top-k", type=_COUNT, default=0, metavar="K",
                   help="Sample among the K most likely tokens only; 0: all. Default: 0.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the sampling. Default: 0.")
    p.add_argument("--tokenizer", choices=("bytes", "char", "bpe"), default="bytes",
                   help="The training's --tokenizer. Default: bytes.")
    p.add_argument("--dataset_path", "--dataset-path", default=None, metavar="FILE|DIR",
                   help="The training's --dataset_path (char and bpe learn its training "
                   "split again). Default: the default corpus.")
    p.add_argument("--vocab_size", "--vocab-size", type=_COUNT, default=None, metavar="N",
                   help="The training's --vocab_size, if it gave one.")
    return p


# -- the model, its positions and the decoding loop ------------------------------------
def _shapes(path: str) -> tuple[int, int]:
    """(positions, vocabulary) from the weights file's embeddings."""
    try:
        with np.load(path) as z:
            shapes = {k: z[k].shape for k in z.files}
    except (OSError, ValueError) as exc:
        raise RunError(f"--weights {path}: cannot read it as an .npz weights file ({exc})") \
            from None
    pos = [s for k, s in shapes.items() if "positionalembedding" in k and len(s) == 2]
    emb = [s for k, s in shapes.items() if k.split("/")[0].startswith("embedding")
           and len(s) == 2]
    if not pos or not emb:
        raise RunError(f"--weights {path}: no token and position embeddings in it; "
                       "generate needs the weights of a language model (distnn train "
                       "--model gpt_mini --dataset text --save_weights FILE)")
    return pos[0][0], emb[0][0]


def load_language_model(name: str, path: str):
    """The zoo model ``name`` with the weights of ``path``, built for their positions."""
    from ..models import get_model
    positions, vocab = _shapes(path)
    try:
        model = get_model(name, input_shape=(positions,), num_classes=vocab)
        model.load_weights(path)
    except (ValueError, OSError, KeyError) as exc:
        raise RunError(f"--weights {path}: {exc}") from None
    return model, positions


class _Decoder:
    """The model run position by position: blocks with ``decode`` use their caches,
    learned positions are added at the running offset, other layers run as in inference."""

    def __init__(self, model):
        from ..nn.attention import KVCache
        from ..nn.embedding import PositionalEmbedding
        self.layers = model.layers
        self._cache_type = KVCache
        self._positions = PositionalEmbedding
        self.reset()

    def reset(self) -> None:
        self.caches = {i: self._cache_type() for i, layer in enumerate(self.layers)
                       if hasattr(layer, "decode")}
        self.length = 0

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Logits (vocab,) of the last of the new tokens ``ids`` (t,) after those seen."""
        h = ids[None, :]
        for i, layer in enumerate(self.layers):
            if i in self.caches:
                h = layer.decode(h, self.caches[i])
            elif isinstance(layer, self._positions):
                h = h + layer.params["w"][self.length:self.length + h.shape[1]]
            else:
                h = layer.forward(h, training=False)
        self.length += len(ids)
        return h[0, -1]


def _pick(logits: np.ndarray, temperature: float, top_k: int, rng) -> int:
    if temperature == 0 or top_k == 1:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.size:
        cut = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= cut, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(z.size, p=p))


def generate(model, ids: np.ndarray, max_tokens: int, *, positions: int,
             temperature: float = 1.0, top_k: int = 0, seed: int = 0) -> np.ndarray:
    """``max_tokens`` ids that continue ``ids`` (1 <= len <= positions), sampled as the
    module doc says."""
    rng = np.random.default_rng(seed)
    dec = _Decoder(model)
    text = list(int(i) for i in ids)
    logits = dec.step(np.asarray(text, np.int64))
    out = []
    for _ in range(max_tokens):
        token = _pick(logits, temperature, top_k, rng)
        out.append(token)
        text.append(token)
        if dec.length >= positions:  # no position left: restart from the last half
            dec.reset()
            logits = dec.step(np.asarray(text[-(positions // 2 or 1):], np.int64))
        else:
            logits = dec.step(np.asarray([token], np.int64))
    return np.asarray(out, np.int64)


def _tokenizer(args):
    from ..data.base import DatasetError
    from ..data.text import corpus_files, encode_splits, make_tokenizer, read_corpus, split_text
    try:
        if args.tokenizer == "bytes":
            return make_tokenizer("bytes", "", args.vocab_size)
        blocks = split_text(read_corpus(corpus_files(args.dataset_path)))
        return encode_splits(blocks, args.tokenizer, args.vocab_size)[0]
    except DatasetError as exc:
        raise RunError(str(exc)) from None


def run_generate(args: argparse.Namespace) -> int:
    """``distnn generate``: prints the prompt and its continuation, then one line of
    figures on stderr."""
    from ..data.base import DatasetError
    model, positions = load_language_model(args.model, args.weights_and_bias_filename)
    tok = _tokenizer(args)
    if tok.vocab_size != model.layers[0].vocab_size:
        raise RunError(f"--tokenizer {args.tokenizer}: its vocabulary has {tok.vocab_size} "
                       f"tokens but the weights' has {model.layers[0].vocab_size}; give the "
                       "training's --tokenizer, --dataset_path and --vocab_size")
    try:
        ids = tok.encode(args.prompt, "prompt")
    except DatasetError as exc:
        raise RunError(f"--prompt: {exc}") from None
    if not 1 <= len(ids) <= positions:
        raise RunError(f"--prompt: {len(ids)} tokens, but the model has {positions} positions "
                       f"(its training --context); give a prompt of 1 to {positions} tokens")
    t0 = time.perf_counter()
    new = generate(model, ids, args.max_tokens, positions=positions,
                   temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    seconds = time.perf_counter() - t0
    sys.stdout.write(args.prompt + tok.decode(new) + "\n")
    sys.stdout.flush()
    rate = f"{len(new) / seconds:,.0f} tokens/s" if seconds > 0 else "- tokens/s"
    sys.stderr.write(f"distnn generate: {len(new)} tokens in {seconds:.2f} s ({rate}; "
                     f"prompt {len(ids)} tokens, {positions} positions)\n")
    return 0
