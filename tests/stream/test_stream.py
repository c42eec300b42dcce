#!/usr/bin/env python3
"""Process-level tests of taskpool-stream-worker against a real redis-server.

    test_stream.py --worker W --enqueue E --redis-server R SCENARIO

Every scenario starts its own redis-server on a unix socket in a temporary
directory, runs real worker processes with real signals, and checks the
streams afterwards: every entry id appears in the results or the dead stream,
the group's pending list is empty, and duplicates are counted. Every wait has
its own bound; children are always killed and reaped. Python standard library
only: Redis is spoken to with the tiny RESP client below.

Scenarios (one CTest test each):
  clean          3 workers, 5,000 entries from 50 users, nobody killed: no duplicate
  crash          the same, one worker SIGKILLed and one SIGTERMed and restarted;
                 the live workers delete the gone ones' consumers from the group
  redis_restart  Redis (appendonly yes, appendfsync always) SIGKILLed and
                 restarted mid-run: nothing lost, the workers reconnect
  fair           a slow user over MAX_PER_USER does not stall the others and
                 is not busy-retried; its entries waiting longer than CLAIM_IDLE
                 in the backlog are not claimed by a second, idle worker
  bad            malformed entries and a poison entry go to the dead stream with
                 a reason; the worker keeps running; invalid configuration -> exit 2
  drain          SIGTERM drains a running task (exit 0); a forced shutdown
                 (exit 1) leaves its entry pending, and another worker runs it
  ... and those of issue 20 and the metrics ones (see SCENARIOS below), then:
  priority       the exact start order of one worker: urgent entries before
                 queued normal ones, background last; PRIO_STARVE_LIMIT; an
                 urgent entry passes its user's held normal backlog, and so
                 does an entry that came due;
                 LOW_PRIO_MAX_RUNNING does not let background entries fill the
                 queue, and their users take turns
  fair_share     SCHED=fair: one user's burst delays another's single entry by
                 one round at most (SCHED=fifo, the control, by all of it),
                 also through the per-user backlog; USER_WEIGHTS
  backoff        RETRY_DELAY_MAX: the delays in the pool's log lines and the
                 records' times; a fixed delay without it
  sched_config   the scheduling variables: --help, exit 2 on bad values, the
                 started line; a bad `priority` field dead-lettered and
                 refused by taskpool-enqueue
  scheduled_restarts  a deferred entry outlives more crashes before its time
                 than MAX_DELIVERIES; an id ahead of the clock defers from the read
  backlog_restarts    an entry held in a backlog through restarts never ran:
                 each stop gives its delivery back
  cancelled_unrun     entries a forced shutdown cancels in the pool's queue
                 never ran: given back, the next worker runs them
  delivery_counts     exact counts per claimed entry, one record for a deleted
                 waiting entry, claims with a full timer heap, poison with a
                 future id still dies
  enqueue_edges  refused command lines, escaped names, partial adds, a wide
                 entry, --requeue-dead under a running worker and without a group
  wait_edges     --wait: each outcome as it comes, one stream for both, outcome
                 records trimmed before they were read (exit 5)
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SLOW = float(os.environ.get("TP_TEST_SLOWDOWN", "1"))


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def log(*a):
    print("test_stream:", *a, flush=True)


# ---------------------------------------------------------------- RESP client
class Redis:
    def __init__(self, path, timeout=10.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.buf = b""

    def close(self):
        self.s.close()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode("latin-1")
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError("bad RESP line %r" % line)

    def __call__(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode("latin-1")
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.s.sendall(b"".join(out))
        r = self._reply()
        if isinstance(r, RuntimeError):
            raise r
        return r


# ---------------------------------------------------------------- processes
class Env:
    """Owns the temporary directory, redis-server and every worker."""

    def __init__(self, args, name):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="tp-stream-%s-" % name)
        self.sock = os.path.join(self.dir, "redis.sock")
        self.url = "unix://" + self.sock
        self.redis = None
        self.redis_args = []
        self.procs = []
        self.logs = {}

    def start_redis(self, *extra):
        if extra:
            self.redis_args = list(extra)
        cmd = [self.args.redis_server, "--port", "0", "--unixsocket", self.sock, "--dir", self.dir,
               "--save", "", "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")] + self.redis_args
        self.redis = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15 * SLOW
        while True:
            check(self.redis.poll() is None, "redis-server exited at start (see %s/redis.log)" % self.dir)
            try:
                r = Redis(self.sock)
                if r("PING") == "PONG":
                    # AOF replay answers LOADING first
                    return r
            except RuntimeError as e:
                if str(e).startswith("NOAUTH"):  # up, with requirepass: the caller logs in
                    return r
            except (OSError, ConnectionError):
                pass
            check(time.monotonic() < deadline, "redis-server did not answer PING within 15 s")
            time.sleep(0.05)

    def kill_redis(self):
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait(timeout=10)
        self.redis = None

    def worker(self, name, connect=True, prog=None, **env):
        """Start a worker (prog: another build of it); return once it has
        connected (its group exists from then on: entries added earlier are
        not the group's when it starts at $), or, with connect=False, once it
        has started."""
        e = dict(os.environ)
        e.update({"REDIS_URL": self.url, "CLAIM_IDLE": "1s", "RETRY_DELAY": "10ms", "MAX_RETRIES": "2",
                  "WORKERS": "4", "QUEUE_CAPACITY": "32", "MAX_PER_USER": "2", "SHUTDOWN_TIMEOUT": "10s",
                  "CONSUMER": name, "METRICS_ADDR": "127.0.0.1:0"})
        e.update({k: str(v) for k, v in env.items()})
        path = os.path.join(self.dir, "%s.log" % name)
        out = open(path, "w")
        p = subprocess.Popen([prog or self.args.worker], env=e, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        p.name = name
        p.log = path
        self.procs.append(p)
        self.logs[name] = path
        # the first line says where the metrics are
        deadline = time.monotonic() + 15 * SLOW
        while True:
            with open(path, errors="replace") as f:
                first = f.readline()
            if '"msg":"started"' in first:
                import json
                p.metrics = json.loads(first).get("metrics_address")
                if not connect or '"msg":"connected"' in self.log_of(p):
                    return p
            check(p.poll() is None, "worker %s exited at start: %s" % (name, open(path).read()[-2000:]))
            check(time.monotonic() < deadline, "worker %s did not start and connect within 15 s" % name)
            time.sleep(0.02)

    def stop(self, p, sig=signal.SIGTERM, timeout=30):
        if p.poll() is None:
            p.send_signal(sig)
        try:
            return p.wait(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
            raise Fail("worker %s did not exit within %d s of %s" % (p.name, timeout, sig.name))

    def enqueue(self, *argv):
        e = dict(os.environ, REDIS_URL=self.url)
        r = subprocess.run([self.args.enqueue] + [str(a) for a in argv], env=e, capture_output=True,
                           text=True, timeout=120)
        check(r.returncode == 0, "taskpool-enqueue failed: %s" % r.stderr)
        log(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
        return r.stdout

    def run(self, prog, *argv, env=None, timeout=60):
        """Run a program to its end; (exit status, stdout, stderr). A program
        that does not end within `timeout` is killed and fails the test."""
        e = dict(os.environ, REDIS_URL=self.url)
        e.update(env or {})
        try:
            r = subprocess.run([prog] + [str(a) for a in argv], env=e, capture_output=True, text=True,
                               timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            raise Fail("%s %s did not exit within %d s" % (os.path.basename(prog), " ".join(map(str, argv)), timeout))
        return r.returncode, r.stdout, r.stderr

    def log_of(self, p):
        with open(p.log, errors="replace") as f:
            return f.read()

    def cleanup(self, ok):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.kill_redis()
        if not ok:
            for name, path in self.logs.items():
                try:
                    lines = open(path, errors="replace").read().splitlines()
                except OSError:
                    continue
                log("---- last lines of worker %s" % name)
                for line in lines[-15:]:
                    print("   ", line)
        shutil.rmtree(self.dir, ignore_errors=True)


def metrics(p):
    with urllib.request.urlopen("http://%s/metrics" % p.metrics, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v) if "." in v or "e" in v or "Inf" in v else int(v)
    return out


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout * SLOW
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Fail("timed out after %.0f s waiting for %s" % (timeout * SLOW, what))
        time.sleep(0.05)


# ---------------------------------------------------------------- stream checks
def entries(r, key):
    """[(entry id, {field: value})] of a whole stream."""
    out, start = [], "-"
    while True:
        batch = r("XRANGE", key, start, "+", "COUNT", 2000)
        if start != "-":
            batch = batch[1:]
        if not batch:
            return out
        for eid, flat in batch:
            out.append((eid, dict(zip(flat[0::2], flat[1::2]))))
        start = batch[-1][0]


def outcome_count(r):
    return r("XLEN", "tasks:done") + r("XLEN", "tasks:dead")


def pending(r):
    return r("XPENDING", "tasks", "taskpool")[0]


def accounted(r, expected):
    """Every expected id has an outcome and nothing is pending."""
    if outcome_count(r) < len(expected):
        return False
    seen = {f["id"] for _, f in entries(r, "tasks:done")} | {f["id"] for _, f in entries(r, "tasks:dead")}
    return expected <= seen and pending(r) == 0


def verify(r, expected):
    """Check the invariants; return (results, dead, duplicates)."""
    done = entries(r, "tasks:done")
    dead = entries(r, "tasks:dead")
    ids = [f["id"] for _, f in done] + [f["id"] for _, f in dead]
    missing = expected - set(ids)
    check(not missing, "%d entries have no outcome, e.g. %s" % (len(missing), sorted(missing)[:5]))
    check(pending(r) == 0, "the group's pending list is not empty: %r" % r("XPENDING", "tasks", "taskpool"))
    extra = set(ids) - expected
    check(not extra, "outcomes for entries never enqueued: %s" % sorted(extra)[:5])
    dups = len(ids) - len(set(ids))
    for _, f in dead:
        check(f.get("reason"), "a dead record without a reason: %r" % f)
    for _, f in done:
        check(int(f["attempts"]) >= 1 and f.get("consumer"), "a result without attempts/consumer: %r" % f)
    return done, dead, dups


def fail_always_ids(r):
    return {eid for eid, f in entries(r, "tasks") if f.get("fail") == "always"}


def check_fail_always(r, dead):
    want = fail_always_ids(r)
    got = {f["id"]: f["reason"] for _, f in dead}
    for eid in want:
        check(eid in got, "fail-always entry %s is not in the dead stream" % eid)
        check(got[eid].startswith("failed after 3 attempts"), "entry %s: reason %r" % (eid, got[eid]))
    return len(want)


def enqueue_5000(env):
    # 4,950 no-op-ish entries (50 of them failing always) and 50 failing once
    env.enqueue("--count", 4950, "--users", 50, "--work", "2ms", "--fail", "always", "--fail-every", 99)
    env.enqueue("--count", 50, "--users", 50, "--delay", "2ms", "--fail", "1")  # --delay: --work's alias


# ---------------------------------------------------------------- scenarios
def scenario_clean(env):
    r = env.start_redis()
    enqueue_5000(env)
    expected = {eid for eid, _ in entries(r, "tasks")}
    check(len(expected) == 5000, "expected 5000 entries")
    ws = [env.worker("w%d" % i) for i in range(3)]
    wait_until(lambda: accounted(r, expected), 90, "all 5000 outcomes")
    for w in ws:
        check(env.stop(w) == 0, "worker %s did not exit 0 after SIGTERM" % w.name)
    done, dead, dups = verify(r, expected)
    n_fail = check_fail_always(r, dead)
    log("clean: %d results, %d dead (%d fail always), duplicates %d" % (len(done), len(dead), n_fail, dups))
    check(dups == 0, "%d duplicates although no worker was killed" % dups)
    redelivered = [f for _, f in done + dead if f["deliveries"] != "1"]
    check(not redelivered, "entries delivered twice although no worker was killed: %r" % redelivered[:3])
    check(len(dead) == n_fail, "dead entries besides the fail-always ones")
    once = [f for _, f in done if f["attempts"] == "2"]
    check(len(once) == 50, "expected 50 results with attempts 2 (fail 1), got %d" % len(once))


def scenario_crash(env):
    r = env.start_redis()
    enqueue_5000(env)
    expected = {eid for eid, _ in entries(r, "tasks")}
    check(len(expected) == 5000, "expected 5000 entries")
    # slower entries so that the kills land mid-run
    ws = [env.worker("w%d" % i, WORKERS=2) for i in range(3)]
    wait_until(lambda: outcome_count(r) >= 800, 60, "800 outcomes")
    ws[0].kill()
    ws[0].wait(timeout=10)
    log("SIGKILLed w0 at %d outcomes" % outcome_count(r))
    wait_until(lambda: outcome_count(r) >= 1800, 60, "1800 outcomes")
    rc = env.stop(ws[1])
    log("SIGTERMed w1 at %d outcomes: exit %d" % (outcome_count(r), rc))
    check(rc == 0, "w1 did not drain (exit %d)" % rc)
    ws[1] = env.worker("w1b", WORKERS=2)
    wait_until(lambda: accounted(r, expected), 120, "all 5000 outcomes")
    # the consumers of the workers that are gone (w0, w1) are deleted from
    # the group by the live ones, once nothing is pending and they have been
    # idle 5 x CLAIM_IDLE; the live ones (reading every second) stay
    def consumers():
        return {c["name"]: c for c in (dict(zip(x[0::2], x[1::2]))
                                       for x in r("XINFO", "CONSUMERS", "tasks", "taskpool"))}
    wait_until(lambda: set(consumers()) == {"w1b", "w2"}, 30, "the consumers of w0 and w1 to be deleted")
    live = consumers()
    check(all(c["pending"] == 0 and c["idle"] < 5000 for c in live.values()), "live consumers: %r" % live)
    deleted = [n for w in ws[1:] for n in re.findall(r'"msg":"consumer_deleted","consumer":"([^"]*)"', env.log_of(w))]
    check(sorted(deleted) == ["w0", "w1"], "consumers deleted: %r" % deleted)
    for w in ws[1:]:
        check(env.stop(w) == 0, "worker %s did not exit 0 after SIGTERM" % w.name)
    done, dead, dups = verify(r, expected)
    n_fail = check_fail_always(r, dead)
    redelivered = sum(1 for _, f in done if int(f["deliveries"]) > 1)
    log("crash: %d results, %d dead (%d fail always), duplicates %d, results delivered more than once %d"
        % (len(done), len(dead), n_fail, dups, redelivered))
    check(any(f["consumer"] == "w1b" for _, f in done), "the restarted worker did nothing")
    check(redelivered > 0, "nothing of the killed worker was claimed and run elsewhere")


def scenario_redis_restart(env):
    r = env.start_redis("--appendonly", "yes", "--appendfsync", "always")
    env.enqueue("--count", 3000, "--users", 30, "--work", "3ms")
    expected = {eid for eid, _ in entries(r, "tasks")}
    ws = [env.worker("w%d" % i) for i in range(2)]
    wait_until(lambda: outcome_count(r) >= 600, 60, "600 outcomes")
    r.close()
    env.kill_redis()
    log("redis SIGKILLed")
    # every worker has seen Redis gone before it comes back (what the
    # reconnect check below counts on)
    wait_until(lambda: all(metrics(w)["tps_stream_connected"] == 0 for w in ws), 30, "workers to see Redis gone")
    r = env.start_redis()
    log("redis restarted with %d outcomes, %d pending" % (outcome_count(r), pending(r)))
    wait_until(lambda: accounted(r, expected), 120, "all 3000 outcomes after the restart")
    for w in ws:
        check(w.poll() is None, "worker %s died with Redis" % w.name)
        m = metrics(w)
        check(m["tps_stream_reconnects_total"] >= 1, "worker %s did not reconnect" % w.name)
        check(env.stop(w) == 0, "worker %s did not exit 0 after SIGTERM" % w.name)
    done, dead, dups = verify(r, expected)
    check(len(dead) == 0, "dead entries: %r" % dead[:3])
    log("redis_restart: %d results, duplicates %d" % (len(done), dups))


def scenario_fair(env):
    r = env.start_redis()
    r("XGROUP", "CREATE", "tasks", "taskpool", "0", "MKSTREAM")
    slow = [r("XADD", "tasks", "*", "user", "slow", "work", "500ms") for _ in range(20)]
    env.enqueue("--count", 200, "--users", 10, "--work", "2ms")
    fast = {eid for eid, f in entries(r, "tasks") if f.get("user") != "slow"}
    w = env.worker("w0", WORKERS=4, QUEUE_CAPACITY=16, MAX_PER_USER=2, LOCAL_BACKLOG=64, CLAIM_IDLE="2s")

    def fast_done():
        return fast <= {f["id"] for _, f in entries(r, "tasks:done")}

    saw_backlog = [0]
    other = []

    def fast_done_sampling():
        m = metrics(w)
        saw_backlog[0] = max(saw_backlog[0], m["tps_stream_backlog"])
        if saw_backlog[0] >= 1 and not other:
            # A second worker, idle most of the time: it must not claim the
            # slow user's entries waiting in w0's backlog longer than
            # CLAIM_IDLE (w0's heartbeat keeps them fresh).
            other.append(env.worker("w1", WORKERS=4, QUEUE_CAPACITY=16, MAX_PER_USER=2, LOCAL_BACKLOG=64,
                                    CLAIM_IDLE="2s"))
        return fast_done()

    wait_until(fast_done_sampling, 30, "the 200 entries of the fast users")
    slow_done = sum(1 for _, f in entries(r, "tasks:done") if f.get("user") == "slow")
    log("fair: fast users done while the slow user had %d of 20 done; backlog seen %d" % (slow_done, saw_backlog[0]))
    check(slow_done < 20, "the fast users finished only after the slow one")
    check(saw_backlog[0] >= 1, "the slow user's entries never waited in the local backlog")
    max_deliveries = [0]

    def slow_done_sampling():
        # Redis's own delivery counter of the entries w0 holds stays 1: nobody
        # (w1's claim, or w0's own) takes them while w0's heartbeat runs.
        for row in r("XPENDING", "tasks", "taskpool", "-", "+", 100):
            max_deliveries[0] = max(max_deliveries[0], int(row[3]))
        return accounted(r, set(slow) | fast)

    wait_until(slow_done_sampling, 60, "the slow user's entries")
    check(max_deliveries[0] == 1, "entries held by a live worker were claimed: %d deliveries" % max_deliveries[0])
    m = metrics(w)
    log("fair: rejected_user %d, user_waits %d" % (m["taskpool_rejected_user_total"], m["tps_stream_user_waits_total"]))
    # An entry refused for its user's limit waits for a completion of that
    # user; a busy retry during the ~5 s the slow user sits at its limit
    # would be refused thousands of times. Here: at most about once per entry.
    n_entries = len(slow) + len(fast)
    check(m["taskpool_rejected_user_total"] <= n_entries,
          "busy retry: %d refusals for %d entries" % (m["taskpool_rejected_user_total"], n_entries))
    check(m["tps_stream_user_waits_total"] >= 1, "no entry waited for a user slot")
    check(other, "the second worker never started")
    m1 = metrics(other[0])
    check(m1["tps_stream_claimed_total"] == 0,
          "w1 claimed %d entries from a live worker" % m1["tps_stream_claimed_total"])
    check(env.stop(w) == 0, "worker did not exit 0 after SIGTERM")
    check(env.stop(other[0]) == 0, "w1 did not exit 0 after SIGTERM")
    done, _, dups = verify(r, set(slow) | fast)
    check(dups == 0, "%d duplicates" % dups)
    check(all(f["consumer"] == "w0" and f["deliveries"] == "1" for _, f in done if f.get("user") == "slow"),
          "a slow entry was delivered twice or ran elsewhere")


def scenario_bad(env):
    r = env.start_redis()
    # A poison entry: already delivered 9 times to a consumer that vanished.
    r("XGROUP", "CREATE", "tasks", "taskpool", "0", "MKSTREAM")
    poison = r("XADD", "tasks", "*", "user", "p", "work", "1ms")
    r("XREADGROUP", "GROUP", "taskpool", "ghost", "COUNT", 1, "STREAMS", "tasks", ">")
    r("XCLAIM", "tasks", "taskpool", "ghost", 0, poison, "IDLE", 600000, "RETRYCOUNT", 9)
    bad = {
        r("XADD", "tasks", "*", "work", "abc"): "work:",
        r("XADD", "tasks", "*", "delay", "-5ms"): "work:",
        r("XADD", "tasks", "*", "work", "2h"): "work: over",
        r("XADD", "tasks", "*", "fail", "sometimes"): "fail:",
        r("XADD", "tasks", "*", "user", "x" * 200): "user:",
        r("XADD", "tasks", "*", "payload", "y" * 2000): "payload:",
        r("XADD", "tasks", "*", "work", "1ms", "delay", "2ms"): "work: repeated",
        r("XADD", "tasks", "*", "not_before", "soon"): "not_before:",
        r("XADD", "tasks", "*", "defer", "1s", "not_before", "1"): "not_before: give",
        r("XADD", "tasks", "*", "attempts", "0"): "attempts:",
        r("XADD", "tasks", "*", "fail", "always"): "failed after 3 attempts",
        poison: "delivered 10 times",
    }
    good = {r("XADD", "tasks", "*", "user", "g", "work", "1ms", "trace", "ignored") for _ in range(10)}
    w = env.worker("w0")
    wait_until(lambda: accounted(r, set(bad) | good), 30, "the bad and the good entries")
    check(w.poll() is None, "the worker died on bad input")
    # it keeps running: more work after the bad entries
    later = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(10)}
    wait_until(lambda: accounted(r, set(bad) | good | later), 30, "entries added after the bad ones")
    done, dead, dups = verify(r, set(bad) | good | later)
    reasons = {f["id"]: f["reason"] for _, f in dead}
    for eid, want in bad.items():
        check(eid in reasons, "bad entry %s is not in the dead stream" % eid)
        check(reasons[eid].startswith(want), "entry %s: reason %r, want %r..." % (eid, reasons[eid], want))
    check({f["id"] for _, f in done} == good | later, "good entries missing from the results")
    m = metrics(w)
    check(m["tps_stream_malformed_total"] == 10, "malformed counter %d" % m["tps_stream_malformed_total"])
    check(m["tps_stream_dead_total"] == 12 and m["tps_stream_claimed_total"] == 1, "dead/claimed counters")
    check(m["taskpool_completed_total"] >= 21, "pool counters missing from /metrics")
    check(env.stop(w) == 0, "worker did not exit 0 after SIGTERM")
    log("bad: reasons %s" % sorted(set(reasons.values())))

    # invalid configuration: one line on stderr, exit 2
    for var, val in [("CLAIM_IDLE", "soon"), ("REDIS_URL", "http://x"), ("WORKERS", "0"),
                     ("MAX_DELIVERIES", "-1"), ("METRICS_ADDR", "nope"), ("LOG_LEVEL", "loud")]:
        e = dict(os.environ, REDIS_URL=env.url)
        e[var] = val
        p = subprocess.run([env.args.worker], env=e, capture_output=True, text=True, timeout=30)
        check(p.returncode == 2, "%s=%s: exit %d, want 2" % (var, val, p.returncode))
        check(len(p.stderr.strip().splitlines()) == 1 and var in p.stderr, "%s=%s: stderr %r" % (var, val, p.stderr))


def scenario_drain(env):
    r = env.start_redis()
    # 1. SIGTERM while a task runs: it finishes, is written, exit 0.
    w = env.worker("a", SHUTDOWN_TIMEOUT="10s")
    e1 = r("XADD", "tasks", "*", "work", "1s")
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "the task to start")
    check(env.stop(w) == 0, "drain: exit code not 0")
    check(accounted(r, {e1}), "drain: the running task's outcome was not written")
    # 2. forced: the budget is shorter than the task; the entry stays pending.
    w = env.worker("b", SHUTDOWN_TIMEOUT="200ms")
    e2 = r("XADD", "tasks", "*", "work", "3s")
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "the long task to start")
    check(env.stop(w) == 1, "forced shutdown: exit code not 1")
    check(pending(r) == 1 and outcome_count(r) == 1, "forced shutdown: the entry was acknowledged")
    # 3. another worker claims it after CLAIM_IDLE and runs it.
    w = env.worker("c", CLAIM_IDLE="300ms")
    wait_until(lambda: accounted(r, {e1, e2}), 20, "the abandoned entry to run elsewhere")
    check(env.stop(w) == 0, "worker c: exit code not 0")
    done, _, dups = verify(r, {e1, e2})
    last = [f for _, f in done if f["id"] == e2][0]
    check(last["consumer"] == "c" and last["deliveries"] == "2", "claimed result: %r" % last)
    check(dups == 0, "duplicates")


# ---------------------------------------------------------------- issue 20: bugs
def scenario_outcome_key(env):
    """An outcome is never acknowledged unless its record was written: the
    results key turned into a string while entries run leaves them pending,
    the worker says so with the server's error, and writes them once the key
    is a stream again."""
    r = env.start_redis()
    w = env.worker("w0", WORKERS=10, QUEUE_CAPACITY=10)
    ids = {r("XADD", "tasks", "*", "delay", "3s") for _ in range(10)}  # delay: work's alias
    wait_until(lambda: metrics(w)["taskpool_started_total"] == 10, 10, "the 10 entries to start")
    r("DEL", "tasks:done")
    r("SET", "tasks:done", "oops")
    check(metrics(w)["taskpool_succeeded_total"] == 0, "setup: an entry ended before the key changed")
    wait_until(lambda: metrics(w)["taskpool_succeeded_total"] == 10, 20, "the 10 tasks to end")
    wait_until(lambda: "outcome_write_failed" in env.log_of(w), 10, "outcome_write_failed in the log")
    m = metrics(w)
    check(m["tps_stream_acked_total"] == 0,
          "%d entries acknowledged while no outcome could be written" % m["tps_stream_acked_total"])
    check(pending(r) == 10, "pending %d, want 10 (unacknowledged)" % pending(r))
    check(r("XLEN", "tasks:dead") == 0, "records in the dead stream")
    check("WRONGTYPE" in env.log_of(w), "the server's error text is not in the log")
    check(m["tps_stream_write_failures_total"] >= 1, "write_failures not counted")
    check(m["tps_stream_unwritten"] == 10, "unwritten gauge %d, want 10" % m["tps_stream_unwritten"])
    # No new read while outcomes cannot be written (an XREADGROUP already
    # waiting in Redis when the first batch was refused may still deliver).
    extra = {r("XADD", "tasks", "*", "work", "1ms")}
    failures = metrics(w)["tps_stream_write_failures_total"]
    wait_until(lambda: metrics(w)["tps_stream_write_failures_total"] > failures, 10, "a retry of the batch")
    read = metrics(w)["tps_stream_read_total"]
    extra.add(r("XADD", "tasks", "*", "work", "1ms"))
    failures = metrics(w)["tps_stream_write_failures_total"]
    wait_until(lambda: metrics(w)["tps_stream_write_failures_total"] > failures, 10, "another retry of the batch")
    check(metrics(w)["tps_stream_read_total"] == read, "an entry was read while outcomes could not be written")
    r("DEL", "tasks:done")
    wait_until(lambda: accounted(r, ids | extra), 20, "the outcomes once the key is a stream again")
    wait_until(lambda: "outcome_write_recovered" in env.log_of(w), 10, "an outcome_write_recovered line")
    check(env.stop(w) == 0, "worker did not exit 0")
    done, dead, dups = verify(r, ids | extra)
    check(len(dead) == 0 and dups == 0, "dead %d, duplicates %d" % (len(dead), dups))

    # The records are written but XACK is refused (an ACL user without it):
    # the entries stay pending, the records are not written again while the
    # XACK is retried, and they are acknowledged once it is allowed.
    for key in ("tasks", "tasks:done"):
        r("DEL", key)
    r("ACL", "SETUSER", "noack", "on", ">pw", "~tasks*", "resetchannels", "-@all", "+@stream", "-xack", "+type",
      "+eval")
    w = env.worker("noack", REDIS_URL="unix://noack:pw@" + env.sock)
    # in one transaction, so that one read takes all five (reading stops at
    # the first refusal)
    r("MULTI")
    for _ in range(5):
        r("XADD", "tasks", "*", "work", "1ms")
    r("XADD", "tasks", "*", "work", "1ms", "fail", "always")  # a dead record: the outcome script
    ids = set(r("EXEC"))
    wait_until(lambda: r("XLEN", "tasks:done") == 5, 10, "the 5 records")
    wait_until(lambda: metrics(w)["tps_stream_write_failures_total"] >= 2, 10, "two refused acknowledgements")
    wait_until(lambda: "may not run XACK" in env.log_of(w), 10, "the outcome script's refusal")
    check("NOPERM" in env.log_of(w), "the server's NOPERM is not in the log")
    check(pending(r) == 6 and metrics(w)["tps_stream_acked_total"] == 0, "acknowledged without XACK")
    check(r("XLEN", "tasks:done") == 5, "records written again while only the XACK was refused")
    check(r("XLEN", "tasks:dead") == 0, "dead records written while the XACK is refused (the outcome script "
          "checks first: it wrote them, then failed at the XACK, at every retry)")
    r("ACL", "SETUSER", "noack", "+xack")
    wait_until(lambda: accounted(r, ids), 20, "the acknowledgements once XACK is allowed")
    check(env.stop(w) == 0, "noack: worker did not exit 0")
    fence = [line for line in env.log_of(w).splitlines() if '"msg":"lost_write_fence_unavailable"' in line]
    check(len(fence) == 1 and "NOPERM" in fence[0],
          "noack (no CLIENT ID permission): lost_write_fence_unavailable lines %r, want one with NOPERM" % fence)
    done, dead, dups = verify(r, ids)
    check(len(done) == 5 and len(dead) == 1 and dups == 0,
          "noack: %d results, %d dead, %d duplicates" % (len(done), len(dead), dups))

    # A deleted entry pending under the worker's name while XACK is refused:
    # the scripts that record deleted entries check the permission before
    # they write (they wrote the record, then failed at the XACK, and every
    # claim wrote one more), and record it once XACK is allowed.
    r("ACL", "SETUSER", "noack", "-xack")
    gone = r("XADD", "tasks", "*", "work", "1ms")
    r("XREADGROUP", "GROUP", "taskpool", "noack2", "COUNT", 1, "STREAMS", "tasks", ">")
    check(r("XDEL", "tasks", gone) == 1, "XDEL")
    w = env.worker("noack2", REDIS_URL="unix://noack:pw@" + env.sock, CLAIM_IDLE="300ms")
    time.sleep(2)  # about a dozen claims (one per 150 ms) pass the entry
    check(r("XLEN", "tasks:dead") == 1, "%d dead records written while XACK is refused" %
          (r("XLEN", "tasks:dead") - 1))
    check(pending(r) == 1, "the deleted entry is not pending any more")
    r("ACL", "SETUSER", "noack", "+xack")
    wait_until(lambda: accounted(r, ids | {gone}), 10, "the deleted entry's record once XACK is allowed")
    time.sleep(0.5)  # a second record, if any, comes with the next claim
    check(dead_reasons(r).get(gone) == "entry deleted before it ran", "its record: %r" % dead_reasons(r))
    check(r("XLEN", "tasks:dead") == 2, "%d dead records, want 2 (the failed one's, the deleted one's)" %
          r("XLEN", "tasks:dead"))
    check(env.stop(w) == 0, "noack2: worker did not exit 0")


def scenario_trimmed_pending(env):
    """Pending entries deleted by XTRIM before they ran get a dead record
    each: a dead consumer's, and an earlier process's of the worker's name
    (also while the worker's pool is full)."""
    r = env.start_redis()
    r("XGROUP", "CREATE", "tasks", "taskpool", "0", "MKSTREAM")
    ids = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(20)}
    r("XREADGROUP", "GROUP", "taskpool", "ghost", "COUNT", 100, "STREAMS", "tasks", ">")
    check(pending(r) == 20, "setup: 20 pending for the dead consumer")
    r("XTRIM", "tasks", "MAXLEN", 0)
    w = env.worker("w0", CLAIM_IDLE="300ms")
    wait_until(lambda: accounted(r, ids), 15, "a dead record for each of the 20 deleted entries")
    done, dead, dups = verify(r, ids)
    check(len(done) == 0 and len(dead) == 20 and dups == 0, "done %d dead %d dups %d" % (len(done), len(dead), dups))
    check(all(f["reason"] == "entry deleted before it ran" for _, f in dead), "reasons: %r" % dead[:2])
    m = metrics(w)
    check(m["tps_stream_deleted_total"] == 20 and m["tps_stream_dead_total"] == 20,
          "deleted %d dead %d" % (m["tps_stream_deleted_total"], m["tps_stream_dead_total"]))
    check(m["tps_stream_ack_missed_total"] == 0, "deleted entries counted as duplicates")
    check(env.stop(w) == 0, "worker did not exit 0")

    # 100 entries of an earlier process of the worker's own name, trimmed:
    # the claim leaves them to the hold script, each noted while a read is
    # in flight (it may be in that read's reply) and recorded once a read
    # has ended -- more than the 64 the worker notes at a time, and a claim
    # of 1 (a pool of one, queue 1), so the claims go round the pending list
    # slower than reads end (a full table that dropped its settled ids
    # instead of settling them left all 100 pending).
    ids2 = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(100)}
    r("XREADGROUP", "GROUP", "taskpool", "w1", "COUNT", 200, "STREAMS", "tasks", ">")
    r("XTRIM", "tasks", "MAXLEN", 0)
    check(pending(r) == 100, "setup: 100 pending for w1")
    w = env.worker("w1", CLAIM_IDLE="300ms", WORKERS=1, QUEUE_CAPACITY=1)
    wait_until(lambda: accounted(r, ids | ids2), 40, "a dead record for each of w1's 100 deleted entries")
    done, dead, dups = verify(r, ids | ids2)
    check(len(dead) == 120 and dups == 0, "dead %d dups %d" % (len(dead), dups))
    m = metrics(w)
    check(m["tps_stream_deleted_total"] == 100 and m["tps_stream_dead_total"] == 100,
          "w1: deleted %d dead %d" % (m["tps_stream_deleted_total"], m["tps_stream_dead_total"]))
    check(env.stop(w) == 0, "worker w1 did not exit 0")

    # 3 more of an earlier w2, trimmed. w2's claims note them, one a claim,
    # while its read is in flight; that read then brings 2 long entries that
    # fill its pool (one worker, queue 1), so no claim runs for a minute: the
    # heartbeat records the noted one meanwhile (before, it waited for room).
    # (If the read times out first, its 1 s BLOCK, the noted one is recorded
    # before the pool fills: the part passes without proving the point.)
    own = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(3)}
    r("XREADGROUP", "GROUP", "taskpool", "w2", "COUNT", 10, "STREAMS", "tasks", ">")
    r("XTRIM", "tasks", "MAXLEN", 0)
    dead0 = r("XLEN", "tasks:dead")
    w = env.worker("w2", CLAIM_IDLE="300ms", WORKERS=1, QUEUE_CAPACITY=1, MAX_PER_USER=2)
    wait_until(lambda: '"own_deleted"' in env.log_of(w), 10, "w2's claim finds an own deleted entry")
    long_ids = {r("XADD", "tasks", "*", "work", "60s") for _ in range(2)}
    wait_until(lambda: all(pending_count(r, i) > 0 for i in long_ids), 10, "w2 holds both long entries")
    wait_until(lambda: r("XLEN", "tasks:dead") > dead0, 15, "w2's noted entry recorded while its pool is full")
    ended = {f["id"] for _, f in entries(r, "tasks:done")} & long_ids
    check(not ended and all(pending_count(r, i) > 0 for i in long_ids), "w2's long entries ended: %r" % ended)
    recs = [f["id"] for _, f in entries(r, "tasks:dead")][dead0:]
    check(set(recs) <= own and len(recs) == len(set(recs)), "w2's dead records: %r" % recs)
    w.kill()
    w.wait(timeout=10)


