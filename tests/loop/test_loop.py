#!/usr/bin/env python3
"""Process-level tests of the event-loop servers of examples/loop/.

    test_loop.py --server BINARY SCENARIO

BINARY is taskpool-loop-uv or taskpool-loop-epoll: the same protocol on two
loops, so every scenario runs against both. Each scenario starts the real
server on 127.0.0.1 port 0, drives it with real TCP clients and signals,
reads its counters with STATS and its last JSON log line, and checks the
exit status and that stderr holds no sanitizer report (in an ASan build a
leak would show there, on the forced path too). Every wait polls with its
own bound; no sleep stands in for a state. Python standard library only.

Scenarios (one CTest test each, per server):
  protocol  command line, configuration errors (exit 2), every reply of the
            protocol, out-of-order answers, MAX_LINE, half-close, MAX_CLIENTS
  load      200 clients at once pipelining work for 20 users against a pool
            of 4 + 16: BUSY and LIMIT refusals, which the clients retry until
            all 2,000 units are done; every request answered exactly once
  refuse    BUSY (TP_EFULL) and LIMIT (TP_EUSERLIMIT) exactly where the
            pool's bounds say; hung-up clients' work cancelled, slot back
  hangup    clients that reset with work in flight (cancelled, drained,
            freed, counted) and clients that close before their answer
  slow      a client that sends without reading is paused, not buffered, and
            loses nothing; one whose answers overflow OUTPUT_LIMIT is dropped
            and its other work cancelled; the others are served meanwhile
  drain     SIGTERM: no new connections, the work in flight finishes and is
            answered, exit 0; a budget too short: work cancelled and answered
            TP_ECANCELED, exit 1; a client that reads nothing is dropped
            within the budget, exit 0; SIGINT on an idle server: exit 0
  linger    a client that goes on sending after the server decided to close
            gets its answers and a clean end of stream
  idle      IDLE_TIMEOUT: a silent client is closed and its MAX_CLIENTS place
            freed; one whose work outlasts it is not idle; one that takes
            none of its answers is dropped
  fds       out of descriptors: the server neither spins nor floods its log
            (accept_failed at most once a second), serves its clients, and
            accepts again once descriptors are free
"""
import argparse
import json
import os
import random
import resource
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

SLOW = float(os.environ.get("TP_TEST_SLOWDOWN", "1"))
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer")


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def log(*a):
    print("test_loop:", *a, flush=True)


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout * SLOW
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Fail("timed out after %.0f s waiting for %s" % (timeout * SLOW, what))
        time.sleep(0.02)


