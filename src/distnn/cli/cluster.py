"""``distnn cluster``: an emulated cluster on this machine (needs root), to try a multi-host
launch without one: ``up``, ``run``, ``exec``, ``kill``, ``status``, ``down``."""
from __future__ import annotations

import argparse
import subprocess
import sys

from ..run import RunError as UserError


def add_cluster_parser(sub) -> None:
    text = "an emulated cluster on this machine: hosts as network namespaces (needs root)"
    p = sub.add_parser("cluster", help=text, description=text[0].upper() + text[1:] + ".",
                       allow_abbrev=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    helps = {"up": "create the hosts and links (replacing a cluster of the same --prefix)",
             "down": "remove every namespace, link and file of the cluster",
             "status": "list the hosts", "run": "mpiexec COMMAND on every host",
             "exec": "run COMMAND on one HOST", "kill": "kill -9 every process on HOST"}
    for action, text in helps.items():
        a = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".",
                               allow_abbrev=False)
        a.add_argument("--prefix", default="h", help="host names PREFIX1..N. Default: h.")
        if action == "up":
            a.add_argument("--hosts", type=int, default=2, help="Number of hosts. Default: 2.")
            a.add_argument("--rate", default="1gbit",
                           help="Bandwidth of each link as tc writes it ('1gbit', '10gbit'), "
                           "or 'none' for unshaped links. Default: 1gbit.")
            a.add_argument("--net", type=int, default=0,
                           help="Addresses 198.18.NET.0/24. Default: 0.")
            a.add_argument("--cores", choices=("split", "all"), default="split",
                           help="Each host its own share of the cores, or all of them.")
            a.add_argument("--private", nargs="*", default=[], metavar="DIR",
                           help="Folders private to each host (node-local storage).")
            a.add_argument("--slurm", action="store_true",
                           help="Also run Slurm on the hosts (munged, slurmctld at the "
                           "bridge address, one slurmd per host; needs Debian's slurmctld, "
                           "slurmd, slurm-client and munge) and print the environment srun "
                           "needs.")
        if action in ("exec", "kill"):
            a.add_argument("host", metavar="HOST")
        if action == "run":
            a.add_argument("--ranks_per_host", "--ranks-per-host", type=int, default=1,
                           help="Ranks on each host. Default: 1.")
        if action in ("run", "exec"):
            a.add_argument("words", nargs=argparse.REMAINDER, metavar="-- COMMAND")


def run_cluster(args) -> int:
    from ..cluster import ClusterError, EmulatedCluster, total_sent
    words = list(getattr(args, "words", []))
    words = words[1:] if words[:1] == ["--"] else words
    try:
        if args.action == "up":
            c = EmulatedCluster(args.hosts, rate=None if args.rate == "none" else args.rate,
                                prefix=args.prefix, net=args.net, cores=args.cores,
                                private_dirs=args.private).up()
            _describe(c)
            print(f"run: distnn cluster run -- distnn train ...   (or: "
                  f"{' '.join(c.mpiexec(['COMMAND']))} with UCX_TLS=tcp)")
            if args.slurm:
                _slurm_up(c)
            return 0
        if args.action == "down":
            _slurm_down(args.prefix)
            EmulatedCluster(1, prefix=args.prefix).down()
            print(f"emulated cluster {args.prefix!r}: removed")
            return 0
        c = EmulatedCluster.existing(args.prefix)
        if args.action == "status":
            _describe(c)
            return 0
        if args.action == "kill":
            print(f"{args.host}: killed {len(c.kill(_host(c, args.host)))} processes")
            return 0
        if not words:
            raise UserError(f"{args.action}: give the command after --, e.g. distnn cluster "
                            "run -- distnn train")
        if args.action == "exec":
            return subprocess.call(c.exec_argv(_host(c, args.host), words))
        before = c.link_bytes()
        code = subprocess.call(c.mpiexec(words, args.ranks_per_host), env=c.env())
        sent = total_sent(before, c.link_bytes())
        print(f"distnn cluster: {sent / 1e6:.1f} MB crossed the links", file=sys.stderr)
        return code
    except (ClusterError, ValueError) as exc:
        raise UserError(str(exc)) from None


def _slurm_up(cluster) -> None:
    import shlex

    from ..cluster.slurm import EmulatedSlurm, SlurmError
    try:
        slurm = EmulatedSlurm(cluster).up()
    except SlurmError as exc:
        cluster.down()
        raise UserError(f"--slurm: {exc}") from None
    env = slurm.env({})
    print("Slurm is up (srun --mpi=pmi2 -N 2 -n 2 distnn info); in the shell that runs srun:")
    print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))


def _slurm_down(prefix: str) -> None:
    from ..cluster import EmulatedCluster
    from ..cluster.slurm import EmulatedSlurm
    try:
        cluster = EmulatedCluster.existing(prefix)
    except Exception:  # noqa: BLE001 - no cluster state: nothing of Slurm's to end either
        return
    EmulatedSlurm(cluster).down()


def _host(cluster, name: str) -> str:
    names = [h.name for h in cluster.hosts]
    if name not in names:
        raise UserError(f"no host {name!r} in the cluster; its hosts are {', '.join(names)}")
    return name


def _describe(c) -> None:
    print(f"emulated cluster {c.prefix!r}: {len(c.hosts)} hosts, links "
          f"{c.rate or 'unshaped'}, bridge {c.bridge_address}")
    for h in c.hosts:
        print(f"  {h.name}: {h.address}, cores {','.join(map(str, h.cores))}")