def send_packet(r, cmds):
    """Send `cmds` in one write: Redis runs them with no other client's
    command in between (the replies are left to read)."""
    r.s.sendall(b"".join(b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in c)
                         for c in cmds))


def delete_then_sleep(r, *ids):
    """XDEL of `ids`, then DEBUG SLEEP 8 (longer than a worker's 5 s command
    timeout), in one pipeline: no worker command runs between the two."""
    send_packet(r, [("XDEL", "tasks") + ids, ("DEBUG", "SLEEP", "8")])
    check(r._reply() == len(ids) and r._reply() == "OK", "XDEL, DEBUG SLEEP")


def scenario_deleted_held(env):
    """Entries deleted from the stream while a live worker holds them (four
    waiting for their time, one in the pool's queue) get one record each,
    though a peer's claim passes them every 150 ms: the claim leaves a live
    holder's entries alone, deleted or not, and the holder, whose heartbeat
    finds them deleted, writes their records. (Redis 7's XAUTOCLAIM drops
    every deleted pending entry it passes, whoever holds it: the peer wrote a
    dead record and the holder its own, each time the peer's sweep came
    before the holder's heartbeat; so the entries are deleted one at a time.)
    The holder's pool is full, so that it makes no claim of its own.
    (b) A heartbeat whose reply is lost (Redis ran it) leaves no deleted
    entry without its record, (c) nor does a claim's; (d) a running entry
    deleted while Redis stalls gets one record, its result, whether the
    heartbeat or the worker's own claim comes first after the stall; (e) so
    does one deleted while the read that delivered it waits unread."""
    r = env.start_redis("--enable-debug-command", "yes")
    cfg = dict(CLAIM_IDLE="300ms", WORKERS=1, QUEUE_CAPACITY=1, MAX_PER_USER=1)
    w0 = env.worker("w0", **cfg)
    waiting = [r("XADD", "tasks", "*", "user", "s", "work", "1ms", "defer", "3s") for _ in range(4)]
    a1 = r("XADD", "tasks", "*", "user", "a1", "work", "3s")
    a2 = r("XADD", "tasks", "*", "user", "a2", "work", "3s")
    every = set(waiting) | {a1, a2}

    def held_by_w0():
        rows = r("XPENDING", "tasks", "taskpool", "-", "+", 10)
        return len(rows) == 6 and all(row[1] == "w0" for row in rows) and metrics(w0)["tps_stream_waiting"] == 4

    wait_until(held_by_w0, 10, "w0 to hold the six entries, four in its timer heap")
    w1 = env.worker("w1", **cfg)
    time.sleep(1.0)  # w1's claims run (the first one claim_idle after it connected, then every 150 ms)
    for eid in waiting + [a2]:
        check(r("XDEL", "tasks", eid) == 1, "XDEL")
        time.sleep(0.07)
    wait_until(lambda: accounted(r, every), 20, "an outcome for each entry")
    time.sleep(0.5)  # a second record, if any, comes within a heartbeat or a claim
    done, dead, dups = verify(r, every)
    check(dups == 0, "duplicates %d: done %r dead %r" % (dups, done, dead))
    reasons = {f["id"]: f["reason"] for _, f in dead}
    check(all(reasons.get(e) == "entry deleted before it ran" for e in waiting),
          "the waiting entries' records: %r" % dead)
    check({f["id"] for _, f in done} >= {a1}, "a1 did not run: %r" % done)
    m0, m1 = metrics(w0), metrics(w1)
    check(m0["tps_stream_deleted_total"] == 4 and m1["tps_stream_deleted_total"] == 0,
          "deleted counted: w0 %d w1 %d" % (m0["tps_stream_deleted_total"], m1["tps_stream_deleted_total"]))
    check(m1["tps_stream_claimed_total"] == 0, "w1 claimed a live worker's entries")
    check(m0["tps_stream_ack_missed_total"] == 0, "the deleted entry that ran counted as a duplicate")
    for w in (w0, w1):
        check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)
    check(verify(r, every)[2] == 0, "a duplicate written at the stop")

    # (b) The heartbeat's reply is lost after Redis ran it: Redis sleeps 8 s
    # (DEBUG SLEEP, longer than the worker's 5 s command timeout) right after
    # the deletions, so the heartbeat sent meanwhile times out and the worker
    # reconnects, while Redis then runs it and acknowledges the deleted
    # entries. Those held (one waiting for its time, one in the backlog behind
    # its user's blocker) still get their records, once: the waiting one's is
    # written by the script itself, before the worker stops (the entry is
    # due only later), the backlog one's when it runs. The pool is full (a
    # blocker runs, a filler waits), so that the heartbeat is the command that
    # times out (a claim or a read would be, with room).
    h = env.worker("h0", CLAIM_IDLE="3s", WORKERS=1, QUEUE_CAPACITY=1, MAX_PER_USER=1)
    sched = r("XADD", "tasks", "*", "work", "1ms", "defer", "60s")
    blocker = r("XADD", "tasks", "*", "user", "u", "work", "4s")
    held = r("XADD", "tasks", "*", "user", "u", "work", "1ms")
    filler = r("XADD", "tasks", "*", "user", "v", "work", "4s")
    wait_until(lambda: metrics(h)["tps_stream_waiting"] == 1 and metrics(h)["tps_stream_backlog"] == 1 and
               metrics(h)["taskpool_queued"] == 1, 10, "h0 to hold one entry until its time, one in its backlog "
               "and one in its queue")
    every |= {sched, blocker, filler, held}
    delete_then_sleep(r, sched, held)
    wait_until(lambda: '"reason":"heartbeat"' in env.log_of(h), 10, "h0's heartbeat to time out")
    wait_until(lambda: accounted(r, every), 30, "an outcome for each entry")
    time.sleep(0.5)
    done, dead, dups = verify(r, every)
    check(dups == 0, "duplicates %d: done %r dead %r" % (dups, done, dead))
    check(dead_reasons(r).get(sched) == "entry deleted before it ran", "the waiting entry: %r" % dead)
    check(env.stop(h) == 0, "worker h0 did not exit 0")
    check(verify(r, every)[2] == 0, "a duplicate written at the stop")

    # (c) A claim's reply is lost the same way: an entry of a consumer that
    # never comes back, and one of an earlier process of this worker's name,
    # are deleted, then Redis sleeps; the claim sent meanwhile (the worker
    # holds nothing, so nothing else is sent) times out and runs later. Its
    # script writes the first one's dead record itself, and leaves the
    # second pending (this worker's name): the next claim lists it again,
    # and the hold script records it.
    mine = r("XADD", "tasks", "*", "work", "1ms")
    r("XREADGROUP", "GROUP", "taskpool", "k0", "COUNT", 1, "STREAMS", "tasks", ">")  # no worker runs now
    k = env.worker("k0", CLAIM_IDLE="3s")
    ghost = r("EVAL", GHOST, 1, "tasks", 1, "work", "1ms")
    every |= {ghost, mine}
    delete_then_sleep(r, ghost, mine)
    wait_until(lambda: '"reason":"claiming"' in env.log_of(k), 10, "k0's claim to time out")
    wait_until(lambda: accounted(r, every), 15, "the deleted entries' records")
    check(all(dead_reasons(r).get(e) == "entry deleted before it ran" for e in (ghost, mine)),
          "the deleted entries' records: %r" % dead_reasons(r))
    check(env.stop(k) == 0, "worker k0 did not exit 0")
    check(verify(r, every)[2] == 0, "duplicates")

    # (d) A running entry is deleted and Redis stalls (DEBUG SLEEP 2) longer
    # than CLAIM_IDLE (1 s), in one transaction: the worker's command that
    # Redis runs first after the sleep is its heartbeat or its own claim,
    # which sees the entry idle 2 s (it recorded it dead, and the slot wrote
    # its result too: two records, whenever the claim came first). Which one
    # it is varies from try to try (four tries, at different moments of the
    # heartbeat's and the claim's periods); either way the entry's one
    # record is now its slot's result: the claim leaves the worker's own
    # entries to the hold script, which acknowledges it for the slot.
    s0 = env.worker("s0", CLAIM_IDLE="1s", WORKERS=4)
    tries = []
    for t in range(4):
        eid = r("XADD", "tasks", "*", "work", "4s")
        tries.append(eid)
        wait_until(lambda: metrics(s0)["taskpool_started_total"] == t + 1, 10, "entry %d to start" % t)
        time.sleep(0.1 + 0.13 * t)
        r("MULTI")
        r("XDEL", "tasks", eid)
        r("DEBUG", "SLEEP", "2")
        check(r("EXEC") == [1, "OK"], "XDEL, DEBUG SLEEP")
    every |= set(tries)
    wait_until(lambda: accounted(r, every), 20, "an outcome for each deleted running entry")
    wait_until(lambda: metrics(s0)["taskpool_active"] == 0 and metrics(s0)["tps_stream_held"] == 0, 20,
               "s0's tasks to end and their slots to be freed")
    time.sleep(0.5)  # a second record, if any, comes within a heartbeat or a claim
    done, dead, dups = verify(r, every)
    check(dups == 0, "duplicates %d: done %r dead %r" % (dups, done, dead))
    mine = [f for _, f in done if f["id"] in tries]
    check(len(mine) == 4 and all(f["consumer"] == "s0" for f in mine),
          "the running entries' records are not their results: done %r dead %r" % (done, dead))
    m = metrics(s0)
    check(m["tps_stream_succeeded_total"] == 4 and m["tps_stream_dead_total"] == 0 and
          m["tps_stream_ack_missed_total"] == 0, "s0 counted succeeded %d dead %d ack_missed %d" %
          (m["tps_stream_succeeded_total"], m["tps_stream_dead_total"], m["tps_stream_ack_missed_total"]))
    check('"outcome_dropped"' not in env.log_of(s0), "an outcome dropped")
    log("deleted_held (d): the worker's own claim found %d of the 4 first" %
        sum(int(x) for x in re.findall(r'"msg":"own_deleted","count":"(\d+)"', env.log_of(s0))))
    check(env.stop(s0) == 0, "worker s0 did not exit 0")
    check(verify(r, every)[2] == 0, "a duplicate written at the stop")

    # (e) An entry a read delivers, deleted, then Redis stalls 3 s (longer
    # than CLAIM_IDLE), all in one packet: the read's reply waits unread in
    # the worker's socket while its claim, sent during the stall, runs first
    # and finds the entry pending as the worker's, idle and in no slot. It
    # is left for a claim after the read has ended (before, the claim's
    # follow-up recorded it dead and the read then ran it: two records, each
    # time); one record, the result.
    e0 = env.worker("e0", CLAIM_IDLE="1s")
    tries = set()
    for t in range(3):
        time.sleep(1.3)  # the worker's read waits again, and a claim is due during the stall
        eid = "%d-0" % (int(time.time() * 1000) + 10)
        tries.add(eid)
        send_packet(r, [("XADD", "tasks", eid, "work", "1ms"), ("XDEL", "tasks", eid), ("DEBUG", "SLEEP", "3")])
        check(r._reply() == eid and r._reply() == 1 and r._reply() == "OK", "XADD, XDEL, DEBUG SLEEP")
    every |= tries
    wait_until(lambda: accounted(r, every), 20, "an outcome for each entry deleted behind a read")
    time.sleep(1.5)  # a second record, if any, comes with the next claims
    done, dead, dups = verify(r, every)
    check(dups == 0, "duplicates %d: done %r dead %r" % (dups, done, dead))
    check({f["id"] for _, f in done if f["consumer"] == "e0"} >= tries, "not the results: %r %r" % (done, dead))
    m = metrics(e0)
    check(m["tps_stream_succeeded_total"] == 3 and m["tps_stream_dead_total"] == 0 and
          m["tps_stream_ack_missed_total"] == 0, "e0 counted succeeded %d dead %d ack_missed %d" %
          (m["tps_stream_succeeded_total"], m["tps_stream_dead_total"], m["tps_stream_ack_missed_total"]))
    check(env.stop(e0) == 0, "worker e0 did not exit 0")
    check(verify(r, every)[2] == 0, "a duplicate written at the stop")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The README's ACL for the worker and the producer (Authentication and TLS),
