"""Theano-MPI's recorder (``theanompi/lib/recorder.py``'s methods): what a Theano-MPI
model class reports its steps to, and what the loop of ``run/theanompi.py`` prints and
gathers over the ranks."""
from __future__ import annotations

import os
import time
from collections import defaultdict

import numpy as np


class Recorder:
    """Theano-MPI's recorder: the model class reports its steps to it (``train_error``,
    ``val_error``, ``start``/``end``), the loop prints and gathers them.

    Args:
        comm: the communicator (validation lines are gathered over it).
        print_freq: print the mean train cost and error every this many counts.
        verbose: print (rank 0).

    Example:
        recorder.train_error(count, cost, error)
    """

    def __init__(self, comm, print_freq: int = 40, modelname: str = "", verbose: bool = True):
        self.comm = comm
        self.printFreq = max(int(print_freq), 1)
        self.modelname = modelname
        self.verbose = verbose
        self.train_info: dict[str, list] = {"cost": [], "error": []}
        self.val_info: dict[str, list] = {"cost": [], "error": [], "error_top5": []}
        self.all_time: dict[str, list] = defaultdict(list)
        self.info_dict: dict[str, list] = defaultdict(list)
        self.t_start: float | None = None
        self.epoch_time: float | None = None

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def end(self, mode: str) -> None:
        if self.t_start is not None:
            self.all_time[mode].append(time.perf_counter() - self.t_start)
        self.t_start = None

    def start_epoch(self) -> None:
        self.epoch_time = time.perf_counter()

    def end_epoch(self, count: int, uepoch: int) -> None:
        duration = time.perf_counter() - (self.epoch_time or time.perf_counter())
        self.info_dict["epoch_time"].append([count, duration])
        if self.verbose:
            print(f"global epoch {uepoch} took {duration:.1f} s", flush=True)
        self.epoch_time = None

    def train_error(self, count: int, cost, error) -> None:
        self.train_info["cost"].append(float(cost))
        self.train_info["error"].append(float(error))

    def val_error(self, count: int, cost, error, error_top5=None) -> None:
        self.val_info["cost"].append(float(cost))
        self.val_info["error"].append(float(error))
        if error_top5 is not None:
            self.val_info["error_top5"].append(float(error_top5))

    def print_train_info(self, count: int) -> None:
        if count % self.printFreq or not self.train_info["cost"]:
            return
        cost = float(np.mean(self.train_info["cost"]))
        error = float(np.mean(self.train_info["error"]))
        self.info_dict["train_info"].append([count, cost, error])
        times = {k: sum(self.all_time[k]) for k in ("calc", "comm")}
        if self.verbose:
            print(f"{count} cost {cost:.6f} error {error:.4f} (train {times['calc']:.2f} s, "
                  f"comm {times['comm']:.2f} s)", flush=True)
        self.clear_train_info()

    def clear_train_info(self) -> None:
        for values in (*self.train_info.values(), *self.all_time.values()):
            values.clear()

    def gather_val_info(self) -> None:
        """Every rank's validation batches on every rank (collective)."""
        gathered = self.comm.allgather_obj(self.val_info)
        self.val_info = {k: [v for part in gathered for v in part[k]] for k in self.val_info}

    def print_val_info(self, count: int, comment: str | None = None) -> None:
        info = [count] + [float(np.mean(v)) if v else float("nan")
                          for v in self.val_info.values()]
        self.info_dict["val_info"].append(info)
        if self.verbose:
            if comment:
                print(comment)
            print(f"validation cost:{info[1]:.4f} error:{info[2]:.4f}", flush=True)
        for values in self.val_info.values():
            values.clear()

    def get_latest_val_info(self) -> list | None:
        return self.info_dict["val_info"][-1] if self.info_dict["val_info"] else None

    def save(self, count: int, lr, filepath: str | None = None) -> None:
        """Keep the learning rate with the history (``info_dict``); Theano-MPI pickles it to
        ./inforec/, distnn writes nothing unless ``filepath`` is given."""
        self.info_dict["lr"].append([count, float(np.asarray(lr))])
        if filepath:
            import pickle
            os.makedirs(filepath, exist_ok=True)
            with open(os.path.join(filepath, "inforec.pkl"), "wb") as f:
                pickle.dump(dict(self.info_dict), f)