# ---------------------------------------------------------------- clients
class Client:
    def __init__(self, addr, rcvbuf=None, timeout=10.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout * SLOW)
        self.sock.connect(addr)
        self.buf = bytearray()
        self.timeout = timeout

    def send(self, data):
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def line(self, timeout=None):
        """The next reply line, without its newline; Fail at EOF or timeout."""
        deadline = time.monotonic() + (timeout or self.timeout) * SLOW
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out = self.buf[:i].decode()
                del self.buf[:i + 1]
                return out
            left = deadline - time.monotonic()
            check(left > 0, "no reply line within %.0f s (have %r)" % ((timeout or self.timeout) * SLOW,
                                                                      bytes(self.buf[:80])))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            check(chunk, "the server closed the connection (have %r)" % bytes(self.buf[:80]))
            self.buf += chunk

    def call(self, line):
        self.send(line + "\n")
        return self.line()

    def call_within(self, line, seconds):
        self.send(line + "\n")
        return self.line(timeout=seconds)

    def stats(self):
        r = self.call("STATS")
        parts = r.split(" ", 2)
        check(len(parts) == 3 and parts[0] == "STATS", "STATS reply %r" % r)
        return json.loads(parts[2])

    def until_eof(self, timeout=10, whole=True):
        """Every remaining line until the server closes (EOF or reset). A
        client dropped with a reset may have got a part of a line: whole=False."""
        deadline = time.monotonic() + timeout * SLOW
        while True:
            left = deadline - time.monotonic()
            check(left > 0, "the server did not close the connection within %.0f s" % (timeout * SLOW))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            self.buf += chunk
        lines = bytes(self.buf).decode().split("\n")
        self.buf = bytearray()
        check(lines[-1] == "" or not whole, "a partial last line %r" % lines[-1])
        return lines[:-1]

    def pipeline_until_eof(self, line, timeout=10):
        """Keep sending `line` without pause while reading, until the server
        closes. Returns (reply lines, "eof" or "reset"): a server that closes
        with our requests unread makes its kernel send a reset, which can
        destroy replies before we read them; a lingering close ends with a
        clean end of stream."""
        data = (line * 2000).encode()  # more than the server reads per turn: input always waits unread
        self.sock.setblocking(False)
        deadline = time.monotonic() + timeout * SLOW
        end = None
        try:
            while end is None:
                check(time.monotonic() < deadline, "the server did not close within %.0f s" % (timeout * SLOW))
                r, w, _ = select.select([self.sock], [self.sock], [], 0.05)
                if w:
                    try:
                        self.sock.send(data)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except (BrokenPipeError, ConnectionResetError):
                        end = "reset"  # (the send took the error a read would have reported)
                        break
                if r:
                    try:
                        chunk = self.sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except ConnectionResetError:
                        end = "reset"
                        break
                    if not chunk:
                        end = "eof"
                        break
                    self.buf += chunk
        finally:
            self.sock.setblocking(True)
        lines = bytes(self.buf).decode().split("\n")
        self.buf = bytearray()
        return lines[:-1], end

    def reset(self):
        """Hang up abruptly: close with SO_LINGER 0, which sends a reset."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------- the server
class Server:
    def __init__(self, env, name, **settings):
        self.name = name
        self.out = os.path.join(env.dir, name + ".out")
        self.err = os.path.join(env.dir, name + ".err")
        e = dict(os.environ)
        # IDLE_TIMEOUT far beyond any scenario's length: only scenario_idle,
        # which sets it, may see a silent client (srv.ctl) closed
        e.update({"LISTEN_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info", "IDLE_TIMEOUT": "1h"})
        nofile = settings.pop("nofile", None)  # RLIMIT_NOFILE of the server, if given
        e.update({k: str(v) for k, v in settings.items()})

        def limits():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.p = subprocess.Popen([env.binary], env=e, stdout=out, stderr=err, preexec_fn=limits)
        first = wait_until(self._first_line, 15, "the server's listening line")
        host, port = first["address"].rsplit(":", 1)
        self.addr = (host, int(port))
        self.ctl = None

    def _first_line(self):
        check(self.p.poll() is None, "%s exited at start: %s %s" % (self.name, self.tail(), self.stderr()))
        with open(self.out, errors="replace") as f:
            line = f.readline()
        if not line.endswith("\n"):
            return None
        ev = json.loads(line)
        check(ev.get("msg") == "listening", "first line %r" % line)
        return ev

    def connect(self, **kw):
        return Client(self.addr, **kw)

    def stats(self):
        if self.ctl is None:
            self.ctl = self.connect()
        return self.ctl.stats()

    def send_signal(self, sig):
        self.p.send_signal(sig)

    def wait(self, timeout=30):
        try:
            rc = self.p.wait(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
            raise Fail("%s did not exit within %.0f s" % (self.name, timeout * SLOW))
        self.check_stderr()
        return rc

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        self.send_signal(sig)
        return self.wait(timeout)

    def stderr(self):
        with open(self.err, errors="replace") as f:
            return f.read()

    def check_stderr(self):
        text = self.stderr()
        for mark in SANITIZER_MARKS:
            check(mark not in text, "%s: sanitizer report on stderr:\n%s" % (self.name, text[-4000:]))

    def events(self):
        out = []
        with open(self.out, errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    raise Fail("%s wrote a line that is not JSON: %r" % (self.name, line))
        return out

    def final(self):
        done = [e for e in self.events() if e.get("msg") == "shutdown_complete"]
        check(len(done) == 1, "%s: %d shutdown_complete lines" % (self.name, len(done)))
        return done[0]

    def tail(self, n=15):
        try:
            with open(self.out, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class Env:
    def __init__(self, binary, scenario):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="tp-loop-%s-" % scenario)
        self.servers = []

    def server(self, name, **settings):
        s = Server(self, name, **settings)
        self.servers.append(s)
        return s

    def run(self, *args, **settings):
        e = dict(os.environ)
        e.update({k: str(v) for k, v in settings.items()})
        return subprocess.run([self.binary] + list(args), env=e, capture_output=True, text=True,
                              timeout=30 * SLOW)

    def cleanup(self, ok):
        for s in self.servers:
            if s.p.poll() is None:
                s.p.kill()
                s.p.wait(timeout=10)
            if not ok:
                log("---- last lines of %s (exit %s)" % (s.name, s.p.returncode))
                print(s.tail(), s.stderr()[-3000:], flush=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def clean_exit(srv):
    """SIGTERM an idle server: exit 0, and its last line says every client
    and every request record is gone."""
    rc = srv.stop()
    check(rc == 0, "%s: exit %d after SIGTERM, want 0" % (srv.name, rc))
    fin = srv.final()
    c = fin["counters"]
    check(fin["result"] == "drained" and fin["exit_code"] == 0, "%s: final line %r" % (srv.name, fin))
    check(c["inflight"] == 0 and c["clients"] == 0 and c["waiting_clients"] == 0,
          "%s: left over at exit: %r" % (srv.name, c))
    return fin


# ---------------------------------------------------------------- scenarios
def scenario_protocol(env):
    prog = os.path.basename(env.binary)
    r = env.run("--help")
    check(r.returncode == 0 and "WORK <ms> [<user>]" in r.stdout and "SHUTDOWN_TIMEOUT" in r.stdout,
          "--help: exit %d, %r" % (r.returncode, r.stdout[:200]))
    r = env.run("--version")
    check(r.returncode == 0 and r.stdout.startswith(prog + " ") and "libtaskpool" in r.stdout,
          "--version: exit %d, %r" % (r.returncode, r.stdout))
    r = env.run("--bogus")
    check(r.returncode == 2 and "--bogus" in r.stderr, "--bogus: exit %d, %r" % (r.returncode, r.stderr))
    for var, val in [("WORKERS", "0"), ("QUEUE_CAPACITY", "x"), ("MAX_PER_USER", "-1"), ("MAX_CLIENTS", "0"),
                     ("MAX_LINE", "8"), ("OUTPUT_LIMIT", "1000"), ("TASK_TIMEOUT", "soon"),
                     ("SHUTDOWN_TIMEOUT", "5"), ("LOG_LEVEL", "loud"), ("LISTEN_ADDR", "nope")]:
        settings = {"LISTEN_ADDR": "127.0.0.1:0"}
        settings[var] = val
        r = env.run(**settings)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        check(r.returncode == 2, "%s=%s: exit %d, want 2" % (var, val, r.returncode))
        check(len(lines) == 1 and lines[0]["level"] == "error" and lines[0].get("variable") == var,
              "%s=%s: output %r" % (var, val, r.stdout))

    srv = env.server("main", WORKERS=2, MAX_LINE=100)
    c = srv.connect()
    check(c.call("PING") == "PONG 1", "PING")
    check(c.call("WORK 0") == "OK 2 TP_OK", "WORK 0")
    check(c.call("WORK 1 alice.B-9_x\r") == "OK 3 TP_OK", "WORK with a user and CRLF")
    bad = [("", "empty line"), ("FOO", "unknown command"), ("work 1", "unknown command"),
           ("WORK", "usage: WORK"), ("WORK -1", "ms: expected"), ("WORK 600001", "ms: at most"),
           ("WORK 1 a/b", "user: only"), ("WORK 1  a", "fields are separated"), ("WORK 1 a b", "too many"),
           ("PING x", "no arguments"), ("WORK 1 " + "u" * 65, "user: at most 64")]
    n = 3
    for line, want in bad:
        n += 1
        got = c.call(line)
        check(got.startswith("ERR %d %s" % (n, want)), "%r: got %r, want ERR %d %s..." % (line, got, n, want))
    # Pipelined: the PING is answered at once, the work in the order it ends.
    c.send("WORK 600\nWORK 0\nPING\n")
    got = [c.line() for _ in range(3)]
    check(got == ["PONG %d" % (n + 3), "OK %d TP_OK" % (n + 2), "OK %d TP_OK" % (n + 1)],
          "pipelined replies %r" % got)
    st = c.stats()
    check(st["work"] == 4 and st["answered"] == 4 and st["errors"] == len(bad) and st["requests"] == n + 4
          and st["inflight"] == 0 and st["clients"] == 1, "counters %r" % st)

    # MAX_LINE: a line of 100 bytes is parsed; 101 is refused and closes
    # the connection; so does a line that never ends.
    c2 = srv.connect()
    check(c2.call("WORK 1 " + "u" * 93) == "ERR 1 user: at most 64 bytes", "a line of MAX_LINE bytes")
    c2.send("x" * 101 + "\nPING\n")
    check(c2.until_eof() == ["ERR 2 line too long"], "a line over MAX_LINE")
    c3 = srv.connect()
    c3.send("y" * 1000)
    check(c3.until_eof() == ["ERR 1 line too long"], "a line without end")
    # Half-close: no more requests, but the answers still come.
    c4 = srv.connect()
    c4.send("WORK 200\nPING\n")
    c4.sock.shutdown(socket.SHUT_WR)
    check(c4.until_eof() == ["PONG 2", "OK 1 TP_OK"], "answers after a half-close")
    c.close()
    clean_exit(srv)

    # MAX_CLIENTS: the next connection is told and closed; room comes back.
    srv = env.server("max_clients", MAX_CLIENTS=2)
    a, b = srv.connect(), srv.connect()
    check(a.call("PING") == "PONG 1" and b.call("PING") == "PONG 1", "two clients")
    third = srv.connect()
    check(third.until_eof() == ["BUSY 0 too many clients"], "the client over MAX_CLIENTS")
    a.close()
    wait_until(lambda: b.stats()["clients"] == 1, 10, "the closed client to leave")
    d = srv.connect()
    check(d.call("PING") == "PONG 1", "a client after room came back")
    check(b.stats()["refused"] == 1, "refused counter")
    b.close()
    d.close()
    clean_exit(srv)


def scenario_load(env):
    workers, queue, users, n_clients, units = 4, 16, 20, 200, 10
    srv = env.server("load", WORKERS=workers, QUEUE_CAPACITY=queue, MAX_PER_USER=3, MAX_CLIENTS=300)
    rnd = random.Random(19)
    sel = selectors.DefaultSelector()
    clients = []
    for k in range(n_clients):
        s = socket.create_connection(srv.addr, timeout=10 * SLOW)
        s.setblocking(False)
        cl = {"sock": s, "user": "u%d" % (k % users), "n": 0, "out": {}, "done": 0, "buf": b"",
              "retry": [], "ok": 0, "busy": 0, "limit": 0}
        clients.append(cl)
        sel.register(s, selectors.EVENT_READ, cl)

    def send(cl, unit):
        cl["n"] += 1
        cl["out"][cl["n"]] = unit
        cl["sock"].sendall(("WORK %d %s\n" % (rnd.randint(5, 20), cl["user"])).encode())

    for cl in clients:  # everyone at once, every unit pipelined
        for u in range(units):
            send(cl, u)
    deadline = time.monotonic() + 120 * SLOW
    remaining = n_clients
    while remaining > 0:
        check(time.monotonic() < deadline, "%d clients unfinished after 120 s" % remaining)
        now = time.monotonic()
        for cl in clients:  # refused units go again after a short pause (a 503's Retry-After)
            due = [u for t, u in cl["retry"] if t <= now]
            cl["retry"] = [(t, u) for t, u in cl["retry"] if t > now]
            for u in due:
                send(cl, u)
        for key, _ in sel.select(timeout=0.01):
            cl = key.data
            chunk = cl["sock"].recv(65536)
            check(chunk, "the server closed a client")
            cl["buf"] += chunk
            *lines, cl["buf"] = cl["buf"].split(b"\n")
            for raw in lines:
                word, num, *rest = raw.decode().split(" ")
                unit = cl["out"].pop(int(num), None)
                check(unit is not None, "a reply to an unknown or already answered request: %r" % raw)
                if word == "OK":
                    check(rest == ["TP_OK"], "reply %r" % raw)
                    cl["ok"] += 1
                    if cl["ok"] == units:
                        remaining -= 1
                elif word in ("BUSY", "LIMIT") and not rest:
                    cl[word.lower()] += 1
                    cl["retry"].append((time.monotonic() + rnd.uniform(0.005, 0.03), unit))
                else:
                    raise Fail("unexpected reply %r" % raw)
    ok = sum(c["ok"] for c in clients)
    busy = sum(c["busy"] for c in clients)
    limit = sum(c["limit"] for c in clients)
    log("load: %d clients, %d units done, %d BUSY and %d LIMIT refusals retried" % (n_clients, ok, busy, limit))
    check(all(not c["out"] and not c["retry"] for c in clients), "requests left unanswered")
    check(ok == n_clients * units, "units done %d" % ok)
    check(busy > 0 and limit > 0, "no refusal under load: busy %d, limit %d" % (busy, limit))
    st = srv.stats()
    check(st["work"] == ok and st["answered"] == ok and st["busy"] == busy and st["limit"] == limit
          and st["errors"] == 0 and st["inflight"] == 0, "server counters %r" % st)
    for c in clients:
        sel.unregister(c["sock"])
        c["sock"].close()
    wait_until(lambda: srv.stats()["clients"] == 1, 20, "the clients to leave")
    fin = clean_exit(srv)
    ps = fin["stats"]
    check(ps["accepted"] == ok and ps["succeeded"] == ok and ps["rejected_full"] == busy
          and ps["rejected_user"] == limit,
          "pool statistics %r" % ps)


def scenario_refuse(env):
    srv = env.server("refuse", WORKERS=1, QUEUE_CAPACITY=2, MAX_PER_USER=1)
    a, b = srv.connect(), srv.connect()
    a.send("WORK 20000 alice\n")
    wait_until(lambda: srv.stats()["active"] == 1, 10, "alice's work to start")
    check(a.call("WORK 10 alice") == "LIMIT 2", "alice over MAX_PER_USER")
    b.send("WORK 20000 bob\nWORK 20000 carol\n")
    wait_until(lambda: srv.stats()["queued"] == 2, 10, "the queue to fill")
    check(b.call("WORK 10") == "BUSY 3", "a full queue, no user")
    check(b.call("WORK 10 dave") == "BUSY 4", "a full queue, a user with free slots")
    st = srv.stats()
    check(st["busy"] == 2 and st["limit"] == 1 and st["inflight"] == 3, "counters %r" % st)
    # Both hang up: their work (one running, two queued, 20 s each) is
    # cancelled, its completions drained and freed.
    a.reset()
    b.reset()
    wait_until(lambda: (lambda s: s["inflight"] == 0 and s["waiting_clients"] == 0)(srv.stats()), 10,
               "the hung-up clients' work to be cancelled and drained")
    st = srv.stats()
    check(st["hangups"] == 2 and st["orphaned"] == 3, "counters %r" % st)
    r = srv.ctl.call("WORK 10 alice")
    check(r.startswith("OK ") and r.endswith(" TP_OK"), "alice's slot is back: %r" % r)
    fin = clean_exit(srv)
    ps = fin["stats"]
    check(ps["rejected_full"] == 2 and ps["rejected_user"] == 1 and ps["cancelled"] == 3, "pool statistics %r" % ps)


def scenario_hangup(env):
    srv = env.server("hangup", WORKERS=4, QUEUE_CAPACITY=128)
    # 30 clients with two long requests each reset while the work runs or waits.
    resets = [srv.connect() for _ in range(30)]
    for c in resets:
        c.send("WORK 3000\nWORK 3000\nPING\n")
    for c in resets:
        check(c.line() == "PONG 3", "both requests admitted")  # parsed, so in flight
    check(srv.stats()["inflight"] == 60, "60 requests in flight")
    for c in resets:
        c.reset()
    # 20 clients close (FIN) before the answer to their request.
    closers = [srv.connect() for _ in range(20)]
    for c in closers:
        c.send("WORK 200\nPING\n")
    for c in closers:
        check(c.line() == "PONG 2", "request admitted")
        c.close()
    # 60 x 3 s of work on 4 workers would take 45 s: only cancellation makes it this quick.
    t0 = time.monotonic()
    wait_until(lambda: (lambda s: s["inflight"] == 0 and s["waiting_clients"] == 0 and s["clients"] == 1)(
        srv.stats()), 15, "the hung-up clients' work to be cancelled, drained and freed")
    st = srv.stats()
    log("hangup: in flight back to 0 in %.2f s; %r" % (time.monotonic() - t0, st))
    check(st["hangups"] == 30 and st["orphaned"] == 60 and st["answered"] == 20, "counters %r" % st)
    check(srv.ctl.call("PING").startswith("PONG "), "the server still answers")
    fin = clean_exit(srv)
    ps = fin["stats"]
    check(ps["cancelled"] == 60 and ps["succeeded"] == 20, "pool statistics %r" % ps)


def pings_past_kernel_buffers():
    """How many PINGs make more answers than the kernel can hold for a client
    that reads nothing. The server's send buffer grows by itself up to
    tcp_wmem's maximum (4 MiB on Debian; on loopback it reaches over 1 MiB
    within a few round trips), and only answers beyond it are left to the
    server's own OUTPUT_LIMIT: 100,000 answers (1.2 MB) were sometimes all
    taken by the kernel, and the server never had a reason to pause."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem_max = int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem_max = 4 << 20
    want = min(wmem_max, 64 << 20) + (1 << 20)  # and 1 MiB more for the receiving side and the sockets' overhead
    n, size = 0, 0
    while size <= want or n < 100000:
        n += 1
        size += len("PONG %d\n" % n)
    return n


