"""The ``sglang.srt.plugins`` entry point: discovered by SGLang's own loader, installs the
``mooncake`` alias (never over an installed original unless MOONCAKE_CORE_COMPAT=1), idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from .conftest import REPO, sglang_env

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent("""
    import json, os, sys
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins, load_plugins_by_group
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    load_plugins()
    load_plugins()  # SGLang calls it from several places; must stay harmless
    out = {"found": {k: v[1] for k, v in found.items()}}
    try:
        import mooncake.engine, mooncake.store
        te = mooncake.engine.TransferEngine()
        import mooncake_connectors.sglang.plugin as plugin
        out.update(engine=mooncake.engine.__name__, store=mooncake.store.__name__,
                   plugin_file=os.path.realpath(plugin.__file__),
                   engine_file=os.path.realpath(sys.modules["mooncake_core.engine"].__file__),
                   get_engine_is_self=te.get_engine() is te,
                   bind_env=os.environ.get("MC_TCP_BIND_ADDRESS"))
    except ImportError as e:
        out["import_error"] = str(e)
    print(json.dumps(out))
""")


def _probe(py: str, **env: str) -> dict:
    r = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, timeout=180, env=sglang_env(**env),
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_entry_point_found_by_sglang_loader(sglang_python):
    out = _probe(sglang_python)
    assert out["found"].get("mooncake") == "mooncake-core", out
    assert out["engine"] == "mooncake_core.engine" and out["store"] == "mooncake_core.store", out
    # the checkout under test is what runs (not wherever the venv's editable install points)
    assert out["plugin_file"] == os.path.join(REPO, "mooncake_connectors", "sglang", "plugin.py"), out
    assert out["engine_file"] == os.path.join(REPO, "mooncake_core", "engine.py"), out
    assert out["get_engine_is_self"] is True  # SGLang's MooncakeTransferEngine.get_engine() works
    assert out["bind_env"] is None  # the plugin leaves the bind address to the engine (local_hostname's host)


def test_ib_device_reaches_our_engine(sglang_python):
    """SGLang's MooncakeTransferEngine, fed as --disaggregation-ib-device feeds it (a NIC list, or
    SGLang's per-GPU JSON), starts our engine on exactly that NIC with protocol rdma (UCX rails
    published on lo); an unknown NIC is refused by the engine, naming it."""
    side = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_device_side.py")
    env = {k: v for k, v in sglang_env(MC_FORCE_TCP="").items() if k not in ("UCX_TLS", "UCX_NET_DEVICES")}
    r = subprocess.run([sglang_python, side], capture_output=True, text=True, timeout=180, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    f = json.loads(r.stdout.strip().splitlines()[-1])["facts"]
    assert f["alias"] is True
    assert f["plain"] == {"engine": "mooncake_core.engine", "ucx_rails": ["lo"]}
    assert f["per_gpu_json"] == {"engine": "mooncake_core.engine", "ucx_rails": ["lo"]}  # GPU 0's entry
    assert f["unknown"]["error"].startswith("RuntimeError")
    assert "device_name 'no_such_nic0': unknown device(s) no_such_nic0" in r.stderr


def test_sglang_plugins_whitelist_excludes_it(sglang_python):
    out = _probe(sglang_python, SGLANG_PLUGINS="some_other_plugin")
    assert "mooncake" not in out["found"]
    assert "import_error" in out, out  # nothing else provides `mooncake` in that venv


REGISTER = textwrap.dedent("""
    import json, sys
    from mooncake_connectors.sglang.plugin import register
    first, second = register(), register()
    import mooncake
    finders = sum(type(f).__module__ == "mooncake_core.compat" for f in sys.meta_path)
    origin = getattr(mooncake, "__file__", None) or ""
    # the alias reports its real file (mooncake_core/compat.py), so tools that read __file__ work
    print(json.dumps({"first": first, "second": second, "finders": finders,
                      "origin": "alias" if origin.endswith("mooncake_core/compat.py") else origin}))
""")


def _register(python_exe: str, tmp_path, *, original: bool, compat: str = "") -> dict:
    env = sglang_env(MOONCAKE_CORE_COMPAT=compat)
    if original:  # a stand-in for an installed original wheel: a real `mooncake` package on sys.path
        pkg = tmp_path / "site" / "mooncake"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("ORIGINAL = True\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env["PYTHONPATH"]])
    r = subprocess.run([python_exe, "-c", REGISTER], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_register_is_idempotent(python_exe, tmp_path):
    out = _register(python_exe, tmp_path, original=False)
    assert out == {"first": True, "second": True, "finders": 1, "origin": "alias"}


def test_register_leaves_an_installed_original_alone(python_exe, tmp_path):
    out = _register(python_exe, tmp_path, original=True)
    assert out["first"] is False and out["finders"] == 0
    assert out["origin"].endswith("site/mooncake/__init__.py")


def test_register_forced_over_original_with_compat_env(python_exe, tmp_path):
    out = _register(python_exe, tmp_path, original=True, compat="1")
    assert out["first"] is True and out["finders"] == 1 and out["origin"] == "alias"
