"""A multi-host test harness on one machine: each "host" is a network namespace on one bridge.

    from mhcluster import Cluster
    with Cluster(4, workdir=tmp_path) as c:          # 4 hosts: 10.231.0.1 .. 10.231.0.4
        h0, h1 = c.hosts[0], c.hosts[1]
        m = c.start_master(h0, "--client_ttl=2")      # build/src/store/mooncake_master, ready
        p = h1.run(["sleep", "60"], log=tmp_path / "s.log")   # a HostProcess
        p.stop(); p.cont(); p.kill(); p.wait(5)       # real signals to the real process
        h1.check_call(["ip", "addr"])                 # short command: its stdout, raises on rc
        h1.python_json("import json; print(json.dumps({'a': 1}))")   # with build/py-venv
        status, body = h1.http_get(9003, "/health")   # from inside h1's namespace
        e = c.etcd(hosts=c.hosts[:3])                 # a 3-member etcd cluster, leader elected
        e.endpoints, e.leader(), e.member(0).stop(), e.etcdctl(h1, "put", "k", "v")

Cluster(n_hosts, workdir=None)   context manager; skips the test (pytest.skip, with the reason)
    where it cannot work: not root, no `ip` (iproute2) or `unshare` (util-linux). On entry it
    deletes what killed runs left (namespaces named mcmh-<pid>-... whose pid is gone, and the
    processes in them); on exit it kills every process it started and deletes its namespaces,
    whatever the test did. workdir: where logs and data go (default: a temporary folder,
    removed on a clean exit); pass pytest's tmp_path to keep them for a failed test.
  .hosts[i] / [i]   Host objects; .workdir; .build_dir (MC_BUILD_DIR or build/);
  .venv_python      build/py-venv/bin/python (MC_PY_VENV overrides the venv), with the package
  .etcd(hosts, ...) Etcd: one member per host, started and with a leader elected
  .start_master(host, *flags, port=50051, metrics_port=9003) -> HostProcess with .addr
    ("ip:port"), once its HTTP /health answers
Host: .name (its namespace), .index, .ip
  .run(argv, env=None, log=None, pipe=False, cwd=None) -> HostProcess   (daemons: returns at once)
  .call(argv, timeout=30, env=None, input=None) -> subprocess.CompletedProcess (text; never raises
    for the exit status)   .check_call(...) -> stdout, raising CommandFailed on a non-zero exit
  .python(code, timeout=60, env=None) -> stdout of `venv_python -c code`   .python_json(...) ->
    its last stdout line parsed as JSON   .run_python(code, **run_kw) -> HostProcess
  .http_get(port, path, timeout=5) -> (status, body str); status 0 when nothing answered
  .wait_port(port, timeout=15)   .net_bytes() -> (rx, tx) bytes counted on its eth0
HostProcess: .pid (the real process, as this test sees it), .log, .returncode
  .kill(sig=SIGKILL) .stop() (SIGSTOP) .cont() (SIGCONT) .wait(timeout) -> exit status (128+N
  when killed by signal N; raises subprocess.TimeoutExpired) .alive() .close() (kills it)
  .wait_for_log(regex, timeout) -> the match   .log_tail(n_bytes)
  pipe=True: stdin/stdout are pipes (stderr goes to the log): .send(line) .readline(timeout)
  .request(obj, timeout) sends one JSON line and returns the JSON line answered.

How a process runs: `ip netns exec <ns> unshare --pid --fork --mount-proc --kill-child python3
-c <init> argv...`: a small init is pid 1 of a fresh pid namespace and the program is its child
(pid 2), so signals reach the program as on a real host (pid 1 would ignore SIGTERM without a
handler), `killall` inside reaches nothing outside, and when the program ends the init exits
with its status and the kernel kills whatever the program left in its pid namespace. The
`unshare` process gets SIGKILL if the test process dies (PR_SET_PDEATHSIG; so start daemons
from the main thread: the signal follows the thread that started them), which kills the init
and so the namespace. Engines see another host, never a same-host shortcut: the transfer
engine's host id is the boot id plus the pid and net namespaces (src/common/host_id.cc), so
its shm transport does not apply and bytes go over TCP across the bridge. Every process gets
MC_TCP_BIND_ADDRESS=<its ip> (and no MC_HOST_ID) unless env says otherwise.

Address plan: 10.231.0.0/24; host i is 10.231.0.(i+1)/24 on its eth0; the bridge br0 sits in a
namespace of its own (mcmh-<pid>-<seq>-sw, port p<i> per host), so nothing of the cluster
exists in the machine's own network namespace. Two clusters at once (two test processes)
do not meet: each has its own bridge.
"""
import concurrent.futures
import ctypes
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import queue

