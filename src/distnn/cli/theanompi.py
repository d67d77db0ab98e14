"""Theano-MPI's session files (``tmlauncher -cfg=session.cfg``: shell ``KEY=VALUE``
lines) and tmlauncher's flags, as distnn's option values and notes, for
``distnn.cli.compat``.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from .spellings import name_of, option_of

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
    module it names, imported from the working folder when it is there, else from the
    config file's folder (``DIR/models.alex_net``), so that it imports its package's other
    modules (``import models.data.dataname``) as under Theano-MPI."""
    if module.endswith(".py") or "/" in module:
        return module
    relative = Path(*module.split("."))
    for base in (Path.cwd(), Path(config_path).resolve().parent):
        if (base / relative.with_suffix(".py")).is_file() or (base / relative).is_dir():
            return module if base == Path.cwd() else f"{base}/{module}"
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
        option = option_of(name)
        try:
            values[name] = option.kind.parse(value)
        except ValueError as exc:
            raise ValueError(f"{source} -> --{name} {value}: {exc}") from None

    for key, value in raw.items():
        if key in SESSION_KEYS:
            continue
        name = name_of(key)
        if option_of(name) is None:
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