# exactly: the auth scenario runs both as a user with these rules and no more.
README_ACL = "~<stream>* -@all +@stream +type +eval"
README_ACL_FENCE = "+client|id +client|kill +info"


def check_wait_trimmed(env, w, r, url, timeout, what):
    """300 entries with --wait --timeout `timeout`, the producer stopped while
    worker w (RESULTS_MAXLEN=10) writes every outcome: MAXLEN ~ 10 trims most
    records before --wait reads them. It must exit 5 with those "unknown" and
    none "missing", not wait until its timeout."""
    p = subprocess.Popen([env.args.enqueue, "--count", "300", "--work", "1ms", "--wait", "--timeout", timeout],
                         env=dict(os.environ, REDIS_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        check('"msg":"enqueued"' in line, "enqueue: %r" % line)
        p.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: metrics(w)["tps_stream_succeeded_total"] >= 300 and pending(r) == 0, 30,
                       "the worker to finish the 300")
        finally:
            p.send_signal(signal.SIGCONT)
        rest, err = p.communicate(timeout=40 * SLOW)
        rc = p.returncode
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    summary = json.loads(rest.strip().splitlines()[-1])
    check(rc == 5 and summary["missing"] == 0 and summary["unknown"] > 0 and
          summary["succeeded"] + summary["unknown"] == 300,
          "%s, trimmed outcomes: exit %d %r %s" % (what, rc, summary, err[-300:]))


def scenario_auth(env):
    """requirepass and an ACL user: credentials in the URL (percent-encoded),
    REDIS_PASSWORD, and the server's own error text when they are wrong. The
    ACL user has exactly the README's rules, and with them a lost reply
    (DEBUG SLEEP while a result is written) still writes one record: the
    worker's search for its own records runs under them; --wait tells
    outcome records trimmed before it read them (exit 5); and Redis's ACL
    LOG shows no command of the worker or the producer refused."""
    port = free_port()
    env.start_redis("--requirepass", "pw0", "--port", str(port), "--bind", "127.0.0.1",
                    "--enable-debug-command", "yes")
    r = Redis(env.sock)
    r("AUTH", "pw0")
    readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")).read()
    readme = re.sub(r"\s+", " ", readme)
    for rules in (README_ACL, README_ACL_FENCE):
        check("`%s`" % rules in readme, "the README does not list the ACL rules `%s` any more" % rules)
    # the commands the README lists for an ACL user of the worker and producer
    r("ACL", "SETUSER", "tpworker", "on", ">tp@secret", "~tasks*", "resetchannels",
      *(README_ACL.split()[1:] + README_ACL_FENCE.split()))
    sock = env.sock

    # 1. no password: NOAUTH from the server, not a "wrong key type"
    w = env.worker("noauth", connect=False, REDIS_URL="unix://" + sock)
    wait_until(lambda: "NOAUTH" in env.log_of(w), 10, "NOAUTH in the log")
    check("wrong_key_type" not in env.log_of(w), "misleading wrong_key_type line")
    check(metrics(w)["tps_stream_connected"] == 0, "connected without a password")
    env.stop(w)
    # 2. a wrong password: WRONGPASS, and the password is not in the log
    w = env.worker("wrong", connect=False, REDIS_URL="unix://:nope-xyz@" + sock)
    wait_until(lambda: "WRONGPASS" in env.log_of(w), 10, "WRONGPASS in the log")
    check("nope-xyz" not in env.log_of(w), "the password appears in the log")
    env.stop(w)
    # 3. password in the URL, default user
    url = "unix://:pw0@" + sock
    w = env.worker("url", REDIS_URL=url)
    rc, out, err = env.run(env.args.enqueue, "--count", 20, "--wait", "--timeout", "20s", env={"REDIS_URL": url})
    check(rc == 0, "enqueue with the URL's password: exit %d %s" % (rc, err))
    check("pw0" not in env.log_of(w), "the password appears in the log")
    env.stop(w)
    # 4. REDIS_PASSWORD, and both at once refused
    w = env.worker("envpw", REDIS_URL="unix://" + sock, REDIS_PASSWORD="pw0")
    rc, out, err = env.run(env.args.enqueue, "--count", 20, "--wait", "--timeout", "20s",
                           env={"REDIS_URL": "unix://" + sock, "REDIS_PASSWORD": "pw0"})
    check(rc == 0, "enqueue with REDIS_PASSWORD: exit %d %s" % (rc, err))
    env.stop(w)
    rc, out, err = env.run(env.args.worker, env={"REDIS_URL": url, "REDIS_PASSWORD": "pw0"})
    check(rc == 2 and "REDIS_PASSWORD" in err and "pw0" not in err, "both passwords: exit %d %r" % (rc, err))
    # 5. the ACL user over TCP, '@' in its password percent-encoded, TRIM_DONE on
    acl = "redis://tpworker:tp%%40secret@127.0.0.1:%d" % port
    w = env.worker("acl", REDIS_URL=acl, TRIM_DONE=1, TRIM_INTERVAL="100ms")
    # 300 entries: XTRIM MINID ~ removes whole stream nodes (100 entries) only
    rc, out, err = env.run(env.args.enqueue, "--count", 300, "--fail", "always", "--fail-every", 60, "--wait",
                           "--timeout", "30s", env={"REDIS_URL": acl})
    check(rc == 3, "ACL user: enqueue --wait exit %d, want 3 (5 dead): %s" % (rc, err))
    check(rc == 3 and '"dead":5' in out, "ACL user: %s" % out[-300:])
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead", env={"REDIS_URL": acl})
    check(rc == 0 and '"requeued":5' in out, "ACL user: requeue exit %d %s %s" % (rc, out[-200:], err))
    wait_until(lambda: metrics(w)["tps_stream_trimmed_total"] > 0, 10, "a trim by the ACL user")
    # a reconnect: the new connections' fence kills the old ones (gone
    # already) with the user's own CLIENT KILL
    fenced = len(re.findall('"msg":"old_connection_fenced"', env.log_of(w)))
    reconnects = metrics(w)["tps_stream_reconnects_total"]
    r("CLIENT", "KILL", "USER", "tpworker")
    wait_until(lambda: metrics(w)["tps_stream_reconnects_total"] > reconnects, 10, "the ACL worker's reconnect")
    check(len(re.findall('"msg":"old_connection_fenced"', env.log_of(w))) >= fenced + 2,
          "no fence of the old writer and reader at the ACL user's reconnect")
    check("NOPERM" not in env.log_of(w) and "lost_write_fence_unavailable" not in env.log_of(w),
          "the ACL user lacks a permission: %s" % env.log_of(w)[-500:])
    check(env.stop(w) == 0, "ACL worker did not exit 0")
    # 6. a lost reply for the ACL user: the result's XADD runs in a stall
    # longer than the worker's 5 s command timeout; the search after the
    # reconnect finds it, and it is not written again
    w = env.worker("acl_lost", REDIS_URL=acl, CLAIM_IDLE="60s", MAX_RETRIES=0)
    eid = r("XADD", "tasks", "*", "work", "3s", "payload", "lost")
    wait_until(lambda: metrics(w)["taskpool_started_total"] == 1, 10, "acl_lost to start")
    time.sleep(0.5)
    r("DEBUG", "SLEEP", "8")  # the entry ends (3 s after its start), and is written, during the stall
    wait_until(lambda: pending(r) == 0, 30, "the outcome")
    time.sleep(0.5 * SLOW)  # a second write would follow at once
    check('"reason":"writing outcomes"' in env.log_of(w), "setup: the stall did not cut acl_lost's write")
    recs = [f for _, f in entries(r, "tasks:done") if f["id"] == eid]
    check(len(recs) == 1, "a lost reply wrote %d records for the ACL user: %s" % (len(recs), env.log_of(w)[-800:]))
    check('"stream":"tasks:done","found":"1"' in env.log_of(w) and "lost_writes_check_failed" not in env.log_of(w),
          "no lost_writes_checked found 1 in acl_lost's log")
    check(env.stop(w) == 0, "worker acl_lost did not exit 0")
    # 7. --wait for the ACL user, its outcome records trimmed (RESULTS_MAXLEN)
    # before it reads them: exit 5, "unknown", not a wait until the timeout
    w = env.worker("acl_trim", REDIS_URL=acl, RESULTS_MAXLEN=10, MAX_PER_USER="unlimited")
    check_wait_trimmed(env, w, r, acl, "20s", "ACL user")
    check(env.stop(w) == 0, "worker acl_trim did not exit 0")
    # nothing the worker or the producer sent was refused to the ACL user
    # (Redis logs every refusal, a script's calls and MULTI's included)
    refused = [dict(zip(e[0::2], e[1::2])) for e in r("ACL", "LOG")]
    refused = ["%s %s (%s)" % (e["reason"], e["object"], e["context"]) for e in refused
               if e["username"] == "tpworker" and e["reason"] != "auth"]
    check(not refused, "refused to the ACL user with the README's rules: %s" % refused)


def scenario_cli(env):
    """Command lines that must not start a worker (bug 5), streams that would
    feed the worker its own outcomes (bug 4), and entries taskpool-enqueue
    refuses because the worker would dead-letter them (bug 6). Every problem
    is collected, then reported together."""
    r = env.start_redis()
    problems = []

    def want(cond, what):
        if not cond:
            problems.append(what)

    r("XADD", "tasks", "*", "work", "1ms")  # an entry a started worker would consume
    for argv, code in [(["--help"], 0), (["-h"], 0), (["--version"], 0), (["--bogus"], 2), (["run"], 2),
                       (["--help", "x"], 2)]:
        try:
            rc, out, err = env.run(env.args.worker, *argv, env={"GROUP_START": "0"}, timeout=5)
        except Fail as e:
            problems.append(str(e))
            continue
        want(rc == code, "worker %s: exit %d, want %d" % (argv, rc, code))
        if argv == ["--help"]:
            for var in ("REDIS_URL", "REDIS_PASSWORD", "GROUP_START", "TRIM_DONE", "RESULTS_MAXLEN"):
                want(var in out, "worker --help does not mention %s" % var)
        if code == 2:
            want(len(err.strip().splitlines()) == 1, "worker %s: stderr %r" % (argv, err))
    want(r("XINFO", "GROUPS", "tasks") == [], "a command line that should only print started a worker")
    rc, out, err = env.run(env.args.enqueue, "--help", timeout=10)
    want(rc == 0 and "REDIS_URL" in out and "STREAM" in out and "(tasks)" in out and "127.0.0.1:6379" in out,
         "enqueue --help: exit %d %r" % (rc, (out + err)[:200]))
    # configuration refused at start: one line, exit 2
    for var, val in [("RESULTS_STREAM", "tasks"), ("DEAD_STREAM", "tasks"), ("GROUP_START", "1"),
                     ("TRIM_DONE", "yes"), ("RESULTS_MAXLEN", "-1"), ("REDIS_URL", "redis://a:b:c@")]:
        try:
            rc, out, err = env.run(env.args.worker, env={var: val, "GROUP_START": "0"} if var != "GROUP_START"
                                   else {var: val}, timeout=5)
        except Fail as e:
            problems.append("%s=%s: %s" % (var, val, e))
            continue
        want(rc == 2, "%s=%s: exit %d, want 2" % (var, val, rc))
        want(len(err.strip().splitlines()) == 1 and (var in err or var == "REDIS_URL"), "%s: %r" % (var, err))
    # values the worker would dead-letter: refused before anything is added
    before = r("XLEN", "tasks")
    for argv in [["--fail", "sometimes"], ["--payload-bytes", 2000], ["--work", "2h"], ["--delay", "abc"],
                 ["--defer", "soon"], ["--not-before", "x"], ["--attempts", 0], ["--attempts", 500],
                 ["--defer", "1s", "--not-before", "1"], ["--count"], ["--since", "1-0"], ["--frobnicate"]]:
        rc, out, err = env.run(env.args.enqueue, "--count", 3, *argv, timeout=10)
        want(rc == 2 and err.strip(), "enqueue %s: exit %d, want 2 (%r)" % (argv, rc, err))
    want(r("XLEN", "tasks") == before, "a refused enqueue added %d entries" % (r("XLEN", "tasks") - before))
    rc, out, err = env.run(env.args.enqueue, "--count", 3, "--fail", "2", "--delay", "1ms", timeout=10)
    want(rc == 0, "a valid enqueue failed: %s" % err)
    for p in problems:
        log("cli: " + p)
    check(not problems, "%d problems (listed above)" % len(problems))


def scenario_reconnect_claim(env):
    """After Redis comes back, the first worker to reconnect does not claim the
    entries of a peer that reconnects a moment later."""
    r = env.start_redis("--appendonly", "yes", "--appendfsync", "always")
    r("XGROUP", "CREATE", "tasks", "taskpool", "$", "MKSTREAM")
    # b holds 3 entries (2 running, 1 queued); a holds none and has room to claim
    b = env.worker("b", WORKERS=2, QUEUE_CAPACITY=1, LOCAL_BACKLOG=1, CLAIM_IDLE="1s", MAX_PER_USER="unlimited")
    ids = {r("XADD", "tasks", "*", "delay", "3s") for _ in range(3)}  # delay: work's alias
    wait_until(lambda: metrics(b)["taskpool_active"] == 2 and pending(r) == 3, 10, "b to hold the 3 entries")
    a = env.worker("a", WORKERS=4, QUEUE_CAPACITY=4, CLAIM_IDLE="1s", MAX_PER_USER="unlimited")
    wait_until(lambda: metrics(a)["tps_stream_connected"] == 1, 10, "a to connect")
    r.close()
    env.kill_redis()
    wait_until(lambda: metrics(a)["tps_stream_connected"] == 0 and metrics(b)["tps_stream_connected"] == 0, 10,
               "both workers to see Redis gone")
    b.send_signal(signal.SIGSTOP)  # b will reconnect a moment after a
    try:
        time.sleep(1.2)  # the outage: b's entries are idle longer than CLAIM_IDLE
        r = env.start_redis()
        wait_until(lambda: metrics(a)["tps_stream_connected"] == 1, 10, "a to reconnect")
        time.sleep(0.3)
    finally:
        b.send_signal(signal.SIGCONT)
    wait_until(lambda: accounted(r, ids), 30, "the 3 outcomes")
    ma, mb = metrics(a), metrics(b)
    check(ma["tps_stream_claimed_total"] == 0 and mb["tps_stream_claimed_total"] == 0,
          "a live worker was robbed after the reconnect: claimed %d / %d" %
          (ma["tps_stream_claimed_total"], mb["tps_stream_claimed_total"]))
    done, dead, dups = verify(r, ids)
    check(dups == 0 and all(f["deliveries"] == "1" for _, f in done), "duplicates %d: %r" % (dups, done))
    check(env.stop(a) == 0, "worker a did not exit 0")

    # A worker that starts while Redis is away claims nothing for one
    # CLAIM_IDLE after it connects: b's entries look idle for the outage.
    more = {r("XADD", "tasks", "*", "delay", "4s") for _ in range(2)}
    wait_until(lambda: metrics(b)["taskpool_active"] == 2, 10, "b to run the 2 entries")
    r.close()
    env.kill_redis()
    c = env.worker("c", connect=False, WORKERS=4, QUEUE_CAPACITY=4, CLAIM_IDLE="1s", MAX_PER_USER="unlimited")
    time.sleep(1.5)  # the outage, longer than CLAIM_IDLE
    r = env.start_redis()
    wait_until(lambda: accounted(r, ids | more), 30, "the 2 outcomes")
    check(metrics(c)["tps_stream_claimed_total"] == 0, "a worker that started during the outage robbed b")
    done, dead, dups = verify(r, ids | more)
    check(dups == 0, "duplicates %d" % dups)
    for w in (b, c):
        check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)


