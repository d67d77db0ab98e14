"""Rules take typed arguments and know nothing of command lines: ``distnn.run`` maps its
options to the rules' constructor arguments (``ParallelConfig.rule_arguments``) and names
the option when a rule refuses an argument."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import distnn.rules as rules_pkg
from distnn.distributed import LocalComm
from distnn.rules import RULES, RuleArgumentError, build_rule
from distnn.run import ConfigError, build_config
from distnn.run import build_rule as build_run_rule
from distnn.run.config import ParallelConfig, rule_error


def test_rules_name_no_command_line_option():
    for path in Path(rules_pkg.__file__).parent.glob("*.py"):
        source = path.read_text()
        assert not re.search(r"--[a-z]", source), f"{path.name} names a command-line option"
    assert all(not hasattr(cls, "options") for cls in RULES.values())


def test_every_rule_argument_has_an_option_or_comes_through_rule_args():
    arguments = ParallelConfig().rule_arguments()
    for name, cls in RULES.items():
        for arg, param in inspect.signature(cls).parameters.items():
            if arg in arguments:
                continue
            # no option of its own (max_sleep: the master's polling sleep, a tuning knob):
            # --rule_args NAME=VALUE sets it
            value = 7 if param.default is None else param.default
            cfg = build_config("train", {"parallel": name, "rule_args": f"{arg}={value}"})
            assert cfg.parallel.rule_arguments()[arg] == value, (name, arg)
    # an option whose name differs from its argument sets that argument
    p = ParallelConfig(non_blocking_mpi=False, gradient_compression="fp16",
                       gossip_probability=0.5, gossip_alpha=0.25, partial_chunks=3)
    got = p.rule_arguments()
    assert (got["non_blocking"], got["compression"], got["probability"], got["alpha"],
            got["chunks"]) == (False, "fp16", 0.5, 0.25, 3)
    assert "non_blocking_mpi" not in got and "partial_chunks" not in got
    assert ParallelConfig.option_of("chunks") == "partial_chunks"
    assert ParallelConfig.option_of("sync_every") == "sync_every"
    assert ParallelConfig.option_of("max_sleep") is None


def test_build_rule_takes_the_arguments_of_its_rule_by_name():
    rule = build_rule("gossip", {"probability": 0.5, "alpha": 0.25, "chunks": 9,
                                 "gossip_probability": 0.9})
    assert (rule.probability, rule.alpha0) == (0.5, 0.25)
    rule = build_rule("data", {"non_blocking": False})
    assert rule.non_blocking is False and rule.compression is None
    cfg = build_config("train", {"parallel": "partial", "partial_chunks": 3})
    assert build_run_rule(cfg, LocalComm()).chunks == 3


def test_a_rules_refusal_names_the_option_that_set_the_argument():
    with pytest.raises(RuleArgumentError) as exc:
        rules_pkg.PartialUpdate(chunks=0)
    assert exc.value.argument == "chunks" and "--" not in str(exc.value)
    said = rule_error(ParallelConfig(parallel="partial"), exc.value)
    assert isinstance(said, ConfigError)
    assert str(said) == "--partial_chunks 4: partial: chunks must be an integer >= 1, got 0"
    with pytest.raises(RuleArgumentError, match=r"^gossip: probability must be in \(0, 1\]"):
        rules_pkg.Gossip(probability=2.0)
    # a refusal with no argument is said of --parallel
    assert str(rule_error(ParallelConfig(parallel="easgd"), ValueError("no"))) == \
        "--parallel easgd: no"


def test_a_refused_rule_args_value_names_its_pair():
    cfg = build_config("train", {"parallel": "diloco", "rule_args": "outer_momentum=1"})
    with pytest.raises(ConfigError, match=r"^--rule_args outer_momentum=1: diloco: "
                       r"outer_momentum must be in \[0, 1\), got 1$"):
        build_run_rule(cfg, LocalComm())
    cfg = build_config("train", {"parallel": "downpour", "rule_args": "max_sleep=-1"})
    with pytest.raises(ConfigError, match=r"^--rule_args max_sleep=-1: downpour: max_sleep "
                       r"\(.*\) must be a number > 0, got -1$"):
        build_run_rule(cfg, LocalComm())
    with pytest.raises(RuleArgumentError, match="sync_every must be an integer >= 1") as exc:
        rules_pkg.LocalSGD(sync_every=0)
    assert exc.value.argument == "sync_every"
    with pytest.raises(RuleArgumentError, match=r"group_size \(ranks per worker\) must be an "
                       r"integer >= 1, got 1.5"):
        rules_pkg.Gossip(group_size=1.5)


def test_every_rule_is_importable_named_in_parallels_help_and_in_the_docs():
    docs = (Path(rules_pkg.__file__).parents[3] / "docs" / "rules.md").read_text()
    helptext = " ".join(ParallelConfig.__dataclass_fields__["parallel"].metadata["help"].split())
    for name, cls in RULES.items():
        assert getattr(rules_pkg, cls.__name__) is cls and cls.__name__ in rules_pkg.__all__
        assert f"{name} (" in helptext, name
        assert f"- **{name}**" in docs, name


def test_rule_args_reach_the_rule_and_are_checked_against_it():
    cfg = build_config("train", {"parallel": "downpour", "rule_args": "max_sleep=0.01"})
    assert cfg.parallel.rule_args == (("max_sleep", 0.01),)
    assert build_rule("downpour", cfg.parallel.rule_arguments()).max_sleep == 0.01
    toml_like = build_config("train", {"parallel": "downpour", "rule_args": {"max_sleep": 1}})
    assert toml_like.parallel.rule_arguments()["max_sleep"] == 1
    own = build_config("train", {"parallel": "localsgd", "rule_args": "sync_every=3"})
    with pytest.raises(ConfigError, match=r"--rule_args sync_every=3: .*use --sync_every 3"):
        build_run_rule(own, LocalComm())
    unknown = build_config("train", {"parallel": "downpour", "rule_args": "outer_lr=0.5"})
    with pytest.raises(ConfigError, match=r"--rule_args outer_lr=0.5: --parallel downpour takes "
                       r"no argument 'outer_lr'; .* without an option of their own: max_sleep"):
        build_run_rule(unknown, LocalComm())
    with pytest.raises(ConfigError, match="--rule_args"):
        build_config("train", {"parallel": "downpour", "rule_args": "max_sleep"})
