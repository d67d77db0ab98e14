"""--dataset text (data/text.py): UTF-8 files as windows of tokens, split 90/5/5 by
characters, tokenized as bytes, characters or a BPE learned from the training split,
sharded like every in-memory dataset; its errors through the real command."""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import COMMAND, child_env, launcher, needs_mpi

from distnn.data import DatasetError, load_dataset
from distnn.data import text as T

MODEL = Path(__file__).with_name("bigram_model.py")
WORDS = "the quick brown fox jumps over a lazy dog and then runs away to the café".split()


def corpus(path: Path, words: int = 3000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    picked = [WORDS[i] for i in rng.integers(0, len(WORDS), words)]
    text = "".join(w + ("\n" if k % 10 == 9 else " ") for k, w in enumerate(picked))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


def blocks(text: str) -> list[str]:
    a, b = int(len(text) * 0.9), int(len(text) * 0.95)
    return [text[:a], text[a:b], text[b:]]


def test_bytes_windows_are_the_splits_tokens_shifted_by_one(tmp_path):
    text = corpus(tmp_path / "c.txt")
    s = load_dataset("text", path=tmp_path / "c.txt", context=16)
    for ds, block in zip((s.train, s.val, s.test), blocks(text)):
        raw = np.frombuffer(block.encode("utf-8"), np.uint8)
        n = (len(raw) - 1) // 16
        x, y = ds.arrays()
        assert len(ds) == n and ds.input_shape == (16,) and ds.num_classes == 256
        assert x.dtype == np.float32 and y.dtype == np.int64
        np.testing.assert_array_equal(x, raw[:n * 16].reshape(n, 16))
        np.testing.assert_array_equal(y, raw[1:n * 16 + 1].reshape(n, 16))
        assert ds.tokenizer.decode(ds.tokens) == block
    batch = next(s.train.batches(5, shuffle=False))
    np.testing.assert_array_equal(batch.y, s.train.arrays()[1][:5])


def test_char_vocabulary_is_the_training_splits_characters(tmp_path):
    text = corpus(tmp_path / "c.txt")
    s = load_dataset("text", path=tmp_path / "c.txt", context=8, tokenizer="char")
    chars = sorted(set(blocks(text)[0]))
    assert s.train.num_classes == len(chars)
    np.testing.assert_array_equal(s.val.tokens, [chars.index(c) for c in blocks(text)[1]])
    assert s.test.tokenizer.decode(s.test.tokens) == blocks(text)[2]
    padded = load_dataset("text", path=tmp_path / "c.txt", context=8, tokenizer="char",
                          vocab_size=64)
    assert padded.train.num_classes == 64
    np.testing.assert_array_equal(padded.train.tokens, s.train.tokens)


def test_a_folder_is_its_files_in_sorted_order_and_a_pattern_picks(tmp_path):
    a = corpus(tmp_path / "tree" / "b" / "two.txt", 400, seed=1)
    b = corpus(tmp_path / "tree" / "a" / "one.py", 400, seed=2)
    c = corpus(tmp_path / "tree" / "c.py", 400, seed=3)
    assert T.corpus_files(tmp_path / "tree") == [tmp_path / "tree" / p
                                                 for p in ("a/one.py", "b/two.txt", "c.py")]
    s = load_dataset("text", path=tmp_path / "tree", context=8)
    assert s.train.tokenizer.decode(s.train.tokens) == blocks(b + a + c)[0]
    only_py = load_dataset("text", path=f"{tmp_path}/tree/**/*.py", context=8)
    assert only_py.test.tokenizer.decode(only_py.test.tokens) == blocks(b + c)[2]


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_share_every_global_batch(tmp_path, size):
    corpus(tmp_path / "c.txt", 800)
    ds = load_dataset("text", path=tmp_path / "c.txt", context=8).train
    whole = list(ds.batches(10, seed=3))
    shards = [list(ds.batches(10, seed=3, rank=r, size=size)) for r in range(size)]
    assert all(len(s) == len(whole) for s in shards)
    for i, batch in enumerate(whole):
        parts = [s[i] for s in shards]
        assert [len(p) for p in parts] == [len(a) for a in np.array_split(batch.x, size)]
        np.testing.assert_array_equal(np.concatenate([p.x for p in parts]), batch.x)
        np.testing.assert_array_equal(np.concatenate([p.y for p in parts]), batch.y)


def test_bpe_is_learned_from_the_training_split_and_kept(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("HOME", str(tmp_path))  # the cache of learned BPEs
    text = corpus(tmp_path / "c.txt")
    s = load_dataset("text", path=tmp_path / "c.txt", context=8, tokenizer="bpe",
                     vocab_size=300)
    own = T.BPETokenizer(blocks(text)[0], 300)
    assert s.train.tokenizer.to_json() == own.to_json()
    assert 256 < s.train.num_classes <= 300
    np.testing.assert_array_equal(s.val.tokens, own.encode(blocks(text)[1]))
    assert s.val.tokenizer.decode(s.val.tokens) == blocks(text)[1]
    assert len(s.train.tokens) < len(blocks(text)[0].encode())  # merges were learned
    assert len(list((tmp_path / ".cache" / "distnn" / "tokenizers").iterdir())) == 1
    again = load_dataset("text", path=tmp_path / "c.txt", context=8, tokenizer="bpe",
                         vocab_size=300)
    np.testing.assert_array_equal(again.test.tokens, s.test.tokens)


def test_bpe_without_tokenizers_is_refused_by_name(tmp_path, monkeypatch):
    corpus(tmp_path / "c.txt", 200)
    find_spec = T.importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tokenizers" else find_spec(name, *a))
    with pytest.raises(DatasetError, match=r"needs Hugging Face tokenizers.*pip install"):
        load_dataset("text", path=tmp_path / "c.txt", tokenizer="bpe")


@pytest.mark.skipif(not T.DEFAULT_CORPUS.is_dir(), reason="Debian's fortunes not installed")
def test_the_default_corpus_is_debians_fortunes():
    files = T.corpus_files(None)
    assert files and all(f.parent == T.DEFAULT_CORPUS and f.with_suffix(".dat").is_file()
                         for f in files)
    text = "".join(f.read_text(encoding="utf-8") for f in files)
    s = load_dataset("text", context=256)
    np.testing.assert_array_equal(s.train.tokens,
                                  np.frombuffer(blocks(text)[0].encode(), np.uint8))
    assert len(s.test) == (len(blocks(text)[2].encode()) - 1) // 256 > 100


def test_a_missing_default_corpus_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "DEFAULT_CORPUS", tmp_path / "fortunes")
    with pytest.raises(DatasetError, match=r"fortunes is not installed; run `apt-get install "
                                           r"fortunes`.*or pass --dataset_path"):
        load_dataset("text")


def distnn(*args, cwd, ranks=1):
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd,
                          env=child_env(DISTNN_KERNELS="numpy"))


