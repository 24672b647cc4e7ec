"""The Store over the engine's metadata stores (etcd, redis, http) instead of P2PHANDSHAKE:
clients named by their local_hostname find each other through the store, in three processes.

The servers come from scripts/store_servers.sh (installs etcd-server / redis-server from Debian
when missing; http is this project's mooncake_http_metadata_server from a build directory).
A server that cannot start skips its case, unless MC_REQUIRE_STORE_SERVERS=1 (CI).
"""
import pathlib

import pytest

from store_helpers import Master, StoreProc, data
from store_helpers import metadata_server as store_metadata_server


@pytest.fixture(params=["http", "etcd", "redis"])
def metadata_server(request):
    with store_metadata_server(request.param) as url:
        yield url


def free_range(n):
    """n consecutive ports that nothing holds now (below the ephemeral range, so that the
    kernel does not hand them out to connections meanwhile)."""
    import random
    import socket
    for _ in range(200):
        base = random.randint(20000, 32000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports")


def named_client(master, name, meta, segment, env=None):
    """A client set up with local_hostname `name` (no port): under a metadata server its
    segment is name:<port>, the port picked in MC_STORE_CLIENT_MIN_PORT..MAX (12300..14300)."""
    p = StoreProc(master, setup=False, env=env)
    rc = p.call("result = store.setup(name, meta, gseg, 4 << 20, 'tcp', '', addr)",
                name=name, meta=meta, gseg=segment, addr=master.addr)
    assert rc == 0, f"setup of {name} with {meta} returned {rc}"
    p.hostname = p.call("result = store.get_hostname()")
    host, _, port = p.hostname.rpartition(":")
    assert host == name and port.isdigit(), p.hostname
    lo, hi = (int((env or {}).get(k, d)) for k, d in
              (("MC_STORE_CLIENT_MIN_PORT", 12300), ("MC_STORE_CLIENT_MAX_PORT", 14300)))
    assert lo <= int(port) <= hi, p.hostname
    return p


def test_clients_find_each_other_through_the_metadata_store(metadata_server):
    with Master() as m:
        made = []
        try:
            holder = named_client(m, "holder-0", metadata_server, 64 << 20)
            made.append(holder)
            writer = named_client(m, "prefill-0", metadata_server, 0)
            made.append(writer)
            reader = named_client(m, "decode-0", metadata_server, 0)
            made.append(reader)
            # Neither writer nor reader lends memory: every byte goes through holder-0's segment,
            # reached by name through the metadata store.
            sizes = [1, 4096, (1 << 20) + 3, 9 << 20]
            assert writer.call("result = [store.put(f'm{i}', data(i, n)) for i, n in "
                               "enumerate(sizes)]", sizes=sizes) == [0] * len(sizes)
            assert reader.call("result = [store.get(f'm{i}') == data(i, n) for i, n in "
                               "enumerate(sizes)]", sizes=sizes) == [True] * len(sizes)
            assert m.metric("master_mounted_segments") == 1
        finally:
            for p in made:
                p.close()


def test_clients_of_one_host_share_a_local_hostname(metadata_server):
    """Tensor-parallel ranks on one node all call setup("127.0.0.1", <metadata>): each gets its
    own segment name 127.0.0.1:<port>, and every one of them serves and reads objects. A range
    of 3 ports for 3 clients makes the later ones draw again past held ports."""
    base = free_range(3)
    env = {"MC_STORE_CLIENT_MIN_PORT": str(base), "MC_STORE_CLIENT_MAX_PORT": str(base + 2)}
    with Master() as m:
        made = []
        try:
            for _ in range(3):
                made.append(named_client(m, "127.0.0.1", metadata_server, 16 << 20, env=env))
            names = [p.hostname for p in made]
            assert len(set(names)) == 3, names
            assert m.metric("master_mounted_segments") == 3
            # Each rank writes into its own segment (preferred) and the others read it.
            for i, p in enumerate(made):
                rc = p.call("from mooncake.store import ReplicateConfig\n"
                            "cfg = ReplicateConfig(); cfg.preferred_segments = [me]\n"
                            "result = store.put(f'r{i}', data(i, (1 << 20) + i), cfg)",
                            i=i, me=p.hostname)
                assert rc == 0
            for i, p in enumerate(made):
                for j in range(3):
                    assert p.call("result = store.get(f'r{j}') == data(j, (1 << 20) + j)",
                                  j=j), (i, j)
            # A fourth client finds no free port in the range: setup fails with a code.
            extra = StoreProc(m, setup=False, env=env)
            made.append(extra)
            rc = extra.call("result = store.setup('127.0.0.1', meta, 0, 4 << 20, 'tcp', '', addr)",
                            meta=metadata_server, addr=m.addr)
            assert rc < 0, rc
        finally:
            for p in made:
                p.close()


def test_a_name_in_use_is_retried_with_another_port(metadata_server):
    """A client named 127.0.0.1:<base> explicitly (its port not held: the engine listens on a
    port of its own) and a client asking for a port in base..base+1: when it draws base the
    http metadata server reports the name in use and the client tries another port, so it
    always ends at base+1. (etcd and redis replace entries without saying so; there the held
    port alone keeps the names of one host apart.)"""
    if not metadata_server.startswith("http"):
        pytest.skip("only the http metadata server reports a name in use")
    base = free_range(2)
    env = {"MC_STORE_CLIENT_MIN_PORT": str(base), "MC_STORE_CLIENT_MAX_PORT": str(base + 1)}
    with Master() as m:
        made = []
        try:
            first = StoreProc(m, setup=False)
            made.append(first)
            assert first.call("result = store.setup(f'127.0.0.1:{base}', meta, 8 << 20, 4 << 20, "
                              "'tcp', '', addr)", base=base, meta=metadata_server,
                              addr=m.addr) == 0
            retried = False
            for _ in range(12):  # draws are random: until one drew 13310 (2^-12 it never does)
                p = named_client(m, "127.0.0.1", metadata_server, 8 << 20, env=env)
                assert p.hostname == f"127.0.0.1:{base + 1}", p.hostname
                retried = "trying another port" in pathlib.Path(p.log.name).read_text()
                p.close()
                if retried:
                    break
            assert retried
        finally:
            for p in made:
                p.close()