def client_that_reads_nothing(srv, timeout):
    """A client that sends PINGs until the server pauses it and TCP pushes
    back, reading none of the answers; returned once the server counts it
    paused (within `timeout` seconds)."""
    s = srv.connect(rcvbuf=4096)
    s.sock.setblocking(False)
    try:
        for _ in range(100000):
            s.sock.send(b"PING\n" * 200)
    except BlockingIOError:
        pass
    wait_until(lambda: srv.stats()["paused_now"] == 1, timeout, "the server to pause the client that reads nothing")
    return s


def scenario_slow(env):
    srv = env.server("slow", WORKERS=128, QUEUE_CAPACITY=256, OUTPUT_LIMIT=2048)
    ctl = srv.connect()

    # A. Sends more requests than the kernel's buffers hold answers for and
    # reads nothing: the server stops reading it, serves the others, and
    # later delivers every answer in order.
    n = pings_past_kernel_buffers()
    log("slow: %d requests from the slow reader" % n)
    s = srv.connect(rcvbuf=4096, timeout=60)
    sent = {}

    def flood(sock, data, box):
        try:
            sock.sendall(data)
            box["ok"] = True
        except OSError as e:
            box["error"] = e

    t = threading.Thread(target=flood, args=(s.sock, b"PING\n" * n, sent), daemon=True)
    t.start()
    wait_until(lambda: ctl.stats()["paused_now"] >= 1, 30, "the server to pause the slow reader")
    check(ctl.call("PING").startswith("PONG "), "another client is answered meanwhile")
    r = ctl.call("WORK 10")
    check(r.startswith("OK ") and r.endswith(" TP_OK"), "another client's work meanwhile: %r" % r)
    for i in range(1, n + 1):
        r = s.line(timeout=60)
        if r != "PONG %d" % i:
            raise Fail("slow reader: line %d is %r" % (i, r))
    t.join(timeout=30 * SLOW)
    check(sent.get("ok"), "the slow reader's requests were not all taken: %r" % sent)
    st = ctl.stats()
    check(st["paused"] >= 1 and st["paused_now"] == 0 and st["slow_dropped"] == 0, "counters %r" % st)
    s.close()

    # B. Has 150 requests of 3 s in flight, then floods without reading: its
    # answers cannot fit in OUTPUT_LIMIT, so it is dropped and the rest of
    # its work cancelled.
    d = srv.connect(rcvbuf=4096, timeout=60)
    d.send("WORK 3000\n" * 150)
    wait_until(lambda: ctl.stats()["inflight"] == 150, 10, "150 requests in flight")
    answered = ctl.stats()["answered"]
    box = {}
    t = threading.Thread(target=flood, args=(d.sock, b"PING\n" * 400000, box), daemon=True)
    t.start()
    wait_until(lambda: ctl.stats()["paused_now"] >= 1, 30, "the server to pause the flooding client")
    check(ctl.stats()["answered"] == answered, "the 3 s work ended before the client was paused: "
          "this machine is too slow for the scenario (TP_TEST_SLOWDOWN)")
    wait_until(lambda: ctl.stats()["slow_dropped"] == 1, 30, "the server to drop the slow reader")
    wait_until(lambda: (lambda x: x["inflight"] == 0 and x["waiting_clients"] == 0)(ctl.stats()), 10,
               "the dropped client's work to be cancelled and drained")
    d.until_eof(timeout=30, whole=False)  # whatever it was sent, then the end
    t.join(timeout=30 * SLOW)
    check(not t.is_alive(), "the flooding client is still blocked")
    st = ctl.stats()
    log("slow: %r" % st)
    check(st["orphaned"] >= 1 and st["clients"] == 1, "counters %r" % st)
    ev = [e for e in srv.events() if e.get("msg") == "client_dropped"]
    check(len(ev) == 1 and ev[0]["reason"].startswith("slow reader"), "client_dropped lines %r" % ev)
    ctl.close()
    clean_exit(srv)


