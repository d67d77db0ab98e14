"""Sharded training state (``--shard``, ``distnn.distributed.ShardedOptimizer``): stages 1,
2 and 3 make the updates of dense ``data`` (float64, 20 steps, uneven slices and shards, a
rank with no samples in the last batch), each rank holds only its slice, and a sharded
checkpoint resumes exactly, on the same and on another number of ranks. One MPI job per
rank count (progs/sharded_prog.py) checks every case."""
from __future__ import annotations

import json

import numpy as np
import pytest

import sharded_prog as prog
from helpers import MPIEXEC, have_mpi4py, needs_mpi, run_distnn
from mpijobs import mpirun
from distnn.distributed import LocalComm, ShardedOptimizer
from distnn.optim import Adam

TOL = 1e-12  # float64; the sums over 2 or 3 ranks may round in another order
SIZE = 107   # the prog's model: not divisible by 2 or 3


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def sharded(request):
    if MPIEXEC is None or not have_mpi4py():
        pytest.skip("needs mpiexec and mpi4py")
    proc = mpirun(request.param, "sharded_prog.py", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def dense(out, opt):
    return np.array(out["cases"][f"{opt}/0/{out['size']}"]["w"])


def close(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


@pytest.mark.mpi
def test_every_stage_gives_the_weights_of_dense_data(sharded):
    n = sharded["size"]
    cases = sharded["cases"]
    stages = {(k.split("/")[0], int(k.split("/")[1]), int(k.split("/")[2])) for k in cases}
    for opt in ("sgd_momentum", "adam"):  # every stage, on n and n - 1 ranks
        assert {(opt, s, n) for s in (0, 1, 2, 3)} <= stages
        assert {(opt, s, n - 1) for s in (1, 2, 3)} <= stages
    for opt in prog.OPTIMIZERS:  # every optimizer, stage 3
        assert (opt, 3, n) in stages
    for key, case in cases.items():
        opt, stage, _ = key.split("/")
        ref = dense(sharded, opt)
        assert case["ranks_agree"], key
        assert close(case["w"], ref) < TOL, (key, close(case["w"], ref))
        start = prog.model("residual" if opt.endswith("_residual") else "mlp")
        assert not np.allclose(ref, start.parameters_flat()), "nothing trained"


@pytest.mark.mpi
def test_units_of_several_layers_give_the_same_weights_in_fewer_collectives(sharded):
    for key, case in sharded["bucketed"].items():
        opt, stage = key.split("/")
        assert close(case["w"], dense(sharded, opt)) < TOL, key
        # 20 steps: 3 layers -> 2 units, so 2 collectives a step for 3 at stage 2 (the
        # reduce-scatters) and 6 for 9 at stage 3 (+ a gather before forward and backward,
        # but the last unit's stays from its forward to its backward)
        per_step = (2, 3) if stage == "2" else (5, 8)
        assert (case["calls"], case["calls_per_layer"]) == (20 * per_step[0],
                                                            20 * per_step[1]), key


@pytest.mark.mpi
def test_clipping_takes_the_norm_over_every_slice(sharded):
    held = sharded["cases"][f"adam_clip/3/{sharded['size']}"]["held"]
    norms = [h["grad_norm"] for h in held]
    assert norms[0] > 0.05 and all(n == norms[0] for n in norms)  # clipped; one norm


@pytest.mark.mpi
def test_each_rank_holds_its_slice_only(sharded):
    n = sharded["size"]
    slices = [len(a) for a in np.array_split(np.arange(SIZE), n)]  # uneven
    for opt, moments in (("sgd_momentum", 1), ("adam", 2)):
        for stage in (1, 2, 3):
            held = sharded["cases"][f"{opt}/{stage}/{n}"]["held"]
            for r, h in enumerate(held):
                assert h["slice"] == slices[r]
                assert h["optimizer"] == moments * 8 * slices[r], (opt, stage, r, h)
                assert h["grads_flat"] == (SIZE if stage == 1 else 0)  # no whole gradient
                assert h["grads"] == 8 * (SIZE if stage == 1 else slices[r])
                assert h["params_flat"] == (SIZE if stage < 3 else 0)  # no whole model
                assert h["params"] == 8 * (SIZE if stage < 3 else slices[r])
                assert h["calls"] > 0


@pytest.mark.mpi
def test_a_model_built_sliced_allocates_its_slice_only_and_trains_as_dense(sharded):
    """build_sliced: each rank allocates only its slice of the parameters (from rank 0's
    initial weights, though the other ranks' generators draw others) and stage 3 trains
    it to dense data's weights, on the world and on a sub-communicator."""
    n = sharded["size"]
    sliced = sharded["sliced"]
    for opt in ("adam", "sgd_momentum", "adam_residual"):
        ref = dense(sharded, opt)
        for ranks in (n, n - 1):
            case = sliced[f"{opt}/{ranks}"]
            assert close(case["w"], ref) < TOL, (opt, ranks, close(case["w"], ref))
            total = ref.size
            cut = [len(a) for a in np.array_split(np.arange(total), ranks)]
            for r, h in enumerate(case["held"]):
                assert h["slice"] == cut[r]
                assert h["params_flat"] == 0 and h["grads_flat"] == 0  # no whole buffer
                assert h["placeholders"], (opt, ranks, r)  # no layer holds its own values
                assert h["params"] == 8 * cut[r] and h["grads"] == 8 * cut[r], h
    assert close(sliced["adam/resumed"]["w"], dense(sharded, "adam")) < TOL


@pytest.mark.mpi
def test_a_sharded_checkpoint_resumes_exactly_on_any_number_of_ranks(sharded):
    n = sharded["size"]
    resumed = sharded["resume"]
    for opt in ("sgd_momentum", "adam"):
        ref = dense(sharded, opt)
        for stage in (1, 2, 3):
            for move in (f"{n}->{n}", f"{n - 1}->{n}", f"{n}->{n - 1}"):
                w = resumed[f"{opt}/{stage}/{move}"]
                assert close(w, ref) < TOL, (opt, stage, move, close(w, ref))
    files = sharded["files"]  # one main file and one shard file per rank that wrote it
    assert f"adam3_world.shard{n - 1}of{n}.step10.npz" in files
    assert sum(f.startswith("adam3_world.") for f in files) == 1 + n
    assert sum(f.startswith("adam3_small.") for f in files) == 1 + (n - 1)


def test_one_process_stage_3_equals_dense():
    ref = prog.train(LocalComm(), "adam", 0, epochs=1)
    assert close(prog.train(LocalComm(), "adam", 3, epochs=1), ref) < TOL


def test_python_api_by_name_and_own_loop_equals_dense():
    """torch's ZeroRedundancyOptimizer(params, optimizer_class, **defaults) form, in a loop
    of the user's own (one process: every slice is the whole buffer)."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(8, 2, 3)), rng.integers(0, 3, size=8)
    from distnn.nn.losses import CategoricalCrossEntropy
    loss = CategoricalCrossEntropy()
    weights = []
    for make in (lambda m: Adam(m, lr=1e-2),
                 lambda m: ShardedOptimizer("adam", m, stage=3, comm=LocalComm(),
                                            defaults={"lr": 1e-2})):
        m = prog.model()
        opt = make(m)
        if isinstance(opt, ShardedOptimizer):
            opt.shard()
            assert m.parameters_flat().size == 0
        for _ in range(3):
            _, dy = loss(m.forward(x, training=True), y, denom=8)
            m.backward(dy)
            opt.step()
        if isinstance(opt, ShardedOptimizer):
            opt.unshard()
        weights.append(m.parameters_flat().copy())
    assert close(weights[1], weights[0]) < TOL


def test_python_api_refuses_what_does_not_apply():
    model = prog.model()
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3.*got 4"):
        ShardedOptimizer(Adam(model), model, stage=4, comm=LocalComm())
    with pytest.raises(ValueError, match="compression 'fp16' applies to stage 1"):
        ShardedOptimizer(Adam(model), model, stage=2, compression="fp16", comm=LocalComm())
    with pytest.raises(ValueError, match="optimizer 'lion' is not a distnn optimizer"):
        ShardedOptimizer("lion", model, stage=1, comm=LocalComm())


TINY = "from distnn.nn import Sequential, Dense, Flatten\n\n" \
       "def build_model():\n    return Sequential([Flatten(), Dense(1, use_bias=False)])\n"
CLI = ["train", "--model", "tiny.py", "--dataset", "synthetic", "--input_shape", "1,1,2",
       "--num_classes", "1", "--num_samples", "12", "--batch_size", "2", "--num_epochs", "1",
       "--validation_split", "0", "--quiet"]


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("extra, message", [
    (["--shard", "1"], "--shard 1: ShardedOptimizer: the model has 2 parameters, fewer than "
                       "the 3 ranks"),
    (["--shard", "2", "--parallel", "localsgd"], "--shard 2 shards the training state of "
                                                 "--parallel data; --parallel localsgd"),
    (["--shard", "4"], "argument --shard: must be an integer in [0, 3], got '4'"),
])
def test_bad_shard_options_fail_before_any_step(tmp_path, extra, message):
    (tmp_path / "tiny.py").write_text(TINY)
    proc = run_distnn(*CLI, *extra, cwd=tmp_path, ranks=3, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert lines and all(message in line for line in lines), proc.stderr
    assert "Epoch" not in proc.stdout + proc.stderr


def test_a_dense_checkpoint_resumes_sharded_and_a_sharded_one_asks_for_shard(tmp_path):
    from distnn.training.checkpoint import CheckpointError
    dense_ck, sharded_ck = str(tmp_path / "dense.npz"), str(tmp_path / "sharded.npz")
    whole = prog.train(LocalComm(), "adam", 0)
    prog.train(LocalComm(), "adam", 0, epochs=1, checkpoint=dense_ck)
    assert close(prog.train(LocalComm(), "adam", 3, resume=dense_ck), whole) < TOL
    prog.train(LocalComm(), "adam", 2, epochs=1, checkpoint=sharded_ck)
    assert close(prog.train(LocalComm(), "adam", 1, resume=sharded_ck), whole) < TOL
    with pytest.raises(CheckpointError, match="holds sharded training state .stage 2 on 1 "
                                              "ranks.; resume it with --shard"):
        prog.train(LocalComm(), "adam", 0, resume=sharded_ck)


RUN = {"model": "simplemlp", "dataset": "synthetic", "num_samples": 40, "batch_size": 8,
       "num_epochs": 1, "dtype": "float64", "validation_split": 0.0, "quiet": True}


def test_the_run_builds_a_shard_3_model_sliced_and_trains_it_as_dense():
    """``build_run`` (what ``distnn train`` runs) with ``--shard 3`` builds the zoo model
    holding its slice only (no whole buffer even before the first step), and its run ends
    with dense data's weights."""
    from distnn.run import build_config, build_run
    weights, start = [], np.empty(0)
    for shard in (0, 3):
        run = build_run(build_config("train", {**RUN, "shard": shard}), LocalComm())
        model = run.model
        if shard:
            assert model.param_slice is not None and model.param_slice.total == start.size
            assert model.parameters_flat().size == 0 and model.gradients_flat().size == 0
        else:
            start = model.parameters_flat().copy()
        run.fit()
        weights.append(model.parameters_flat().copy())
    assert close(weights[1], weights[0]) < TOL and not np.allclose(weights[0], start)


@needs_mpi
@pytest.mark.mpi
def test_distnn_train_shard_3_on_3_ranks_ends_with_dense_weights(tmp_path):
    args = [f"--{k}={v}" for k, v in RUN.items() if k != "quiet"] + ["--quiet"]
    saved = []
    for shard in (0, 3):
        out = tmp_path / f"w{shard}.npz"
        proc = run_distnn("train", *args, "--shard", shard, "--save_weights", out,
                          cwd=tmp_path, ranks=3, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with np.load(out) as f:
            saved.append({k: f[k] for k in f.files})
    assert saved[0].keys() == saved[1].keys() and saved[0]
    for k in saved[0]:
        assert close(saved[1][k], saved[0][k]) < TOL, k
