"""mooncake.mooncake_config: MooncakeConfig from a JSON file or the MOONCAKE_* variables, with
upstream's names, defaults and rules (vLLM and SGLang read it)."""
import json
import logging

import pytest

from mooncake import mooncake_config as mc
from mooncake.mooncake_config import (DEFAULT_GLOBAL_SEGMENT_SIZE, DEFAULT_LOCAL_BUFFER_SIZE,
                                      MooncakeConfig, _parse_bool, _parse_segment_size)

FULL = {
    "local_hostname": "node1", "metadata_server": "P2PHANDSHAKE",
    "master_server_address": "10.0.0.1:50051", "global_segment_size": "2GB",
    "local_buffer_size": 1 << 20, "protocol": "TCP", "device_name": "eth0",
    "enable_ssd_offload": "yes", "ssd_offload_path": "/nvme", "tenant_id": "t1",
    "enable_client_http_server": 1, "client_http_port": 19300,
}
ENV = [k for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_LOCAL_HOSTNAME",
                   "MOONCAKE_TE_META_DATA_SERVER", "MOONCAKE_GLOBAL_SEGMENT_SIZE",
                   "MOONCAKE_LOCAL_BUFFER_SIZE", "MOONCAKE_PROTOCOL", "MOONCAKE_DEVICE",
                   "MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
                   "MOONCAKE_TENANT_ID", "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
                   "MOONCAKE_CLIENT_HTTP_PORT")]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)


def write(tmp_path, cfg):
    p = tmp_path / "mooncake.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_from_file_every_field(tmp_path):
    c = MooncakeConfig.from_file(write(tmp_path, FULL))
    assert (c.local_hostname, c.metadata_server, c.master_server_address) == \
        ("node1", "P2PHANDSHAKE", "10.0.0.1:50051")
    assert c.global_segment_size == 2 << 30 and c.local_buffer_size == 1 << 20
    assert c.protocol == "tcp" and c.device_name == "eth0"
    assert c.enable_ssd_offload is True and c.ssd_offload_path == "/nvme"
    assert c.tenant_id == "t1" and c.enable_client_http_server is True
    assert c.client_http_port == 19300


def test_from_file_defaults_and_nulls(tmp_path):
    c = MooncakeConfig.from_file(write(tmp_path, {
        "local_hostname": "h", "metadata_server": "m", "master_server_address": "a:1",
        "tenant_id": None, "ssd_offload_path": None}))
    assert c.global_segment_size == DEFAULT_GLOBAL_SEGMENT_SIZE == 3355443200
    assert c.local_buffer_size == DEFAULT_LOCAL_BUFFER_SIZE == 1 << 30
    assert (c.protocol, c.device_name, c.tenant_id, c.ssd_offload_path) == \
        ("tcp", "", "default", "")
    assert c.enable_ssd_offload is False and c.enable_client_http_server is False
    assert c.client_http_port == 9300


@pytest.mark.parametrize("field", ["local_hostname", "metadata_server",
                                   "master_server_address"])
def test_required_fields(tmp_path, field):
    cfg = dict(FULL)
    del cfg[field]
    with pytest.raises(ValueError, match=f"Missing required config field: {field}"):
        MooncakeConfig.from_file(write(tmp_path, cfg))
    cfg[field] = "  "
    with pytest.raises(ValueError, match=field):
        MooncakeConfig.from_file(write(tmp_path, cfg))


def test_bad_values_name_the_field(tmp_path):
    for key, value, what in (("global_segment_size", -1, "global_segment_size"),
                             ("local_buffer_size", "lots", "segment size"),
                             ("enable_ssd_offload", "maybe", "boolean"),
                             ("protocol", "", "Invalid protocol"),
                             ("protocol", 5, "Invalid protocol"),
                             ("client_http_port", 70000, "client_http_port")):
        cfg = dict(FULL, **{key: value})
        with pytest.raises(ValueError, match=what):
            MooncakeConfig.from_file(write(tmp_path, cfg))
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        MooncakeConfig.from_file(str(p))


