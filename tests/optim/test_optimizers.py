"""Optimizers: trajectories against torch.optim, lr changes, state_dict round trips, errors,
dtype and allocation behaviour of the update functions."""
import tracemalloc

import numpy as np
import pytest

from distnn.optim import (OPTIMIZERS, SGD, Adadelta, Adam, AdamW, Nadam, RMSprop,
                          get_optimizer)
from distnn.optim import functional as F

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 3))
Y = RNG.standard_normal((8, 4))
W0 = RNG.standard_normal((3, 4))
B0 = RNG.standard_normal(4)

# (distnn class, kwargs, torch class name, torch kwargs)
CASES = {
    "sgd": (SGD, dict(lr=0.1), "SGD", dict(lr=0.1)),
    "sgd_momentum": (SGD, dict(lr=0.1, momentum=0.9), "SGD", dict(lr=0.1, momentum=0.9)),
    "sgd_dampening": (SGD, dict(lr=0.1, momentum=0.9, dampening=0.3), "SGD",
                      dict(lr=0.1, momentum=0.9, dampening=0.3)),
    "sgd_nesterov": (SGD, dict(lr=0.1, momentum=0.9, nesterov=True), "SGD",
                     dict(lr=0.1, momentum=0.9, nesterov=True)),
    "sgd_weight_decay": (SGD, dict(lr=0.1, weight_decay=0.05), "SGD",
                         dict(lr=0.1, weight_decay=0.05)),
    "sgd_nesterov_wd": (SGD, dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05),
                        "SGD", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05)),
    "sgd_dampening_wd": (SGD, dict(lr=0.1, momentum=0.8, dampening=0.5, weight_decay=0.05),
                         "SGD", dict(lr=0.1, momentum=0.8, dampening=0.5, weight_decay=0.05)),
    "adam": (Adam, dict(lr=0.05), "Adam", dict(lr=0.05)),
    "adam_amsgrad": (Adam, dict(lr=0.05, amsgrad=True, betas=(0.8, 0.99)), "Adam",
                     dict(lr=0.05, amsgrad=True, betas=(0.8, 0.99))),
    "adam_wd": (Adam, dict(lr=0.05, weight_decay=0.1), "Adam", dict(lr=0.05, weight_decay=0.1)),
    "adam_wd_amsgrad": (Adam, dict(lr=0.05, weight_decay=0.1, amsgrad=True), "Adam",
                        dict(lr=0.05, weight_decay=0.1, amsgrad=True)),
    "adamw": (AdamW, dict(lr=0.05), "AdamW", dict(lr=0.05)),
    "adamw_wd_amsgrad": (AdamW, dict(lr=0.05, weight_decay=0.2, amsgrad=True), "AdamW",
                         dict(lr=0.05, weight_decay=0.2, amsgrad=True)),
    "rmsprop": (RMSprop, dict(lr=0.01), "RMSprop", dict(lr=0.01)),
    "rmsprop_momentum": (RMSprop, dict(lr=0.01, momentum=0.9), "RMSprop",
                         dict(lr=0.01, momentum=0.9)),
    "rmsprop_centered": (RMSprop, dict(lr=0.01, centered=True, alpha=0.9), "RMSprop",
                         dict(lr=0.01, centered=True, alpha=0.9)),
    "rmsprop_all": (RMSprop, dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1),
                    "RMSprop", dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1)),
    "nadam": (Nadam, dict(lr=0.02), "NAdam", dict(lr=0.02)),
    "nadam_wd": (Nadam, dict(lr=0.02, weight_decay=0.1, momentum_decay=0.01), "NAdam",
                 dict(lr=0.02, weight_decay=0.1, momentum_decay=0.01)),
    "nadam_decoupled": (Nadam, dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True),
                        "NAdam", dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True)),
    "adadelta": (Adadelta, dict(), "Adadelta", dict()),
    "adadelta_wd": (Adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.1), "Adadelta",
                    dict(lr=0.5, rho=0.8, weight_decay=0.1)),
}


def grads(w, b):
    """Gradients of 0.5 * mean over samples of ||x w + b - y||^2 (a small regression)."""
    r = X.astype(w.dtype) @ w + b - Y.astype(w.dtype)
    return X.astype(w.dtype).T @ r / len(X), r.sum(axis=0) / len(X)


class FlatModel:
    """What an optimizer sees of a built Sequential: one flat parameter and gradient buffer."""

    def __init__(self, dtype):
        self.p = np.concatenate([W0.ravel(), B0]).astype(dtype)
        self.g = np.zeros_like(self.p)
        self.w, self.b = self.p[:12].reshape(3, 4), self.p[12:]
        self.dw, self.db = self.g[:12].reshape(3, 4), self.g[12:]

    def parameters_flat(self):
        return self.p

    def gradients_flat(self):
        return self.g


