"""Kinds of option values: each parses a command-line string and checks a value from
anywhere (TOML, Python), raising ValueError with the rule and the value. A field of a
config dataclass (``run.config``) names its kind; the kinds whose choices are registries
(models, datasets, optimizers...) read them when first asked, so ``--help`` stays fast.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence


class Kind:
    """Parses a command-line string and checks a value from anywhere (TOML, Python)."""

    metavar = "VALUE"

    def parse(self, text: str) -> Any:
        return self.check(text)

    def check(self, value: Any) -> Any:
        return value


class Int(Kind):
    metavar = "N"

    def __init__(self, low: int = 1, high: int | None = None):
        self.low, self.high = low, high
        self.rule = (f"must be an integer >= {low}" if high is None else
                     f"must be an integer in [{low}, {high}]")

    def parse(self, text):
        try:
            return self.check(int(text))
        except ValueError:
            raise ValueError(f"{self.rule}, got {text!r}") from None

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low \
                or (self.high is not None and value > self.high):
            raise ValueError(f"{self.rule}, got {value!r}")
        return int(value)


class Float(Kind):
    metavar = "X"

    def __init__(self, low: float = 0.0, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        lo = "(" if low_open else "["
        hi = ")" if high_open or high == math.inf else "]"
        self.rule = f"must be a number in {lo}{low:g}, {high:g}{hi}"

    def parse(self, text):
        try:
            return self.check(float(text))
        except (TypeError, ValueError):
            raise ValueError(f"{self.rule}, got {text!r}") from None

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{self.rule}, got {value!r}")
        v = float(value)
        # inf only as a closed bound the rule shows (stop_at_loss_threshold's -inf)
        ok = ((math.isfinite(v) or (v == self.low and not self.low_open))
              and (v > self.low if self.low_open else v >= self.low)
              and (v < self.high if self.high_open else v <= self.high))
        if not ok:
            raise ValueError(f"{self.rule}, got {value!r}")
        return v


class Bool(Kind):
    metavar = "BOOL"
    TRUE = {"true", "yes", "on", "1", "y", "t"}
    FALSE = {"false", "no", "off", "0", "n", "f"}

    def parse(self, text):
        low = str(text).strip().lower()
        if low in self.TRUE:
            return True
        if low in self.FALSE:
            return False
        raise ValueError(f"must be true or false, got {text!r}")

    def check(self, value):
        if isinstance(value, str):
            return self.parse(value)
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value


class Str(Kind):
    metavar = "TEXT"

    def __init__(self, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
                 metavar: str | None = None, lower: bool = True):
        self._choices, self.lower = choices, lower
        if metavar:
            self.metavar = metavar

    @property
    def choices(self):
        c = self._choices() if callable(self._choices) else self._choices
        return sorted(c) if c is not None else None

    def check(self, value):
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {value!r}")
        choices = self.choices
        if choices is not None:
            key = value.lower().replace("-", "_") if self.lower else value
            if key not in choices:
                raise ValueError(f"must be one of {', '.join(choices)}; got {value!r}")
            return key
        if not value:
            raise ValueError("must not be empty, got ''")
        return value


class KernelPlan(Kind):
    """How the kernels' methods are chosen: fixed, measure or plan:FILE."""

    metavar = "PLAN"

    def check(self, value):
        if not isinstance(value, str):
            raise ValueError(f"must be fixed, measure or plan:FILE, got {value!r}")
        low = value.strip()
        if low.lower() in ("fixed", "measure"):
            return low.lower()
        if low.startswith("plan:") and len(low) > 5:
            return low
        raise ValueError(f"must be fixed, measure or plan:FILE (a file of measured "
                         f"choices), got {value!r}")


class List(Kind):
    """Comma-separated names on the command line; a list (or such a string) in TOML."""

    metavar = "A,B"

    def __init__(self, choices: Callable[[], Sequence[str]] | Sequence[str] | None = None):
        self._choices = choices

    def check(self, value):
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = [v.strip() for v in value if v.strip()]
        else:
            raise ValueError(f"must be comma-separated names, got {value!r}")
        choices = self._choices() if callable(self._choices) else self._choices
        if choices is not None:
            items = [v.lower().replace("-", "_") for v in items]
            bad = [v for v in items if v not in choices]
            if bad:
                raise ValueError(f"must list names from {', '.join(sorted(choices))}; got "
                                 f"{', '.join(bad)!r}")
        return tuple(items)