def scenario_group_start(env):
    """A missing group starts at $ (new entries only) unless GROUP_START=0."""
    r = env.start_redis()
    history = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(5)}
    w = env.worker("typo", GROUP="taskpoool")
    new = {r("XADD", "tasks", "*", "work", "1ms") for _ in range(3)}
    wait_until(lambda: {f["id"] for _, f in entries(r, "tasks:done")} >= new, 10, "the 3 new entries")
    check(env.stop(w) == 0, "worker did not exit 0")
    ran = {f["id"] for _, f in entries(r, "tasks:done")}
    check(not (ran & history), "a new group re-ran %d entries of the history" % len(ran & history))
    started = env.log_of(w).splitlines()[0]
    check('"group_start":"$"' in started, "the started line does not say group_start $: %s" % started)
    check('"start":"$"' in env.log_of(w), "group_created does not say where it started")
    r("DEL", "tasks:done")
    w = env.worker("all", GROUP="replay", GROUP_START="0")
    wait_until(lambda: {f["id"] for _, f in entries(r, "tasks:done")} >= history | new, 10, "the whole stream")
    check(env.stop(w) == 0, "worker did not exit 0")


# ---------------------------------------------------------------- issue 20: features
def scenario_scheduled(env):
    """not_before and defer: no start before the time, and at most 50 ms after
    it while every worker is busy with other users' entries; a waiting entry
    holds no pool place."""
    r = env.start_redis()
    cfg = dict(WORKERS=4, QUEUE_CAPACITY=4, MAX_PER_USER=4, LOCAL_BACKLOG=16)
    ws = [env.worker("w%d" % i, **cfg) for i in range(2)]
    # A scheduled entry is read in stream order and then waits aside, so these
    # go first; the filler behind them (8 users, ~4 s of work for the 8 pool
    # threads) keeps every worker busy through all the due times.
    now = int(time.time() * 1000)
    due = {}
    for k in range(30):
        t = now + 800 + 60 * k
        due[r("XADD", "tasks", "*", "user", "sched", "work", "1ms", "not_before", t)] = t
    env.enqueue("--count", 10, "--users", 0, "--work", "1ms", "--defer", "1500ms")
    for eid, f in entries(r, "tasks"):
        if f.get("defer") == "1500ms":
            due[eid] = int(eid.split("-")[0]) + 1500
    env.enqueue("--count", 6400, "--users", 8, "--work", "5ms")
    check(len(due) == 40, "40 scheduled entries")
    waiting = wait_until(lambda: sum(metrics(w)["tps_stream_waiting"] for w in ws) or None, 10,
                         "scheduled entries to wait in a worker's timer heap")
    log("scheduled: %d waiting in the timer heaps" % waiting)
    filler = {eid for eid, f in entries(r, "tasks") if f.get("user", "").startswith("u")}
    wait_until(lambda: accounted(r, set(due) | filler), 60, "every entry")
    for w in ws:
        check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)
    done, dead, dups = verify(r, set(due) | filler)
    check(not dead, "dead entries: %r" % dead[:3])
    started = {f["id"]: int(f["started_ms"]) for _, f in done}
    late = sorted(started[e] - t for e, t in due.items())
    log("scheduled: lateness ms min %d median %d max %d" % (late[0], late[len(late) // 2], late[-1]))
    check(late[0] >= 0, "an entry started %d ms before its time" % -late[0])
    check(late[-1] <= 50 * SLOW, "an entry started %d ms after its time (bound 50 ms)" % late[-1])
    last_filler = max(int(f["finished_ms"]) for _, f in done if f["id"] in filler)
    check(last_filler > max(due.values()), "the workers were not busy with other users until the last due time")


def pending_count(r, eid):
    """Redis's delivery count of a pending entry, 0 when it is not pending."""
    rows = r("XPENDING", "tasks", "taskpool", eid, eid, 1)
    return int(rows[0][3]) if rows else 0


def scenario_scheduled_restarts(env):
    """A scheduled entry outlives more worker crashes before its time than
    MAX_DELIVERIES allows deliveries (a claim of an entry that is not due is
    no delivery: the worker sets Redis's count back), then runs once, on time.
    And an entry whose id is ahead of the clock waits its defer from when it
    was read, not from its id's time (centuries ahead)."""
    r = env.start_redis()
    cfg = dict(CLAIM_IDLE="200ms", MAX_DELIVERIES=2)
    w = env.worker("w0", **cfg)
    defer_ms, restarts = 20000, 5
    a = r("XADD", "tasks", "*", "user", "a", "work", "1ms", "defer", "%dms" % defer_ms)
    due = int(a.split("-")[0]) + defer_ms
    counts = []
    for k in range(restarts + 1):
        wait_until(lambda: metrics(w)["tps_stream_waiting"] == 1 or r("XLEN", "tasks:dead") > 0, 10,
                   "worker %s to hold the entry in its timer heap" % w.name)
        check(r("XLEN", "tasks:dead") == 0,
              "the entry went to the dead stream after %d restarts: %r" % (k, entries(r, "tasks:dead")))
        counts.append(pending_count(r, a))
        if k == restarts:
            break
        # killed: no stop gives the delivery back (backlog_restarts), the
        # claim that finds it not due does
        env.stop(w, signal.SIGKILL)
        w = env.worker("w%d" % (k + 1), **cfg)  # claims it after CLAIM_IDLE
    log("scheduled_restarts: delivery counts while it waited %r" % counts)
    check(time.time() * 1000 < due, "the restarts took longer than the defer (%d ms): inconclusive" % defer_ms)
    check(all(n <= 2 for n in counts), "delivery counts grew with the restarts: %r" % counts)
    check(metrics(w)["tps_stream_claimed_total"] == 1, "the last worker claimed it more than once")
    # accounted, not only recorded: a success's XACK follows its record (write_outcomes)
    wait_until(lambda: accounted(r, {a}), (due - time.time() * 1000) / 1000 + 10, "its result")
    done, dead, dups = verify(r, {a})
    check(not dead and dups == 0, "dead %r, duplicates %d" % (dead, dups))
    f = done[0][1]
    check(int(f["started_ms"]) >= due, "it started %d ms before its time" % (due - int(f["started_ms"])))
    check(int(f["deliveries"]) <= 2 and f["attempts"] == "1", "its record: %r" % f)

    # An explicit id far ahead: every later `*` id inherits its time.
    r("XADD", "tasks", "9999999999999-0", "user", "b", "work", "1ms")
    read_after = int(time.time() * 1000)
    g = r("XADD", "tasks", "*", "user", "b", "work", "1ms", "defer", "300ms")
    check(g.startswith("9999999999999-"), "Redis gave %s" % g)
    wait_until(lambda: accounted(r, {a, "9999999999999-0", g}), 15, "the entry with an id ahead of the clock")
    done, dead, dups = verify(r, {a, "9999999999999-0", g})
    check(not dead and dups == 0, "dead %r, duplicates %d" % (dead, dups))
    started = {f["id"]: int(f["started_ms"]) for _, f in done}
    check(started[g] >= read_after + 300, "the deferred entry started %d ms after it was added (defer 300 ms)" %
          (started[g] - read_after))
    check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)


def scenario_backlog_restarts(env):
    """An entry held in a worker's backlog (its user at MAX_PER_USER) through
    more restarts than MAX_DELIVERIES allows deliveries never ran: each stop
    gives it back without the delivery (XCLAIM RETRYCOUNT). The blocker,
    forced to stop while running every time, is counted and goes dead."""
    r = env.start_redis()
    cfg = dict(CLAIM_IDLE="200ms", MAX_DELIVERIES=3, WORKERS=1, MAX_PER_USER=1, SHUTDOWN_TIMEOUT="200ms")
    w = env.worker("w0", **cfg)
    b = r("XADD", "tasks", "*", "user", "a", "work", "1h")
    h = r("XADD", "tasks", "*", "user", "a", "work", "1ms")
    counts = []
    for k in range(3):
        # w0 reads both; each later worker claims both (b first: ids in order)
        wait_until(lambda: r("XLEN", "tasks:dead") > 0 or
                   (metrics(w)["taskpool_active"] == 1 and metrics(w)["tps_stream_backlog"] == 1), 10,
                   "worker %s to run the blocker and hold the other entry" % w.name)
        check(r("XLEN", "tasks:dead") == 0, "an entry went dead after %d restarts: %r" % (k, entries(r, "tasks:dead")))
        counts.append((pending_count(r, b), pending_count(r, h)))
        check(env.stop(w) == 1, "worker %s: a forced drain exits 1" % w.name)
        # both idle past CLAIM_IDLE, so that the next worker claims them in one
        # batch, in id order: the blocker runs, the other is held again
        wait_until(lambda: all(row[2] >= 300 for row in r("XPENDING", "tasks", "taskpool", "-", "+", 10)), 10,
                   "both entries to be idle")
        w = env.worker("w%d" % (k + 1), **cfg)
    # w3 claims the blocker a 4th time: dead (delivered 4 times); the held one runs
    log("backlog_restarts: delivery counts (blocker, held) while held %r" % counts)
    wait_until(lambda: accounted(r, {b, h}), 15, "both outcomes")
    done, dead, dups = verify(r, {b, h})
    check([f["id"] for _, f in done] == [h], "results %r" % done)
    check([f["id"] for _, f in dead] == [b] and dead[0][1]["reason"].startswith("delivered 4 times"),
          "dead %r" % dead)
    check(int(done[0][1]["deliveries"]) == 1, "the held entry's record says deliveries %s" % done[0][1]["deliveries"])
    check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)



def scenario_cancelled_unrun(env):
    """What a forced shutdown lets go of without an outcome (let_go):
    (a) entries cancelled in the pool's queue never ran: given back with
        count 0, so with MAX_DELIVERIES 1 the next worker runs them; the
        blocker, running, is counted and goes dead;
    (b) an entry deleted while it waits in the queue, and one deleted while it
        runs, get their dead records from the stopping worker (its heartbeat
        had acknowledged them, deleted);
    (c) Redis is down when the shutdown cancels: the worker reconnects within
        its write budget and gives the deliveries back then;
    (d) an entry a live peer claimed while this worker stalled keeps the
        peer's count (nothing is given back that is not pending as ours with
        the count this worker holds);
    (e) an entry that a peer ran, recorded, acknowledged and that was then
        deleted while this worker waited to let it go gets no second record;
    (f) the let-go script is refused (Redis busy with another script): the
        worker keeps the slots and retries within its write budget."""
    r = env.start_redis("--appendonly", "yes", "--appendfsync", "always")
    cfg = dict(CLAIM_IDLE="300ms", MAX_DELIVERIES=1, WORKERS=1, QUEUE_CAPACITY=8, SHUTDOWN_TIMEOUT="200ms")

    def counts():
        return {row[0]: (row[1], int(row[3])) for row in r("XPENDING", "tasks", "taskpool", "-", "+", 100)}

    def blocker_and_queued(w, n, work="1ms"):
        b = r("XADD", "tasks", "*", "work", "1h")
        wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "%s to run the blocker" % w.name)
        q = [r("XADD", "tasks", "*", "work", work, "n", str(k)) for k in range(n)]
        wait_until(lambda: metrics(w)["taskpool_queued"] == n, 10, "%d entries to wait in %s's queue" % (n, w.name))
        return b, q

    # (a)
    w = env.worker("u0", **cfg)
    b, queued = blocker_and_queued(w, 3)
    check(env.stop(w) == 1, "worker u0: a forced drain exits 1")
    rows = counts()
    log("cancelled_unrun (a): delivery counts after the forced stop %r" % rows)
    check(rows.get(b, (None, 0))[1] == 1, "the blocker ran once: %r" % (rows.get(b),))
    for q in queued:
        check(rows.get(q, (None, None))[1] == 0, "entry %s never ran but counts %r" % (q, rows.get(q)))
    w = env.worker("u1", **cfg)
    wait_until(lambda: outcome_count(r) == 4, 15, "four outcomes")
    check(env.stop(w) == 0, "worker u1 did not exit 0")
    done, dead, dups = verify(r, {b} | set(queued))
    check(sorted(f["id"] for _, f in done) == sorted(queued), "results %r" % done)
    check([f["id"] for _, f in dead] == [b] and dead[0][1]["reason"].startswith("delivered 2 times"),
          "dead %r" % dead)
    check(all(int(f["deliveries"]) == 1 for _, f in done), "deliveries %r" % [f["deliveries"] for _, f in done])
    expected = {b} | set(queued)

    # (b)
    w = env.worker("v0", **cfg)
    b2, (q2,) = blocker_and_queued(w, 1)
    r("XDEL", "tasks", b2, q2)
    check(env.stop(w) == 1, "worker v0: a forced drain exits 1")
    reasons = dead_reasons(r)
    check(reasons.get(q2) == "entry deleted before it ran", "the deleted queued entry: %r" % reasons.get(q2))
    check(reasons.get(b2) == "entry deleted before its run ended", "the deleted running one: %r" % reasons.get(b2))
    expected |= {b2, q2}
    verify(r, expected)

    # (c)
    w = env.worker("d0", **cfg)
    b3, queued3 = blocker_and_queued(w, 3)
    r.close()
    env.kill_redis()
    wait_until(lambda: metrics(w)["tps_stream_connected"] == 0, 10, "d0 to see Redis gone")
    w.send_signal(signal.SIGTERM)

    def abandoned():
        if w.poll() is not None:  # gone already (the code before the fix freed them and left)
            return True
        try:
            return metrics(w)["tps_stream_abandoned_total"] == 4
        except OSError:
            return False
    # the four let go of (the blocker cancelled running, three unstarted) while Redis is away
    wait_until(abandoned, 10, "d0's forced shutdown to cancel all four")
    r = env.start_redis()
    code = w.wait(timeout=30 * SLOW)
    check(code == 1, "worker d0: a forced drain exits 1 (got %r)" % code)
    rows = counts()
    log("cancelled_unrun (c): delivery counts after a forced stop with Redis restarted %r" % rows)
    check(rows.get(b3, (None, 0))[1] == 1, "the blocker ran once: %r" % (rows.get(b3),))
    for q in queued3:
        check(rows.get(q, (None, None))[1] == 0, "entry %s never ran but counts %r" % (q, rows.get(q)))
    w = env.worker("d1", **cfg)
    expected |= {b3} | set(queued3)
    wait_until(lambda: accounted(r, expected), 15, "d1 to run the given-back entries")
    check(env.stop(w) == 0, "worker d1 did not exit 0")
    verify(r, expected)
    check(dead_reasons(r)[b3].startswith("delivered 2 times"), "the blocker: %r" % dead_reasons(r)[b3])

    # (e): d0's situation again, but while it is stopped (SIGSTOP) with Redis
    # back, "a peer" ends the entry (record, XACK) and it is deleted
    w = env.worker("e0", **cfg)
    b5, (e5,) = blocker_and_queued(w, 1)
    r.close()
    env.kill_redis()
    wait_until(lambda: metrics(w)["tps_stream_connected"] == 0, 10, "e0 to see Redis gone")
    w.send_signal(signal.SIGTERM)
    wait_until(lambda: metrics(w)["tps_stream_abandoned_total"] == 2, 10, "e0's forced shutdown to cancel both")
    w.send_signal(signal.SIGSTOP)
    r = env.start_redis()
    r("XCLAIM", "tasks", "taskpool", "peer", 0, e5, "JUSTID")
    r("XADD", "tasks:done", "*", "id", e5, "consumer", "peer", "attempts", 1, "deliveries", 2)
    r("XACK", "tasks", "taskpool", e5)
    r("XDEL", "tasks", e5)
    w.send_signal(signal.SIGCONT)
    code = w.wait(timeout=30 * SLOW)
    check(code == 1, "worker e0: a forced drain exits 1 (got %r)" % code)
    outs = [f for _, f in entries(r, "tasks:done") + entries(r, "tasks:dead") if f["id"] == e5]
    check(len(outs) == 1 and outs[0]["consumer"] == "peer", "the peer's entry got records %r" % outs)
    r("XACK", "tasks", "taskpool", b5)  # the blocker: not this part's subject

    # (f) Redis answers BUSY to every other client while a script runs past
    # busy-reply-threshold: here 1.5 s from 0.3 s before the SIGTERM, so the
    # let-go (at the forced shutdown, 200 ms in) is refused and retried
    # 200, 400, 800 ms later, within the write budget (2 s at least)
    w = env.worker("f0", **cfg)
    b6, queued6 = blocker_and_queued(w, 3)
    r("CONFIG", "SET", "busy-reply-threshold", 100)
    busy = Redis(env.sock)
    spin = threading.Thread(target=busy, args=("EVAL", SPIN, 0, 1500000))
    spin.start()
    time.sleep(0.3)
    w.send_signal(signal.SIGTERM)
    spin.join(timeout=10)
    busy.close()
    code = w.wait(timeout=30 * SLOW)
    check(code == 1, "worker f0: a forced drain exits 1 (got %r)" % code)
    r("CONFIG", "SET", "busy-reply-threshold", 5000)
    check('"msg":"let_go_failed"' in env.log_of(w), "the let-go was not refused: inconclusive")
    rows = counts()
    log("cancelled_unrun (f): delivery counts after a refused let-go %r" % rows)
    check(rows.get(b6, (None, 0))[1] == 1, "the blocker ran once: %r" % (rows.get(b6),))
    for q in queued6:
        check(rows.get(q, (None, None))[1] == 0, "entry %s never ran but counts %r" % (q, rows.get(q)))
    w = env.worker("f1", **cfg)
    expected |= {b6, e5} | set(queued6)  # e5: the peer's record of (e)
    wait_until(lambda: accounted(r, expected), 15, "f1 to run the given-back entries")
    check(env.stop(w) == 0, "worker f1 did not exit 0")
    verify(r, expected)

    # (d)
    w = env.worker("s0", **dict(cfg, MAX_DELIVERIES=5))
    b4, (e4,) = blocker_and_queued(w, 1, work="1h")
    w.send_signal(signal.SIGSTOP)
    peer = env.worker("s1", **dict(cfg, MAX_DELIVERIES=5, WORKERS=2))
    wait_until(lambda: metrics(peer)["taskpool_active"] == 2, 15, "the peer to claim and run both")
    before = counts()
    w.send_signal(signal.SIGCONT)
    check(env.stop(w) == 1, "worker s0: a forced drain exits 1")
    after = counts()
    log("cancelled_unrun (d): the peer's entries before and after s0's stop %r %r" % (before, after))
    # s0's heartbeat leaves them to the peer (its script touches only what is
    # pending as s0's), and its let-go must not lower their count
    check(after.get(e4, (None, 0))[1] == 2 and after.get(b4, (None, 0))[1] == 2,
          "s0's stop lowered what its live peer claimed: %r -> %r" % (before, after))
    env.stop(peer, signal.SIGKILL)


