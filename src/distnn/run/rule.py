"""The training rule a ``RunConfig`` asks for (``--parallel`` and the rule's options)."""
from __future__ import annotations

import inspect

from .config import ConfigError, ParallelConfig, RunConfig, rule_error

__all__ = ["build_rule"]


def build_rule(cfg: RunConfig, comm):
    """The training rule of ``cfg.parallel.parallel`` (auto and sequential: data), its
    constructor's arguments the fields of ``cfg.parallel`` that set them
    (``ParallelConfig.rule_arguments``); a rule's refusal names the option."""
    from ..rules import RULES, rule_name
    from ..rules import build_rule as rule_from_options
    p = cfg.parallel
    name = "data" if p.parallel in ("auto", "sequential") else rule_name(p.parallel)
    compressing = p.gradient_compression != "none"
    if compressing and "compression" not in inspect.signature(RULES[name]).parameters:
        raise ConfigError(f"--gradient_compression {p.gradient_compression} compresses the "
                          f"gradient all-reduce of --parallel data; --parallel {p.parallel} "
                          "exchanges no gradients that way: drop --gradient_compression or "
                          "use --parallel data")
    if p.shard and "shard" not in inspect.signature(RULES[name]).parameters:
        raise ConfigError(f"--shard {p.shard} shards the training state of --parallel data; "
                          f"--parallel {p.parallel} keeps its own: drop --shard or use "
                          "--parallel data")
    for option in ("group_size", "masters"):
        value = getattr(p, option)
        if value > 1 and option not in inspect.signature(RULES[name]).parameters \
                and not (option == "group_size" and name == "data"):  # data: one group of all
            takes = [r for r, cls in RULES.items() if option in inspect.signature(cls).parameters]
            raise ConfigError(f"--{option} {value} is built for --parallel {', '.join(takes)}, "
                              f"not --parallel {p.parallel}: drop --{option} or change the rule")
    accepted = inspect.signature(RULES[name]).parameters
    if p.encryption != "none" and "encryption" not in accepted:
        raise ConfigError(f"--encryption {p.encryption} encrypts --parallel fedavg's averages; "
                          f"--parallel {p.parallel} does not take it: drop --encryption or use "
                          "--parallel fedavg")
    for option, default in (("sync_weighting", "wavg"), ("sync_participation", "all"),
                            ("sync_min_avail", 0), ("sync_dtype", "none")):
        argument = p.rule_arguments_of(option)
        if getattr(p, option) != default and argument not in accepted:
            raise ConfigError(f"--{option} {getattr(p, option)} sets localsgd's averages, not "
                              f"--parallel {p.parallel}'s: drop it or use --parallel localsgd")
    for key, value in p.rule_args:
        option = ParallelConfig.option_of(key)
        if option is not None:
            raise ConfigError(f"--rule_args {key}={value}: {key} has an option of its own: "
                              f"use --{option} {value}")
        if key not in accepted:
            free = sorted(a for a in accepted if ParallelConfig.option_of(a) is None)
            raise ConfigError(f"--rule_args {key}={value}: --parallel {p.parallel} takes no "
                              f"argument {key!r}; the arguments it takes without an option "
                              f"of their own: {', '.join(free) or 'none'}")
    if p.partition != "iid" and "partition" not in accepted:
        raise ConfigError(f"--partition {p.partition} cuts the data among --parallel fedavg's "
                          f"clients; --parallel {p.parallel} shards every global batch: drop "
                          "--partition or use --parallel fedavg")
    if p.pipeline_stages > 1 or p.micro_batches > 1:
        return _pipeline(cfg, comm, name)
    try:
        rule = rule_from_options(name, p.rule_arguments())
    except ValueError as exc:
        raise rule_error(p, exc) from None
    if comm.size < rule.min_ranks:
        raise ConfigError(f"--parallel {p.parallel}: rank 0 is the master (with --masters M, "
                          f"ranks 1..M too) and the others are workers (--group_size ranks "
                          f"each), so it needs at least {rule.min_ranks} ranks, got "
                          f"{comm.size}; run it under mpiexec -n {max(rule.min_ranks, 3)} (or "
                          "use --parallel data)")
    if cfg.train.checkpoint_steps and comm.size > 1 and not rule.lockstep:
        raise ConfigError(f"--checkpoint_steps needs a rule whose ranks take every step "
                          f"together (--parallel data); --parallel {p.parallel} does not: "
                          "checkpoint by epochs (--checkpoint_freq) instead")
    return rule


def _pipeline(cfg: RunConfig, comm, name: str):
    """The ``Pipeline`` rule of ``--pipeline_stages``/``--micro_batches`` (over ``data``),
    refused by name where it does not combine."""
    from ..rules import Pipeline
    p, t = cfg.parallel, cfg.train
    if name != "data":
        raise ConfigError(f"--pipeline_stages {p.pipeline_stages} runs over --parallel data "
                          f"(each stage's gradients all-reduced over its replicas), not "
                          f"--parallel {p.parallel}: drop one of them")
    for option, off in (("gradient_compression", "none"), ("sync_batchnorm", False),
                        ("shard", 0)):
        value = getattr(p, option, off)
        if value not in (off, None):
            raise ConfigError(f"--{option} {value} does not combine with --pipeline_stages "
                              f"{p.pipeline_stages} yet: drop one of them")
    if t.validate_every:
        raise ConfigError(f"--validate_every {t.validate_every}: validation inside an epoch "
                          f"would see other stages' stale weights under --pipeline_stages "
                          f"{p.pipeline_stages}; validate at epoch ends (drop it)")
    stages = p.pipeline_stages
    if comm.size % stages:
        raise ConfigError(f"--pipeline_stages {stages}: {comm.size} ranks are not a multiple "
                          f"of {stages} stages (ranks = replicas x stages); run mpiexec -n "
                          f"{stages * max(1, comm.size // stages)} or change the stages")
    replicas = comm.size // stages
    share = (t.global_batch_size // replicas) if t.global_batch_size else t.batch_size
    if p.micro_batches > share or share % p.micro_batches:
        raise ConfigError(f"--micro_batches {p.micro_batches}: it must divide a replica's "
                          f"batch of {share} samples (--batch_size); use a divisor of {share}")
    try:
        return Pipeline(stages=stages, micro_batches=p.micro_batches,
                        schedule=p.pipeline_schedule, balance=p.pipeline_balance,
                        probe_rows=max(1, share // p.micro_batches),
                        bucket_size_mb=p.bucket_size_mb)
    except ValueError as exc:
        raise rule_error(p, exc) from None