class FileList(Kind):
    """A text file listing files (its path), or the files themselves as a list (TOML, a
    model file's NNLO ``get_train()``); a list comes back as a tuple."""

    metavar = "FILE"

    def check(self, value):
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
            if not value:
                raise ValueError("must list at least one file, got []")
            return tuple(value)
        if not isinstance(value, str) or not value:
            raise ValueError(f"must be a file listing files, or a list of files; got "
                             f"{value!r}")
        return value


class KeyValues(Kind):
    """``NAME=VALUE,...`` (values read as int, float, true/false or text), or a table in
    TOML; comes back as a tuple of (name, value) pairs in the order given."""

    metavar = "K=V,..."

    @staticmethod
    def _value(text: str):
        text = text.strip()
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    def check(self, value):
        if isinstance(value, str):
            pairs = []
            for item in (v for v in value.split(",") if v.strip()):
                name, sep, text = item.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"must be NAME=VALUE pairs separated by commas, got "
                                     f"{item.strip()!r} in {value!r}")
                pairs.append((name.strip(), self._value(text)))
        elif isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, (list, tuple)) and all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
            pairs = [tuple(p) for p in value]
        else:
            raise ValueError(f"must be NAME=VALUE pairs, got {value!r}")
        names = [n for n, _ in pairs]
        if not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"names must be Python identifiers, got {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"a name is given twice in {value!r}")
        for n, v in pairs:
            if not isinstance(v, (bool, int, float, str)):
                raise ValueError(f"{n}: values must be numbers, true/false or text, got {v!r}")
        return tuple(pairs)


class Shape(Kind):
    metavar = "C,H,W"

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = [int(v) for v in value.replace("x", ",").split(",")]
            except ValueError:
                raise ValueError(f"must be positive integers like 1,28,28, got {value!r}") from None
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                           for v in value)):
            raise ValueError(f"must be positive integers like 1,28,28, got {value!r}")
        return tuple(value)


class Maybe(Kind):
    """Another kind that also accepts None ('' or 'none' on the command line)."""

    def __init__(self, inner: Kind):
        self.inner = inner
        self.metavar = inner.metavar

    def parse(self, text):
        return None if str(text).strip().lower() in ("", "none") else self.inner.parse(text)

    def check(self, value):
        return None if value is None else self.inner.check(value)


# -- registries the choices come from (imported lazily) ----------------------------------
def models():
    from ..models import MODELS
    return MODELS


def datasets():
    from ..data import DATASETS
    return DATASETS


def optimizers():
    from ..optim import OPTIMIZERS
    return OPTIMIZERS


def losses():
    from ..nn.losses import LOSSES
    return LOSSES


def parallel_modes():
    from ..rules import ALIASES, RULES
    return ("auto", "sequential", *RULES, *ALIASES)


def schedulers():
    from ..training.callbacks import CALLBACKS
    return CALLBACKS


class ModelSpec(Str):
    """A zoo name (any case) or a user's model: FILE.py, FILE.py:NAME or MODULE:NAME
    (``distnn.models.files``; kept as written)."""

    metavar = "NAME|FILE.py[:FN]"

    def check(self, value):
        from ..models.files import is_model_spec
        if isinstance(value, str) and is_model_spec(value):
            return value
        try:
            return super().check(value)
        except ValueError as exc:
            raise ValueError(f"{exc} (or a model file: FILE.py, FILE.py:NAME, "
                             "MODULE:NAME)") from None


class CompressionSpec(Str):
    """none, fp16, topk:RATIO, threshold:VALUE or powersgd:RANK (checked, lower-cased)."""

    metavar = "none|fp16|topk:R|threshold:V|powersgd:R"

    def check(self, value):
        from ..distributed.lossy import parse_compression
        if not isinstance(value, str):
            raise ValueError(f"must be a string such as topk:0.01, got {value!r}")
        spec = parse_compression(value)
        return spec if isinstance(spec, str) else spec.spec