# Add an entry (ARGV[2..]: its fields) delivered to a consumer "ghost" that
# never comes back, with delivery count ARGV[1], atomically (a worker's
# blocked XREADGROUP cannot take it first).
GHOST = ("local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2)) "
         "redis.call('XREADGROUP', 'GROUP', 'taskpool', 'ghost', 'COUNT', 1, 'STREAMS', KEYS[1], '>') "
         "redis.call('XCLAIM', KEYS[1], 'taskpool', 'ghost', 0, id, 'RETRYCOUNT', ARGV[1], 'JUSTID') return id")


# Keep Redis busy for ARGV[1] microseconds (other clients get BUSY past
# busy-reply-threshold).
SPIN = ("local t0 = redis.call('TIME') local s = t0[1] * 1000000 + t0[2] "
        "while true do local t = redis.call('TIME') "
        "if t[1] * 1000000 + t[2] - s > tonumber(ARGV[1]) then return 1 end end")


def dead_reasons(r):
    return {f["id"]: f["reason"] for _, f in entries(r, "tasks:dead")}


def scenario_delivery_counts(env):
    """Redis's delivery count, which MAX_DELIVERIES judges, counts the
    deliveries that could run, exactly, and each entry gets one outcome:
    (a) a crash before a scheduled entry's time does not count even with
        MAX_DELIVERIES 1;
    (b) a claim reads each claimed entry's own count, however many entries
        this worker holds in between;
    (c) an entry deleted while it waits for its time gets one dead record;
    (d) a worker whose timer heap is full still recovers a dead peer's entries;
    (e) an entry whose id is ahead of the clock and that kills its worker
        every time it runs is counted and goes dead (its due time, counted
        from each claim, is no evidence that it never ran), (f) unless the
        claims found the timer heap full (then it surely did not run);
    (a2) a poison entry waiting through a graceful stop still runs at most
        MAX_DELIVERIES times; (c2) 300 deleted waiting entries, 300 records;
    (g) a claim while a read is in flight leaves the heap room the read may
        need."""
    r = env.start_redis()
    # (a)
    w = env.worker("a1", CLAIM_IDLE="200ms", MAX_DELIVERIES=1)
    a = r("XADD", "tasks", "*", "work", "1ms", "defer", "3s")
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 1, 10, "a1 to hold the entry until its time")
    env.stop(w, signal.SIGKILL)
    w = env.worker("a2", CLAIM_IDLE="200ms", MAX_DELIVERIES=1)
    wait_until(lambda: outcome_count(r) == 1, 15, "its outcome")
    check(a not in dead_reasons(r), "a crash before its time killed it: %r" % dead_reasons(r))
    check(env.stop(w) == 0, "worker a2 did not exit 0")
    # (a3) a graceful stop before its time, and a worker that claims it after:
    # it runs (the count a read left was lowered to its runs so far, 0)
    a3 = r("XADD", "tasks", "*", "work", "1ms", "defer", "1s")
    w = env.worker("a3", CLAIM_IDLE="200ms", MAX_DELIVERIES=1)
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 1, 10, "a3 to hold the entry until its time")
    check(env.stop(w) == 0, "worker a3 did not exit 0")
    wait_until(lambda: time.time() * 1000 > int(a3.split("-")[0]) + 1300, 5, "its time to pass")
    w = env.worker("a4", CLAIM_IDLE="200ms", MAX_DELIVERIES=1)
    wait_until(lambda: outcome_count(r) == 2, 15, "its outcome")
    check(a3 not in dead_reasons(r), "a stop before its time killed it: %r" % dead_reasons(r))
    check(env.stop(w) == 0, "worker a4 did not exit 0")

    # (b) two entries delivered 10 times to a dead consumer, 12 that this
    # worker holds until their time in between (its XPENDING used to be a
    # range capped at 2 x its slots: the second one's count was not listed)
    cfg = dict(CLAIM_IDLE="1s", WORKERS=2, QUEUE_CAPACITY=2, LOCAL_BACKLOG=1, MAX_DELIVERIES=5)
    w = env.worker("b1", **cfg)
    poison = [r("EVAL", GHOST, 1, "tasks", 10, "work", "1ms")]  # atomic: b1's blocked read cannot take it
    for _ in range(12):
        r("XADD", "tasks", "*", "work", "1ms", "defer", "1h")
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 12, 10, "b1 to hold 12 entries until their time")
    poison.append(r("EVAL", GHOST, 1, "tasks", 10, "work", "1ms"))
    wait_until(lambda: all(e in dead_reasons(r) for e in poison), 15, "both to be claimed")
    reasons = dead_reasons(r)
    check(all(reasons[e].startswith("delivered 11 times") for e in poison), "reasons %r" % reasons)
    check(not any(f["id"] in poison for _, f in entries(r, "tasks:done")), "a poison entry ran")

    # (c) deleted while b1 holds it until its time: b1's heartbeat (its hold
    # script) acknowledges it, and b1 writes its record then, once; the fetch
    # at its time writes no other
    c = r("XADD", "tasks", "*", "work", "1ms", "defer", "3s")
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 13, 10, "b1 to hold the entry until its time")
    r("XDEL", "tasks", c)
    due = int(c.split("-")[0]) + 3000
    wait_until(lambda: time.time() * 1000 > due + 1500, 10, "its time to pass")
    recs = [f for _, f in entries(r, "tasks:dead") if f["id"] == c]
    check(len(recs) == 1 and recs[0]["reason"] == "entry deleted before it ran", "its dead records: %r" % recs)
    check(env.stop(w) == 0, "worker b1 did not exit 0")

    # (c1) deleted while held in the backlog (its user at MAX_PER_USER): the
    # heartbeat acknowledges it; the stop writes its record
    w = env.worker("g1", WORKERS=1, QUEUE_CAPACITY=1, MAX_PER_USER=1, LOCAL_BACKLOG=4, CLAIM_IDLE="1s")
    r("XADD", "tasks", "*", "user", "u", "work", "2s")
    held = r("XADD", "tasks", "*", "user", "u", "work", "1ms")
    wait_until(lambda: metrics(w)["tps_stream_backlog"] == 1, 10, "g1 to hold the entry in its backlog")
    r("XDEL", "tasks", held)
    wait_until(lambda: pending_count(r, held) == 0, 5, "the heartbeat to drop it from the pending list")
    check(env.stop(w) == 0, "worker g1 did not exit 0")
    check(dead_reasons(r).get(held) == "entry deleted before it ran", "its record: %r" % dead_reasons(r).get(held))

    # (c2) 300 of them, more than a round of DUE_BATCH and than the slots
    # free, due before the heartbeat after next (CLAIM_IDLE 9 s: one every
    # 3 s): every one gets its record, once
    w = env.worker("c1", CLAIM_IDLE="9s")
    before = set(dead_reasons(r))
    env.enqueue("--count", 300, "--users", 0, "--work", "1ms", "--defer", "4s")
    many = {eid for eid, f in entries(r, "tasks") if f.get("defer") == "4s"}
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 300, 10, "c1 to hold 300 entries until their time")
    for eid in many:
        r("XDEL", "tasks", eid)
    wait_until(lambda: set(dead_reasons(r)) - before >= many, 20, "300 dead records")
    recs = [f["id"] for _, f in entries(r, "tasks:dead") if f["id"] in many]
    check(len(recs) == 300, "%d dead records for 300 deleted entries" % len(recs))
    still = [row[0] for row in r("XPENDING", "tasks", "taskpool", "-", "+", 1000) if row[0] in many]
    check(not still, "%d deleted entries still pending" % len(still))
    check(env.stop(w) == 0, "worker c1 did not exit 0")

    # (a2) a poison entry waiting for its time through a graceful stop runs
    # at most MAX_DELIVERIES (1) times: the stop keeps its count
    r("DEL", "tasks")  # b1's twelve entries of an hour stay out of the counts below
    r("XGROUP", "CREATE", "tasks", "taskpool", "$", "MKSTREAM")
    p = r("XADD", "tasks", "*", "work", "1h", "defer", "2s")
    w = env.worker("p1", CLAIM_IDLE="300ms", MAX_DELIVERIES=1)
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 1, 10, "p1 to hold it until its time")
    check(env.stop(w) == 0, "worker p1 did not exit 0")
    w = env.worker("p2", CLAIM_IDLE="300ms", MAX_DELIVERIES=1)
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "p2 to run it at its time")
    env.stop(w, signal.SIGKILL)  # it "crashes" its worker
    w = env.worker("p3", CLAIM_IDLE="300ms", MAX_DELIVERIES=1)
    wait_until(lambda: p in dead_reasons(r), 10, "p3 to send it to the dead stream")
    check(metrics(w)["taskpool_started_total"] == 0, "the poison entry ran twice with MAX_DELIVERIES 1")
    check(env.stop(w) == 0, "worker p3 did not exit 0")

    # (d) h1's heap is full (SCHEDULED_MAX=2): it reads nothing, but claims
    r("DEL", "tasks")
    r("XGROUP", "CREATE", "tasks", "taskpool", "$", "MKSTREAM")
    h1 = env.worker("h1", CLAIM_IDLE="500ms", SCHEDULED_MAX=2)
    for _ in range(2):
        r("XADD", "tasks", "*", "work", "1ms", "defer", "1h")
    wait_until(lambda: metrics(h1)["tps_stream_waiting"] == 2, 10, "h1's heap to fill")
    h2 = env.worker("h2", CLAIM_IDLE="500ms")
    d = r("XADD", "tasks", "*", "work", "1s")
    wait_until(lambda: metrics(h2)["taskpool_active"] == 1, 10, "h2 to run the entry")
    env.stop(h2, signal.SIGKILL)
    wait_until(lambda: any(f["id"] == d for _, f in entries(r, "tasks:done")), 10,
               "h1 to claim and run the dead peer's entry")
    check(env.stop(h1) == 0, "worker h1 did not exit 0")

    # (e) last: every later `*` id inherits this one's time
    e = r("XADD", "tasks", "9999999999999-0", "work", "1h", "defer", "200ms")
    for k in range(4):
        w = env.worker("e%d" % k, CLAIM_IDLE="200ms", MAX_DELIVERIES=2)
        wait_until(lambda: e in dead_reasons(r) or metrics(w)["taskpool_active"] == 1, 10,
                   "e%d to run the entry or send it to the dead stream" % k)
        if e in dead_reasons(r):
            break
        env.stop(w, signal.SIGKILL)  # it "crashes" its worker
    check(k == 2 and dead_reasons(r).get(e, "").startswith("delivered 3 times"),
          "after %d crashes: %r" % (k, dead_reasons(r).get(e)))
    check(env.stop(w) == 0, "the last worker did not exit 0")

    # (f) such an entry, claimed again and again by a worker whose heap is
    # full, never ran: it is not counted towards MAX_DELIVERIES
    w = env.worker("f1", CLAIM_IDLE="300ms", SCHEDULED_MAX=1, MAX_DELIVERIES=2)
    r("XADD", "tasks", "*", "work", "1ms", "defer", "1h")
    wait_until(lambda: metrics(w)["tps_stream_waiting"] == 1, 10, "f1's heap to fill")
    f = r("EVAL", GHOST, 1, "tasks", 1, "work", "1ms", "defer", "1h")
    wait_until(lambda: metrics(w)["tps_stream_claimed_total"] >= 5, 15, "five claims of it")
    check(f not in dead_reasons(r) and pending_count(r, f) <= 2,
          "claims that found the heap full counted: %r, count %d" % (dead_reasons(r).get(f), pending_count(r, f)))
    check(env.stop(w) == 0, "worker f1 did not exit 0")

    # (g) a claim while a read is in flight leaves the timer-heap room the
    # read may need: a dead consumer's 2 entries (6 s ahead) are claimed by a
    # worker with SCHEDULED_MAX=2 whose read waits in Redis; the entry that
    # read then brings (1 s ahead) waits for its time and runs, with
    # MAX_DELIVERIES=1 (it found the heap full, was let go unlowered and died
    # 'delivered 2 times' without running). Its own stream: the ids above
    # are ahead of the clock (e).
    r("XGROUP", "CREATE", "g", "taskpool", "0", "MKSTREAM")
    ghosts = [r("XADD", "g", "*", "work", "1ms", "defer", "6s") for _ in range(2)]
    r("XREADGROUP", "GROUP", "taskpool", "ghost", "COUNT", 10, "STREAMS", "g", ">")
    time.sleep(0.7)  # idle longer than CLAIM_IDLE
    w = env.worker("g1", STREAM="g", CLAIM_IDLE="500ms", SCHEDULED_MAX=2, MAX_DELIVERIES=1)
    wait_until(lambda: '"msg":"claimed"' in env.log_of(w), 10, "g1's first claim")
    x = r("XADD", "g", "*", "work", "1ms", "defer", "1s")
    wait_until(lambda: x in {f["id"] for _, f in entries(r, "tasks:done")} or x in dead_reasons(r), 15,
               "the read entry's outcome")
    check(x not in dead_reasons(r), "the read entry died: %r" % dead_reasons(r).get(x))
    rec = [f for _, f in entries(r, "tasks:done") if f["id"] == x]
    check(len(rec) == 1 and rec[0]["deliveries"] == "1" and rec[0]["attempts"] == "1", "its record %r" % rec)
    wait_until(lambda: all(g in dead_reasons(r) for g in ghosts) and r("XPENDING", "g", "taskpool")[0] == 0, 20,
               "the ghost's entries to come due (they count the ghost's read: dead)")
    check(env.stop(w) == 0, "worker g1 did not exit 0")


