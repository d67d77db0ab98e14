"""Text for language models: a corpus of UTF-8 files, its tokenizers (bytes, characters,
byte-level BPE) and windows of ``context`` tokens (``TextDataset``, ``read_text``).

The corpus is one string: a file's text, or the texts of a folder's files concatenated in
sorted order of their paths (every file under the folder, recursively; a glob pattern
such as ``DIR/**/*.py`` picks some). It is cut into contiguous blocks by characters, the
first 90 % for training, the next 5 % for validation, the last 5 % for test
(``SPLIT``); a tokenizer that learns (char, bpe) learns from the training block only.
Each block's tokens ``t`` give the windows ``x = t[i*C:(i+1)*C]``, ``y = t[i*C+1:(i+1)*C+1]``
for ``i < (len(t) - 1) // C``: back-to-back, not overlapping, the trailing tokens dropped.
Every rank reads the whole corpus (a few MB) and takes its share of each global batch as
every in-memory dataset does (``data.base``).

Default corpus: Debian's ``fortunes`` package (``/usr/share/games/fortunes``, the text
files that have a ``.dat`` index; ``apt-get install fortunes``; ``scripts/setup.sh``
installs it). It is English prose of tiny-Shakespeare's scale (1.4 MB), the same bytes on
every machine of one Debian release, read in milliseconds by every rank. The Python
standard library's source, the other corpus every machine has, changes with the Python
version and is twenty times larger; pass it as ``--dataset_path /usr/lib/python3.11``
(or a pattern of it) when code is wanted.
"""
from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from . import fetch
from .base import Dataset, DatasetError, Preprocess, Splits, _check_int, epoch_ids

DEFAULT_CORPUS = Path("/usr/share/games/fortunes")
SPLIT = (0.90, 0.05, 0.05)
SPLIT_NAMES = ("training", "validation", "test")


def corpus_files(path: str | Path | None) -> list[Path]:
    """The files of the corpus ``path`` names (a file, a folder, a glob pattern; None: the
    default corpus), in the order their texts are concatenated."""
    if path is None:
        if not DEFAULT_CORPUS.is_dir():
            raise DatasetError(f"text: the default corpus {DEFAULT_CORPUS} is not installed; "
                               "run `apt-get install fortunes` (scripts/setup.sh does), or pass "
                               "--dataset_path FILE|DIR")
        return sorted(p for p in DEFAULT_CORPUS.iterdir()
                      if p.is_file() and not p.is_symlink() and p.with_suffix(".dat").is_file()
                      and p.suffix != ".dat")
    text = str(path)
    if any(c in text for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not files:
            raise DatasetError(f"text: --dataset_path {text}: the pattern matches no file; "
                               "check it")
        return files
    p = Path(text).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        if not files:
            raise DatasetError(f"text: --dataset_path {p}: the folder holds no file; give a "
                               "folder of text files")
        return files
    raise DatasetError(f"text: --dataset_path {p}: no such file or folder; give a text file, "
                       "a folder of them or a glob pattern")


def read_corpus(files: Sequence[Path]) -> str:
    """The concatenated texts of ``files``; a file that is not UTF-8 or a corpus without
    text is a DatasetError naming the file."""
    parts = []
    for f in files:
        raw = f.read_bytes()
        try:
            parts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DatasetError(f"text: {f} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                               f"offset {exc.start}); convert it to UTF-8, or leave it out of "
                               "--dataset_path (a pattern such as DIR/**/*.txt)") from None
    text = "".join(parts)
    if not text:
        where = files[0] if len(files) == 1 else f"the {len(files)} files of the corpus"
        raise DatasetError(f"text: {where} holds no text (empty); give a file with some")
    return text


def split_text(text: str, split: Sequence[float] = SPLIT) -> tuple[str, str, str]:
    """(training, validation, test) contiguous blocks of ``text`` by characters: the cuts
    are at ``int(len(text) * split[0])`` and ``int(len(text) * (split[0] + split[1]))``."""
    n = len(text)
    a = int(n * split[0])
    b = int(n * (split[0] + split[1]))
    return text[:a], text[a:b], text[b:]


