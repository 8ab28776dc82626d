"""Pure parts of the NIXL plugin package: parameters, the nixl ABI check, the ELF reader, the
compiler lookup. No nixl needed (runs in the main environment)."""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
from pathlib import Path

import pytest

from mooncake_connectors.nixl import abi, build, cli, locate
from mooncake_connectors.nixl.config import parse_params


def test_params_defaults_and_env() -> None:
    cfg = parse_params({}, env={}, default_host="10.0.0.7")
    assert (cfg.local_hostname, cfg.metadata_server, cfg.num_workers) == ("10.0.0.7", "P2PHANDSHAKE", 2)
    assert parse_params({}, env={"MOONCAKE_LOCAL_HOSTNAME": "h1"}).local_hostname == "h1"
    cfg = parse_params({"local_hostname": "h2:1234", "num_workers": "4", "metadata_server": "http://m/metadata"}, env={})
    assert (cfg.local_hostname, cfg.num_workers, cfg.metadata_server) == ("h2:1234", 4, "http://m/metadata")
    assert (cfg.protocol, cfg.device_name) == ("tcp", "")
    cfg = parse_params({"protocol": "RDMA", "device_name": " mlx5_0,mlx5_1 "}, env={})
    assert (cfg.protocol, cfg.device_name) == ("rdma", "mlx5_0,mlx5_1")  # names go to the engine as given


@pytest.mark.parametrize("params, needle", [({"num_threads": "4"}, "'num_threads'"), ({"num_workers": "x"}, "integer"),
                                            ({"num_workers": "0"}, "1-64"), ({"local_hostname": "a b"}, "local_hostname"),
                                            ({"protocol": "ib"}, "protocol must be one of tcp, rdma")])
def test_params_refused_with_the_key(params, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_params(params, env={})


def test_abi_check_names_both_versions() -> None:
    abi.check("1.5.1", 29)
    with pytest.raises(abi.NixlAbiMismatch, match=r"nixl 1\.6\.0 is installed.*1\.5\.1"):
        abi.check("1.6.0", 29)
    with pytest.raises(abi.NixlAbiMismatch, match=r"31-word.*29 words"):
        abi.check("1.5.1", 31)
    with pytest.raises(abi.NixlAbiMismatch, match="cannot be confirmed"):
        abi.check("1.5.1", None)


def test_elf_reader_on_libc() -> None:
    libc = Path(ctypes.util.find_library("c") or "")
    path = next((p for p in (Path("/lib/x86_64-linux-gnu") / libc.name, Path("/usr/lib/x86_64-linux-gnu") / libc.name)
                 if p.is_file()), None)
    if path is None:
        pytest.skip("libc not found at the Debian path")
    data = path.read_bytes()
    assert (abi.elf_symbol_size(data, "malloc") or 0) > 0
    assert abi.elf_symbol_size(data, "no_such_symbol_here") is None
    with pytest.raises(ValueError):
        abi.elf_symbol_size(b"not an elf" * 10, "x")


def _fake_nixl(tmp: Path, methods: int) -> Path:
    """A plugin dir whose libplugin_POSIX.so carries an engine vtable with `methods` virtuals."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    src = tmp / "fake.cpp"
    body = "".join(f"virtual int m{i}();" for i in range(methods))
    defs = "".join(f"int nixlBackendEngine::m{i}(){{return {i};}}" for i in range(methods))
    src.write_text(f"struct __attribute__((visibility(\"default\"))) nixlBackendEngine {{ virtual ~nixlBackendEngine(); "
                   f"{body} }}; nixlBackendEngine::~nixlBackendEngine(){{}} {defs}")
    d = tmp / "plugins"
    d.mkdir()
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(d / "libplugin_POSIX.so"), str(src)], check=True)
    return d


def test_vtable_size_read_from_a_compiled_plugin(tmp_path: Path) -> None:
    d = _fake_nixl(tmp_path, 27)  # 2 destructor slots + 27 + offset-to-top + RTTI = 31 words
    assert abi.vtable_words(d) == 31
    with pytest.raises(abi.NixlAbiMismatch, match="31-word"):
        locate.NixlInstall("nixl_cu12", "1.5.1", d).check_abi()


def test_cli_refuses_other_nixl(tmp_path: Path, monkeypatch, capsys) -> None:
    d = _fake_nixl(tmp_path, 25)
    fake = locate.NixlInstall("nixl_cu12", "1.6.0", d)
    monkeypatch.setattr(locate, "find_nixl", lambda: fake)
    monkeypatch.setattr(locate, "find_all", lambda: [fake])
    for cmd in ("install", "path"):
        assert cli.main([cmd]) == 2
        err = capsys.readouterr().err
        assert "nixl 1.6.0" in err and "1.5.1" in err
    assert not (d / locate.PLUGIN_FILE).exists()


def test_missing_compiler_names_debian_package(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(build.CompilerMissing, match=r"Debian package g\+\+"):
        build.find_compiler()
    with pytest.raises(build.CompilerMissing, match="--cxx"):
        build.find_compiler("clang++-99")


def test_build_id_tracks_sources() -> None:
    a = build.build_id()
    assert a == build.build_id() and len(a) == 16


def test_help_explains_every_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["install", "--help"])
    out = capsys.readouterr().out
    for flag in ("--cxx", "--force", "--plugin-dir"):
        assert flag in out