def scenario_enqueue_edges(env):
    """taskpool-enqueue at its edges: command lines it must refuse, names that
    need escaping, an add that fails part way, a wide entry that must not
    block the outcomes behind it, and --requeue-dead taking only the records
    there when it starts, skipping what would die again, creating the group."""
    r = env.start_redis()
    problems = []

    def want(cond, what):
        if not cond:
            problems.append(what)

    for argv, extra in [(["--requeue-dead", "--wait"], {}), (["--requeue-dead", "--count", 5], {}),
                        (["--timeout", "1s", "--requeue-dead"], {}), (["--fail-every", 3], {}),
                        (["--since", "--requeue-dead"], {}), (["--requeue-dead", "--since", "99999999999999999999-0"], {}),
                        (["--requeue-dead", "--since", "1-18446744073709551616"], {}),
                        (["--requeue-dead"], {"STREAM": "tasks:dead"})]:
        rc, out, err = env.run(env.args.enqueue, *argv, env=extra, timeout=10)
        want(rc == 2 and len(err.strip().splitlines()) == 1, "enqueue %s %s: exit %d %r" % (argv, extra, rc, err))
    want(r("EXISTS", "tasks", "tasks:dead") == 0, "a refused command line touched Redis")

    rc, out, err = env.run(env.args.enqueue, "--count", 1, env={"STREAM": 't"x\\', "GROUP": 'g"'}, timeout=10)
    try:
        line = json.loads(out.strip().splitlines()[-1])
        want(rc == 0 and line["stream"] == 't"x\\' and line["group"] == 'g"', "escaped names: %r" % line)
    except ValueError:
        problems.append("the enqueued line is not JSON: %r" % out)

    r("CONFIG", "SET", "maxmemory-policy", "noeviction")
    r("CONFIG", "SET", "maxmemory", "4mb")
    rc, out, err = env.run(env.args.enqueue, "--count", 5000, "--payload-bytes", 1024, env={"STREAM": "big"},
                           timeout=60)
    r("CONFIG", "SET", "maxmemory", "0")
    try:
        line = json.loads(out.strip().splitlines()[-1])
        want(rc == 1 and line["msg"] == "enqueue_failed" and line["added"] == r("XLEN", "big") and
             0 < line["added"] < 5000, "a partial add: exit %d %r (XLEN %d)" % (rc, line, r("XLEN", "big")))
    except (ValueError, IndexError):
        problems.append("a partial add printed no JSON: exit %d %r %r" % (rc, out, err))
    r("DEL", "big")

    w = env.worker("w0", MAX_RETRIES=0)
    rc, out, err = env.run(env.args.enqueue, "--count", 1, "--work", "1ms", "--wait", "--timeout", "5124095h",
                           timeout=20)
    want(rc == 0, "--timeout 5124095h: exit %d %s" % (rc, out[-200:]))
    # 1100 fields: its dead record cannot copy them all (Lua unpack), and
    # must not hold up the outcomes of the entries behind it
    flat = []
    for k in range(1100):
        flat += ["pad%d" % k, "x"]
    wide = r("XADD", "tasks", "*", "priority", "9", *flat)
    bad = r("XADD", "tasks", "*", "priority", "9")
    rc, out, err = env.run(env.args.enqueue, "--count", 3, "--work", "1ms", "--wait", "--timeout", "20s", timeout=30)
    want(rc == 0, "entries behind a wide dead one: exit %d %s" % (rc, out[-300:]))
    wait_until(lambda: {f["id"] for _, f in entries(r, "tasks:dead")} >= {wide, bad}, 10, "both dead records")
    rec = {f["id"]: f for _, f in entries(r, "tasks:dead")}
    want(rec[wide].get("entry_not_copied") == "1101" and "entry.pad0" not in rec[wide],
         "the wide entry's record: %r" % {k: v for k, v in rec[wide].items() if not k.startswith("entry.")})
    # 50 entries die; requeued while the worker runs, they die again at once:
    # one run requeues each once, and skips what cannot or would die again
    rc, out, err = env.run(env.args.enqueue, "--count", 50, "--users", 0, "--fail", "always", "--wait",
                           "--timeout", "30s", timeout=40)
    want(rc == 3, "50 failing entries: exit %d" % rc)
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead", timeout=60)
    done = json.loads(out.strip().splitlines()[-1])
    want(rc == 0 and done["requeued"] == 50 and done["skipped"] == 2, "requeue under a running worker: %r" % done)
    skipped = [json.loads(l) for l in out.splitlines() if '"msg":"skipped"' in l]
    want(sorted(x["status"] for x in skipped) == ["malformed", "not_copied"], "skipped %r" % skipped)
    wait_until(lambda: r("XLEN", "tasks:dead") == 52 and pending(r) == 0, 30, "the requeued entries to die again")
    check(env.stop(w) == 0, "worker did not exit 0")
    # without the group, --requeue-dead creates it (at $) before adding
    r("XGROUP", "DESTROY", "tasks", "taskpool")
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead", timeout=60)
    want(rc == 0 and '"requeued":50' in out, "requeue without a group: exit %d %s" % (rc, out[-200:]))
    w = env.worker("w1", MAX_RETRIES=0)
    wait_until(lambda: r("XLEN", "tasks:dead") == 52 and pending(r) == 0, 30,
               "the entries requeued into a new group to run")
    check(env.stop(w) == 0, "worker did not exit 0")
    for p in problems:
        log("enqueue_edges: " + p)
    check(not problems, "%d problems (listed above)" % len(problems))


def scenario_wait_edges(env):
    """--wait writes each outcome as it comes, reads one stream when results
    and dead are the same (without spinning), and reports outcome records
    trimmed before it read them instead of waiting for them forever."""
    r = env.start_redis()
    one = {"RESULTS_STREAM": "out", "DEAD_STREAM": "out"}
    w = env.worker("w0", WORKERS=1, MAX_PER_USER=1, **one)
    calls = lambda: int(dict(l.split(":", 1) for l in r("INFO", "commandstats").splitlines()
                             if l.startswith("cmdstat_xread:"))["cmdstat_xread"].split(",")[0].split("=")[1]) \
        if "cmdstat_xread:" in r("INFO", "commandstats") else 0
    before = calls()
    p = subprocess.Popen([env.args.enqueue, "--count", "2", "--users", "1", "--work", "1500ms", "--wait",
                          "--timeout", "30s"], env=dict(os.environ, REDIS_URL=env.url, **one), stdout=subprocess.PIPE,
                         text=True)
    first = None
    try:
        for line in p.stdout:
            if '"msg":"outcome"' in line:
                first = p.poll()  # None: still waiting for the second one
                break
        rest = p.stdout.read()
        rc = p.wait(timeout=30 * SLOW)
    finally:
        if p.poll() is None:
            p.kill()
    check(first is None, "the first outcome line came only at exit")
    check(rc == 0 and '"succeeded":2' in rest, "one stream for both: exit %s %s" % (rc, rest[-200:]))
    n = calls() - before
    check(n < 40, "--wait ran %d XREADs in about 3 s (spinning)" % n)
    check(env.stop(w) == 0, "worker did not exit 0")

    w = env.worker("w1", RESULTS_MAXLEN=10, MAX_PER_USER="unlimited")
    check_wait_trimmed(env, w, r, env.url, "60s", "default user")
    check(env.stop(w) == 0, "worker did not exit 0")

    # An entry deleted while it runs is dropped from the pending list without
    # an acknowledgement; its record comes when it ends. A trim meanwhile
    # must not make --wait call it unknown.
    w = env.worker("w2", CLAIM_IDLE="1s")
    p = subprocess.Popen([env.args.enqueue, "--count", "1", "--users", "0", "--work", "4s", "--wait", "--timeout",
                          "30s"], env=dict(os.environ, REDIS_URL=env.url), stdout=subprocess.PIPE, text=True)
    try:
        line = json.loads(p.stdout.readline())
        wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "the entry to run")
        r("XDEL", "tasks", line["first_id"])
        wait_until(lambda: pending(r) == 0, 5, "the heartbeat to drop it from the pending list")
        # an outcome record --wait cannot read: added and trimmed at once
        r("EVAL", "redis.call('XADD', KEYS[1], '*', 'id', '0-1') return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)",
          1, "tasks:done")
        rest = p.stdout.read()
        rc = p.wait(timeout=30 * SLOW)
    finally:
        if p.poll() is None:
            p.kill()
    check(rc == 0 and '"outcome":"done"' in rest, "a deleted running entry: exit %d %s" % (rc, rest[-300:]))
    check(env.stop(w) == 0, "worker did not exit 0")


def scenario_results(env):
    """Results in the record, --wait exit codes, and the per-entry attempts."""
    r = env.start_redis()
    w = env.worker("w0", MAX_RETRIES=2)
    rc, out, err = env.run(env.args.enqueue, "--count", 30, "--users", 3, "--work", "2ms", "--payload-bytes", 5,
                           "--wait", "--timeout", "30s")
    check(rc == 0, "--wait, all succeed: exit %d (%s)" % (rc, err))
    lines = [l for l in out.splitlines() if '"msg":"outcome"' in l]
    check(len(lines) == 30 and all('"result":"xxxxx"' in l for l in lines), "outcome lines: %r" % lines[:2])
    check(all(f.get("result") == "xxxxx" for _, f in entries(r, "tasks:done")), "result missing from a record")
    rc, out, err = env.run(env.args.enqueue, "--count", 10, "--fail", "always", "--fail-every", 5, "--wait",
                           "--timeout", "30s")
    check(rc == 3 and '"dead":2' in out, "--wait with dead entries: exit %d, want 3: %s" % (rc, out[-200:]))
    rc, out, err = env.run(env.args.enqueue, "--count", 1, "--work", "3s", "--wait", "--timeout", "300ms")
    check(rc == 4 and '"missing":1' in out, "--wait timing out: exit %d, want 4: %s" % (rc, out[-200:]))
    # attempts: 1 stops after the first failure although MAX_RETRIES=2;
    # 50 gets MAX_RETRIES + 1 = 3 (the pool does the retrying)
    one = {r("XADD", "tasks", "*", "fail", "always", "attempts", "1") for _ in range(3)}
    many = {r("XADD", "tasks", "*", "fail", "always", "attempts", "50") for _ in range(3)}
    two = {r("XADD", "tasks", "*", "fail", "1", "attempts", "2") for _ in range(3)}
    wait_until(lambda: {f["id"] for _, f in entries(r, "tasks:done") + entries(r, "tasks:dead")} >= one | many | two,
               30, "the attempts entries")
    dead = {f["id"]: f for _, f in entries(r, "tasks:dead")}
    done = {f["id"]: f for _, f in entries(r, "tasks:done")}
    for e in one:
        check(dead[e]["attempts"] == "1" and "the entry's attempts" in dead[e]["reason"], "attempts 1: %r" % dead[e])
    for e in many:
        check(dead[e]["attempts"] == "3", "attempts 50 with MAX_RETRIES=2: %r" % dead[e])
    for e in two:
        check(done[e]["attempts"] == "2", "attempts 2, fail 1: %r" % done.get(e))
    check(env.stop(w) == 0, "worker did not exit 0")
    check(pending(r) == 0, "pending after --wait timed out and the worker drained")


def scenario_requeue(env):
    """--requeue-dead puts dead entries back with their fields, even after the
    originals were trimmed, once each, and --since limits it."""
    r = env.start_redis()
    w = env.worker("w0", MAX_RETRIES=0)
    env.enqueue("--count", 10, "--users", 2, "--work", "1ms", "--fail", "1", "--payload-bytes", 3)
    orig = {eid: f for eid, f in entries(r, "tasks")}
    wait_until(lambda: r("XLEN", "tasks:dead") == 10, 20, "10 dead entries")
    check(env.stop(w) == 0, "worker did not exit 0")
    r("XTRIM", "tasks", "MAXLEN", 0)  # the originals are gone: the dead records carry their fields
    dead_ids = [eid for eid, _ in entries(r, "tasks:dead")]
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead", "--since", dead_ids[6])
    check(rc == 0 and '"requeued":4' in out, "--since: exit %d %s %s" % (rc, out[-200:], err))
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead")
    check(rc == 0 and '"requeued":6' in out, "the rest: exit %d %s" % (rc, out[-200:]))
    rc, out, err = env.run(env.args.enqueue, "--requeue-dead")
    check(rc == 0 and '"requeued":0' in out, "a second run requeued again: %s" % out[-200:])
    check(r("XLEN", "tasks:dead") == 0, "dead records left after requeue")
    back = {eid: f for eid, f in entries(r, "tasks")}
    check(len(back) == 10, "requeued entries: %d" % len(back))
    check({f["requeued_from"] for f in back.values()} == set(orig), "requeued_from does not name the originals")
    for f in back.values():
        o = orig[f["requeued_from"]]
        check(all(f.get(k) == v for k, v in o.items()), "fields changed: %r -> %r" % (o, f))
    w = env.worker("w1", MAX_RETRIES=1)
    wait_until(lambda: accounted(r, set(back)), 20, "the requeued entries to succeed")
    check(env.stop(w) == 0, "worker did not exit 0")
    done, dead, dups = verify(r, set(back))
    check(len(done) == 10 and not dead, "requeued: %d done, %d dead" % (len(done), len(dead)))


def scenario_trim_load(env):
    """TRIM_DONE under load with workers SIGKILLed: the stream shrinks, no
    pending entry is trimmed, nothing is lost; RESULTS_MAXLEN / DEAD_MAXLEN
    bound their streams."""
    r = env.start_redis()
    trim = dict(TRIM_DONE=1, TRIM_INTERVAL="100ms", WORKERS=2)
    env.enqueue("--count", 6000, "--users", 30, "--work", "1ms", "--fail", "always", "--fail-every", 200)
    expected = {eid for eid, _ in entries(r, "tasks")}
    ws = [env.worker("w%d" % i, **trim) for i in range(3)]
    wait_until(lambda: outcome_count(r) >= 1500, 60, "1500 outcomes")
    ws[0].kill()
    ws[0].wait(timeout=10)
    wait_until(lambda: outcome_count(r) >= 3500, 60, "3500 outcomes")
    ws[1].kill()
    ws[1].wait(timeout=10)
    log("trim_load: SIGKILLed w0 and w1; stream length %d, pending %d" % (r("XLEN", "tasks"), pending(r)))
    ws[0] = env.worker("w3", **trim)
    wait_until(lambda: accounted(r, expected), 120, "all 6000 outcomes")
    wait_until(lambda: r("XLEN", "tasks") < 300, 10, "the trim to catch up")
    trimmed = sum(metrics(w)["tps_stream_trimmed_total"] for w in (ws[0], ws[2]))
    deleted = sum(metrics(w)["tps_stream_deleted_total"] for w in (ws[0], ws[2]))
    for w in (ws[0], ws[2]):
        check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)
    done, dead, dups = verify(r, expected)
    log("trim_load: %d results, %d dead, %d duplicates; stream length %d; trimmed by the survivors %d" %
        (len(done), len(dead), dups, r("XLEN", "tasks"), trimmed))
    check(deleted == 0 and all(f["reason"] != "entry deleted before it ran" for _, f in dead),
          "the trim removed a pending entry")
    check(len(dead) == 30, "dead %d, want the 30 fail-always" % len(dead))
    # bounded outcome streams
    r("DEL", "tasks:done", "tasks:dead")
    w = env.worker("bounded", RESULTS_MAXLEN=500, DEAD_MAXLEN=50, WORKERS=8)
    env.enqueue("--count", 3000, "--users", 30, "--work", "0", "--fail", "always", "--fail-every", 10)
    wait_until(lambda: metrics(w)["tps_stream_acked_total"] == 3000, 60, "3000 outcomes")
    nr, nd = r("XLEN", "tasks:done"), r("XLEN", "tasks:dead")
    log("trim_load: RESULTS_MAXLEN=500 -> %d results kept; DEAD_MAXLEN=50 -> %d dead kept" % (nr, nd))
    check(500 <= nr <= 700 and 50 <= nd <= 250, "MAXLEN ~ not applied: %d results, %d dead" % (nr, nd))
    check(env.stop(w) == 0, "worker did not exit 0")


# ---------------------------------------------------------------- issue 18/20: priorities, fair shares, backoff
def one_worker_order(env, r, name, blocker, batches, **cfg):
    """Start one worker (WORKERS=1 unless cfg says), hold it busy with the
    entry `blocker` (a dict of fields), add the entries of `batches` (lists of
    (label, fields) pairs) while it runs, and return the labels in the order
    they started. The results stream is in end order, which with one worker
    is the start order; started_ms must agree with it. `fields` may be a
    function, called when its entry is added (for times relative to then)."""
    env_cfg = dict(WORKERS=1, QUEUE_CAPACITY=64, MAX_PER_USER="unlimited")
    env_cfg.update(cfg)
    w = env.worker(name, **env_cfg)
    label = {}
    flat = lambda f: [x for kv in f.items() for x in kv]
    label[r("XADD", "tasks", "*", *flat(blocker))] = "blocker"
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "%s: the blocker to start" % name)
    n = 1
    for batch in batches:
        for lab, fields in batch:
            if callable(fields):
                fields = fields()
            label[r("XADD", "tasks", "*", *flat(fields))] = lab
            n += 1
    wait_until(lambda: metrics(w)["tps_stream_read_total"] == n, 10, "%s: the worker to read all %d entries" % (name, n))
    check(metrics(w)["taskpool_succeeded_total"] == 0,
          "%s: setup: the blocker ended before every entry was read (machine too slow?)" % name)
    wait_until(lambda: accounted(r, set(label)), 60, "%s: every outcome" % name)
    m = metrics(w)
    check(env.stop(w) == 0, "%s: worker did not exit 0" % name)
    done, dead, dups = verify(r, set(label))
    check(not dead and dups == 0, "%s: dead %r, duplicates %d" % (name, dead[:2], dups))
    order = [label[f["id"]] for _, f in done]
    starts = [int(f["started_ms"]) for _, f in done]
    check(starts == sorted(starts), "%s: results not in start order: %r" % (name, list(zip(order, starts))))
    for key in ("tasks", "tasks:done", "tasks:dead"):
        r("DEL", key)
    log("%s: %s" % (name, " ".join(order)))
    return order, m


def blocker_fields(user="z"):
    return {"user": user, "work": "%dms" % int(700 * SLOW)}


def scenario_priority(env):
    """Urgent entries start before queued normal ones, background ones last;
    PRIO_STARVE_LIMIT lets a waiting lane in; an urgent entry passes its own
    user's held normal backlog, and so does a scheduled entry that came due;
    LOW_PRIO_MAX_RUNNING keeps background entries from filling the pool's
    queue, and its held entries take turns by user."""
    r = env.start_redis()
    ent = lambda user, prio, work="20ms": {"user": user, "work": work, "priority": prio}
    # 1. lanes, one worker held busy: u* (2) first, then n* (0), b* (-1) last
    order, _ = one_worker_order(env, r, "lanes", blocker_fields(), [
        [("n%d" % i, ent("n", 0)) for i in range(1, 7)],
        [("b%d" % i, ent("b", -1)) for i in range(1, 3)],
        [("u%d" % i, ent("u", 2)) for i in range(1, 4)]])
    want = ["blocker", "u1", "u2", "u3"] + ["n%d" % i for i in range(1, 7)] + ["b1", "b2"]
    check(order == want, "lanes: start order %s, want %s" % (order, want))

    # 2. PRIO_STARVE_LIMIT=2: a waiting normal lane gets a start after at most 2 urgent ones
    order, _ = one_worker_order(env, r, "starve", blocker_fields(), [
        [("n%d" % i, ent("n", 0)) for i in range(1, 4)],
        [("u%d" % i, ent("u", 1)) for i in range(1, 9)]], PRIO_STARVE_LIMIT=2)
    run = longest = 0
    for lab in order[1:]:
        n_left = any(x.startswith("n") for x in order[order.index(lab):])
        run = run + 1 if lab.startswith("u") and n_left else 0
        longest = max(longest, run)
    check(longest <= 2, "starve: %d urgent starts in a row while normal entries waited: %s" % (longest, order))
    check(order.index("n1") <= 3, "starve: n1 started %dth: %s" % (order.index("n1"), order))

    # 3. the local backlog: alice at MAX_PER_USER=2 (a0 runs, n1 queued, n2..n5
    # held); her urgent u1 goes before her held normal entries, bob's urgent
    # v1 before every queued normal one
    order, m = one_worker_order(env, r, "backlog", blocker_fields("alice"), [
        [("n%d" % i, ent("alice", 0)) for i in range(1, 6)],
        [("u1", ent("alice", 2)), ("v1", ent("bob", 2, "300ms")), ("c1", ent("carol", 0))]],
        MAX_PER_USER=2, LOCAL_BACKLOG=16)
    want = ["blocker", "v1", "u1", "n1", "c1", "n2", "n3", "n4", "n5"]
    check(order == want, "backlog: start order %s, want %s" % (order, want))
    check(m["tps_stream_user_waits_total"] >= 5, "backlog: user_waits %d" % m["tps_stream_user_waits_total"])

    # 4. a scheduled entry that comes due while its user's normal entries are
    # held (MAX_PER_USER=1, the blocker is alice's) goes before them: it was
    # read first and has waited for its time already. Its time is set when it
    # is added, once the blocker runs: 300 ms to read it, 400 ms to spare
    # before the blocker ends (a slow worker start no longer eats the margin)
    due_in = lambda: {"user": "alice", "work": "20ms", "not_before": int(time.time() * 1000) + int(300 * SLOW)}
    order, m = one_worker_order(env, r, "due", blocker_fields("alice"), [
        [("n%d" % i, ent("alice", 0)) for i in range(1, 4)],
        [("d1", due_in)]], MAX_PER_USER=1)
    want = ["blocker", "d1", "n1", "n2", "n3"]
    check(order == want, "due: start order %s, want %s" % (order, want))
    check(m["tps_stream_scheduled_total"] == 1, "due: d1 did not wait for its time")

    # 5. LOW_PRIO_MAX_RUNNING=1 on 2 workers, a 4-place queue: 12 background
    # entries of two users, then 6 normal ones. The normal ones are read and
    # run on the free worker at once (not after the background ones, which
    # would fill the queue); one background entry runs at a time; the two
    # background users take turns.
    w = env.worker("low", WORKERS=2, QUEUE_CAPACITY=4, LOCAL_BACKLOG=32, MAX_PER_USER="unlimited",
                   LOW_PRIO_MAX_RUNNING=1)
    label = {}
    bg_work = "%dms" % int(150 * SLOW)
    for user in ("bgA", "bgB"):
        for i in range(1, 7):
            label[r("XADD", "tasks", "*", "user", user, "work", bg_work, "priority", -1)] = "%s%d" % (user, i)
    t_normal = int(time.time() * 1000)
    for i in range(1, 7):
        label[r("XADD", "tasks", "*", "user", "n", "work", "20ms")] = "n%d" % i
    wait_until(lambda: accounted(r, set(label)), 60, "low: every outcome")
    m = metrics(w)
    check(env.stop(w) == 0, "low: worker did not exit 0")
    done, dead, dups = verify(r, set(label))
    check(not dead and dups == 0, "low: dead %d, duplicates %d" % (len(dead), dups))
    rec = {label[f["id"]]: (int(f["started_ms"]), int(f["finished_ms"])) for _, f in done}
    bg = sorted((v, k) for k, v in rec.items() if k.startswith("bg"))
    for (a, ka), (b, kb) in zip(bg, bg[1:]):
        check(b[0] >= a[1], "low: background %s and %s ran at once: %r %r" % (ka, kb, a, b))
    normal_end = max(v[1] for k, v in rec.items() if k.startswith("n"))
    third_bg_end = bg[2][0][1]
    log("low: normal entries done %d ms after they were added; background start order %s" %
        (normal_end - t_normal, " ".join(k for _, k in bg)))
    check(normal_end < third_bg_end, "low: the normal entries waited behind the background ones "
          "(done at %d, third background entry done at %d)" % (normal_end, third_bg_end))
    bg_order = [k for _, k in bg]
    check(bg_order.index("bgB1") < bg_order.index("bgA5"),
          "low: bgB waited behind bgA's burst: %s" % bg_order)
    check(m["tps_stream_low_prio_waits_total"] >= 8, "low: low_prio_waits %d" % m["tps_stream_low_prio_waits_total"])


