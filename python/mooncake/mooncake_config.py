"""MooncakeConfig: the Store client's settings, from a JSON file or MOONCAKE_* variables.

The same names, defaults and rules as upstream Mooncake's mooncake.mooncake_config, which
vLLM's and SGLang's Mooncake integrations read:

    config = MooncakeConfig.load_from_env()       # MOONCAKE_CONFIG_PATH, else MOONCAKE_*
    config = MooncakeConfig.from_file("mooncake.json")
    store.setup(config.local_hostname, config.metadata_server, config.global_segment_size,
                config.local_buffer_size, config.protocol, config.device_name,
                config.master_server_address)

File fields (JSON object): local_hostname, metadata_server, master_server_address (required,
non-empty); global_segment_size (default 3355443200), local_buffer_size (default 1 GiB): an
int or a string such as "512MB", "1.5gb", "4096b" (binary units; "k", "m", "g", "t" too);
protocol ("tcp"; lower-cased; an unknown name is logged and passed on, the engine decides);
device_name (""); enable_ssd_offload (false; true/false, 1/0, yes/no, on/off,
enable/disable); ssd_offload_path (""); tenant_id ("default"); enable_client_http_server
(false); client_http_port (9300).

Environment (used when MOONCAKE_CONFIG_PATH is unset; MOONCAKE_MASTER is then required):
MOONCAKE_MASTER, MOONCAKE_LOCAL_HOSTNAME ("localhost"), MOONCAKE_TE_META_DATA_SERVER
("P2PHANDSHAKE"), MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_BUFFER_SIZE, MOONCAKE_PROTOCOL,
MOONCAKE_DEVICE, MOONCAKE_OFFLOAD_ENABLED, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH,
MOONCAKE_TENANT_ID, MOONCAKE_ENABLE_CLIENT_HTTP_SERVER, MOONCAKE_CLIENT_HTTP_PORT.

Bad values raise ValueError naming the field. tenant_id is what callers pass to
setup(tenant_id=...) (a master in strict multi-tenant mode keeps each tenant's keys apart).
This package's Store has no SSD tier and no client HTTP server: those fields are parsed so
that configs written for upstream load unchanged, and setup refuses them turned on.
"""
import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824    # 1 GiB
DEFAULT_CLIENT_HTTP_PORT = 9300

# Longest suffix first, so that "kb" is not read as "b".
_UNITS = (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40),
          ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1))

# Names upstream's engine or Store know. A hint for the warning only: the engine refuses what
# its build lacks, with its own message.
KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
})

_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")
_TRUE = ("true", "1", "yes", "on", "enable")
_FALSE = ("false", "0", "no", "off", "disable")


def _parse_segment_size(value) -> int:
    """Bytes of a size: an int (floats truncate), or a string of a number with an optional
    binary unit ("3 gb", "512MB", "1.5k", "1e9"). ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"Invalid segment size: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"Invalid segment size: {value!r}")
    s = value.strip().lower()
    if not s:
        raise ValueError("Invalid segment size: empty string")
    for suffix, scale in _UNITS:
        if s.endswith(suffix):
            number = s[:-len(suffix)].strip()
            if not number:
                raise ValueError(f"Invalid segment size: missing number before '{suffix}'")
            return int(_number(number, value) * scale)
    return int(_number(s, value))


def _number(text, original):
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"Invalid segment size: {original!r}") from None


def _parse_bool(value) -> bool:
    """A config boolean given as a bool, a number or a word; ValueError for other words."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    s = str(value).strip().lower()
    if not s:
        return False
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"Invalid boolean value: {value!r}")


def _parse_port(value, field):
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"Invalid {field}: {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"Invalid {field}: {port} (0..65535)")
    return port


@dataclass
class MooncakeConfig:
    """The Store client's settings (see the module docstring for each field)."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = DEFAULT_CLIENT_HTTP_PORT

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}. Protocol must be a "
                             "non-empty string, e.g. 'tcp' or 'rdma'.")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r; passing it through to the Mooncake "
                           "engine unchanged. Known protocols are: %s.", self.protocol,
                           ", ".join(sorted(KNOWN_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}. Size must be "
                                 "non-negative.")
        for name in _REQUIRED:
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, "
                                 f"got {v!r}.")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """The config in a JSON file; ValueError for a missing required field or bad value."""
        with open(file_path) as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ValueError(f"{file_path}: the config must be a JSON object")
        for name in _REQUIRED:
            if name not in cfg:
                raise ValueError(f"Missing required config field: {name}")

        def text(name, default):
            v = cfg.get(name)
            return default if v is None else str(v)

        return MooncakeConfig(
            local_hostname=cfg["local_hostname"],
            metadata_server=cfg["metadata_server"],
            global_segment_size=_parse_segment_size(
                cfg.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                cfg.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=cfg.get("protocol", "tcp"),
            device_name=cfg.get("device_name", ""),
            master_server_address=cfg["master_server_address"],
            enable_ssd_offload=_parse_bool(cfg.get("enable_ssd_offload", False)),
            ssd_offload_path=text("ssd_offload_path", ""),
            tenant_id=text("tenant_id", "default"),
            enable_client_http_server=_parse_bool(cfg.get("enable_client_http_server", False)),
            client_http_port=_parse_port(cfg.get("client_http_port", DEFAULT_CLIENT_HTTP_PORT),
                                         "client_http_port"),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """from_file($MOONCAKE_CONFIG_PATH) when it is set, else the MOONCAKE_* variables;
        ValueError when neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                             "'MOONCAKE_MASTER' is set.")
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(
                env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=env("MOONCAKE_MASTER"),
            enable_ssd_offload=_parse_bool(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=_parse_port(
                env("MOONCAKE_CLIENT_HTTP_PORT", str(DEFAULT_CLIENT_HTTP_PORT)),
                "MOONCAKE_CLIENT_HTTP_PORT"),
        )


__all__ = ["MooncakeConfig", "DEFAULT_GLOBAL_SEGMENT_SIZE", "DEFAULT_LOCAL_BUFFER_SIZE"]
