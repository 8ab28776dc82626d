"""gflags-style flag parsing of mooncake_master (pure, no processes)."""

from __future__ import annotations

import pytest

from mooncake_core.store.flags import FlagError, HelpRequested, master_flagset
from mooncake_core.store.master_main import config_from_flags, main


def parse(*argv: str) -> dict:
    return master_flagset().parse(list(argv))


def test_defaults_match_mooncake() -> None:
    v = parse()
    assert v["port"] == 50051
    assert v["metrics_port"] == 9003
    assert v["eviction_high_watermark_ratio"] == 0.90
    assert v["eviction_ratio"] == 0.05
    assert v["client_ttl"] == 10
    assert v["http_metadata_server_port"] == 8080
    assert v["enable_ha"] is False and v["enable_offload"] is False
    assert v["default_kv_lease_ttl"] == 10000


@pytest.mark.parametrize("argv", [["--port=1234"], ["--port", "1234"], ["-port=1234"], ["-port", "1234"]])
def test_value_forms(argv: list[str]) -> None:
    assert parse(*argv)["port"] == 1234


@pytest.mark.parametrize("argv,expected", [
    (["--enable_ha"], True),
    (["--enable_ha=true"], True),
    (["--enable_ha=1"], True),
    (["--enable_ha=false"], False),
    (["--enable_ha=False"], False),
    (["--noenable_ha"], False),
    (["--enable_ha", "--noenable_ha"], False),
    ([], False),
])
def test_bool_forms(argv: list[str], expected: bool) -> None:
    assert parse(*argv)["enable_ha"] is expected


def test_bool_does_not_swallow_next_flag() -> None:
    v = parse("--enable_offload", "--root_fs_dir", "/tmp/x")
    assert v["enable_offload"] is True and v["root_fs_dir"] == "/tmp/x"


def test_dash_and_underscore_and_types() -> None:
    v = parse("--log-level=debug", "--eviction_ratio", "0.1", "--quota_bytes=2 GB",
              "--etcd_endpoints=127.0.0.1:2379;127.0.0.1:2380")
    assert v["log_level"] == "debug"
    assert v["eviction_ratio"] == 0.1
    assert v["quota_bytes"] == 2 * 1024**3
    assert v["etcd_endpoints"] == "127.0.0.1:2379;127.0.0.1:2380"


@pytest.mark.parametrize("argv,fragment", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--port=abc"], "--port: expected an integer"),
    (["--port=70000"], "port number"),
    (["--eviction_ratio=1.5"], "between 0.0 and 1.0"),
    (["--eviction_high_watermark_ratio=x"], "expected a number"),
    (["--enable_ha=maybe"], "expected a boolean"),
    (["--port"], "missing value"),
    (["--client_ttl=0"], "must be > 0"),
    (["--quota_bytes=50%"], "cannot parse size"),
    (["positional"], "unexpected positional argument"),
    (["--noport"], "unknown flag"),
    (["--log_level=loud"], "must be one of"),
])
def test_bad_values_rejected_clearly(argv: list[str], fragment: str) -> None:
    with pytest.raises(FlagError) as ei:
        parse(*argv)
    assert fragment in str(ei.value)


def test_flag_combinations_checked() -> None:
    with pytest.raises(FlagError, match="--root_fs_dir"):
        config_from_flags(parse("--enable_offload"))
    with pytest.raises(FlagError, match="--etcd_endpoints"):
        config_from_flags(parse("--enable_ha"))
    cfg = config_from_flags(parse("--default_kv_lease_ttl=500", "--client_ttl=3"))
    assert cfg.default_kv_lease_ttl_ms == 500 and cfg.client_ttl_s == 3.0


def test_help_lists_every_flag(capsys) -> None:
    with pytest.raises(HelpRequested):
        parse("--help")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in master_flagset().flags:
        assert f"--{name} " in out


def test_main_exit_code_2_on_bad_flag(capsys) -> None:
    assert main(["--nope"]) == 2
    assert "unknown flag --nope" in capsys.readouterr().err