def scenario_fair_share(env):
    """SCHED=fair: a user's burst does not delay another user's single entry
    beyond one round (SCHED=fifo, the control, does); the per-user backlog
    (MAX_PER_USER) keeps working in a fair pool; USER_WEIGHTS sets the turns."""
    r = env.start_redis()
    alice = lambda k: [("a%d" % i, {"user": "alice", "work": "20ms"}) for i in range(1, k + 1)]
    bob = lambda k: [("b%d" % i, {"user": "bob", "work": "20ms"}) for i in range(1, k + 1)]
    order, _ = one_worker_order(env, r, "fifo", blocker_fields(), [alice(10), bob(1)], SCHED="fifo")
    check(order.index("b1") == 11, "fifo (control): bob started %dth, want after all of alice's: %s" %
          (order.index("b1"), order))
    order, _ = one_worker_order(env, r, "fair", blocker_fields(), [alice(10), bob(1)], SCHED="fair")
    check(order.index("b1") <= 2, "fair: bob waited %d of alice's entries: %s" % (order.index("b1") - 1, order))
    # the per-user backlog in a fair pool: alice over MAX_PER_USER, her burst held locally
    order, m = one_worker_order(env, r, "fair_backlog", blocker_fields(), [alice(30), bob(1)], SCHED="fair",
                                MAX_PER_USER=2, LOCAL_BACKLOG=40)
    check(order.index("b1") <= 2, "fair_backlog: bob waited %d of alice's entries: %s" %
          (order.index("b1") - 1, order))
    check(m["tps_stream_user_waits_total"] >= 28, "fair_backlog: alice's burst was not held locally (user_waits %d)"
          % m["tps_stream_user_waits_total"])
    check(order[1:] == ["a1", "b1"] + ["a%d" % i for i in range(2, 31)], "fair_backlog: order %s" % order)
    # weights: alice 3 turns, bob 1
    order, _ = one_worker_order(env, r, "weights", blocker_fields(), [alice(9), bob(3)], SCHED="fair",
                                USER_WEIGHTS="alice:3,bob:1")
    want = ["blocker", "a1", "a2", "a3", "b1", "a4", "a5", "a6", "b2", "a7", "a8", "a9", "b3"]
    check(order == want, "weights: order %s, want %s" % (order, want))


def retry_delays(env, w, eid):
    """The retry delays the pool logged for entry `eid` (log_id), in ms."""
    out = []
    for line in env.log_of(w).splitlines():
        if '"log_id":"%s"' % eid in line and "; retry " in line:
            num, unit = json.loads(line)["detail"].rsplit(" in ", 1)[1].split()  # "40 ms", "1.5 s"
            out.append(float(num) * {"s": 1000, "ms": 1, "us": 1e-3, "ns": 1e-6}[unit])
    return out


def scenario_backoff(env):
    """RETRY_DELAY_MAX: retry k waits RETRY_DELAY x 2^(k-1), at most
    RETRY_DELAY_MAX, seen in the pool's log lines and in the records' times;
    without it the delay is fixed."""
    r = env.start_redis()
    # fail 5: attempts 6, 5 retries: 40 80 160 200 200 ms = 680 ms
    w = env.worker("exp", MAX_RETRIES=5, RETRY_DELAY="40ms", RETRY_DELAY_MAX="200ms")
    ok = r("XADD", "tasks", "*", "fail", 5, "work", "1ms")
    bad = r("XADD", "tasks", "*", "fail", "always")
    wait_until(lambda: accounted(r, {ok, bad}), 30, "the two entries")
    check(env.stop(w) == 0, "exp: worker did not exit 0")
    done = {f["id"]: f for _, f in entries(r, "tasks:done")}
    dead = {f["id"]: f for _, f in entries(r, "tasks:dead")}
    check(done[ok]["attempts"] == "6" and dead[bad]["attempts"] == "6", "attempts: %r %r" % (done[ok], dead[bad]))
    for eid, f in ((ok, done[ok]), (bad, dead[bad])):
        delays = retry_delays(env, w, eid)
        check(delays == [40, 80, 160, 200, 200], "exp: logged retry delays %r, want 40 80 160 200 200" % delays)
        span = int(f["finished_ms"]) - int(f["started_ms"])
        log("backoff: %s took %d ms over 6 attempts (delays 680 ms)" % (eid, span))
        check(680 <= span <= 680 + 400 * SLOW, "exp: first start to last end %d ms, want 680 ms and a little" % span)
    check('"retry_delay_max_ms":200' in env.log_of(w).splitlines()[0], "started line lacks retry_delay_max_ms")
    for key in ("tasks", "tasks:done", "tasks:dead"):
        r("DEL", key)
    # fixed: 5 x 40 ms
    w = env.worker("fixed", MAX_RETRIES=5, RETRY_DELAY="40ms")
    ok = r("XADD", "tasks", "*", "fail", 5)
    wait_until(lambda: accounted(r, {ok}), 30, "the fixed-delay entry")
    check(env.stop(w) == 0, "fixed: worker did not exit 0")
    f = entries(r, "tasks:done")[0][1]
    delays = retry_delays(env, w, ok)
    check(delays == [40] * 5, "fixed: logged retry delays %r, want 5 x 40" % delays)
    span = int(f["finished_ms"]) - int(f["started_ms"])
    check(200 <= span <= 200 + 400 * SLOW, "fixed: first start to last end %d ms, want 200 ms and a little" % span)


def scenario_sched_config(env):
    """SCHED, USER_WEIGHTS, LOW_PRIO_MAX_RUNNING, PRIO_STARVE_LIMIT and
    RETRY_DELAY_MAX: --help lists them, bad values exit 2 with one line naming
    the variable, good ones are logged at start; a bad `priority` field is
    dead-lettered with its reason and refused by taskpool-enqueue."""
    r = env.start_redis()
    problems = []
    want = lambda cond, what: cond or problems.append(what)
    rc, out, err = env.run(env.args.worker, "--help", timeout=5)
    for var in ("SCHED", "USER_WEIGHTS", "LOW_PRIO_MAX_RUNNING", "PRIO_STARVE_LIMIT", "RETRY_DELAY_MAX", "priority"):
        want(var in out, "worker --help does not mention %s" % var)
    for env_bad, var in [({"SCHED": "round"}, "SCHED"), ({"SCHED": "FAIR"}, "SCHED"),
                         ({"USER_WEIGHTS": "alice:2"}, "USER_WEIGHTS"),  # SCHED is fifo
                         ({"SCHED": "fair", "USER_WEIGHTS": "alice"}, "USER_WEIGHTS"),
                         ({"SCHED": "fair", "USER_WEIGHTS": "alice:0"}, "USER_WEIGHTS"),
                         ({"SCHED": "fair", "USER_WEIGHTS": "alice:1001"}, "USER_WEIGHTS"),
                         ({"SCHED": "fair", "USER_WEIGHTS": "alice:1,alice:2"}, "USER_WEIGHTS"),
                         ({"SCHED": "fair", "USER_WEIGHTS": "alice:1,,bob:2"}, "USER_WEIGHTS"),
                         ({"WORKERS": "4", "LOW_PRIO_MAX_RUNNING": "5"}, "LOW_PRIO_MAX_RUNNING"),
                         ({"LOW_PRIO_MAX_RUNNING": "-1"}, "LOW_PRIO_MAX_RUNNING"),
                         ({"PRIO_STARVE_LIMIT": "0"}, "PRIO_STARVE_LIMIT"),
                         ({"PRIO_STARVE_LIMIT": "always"}, "PRIO_STARVE_LIMIT"),
                         ({"RETRY_DELAY": "100ms", "RETRY_DELAY_MAX": "50ms"}, "RETRY_DELAY_MAX"),
                         ({"RETRY_DELAY_MAX": "soon"}, "RETRY_DELAY_MAX")]:
        e = dict(env_bad, GROUP_START="0")
        try:
            rc, out, err = env.run(env.args.worker, env=e, timeout=5)
        except Fail as ex:
            problems.append("%r: %s" % (env_bad, ex))
            continue
        want(rc == 2, "%r: exit %d, want 2" % (env_bad, rc))
        want(len(err.strip().splitlines()) == 1 and var in err, "%r: stderr %r" % (env_bad, err))
    want(r("EXISTS", "tasks") == 0, "a refused configuration touched the stream")
    for argv in [["--priority", "3"], ["--priority", "-3"], ["--priority", "x"], ["--priority", "+1"],
                 ["--priority", "01"], ["--priority", ""], ["--priority"]]:
        rc, out, err = env.run(env.args.enqueue, "--count", 2, *argv, timeout=10)
        want(rc == 2 and err.strip(), "enqueue %s: exit %d, want 2 (%r)" % (argv, rc, err))
    want(r("EXISTS", "tasks") == 0, "a refused enqueue added entries")
    check(not problems, "; ".join(problems))
    w = env.worker("good", SCHED="fair", USER_WEIGHTS="alice:3,bob.b@x:1000", LOW_PRIO_MAX_RUNNING=2,
                   PRIO_STARVE_LIMIT="unlimited", RETRY_DELAY="50ms", RETRY_DELAY_MAX="1s")
    started = json.loads(env.log_of(w).splitlines()[0])
    for k, v in [("sched", "fair"), ("user_weights", "alice:3,bob.b@x:1000"), ("low_prio_max_running", 2),
                 ("prio_starve_limit", "unlimited"), ("retry_delay_ms", 50), ("retry_delay_max_ms", 1000)]:
        check(started.get(k) == v, "started line: %s = %r, want %r" % (k, started.get(k), v))
    bad = {r("XADD", "tasks", "*", "priority", v): v for v in ("3", "-3", "high", "+1", "1.0", " 1", "")}
    rep = r("XADD", "tasks", "*", "priority", "1", "priority", "1")
    good = {r("XADD", "tasks", "*", "priority", v, "work", "1ms"): v for v in ("-2", "-1", "0", "1", "2")}
    rc, out, err = env.run(env.args.enqueue, "--count", 4, "--priority", "-2", "--wait", "--timeout", "20s")
    check(rc == 0, "enqueue --priority -2 --wait: exit %d %s" % (rc, err))
    wait_until(lambda: accounted(r, set(bad) | set(good) | {rep}), 20, "the priority entries")
    check(env.stop(w) == 0, "worker did not exit 0")
    dead = {f["id"]: f["reason"] for _, f in entries(r, "tasks:dead")}
    for eid, v in bad.items():
        check(dead.get(eid, "").startswith("priority: expected"), "priority %r: reason %r" % (v, dead.get(eid)))
    check(dead.get(rep) == "priority: repeated", "repeated priority: %r" % dead.get(rep))
    check(not (set(good) & set(dead)), "a valid priority was dead-lettered")
    check(all(f.get("entry.priority") is not None for _, f in entries(r, "tasks:dead")),
          "the dead records lack the entry's priority field")

def shutdown_stats(w):
    """The stream counters of a stopped worker's shutdown_complete line."""
    for line in open(w.log, errors="replace"):
        if '"msg":"shutdown_complete"' in line:
            return json.loads(line)["stream"]
    raise Fail("worker %s logged no shutdown_complete" % w.name)


def scenario_handler_status(env):
    """A handler's return is the outcome, whatever its value (tp_stream.h):
    (a) -1 for a failed attempt, and the pool's own TP_ETIMEDOUT after the
        run timeout, are failures like any other: retried as configured,
        then one dead record, never taken for a forced shutdown's
        cancellation (which would leave them pending, to run again on every
        claim until MAX_DELIVERIES);
    (b) a forced shutdown: a retry that was waiting, and a run that returns
        TP_ECANCELED when cancelled, stay pending for another worker, which
        runs them;
    (c) a run that finishes its work and returns 0 although a forced shutdown
        cancelled it is a success: recorded by the stopping worker, and not
        run again by the next."""
    check(env.args.test_worker, "--test-worker (taskpool-stream-worker-test) is needed")
    r = env.start_redis()
    tw = env.args.test_worker

    # (a)
    w = env.worker("n0", prog=tw, TEST_HANDLER="neg", CLAIM_IDLE="300ms", MAX_RETRIES=1, MAX_DELIVERIES=3,
                   TASK_TIMEOUT="300ms")
    a = r("XADD", "tasks", "*", "fail", "always")
    b = r("XADD", "tasks", "*", "fail", "1")
    t = r("XADD", "tasks", "*", "work", "1h")
    wait_until(lambda: accounted(r, {a, b, t}), 20, "three outcomes")
    time.sleep(1.0 * SLOW)  # three claim periods: nothing runs again
    m = metrics(w)
    check(env.stop(w) == 0, "worker n0 did not exit 0")
    done, dead, dups = verify(r, {a, b, t})
    reasons = {f["id"]: (f["reason"], f["deliveries"]) for _, f in dead}
    log("handler_status (a): dead %r" % reasons)
    check(reasons.get(a, ("",))[0].startswith("failed after 2 attempts (status -1)") and reasons[a][1] == "1",
          "the failing entry: %r" % (reasons.get(a),))
    check(reasons.get(t, ("",))[0].startswith("timed out after 2 attempts (status -6)") and
          reasons[t][1] == "1", "the timed-out entry: %r" % (reasons.get(t),))
    check([(f["id"], f["attempts"]) for _, f in done] == [(b, "2")], "results %r" % done)
    check(dups == 0, "duplicates")
    check(m["tps_stream_abandoned_total"] == 0 and m["taskpool_started_total"] == 3,
          "abandoned %d started %d, want 0 and 3" % (m["tps_stream_abandoned_total"], m["taskpool_started_total"]))
    expected = {a, b, t}

    # (b)
    w = env.worker("n1", prog=tw, TEST_HANDLER="neg", RETRY_DELAY="1h", SHUTDOWN_TIMEOUT="300ms", WORKERS=2)
    f = r("XADD", "tasks", "*", "fail", "1")
    wait_until(lambda: metrics(w)["taskpool_delayed"] == 1, 10, "the first attempt to fail and wait for its retry")
    c = r("XADD", "tasks", "*", "work", "1h")  # neg returns TP_ECANCELED when cancelled
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "the second entry to run")
    check(env.stop(w) == 1, "worker n1: a forced drain exits 1")
    st = shutdown_stats(w)
    check(st["abandoned"] == 2 and st["succeeded"] == 0 and st["dead"] == 0, "n1's counts %r" % st)
    check(pending(r) == 2 and outcome_count(r) == 3, "pending %d outcomes %d, want 2 and 3" %
          (pending(r), outcome_count(r)))
    w = env.worker("n2", CLAIM_IDLE="300ms", MAX_RETRIES=1, TASK_TIMEOUT="300ms")  # c: 2 timeouts
    expected |= {f, c}
    wait_until(lambda: accounted(r, expected), 20, "n2 to run both")
    check(env.stop(w) == 0, "worker n2 did not exit 0")
    done, dead, dups = verify(r, expected)
    rec = {x["id"]: x for _, x in done + dead}
    check(rec.get(f, {}).get("consumer") == "n2" and "reason" not in rec[f] and
          rec.get(c, {}).get("consumer") == "n2" and rec[c].get("reason", "").startswith("timed out after 2"),
          "the two entries n1 let go: %r %r" % (rec.get(f), rec.get(c)))

    # (c)
    w = env.worker("u0", prog=tw, TEST_HANDLER="uninterruptible", SHUTDOWN_TIMEOUT="300ms")
    u = r("XADD", "tasks", "*", "work", "1h", "payload", "charged")  # cancelled, it ends 100 ms later
    wait_until(lambda: metrics(w)["taskpool_active"] == 1, 10, "the entry to run")
    rc = env.stop(w)
    st = shutdown_stats(w)
    log("handler_status (c): u0 exit %d, counts %r" % (rc, st))
    check(rc == 1 and '"pool_result":"TP_ETIMEDOUT"' in env.log_of(w), "u0: the drain was not forced (exit %d)" % rc)
    check(st["succeeded"] == 1 and st["abandoned"] == 0, "u0's counts %r" % st)
    expected.add(u)
    done, dead, dups = verify(r, expected)
    rec = [x for _, x in done if x["id"] == u]
    check(len(rec) == 1 and rec[0]["consumer"] == "u0" and rec[0].get("result") == "charged",
          "the record of the cancelled success: %r" % rec)
    w = env.worker("u1", CLAIM_IDLE="300ms")
    mark = r("XADD", "tasks", "*", "work", "1ms")
    expected.add(mark)
    wait_until(lambda: accounted(r, expected), 10, "u1 to run the marker")
    time.sleep(1.0 * SLOW)  # three claim periods
    check(metrics(w)["taskpool_started_total"] == 1, "u1 ran %d entries, want 1 (the marker)" %
          metrics(w)["taskpool_started_total"])
    check(env.stop(w) == 0, "worker u1 did not exit 0")
    _, _, dups = verify(r, expected)
    check(dups == 0, "duplicates")