def scenario_drain(env):
    # 1. SIGTERM with work in flight: no new connections, the work finishes
    # and is answered, idle clients close at once, exit 0.
    srv = env.server("drain", WORKERS=2, QUEUE_CAPACITY=8, SHUTDOWN_TIMEOUT="30s")
    a, b = srv.connect(), srv.connect()
    a.send("WORK 1500\nWORK 1500\nWORK 1500\n")
    wait_until(lambda: (lambda s: s["active"] == 2 and s["queued"] == 1)(srv.stats()), 10, "2 running, 1 queued")
    check(b.call("PING") == "PONG 1", "b is connected")
    srv.ctl.close()
    srv.ctl = None
    srv.send_signal(signal.SIGTERM)
    check(b.until_eof(timeout=5) == [], "the idle client is closed at once")

    def refused():
        try:
            socket.create_connection(srv.addr, timeout=5).close()
            return False
        except ConnectionRefusedError:
            return True

    wait_until(refused, 5, "the listener to close")
    a.send("WORK 10\nPING\n")  # still served while its work runs; new work refused
    got = a.until_eof(timeout=15)
    check(sorted(got) == ["CLOSED 4", "OK 1 TP_OK", "OK 2 TP_OK", "OK 3 TP_OK", "PONG 5"],
          "answers during the drain: %r" % got)
    check(got.index("CLOSED 4") < got.index("PONG 5"), "answers during the drain: %r" % got)
    rc = srv.wait(15)
    check(rc == 0, "exit %d after a drain in time, want 0" % rc)
    fin = srv.final()
    check(fin["result"] == "drained" and fin["counters"]["closed"] == 1 and fin["counters"]["answered"] == 3
          and fin["counters"]["inflight"] == 0, "final line %r" % fin)

    # 2. The budget runs out: running and queued work is cancelled, answered
    # TP_ECANCELED, exit 1, long before the work would have ended.
    srv = env.server("forced", WORKERS=1, QUEUE_CAPACITY=4, SHUTDOWN_TIMEOUT="300ms")
    a = srv.connect()
    a.send("WORK 20000\nWORK 20000\n")
    wait_until(lambda: (lambda s: s["active"] == 1 and s["queued"] == 1)(srv.stats()), 10, "1 running, 1 queued")
    srv.ctl.close()
    srv.ctl = None
    t0 = time.monotonic()
    srv.send_signal(signal.SIGTERM)
    got = a.until_eof(timeout=10)
    check(sorted(got) == ["OK 1 TP_ECANCELED", "OK 2 TP_ECANCELED"], "answers of a forced drain: %r" % got)
    rc = srv.wait(10)
    took = time.monotonic() - t0
    check(rc == 1, "exit %d after a forced drain, want 1" % rc)
    check(took < 10 * SLOW, "the forced drain took %.1f s" % took)
    fin = srv.final()
    check(fin["result"] == "forced" and fin["exit_code"] == 1 and fin["counters"]["inflight"] == 0
          and fin["stats"]["cancelled"] == 2, "final line %r" % fin)
    log("drain: forced exit after %.2f s" % took)

    # 3. A client that stops reading, its answers unwritten, no work in
    # flight: it is dropped by nine tenths of the budget (slow_dropped) and
    # the drain still ends drained, exit 0, not forced.
    srv = env.server("drain-unread", SHUTDOWN_TIMEOUT="2s", OUTPUT_LIMIT=65536)
    s = client_that_reads_nothing(srv, 10)
    srv.ctl.close()
    srv.ctl = None
    t0 = time.monotonic()
    srv.send_signal(signal.SIGTERM)
    rc = srv.wait(15)
    took = time.monotonic() - t0
    check(rc == 0, "exit %d with a client that reads nothing through the drain, want 0" % rc)
    fin = srv.final()
    check(fin["result"] == "drained" and fin["counters"]["slow_dropped"] == 1 and fin["counters"]["clients"] == 0,
          "final line %r" % fin)
    ev = [e for e in srv.events() if e.get("msg") == "client_dropped"]
    check(len(ev) == 1 and ev[0]["reason"].startswith("slow reader") and ev[0]["inflight"] == 0
          and ev[0]["unwritten"] > 0, "client_dropped lines %r" % ev)
    log("drain: a client that reads nothing dropped, drained after %.2f s" % took)
    s.close()

    # 4. SIGINT drains like SIGTERM.
    srv = env.server("sigint")
    check(srv.stop(signal.SIGINT) == 0, "exit after SIGINT, want 0")
    started = [e for e in srv.events() if e.get("msg") == "shutdown_started"]
    check(len(started) == 1 and started[0]["signal"] == "SIGINT", "shutdown_started %r" % started)


