#!/usr/bin/env python3
"""gen_inputs.py -- write random *structured* inputs for fuzz_pool.c.

libFuzzer mutates bytes; a scheduling bug often needs a whole scene (every
worker blocked, a few lanes filled, a gate opened at the right moment, then
more work). This writes such scenes at random, in the op encoding of
make_corpus.py, for the exact model to check start by start:

    python3 tests/fuzz/gen_inputs.py DIR [N [SEED]]
    build/tests/fuzz/fuzz_replay DIR

Each input: a pool made for the exact model (FIFO or fair, 1..3 workers,
prio_starve_limit 1, 2, 3, 16 or unlimited, sometimes low_prio_max_running,
retries and backoff), workers blocked on gates, then rounds of submits
(priorities, users, failing and blocking tasks, completion queues), weights,
cancels, gates opened and settles, and drains. Failing inputs can be added to
make_corpus.py (PENDING until their bug is fixed).
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_corpus import cancel, cq, create2, gate, group, gsubmit, lanes, settle, submit, weight  # noqa: E402

USERS = [None, "", "u0", "u1", "u2"]


def scene(rng):
    workers = rng.choice([1, 1, 1, 2, 3])
    sched = rng.choice(["fifo", "fair"])
    starve = rng.choice([1, 2, 3, 0, "unlimited"])
    low_max = rng.choice([0, 0, 0] + list(range(1, workers + 1)))
    retries = rng.choice([0, 0, 1, 2])
    ops = [create2(workers=workers, cap=8, name=True, mpu="unlimited", sched=sched, starve=starve,
                   low_max=low_max, retries=retries, retry=rng.choice([0, 1]),
                   backoff=rng.choice([0, 0, 2, 4]))]
    if sched == "fair":
        for u in rng.sample(USERS, rng.randint(0, 3)):
            ops.append(weight(user=u, w=rng.choice([1, 2, 3, 4])))
    open_gates = set()
    next_gate = 0
    # every worker blocked on gate 0 (some background, some not)
    for _ in range(workers):
        ops.append(submit(kind="ignore", gate=0, prio=rng.choice([0, 0, 1, -1, -2, 2])))
    ops.append(settle())
    for _ in range(rng.randint(1, 4)):
        for _ in range(rng.randint(1, 6)):
            kind = rng.choice(["succeed"] * 5 + ["fail", "flaky", "ignore", "gsleep", "gfd", "sleep", "self"])
            g = rng.randint(1, 3)
            kw = dict(kind=kind, prio=rng.choice([-2, -1, 0, 0, 0, 1, 1, 2]), user=rng.choice(USERS))
            if kind in ("ignore", "gsleep", "gfd"):
                kw["gate"] = g
            if kind in ("fail", "flaky", "self"):
                kw["res"] = 1
                kw["fail_k"] = rng.randint(1, 2)
            if rng.random() < 0.15:
                kw["cq"] = 0
            if rng.random() < 0.1:
                kw["dl"] = rng.choice(["past", "near", "far"])
            r = rng.random()
            if r < 0.1:
                ops.append(gsubmit(group=rng.randint(0, 1), **kw))
            else:
                if r < 0.2:
                    kw["via"] = rng.choice(["batch", "default"])
                ops.append(submit(**kw))
        for _ in range(rng.randint(0, 2)):
            r = rng.random()
            if r < 0.1:
                ops.append(group(op="cancel", group=rng.randint(0, 1)))
            elif r < 0.3:
                ops.append(cancel(sel=rng.randint(0, 4)))
            elif r < 0.5 and sched == "fair":
                ops.append(weight(user=rng.choice(USERS), w=rng.choice([1, 2, 3])))
            elif r < 0.7:
                ops.append(cq(op=rng.choice(["drain", "drain_all", "poll"]), arg=rng.randint(0, 3)))
        g = next_gate if next_gate not in open_gates else rng.randint(0, 3)
        ops.append(gate(g))
        open_gates.add(g)
        next_gate = min(next_gate + 1, 3)
        ops.append(settle())
        if rng.random() < 0.3:
            ops.append(lanes())
    ops.append(cq(op="drain_all"))
    return b"".join(ops)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    os.makedirs(out, exist_ok=True)
    for i in range(n):
        with open(os.path.join(out, "scene-%04d" % i), "wb") as f:
            f.write(scene(rng))
    print("wrote %d inputs to %s" % (n, out))


if __name__ == "__main__":
    main()
