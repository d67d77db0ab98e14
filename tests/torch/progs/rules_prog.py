"""Every training rule drives a torch module (TorchModel) as it drives a distnn Sequential:
for each rule, the same two-layer network is trained once as a torch module and once as
distnn layers, from the same weights on the same data (float64); rank r writes
OUT_DIR/rank<r>.pkl with both final weights (in distnn's layout) and the test accuracy.

python rules_prog.py OUT_DIR  (under mpiexec -n N)
"""
import inspect
import pickle
import sys

import numpy as np
import torch

from distnn import distributed as dist
from distnn.data import load_dataset
from distnn.nn import Dense, Flatten, ReLU, Sequential
from distnn.optim import SGD
from distnn.rules import RULES, get_rule
from distnn.torch import TorchModel
from distnn.training import Trainer

torch.set_num_threads(1)
comm = dist.init()
splits = load_dataset("synthetic", input_shape=(1, 4, 4), num_classes=3, num_samples=150,
                      dtype=np.float64, seed=1)
results = {}
for name in sorted(RULES):
    accepted = inspect.signature(RULES[name]).parameters
    options = {"synchronous": True} if "synchronous" in accepted else {}
    if "sync_every" in accepted:
        options["sync_every"] = 2
    if name == "partial":  # chunks are slices of the flat weights, and a torch Linear's
        options["chunks"] = 1  # weight is stored transposed to a Dense's: only whole
        # averages (one chunk) cover the same weights in both layouts
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 3))
    tmodel = TorchModel(net, (1, 4, 4), dtype=np.float64, name="net")
    dmodel = Sequential([Flatten(), Dense(8), ReLU(), Dense(3)], input_shape=(1, 4, 4),
                        dtype=np.float64)
    for layer, linear in zip([dmodel.layers[1], dmodel.layers[3]], [net[1], net[3]]):
        layer.params["w"][...] = linear.weight.detach().numpy().T
        layer.params["b"][...] = linear.bias.detach().numpy()
    finals = []
    for model in (tmodel, dmodel):
        trainer = Trainer(model, SGD(model, lr=0.1, momentum=0.9), comm=comm,
                          rule=get_rule(name, **options), progress=False, verbose=False)
        trainer.fit(splits.train, epochs=2, global_batch_size=20, steps_per_epoch=5)
        accuracy = trainer.evaluate(splits.test)["accuracy"]
        if model is tmodel:
            w = [net[1].weight.detach().numpy().T, net[1].bias.detach().numpy(),
                 net[3].weight.detach().numpy().T, net[3].bias.detach().numpy()]
        else:
            w = [dmodel.layers[i].params[k] for i in (1, 3) for k in ("w", "b")]
        finals.append((np.concatenate([a.ravel() for a in w]).copy(), accuracy))
    results[name] = finals
with open(f"{sys.argv[1]}/rank{comm.rank}.pkl", "wb") as f:
    pickle.dump(results, f)