class ByteTokenizer:
    """UTF-8 bytes as tokens: id = byte value, ``vocab_size`` 256 (a smaller one refuses
    text with bytes at or above it, e.g. 128 for ASCII)."""

    name = "bytes"

    def __init__(self, vocab_size: int = 256):
        self.vocab_size = _check_int("vocab_size", vocab_size, 1, 257)

    def encode(self, text: str, where: str = "text") -> np.ndarray:
        ids = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
        if self.vocab_size < 256 and ids.size and int(ids.max()) >= self.vocab_size:
            at = int(np.argmax(ids >= self.vocab_size))
            raise DatasetError(f"text: the {where} holds byte {int(ids[at])} (byte offset {at}), "
                               f"outside the vocabulary of {self.vocab_size} byte values; drop "
                               "--vocab_size (256) or use --tokenizer char or bpe")
        return ids

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, np.uint8)).decode("utf-8", errors="replace")


class CharTokenizer:
    """The characters of the training text as tokens, ids in sorted order of code point;
    ``vocab_size`` (if given) pads the vocabulary to that size. A character the training
    text lacks is outside the vocabulary (an error naming it)."""

    name = "char"

    def __init__(self, train_text: str, vocab_size: int | None = None):
        chars = sorted(set(train_text))
        if vocab_size is not None and vocab_size < len(chars):
            raise DatasetError(f"text: --vocab_size {vocab_size} is smaller than the {len(chars)} "
                               "characters of the training text (--tokenizer char); drop it "
                               f"or give at least {len(chars)}")
        self.chars = chars
        self.vocab_size = len(chars) if vocab_size is None else int(vocab_size)
        # id of each code point up to the largest one seen, -1 for those not seen
        self._table = np.full(max(map(ord, chars), default=0) + 2, -1, np.int64)
        self._table[[ord(c) for c in chars]] = np.arange(len(chars))

    def encode(self, text: str, where: str = "text") -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        table = self._table
        ids = table[np.minimum(codes, len(table) - 1)]
        if ids.size and ids.min() < 0:
            at = int(np.argmax(ids < 0))
            raise DatasetError(f"text: the {where} holds the character {text[at]!r} (character "
                               f"{at}) that the training text lacks, outside the vocabulary of "
                               "--tokenizer char; use --tokenizer bytes or bpe, or more "
                               "training text")
        return ids.astype(np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids if int(i) < len(self.chars))


class BPETokenizer:
    """Byte-level BPE (GPT-2's kind) learned from the training text with Hugging Face
    ``tokenizers`` (the optional extra ``distnn[text]``): every text encodes, no token is
    outside the vocabulary. ``vocab_size``: at least 256 (the byte alphabet); the merges
    learned may stop below it on a small text (``vocab_size`` is then the count learned)."""

    name = "bpe"

    def __init__(self, train_text: str, vocab_size: int | None = None, *,
                 learned: str | None = None):
        tokenizers = _tokenizers()
        size = 1024 if vocab_size is None else int(vocab_size)
        if size < 256:
            raise DatasetError(f"text: --vocab_size {size} is below the 256 byte values of "
                               "--tokenizer bpe; give 256 or more")
        if learned is not None:  # what to_json() wrote
            tok = tokenizers.Tokenizer.from_str(learned)
        else:
            from tokenizers import decoders, models, pre_tokenizers, trainers
            tok = tokenizers.Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            tok.train_from_iterator([train_text], trainer=trainer)
        self._tok = tok
        self.vocab_size = tok.get_vocab_size()

    def to_json(self) -> str:
        """The learned tokenizer as the library's JSON (``learned=`` reads it back)."""
        return self._tok.to_str()

    def encode(self, text: str, where: str = "text") -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, np.int32)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def _tokenizers():
    if importlib.util.find_spec("tokenizers") is None:
        raise DatasetError("text: --tokenizer bpe needs Hugging Face tokenizers, which is "
                           "not installed; pip install 'distnn[text]' (or tokenizers), or use "
                           "--tokenizer bytes or char")
    # One thread per rank, as everywhere (the ranks of a node share its cores).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import tokenizers
    return tokenizers


