"""The configuration is typed in source: every option is a field of a config dataclass
(``run.config``) with its type, default and kind written there; the option table, the
command's ``--help`` and TOML keys derive from those fields, and ``__post_init__`` checks
every value by its kind (the error names the option)."""
from __future__ import annotations

import inspect
import re
import typing
from dataclasses import MISSING, FrozenInstanceError, fields
from typing import Any

import pytest

from distnn.cli.main import build_parser
from distnn.run import OPTION_BY_NAME, OPTIONS, build_config, load_toml, option_values
from distnn.run import config as config_module
from distnn.run.config import (SECTIONS, ConfigError, ModelConfig, OptimizerConfig,
                               ParallelConfig, RunConfig, TrainConfig)
from distnn.run.kinds import (Bool, CompressionSpec, FileList, Float, Int, KernelPlan, KeyValues,
                              List, Maybe, ModelSpec, Shape, Str)
from distnn.run.options import GROUPS

FIELDS = [(section, f) for section, cls in SECTIONS.items() for f in fields(cls)]

# The Python type a value of each kind has once checked.
KIND_TYPES = {Int: int, Float: float, Bool: bool, Str: str, ModelSpec: str,
              CompressionSpec: str, KernelPlan: str, List: tuple[str, ...], Shape: tuple[int, ...],
              KeyValues: tuple[tuple[str, Any], ...], FileList: str | tuple[str, ...]}


def _type_of(kind):
    if isinstance(kind, Maybe):
        return _type_of(kind.inner) | None
    return KIND_TYPES[type(kind)]


def _is_instance(value, hint) -> bool:
    """``isinstance`` for the hints the config fields use (unions, tuple[X, ...], Any)."""
    if hint is Any:
        return True
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, type(int | None)):
        return any(_is_instance(value, a) for a in args)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and all(_is_instance(v, args[0]) for v in value)
    return isinstance(value, hint) and not (hint in (int, float) and isinstance(value, bool))


def test_the_option_table_is_the_dataclass_fields():
    assert [o.name for o in OPTIONS] == [f.name for _, f in FIELDS]
    assert len(OPTIONS) > 100  # the whole table (116 when it was typed; new options add rows)
    for (section, f), o in zip(FIELDS, OPTIONS):
        assert (o.section, o.group) == (section, section), o.name
        assert o.default is f.default or o.default == f.default, o.name
        assert o.kind is f.metadata["kind"] and o.help == f.metadata["help"], o.name
        assert o.commands == SECTIONS[section].commands_of(f), o.name
        assert o.aliases == f.metadata["aliases"], o.name
    assert GROUPS == {name: cls.title for name, cls in SECTIONS.items()}
    # a section says once which commands take its options; an option may name others
    assert SECTIONS["sched"].commands == ("train",) and SECTIONS["model"].commands == (
        "train", "evaluate", "predict")
    assert OPTION_BY_NAME["learning_rate"].commands == ("train",)
    assert OPTION_BY_NAME["batch_size"].commands == ("train", "evaluate", "predict")
    assert OPTION_BY_NAME["output"].commands == ("predict",)
    assert option_values({}) == {f.name: f.default for _, f in FIELDS}


@pytest.mark.parametrize("section,cls", list(SECTIONS.items()))
def test_fields_types_and_defaults_are_written_in_source(section, cls):
    source = inspect.getsource(cls)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        # declared in the class body, with a type (not generated at import)
        assert re.search(rf"^    {f.name}: [^=]+ = option\(", source, re.M), f.name
        assert f.default is not MISSING, f.name
        hint = hints[f.name]
        assert hint is not Any, f.name
        # the annotation is the type the field's kind gives, and the default has it
        assert hint == _type_of(f.metadata["kind"]), (f.name, hint)
        assert _is_instance(f.default, hint), (f.name, f.default, hint)
        assert f.metadata["kind"].check(f.default) == f.default, f.name
        assert f.metadata["help"].strip(), f.name
    assert "__annotations__ =" not in inspect.getsource(config_module)