def run_distnn(cls, kwargs, steps, dtype, lrs=None, flat=False):
    if flat:
        model = FlatModel(dtype)
        w, b, dw, db = model.w, model.b, model.dw, model.db
        opt = cls(model, **kwargs)
    else:
        w, b = W0.astype(dtype), B0.astype(dtype)
        dw, db = np.zeros_like(w), np.zeros_like(b)
        opt = cls([(w, dw), (b, db)], **kwargs)
    out = []
    for t in range(steps):
        if lrs is not None:
            opt.lr = lrs[t]
        dw[...], db[...] = grads(w, b)
        opt.step()
        out.append(np.concatenate([w.ravel(), b]).copy())
    assert opt.iterations == steps
    return np.array(out)


def run_torch(name, kwargs, steps, dtype, lrs=None):
    torch = pytest.importorskip("torch")
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(tdtype)  # torch keeps scalar state (NAdam's mu_product) in it
    try:
        w = torch.tensor(W0.astype(dtype), requires_grad=True)
        b = torch.tensor(B0.astype(dtype), requires_grad=True)
        opt = getattr(torch.optim, name)([w, b], **kwargs)
        out = []
        for t in range(steps):
            if lrs is not None:
                opt.param_groups[0]["lr"] = lrs[t]
            gw, gb = grads(w.detach().numpy(), b.detach().numpy())
            w.grad, b.grad = torch.from_numpy(gw), torch.from_numpy(gb)
            opt.step()
            out.append(np.concatenate([w.detach().numpy().ravel(), b.detach().numpy()]))
    finally:
        torch.set_default_dtype(old)
    return np.array(out)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_trajectory_matches_torch(case, dtype):
    cls, kw, tname, tkw = CASES[case]
    ours = run_distnn(cls, kw, 20, dtype)
    ref = run_torch(tname, tkw, 20, dtype)
    assert ours.dtype == dtype
    tol = 1e-10 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)
    assert np.abs(ours[-1] - ours[0]).max() > 1e-3  # the parameters did move


@pytest.mark.parametrize("case", ["sgd_nesterov_wd", "adam_wd_amsgrad", "rmsprop_all",
                                  "nadam_wd", "adadelta_wd", "adamw"])
def test_flat_buffer_model_matches_torch(case):
    cls, kw, tname, tkw = CASES[case]
    ours = run_distnn(cls, kw, 20, np.float64, flat=True)
    np.testing.assert_allclose(ours, run_torch(tname, tkw, 20, np.float64),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "nadam", "rmsprop_momentum"])
def test_changing_lr_between_steps_matches_torch(case):
    cls, kw, tname, tkw = CASES[case]
    base = kw.get("lr", 1.0)
    lrs = [base * f for f in [1.0] * 5 + [0.5] * 5 + [0.1] * 5 + [2.0] * 5]
    ours = run_distnn(cls, kw, 20, np.float64, lrs=lrs)
    np.testing.assert_allclose(ours, run_torch(tname, tkw, 20, np.float64, lrs=lrs),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trip_resumes_exactly(case):
    cls, kw, _, _ = CASES[case]
    w, b = W0.copy(), B0.copy()
    dw, db = np.zeros_like(w), np.zeros_like(b)
    opt = cls([(w, dw), (b, db)], **kw)
    for _ in range(10):
        dw[...], db[...] = grads(w, b)
        opt.step()
    saved, w10, b10 = opt.state_dict(), w.copy(), b.copy()
    for _ in range(10):
        dw[...], db[...] = grads(w, b)
        opt.step()
    for arrays in saved["state"]:  # the saved arrays are copies, untouched by later steps
        for a in arrays.values():
            assert not any(np.shares_memory(a, s) for s in opt.state_arrays())

    w2, b2 = w10.copy(), b10.copy()
    dw2, db2 = np.zeros_like(w2), np.zeros_like(b2)
    fresh = cls([(w2, dw2), (b2, db2)])  # default hyper-parameters: load restores them
    fresh.load_state_dict(saved)
    assert fresh.iterations == 10 and fresh.lr == opt.lr
    assert fresh.hyperparameters() == opt.hyperparameters()
    for _ in range(10):
        dw2[...], db2[...] = grads(w2, b2)
        fresh.step()
    np.testing.assert_array_equal(w2, w)
    np.testing.assert_array_equal(b2, b)
    assert fresh.iterations == 20


def test_load_state_dict_copies_into_live_buffers():
    w, g = np.ones(5), np.full(5, 0.5)
    opt = Adam([(w, g)])
    live = opt.state_arrays()
    other = Adam([(np.zeros(5), np.ones(5))])
    other.step()
    opt.load_state_dict(other.state_dict())
    assert all(a is b for a, b in zip(live, opt.state_arrays()))
    np.testing.assert_array_equal(live[0], other.state_arrays()[0])


def test_state_arrays():
    w, g = np.ones(3), np.ones(3)
    assert SGD([(w, g)]).state_arrays() == []
    assert len(SGD([(w, g)], momentum=0.9).state_arrays()) == 1
    assert len(Adam([(w, g)], amsgrad=True).state_arrays()) == 3
    assert len(RMSprop([(w, g)], momentum=0.9, centered=True).state_arrays()) == 3
    opt = Adam([(w, g), (np.ones(2), np.ones(2))])
    assert [a.shape for a in opt.state_arrays()] == [(3,), (3,), (2,), (2,)]


def test_nadam_mu_product_follows_iterations():
    w, g = np.ones(3), np.ones(3)
    opt = Nadam([(w, g)])
    for _ in range(5):
        opt.step()
    product = opt.mu_product
    other = Nadam([(np.ones(3), np.ones(3))])
    other.iterations = 5  # as a broadcast of the step count from another rank does
    assert other.mu_product == product


def test_load_state_dict_errors():
    opt = Adam([(np.ones(4), np.ones(4))])
    good = Adam([(np.ones(5), np.ones(5))]).state_dict()
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg'\] has shape \(5,\), "
                                         r"expected \(4,\)"):
        opt.load_state_dict(good)
    with pytest.raises(ValueError, match="'sgd', this one is 'adam'"):
        opt.load_state_dict(SGD([(np.ones(4), np.ones(4))]).state_dict())
    with pytest.raises(ValueError, match="holds state for 2 parameter arrays"):
        opt.load_state_dict(Adam([(np.ones(4), np.ones(4))] * 2).state_dict())
    with pytest.raises(ValueError, match="lacks"):
        opt.load_state_dict({"optimizer": "adam"})
    assert opt.iterations == 0  # nothing was changed by the failed loads