def scenario_linger(env):
    # A client that goes on sending after the server decided to close (a
    # protocol error; the drain) still gets every answer, then a clean end
    # of stream: the server ends its output and reads and drops input until
    # the client closes, instead of closing with input unread (a reset).
    srv = env.server("linger", WORKERS=2, QUEUE_CAPACITY=8, MAX_LINE=64, SHUTDOWN_TIMEOUT="30s",
                     LOG_LEVEL="debug")
    c = srv.connect()
    c.send("PING\n" + "x" * 100 + "\n" + "PING\n" * 2000)  # unread input when the server is done
    got, end = c.pipeline_until_eof("PING\n")
    check(got == ["PONG 1", "ERR 2 line too long"] and end == "eof",
          "after a protocol error: %r, ended by %s" % (got, end))
    c.close()
    wait_until(lambda: srv.stats()["clients"] == 1, 10, "the client to leave once it closed")
    ev = [e["msg"] for e in srv.events() if e.get("client") == 1]
    check(ev[-2:] == ["client_done", "client_closed"] and "client_linger_ended" not in ev,
          "the lingering ends with the client's own close, not by the timer: %r" % ev)

    # The drain: work in flight, the client pipelines PINGs throughout.
    a = srv.connect()
    a.send("WORK 500\n")
    wait_until(lambda: srv.stats()["active"] == 1, 10, "the work to run")
    srv.ctl.close()
    srv.ctl = None
    srv.send_signal(signal.SIGTERM)
    got, end = a.pipeline_until_eof("PING\n", timeout=20)
    check("OK 1 TP_OK" in got and end == "eof", "during the drain: %d lines, %r, ended by %s"
          % (len(got), [g for g in got if not g.startswith("PONG") and not g.startswith("CLOSED")], end))
    check(all(g == "OK 1 TP_OK" or g.startswith("PONG ") for g in got), "during the drain: %r" % got[:5])
    a.close()
    rc = srv.wait(15)
    check(rc == 0, "exit %d after the drain, want 0" % rc)
    fin = srv.final()
    check(fin["result"] == "drained" and fin["counters"]["answered"] == 1, "final line %r" % fin)

    # A client lingering when the drain begins, that never closes, with a
    # budget shorter than a lingering close: the drain still ends drained.
    srv = env.server("linger-budget", MAX_LINE=64, SHUTDOWN_TIMEOUT="1s")
    b = srv.connect()
    b.send("x" * 100 + "\n")
    check(b.line() == "ERR 1 line too long", "the protocol error")
    wait_until(lambda: srv.stats()["clients"] == 2, 10, "b lingering, the stats client open")
    srv.ctl.close()
    srv.ctl = None
    srv.send_signal(signal.SIGTERM)
    rc = srv.wait(15)
    check(rc == 0, "exit %d with a client lingering through the drain, want 0" % rc)
    check(srv.final()["result"] == "drained", "final line %r" % srv.final())
    b.close()