def test_post_init_checks_every_field_with_the_options_message():
    with pytest.raises(ConfigError, match=r"^--random_seed: must be an integer >= 0, got -1$"):
        ModelConfig(random_seed=-1)
    with pytest.raises(ConfigError, match=r"^--batch_size: must be an integer >= 1, got 0$"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match=r"^--gossip_probability: must be a number in "
                                          r"\(0, 1\], got 1\.5$"):
        ParallelConfig(gossip_probability=1.5)
    with pytest.raises(ConfigError, match="^--optimizer: must be one of "):
        OptimizerConfig(optimizer="sgdd")
    # normalized by the kind: names lower-cased, lists as tuples, ints as floats
    cfg = OptimizerConfig(optimizer="Adam", metrics="acc,top5", learning_rate=1)
    assert (cfg.optimizer, cfg.metrics, cfg.learning_rate) == ("adam", ("acc", "top5"), 1.0)
    assert isinstance(cfg.learning_rate, float)
    with pytest.raises(FrozenInstanceError):
        cfg.optimizer = "sgd"


def test_the_same_checks_from_python_and_the_command_line():
    # the message the dataclass gives is the one build_config gives
    with pytest.raises(ConfigError) as direct:
        ParallelConfig(partial_chunks=0)
    with pytest.raises(ConfigError) as built:
        build_config("train", {"partial_chunks": 0})
    assert str(direct.value) == str(built.value) == \
        "--partial_chunks: must be an integer >= 1, got 0"


@pytest.mark.parametrize("command", ["train", "evaluate", "predict"])
def test_help_lists_each_field_of_the_command(command):
    parser = build_parser().commands[command]
    text = " ".join(parser.format_help().split())
    flags = {s for action in parser._actions for s in action.option_strings}
    for section, f in FIELDS:
        if command in SECTIONS[section].commands_of(f):
            assert {f"--{f.name}", f"--{f.name.replace('_', '-')}"} <= flags, f.name
            assert f"--{f.name} " in text, f.name
            assert " ".join(f.metadata["help"].split()[:4]) in text, f.name
        else:
            assert f"--{f.name}" not in flags, f.name
    for cls in SECTIONS.values():
        if any(command in cls.commands_of(f) for f in fields(cls)):
            assert f"{cls.title}:" in text


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def test_toml_keys_are_the_field_names(tmp_path):
    # every field (not None: TOML has no null) in a table of its section, a few with dashes
    given = {f.name: f.default for _, f in FIELDS if f.default is not None}
    given.update(random_seed=7, model_args="dense=10", metrics=("acc",),
                 gradient_compression="topk:0.01", input_shape=(1, 8, 8))
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        for f in fields(cls):
            if f.name in given:
                key = f.name.replace("_", "-") if f.name.startswith("crop") else f.name
                lines.append(f"{key} = {_toml(given[f.name])}")
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    values = load_toml(str(path))
    assert values == {name: OPTION_BY_NAME[name].kind.check(v) for name, v in given.items()}
    cfg = build_config("train", option_values(values))
    assert cfg.model.random_seed == 7 and cfg.model.model_args == (("dense", 10),)
    assert cfg.parallel.gradient_compression == "topk:0.01"
    # an unknown key and a bad value are refused naming the key
    path.write_text("[train]\nbatch_sise = 3\n")
    with pytest.raises(ConfigError, match="unknown option 'batch_sise'"):
        load_toml(str(path))
    path.write_text("batch_size = 0\n")
    with pytest.raises(ConfigError, match="batch_size: must be an integer >= 1, got 0"):
        load_toml(str(path))


def test_run_config_sections_are_the_section_classes():
    cfg = build_config("train", {})
    assert isinstance(cfg, RunConfig)
    for section, cls in SECTIONS.items():
        assert type(getattr(cfg, section)) is cls
        assert getattr(cfg, section) == cls()  # the defaults are the fields' defaults