@pytest.mark.parametrize("make, match", [
    (lambda p: SGD(p, lr=-0.1), r"SGD: lr must be a finite number >= 0, got -0.1"),
    (lambda p: SGD(p, momentum=-1), r"momentum must be a finite number >= 0, got -1"),
    (lambda p: SGD(p, nesterov=True), r"nesterov=True needs momentum > 0"),
    (lambda p: SGD(p, momentum=0.9, nesterov=True, dampening=0.1), r"dampening == 0"),
    (lambda p: Adam(p, betas=(0.9, 1.0)), r"betas\[1\] must be a finite number in \[0, 1\), "
                                          r"got 1.0"),
    (lambda p: Adam(p, eps=0), r"eps must be a finite number > 0, got 0"),
    (lambda p: RMSprop(p, alpha=1.5), r"alpha must be a finite number in \[0, 1\]"),
    (lambda p: Adadelta(p, weight_decay=-1), r"weight_decay must be"),
    (lambda p: Nadam(p, momentum_decay=float("nan")), r"momentum_decay"),
    (lambda p: Adam(p, amsgrad=1), r"amsgrad must be True or False"),
    (lambda p: SGD([(np.ones(3), np.ones(4))]), r"gradient has shape \(4,\)"),
    (lambda p: SGD([]), r"params is empty"),
    (lambda p: SGD([(np.ones(3, int), np.ones(3, int))]), r"float32 or float64"),
])
def test_hyperparameter_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make([(np.ones(3), np.ones(3))])


def test_lr_setter_and_fixed_hyperparameters():
    opt = SGD([(np.ones(3), np.ones(3))], momentum=0.9)
    opt.lr = np.float32(0.5)
    assert opt.lr == 0.5 and type(opt.lr) is float
    with pytest.raises(ValueError, match="lr must be"):
        opt.lr = -1
    with pytest.raises(AttributeError, match="fixed at construction"):
        opt.momentum = 0.5
    assert opt.momentum == 0.9
    assert "momentum=0.9" in repr(opt)


def test_registry():
    assert set(OPTIMIZERS) == {"sgd", "rmsprop", "adam", "adamw", "nadam", "adadelta"}
    opt = get_optimizer("Adam", [(np.ones(3), np.ones(3))], lr=0.1, amsgrad=True)
    assert isinstance(opt, Adam) and opt.lr == 0.1 and opt.amsgrad
    assert AdamW([(np.ones(3), np.ones(3))]).weight_decay == 1e-2
    with pytest.raises(ValueError, match=r"'adagrad' is unknown; valid choices: adadelta, adam"):
        get_optimizer("adagrad", [(np.ones(3), np.ones(3))])
    with pytest.raises(ValueError, match=r"unknown hyper-parameters \['beta1'\]"):
        get_optimizer("adam", [(np.ones(3), np.ones(3))], beta1=0.9)