def test_unknown_protocol_warns_and_passes(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=mc.logger.name):
        c = MooncakeConfig.from_file(write(tmp_path, dict(FULL, protocol="RMDA")))
    assert c.protocol == "rmda"
    assert any("Unrecognised protocol" in r.message for r in caplog.records)


def test_load_from_env_variables(monkeypatch):
    with pytest.raises(ValueError, match="MOONCAKE_CONFIG_PATH"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    c = MooncakeConfig.load_from_env()
    assert (c.local_hostname, c.metadata_server, c.protocol) == \
        ("localhost", "P2PHANDSHAKE", "tcp")
    assert c.global_segment_size == DEFAULT_GLOBAL_SEGMENT_SIZE
    for k, v in (("MOONCAKE_LOCAL_HOSTNAME", "10.1.1.1"),
                 ("MOONCAKE_TE_META_DATA_SERVER", "http://m:8080/metadata"),
                 ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "512mb"),
                 ("MOONCAKE_LOCAL_BUFFER_SIZE", "268435456"),
                 ("MOONCAKE_PROTOCOL", "RDMA"), ("MOONCAKE_DEVICE", "mlx5_0"),
                 ("MOONCAKE_OFFLOAD_ENABLED", "on"),
                 ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/ssd"),
                 ("MOONCAKE_TENANT_ID", "env-tenant"),
                 ("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "true"),
                 ("MOONCAKE_CLIENT_HTTP_PORT", "19444")):
        monkeypatch.setenv(k, v)
    c = MooncakeConfig.load_from_env()
    assert c.local_hostname == "10.1.1.1" and c.metadata_server == "http://m:8080/metadata"
    assert c.global_segment_size == 512 << 20 and c.local_buffer_size == 256 << 20
    assert c.protocol == "rdma" and c.device_name == "mlx5_0"
    assert c.enable_ssd_offload and c.ssd_offload_path == "/ssd"
    assert c.tenant_id == "env-tenant" and c.enable_client_http_server
    assert c.client_http_port == 19444
    monkeypatch.setenv("MOONCAKE_CLIENT_HTTP_PORT", "x")
    with pytest.raises(ValueError, match="MOONCAKE_CLIENT_HTTP_PORT"):
        MooncakeConfig.load_from_env()


def test_config_path_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_MASTER", "ignored:1")
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", write(tmp_path, FULL))
    assert MooncakeConfig.load_from_env().master_server_address == "10.0.0.1:50051"
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(tmp_path / "absent.json"))
    with pytest.raises(FileNotFoundError):
        MooncakeConfig.load_from_env()


def test_sizes():
    for text, want in (("1024", 1024), ("  2048 ", 2048), ("1kb", 1024), ("1KB", 1024),
                       ("512k", 512 << 10), ("1.5kb", 1536), ("1mb", 1 << 20),
                       ("3GB", 3 << 30), ("1.5gb", int(1.5 * (1 << 30))), ("1t", 1 << 40),
                       ("4096B", 4096), ("1.5", 1), ("1e9", 10**9), (" 3 gb ", 3 << 30),
                       (1.5, 1), (0, 0)):
        assert _parse_segment_size(text) == want, text
    for bad in ("", "   ", "gb", "kb", "abc", "1xb", None, True, [1]):
        with pytest.raises(ValueError):
            _parse_segment_size(bad)


def test_bools():
    for v in (True, 1, "true", "YES", " on ", "enable", "1"):
        assert _parse_bool(v) is True
    for v in (False, 0, "false", "No", "off", "disable", "0", "", None):
        assert _parse_bool(v) is False
    with pytest.raises(ValueError):
        _parse_bool("maybe")


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match="local_buffer_size"):
        MooncakeConfig("h", "m", 0, -5, "tcp", "", "a:1")
    c = MooncakeConfig("h", "m", 0, 0, " Rdma ", None, "a:1")
    assert c.protocol == "rdma" and c.global_segment_size == 0
