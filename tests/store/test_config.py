"""Store client config parsing: positional/dict/env/JSON doors agree and reject bad input."""

from __future__ import annotations

import json

import pytest

from mooncake_core.store.config import DummyAttach, StoreConfig, parse_bool


def test_positional_defaults_and_size_strings() -> None:
    c = StoreConfig("127.0.0.1", "http://127.0.0.1:8080/metadata", "1 GB", "512MB")
    assert c.global_segment_size == 1 << 30
    assert c.local_buffer_size == 512 << 20
    assert c.protocol == "tcp"
    assert c.master_server_addr == "127.0.0.1:50051"


@pytest.mark.parametrize("bad", ["50%", "-1", "1 XB", "", "abc", -5])
def test_bad_sizes_rejected_with_field_name(bad) -> None:
    with pytest.raises(ValueError, match="global_segment_size"):
        StoreConfig("h", "P2PHANDSHAKE", global_segment_size=bad)


def test_bad_protocol_and_types() -> None:
    with pytest.raises(ValueError, match="protocol"):
        StoreConfig("h", "P2PHANDSHAKE", protocol="carrier-pigeon")
    with pytest.raises(TypeError, match="local_hostname"):
        StoreConfig(123, "P2PHANDSHAKE")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metadata_server"):
        StoreConfig("h", "  ")
    assert StoreConfig("h", "m", protocol="TCP").protocol == "tcp"


def test_dict_form_aliases_and_unknown_keys() -> None:
    c = StoreConfig.from_dict({
        "local_hostname": "h", "metadata_server": "m", "global_segment_size": "64MB",
        "master_server_address": "10.0.0.1:5000", "device_name": "", "ipc_socket_path": "x",
    })
    assert c.master_server_addr == "10.0.0.1:5000"
    assert c.global_segment_size == 64 << 20
    with pytest.raises(ValueError, match="unknown key 'global_segment'"):
        StoreConfig.from_dict({"local_hostname": "h", "metadata_server": "m", "global_segment": 1})
    with pytest.raises(ValueError, match="missing required key 'metadata_server'"):
        StoreConfig.from_dict({"local_hostname": "h"})
    with pytest.raises(TypeError):
        StoreConfig.from_dict(["local_hostname"])  # type: ignore[arg-type]


def test_dict_naming_a_client_server_address_attaches_as_a_dummy() -> None:
    """What LMCache's adapter hands ``setup(dict)`` (its defaults filled in) for a dummy."""
    lmcache = {"client_server_address": "127.0.0.1:50052", "local_buffer_size": "16MB",
               "global_segment_size": "3355443200", "protocol": "tcp", "device_name": "",
               "local_hostname": "h", "metadata_server": "m", "master_server_address": "x:1"}
    assert DummyAttach.wanted(lmcache) and not DummyAttach.wanted({"local_hostname": "h"})
    assert not DummyAttach.wanted({"client_server_address": ""}) and not DummyAttach.wanted("h")
    a = DummyAttach.from_dict(lmcache)
    assert (a.server_address, a.mem_pool_size, a.local_buffer_size) == ("127.0.0.1:50052", 0, 16 << 20)
    assert "global_segment_size" in a.ignored and "client_server_address" not in a.ignored
    assert DummyAttach.from_dict({"client_server_address": "h:1", "mem_pool_size": "1GB"}).mem_pool_size == 1 << 30
    with pytest.raises(ValueError, match="unknown key.*'segment'"):
        DummyAttach.from_dict({"client_server_address": "h:1", "segment": 1})
    with pytest.raises(ValueError, match="mem_pool_size"):
        DummyAttach.from_dict({"client_server_address": "h:1", "mem_pool_size": "50%"})
    with pytest.raises(TypeError, match="client_server_address"):
        DummyAttach.from_dict({"client_server_address": 50052})


def test_env_and_json_file(tmp_path) -> None:
    env = {
        "MOONCAKE_MASTER": "1.2.3.4:50051", "MOONCAKE_TE_META_DATA_SERVER": "http://x:8080/metadata",
        "MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "2GB",
        "MOONCAKE_LOCAL_BUFFER_SIZE": "128 MB", "MOONCAKE_LOCAL_HOSTNAME": "node7",
    }
    c = StoreConfig.load_from_env(env)
    assert (c.master_server_addr, c.local_hostname, c.global_segment_size, c.local_buffer_size) == \
        ("1.2.3.4:50051", "node7", 2 << 30, 128 << 20)
    assert c.metadata_server == "http://x:8080/metadata"
    with pytest.raises(ValueError, match="MOONCAKE_CONFIG_PATH"):
        StoreConfig.load_from_env({})
    with pytest.raises(ValueError, match="MOONCAKE_GLOBAL_SEGMENT_SIZE|global_segment_size"):
        StoreConfig.load_from_env({**env, "MOONCAKE_GLOBAL_SEGMENT_SIZE": "50%"})
    p = tmp_path / "mc.json"
    p.write_text(json.dumps({"local_hostname": "a", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": "m:1", "global_segment_size": "3 GB",
                             "protocol": "tcp", "device_name": ""}))
    c2 = StoreConfig.load_from_env({"MOONCAKE_CONFIG_PATH": str(p)})
    assert c2.global_segment_size == 3 << 30 and c2.master_server_addr == "m:1"
    assert c2.local_buffer_size == 1 << 30  # upstream file default
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        StoreConfig.from_file(str(p))
    with pytest.raises(ValueError, match="does not exist"):
        StoreConfig.from_file(str(tmp_path / "nope.json"))


def test_parse_bool() -> None:
    assert parse_bool("false") is False and parse_bool("TRUE") is True and parse_bool(1) is True
    with pytest.raises(ValueError):
        parse_bool("maybe")


@pytest.mark.parametrize("form", ["positional", "env"])
def test_protocol_and_device_reach_the_transfer_engine(form, monkeypatch, caplog) -> None:
    """setup(..., "rdma", devices) and MOONCAKE_PROTOCOL / MOONCAKE_DEVICE start the store's engine
    with them: an unknown NIC is refused by the engine's own check (run only under protocol rdma),
    before any master is contacted, and setup's error says what it was given."""
    from mooncake_core.store.client import MooncakeDistributedStore
    from mooncake_core.transfer.ucx import library
    try:
        library.load()  # the NIC check is the UCX transport's (CI installs the ucx extra)
    except library.UcxNotFound as e:
        pytest.skip(f"no UCX here: {e}")
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    s = MooncakeDistributedStore()
    with caplog.at_level("ERROR"):
        if form == "env":
            for k, v in {"MOONCAKE_MASTER": "127.0.0.1:1", "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
                         "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE", "MOONCAKE_PROTOCOL": "rdma",
                         "MOONCAKE_DEVICE": "no_such_nic0", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "16MB",
                         "MOONCAKE_LOCAL_BUFFER_SIZE": "16MB"}.items():
                monkeypatch.setenv(k, v)
            monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
            rc = s.setup()
        else:
            rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "rdma", "no_such_nic0", "127.0.0.1:1")
    assert rc < 0
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "'rdma', 'no_such_nic0') failed" in text and "unknown device(s) no_such_nic0" in text, text
    s.close()