TOKENIZERS = {"bytes": ByteTokenizer, "char": CharTokenizer, "bpe": BPETokenizer}


def make_tokenizer(name: str, train_text: str, vocab_size: int | None = None):
    """The tokenizer ``name`` of ``TOKENIZERS`` (those that learn, learn ``train_text``)."""
    if name not in TOKENIZERS:
        raise DatasetError(f"text: tokenizer {name!r} is unknown; choose one of "
                           f"{', '.join(TOKENIZERS)}")
    if name == "bytes":
        return ByteTokenizer(256 if vocab_size is None else vocab_size)
    return TOKENIZERS[name](train_text, vocab_size)


def encode_splits(blocks: Sequence[str], tokenizer: str = "bytes",
                  vocab_size: int | None = None) -> tuple[object, list[np.ndarray]]:
    """(the tokenizer, the token ids of each block) for the (training, validation, test)
    ``blocks``; the tokenizer learns the training block. A BPE and its ids are kept in the
    cache (``~/.cache/distnn/tokenizers``, named by a hash of the blocks, the size and the
    library's version): learning and encoding the default corpus cost 6 s and 3 s of CPU
    in every rank of every run."""
    if tokenizer != "bpe":
        tok = make_tokenizer(tokenizer, blocks[0], vocab_size)
        return tok, [tok.encode(b, f"{n} split") for n, b in zip(SPLIT_NAMES, blocks)]
    import hashlib
    import io
    key = hashlib.sha1(f"{vocab_size}:{_tokenizers().__version__}".encode())
    for b in blocks:
        key.update(f":{len(b)}:".encode() + b.encode("utf-8"))
    entry = fetch.cache_root() / "tokenizers" / f"bpe-{key.hexdigest()[:20]}.npz"
    try:
        with np.load(entry) as z:
            tok = BPETokenizer("", vocab_size, learned=z["tokenizer"].tobytes().decode())
            return tok, [z[n] for n in SPLIT_NAMES]
    except Exception:  # absent (OSError) or unreadable (numpy, the library): learn again
        pass
    tok = BPETokenizer(blocks[0], vocab_size)
    ids = [tok.encode(b) for b in blocks]
    buf = io.BytesIO()
    np.savez(buf, tokenizer=np.frombuffer(tok.to_json().encode(), np.uint8),
             **dict(zip(SPLIT_NAMES, ids)))
    from .readers import _keep
    _keep(entry, buf.getvalue())
    return tok, ids


