"""The native LMCache connector's settings (pure: no LMCache, no sockets): the same keys and
precedence as LMCache's built-in Mooncake adapter, and every mistake reported with the key the
user wrote (LMCache swallows construction errors, so that log line is all the user sees)."""

from __future__ import annotations

import json

import pytest

from mooncake_connectors.lmcache.settings import ConfigError, l2_settings_from, settings_from

BASE = {"local_hostname": "127.0.0.1", "metadata_server": "http://127.0.0.1:1/metadata",
        "master_server_address": "127.0.0.1:50051"}


def test_defaults_and_precedence_follow_lmcache() -> None:
    s = settings_from(dict(BASE, save_chunk_meta=False, transfer_timeout=3,
                           **{"remote_storage_plugin.mooncake_core.module_path": "x"}), environ={})
    assert s.setup["global_segment_size"] == "3355443200" and s.setup["local_buffer_size"] == "1073741824"
    assert s.setup["protocol"] == "tcp" and s.setup["device_name"] == ""
    assert "save_chunk_meta" not in s.setup and not any(k.startswith("remote_storage") for k in s.setup)
    assert s.transfer_timeout == 3.0 and s.prefer_local_alloc is False
    # mooncake_<key> wins over the plain key; LMCache-only keys never reach the store
    s = settings_from(dict(BASE, global_segment_size="1GB", mooncake_global_segment_size="2GB",
                           mooncake_prefer_local_alloc=True, mooncake_transfer_timeout=2), environ={})
    assert s.setup["global_segment_size"] == "2GB" and s.prefer_local_alloc and s.transfer_timeout == 2.0
    assert "prefer_local_alloc" not in s.setup and "transfer_timeout" not in s.setup
    assert s.source("global_segment_size") == "extra_config['mooncake_global_segment_size']"


def test_rpc_timeout_stays_below_lmcache_blocking_timeout() -> None:
    assert settings_from(BASE, blocking_timeout_secs=10, environ={}).setup["rpc_timeout"] == 5.0
    assert settings_from(BASE, blocking_timeout_secs=2, environ={}).setup["rpc_timeout"] == 1.0
    assert settings_from(dict(BASE, mooncake_rpc_timeout="0.7"), environ={}).setup["rpc_timeout"] == "0.7"


def test_config_file_wins(tmp_path) -> None:
    f = tmp_path / "mc.json"
    f.write_text(json.dumps(dict(BASE, master_server_address="10.0.0.9:50051")))
    s = settings_from(dict(BASE), environ={"MOONCAKE_CONFIG_PATH": str(f)})
    assert s.setup["master_server_address"] == "10.0.0.9:50051"
    assert s.source("master_server_address").startswith("MOONCAKE_CONFIG_PATH")
    f.write_text("{not json")
    with pytest.raises(ConfigError, match="MOONCAKE_CONFIG_PATH.*not valid JSON"):
        settings_from(BASE, environ={"MOONCAKE_CONFIG_PATH": str(f)})


@pytest.mark.parametrize("extra, key, what", [
    ({"global_segment_size": "lots"}, "extra_config['global_segment_size']", "lots"),
    ({"mooncake_local_buffer_size": "-5"}, "extra_config['mooncake_local_buffer_size']", "-5"),
    ({"protocol": "carrier-pigeon"}, "extra_config['protocol']", "carrier-pigeon"),
    ({"mooncake_no_such_knob": "1"}, "extra_config['mooncake_no_such_knob']", "unknown key"),
    ({"transfer_timeout": "soon"}, "extra_config['transfer_timeout']", "soon"),
    ({"mooncake_prefer_local_alloc": "maybe"}, "extra_config['mooncake_prefer_local_alloc']", "maybe"),
    ({"mooncake_rpc_timeout": "0"}, "extra_config['mooncake_rpc_timeout']", "rpc_timeout"),
])
def test_bad_values_name_the_key(extra, key, what) -> None:
    with pytest.raises(ConfigError) as ei:
        settings_from(dict(BASE, **extra), environ={})
    assert ei.value.key == key and key in str(ei.value) and what in str(ei.value)


def test_missing_settings_name_the_key() -> None:
    with pytest.raises(ConfigError, match="extra_config: no Mooncake settings"):
        settings_from(None, environ={})
    with pytest.raises(ConfigError, match=r"^extra_config\['metadata_server'\]: .*missing"):
        settings_from({"local_hostname": "h", "master_server_address": "h:1"}, environ={})


def test_l2_adapter_params_are_the_store_keys_and_name_adapter_params() -> None:
    """The multiprocess mode's L2 adapter: the same store keys, errors say ``adapter_params``,
    and (the mapping being ours alone) an unknown key is an error, not a silent default."""
    s = l2_settings_from(dict(BASE, global_segment_size="0", num_workers=3), environ={})
    assert s.num_workers == 3 and s.store.setup["global_segment_size"] == "0"
    assert s.store.source("master_server_address") == "adapter_params['master_server_address']"
    assert "num_workers" not in s.store.setup
    for params, key, what in (
            ({"master_server_adress": "h:1"}, "adapter_params['master_server_adress']", "unknown key"),
            ({"global_segment_size": "lots"}, "adapter_params['global_segment_size']", "lots"),
            ({"num_workers": 0}, "adapter_params['num_workers']", "positive integer")):
        with pytest.raises(ConfigError) as ei:
            l2_settings_from(dict(BASE, **params), environ={})
        assert ei.value.key == key and what in str(ei.value)
    with pytest.raises(ConfigError, match=r"^adapter_params\['master_server_address'\]: missing"):
        l2_settings_from({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}, environ={})
