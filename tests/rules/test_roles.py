"""``Rule.role``: the words that name a lost rank (``distnn launch``, launch/rankwatch.py)
for every place in a master/worker layout: the master, the top master, a sub-master and
whom it serves, a worker (in a group) and who serves it."""
from __future__ import annotations

from types import SimpleNamespace

from distnn.rules import RULES
from distnn.rules.masters import MasterTree


def bound(rank: int, leaders, masters: int = 1, group_size: int = 1, mine=()):
    """A downpour rule as ``bind`` leaves it on ``rank`` (its tree and group)."""
    rule = RULES["downpour"](masters=masters, group_size=group_size)
    rule._leaders = tuple(leaders)
    if masters > 1:
        rule._tree = MasterTree(rule, SimpleNamespace(rank=rank), rule._leaders)
    if group_size > 1 and mine:
        rule._group = SimpleNamespace(groups=SimpleNamespace(mine=tuple(mine)))
    return rule


def test_one_master_and_its_workers():
    assert bound(0, range(1, 100)).role(0) == "master of workers 1-99"
    assert bound(3, [1, 2, 3]).role(3) == "worker"
    assert RULES["data"]().role(1) == ""


def test_a_tree_of_masters_names_whom_each_serves():
    leaders = [3, 4, 5]  # 6 ranks: top master 0, sub-masters 1 and 2
    assert bound(0, leaders, masters=2).role(0) == "top master"
    assert bound(1, leaders, masters=2).role(1) == \
        "sub-master of workers 3,4 (master group 0 of 2)"
    assert bound(2, leaders, masters=2).role(2) == \
        "sub-master of worker 5 (master group 1 of 2)"
    assert bound(5, leaders, masters=2).role(5) == "worker, served by sub-master 2"


def test_workers_that_are_groups_of_ranks():
    # 7 ranks, masters 2, groups of 2: sub-masters 1, 2; groups (3,4) and (5,6)
    leaders = [3, 5]
    assert bound(2, leaders, masters=2, group_size=2).role(2) == \
        "sub-master of worker group led by rank 5 (master group 1 of 2)"
    assert bound(6, leaders, masters=2, group_size=2, mine=(5, 6)).role(6) == \
        "worker in group 5,6, served by sub-master 2"
    assert bound(0, [1, 3], group_size=2).role(0) == \
        "master of worker groups led by ranks 1,3"
