"""What the harness (mhcluster.py) promises: hosts reach each other only over the bridge, each
process is alone in its pid namespace with real signals, and nothing outlives a cluster or a
killed run."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mhcluster import PREFIX, Cluster, unavailable_reason


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split()]


def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_state(pid, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while state(pid) != want:
        assert time.monotonic() < deadline, f"pid {pid} is {state(pid)}, not {want}"
        time.sleep(0.01)


def test_addresses_exist_only_inside_the_hosts(tmp_path):
    with Cluster(3, workdir=tmp_path) as c:
        assert [h.ip for h in c.hosts] == ["10.231.0.1", "10.231.0.2", "10.231.0.3"]
        for h in c.hosts:
            addrs = h.check_call(["ip", "-4", "-o", "addr"])
            assert re.findall(r"inet (\S+)", addrs) == ["127.0.0.1/8", f"{h.ip}/24"]
            assert h.check_call(["ip", "-4", "route"]).split()[0] == "10.231.0.0/24"
        mine = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        assert "10.231.0." not in mine
        # A listener on host 0 is reached from host 2 across the bridge, not from this namespace.
        srv = c[0].run([sys.executable, "-m", "http.server", "8000", "--bind", c[0].ip])
        c[2].wait_port(8000, host=c[0].ip)
        status, body = c[2].http_get(8000, "/", host=c[0].ip)
        assert status == 200 and "Directory listing" in body
        assert c[1].http_get(8000, "/")[0] == 0  # nothing on host 1 itself
        srv.kill(signal.SIGTERM)
        assert srv.wait(5) == 128 + signal.SIGTERM


def test_each_process_has_its_own_pid_namespace(tmp_path):
    with Cluster(2, workdir=tmp_path) as c:
        a = c[0].run(["sleep", "60"])
        b = c[1].run(["sleep", "60"])
        same_host = c[0].run(["sleep", "60"])
        # Inside, a program is pid 2 (its init is 1) and sees no other process.
        assert c[0].python_json("import json, os; print(json.dumps(os.getpid()))") == 2
        assert c[0].python_json("import json, os; print(json.dumps(sorted(int(d) for d in "
                                "os.listdir('/proc') if d.isdigit())))") == [1, 2]
        # "killall" from a host reaches none of them.
        c[0].check_call(["sh", "-c", "kill -9 -1; true"])
        # Signals reach the program itself: SIGSTOP / SIGCONT, then kill -9.
        a.stop()
        wait_state(a.pid, "T")
        a.cont()
        wait_state(a.pid, "S")
        a.kill()
        assert a.wait(5) == 137
        assert b.alive() and same_host.alive()
        pid = b.pid
    assert not os.path.exists(f"/proc/{pid}")  # the cluster's exit killed the rest


def test_teardown_after_a_failure_and_stale_leftovers(tmp_path):
    with pytest.raises(RuntimeError):
        with Cluster(2, workdir=tmp_path) as c:
            p = c[1].run(["sleep", "60"])
            p.stop()
            names = [h.name for h in c.hosts]
            raise RuntimeError("the test failed")
    assert not set(names) & set(namespaces())
    assert not os.path.exists(f"/proc/{p.pid}")

    # What a killed run leaves: a namespace named for a pid that is gone, a daemon in it.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{PREFIX}{dead.pid}-1-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    daemon = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "300"],
                              start_new_session=True)
    with Cluster(1, workdir=tmp_path) as c:
        assert stale not in namespaces()
        assert daemon.wait(5) == -signal.SIGKILL
        assert c[0].name in namespaces()
    assert not [n for n in namespaces() if n.startswith(f"{PREFIX}{os.getpid()}-")]


def test_skips_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert unavailable_reason() == "needs root (network namespaces need CAP_NET_ADMIN)"
