"""Helpers of the Store tests (tests/python/test_store*.py): a real mooncake_master process and
Store clients in child processes.

    master = Master(client_ttl=2)             # free ports, waits until it serves
    holder = StoreProc(master, global_segment_size=64 << 20)
    holder.call("result = store.get_hostname()")
    ...
    holder.kill(); master.stop()

A StoreProc is this file run as a script: it sets up a MooncakeDistributedStore and then runs
the Python snippets it is sent (one JSON line each) in one namespace holding `store`, `np`,
`data(seed, n)` (deterministic random bytes) and whatever earlier snippets defined; the value
the snippet leaves in `result` comes back (bytes as base64). Its log goes to a file, shown
when a call fails.

Also: store_fixtures (master / holder / store fixtures of a module), lending_store_fixtures, new_store, buf / ptr
(numpy buffers and their addresses), metadata_server (etcd / redis / http from
scripts/store_servers.sh), terminate (SIGTERM, then SIGKILL).
"""
import base64
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
# The master installed beside the interpreter (scripts/python_test.sh's venv), or MC_MASTER_BIN
# (scripts/gpu_check.sh runs these tests against a build directory).
MASTER_BIN = pathlib.Path(os.environ.get("MC_MASTER_BIN")
                          or pathlib.Path(sys.executable).parent / "mooncake_master")