def test_config_file_and_command_line_precedence(tmp_path) -> None:
    import json

    from mooncake_core.store.flags import apply_config_file

    cfg = tmp_path / "master.json"
    cfg.write_text(json.dumps({"rpc_port": 6000, "client_live_ttl_sec": 4, "enable_offload": True,
                               "root_fs_dir": "/tmp/x", "eviction_ratio": "0.2"}))
    fs = master_flagset()
    v = apply_config_file(fs, fs.parse([f"--config_path={cfg}", "--rpc_port=7000"]))
    assert v["rpc_port"] == 7000, "the command line wins"
    assert v["client_ttl"] == 4 and v["enable_offload"] is True and v["eviction_ratio"] == 0.2
    for bad, fragment in (({"nope": 1}, "unknown setting 'nope'"),
                          ({"port": "abc"}, "expected an integer"),
                          ({"enable_ha": 3}, "expected bool"),
                          ({"eviction_ratio": 7}, "between 0.0 and 1.0")):
        cfg.write_text(json.dumps(bad))
        with pytest.raises(FlagError, match=fragment):
            apply_config_file(fs, fs.parse([f"--config_path={cfg}"]))
    cfg.write_text("{not json")
    with pytest.raises(FlagError, match="not valid JSON"):
        apply_config_file(fs, fs.parse([f"--config_path={cfg}"]))
    with pytest.raises(FlagError, match="cannot read"):
        apply_config_file(fs, fs.parse([f"--config_path={tmp_path / 'missing.json'}"]))


def test_cluster_id_namespaces_ha_key_and_ssd_dir_as_the_original(tmp_path, capsys, monkeypatch) -> None:
    from mooncake_core.store.ha import LEADER_KEY, leader_key

    assert parse()["cluster_id"] == "mooncake_cluster"  # the original's default
    assert LEADER_KEY == "mooncake-store/mooncake_cluster/master/leader"
    assert leader_key("ci_test_cluster") == "mooncake-store/ci_test_cluster/master/leader"
    cfg = config_from_flags(parse("--cluster_id=ci_test_cluster/", f"--root_fs_dir={tmp_path}"))
    assert cfg.root_fs_dir == str(tmp_path / "ci_test_cluster")  # a trailing '/' is dropped, as upstream
    for bad in ("a/b", "..", "", "x" * 129, "sp ace"):
        with pytest.raises(FlagError, match="--cluster_id.*1-128 characters"):
            parse(f"--cluster_id={bad}")
    assert main(["--cluster_id=../etc"]) == 2
    assert "--cluster_id" in capsys.readouterr().err


def test_every_flag_of_the_original_master_is_implemented_or_refused_with_a_reason() -> None:
    from mooncake_core.store.flags import MASTER_NOT_IMPLEMENTED

    fs = master_flagset()
    assert not set(MASTER_NOT_IMPLEMENTED) & set(fs.flags)
    with pytest.raises(FlagError, match=r"--enable_snapshot is a flag of the original mooncake_master .*no snapshots"):
        parse("--enable_snapshot=true")
    with pytest.raises(FlagError, match="--kv-events-queue-capacity is a flag of the original.*no queue"):
        parse("--kv-events-queue-capacity", "10")
    assert parse("--kv-events-bind-endpoint", "tcp://0.0.0.0:5557")["kv_events_bind_endpoint"] == "tcp://0.0.0.0:5557"
    # the SSD-tier flags the original's CI passes: this master's mode, so accepted
    v = parse("--enable_offload=true", "--offload_on_evict=true", "--promotion_on_hit=true",
              "--promotion_admission_threshold=1", "--root_fs_dir=/tmp/x")
    assert config_from_flags(v).enable_offload
    with pytest.raises(FlagError, match="--offload_on_evict=false is not implemented"):
        config_from_flags(parse("--enable_offload", "--offload_on_evict=false", "--root_fs_dir=/tmp/x"))
    with pytest.raises(FlagError, match="--promotion_admission_threshold.*only 1 is implemented"):
        parse("--promotion_admission_threshold=2")
    with pytest.raises(FlagError, match="--ha_backend_type.*must be etcd or redis"):
        parse("--ha_backend_type=k8s")
