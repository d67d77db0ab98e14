"""Time to 85% at 2 hosts: measured (the a_2_*.json accuracy runs) against the steps each run
took to reach it times table (a)'s analytic step (RESULTS.md, 2 x 1 rows; copied below), bare
and plus the step overhead the shared-memory accuracy runs show over the throughput runs'
shared-memory step (4.05 ms). The steps to 85% are measured: the model does not predict them.
Run here: python t85.py"""
import collections
import glob
import json
import statistics as st

ANALYTIC_MS = {  # table (a), 2 x 1, analytic column (1gbit, 10gbit)
    "data": (6.62, 3.96), "data+fp16": (4.37, 4.08), "data+topk": (4.44, 4.44),
    "data+powersgd": (4.32, 4.32), "partial": (3.89, 3.89), "localsgd": (4.25, 3.92),
    "gossip": (3.93, 3.93)}
SHM_THROUGHPUT_MS = 4.05

runs = collections.defaultdict(list)
for f in sorted(glob.glob("a_2_*.json")):
    for k, v in json.load(open(f))["accuracy"].items():
        runs[k].append(v)
shm = st.median(v["time_to_target_steps"] / v["step_to_target"] for v in runs["data/shm"]) * 1e3
over = shm - SHM_THROUGHPUT_MS
print(f"shared-memory accuracy runs: {shm:.2f} ms a step against {SHM_THROUGHPUT_MS} in the "
      f"throughput runs: {over:.2f} ms a step more")
print("| configuration | link | steps to 85% (runs) | measured s (median) | "
      "steps x analytic step s (error) | steps x (analytic + overhead) s (error) |")
print("|---|---|---|---|---|---|")
for conf, steps_ms in ANALYTIC_MS.items():
    for rate, a in zip(("1gbit", "10gbit"), steps_ms):
        vs = runs[f"{conf}/{rate}"]
        steps = [v["step_to_target"] for v in vs]
        m = st.median(v["time_to_target_steps"] for v in vs)
        p1 = st.median(s * a / 1e3 for s in steps)
        p2 = st.median(s * (a + over) / 1e3 for s in steps)
        print(f"| {conf} | {rate} | {'/'.join(map(str, steps))} | {m:.2f} | {p1:.2f} "
              f"({p1 / m - 1:+.1%}) | {p2:.2f} ({p2 / m - 1:+.1%}) |")
