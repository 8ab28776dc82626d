"""``mooncake.mooncake_config``: the original's ``MooncakeConfig`` contract on our package.

Code written for the original builds the config with its positional fields, reads sizes and
booleans as it does and relies on an unknown protocol being passed on (warned), not refused.
"""

from __future__ import annotations

import json
import logging

import pytest

from mooncake_core.store.config import StoreConfig
from mooncake_core.store.mooncake_config import (
    DEFAULT_GLOBAL_SEGMENT_SIZE,
    MooncakeConfig,
    parse_config_bool,
    parse_segment_size,
)
from mooncake_core.utils.net import local_ip

BASE = dict(local_hostname="h", metadata_server="http://m:8080/metadata", global_segment_size=0,
            local_buffer_size=1, protocol="tcp", device_name="", master_server_address="m:50051")


@pytest.mark.parametrize("given, size", [
    (7, 7), (2.9, 2), ("4096", 4096), (" 3 gb ", 3 << 30), ("512K", 512 << 10), ("1.5mb", 3 << 19),
    ("2T", 2 << 40), ("10b", 10), ("2.7", 2), ("2e3", 2000),
])
def test_sizes_read_as_the_original_reads_them(given, size) -> None:
    assert parse_segment_size(given) == size


@pytest.mark.parametrize("bad", ["", "  ", "kb", "G", "50%", "lots", "1 GiB"])
def test_a_size_that_is_no_number_of_bytes_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="segment size"):
        parse_segment_size(bad)


def test_booleans_from_strings_are_parsed_and_typos_refused() -> None:
    assert [parse_config_bool(v) for v in ("Yes", "off", "ENABLE", "0", "", None, 2, False)] == [
        True, False, True, False, False, False, True, False]
    with pytest.raises(ValueError, match="'ture'"):
        parse_config_bool("ture")


def test_unknown_protocol_is_passed_on_with_a_warning_and_our_store_config_refuses_it(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mooncake.mooncake_config"):
        cfg = MooncakeConfig(**{**BASE, "protocol": " UDP "})
    assert cfg.protocol == "udp" and "Unrecognised protocol 'udp'" in caplog.text
    with pytest.raises(ValueError, match="unknown protocol"):
        cfg.to_store_config()
    assert MooncakeConfig(**{**BASE, "protocol": "RDMA"}).protocol == "rdma"


@pytest.mark.parametrize("override, field", [
    ({"protocol": " "}, "protocol"), ({"protocol": None}, "protocol"), ({"local_buffer_size": -1}, "local_buffer_size"),
    ({"master_server_address": " "}, "master_server_address"), ({"local_hostname": ""}, "local_hostname"),
])
def test_structural_mistakes_are_refused_naming_the_field(override, field) -> None:
    with pytest.raises(ValueError, match=field):
        MooncakeConfig(**{**BASE, **override})


def test_file_config_fills_the_originals_defaults_and_names_a_missing_field(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "m:1", "tenant_id": None,
                                "enable_ssd_offload": "no", "client_http_port": "9400"}))
    cfg = MooncakeConfig.from_file(str(path))
    assert (cfg.global_segment_size, cfg.protocol, cfg.device_name, cfg.tenant_id, cfg.enable_ssd_offload,
            cfg.client_http_port) == (DEFAULT_GLOBAL_SEGMENT_SIZE, "tcp", "", "default", False, 9400)
    store = cfg.to_store_config()
    assert isinstance(store, StoreConfig) and store.master_server_address == "m:1"
    path.write_text(json.dumps({"local_hostname": "h", "master_server_address": "m:1"}))
    with pytest.raises(ValueError, match="Missing required config field: metadata_server"):
        MooncakeConfig.from_file(str(path))


def test_env_config_advertises_localhost_only_toward_a_loopback_master() -> None:
    with pytest.raises(ValueError, match="Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER'"):
        MooncakeConfig.load_from_env({})
    local = MooncakeConfig.load_from_env({"MOONCAKE_MASTER": "localhost:50051", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb"})
    assert (local.local_hostname, local.global_segment_size, local.metadata_server) == ("localhost", 1 << 30,
                                                                                       "P2PHANDSHAKE")
    remote = MooncakeConfig.load_from_env({"MOONCAKE_MASTER": "192.0.2.7:50051"})
    assert remote.local_hostname == local_ip(toward="192.0.2.7") != "localhost"  # the route's source
    named = MooncakeConfig.load_from_env({"MOONCAKE_MASTER": "192.0.2.7:50051", "MOONCAKE_LOCAL_HOSTNAME": "node3"})
    assert named.local_hostname == "node3"
