"""``distnn launch``: a supervisor that keeps a training run going when hosts die
(``distnn.launch.supervisor``), or an ``hvd.elastic`` job going as hosts come and go
(``distnn.launch.elastic``): parse, build the supervisor, run it."""
from __future__ import annotations

import argparse
import os

from ..run.build import RunError


def add_launch_parser(sub) -> None:
    text = ("run distnn train under mpiexec on hosts and restart it from its checkpoint on the "
            "hosts that still answer when a rank or host dies; or an hvd.elastic script, "
            "restarted from its last commit when hosts die, are added or are removed")
    p = sub.add_parser("launch", help=text, description=text[0].upper() + text[1:] + ".",
                       allow_abbrev=False)
    p.add_argument("--hosts", default=None, metavar="H1,H2,...",
                   help="Hosts, rank 0 on the first. Default: the Slurm allocation's "
                   "SLURM_JOB_NODELIST.")
    p.add_argument("--ranks_per_host", "--ranks-per-host", type=int, default=1, metavar="N",
                   help="Ranks on each host. Default: 1.")
    p.add_argument("--max_restarts", "--max-restarts", type=int, default=3, metavar="N",
                   help="Relaunches allowed after failures. Default: 3.")
    p.add_argument("--min_hosts", "--min-hosts", type=int, default=1, metavar="N",
                   help="Fewest hosts to go on with. Default: 1.")
    p.add_argument("--cluster", default=None, metavar="PREFIX",
                   help="Launch on the emulated cluster PREFIX (distnn cluster up): its "
                   "launcher script and environment; --hosts defaults to all its hosts.")
    p.add_argument("--launcher_args", "--launcher-args", default="", metavar="ARGS",
                   help="More mpiexec arguments, e.g. '-launcher ssh -launcher-exec "
                   "/path/script' (a host is probed with that program's 'HOST true', and over the "
                   "data network through it).")
    p.add_argument("--stall_timeout", "--stall-timeout", type=float, default=600.0,
                   metavar="S", help="--stall_timeout given to a train command that sets "
                   "none: a hung rank ends the job (exit 4) and its host is dropped; also the "
                   "longest wait for a partition to heal. "
                   "Default: 600.")
    p.add_argument("--backoff", type=float, default=1.0, metavar="S",
                   help="While hosts answer the launcher but fail the probe over the data "
                   "network (a partition) and fewer than --min_hosts pass without them: the "
                   "first wait before probing again, doubled each round up to "
                   "--backoff_cap; the wait ends after --stall_timeout. Default: 1.")
    p.add_argument("--backoff_cap", "--backoff-cap", type=float, default=30.0, metavar="S",
                   help="The longest wait between two probes of a partition. Default: 30.")
    p.add_argument("--host_discovery_script", "--host-discovery-script", default=None,
                   metavar="PATH", help="Elastic jobs (a command other than train): a "
                   "program printing the usable hosts, one 'host' or 'host:slots' a line, "
                   "run every --discovery_interval seconds; hosts it adds or removes "
                   "restart the world from the last hvd.elastic commit.")
    p.add_argument("--discovery_interval", "--discovery-interval", type=float, default=1.0,
                   metavar="S", help="Seconds between two discovery runs. Default: 1.")
    p.add_argument("--mpiexec", default=None, metavar="PATH",
                   help="The launcher. Default: the mpiexec next to this Python.")
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="-- train ...",
                   help="The distnn train command line (must name --checkpoint), or any "
                   "command (python script.py ...): an elastic job (hvd.elastic), restarted "
                   "from its last commit, held in the supervisor's memory.")


def run_launch(args) -> int:
    from ..launch.supervisor import (LaunchError, Supervisor, expand_nodelist,
                                      launcher_words)
    words = list(args.words)
    words = words[1:] if words[:1] == ["--"] else words
    if not words:
        raise RunError("give the job after --: distnn launch --hosts h1,h2 -- train "
                       "--checkpoint ck.npz ..., or -- python elastic_script.py")
    env, launcher, store = None, launcher_words(args.launcher_args), None
    hosts = args.hosts.split(",") if args.hosts else None
    if args.cluster:
        from ..cluster import ClusterError, EmulatedCluster
        try:
            c = EmulatedCluster.existing(args.cluster)
        except ClusterError as exc:
            raise RunError(f"--cluster: {exc}") from None
        env, store = c.env(), c.bridge_address  # where the emulated hosts reach us
        launcher = ["-launcher", "ssh", "-launcher-exec", c.launcher_script, *launcher]
        hosts = hosts or ([] if args.host_discovery_script else [h.name for h in c.hosts])
    if hosts is None and os.environ.get("SLURM_JOB_NODELIST"):
        hosts = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])
    if words[0] != "train":
        return _run_elastic(args, words, hosts or [], launcher, env, store)
    try:
        sup = Supervisor(hosts or [], words[1:], ranks_per_host=args.ranks_per_host,
                         max_restarts=args.max_restarts, min_hosts=args.min_hosts,
                         mpiexec=args.mpiexec, launcher_args=launcher, env=env,
                         stall_timeout=args.stall_timeout, backoff=args.backoff,
                         backoff_cap=args.backoff_cap)
    except LaunchError as exc:
        raise RunError(str(exc)) from None
    return sup.run()


def _run_elastic(args, words, hosts, launcher, env, store) -> int:
    """An elastic job (``hvd.elastic``): any command, restarted from its last commit."""
    import socket

    from ..launch.elastic import ElasticSupervisor
    from ..launch.supervisor import LaunchError
    if store is None:  # ranks on this machine (as --hosts) reach loopback; others, this
        # host's address
        local = {"localhost", "127.0.0.1", socket.gethostname()}
        names = {h.partition(":")[0] for h in hosts}
        store = "127.0.0.1" if names and names <= local \
            else socket.gethostbyname(socket.gethostname())
    try:
        sup = ElasticSupervisor(hosts, words, ranks_per_host=args.ranks_per_host,
                                max_restarts=args.max_restarts, min_hosts=args.min_hosts,
                                discovery=args.host_discovery_script,
                                interval=args.discovery_interval, store_address=store,
                                mpiexec=args.mpiexec, launcher_args=launcher, env=env)
    except LaunchError as exc:
        raise RunError(str(exc)) from None
    return sup.run()
