#!/usr/bin/env python3
"""check_metrics.py PROM_FILE JSON_FILE -- parse emit_metrics' documents with
prometheus_client's text parser and Python's json, and check what they say.

Exit status: 0 good, 1 a check failed, 77 prometheus_client is missing (the
caller decides whether that is a skip)."""
import json
import math
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("check_metrics.py: python3 prometheus_client is not installed (Debian: python3-prometheus-client)")
    sys.exit(77)

NAMES = ['q"uote\\back', "line\nbreak \u00e4"]


def fail(msg):
    print("check_metrics.py: FAIL: " + msg)
    sys.exit(1)


def main(prom_path, json_path):
    with open(prom_path, encoding="utf-8") as f:
        text = f.read()
    families = {fam.name: fam for fam in text_string_to_metric_families(text)}
    # counters are reported without _total by the parser
    want = {"taskpool_accepted": "counter", "taskpool_retried": "counter", "taskpool_active": "gauge",
            "taskpool_workers_max": "gauge", "taskpool_queue_capacity": "gauge",
            "taskpool_max_per_user": "gauge", "taskpool_queue_wait_seconds": "histogram",
            "taskpool_run_seconds": "histogram", "taskpool_build_info": "gauge"}
    for name, typ in want.items():
        if name not in families:
            fail("family %s missing (have %s)" % (name, sorted(families)))
        if families[name].type != typ:
            fail("family %s has type %s, not %s" % (name, families[name].type, typ))
    bi = families["taskpool_build_info"].samples
    if len(bi) != 1 or bi[0].value != 1 or "version" not in bi[0].labels or "pool" in bi[0].labels:
        fail("taskpool_build_info: %r" % (bi,))
    for fam in families.values():
        if fam.name == "taskpool_build_info":
            continue
        pools = sorted({s.labels.get("pool") for s in fam.samples})
        if pools != sorted(NAMES):
            fail("family %s: pool labels %r, expected %r" % (fam.name, pools, NAMES))
    accepted = {s.labels["pool"]: s.value for s in families["taskpool_accepted"].samples}
    started = {s.labels["pool"]: s.value for s in families["taskpool_started"].samples}
    retried = {s.labels["pool"]: s.value for s in families["taskpool_retried"].samples}
    mpu = {s.labels["pool"]: s.value for s in families["taskpool_max_per_user"].samples}
    if accepted != {NAMES[0]: 40, NAMES[1]: 40}:
        fail("accepted: %r" % accepted)
    if mpu[NAMES[0]] != 2 or not math.isinf(mpu[NAMES[1]]):
        fail("max_per_user: %r" % mpu)
    for h in ("taskpool_queue_wait_seconds", "taskpool_run_seconds"):
        for pool in NAMES:
            s = [x for x in families[h].samples if x.labels["pool"] == pool]
            buckets = [(float(x.labels["le"]), x.value) for x in s if x.name == h + "_bucket"]
            count = [x.value for x in s if x.name == h + "_count"]
            total = [x.value for x in s if x.name == h + "_sum"]
            if len(count) != 1 or len(total) != 1 or len(buckets) < 2:
                fail("%s{pool=%r}: bucket/sum/count samples missing" % (h, pool))
            les = [b[0] for b in buckets]
            if les != sorted(les) or len(set(les)) != len(les) or not math.isinf(les[-1]):
                fail("%s{pool=%r}: le bounds not ascending to +Inf" % (h, pool))
            vals = [b[1] for b in buckets]
            if vals != sorted(vals):
                fail("%s{pool=%r}: cumulative counts decrease" % (h, pool))
            if vals[-1] != count[0]:
                fail("%s{pool=%r}: +Inf %s != _count %s" % (h, pool, vals[-1], count[0]))
            if count[0] != started[pool] + retried[pool]:
                fail("%s{pool=%r}: _count %s != started + retried %s" % (h, pool, count[0], started[pool] + retried[pool]))
            if total[0] < 0:
                fail("%s{pool=%r}: negative _sum" % (h, pool))
    with open(json_path, encoding="utf-8") as f:
        doc = json.load(f)
    if set(doc) != {"version", "pools"} or sorted(doc["pools"]) != sorted(NAMES):
        fail("JSON: keys %r, pools %r" % (sorted(doc), sorted(doc.get("pools", {}))))
    if doc["version"] != bi[0].labels["version"]:
        fail("JSON version %r != build_info version %r" % (doc["version"], bi[0].labels["version"]))
    for pool in NAMES:
        p = doc["pools"][pool]
        if p["accepted"] != 40 or p["workers_max"] != 2:
            fail("JSON pool %r: %r" % (pool, {k: p[k] for k in ("accepted", "workers_max")}))
        for h in ("queue_wait", "run"):
            b = p[h]["buckets"]
            if sum(c for _, c in b) != p[h]["count"] or p[h]["count"] != p["started"] + p["retried"]:
                fail("JSON pool %r %s: buckets %r, count %r" % (pool, h, b, p[h]["count"]))
            if [x for x, _ in b] != sorted(x for x, _ in b):
                fail("JSON pool %r %s: bounds not ascending" % (pool, h))
    if doc["pools"][NAMES[1]]["max_per_user"] is not None:
        fail("JSON: unlimited max_per_user is not null")
    print("check_metrics.py: prometheus_client and json parse both documents; %d families" % len(families))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