class HoldProxy:
    """A unix-socket proxy in front of redis-server. hold() holds what the
    connections open at that moment send from then on, as a partition
    would; release() forwards it to Redis late, on each connection's server
    side, which stays open (unless Redis closed it) even if the client has
    closed its side meanwhile: the commands of a connection the client gave
    up on reach Redis after the client's next connection has done its work.
    Connections opened after hold() pass freely."""

    def __init__(self, env):
        self.path = os.path.join(env.dir, "proxy.sock")
        self.target = env.sock
        self.lock = threading.Lock()
        self.conns = []
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.path)
        self.lsock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                cl, _ = self.lsock.accept()
            except OSError:  # closed
                return
            sv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sv.connect(self.target)
            except OSError:
                cl.close()
                sv.close()
                continue
            st = {"held": False, "buf": []}
            with self.lock:
                self.conns.append((cl, sv, st))
            threading.Thread(target=self._up, args=(cl, sv, st), daemon=True).start()
            threading.Thread(target=self._down, args=(cl, sv), daemon=True).start()

    def _up(self, cl, sv, st):  # client -> server
        while True:
            try:
                data = cl.recv(65536)
            except OSError:
                data = b""
            with self.lock:
                if st["held"]:
                    st["buf"].append(data)  # b"": the client's end, forwarded at release
                    if not data:
                        return
                    continue
            try:
                if not data:
                    sv.shutdown(socket.SHUT_WR)
                    return
                sv.sendall(data)
            except OSError:
                return

    def _down(self, cl, sv):  # server -> client; a closed client's replies are dropped
        client_gone = False
        while True:
            try:
                data = sv.recv(65536)
            except OSError:
                data = b""
            if not data:
                for x in (cl, sv):
                    try:
                        x.close()
                    except OSError:
                        pass
                return
            if not client_gone:
                try:
                    cl.sendall(data)
                except OSError:
                    client_gone = True

    def hold(self):
        with self.lock:
            for _, _, st in self.conns:
                st["held"] = True

    def release(self):
        """Forward what was held; the number of connections whose server
        side refused it (closed by Redis meanwhile)."""
        refused = 0
        with self.lock:
            for _, sv, st in self.conns:
                if not st["held"]:
                    continue
                st["held"] = False
                try:
                    for data in st["buf"]:
                        if data:
                            sv.sendall(data)
                        else:
                            sv.shutdown(socket.SHUT_WR)
                except OSError:
                    refused += 1
                st["buf"] = []
        return refused

    def close(self):
        """Stop accepting (the accept thread ends); open connections end with
        their ends."""
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()


def scenario_lost_reply(env):
    """Redis stalls longer than the worker's 5 s command timeout while an
    outcome is in flight (DEBUG SLEEP), then runs the commands of the
    connection the worker closed meanwhile; after the reconnect the worker
    looks for this process's records (`writer`) among those added since and
    writes each outcome once:
    (a) a result; (b) a dead record (the outcome script's XACK was in the
        lost call too: nothing left to acknowledge);
    (c) a worker whose XADD never ran (CLIENT PAUSE WRITE: Redis drops it
        with the connection) does not take another stream's record of the
        same entry id by a worker of the same CONSUMER name for its own;
    (d) a lost heartbeat reply (its hold script acknowledged a deleted
        entry) still leaves the entry's dead record to the worker;
    (e) a partition that heals late (HoldProxy): the closed connection's
        XADD reaches Redis after the new connection's search, and is not a
        second record: the new connections killed the old writer and the
        old reader first."""
    r = env.start_redis("--enable-debug-command", "yes")

    def stalled_write(w, started):
        wait_until(lambda: metrics(w)["taskpool_started_total"] == 1, 10, "%s to start" % w.name)
        time.sleep(0.5)
        r("DEBUG", "SLEEP", "8")  # the entry ends (3 s after its start), and is written, during the stall
        wait_until(lambda: accounted(r, started), 30, "the outcome")
        time.sleep(0.5 * SLOW)  # a second write would follow at once
        check('"reason":"writing outcomes"' in env.log_of(w),
              "setup: the stall did not cut %s's write of the outcome" % w.name)
        m = metrics(w)
        check(env.stop(w) == 0, "worker %s did not exit 0" % w.name)
        return m

    # (a)
    w = env.worker("w0", CLAIM_IDLE="60s", MAX_RETRIES=0)
    ok_id = r("XADD", "tasks", "*", "work", "3s", "payload", "x")
    m = stalled_write(w, {ok_id})
    done, dead, dups = verify(r, {ok_id})
    check(len(done) == 1 and done[0][1].get("result") == "x" and not dead, "results %r dead %r" % (done, dead))
    check(re.fullmatch("[0-9a-f]{16}", done[0][1].get("writer", "")), "the record's writer %r" % done[0][1])
    check('"stream":"tasks:done","found":"1"' in env.log_of(w), "no lost_writes_checked found 1 in the log")
    check(m["tps_stream_succeeded_total"] == 1 and m["tps_stream_ack_missed_total"] == 0,
          "succeeded %d ack_missed %d" % (m["tps_stream_succeeded_total"], m["tps_stream_ack_missed_total"]))

    # (b) its second attempt fails 3 s after the first, during the stall
    w = env.worker("w1", CLAIM_IDLE="60s", MAX_RETRIES=1, RETRY_DELAY="3s")
    dead_id = r("XADD", "tasks", "*", "fail", "always")
    m = stalled_write(w, {ok_id, dead_id})
    done, dead, dups = verify(r, {ok_id, dead_id})
    check([f["id"] for _, f in dead] == [dead_id] and dead[0][1]["reason"].startswith("failed after 2 attempts"),
          "dead records %r" % dead)
    check(dups == 0, "duplicates")
    check('"stream":"tasks:dead","found":"1"' in env.log_of(w), "no lost_writes_checked found 1 in the log")
    check(m["tps_stream_dead_total"] == 1 and m["tps_stream_ack_missed_total"] == 0,
          "dead %d ack_missed %d" % (m["tps_stream_dead_total"], m["tps_stream_ack_missed_total"]))
    expected = {ok_id, dead_id}

    # (c) streams a and b share tasks:done, and their workers the name x
    r("XGROUP", "CREATE", "a", "taskpool", "$", "MKSTREAM")
    r("XGROUP", "CREATE", "b", "taskpool", "$", "MKSTREAM")
    wa = env.worker("ca", STREAM="a", CONSUMER="x", CLAIM_IDLE="60s")
    wb = env.worker("cb", STREAM="b", CONSUMER="x", CLAIM_IDLE="60s")
    xb = r("XADD", "b", "*", "work", "3s")
    r("XADD", "a", xb, "work", "1ms")  # the same id in stream a
    wait_until(lambda: any(f["id"] == xb for _, f in entries(r, "tasks:done")), 10, "a's record")
    wait_until(lambda: metrics(wb)["taskpool_started_total"] == 1, 10, "b to start")
    time.sleep(0.6)
    r("CLIENT", "PAUSE", "8000", "WRITE")  # b's XADD waits, and is dropped with its connection
    wait_until(lambda: '"reason":"writing outcomes"' in env.log_of(wb), 15, "b's write to time out")
    wait_until(lambda: r("XPENDING", "b", "taskpool")[0] == 0, 30, "b's outcome")
    recs = [f for _, f in entries(r, "tasks:done") if f["id"] == xb]
    check(len(recs) == 2 and recs[0]["writer"] != recs[1]["writer"],
          "b's entry acknowledged without a record of its own: %r" % recs)
    check('"stream":"tasks:done","found":"0"' in env.log_of(wb), "no lost_writes_checked found 0 in b's log")
    check(env.stop(wa) == 0 and env.stop(wb) == 0, "workers ca, cb did not exit 0")

    # (d) the entry fails, is deleted, and the heartbeat's reply is lost
    w = env.worker("h0", CLAIM_IDLE="3s", MAX_RETRIES=1, RETRY_DELAY="12s")
    e = r("XADD", "tasks", "*", "fail", "always")
    wait_until(lambda: metrics(w)["taskpool_delayed"] == 1, 10, "the first attempt to fail")
    r("XDEL", "tasks", e)
    r("DEBUG", "SLEEP", "8")  # the heartbeat (every 1 s) acknowledges it deleted; its reply is lost
    check('"reason":"heartbeat"' in env.log_of(w), "setup: the stall did not cut a heartbeat")
    expected |= {e, xb}
    wait_until(lambda: e in dead_reasons(r), 30, "the entry's dead record")
    time.sleep(0.5 * SLOW)
    done, dead, dups = verify(r, expected)
    check(dups == 1, "duplicates: %d, want 1 (xb: an entry of a and one of b)" % dups)
    check(env.stop(w) == 0, "worker h0 did not exit 0")

    # (e) the worker's connections pass through the proxy; what they send
    # after the start is held, and released once the entry is acknowledged
    px = HoldProxy(env)
    try:
        w = env.worker("p0", REDIS_URL="unix://" + px.path, CLAIM_IDLE="60s", MAX_RETRIES=0)
        # the run ends well after the hold, with the reader's next XREADGROUP
        # (every second) held before it
        late = r("XADD", "tasks", "*", "work", "%dms" % (3000 * SLOW), "payload", "late")
        expected.add(late)
        wait_until(lambda: metrics(w)["taskpool_started_total"] == 1, 10, "p0 to start")
        px.hold()  # the result's XADD is held: a timeout 5 s after it
        wait_until(lambda: '"reason":"writing outcomes"' in env.log_of(w), 20 + 3 * SLOW, "p0's write to time out")
        wait_until(lambda: accounted(r, expected), 30, "the outcome, written by the next connection")
        refused = px.release()
        time.sleep(1.0 * SLOW)  # what was held reaches Redis now, if it can
    finally:
        px.close()
    recs = [f for _, f in entries(r, "tasks:done") if f["id"] == late]
    check(len(recs) == 1 and recs[0].get("result") == "late", "records of the late entry: %r" % recs)
    # the old writer's XADD and the old reader's next XREADGROUP (sent within
    # a BLOCK of 1 s after the hold) found their connections closed by Redis
    check(refused == 2, "held connections whose commands Redis refused: %d, want 2" % refused)
    lines = env.log_of(w).splitlines()
    searched = [i for i, line in enumerate(lines) if '"msg":"lost_writes_checked"' in line]
    check(searched, "no lost_writes_checked line in p0's log")
    for conn in ("writer", "reader"):
        at = [i for i, line in enumerate(lines)
              if re.search(r'"msg":"old_connection_fenced","connection":"%s".*"killed":"1"' % conn, line)]
        check(at, "no old_connection_fenced of the %s, killed 1, in p0's log" % conn)
        check(at[0] < searched[0], "the old %s was killed after the lost-write search" % conn)
    done, dead, dups = verify(r, expected)
    check(dups == 1, "duplicates: %d, want 1 (xb)" % dups)
    check(env.stop(w) == 0, "worker p0 did not exit 0")


SCENARIOS = {
    "clean": scenario_clean,
    "crash": scenario_crash,
    "redis_restart": scenario_redis_restart,
    "fair": scenario_fair,
    "bad": scenario_bad,
    "drain": scenario_drain,
    "outcome_key": scenario_outcome_key,
    "trimmed_pending": scenario_trimmed_pending,
    "deleted_held": scenario_deleted_held,
    "auth": scenario_auth,
    "cli": scenario_cli,
    "reconnect_claim": scenario_reconnect_claim,
    "group_start": scenario_group_start,
    "scheduled": scenario_scheduled,
    "scheduled_restarts": scenario_scheduled_restarts,
    "backlog_restarts": scenario_backlog_restarts,
    "cancelled_unrun": scenario_cancelled_unrun,
    "delivery_counts": scenario_delivery_counts,
    "enqueue_edges": scenario_enqueue_edges,
    "wait_edges": scenario_wait_edges,
    "results": scenario_results,
    "requeue": scenario_requeue,
    "trim_load": scenario_trim_load,
    "priority": scenario_priority,
    "fair_share": scenario_fair_share,
    "backoff": scenario_backoff,
    "sched_config": scenario_sched_config,
    "handler_status": scenario_handler_status,
    "lost_reply": scenario_lost_reply,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--enqueue", required=True)
    ap.add_argument("--test-worker", help="taskpool-stream-worker-test (handler_status)")
    ap.add_argument("--redis-server", default=shutil.which("redis-server"))
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    args = ap.parse_args()
    check(args.redis_server, "redis-server not found")
    env = Env(args, args.scenario)
    t0 = time.monotonic()
    ok = False
    try:
        SCENARIOS[args.scenario](env)
        ok = True
    except Fail as e:
        log("FAIL:", e)
    except Exception as e:  # noqa: BLE001 -- any error fails the test, with cleanup
        log("FAIL: %s: %s" % (type(e).__name__, e))
    finally:
        env.cleanup(ok)
    log("%s: %s in %.1f s" % (args.scenario, "PASS" if ok else "FAIL", time.monotonic() - t0))
    return 0 if ok else 1



# ================================================================ /metrics over HTTP (issue 22)
# The worker's GET /metrics is served by the examples' shared HTTP server
# (examples/common/httpd.c) from a poll loop: every connection has a total
# head deadline, and no client can make a scrape wait. Raw sockets, so that
# every byte on the wire is the test's choice.
#   metrics_slow  30 clients trickle their heads a byte at a time: scrapes
#                 are answered meanwhile, each trickler gets 408 at its
#                 deadline although it never stops sending
#   metrics_http  conformance: 400 without Host (HTTP/1.1), HEAD = GET
#                 without a body, 405 + Allow for POST, 501 for an unknown
#                 method, charset, keep-alive; JSON log lines
import json as metrics_json
import threading as metrics_threading


class MetricsConn:
    """One HTTP connection to a worker's /metrics, read response by response."""

    def __init__(self, p, timeout=10.0):
        host, port = p.metrics.rsplit(":", 1)
        self.s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout * SLOW)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def _fill(self):
        chunk = self.s.recv(65536)
        self.buf += chunk
        return chunk

    def read(self, head_only=False):
        """(status, {lower-case name: value}, body); None if the connection
        ended before a response began."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                check(not self.buf, "EOF inside a response head: %r" % self.buf[:200])
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        check(lines[0].startswith("HTTP/1.1 "), "status line %r" % lines[0])
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            check(name.lower() not in headers, "header %s twice" % name)
            headers[name.lower()] = value.strip()
        n = 0 if head_only else int(headers["content-length"])
        while len(self.buf) < n:
            check(self._fill(), "EOF inside a response body")
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(lines[0].split(" ")[1]), headers, body

    def closed(self):
        """The server closed the connection, with nothing more to read."""
        try:
            return not self.buf and not self._fill()
        except ConnectionResetError:
            return True

    def close(self):
        self.s.close()


def metrics_one(w, raw, head_only=False):
    c = MetricsConn(w)
    try:
        c.send(raw)
        r = c.read(head_only)
    finally:
        c.close()
    check(r is not None, "no response to %r" % raw)
    return r


def metrics_slow(env):
    env.start_redis()
    w = env.worker("m0")
    slow = [MetricsConn(w) for _ in range(30)]  # more than the old listen backlog (16)
    head = b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Trickle: "
    stop = metrics_threading.Event()

    def trickle():
        # one byte on every connection each 50 ms, until the test ends or the
        # server closes it: a per-byte timeout would never fire
        i = 0
        while not stop.is_set():
            byte = head[i:i + 1] or b"a"
            for c in slow:
                try:
                    c.s.send(byte)
                except OSError:
                    pass
            i += 1
            stop.wait(0.05)

    t = metrics_threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        for i in range(5):
            t0 = time.monotonic()
            c = None
            try:
                c = MetricsConn(w, timeout=3.0)  # a scrape waits for nobody: 3 s is plenty
                c.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                r = c.read()
            except socket.timeout:
                raise Fail("scrape %d got no answer within 3 s while 30 heads trickle in" % i)
            finally:
                if c is not None:
                    c.close()
            check(r is not None and r[0] == 200 and b"tps_stream_read_total" in r[2], "scrape %d: %r" % (i, r))
            log("metrics_slow: scrape %d answered in %.0f ms" % (i, (time.monotonic() - t0) * 1000))
        for i, c in enumerate(slow):
            c.s.settimeout(20 * SLOW)
            try:
                r = c.read()
            except socket.timeout:
                raise Fail("trickling client %d was not cut off within 20 s" % i)
            check(r is not None and r[0] == 408, "trickling client %d: %r, want 408" % (i, r and r[:2]))
            check(r[1].get("connection") == "close", "408 without Connection: close")
    finally:
        stop.set()
        t.join(timeout=10)
        for c in slow:
            c.close()
    check(metrics(w)["tps_stream_connected"] == 1, "the worker lost Redis")
    check(env.stop(w) == 0, "worker did not exit 0 after SIGTERM")


def metrics_http(env):
    env.start_redis()
    w = env.worker("m0", LOG_LEVEL="debug")
    ctype = "text/plain; version=0.0.4; charset=utf-8"
    st, h, body = metrics_one(w, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
    check(st == 200 and h.get("content-type") == ctype, "GET: %d %r" % (st, h))
    check(b"tps_stream_read_total" in body and b"taskpool_workers" in body, "GET: body %r" % body[:200])
    check(metrics_one(w, b"GET /metrics HTTP/1.1\r\n\r\n")[0] == 400, "HTTP/1.1 without Host: want 400")
    check(metrics_one(w, b"GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n")[0] == 400, "Host: a b: want 400")
    check(metrics_one(w, b"GET /metrics HTTP/1.0\r\n\r\n")[0] == 200, "HTTP/1.0 without Host: want 200")
    check(metrics_one(w, b"GET http://t/metrics HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 200, "absolute-form")
    st, h, body = metrics_one(w, b"POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
    check(st == 405 and h.get("allow") == "GET, HEAD", "POST: %d %r" % (st, h))
    check(metrics_one(w, b"get /metrics HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 501, "get: want 501")
    check(metrics_one(w, b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 404, "GET /nope: want 404")
    check(metrics_one(w, b"GET /metrics?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 400, "unknown parameter")

    # HEAD: the GET's headers, no body (the next response follows at once);
    # then keep-alive until Connection: close.
    c = MetricsConn(w)
    c.send(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\nGET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
    st, h, _ = c.read(head_only=True)
    check(st == 200 and h.get("content-type") == ctype and int(h["content-length"]) > 0, "HEAD: %d %r" % (st, h))
    st, h, body = c.read()
    check(st == 200 and body.startswith(b"# HELP") and "connection" not in h, "GET after HEAD: %d %r" % (st, h))
    c.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    st, h, _ = c.read()
    check(st == 200 and h.get("connection") == "close", "last GET: %d %r" % (st, h))
    check(c.closed(), "the connection stayed open after Connection: close")
    c.close()
    check(metrics(w)["tps_stream_connected"] == 1, "urllib's scrape")
    check(env.stop(w) == 0, "worker did not exit 0 after SIGTERM")

    # The worker's log, request lines included, is JSON line by line.
    requests = 0
    with open(w.log, encoding="utf-8") as f:
        for line in f:
            rec = metrics_json.loads(line)
            requests += rec.get("msg") == "request"
    check(requests >= 12, "%d request lines in the worker's log, want every request" % requests)


SCENARIOS.update({"metrics_slow": metrics_slow, "metrics_http": metrics_http})

if __name__ == "__main__":
    sys.exit(main())
