"""--lr_schedule cosine --warmup_steps N (training/callbacks.py CosineDecay): the rate of
every step of a real fit, against torch's CosineAnnealingLR after the linear warm-up; how
the options choose the one callback that owns the rate's factor."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.data import ArrayDataset, Preprocess
from distnn.nn import Dense, Sequential
from distnn.optim import SGD
from distnn.run import ConfigError, build_config
from distnn.run.callbacks import build_callbacks, build_optimizer
from distnn.training import Callback, Trainer
from distnn.training.callbacks import CosineDecay, WarmUp

torch = pytest.importorskip("torch")


class Rates(Callback):
    def __init__(self):
        self.seen = []

    def on_batch_end(self, trainer, step, logs):
        self.seen.append(trainer.optimizer.lr)


def test_a_fit_warms_up_then_follows_torchs_cosine():
    rng = np.random.default_rng(0)
    ds = ArrayDataset(rng.normal(size=(24, 3)), rng.integers(0, 2, 24), 2,
                      preprocess=Preprocess(dtype=np.float64, normalize=False))
    model = Sequential([Dense(2)], input_shape=(3,), dtype=np.float64, rng=0)
    rates = Rates()
    trainer = Trainer(model, SGD(model, lr=0.4), progress=False, verbose=False,
                      callbacks=[CosineDecay(warmup_steps=3, min_factor=0.1), rates])
    trainer.fit(ds, epochs=3, global_batch_size=6)  # 4 steps an epoch, 12 in all
    assert rates.seen[:3] == pytest.approx([0.4 / 3, 0.8 / 3, 0.4])
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.4)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=9, eta_min=0.04)
    cosine = []
    for _ in range(9):
        cosine.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert rates.seen[3:] == pytest.approx(cosine, rel=1e-12)
    assert trainer.lr == 0.4  # the scheduled rate itself is left alone


def test_past_the_end_the_rate_stays_at_its_floor():
    c = CosineDecay(warmup_steps=0, min_factor=0.25, total_steps=4)
    assert [c.factor(s) for s in (0, 2, 4, 9)] == pytest.approx([1.0, 0.625, 0.25, 0.25])


def test_the_options_choose_the_callback_and_reach_the_optimizer():
    cfg = build_config("train", {"lr_schedule": "cosine", "warmup_steps": 5,
                                 "min_lr_ratio": 0.1, "clip_grad_norm": 1.5})
    first = build_callbacks(cfg, 1)[0]
    assert isinstance(first, CosineDecay)
    assert (first.warmup_steps, first.min_factor) == (5, 0.1)
    model = Sequential([Dense(2)], input_shape=(3,))
    assert build_optimizer(cfg, model, 1).clip_grad_norm == 1.5
    warm = build_callbacks(build_config("train", {"warmup_steps": 4}), 1)
    assert [type(cb) for cb in warm] == [WarmUp] and warm[0].batches == 4
    assert build_callbacks(build_config("train", {}), 1) == []
    with pytest.raises(ConfigError, match=r"--lr_schedulers warm_up and --lr_schedule cosine"):
        build_config("train", {"lr_schedule": "cosine", "lr_schedulers": ("warm_up",)})