class TextDataset(Dataset):
    """Windows of ``context`` tokens over a token array: sample i is
    ``x = tokens[i*C:(i+1)*C]`` (ids as the float dtype of ``preprocess``: models cast their
    input to it anyway) with targets ``y = tokens[i*C+1:(i+1)*C+1]`` (int64).

    Args:
        tokens: int token ids (1-D), all below ``vocab_size``.
        context: C, tokens per window.
        vocab_size: the number of token ids (``num_classes``).
        tokenizer: what made the ids (``decode`` turns ids back into text), or None.
        starts: first token of each window (default: every C-th, back to back).

    Shape:
        batch.x (n, C) float; batch.y (n, C) int64.

    Example:
        ds = TextDataset(np.frombuffer(b"hello world", np.uint8), context=4, vocab_size=256)
        next(ds.batches(2, shuffle=False)).y  # [[101, 108, 108, 111], [32, 119, 111, 114]]
    """

    implied_metrics = ("perplexity",)  # what a run on it logs whatever --metrics says

    def __init__(self, tokens: np.ndarray, context: int, vocab_size: int, *, tokenizer=None,
                 starts: np.ndarray | None = None, preprocess: Preprocess | None = None):
        preprocess = preprocess or Preprocess()
        if preprocess.one_hot:
            raise DatasetError("text: the targets are token ids of shape (N, T), not one-hot "
                               "rows; use --loss_func categorical_cross_entropy and token "
                               "metrics (perplexity, accuracy), not mse/mae/bce")
        if preprocess.mean is not None or preprocess.std is not None:
            raise DatasetError("text: token ids take no mean/std standardization; drop them")
        context = _check_int("context", context, 1)
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"tokens must be a 1-D integer array, got {tokens.dtype} "
                             f"{tokens.shape}")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise DatasetError(f"text: token ids span [{int(tokens.min())}, {int(tokens.max())}], "
                               f"outside the vocabulary [0, {vocab_size}); give a larger "
                               "vocab_size")
        super().__init__((context,), vocab_size, value_range=None, preprocess=preprocess)
        self.tokens = tokens.astype(np.int32, copy=False)
        self.context = context
        self.tokenizer = tokenizer
        if starts is None:
            starts = np.arange((len(self.tokens) - 1) // context, dtype=np.int64) * context
        self.starts = np.asarray(starts, np.int64)

    @property
    def vocab_size(self) -> int:
        return self.num_classes

    def __len__(self) -> int:
        return len(self.starts)

    def _windows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = self.starts[ids][:, None] + np.arange(self.context + 1)
        w = self.tokens[at]
        return w[:, :-1], w[:, 1:].astype(np.int64)

    def _raw_batches(self, batch_size, shuffle, seed, rank, size, drop_last):
        for ids, global_size in epoch_ids(len(self), batch_size, shuffle, seed, rank, size,
                                          drop_last):
            x, y = self._windows(ids)
            yield ids, x, y, global_size

    def split_tail(self, count):
        count = _check_int("count", count, 0, len(self) + 1)
        cut = len(self) - count
        kw = dict(tokenizer=self.tokenizer, preprocess=self.preprocess)
        return (TextDataset(self.tokens, self.context, self.num_classes, starts=self.starts[:cut],
                            **kw),
                TextDataset(self.tokens, self.context, self.num_classes, starts=self.starts[cut:],
                            **kw))

    def arrays(self):
        x, y = self._windows(np.arange(len(self)))
        return self.preprocess.scale(x, None), y


def read_text(*, path=None, preprocess: Preprocess, seed: int = 0, context: int = 128,
              tokenizer: str = "bytes", vocab_size: int | None = None) -> Splits:
    """UTF-8 text as train/val/test windows of ``context`` tokens (see the module's doc).

    Args:
        path: a text file, a folder (all its files, recursively, in sorted order) or a glob
            pattern; default: Debian's fortunes (``DEFAULT_CORPUS``).
        context: tokens per window (the model's sequence length).
        tokenizer: bytes (256 ids), char (the training text's characters) or bpe (byte-level
            BPE of ``vocab_size`` learned from the training text; needs ``tokenizers``).
        vocab_size: bytes: at most 256; char: pads the vocabulary; bpe: the size to learn
            (default 1024).
    """
    files = corpus_files(path)
    tok, encoded = encode_splits(split_text(read_corpus(files)), tokenizer, vocab_size)
    where = str(files[0]) if len(files) == 1 else f"{len(files)} files"
    out = []
    for name, ids in zip(SPLIT_NAMES, encoded):
        if len(ids) - 1 < context:
            raise DatasetError(f"text: --context {context} is larger than the {name} split of "
                               f"{where} ({len(ids)} tokens, a window needs {context + 1}); "
                               "give a smaller --context or more text")
        out.append(TextDataset(ids, context, tok.vocab_size, tokenizer=tok,
                               preprocess=preprocess))
    return Splits(*out)


__all__ = ["TextDataset", "read_text", "corpus_files", "read_corpus", "split_text",
           "ByteTokenizer", "CharTokenizer", "BPETokenizer", "TOKENIZERS", "make_tokenizer",
           "encode_splits",
           "DEFAULT_CORPUS", "SPLIT"]