def scenario_idle(env):
    # IDLE_TIMEOUT: a client with nothing in flight and nothing to write,
    # silent that long, is closed (lingering: its end of stream is clean),
    # so silent connections cannot hold every MAX_CLIENTS place. A client
    # whose work runs longer than IDLE_TIMEOUT is not idle.
    srv = env.server("idle", MAX_CLIENTS=2, IDLE_TIMEOUT="1s", LOG_LEVEL="debug")
    r = env.run("--help")
    check("IDLE_TIMEOUT" in r.stdout, "--help documents IDLE_TIMEOUT")
    r = env.run(LISTEN_ADDR="127.0.0.1:0", IDLE_TIMEOUT="never")
    check(r.returncode == 2 and "IDLE_TIMEOUT" in r.stdout, "IDLE_TIMEOUT=never: exit %d" % r.returncode)
    check(srv.events()[0].get("idle_timeout_ms") == 1000, "the listening line says the idle timeout")
    busy = srv.connect(timeout=20)
    check(busy.call("WORK 2500\nPING") == "PONG 2", "the long work admitted")  # in flight from here
    silent = srv.connect()  # the second and last place
    third = srv.connect()
    check(third.until_eof() == ["BUSY 0 too many clients"], "every place taken")
    check(silent.until_eof(timeout=10) == [], "the silent client closed, a clean end of stream")
    silent.close()
    c = srv.connect()
    check(c.call("PING") == "PONG 1", "a new client is served once the silent one is gone")
    check(busy.line() == "OK 1 TP_OK", "the client whose work outlasted IDLE_TIMEOUT is answered")
    check(busy.call("PING") == "PONG 3", "and still connected")
    ev = {e["client"]: e for e in srv.events() if e.get("msg") == "client_done" and e.get("reason") == "idle timeout"}
    check(2 in ev and 1 not in ev and all(e["inflight"] == 0 and e["unwritten"] == 0 for e in ev.values()),
          "idle client_done lines %r" % ev)  # (c, idle while busy waited, may be among them)
    busy.close()
    c.close()
    clean_exit(srv)

    # A client that takes none of its answers (it sends enough to fill the
    # kernel's buffers with them, then neither reads nor sends) is not idle
    # by the rule above, but must not hold its MAX_CLIENTS place for ever:
    # with nothing in flight and no output written for IDLE_TIMEOUT it is
    # dropped, and its place is free again.
    srv = env.server("stalled", MAX_CLIENTS=2, IDLE_TIMEOUT="1s", OUTPUT_LIMIT=4096)
    s = client_that_reads_nothing(srv, 20)
    wait_until(lambda: srv.stats()["slow_dropped"] == 1, 10, "the client that reads nothing to be dropped")
    st = srv.stats()
    check(st["clients"] == 1 and st["inflight"] == 0, "counters %r" % st)
    ev = [e for e in srv.events() if e.get("msg") == "client_dropped"]
    check(len(ev) == 1 and ev[0]["client"] == 1 and ev[0]["reason"].startswith("slow reader")
          and ev[0]["inflight"] == 0 and ev[0]["unwritten"] > 0, "client_dropped lines %r" % ev)
    c = srv.connect()
    check(c.call("PING") == "PONG 1", "a new client is served once the stalled one is gone")
    c.close()
    s.close()
    clean_exit(srv)