def test_grads_are_not_written():
    w, g = np.ones(4), np.linspace(-1, 1, 4)
    before = g.copy()
    for name, cls in OPTIMIZERS.items():
        kw = {"sgd": dict(momentum=0.9, nesterov=True, weight_decay=0.1)}.get(
            name, dict(weight_decay=0.1))
        opt = cls([(w, g)], **kw)
        opt.step()
        opt.step()
    np.testing.assert_array_equal(g, before)


ALLOC_CASES = {
    "sgd": (SGD, {}),
    "sgd_nesterov_wd": (SGD, dict(momentum=0.9, nesterov=True, weight_decay=1e-4)),
    "sgd_dampening_wd": (SGD, dict(momentum=0.9, dampening=0.1, weight_decay=1e-4)),
    "adam_wd_amsgrad": (Adam, dict(weight_decay=1e-4, amsgrad=True)),
    "adamw": (AdamW, {}),
    "rmsprop_all": (RMSprop, dict(momentum=0.9, centered=True, weight_decay=1e-4)),
    "nadam_wd": (Nadam, dict(weight_decay=1e-4)),
    "adadelta_wd": (Adadelta, dict(weight_decay=1e-4)),
}


@pytest.mark.parametrize("case", sorted(ALLOC_CASES))
def test_float32_stays_float32_without_per_step_allocation(case):
    cls, kw = ALLOC_CASES[case]
    n = 1 << 18  # 1 MiB of float32
    rng = np.random.default_rng(1)
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    opt = cls([(p, g)], **kw)
    opt.step()  # the first step allocates the scratch arrays
    tracemalloc.start()
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n  # well below one float32 temporary of the parameter size (4 n bytes)
    assert p.dtype == np.float32 and all(a.dtype == np.float32 for a in opt.state_arrays())
    assert np.isfinite(p).all()


def test_functional_without_scratch_and_scratch_count():
    p, g = np.ones(4), np.full(4, 0.5)
    m, v = np.zeros(4), np.zeros(4)
    F.adam_update_(p, g, m, v, step=1, lr=0.1)
    np.testing.assert_allclose(p, 0.9)  # the first Adam step moves by lr * sign(g)
    with pytest.raises(ValueError, match="step must be >= 1"):
        F.adam_update_(p, g, m, v, step=0, lr=0.1)
    assert F.scratch_count("rmsprop", weight_decay=0.1) == 2
    with pytest.raises(ValueError, match="unknown"):
        F.scratch_count("lamb")


@pytest.mark.parametrize("case", ["sgd_nesterov_wd", "adam_wd_amsgrad", "rmsprop_all",
                                  "nadam_wd", "adadelta_wd", "adamw"])
def test_long_buffers_update_in_pieces_to_the_same_numbers(case):
    """A flat buffer of a few million parameters is updated in one piece per kernel thread
    (kernels.pieces): 2 threads give exactly what 1 thread gives."""
    from distnn import kernels
    cls, kw, _, _ = CASES[case]
    rng = np.random.default_rng(1)
    n = 3 * (1 << 20) + 5  # uneven pieces
    assert n >= 1 << 20  # kernels.pieces splits from there
    start = rng.standard_normal(n).astype(np.float32)
    grads_ = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    previous = kernels.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            model = FlatModel(np.float32)
            model.p, model.g = start.copy(), np.zeros(n, np.float32)
            p, g = model.p, model.g
            opt = cls(model, **kw)
            for gi in grads_:
                g[...] = gi
                opt.step()
            results.append(p)
    finally:
        kernels.set_num_threads(previous)
    assert np.abs(results[0] - start).max() > 1e-4
    np.testing.assert_array_equal(results[0], results[1])


def test_the_learning_rate_is_the_scheduled_rate_times_the_warm_up_scale():
    p, g = np.ones(3), np.full(3, 2.0)
    opt = SGD([(p, g)], lr=0.4)
    assert (opt.lr, opt.scheduled_lr, opt.lr_scale) == (0.4, 0.4, 1.0)
    opt.lr_scale = 0.25
    assert opt.lr == 0.4 * 0.25 and opt.scheduled_lr == 0.4
    opt.step()  # the step uses lr = scheduled * scale
    np.testing.assert_array_equal(p, 1.0 - 0.4 * 0.25 * 2.0)
    opt.lr = 0.2  # sets the scheduled rate; the warm-up's factor stays
    assert opt.scheduled_lr == 0.2 and opt.lr == 0.2 * 0.25
    state = opt.state_dict()
    assert state["lr"] == 0.2  # a checkpoint keeps the scheduled rate, not the scaled one
    fresh = SGD([(np.ones(3), np.zeros(3))], lr=1.0)
    fresh.load_state_dict(state)
    assert (fresh.lr, fresh.scheduled_lr, fresh.lr_scale) == (0.2, 0.2, 1.0)
    with pytest.raises(ValueError, match="lr_scale must be a finite number >= 0"):
        opt.lr_scale = -1