def test_train_prints_perplexity_and_evaluate_reports_it(tmp_path):
    corpus(tmp_path / "c.txt", 2000)
    common = ["--model", MODEL, "--dataset", "text", "--dataset_path", tmp_path / "c.txt",
              "--context", 16, "--batch_size", 32]
    train = distnn("train", *common, "--num_epochs", 1, "--optimizer", "adam",
                   "--learning_rate", 0.05, "--save_weights", "w.npz", cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    assert re.search(r"loss=[\d.]+ accuracy=[\d.]+ perplexity=[\d.]+ val_loss", train.stderr)
    evaluate = distnn("evaluate", *common, "--weights_and_bias_filename", "w.npz",
                      cwd=tmp_path)
    assert evaluate.returncode == 0, evaluate.stderr
    found = re.search(r"loss=([\d.]+) accuracy=[\d.]+ perplexity=([\d.]+)", evaluate.stdout)
    assert found, evaluate.stdout
    loss, ppl = map(float, found.groups())
    assert ppl < 256 and math.isclose(ppl, math.exp(loss), rel_tol=1e-3)


BAD = {
    "not_utf8": ("latin1.txt", "café".encode("latin-1") * 50, [],
                 r"latin1\.txt is not UTF-8 text \(byte 0xe9 at offset 3\); convert it"),
    "empty": ("empty.txt", b"", [], r"empty\.txt holds no text \(empty\)"),
    "context": ("c.txt", None, ["--context", 1000],
                r"--context 1000 is larger than the validation split of .*c\.txt \(\d+ tokens"),
    "byte_outside_vocab": ("c.txt", None, ["--vocab_size", 128],
                           r"holds byte 195 .*outside the vocabulary of 128 byte values"),
    "char_outside_vocab": ("c.txt", "abc" * 400 + "xyz", ["--tokenizer", "char", "--context", 4],
                           r"test split holds the character 'x' .*outside the vocabulary"),
    "model_vocab": ("c.txt", None, ["--model_args", "vocab=64"],
                    r"scores 64 tokens per position but the data's vocabulary .* has 256"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_text_is_one_line_exit_2(tmp_path, case):
    name, content, extra, message = BAD[case]
    if content is None:
        corpus(tmp_path / name, 2000)
    else:
        (tmp_path / name).write_bytes(content.encode() if isinstance(content, str) else content)
    proc = distnn("train", "--model", MODEL, "--dataset", "text", "--dataset_path",
                  tmp_path / name, "--context", 8, *extra, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), proc.stderr


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_bad_text_fails_every_rank(tmp_path, ranks):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    proc = distnn("train", "--model", MODEL, "--dataset", "text", "--dataset_path",
                  tmp_path / "latin1.txt", cwd=tmp_path, ranks=ranks)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("is not UTF-8 text") == 1, proc.stderr
