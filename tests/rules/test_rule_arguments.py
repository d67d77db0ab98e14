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


def test_every_rule_argument_has_an_option():
    arguments = ParallelConfig().rule_arguments()
    for name, cls in RULES.items():
        for arg in inspect.signature(cls).parameters:
            # max_sleep: the master's polling sleep, a tuning knob with no option
            assert arg in arguments or arg == "max_sleep", (name, arg)
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