REPO = pathlib.Path(__file__).resolve().parents[2]
PREFIX = "mcmh-"
SUBNET = "10.231.0"
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380

_seq = 0  # clusters made by this process (names stay unique one after another)

# pid 1 of each host process's pid namespace: runs argv as its child, reaps orphans, and exits
# with the child's status (128+N for signal N) when the child ends.
_INIT = r"""
import os, signal, sys
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        sys.stderr.write("mhcluster: cannot run %s: %s\n" % (sys.argv[1], e))
        os._exit(127)
while True:
    try:
        p, st = os.wait()
    except ChildProcessError:
        os._exit(1)
    if p == pid:
        os._exit(128 + os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))
"""


class CommandFailed(AssertionError):
    """A host command exited non-zero; the message has its argv, status and output."""


def unavailable_reason():
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces need CAP_NET_ADMIN)"
    for tool, pkg in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"no `{tool}` binary (Debian package {pkg})"
    return None


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise CommandFailed(f"`ip {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name):
    """Kills what runs in namespace `name`, then deletes it."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", name, check=False)


def remove_stale():
    """Deletes namespaces (and their processes) left by runs whose process is gone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(re.escape(PREFIX) + r"(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            _delete_namespace(name)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    out = []  # kernels without CONFIG_PROC_CHILDREN: scan /proc
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _set_pdeathsig():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class HostProcess:
    """A program started on a host (see the module's docstring)."""

    def __init__(self, host, argv, env, log, pipe, cwd):
        self.host, self.argv = host, [str(a) for a in argv]
        self.log = pathlib.Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "ab")
        self._lines = None
        self.addr = None  # set by helpers that start servers
        self._popen = subprocess.Popen(
            host._wrap(self.argv), env=host._env(env), cwd=cwd,
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else self._log_file, stderr=self._log_file,
            preexec_fn=_set_pdeathsig, text=pipe, bufsize=1 if pipe else -1)
        if pipe:
            self._lines = queue.Queue()
            threading.Thread(target=self._read_stdout, daemon=True).start()
        self._init_pid = None
        self.pid = self._find_pid()

    def _find_pid(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._popen.poll() is None:
            inits = _children(self._popen.pid)
            if inits:
                kids = _children(inits[0])
                if kids:
                    self._init_pid = inits[0]
                    return kids[0]
            time.sleep(0.005)
        return None

    def _read_stdout(self):
        for line in self._popen.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    @property
    def returncode(self):
        return self._popen.poll()

    def alive(self):
        return self._popen.poll() is None

    def _still_ours(self):
        if self.pid is None or self._popen.poll() is not None:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1]) == self._init_pid
        except (OSError, IndexError, ValueError):
            return False

    def kill(self, sig=signal.SIGKILL):
        """Sends sig to the program itself (not to a wrapper); no-op once it has ended."""
        if self._still_ours():
            os.kill(self.pid, sig)

    def stop(self):
        self.kill(signal.SIGSTOP)

    def cont(self):
        self.kill(signal.SIGCONT)

    def wait(self, timeout=None):
        """Its exit status (128+N when killed by signal N); raises subprocess.TimeoutExpired."""
        return self._popen.wait(timeout)

    def close(self):
        """Kills the program and everything in its pid namespace; idempotent."""
        if self._popen.poll() is None:
            self._popen.kill()  # unshare: --kill-child kills the init, the kernel the rest
            try:
                self._popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for f in (self._popen.stdin, self._popen.stdout):
            if f:
                try:
                    f.close()
                except OSError:
                    pass
        self._log_file.close()

    def log_text(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, n=3000):
        return self.log_text()[-n:]

    def wait_for_log(self, pattern, timeout=30.0):
        """Waits until the log matches regex `pattern`; raises with the log's tail otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log_text())
            if m:
                return m
            if time.monotonic() > deadline or not self.alive():
                raise AssertionError(f"{self.argv[:3]} on {self.host.ip}: no /{pattern}/ in "
                                     f"{self.log} (alive={self.alive()}):\n{self.log_tail()}")
            time.sleep(0.05)

    # pipe=True only
    def send(self, line):
        self._popen.stdin.write(line + "\n")
        self._popen.stdin.flush()

    def readline(self, timeout=30.0):
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.argv[:3]} on {self.host.ip}: no line within "
                                 f"{timeout} s; log:\n{self.log_tail()}") from None
        if line is None:
            self._lines.put(None)
            raise AssertionError(f"{self.argv[:3]} on {self.host.ip} closed its stdout "
                                 f"(status {self.returncode}); log:\n{self.log_tail()}")
        return line

    def request(self, obj, timeout=30.0):
        self.send(json.dumps(obj))
        return json.loads(self.readline(timeout))


class Host:
    """One namespace of a Cluster (see the module's docstring)."""

    def __init__(self, cluster, index):
        self.cluster, self.index = cluster, index
        self.name = f"{cluster.name}-h{index}"
        self.ip = f"{SUBNET}.{index + 1}"

    def __repr__(self):
        return f"Host({self.index}, {self.ip})"

    def _wrap(self, argv):
        return ["ip", "netns", "exec", self.name, "unshare", "--pid", "--fork", "--mount-proc",
                "--kill-child", sys.executable, "-S", "-c", _INIT, *[str(a) for a in argv]]

    def _env(self, env):
        e = {k: v for k, v in os.environ.items() if k != "MC_HOST_ID"}
        e["MC_TCP_BIND_ADDRESS"] = self.ip
        e.update(env or {})
        return e

    def run(self, argv, env=None, log=None, pipe=False, cwd=None):
        if log is None:
            log = self.cluster.workdir / f"h{self.index}-{pathlib.Path(str(argv[0])).name}-" \
                                         f"{self.cluster._next_id()}.log"
        p = HostProcess(self, argv, env, log, pipe, cwd)
        self.cluster._procs.append(p)
        return p

    def call(self, argv, timeout=30, env=None, input=None):
        return subprocess.run(self._wrap(argv), env=self._env(env), capture_output=True,
                              text=True, timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def check_call(self, argv, timeout=30, env=None, input=None):
        r = self.call(argv, timeout=timeout, env=env, input=input)
        if r.returncode != 0:
            raise CommandFailed(f"{[str(a) for a in argv]} on {self.ip} exited {r.returncode}:"
                                f"\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}")
        return r.stdout

    def python(self, code, timeout=60, env=None):
        return self.check_call([self.cluster.venv_python, "-c", code], timeout=timeout, env=env)

    def python_json(self, code, timeout=60, env=None):
        lines = [ln for ln in self.python(code, timeout, env).splitlines() if ln.strip()]
        if not lines:
            raise CommandFailed(f"python on {self.ip} printed nothing")
        return json.loads(lines[-1])

    def run_python(self, code, **kw):
        return self.run([self.cluster.venv_python, "-c", code], **kw)

    def http_get(self, port, path, timeout=5.0, host=None):
        """GET http://<host or this ip>:port/path from inside this namespace: (status, body)."""
        code = ("import json, sys, urllib.request, urllib.error\n"
                "try:\n"
                "    r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))\n"
                "    s, b = r.status, r.read()\n"
                "except urllib.error.HTTPError as e:\n"
                "    s, b = e.code, e.read()\n"
                "except Exception as e:\n"
                "    s, b = 0, str(e).encode()\n"
                "print(json.dumps([s, b.decode('utf-8', 'replace')]))\n")
        url = f"http://{host or self.ip}:{port}{path}"
        out = self.check_call([sys.executable, "-S", "-c", code, url, str(timeout)],
                              timeout=timeout + 10)
        status, body = json.loads(out)
        return status, body

    def wait_port(self, port, timeout=15.0, host=None):
        """Waits until host:port (default: this host) accepts a TCP connection."""
        code = ("import socket, sys, time\n"
                "end = time.monotonic() + float(sys.argv[3])\n"
                "while True:\n"
                "    try:\n"
                "        socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()\n"
                "        break\n"
                "    except OSError:\n"
                "        if time.monotonic() > end: sys.exit(1)\n"
                "        time.sleep(0.05)\n")
        r = self.call([sys.executable, "-S", "-c", code, host or self.ip, str(port), str(timeout)],
                      timeout=timeout + 10)
        if r.returncode != 0:
            raise AssertionError(f"{host or self.ip}:{port} not accepting after {timeout} s")

    def net_bytes(self):
        """(rx, tx) bytes of this host's eth0."""
        out = self.check_call(["cat", "/sys/class/net/eth0/statistics/rx_bytes",
                               "/sys/class/net/eth0/statistics/tx_bytes"])
        rx, tx = out.split()
        return int(rx), int(tx)


class Etcd:
    """An etcd cluster, one member per host (Cluster.etcd)."""

    def __init__(self, cluster, hosts, heartbeat_ms, election_ms, extra_args):
        self.cluster, self.hosts = cluster, list(hosts)
        self.binary = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.path.exists(self.binary):
            _skip_or_fail("no etcd binary (Debian package etcd-server)")
        self.etcdctl_binary = shutil.which("etcdctl") or "/usr/bin/etcdctl"
        if not os.path.exists(self.etcdctl_binary):
            _skip_or_fail("no etcdctl binary (Debian package etcd-client)")
        names = [f"m{i}" for i in range(len(self.hosts))]
        initial = ",".join(f"{n}=http://{h.ip}:{ETCD_PEER_PORT}" for n, h in zip(names, self.hosts))
        env = {"ETCDCTL_API": "3"}
        arch = os.uname().machine
        if arch not in ("x86_64", "amd64"):
            env["ETCD_UNSUPPORTED_ARCH"] = {"aarch64": "arm64"}.get(arch, arch)
        self._members = []
        for n, h in zip(names, self.hosts):
            client = f"http://{h.ip}:{ETCD_CLIENT_PORT}"
            peer = f"http://{h.ip}:{ETCD_PEER_PORT}"
            data = cluster.workdir / f"etcd-{n}.data"
            shutil.rmtree(data, ignore_errors=True)
            argv = [self.binary, "--name", n, "--data-dir", data,
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", cluster.name,
                    "--heartbeat-interval", str(heartbeat_ms),
                    "--election-timeout", str(election_ms), *extra_args]
            self._members.append(h.run(argv, env=env, log=cluster.workdir / f"etcd-{n}.log"))
        self.endpoints = ";".join(f"{h.ip}:{ETCD_CLIENT_PORT}" for h in self.hosts)
        self.urls = ",".join(f"http://{h.ip}:{ETCD_CLIENT_PORT}" for h in self.hosts)

    def member(self, i):
        return self._members[i]

    def etcdctl(self, host, *args, endpoints=None, timeout=10.0, command_timeout=3.0):
        """Runs etcdctl on `host` against `endpoints` (default: every member):
        a CompletedProcess."""
        argv = [self.etcdctl_binary, f"--endpoints={endpoints or self.urls}",
                "--dial-timeout=1s", f"--command-timeout={command_timeout}s", *args]
        return host.call(argv, timeout=timeout, env={"ETCDCTL_API": "3"})

    def status(self, i, timeout=1.0):
        """Member i's `endpoint status` (the Status object), or None when it does not answer;
        asked from member i's own host."""
        r = self.etcdctl(self.hosts[i], "endpoint", "status", "-w", "json",
                         endpoints=f"http://{self.hosts[i].ip}:{ETCD_CLIENT_PORT}",
                         timeout=timeout + 10, command_timeout=timeout)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)[0]["Status"]
        except (ValueError, KeyError, IndexError):
            return None

    def statuses(self, timeout=1.0):
        with concurrent.futures.ThreadPoolExecutor(len(self.hosts)) as ex:
            return list(ex.map(lambda i: self.status(i, timeout), range(len(self.hosts))))

    def leader(self, timeout=1.0):
        """Index of the member that leads: among the members answering, the one that says it
        leads in the highest term; None when none does."""
        best = None
        for i, s in enumerate(self.statuses(timeout)):
            if s and s.get("leader") and s["leader"] == s["header"]["member_id"]:
                if best is None or s["raftTerm"] > best[1]:
                    best = (i, s["raftTerm"])
        return None if best is None else best[0]

    def wait_leader(self, timeout=15.0, among=None):
        """Waits until a member of `among` (default: all) leads; its index."""
        deadline = time.monotonic() + timeout
        while True:
            i = self.leader()
            if i is not None and (among is None or i in among):
                return i
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- m{k}:\n{m.log_tail(1500)}" for k, m in
                                 enumerate(self._members))
                raise AssertionError(f"no etcd leader among {among} within {timeout} s\n{logs}")
            time.sleep(0.1)