SERVERS = HERE.parents[1] / "scripts" / "store_servers.sh"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(seed, n):
    """n deterministic pseudo-random bytes."""
    import numpy as np
    return np.random.default_rng(seed).bytes(n)


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Polls pred() until it is true (returns its value) or raises after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def terminate(proc, timeout=10):
    """Ends the subprocess `proc`: SIGTERM, then SIGKILL if it still runs after `timeout`
    seconds; reaps it. Nothing when it has already exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def metadata_server(kind):
    """A metadata server of `kind` (http, etcd, redis) from scripts/store_servers.sh for the
    duration of the block, as the URL clients are given. When it cannot start, the test is
    skipped (failed under MC_REQUIRE_STORE_SERVERS=1)."""
    import pytest
    work = tempfile.mkdtemp(prefix=f"mc_store_{kind}_")
    env = dict(os.environ, MC_STORE_SERVERS_OWNER_PID=str(os.getpid()))
    proc = subprocess.run([str(SERVERS), "start", kind, work], capture_output=True, text=True,
                          env=env, timeout=300)
    if proc.returncode != 0:
        msg = f"{kind} server could not start: {proc.stderr.strip()[-500:]}"
        if os.environ.get("MC_REQUIRE_STORE_SERVERS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    port = proc.stdout.strip().splitlines()[-1]
    try:
        yield {"http": f"http://127.0.0.1:{port}/metadata", "etcd": f"etcd://127.0.0.1:{port}",
               "redis": f"redis://127.0.0.1:{port}"}[kind]
    finally:
        subprocess.run([str(SERVERS), "stop", work], capture_output=True, timeout=60)


def new_store(master, global_segment_size=0, local_buffer_size=16 << 20, **kw):
    """A MooncakeDistributedStore in this process set up against `master` (P2PHANDSHAKE, tcp;
    by default lending no memory); `kw` goes to setup."""
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, local_buffer_size, "tcp", "",
                 master.addr, **kw)
    assert rc == 0
    return s


def store_fixtures(lease_ms, holder_segment):
    """The fixtures of a module whose tests run a client in this process that lends no memory,
    beside a holder client in another process that lends `holder_segment` bytes, so that
    every transfer crosses the engine:
        master, holder, store = store_fixtures(lease_ms=500, holder_segment=64 << 20)
    `master` (per module: default_kv_lease_ttl=lease_ms), `holder` (a StoreProc, per module),
    `store` (per test: new_store(master); everything removed and the store closed after)."""
    import pytest

    @pytest.fixture(scope="module", name="master")
    def master():
        m = Master(default_kv_lease_ttl=lease_ms)
        yield m
        m.stop()

    @pytest.fixture(scope="module", name="holder")
    def holder(master):
        h = StoreProc(master, global_segment_size=holder_segment)
        yield h
        h.close()

    @pytest.fixture(name="store")
    def store(master, holder):
        s = new_store(master)
        yield s
        s.remove_all(force=True)
        s.close()

    return master, holder, store


def lending_store_fixtures(lease_ms, segment, local_buffer, clean=True):
    """The fixtures of a module whose tests share one client in this process that lends
    `segment` bytes itself (no holder process):
        master, store, _clean = lending_store_fixtures(1000, 256 << 20, 32 << 20)
    `master` and `store` are per module; `_clean` (autouse) removes every object after each
    test that used `store` (None when clean=False)."""
    import pytest
    from mooncake.store import MooncakeDistributedStore

    @pytest.fixture(scope="module", name="master")
    def master():
        m = Master(default_kv_lease_ttl=lease_ms)
        yield m
        m.stop()

    @pytest.fixture(scope="module", name="store")
    def store(master):
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "",
                       master.addr) == 0
        yield s
        s.close()

    @pytest.fixture(autouse=True, name="_clean")
    def _clean(request):
        yield
        if "store" in request.fixturenames:
            request.getfixturevalue("store").remove_all(force=True)

    return master, store, (_clean if clean else None)


def buf(n, seed=None):
    """A numpy uint8 array of n bytes: zeros, or data(seed, n)."""
    import numpy as np
    a = np.zeros(n, dtype=np.uint8)
    if seed is not None:
        a[:] = np.frombuffer(data(seed, n), dtype=np.uint8)
    return a


def ptr(a, off=0):
    """The address of byte `off` of the numpy array `a`."""
    return a.ctypes.data + off


def _tail(path, n=4000):
    try:
        return pathlib.Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Master:
    """mooncake_master on free ports (--rpc_port, --metrics_port; or the ones given, e.g. to
    restart a master where it was); `flags` are extra --name=value flags. Started and serving (its /metrics answers) when the constructor
    returns."""

    def __init__(self, rpc_port=None, metrics_port=None, **flags):
        if not MASTER_BIN.exists():
            raise AssertionError(f"{MASTER_BIN} is missing: run scripts/python_test.sh")
        self.log = tempfile.NamedTemporaryFile(prefix="mc_master_", suffix=".log", delete=False)
        for _ in range(5 if rpc_port is None else 1):
            self.rpc_port = rpc_port or free_port()
            self.metrics_port = metrics_port or free_port()
            args = [str(MASTER_BIN), f"--rpc_port={self.rpc_port}",
                    f"--metrics_port={self.metrics_port}", "--rpc_address=127.0.0.1"]
            args += [f"--{k}={v}" for k, v in flags.items()]
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
            try:
                wait_until(lambda: self.proc.poll() is not None or self._serving(), 15,
                           what="mooncake_master to serve")
            except AssertionError:
                self.stop()
                raise
            if self.proc.poll() is None:
                return
            # It exited: most likely a port was taken between free_port() and bind; retry.
        raise AssertionError("mooncake_master did not start:\n" + _tail(self.log.name))

    @property
    def addr(self):
        return f"127.0.0.1:{self.rpc_port}"

    def _serving(self):
        try:
            self.metrics_text(timeout=0.5)
            return True
        except OSError:
            return False

    def metrics_text(self, timeout=5):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()

    def metrics(self):
        """{name: value} of the samples of /metrics."""
        out = {}
        for line in self.metrics_text().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def metric(self, name):
        return self.metrics()[name]

    def stop(self):
        terminate(self.proc)
        self.log.close()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class WorkerError(AssertionError):
    pass


class StoreProc:
    """A Store client in a child process, set up against `master` (setup's positional form);
    setup's return code is `setup_rc` (the process stays usable when it is not 0); `env`: extra
    environment variables of the child."""

    def __init__(self, master, global_segment_size=64 << 20, local_buffer_size=16 << 20,
                 setup=True, env=None):
        self.log = tempfile.NamedTemporaryFile(prefix="mc_store_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
            env={**os.environ, "GLOG_minloglevel": os.environ.get("GLOG_minloglevel", "0"),
                 **(env or {})})
        self.setup_rc = None
        self.hostname = None
        if setup:
            self.setup_rc = self.call(
                "result = store.setup('127.0.0.1', 'P2PHANDSHAKE', gseg, lbuf, 'tcp', '', addr)",
                gseg=global_segment_size, lbuf=local_buffer_size, addr=master.addr)
            if self.setup_rc != 0:
                raise WorkerError(f"setup returned {self.setup_rc}:\n" + _tail(self.log.name))
            self.hostname = self.call("result = store.get_hostname()")

    def call(self, code, timeout=120, **variables):
        """Runs `code` in the worker with `variables` bound; returns its `result`."""
        if self.proc.poll() is not None:
            raise WorkerError(f"store worker exited ({self.proc.returncode}):\n" +
                              _tail(self.log.name))
        self.proc.stdin.write(json.dumps({"code": code, "vars": variables}) + "\n")
        self.proc.stdin.flush()
        line = _readline(self.proc.stdout, timeout)
        if line is None:
            self.kill()
            raise WorkerError(f"store worker did not answer within {timeout} s:\n" +
                              _tail(self.log.name))
        if not line:
            self.proc.wait(timeout=10)
            raise WorkerError(f"store worker exited ({self.proc.returncode}):\n" +
                              _tail(self.log.name))
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(reply["error"] + "\n--- worker log:\n" + _tail(self.log.name))
        return _decode(reply["result"])

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def close(self):
        """Closes the store (if the worker lives), ends the worker, removes its log."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the worker closes the store and exits on EOF
                self.proc.wait(timeout=20)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stdin):
            try:
                f.close()
            except Exception:
                pass
        self.log.close()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)


def _readline(f, timeout):
    """A line of f (text mode), '' at EOF, None after `timeout` seconds."""
    import select
    if select.select([f], [], [], timeout)[0]:
        return f.readline()
    return None


def _encode(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"__bytes__": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _encode(x) for k, x in v.items()}
    return v


def _decode(v):
    if isinstance(v, dict):
        if set(v) == {"__bytes__"}:
            return base64.b64decode(v["__bytes__"])
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def _worker():
    # The protocol has its own descriptor; fd 1 goes to the log, so nothing else writes into it.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import numpy as np
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    ns = {"store": store, "np": np, "data": data, "ReplicateConfig": ReplicateConfig,
          "time": time}
    for line in sys.stdin:
        req = json.loads(line)
        ns.update(req["vars"])
        ns["result"] = None
        try:
            exec(req["code"], ns)
            reply = {"result": _encode(ns["result"])}
        except BaseException:
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
    store.close()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker()
