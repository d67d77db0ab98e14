"""What the seed systems' users bring, in distnn's terms: Theano-MPI session files, the
spellings of PyDTNN and NNLO that depend on several options, and NNLO's
``--validate-every``.

Where an option of those systems cannot mean the same here, it is accepted and a note
(printed once, on rank 0, to stderr) says what distnn does instead.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from ..training.callbacks import Callback
from .options import OPTION_BY_NAME, PYDTNN_MODELS, SEED_MODELS, canonical

# -- Theano-MPI session files (tmlauncher -cfg=session.cfg) ---------------------------------
# RULE of Theano-MPI -> distnn's --parallel (the training rule).
RULES = {"BSP": "data", "EASGD": "easgd", "GOSGD": "gossip"}
SESSION_KEYS = ("RULE", "MODELFILE", "MODELCLASS", "SIZE", "DEVICES", "BSP_SYNC_TYPE",
                "BSP_EXCH_STRATEGY", "BIND")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def _statements(text: str) -> list[str]:
    """Shell assignments of a session file, a parenthesized array joined onto one line."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        line = line.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.count("(") <= pending.count(")"):
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def is_session_file(text: str) -> bool:
    """Whether ``text`` is a Theano-MPI session file: shell ``KEY=VALUE`` lines (no spaces
    around '=') with at least one of Theano-MPI's upper-case keys."""
    statements = _statements(text)
    if not statements or not all(_ASSIGN.match(s) for s in statements):
        return False
    return any(_ASSIGN.match(s).group(1) in SESSION_KEYS for s in statements)