def scenario_fds(env):
    # The server gets 48 descriptors, and clients connect one at a time
    # until one is not served: the server has no descriptor left for it
    # (epoll: accept fails with EMFILE and the client waits in the listen
    # backlog; libuv accepts and closes it, its own EMFILE answer). For
    # 2.5 s (a duration under test, not a wait for a state) the server
    # stays out of descriptors: it logs accept_failed at most once a second
    # (it retries every 100 ms), and the clients it holds are still served.
    # Once they leave, a new client is taken in and served.
    srv = env.server("fds", nofile=48, MAX_CLIENTS=1000)
    held = []
    while True:
        check(len(held) < 100, "every one of %d clients served with 48 descriptors" % len(held))
        c = srv.connect(timeout=20)
        try:
            r = c.call_within("PING", 1.0)
        except (Fail, OSError):
            c.close()  # not taken in (or closed at once by libuv)
            break
        check(r.startswith("PONG "), "PING answered %r" % r)
        held.append(c)
    check(len(held) >= 10, "only %d clients served before the descriptors ran out" % len(held))

    def failed():
        return sum(1 for e in srv.events() if e.get("msg") == "accept_failed")

    n0, t0 = failed(), time.monotonic()
    time.sleep(2.5)
    n, elapsed = failed() - n0, time.monotonic() - t0
    check(n <= 1 + elapsed, "%d accept_failed lines in %.1f s: more than one a second" % (n, elapsed))
    for c in held[:4]:
        check(c.call("PING").startswith("PONG "), "a client held is served meanwhile")
    for c in held:
        c.close()
    c = srv.connect(timeout=20)  # taken in once the listener is watched again
    check(c.call("PING").startswith("PONG "), "a new client served once descriptors are free")
    c.close()
    log("fds: %d clients held, %d accept_failed lines in %.1f s" % (len(held), n, elapsed))
    clean_exit(srv)

SCENARIOS = {
    "protocol": scenario_protocol,
    "load": scenario_load,
    "refuse": scenario_refuse,
    "hangup": scenario_hangup,
    "slow": scenario_slow,
    "drain": scenario_drain,
    "linger": scenario_linger,
    "idle": scenario_idle,
    "fds": scenario_fds,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    args = ap.parse_args()
    env = Env(args.server, args.scenario)
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
    log("%s %s: %s in %.1f s" % (os.path.basename(args.server), args.scenario, "PASS" if ok else "FAIL",
                                 time.monotonic() - t0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