def _skip_or_fail(reason):
    import pytest
    if os.environ.get("CI") == "true" or os.environ.get("MC_REQUIRE_MULTIHOST") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class Cluster:
    """n_hosts namespaces on one bridge (see the module's docstring)."""

    def __init__(self, n_hosts, workdir=None):
        global _seq
        _seq += 1
        self.n_hosts = n_hosts
        self.name = f"{PREFIX}{os.getpid()}-{_seq}"
        self._workdir_arg = workdir
        self._procs, self._namespaces, self._ids = [], [], 0
        self.hosts = []
        self.build_dir = pathlib.Path(os.environ.get("MC_BUILD_DIR", REPO / "build"))

    def __getitem__(self, i):
        return self.hosts[i]

    def _next_id(self):
        self._ids += 1
        return self._ids

    def __enter__(self):
        reason = unavailable_reason()
        if reason:
            import pytest
            pytest.skip(f"multi-host harness: {reason}")
        remove_stale()
        if self._workdir_arg is None:
            self.workdir = pathlib.Path(tempfile.mkdtemp(prefix=self.name + "-"))
            self._own_workdir = True
        else:
            self.workdir = pathlib.Path(self._workdir_arg)
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._own_workdir = False
        try:
            self._create()
        except BaseException:
            self._teardown()
            raise
        return self

    def _create(self):
        sw = f"{self.name}-sw"
        _ip("netns", "add", sw)
        self._namespaces.append(sw)
        _ip("-n", sw, "link", "set", "lo", "up")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i in range(self.n_hosts):
            h = Host(self, i)
            _ip("netns", "add", h.name)
            self._namespaces.append(h.name)
            _ip("-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                "netns", h.name)
            _ip("-n", sw, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", sw, "link", "set", f"p{i}", "up")
            _ip("-n", h.name, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            _ip("-n", h.name, "link", "set", "eth0", "up")
            _ip("-n", h.name, "link", "set", "lo", "up")
            self.hosts.append(h)

    def __exit__(self, exc_type, exc, tb):
        self._teardown()
        if self._own_workdir and exc_type is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        elif exc_type is not None:
            sys.stderr.write(f"mhcluster: logs kept in {self.workdir}\n")
        return False

    def _teardown(self):
        for p in self._procs:
            try:
                p.close()
            except Exception:
                pass
        for ns in reversed(self._namespaces):
            _delete_namespace(ns)
        self._namespaces = []

    @property
    def venv_python(self):
        if getattr(self, "_venv_python", None):
            return self._venv_python
        venv = pathlib.Path(os.environ.get("MC_PY_VENV", REPO / "build" / "py-venv"))
        py = venv / "bin" / "python"
        ok = py.exists() and subprocess.run([py, "-c", "import mooncake.store"],
                                            capture_output=True, timeout=60).returncode == 0
        if not ok:
            _skip_or_fail(f"{py} cannot import mooncake.store: install the package first "
                          "(MC_PY_INSTALL_ONLY=1 scripts/python_test.sh)")
        self._venv_python = str(py)
        return self._venv_python

    def etcd(self, hosts, heartbeat_ms=100, election_ms=1000, extra_args=(), timeout=20.0):
        """Starts one etcd member on each of `hosts` (an --initial-cluster of them) and waits
        until a leader is elected and every member answers."""
        e = Etcd(self, hosts, heartbeat_ms, election_ms, list(extra_args))
        e.wait_leader(timeout)
        deadline = time.monotonic() + timeout
        while not all(e.statuses()):
            if time.monotonic() > deadline:
                raise AssertionError("not every etcd member answers")
            time.sleep(0.1)
        return e

    def start_master(self, host, *flags, port=50051, metrics_port=9003, timeout=20.0):
        """Starts build/src/store/mooncake_master on `host` (--rpc_address=its ip), returns
        once its HTTP /health answers 200; .addr is "ip:port"."""
        binary = self.build_dir / "src" / "store" / "mooncake_master"
        if not binary.exists():
            _skip_or_fail(f"{binary} is missing: build first (make build) or set MC_BUILD_DIR")
        m = host.run([binary, f"--rpc_address={host.ip}", f"--rpc_port={port}",
                      f"--metrics_port={metrics_port}", *flags],
                     log=self.workdir / f"master-h{host.index}-{self._next_id()}.log")
        m.addr = f"{host.ip}:{port}"
        deadline = time.monotonic() + timeout
        while host.http_get(metrics_port, "/health", timeout=1)[0] != 200:
            if time.monotonic() > deadline or not m.alive():
                raise AssertionError(f"master on {host.ip} not healthy:\n{m.log_tail()}")
            time.sleep(0.1)
        return m