def _shell_value(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith("(") and raw.endswith(")"):
        raw = raw[1:-1]
    try:
        words = shlex.split(raw, comments=True)
    except ValueError:
        words = [raw]
    return " ".join(words)


def _model_file(module: str, config_path: str) -> str:
    """MODELFILE for --model: a .py path as is; a dotted module (models.alex_net) as the
    file models/alex_net.py when it is in the working folder or next to the config file,
    else as the module to import."""
    if module.endswith(".py") or "/" in module:
        return module
    relative = module.replace(".", "/") + ".py"
    for base in (Path.cwd(), Path(config_path).resolve().parent):
        if (base / relative).is_file():
            return str(base / relative)
    return module


def session_options(text: str, path: str) -> tuple[dict[str, Any], list[str]]:
    """Option values and notes from a Theano-MPI session file. Lower-case keys are distnn
    options (as in TOML); upper-case ones are Theano-MPI's."""
    raw: dict[str, str] = {}
    for statement in _statements(text):
        key, value = _ASSIGN.match(statement).groups()
        if key in raw:
            raise ValueError(f"{key} is set twice")
        raw[key] = _shell_value(value)
    return session_values(raw, path)


def session_values(raw: dict[str, str], path: str) -> tuple[dict[str, Any], list[str]]:
    """Option values and notes of Theano-MPI's keys (a session file's, or tmlauncher's
    flags: -r=, -file=, -class=, -s=...); ``path``: the config file (its folder is
    searched for MODELFILE)."""
    values: dict[str, Any] = {}
    notes: list[str] = []

    def put(name: str, value: str, source: str) -> None:
        option = OPTION_BY_NAME[name]
        try:
            values[name] = option.kind.parse(value)
        except ValueError as exc:
            raise ValueError(f"{source} -> --{name} {value}: {exc}") from None

    for key, value in raw.items():
        if key in SESSION_KEYS:
            continue
        name = canonical(key)
        if name not in OPTION_BY_NAME:
            raise ValueError(f"unknown key {key!r}; a session file takes Theano-MPI's "
                             f"{', '.join(SESSION_KEYS)} or distnn option names")
        put(name, value, key)
    if "RULE" in raw:
        rule = raw["RULE"].upper()
        if rule not in RULES:
            raise ValueError(f"RULE={raw['RULE']}: must be one of {', '.join(RULES)}")
        put("parallel", RULES[rule], f"RULE={raw['RULE']}")
    if ("MODELFILE" in raw) != ("MODELCLASS" in raw):
        given = "MODELFILE" if "MODELFILE" in raw else "MODELCLASS"
        raise ValueError(f"{given} needs MODELFILE and MODELCLASS together (the module and "
                         f"the class or function in it that builds the model)")
    if "MODELFILE" in raw:
        spec = f"{_model_file(raw['MODELFILE'], path)}:{raw['MODELCLASS']}"
        put("model", spec, f"MODELFILE={raw['MODELFILE']} MODELCLASS={raw['MODELCLASS']}")
    if "DEVICES" in raw:
        notes.append(f"DEVICES={raw['DEVICES']}: not applicable, this build has no GPU "
                     "backend; distnn runs one CPU process per MPI rank (start them with "
                     "mpiexec -n N)")
    if "SIZE" in raw:
        notes.append(f"SIZE={raw['SIZE']}: distnn trains on as many ranks as mpiexec -n "
                     "starts; launch with mpiexec -n " + raw["SIZE"])
    if "BSP_SYNC_TYPE" in raw:
        notes.append(f"BSP_SYNC_TYPE={raw['BSP_SYNC_TYPE']}: distnn's BSP sums the gradients "
                     "of all ranks every step (an exact synchronous update); there is no "
                     "other exchange type")
    if "BSP_EXCH_STRATEGY" in raw:
        strategy = raw["BSP_EXCH_STRATEGY"]
        if strategy.endswith("16"):
            put("gradient_compression", "fp16", f"BSP_EXCH_STRATEGY={strategy}")
            notes.append(f"BSP_EXCH_STRATEGY={strategy}: gradients travel as float16 over "
                         "MPI (--gradient_compression fp16)")
        else:
            notes.append(f"BSP_EXCH_STRATEGY={strategy}: gradients are all-reduced over MPI "
                         "(bucketed, overlapped with backward)")
    if "BIND" in raw:
        notes.append("BIND: bind ranks to cores with your mpiexec's options (e.g. mpiexec "
                     "-bind-to core); --threads sets BLAS threads per rank")
    return values, notes


# tmlauncher's flags (-r=BSP, -file=..., -class=..., -s=2, ...) -> session-file keys
LAUNCHER_FLAGS = {"rule": "RULE", "modelfile": "MODELFILE", "modelclass": "MODELCLASS",
                  "size": "SIZE", "bsp_sync_type": "BSP_SYNC_TYPE",
                  "bsp_exch_strategy": "BSP_EXCH_STRATEGY", "bind": "BIND"}


# -- options with no counterpart: what distnn does instead ----------------------------------
NOTES = {
    "timeline": "NNLO's activity timeline is distnn's Chrome trace (layers and "
                "communication per rank; open it in Perfetto)",
    "n_processes": "every distnn rank is one worker training on its share of each global "
                   "batch; start more ranks with mpiexec -n instead of processes per worker",
    "n_masters": "distnn's parameter-server rules (--parallel downpour, easgd, gem) have one "
                 "master, rank 0",
    "max_gpus": "not applicable, this build has no GPU backend",
    "master_gpu": "not applicable, this build has no GPU backend",
    "tf": "distnn trains its own models or torch.nn.Module ones (--model FILE.py), not "
          "TensorFlow/Keras ones",
    "backend": "distnn trains its own models or torch.nn.Module ones (--model FILE.py)",
    "monitor": "use --profile for per-layer times and all-reduce waits, --trace for a "
               "timeline",
    "tensor_format": "distnn computes in NCHW; the data is read in that layout",
    "use_mpi_buffers": "distnn always communicates NumPy buffers (flat gradient buckets)",
}


# -- spellings that depend on several options -----------------------------------------------
def translate(values: dict[str, Any], explicit: set[str]) -> list[str]:
    """Apply, in place, the other systems' meanings that involve several options; return
    notes for what is done differently here. Raises ValueError naming the option."""
    notes: list[str] = []
    model = values.get("model")
    if isinstance(model, str) and model in PYDTNN_MODELS:
        values["model"] = PYDTNN_MODELS[model]
    if isinstance(model, str) and model in SEED_MODELS:
        values["model"] = SEED_MODELS[model]
        notes.append(f"--model {model}: NNLO's example model; distnn trains its zoo model "
                     f"{SEED_MODELS[model]} (a small CNN of the same kind)")
    if values.get("train_list") is not None:
        if "dataset" not in explicit:
            values["dataset"] = "hdf5"
        elif values["dataset"] != "hdf5":
            raise ValueError(f"--train_list/--train_data lists HDF5 files: use it with "
                             f"--dataset hdf5, got --dataset {values['dataset']}")
    if values.get("validation_split") is None:
        values["validation_split"] = 0.0 if values.get("val_list") else 0.2
    if values.get("trial_name") and not values.get("history_file"):
        stem = Path(str(values["model"]).split(":")[0]).stem
        values["history_file"] = f"{stem}_{values['trial_name']}_history.json"
    if values.get("timeline") and not values.get("trace"):
        stem = Path(str(values["model"]).split(":")[0]).stem
        values["trace"] = f"{stem}_{values.get('trial_name') or 'train'}_timeline.json"
    for name, note in NOTES.items():
        value = values.get(name)
        if value not in (None, False) and not (name == "n_processes" and value == 1):
            notes.append(f"--{name} {value}: {note}" if value is not True
                         else f"--{name}: {note}")
    launcher = {key: values.get(name) for name, key in LAUNCHER_FLAGS.items()
                 if values.get(name) not in (None, False)}
    if launcher:
        raw = {k: "1" if v is True else str(v) for k, v in launcher.items()}
        given, said = session_values(raw, "tmlauncher")
        for name, value in given.items():
            if name not in explicit:
                values[name] = value
        notes += said
    if values.get("tracing") and not values.get("trace"):
        values["trace"] = "distnn-trace.json"
        notes.append("--tracing: distnn writes a Chrome trace (layers and communication) to "
                     "distnn-trace.json (choose the file with --trace FILE); PyDTNN's "
                     "Extrae/Simple tracers are not available")
    return notes


def rank_path(path: str, rank: int) -> str:
    """``path`` with '{rank}' replaced by ``rank`` (--shared_storage false)."""
    return path.replace("{rank}", str(rank))


class ValidateEvery(Callback):
    """NNLO's --validate-every: evaluate ``validation`` after every ``every`` optimizer
    updates (collective: every rank calls it at the same step) and print the result on
    rank 0; ``records`` keeps them."""

    def __init__(self, every: int, validation, batch_size: int, steps: int):
        self.every, self.validation = int(every), validation
        self.batch_size, self.steps = int(batch_size), int(steps)
        self.records: list[dict[str, float]] = []

    def on_batch_end(self, trainer, step, logs):
        if (step + 1) % self.every:
            return
        result = trainer.evaluate(self.validation, global_batch_size=self.batch_size,
                                  steps=self.steps, prefix="val_")
        self.records.append({"step": step + 1, **result})
        text = " ".join(f"{k}={v:.4f}" for k, v in result.items())
        trainer.print(f"Validation after {step + 1} updates: {text}", force=True)


def make_validate_every(every: int, validation, batch_size: int, steps: int) -> ValidateEvery:
    """The --validate-every callback (see ``ValidateEvery``)."""
    return ValidateEvery(every, validation, batch_size, steps)
