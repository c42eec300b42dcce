#!/usr/bin/env python3
"""gen_inputs.py -- write random *structured* inputs for fuzz_pool.c.

libFuzzer mutates bytes; a scheduling bug often needs a whole scene (every
worker blocked, a few lanes filled, a gate opened at the right moment, then
more work). This writes such scenes at random, in the op encoding of
make_corpus.py, for the exact model to check start by start:

    python3 tests/fuzz/gen_inputs.py [--big] DIR [N [SEED]]
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
from make_corpus import (BIG_CAP, batch, burst, cancel, cq, create2, create3, gate, group, gsubmit,  # noqa: E402
                         lanes, settle, submit, weight)

USERS = [None, "", "u0", "u1", "u2"]


def scene(rng, big=False):
    """big: a queue of 40..64 places, filled by batches of 2..8, and now and
    then a burst of several submitting threads (without big, the scenes are
    what they were)."""
    workers = rng.choice([1, 1, 1, 2, 3])
    sched = rng.choice(["fifo", "fair"])
    starve = rng.choice([1, 2, 3, 0, "unlimited"])
    low_max = rng.choice([0, 0, 0] + list(range(1, workers + 1)))
    retries = rng.choice([0, 0, 1, 2])
    kw = dict(workers=workers, name=True, mpu="unlimited", sched=sched, starve=starve, low_max=low_max,
              retries=retries, retry=rng.choice([0, 1]), backoff=rng.choice([0, 0, 2, 4]))
    ops = [create3(cap=rng.choice(BIG_CAP), **kw) if big else create2(cap=8, **kw)]
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
            elif big and r < 0.7:
                kw.pop("dl", None)
                ops.append(batch(n=rng.randint(2, 8), **kw))
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
        if big and rng.random() < 0.2:
            ops.append(burst(threads=rng.randint(2, 4), workers=rng.randint(1, 3), fair=rng.random() < 0.5,
                             cap=rng.choice(BIG_CAP + [1, 2, 4, 8]), mpu=rng.choice([1, 2, 3, "unlimited"]),
                             retries=rng.randint(0, 2), seed=rng.randint(0, 65535)))
    ops.append(cq(op="drain_all"))
    return b"".join(ops)


def main():
    if len([a for a in sys.argv if a != "--big"]) < 2:
        sys.exit(__doc__)
    big = "--big" in sys.argv
    args = [a for a in sys.argv if a != "--big"]
    out = args[1]
    n = int(args[2]) if len(args) > 2 else 200
    rng = random.Random(int(args[3]) if len(args) > 3 else 1)
    os.makedirs(out, exist_ok=True)
    for i in range(n):
        with open(os.path.join(out, "scene-%04d" % i), "wb") as f:
            f.write(scene(rng, big))
    print("wrote %d inputs to %s" % (n, out))


if __name__ == "__main__":
    main()
