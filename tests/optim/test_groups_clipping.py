"""AdamW's parameter groups (optim/groups.py: no decay on biases, norms, embeddings),
clipping by the global gradient norm (torch's clip_grad_norm_), and both under the data
rule on 2 and 3 ranks: every rank's weights equal, and equal to one process's with the
same global batch (float64), the clipping applied to the all-reduced gradient."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import child_env, launcher, needs_mpi

from distnn.nn import BatchNormalization, Dense, ReLU, Sequential
from distnn.nn.base import Layer
from distnn.optim import SGD, AdamW
from distnn.optim.groups import clip_grad_norm_, decay_ranges, decays

PROG = Path(__file__).parent / "progs" / "clip_prog.py"
torch = pytest.importorskip("torch")


class Embedding(Layer):
    """Stands for the embedding family (the rule goes by the class name)."""

    def _build(self, input_shape, rng):
        self.add_param("w", (10, 4), "glorot_uniform", rng, fan_in=10, fan_out=4)
        return input_shape


def model():
    return Sequential([Embedding(), Dense(6), BatchNormalization(), ReLU(), Dense(3)],
                      input_shape=(5,), dtype=np.float64, rng=3)


def test_the_rule_decays_matrices_only():
    m = model()
    groups = AdamW(m).param_groups
    assert groups[0]["params"] == ["dense_0/w", "dense_1/w"]
    assert groups[1]["params"] == ["embedding_0/w", "dense_0/b", "batchnormalization_0/gamma",
                                   "batchnormalization_0/beta", "dense_1/b"]
    flat = m.parameters_flat()
    covered = np.zeros(flat.size, bool)
    for a, b in decay_ranges(m):
        covered[a:b] = True
    flat[:] = 0
    m.layers[1].params["w"][...] = 1
    m.layers[4].params["w"][...] = 1
    np.testing.assert_array_equal(covered, flat == 1)
    assert not decays(m.layers[0], "w", m.layers[0].params["w"])


@pytest.mark.parametrize("clip", [None, 0.3])
def test_adamw_groups_and_clipping_match_torch(clip):
    m = model()
    tm = [torch.tensor(p.copy(), requires_grad=True) for p in
          (layer.params[k] for layer in m.walk() for k in layer.params)]
    names = [f"{layer.name}/{k}" for layer in m.walk() for k in layer.params]
    decay = set(AdamW(m).param_groups[0]["params"])
    opt = AdamW(m, lr=0.01, weight_decay=0.3)
    opt.clip_grad_norm = clip
    ref = torch.optim.AdamW([{"params": [t for t, n in zip(tm, names) if n in decay]},
                             {"params": [t for t, n in zip(tm, names) if n not in decay],
                              "weight_decay": 0.0}], lr=0.01, weight_decay=0.3)
    rng = np.random.default_rng(4)
    for _ in range(3):
        g = rng.normal(size=m.gradients_flat().size)
        m.gradients_flat()[:] = g
        opt.step()
        offset = 0
        for t in tm:
            t.grad = torch.tensor(g[offset:offset + t.numel()].reshape(t.shape))
            offset += t.numel()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(tm, clip)
            assert opt.grad_norm == pytest.approx(norm.item(), rel=1e-12)
        ref.step()
    np.testing.assert_allclose(m.parameters_flat(),
                               np.concatenate([t.detach().numpy().ravel() for t in tm]),
                               rtol=1e-12, atol=1e-14)


def test_decay_none_is_torchs_adamw_over_everything():
    m = model()
    opt = AdamW(m, lr=0.1, weight_decay=0.5, decay=None)
    before = m.parameters_flat().copy()
    m.gradients_flat()[:] = 0  # Adam's step is 0 then: only the decay acts
    opt.step()
    np.testing.assert_allclose(m.parameters_flat(), before * (1 - 0.1 * 0.5), rtol=1e-15)


def test_clip_grad_norm_is_torchs():
    rng = np.random.default_rng(5)
    grads = [rng.normal(size=(3, 4)), rng.normal(size=7)]
    ref = [torch.tensor(g) for g in grads]
    params = [torch.zeros_like(r, requires_grad=True) for r in ref]
    for p, r in zip(params, ref):
        p.grad = r.clone()
    norm = clip_grad_norm_(grads, 0.5)
    assert norm == pytest.approx(torch.nn.utils.clip_grad_norm_(params, 0.5).item(), rel=1e-12)
    for g, p in zip(grads, params):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-12)
    small = [np.full(3, 0.1)]
    assert clip_grad_norm_(small, 1.0) == pytest.approx(np.sqrt(0.03))
    np.testing.assert_array_equal(small[0], 0.1)


def test_clip_grad_norm_is_checked():
    opt = SGD([(np.zeros(2), np.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match=r"clip_grad_norm must be a finite number > 0, got -1"):
        opt.clip_grad_norm = -1


@pytest.fixture(scope="module")
def one_rank():
    sys.path.insert(0, str(PROG.parent))
    from clip_prog import result

    from distnn.distributed import LocalComm
    return result(LocalComm())


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_clips_the_same_sum_as_one_process(tmp_path, one_rank, ranks):
    proc = subprocess.run([*launcher(ranks), sys.executable, str(PROG), str(tmp_path)],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(DISTNN_KERNELS="numpy"))
    assert proc.returncode == 0, proc.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    assert one_rank["grad_norm"] > 0.05  # the clipping acted at the last step
    for r in results:
        np.testing.assert_array_equal(r["weights"], results[0]["weights"])
        np.testing.assert_allclose(r["weights"], one_rank["weights"], rtol=1e-10, atol=1e-12)
        assert r["grad_norm"] == pytest.approx(one_rank["grad_norm"], rel=1e-10)
        assert r["steps"] == one_rank["steps"] == 8 and r["lr"] == one_rank["lr"]
        for key, value in one_rank["eval"].items():
            assert r["eval"][key] == pytest.approx(value, rel=1e-12), key
