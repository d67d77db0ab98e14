"""``distnn generate`` through the real command, on a gpt_mini trained by ``distnn train``
for a few steps on a small corpus with ``--tokenizer char`` (so the command re-derives the
tokenizer from the dataset options): N tokens come out, past the model's positions too;
greedy decoding with the key/value cache (``--temperature 0``, ``--top_k 1``) equals the
argmax of the whole forward, token by token; a seed repeats a sample; a prompt longer
than the positions or with a character outside the vocabulary is one line, exit 2; and
``distnn evaluate`` reports the perplexity of the text."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import run_distnn

CONTEXT = 16
TEXT = ("A fortune is a short saying. Every cook praises his own broth. The early bird "
        "catches the worm, and the second mouse gets the cheese. ") * 60


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(folder, corpus, weights) of a gpt_mini trained 3 steps, char tokens, context 16."""
    d = tmp_path_factory.mktemp("gen")
    corpus = d / "corpus.txt"
    corpus.write_text(TEXT)
    weights = d / "w.npz"
    p = run_distnn("train", "--model", "gpt_mini", "--dataset", "text", "--dataset_path",
                   corpus, "--tokenizer", "char", "--context", CONTEXT, "--batch_size", 8,
                   "--steps_per_epoch", 3, "--num_epochs", 1, "--evaluate", "false",
                   "--save_weights", weights, cwd=d, timeout=900)
    assert p.returncode == 0, p.stderr
    return d, corpus, weights


def _generate(trained, *args):
    d, corpus, weights = trained
    return run_distnn("generate", "--weights", weights, "--tokenizer", "char",
                      "--dataset_path", corpus, *args, cwd=d, timeout=600)


def test_generates_the_tokens_asked_past_the_positions(trained):
    p = _generate(trained, "--prompt", "The ", "--max_tokens", 40, "--top_k", 5)
    assert p.returncode == 0, p.stderr
    out = p.stdout[:-1]  # the command ends the text with a newline
    assert out.startswith("The ") and len(out) == 4 + 40  # char tokens: one per character
    assert set(out) <= set(TEXT)
    assert "40 tokens in" in p.stderr and f"{CONTEXT} positions" in p.stderr


def test_greedy_with_the_cache_is_the_argmax_of_the_whole_forward(trained):
    from distnn.cli.generate import load_language_model
    from distnn.data.text import CharTokenizer, split_text
    d, corpus, weights = trained
    prompt, n = "The early ", 6
    greedy = _generate(trained, "--prompt", prompt, "--max_tokens", n, "--temperature", 0)
    top1 = _generate(trained, "--prompt", prompt, "--max_tokens", n, "--top_k", 1,
                     "--seed", 5)
    assert greedy.returncode == 0 and top1.returncode == 0, greedy.stderr + top1.stderr
    assert greedy.stdout == top1.stdout
    model, positions = load_language_model("gpt_mini", str(weights))
    assert positions == CONTEXT
    tok = CharTokenizer(split_text(TEXT)[0])
    ids = list(tok.encode(prompt))
    for _ in range(n):
        h = np.asarray([ids])  # the whole sequence, no cache (shorter than the built T)
        for layer in model.layers:
            h = layer.forward(h, training=False)
        ids.append(int(np.argmax(h[0, -1])))
    assert greedy.stdout == tok.decode(ids) + "\n"


def test_a_seed_repeats_a_sample(trained):
    a, b = (_generate(trained, "--prompt", "A", "--max_tokens", 12, "--seed", 3)
            for _ in range(2))
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout) == 1 + 12 + 1


@pytest.mark.parametrize("prompt,message", [
    ("e" * (CONTEXT + 1), f"--prompt: {CONTEXT + 1} tokens, but the model has {CONTEXT} "
                          "positions"),
    ("caf\u00e9", "holds the character '\u00e9'"),
])
def test_a_prompt_the_model_cannot_take_is_one_line(trained, prompt, message):
    p = _generate(trained, "--prompt", prompt, "--max_tokens", 3)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distnn generate: error: ")
    assert message in lines[0]


def test_weights_of_another_model_are_refused(tmp_path):
    w = tmp_path / "cnn.npz"
    np.savez(w, **{"conv2d_0/w": np.zeros((4, 1, 3, 3))})
    p = run_distnn("generate", "--weights", w, cwd=tmp_path)
    assert p.returncode == 2
    assert "no token and position embeddings" in p.stderr


def test_evaluate_reports_perplexity(trained):
    d, corpus, weights = trained
    p = run_distnn("evaluate", "--model", "gpt_mini", "--dataset", "text", "--dataset_path",
                   corpus, "--tokenizer", "char", "--context", CONTEXT, "--weights", weights,
                   cwd=d, timeout=600)
    assert p.returncode == 0, p.stderr
    line = next(s for s in p.stdout.splitlines() if s.startswith("Test:"))
    fields = dict(f.split("=") for f in line.split() if "=" in f)
    assert np.isclose(float(fields["perplexity"]), np.exp(float(fields["loss"])), rtol=1e-3)
