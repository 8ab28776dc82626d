"""``mooncake_core.compat``: ``import mooncake.store`` / ``mooncake.engine`` resolve to ours.

Each case runs in a fresh interpreter so sys.modules of the test process stays clean.
"""

from __future__ import annotations

import os
import subprocess
import textwrap


def _run(python_exe: str, code: str, env: dict | None = None) -> str:
    e = dict(os.environ)
    e.pop("MOONCAKE_CORE_COMPAT", None)
    e.update(env or {})
    out = subprocess.run([python_exe, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=60, env=e)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_alias_store_and_engine(python_exe) -> None:
    out = _run(python_exe, """
        import importlib.util, sys
        assert importlib.util.find_spec("mooncake") is None, "original Mooncake installed here?"
        from mooncake_core import compat
        assert compat.install() is True
        assert compat.install() is True  # idempotent
        assert sum(type(f).__name__ == "_AliasFinder" for f in sys.meta_path) == 1
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
        import mooncake_core.store as ours
        assert MooncakeDistributedStore is ours.MooncakeDistributedStore
        import mooncake.store
        assert mooncake.store is ours and ours.__spec__.name == "mooncake_core.store"
        from mooncake.mooncake_config import MooncakeConfig
        import mooncake.engine
        from mooncake.engine import TransferEngine
        import mooncake_core.engine
        assert TransferEngine is mooncake_core.engine.TransferEngine
        print("ok")
    """)
    assert out.strip() == "ok"


def test_not_installed_without_import(python_exe) -> None:
    out = _run(python_exe, """
        try:
            import mooncake.store
        except ImportError:
            print("absent")
    """)
    assert out.strip() == "absent"


def test_respects_original_unless_forced(python_exe, tmp_path) -> None:
    pkg = tmp_path / "mooncake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("ORIGINAL = True\n")
    (pkg / "store.py").write_text("WHO = 'original'\n")
    code = """
        from mooncake_core import compat
        print(compat.install())
        import mooncake.store
        print(getattr(mooncake.store, "WHO", "ours"))
    """
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    assert _run(python_exe, code, env).split() == ["False", "original"]
    assert _run(python_exe, code, {**env, "MOONCAKE_CORE_COMPAT": "1"}).split() == ["True", "ours"]
    forced = code.replace("compat.install()", "compat.install(force=True)")
    assert _run(python_exe, forced, env).split() == ["True", "ours"]


def test_alias_ships_the_originals_async_store_and_a_real_file(python_exe) -> None:
    out = _run(python_exe, """
        import asyncio, os
        from mooncake_core import compat
        compat.install(force=True)
        import mooncake
        assert os.path.isfile(mooncake.__file__), mooncake.__file__
        from mooncake.async_store import MooncakeDistributedStoreAsync
        from mooncake_core.store.async_store import MooncakeDistributedStoreAsync as ours
        assert MooncakeDistributedStoreAsync is ours
        s = MooncakeDistributedStoreAsync()
        # not set up: the async form returns what the sync form returns, off the event loop
        assert asyncio.run(s.async_put("k", b"v")) == s.put("k", b"v") == -600
        assert asyncio.run(s.async_get("k")) == b""
        try:
            s.async_no_such_method
        except AttributeError as e:
            assert "no_such_method" in str(e)
        else:
            raise AssertionError("expected AttributeError")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_alias_ships_the_originals_structured_object_store_config_and_metadata_server(python_exe) -> None:
    out = _run(python_exe, """
        from mooncake_core import compat
        compat.install(force=True)
        from mooncake.http_metadata_server import KVBootstrapServer, KVPoll
        from mooncake_core.metadata.kv_bootstrap import KVBootstrapServer as our_server
        assert KVBootstrapServer is our_server and KVPoll.Success.value == 4
        from mooncake.mooncake_config import MooncakeConfig, _parse_segment_size
        from mooncake_core.store.mooncake_config import MooncakeConfig as our_config
        assert MooncakeConfig is our_config and _parse_segment_size("2kb") == 2048
        from mooncake.dataproto_catalog import DataProtoCatalog
        from mooncake.structured_object_store import export_dataproto_ref, import_dataproto_ref
        from mooncake_core.structured import DataProtoCatalog as our_catalog
        assert DataProtoCatalog is our_catalog and callable(export_dataproto_ref) and callable(import_dataproto_ref)
        from mooncake.structured_object_store import MISSING, _choose_leaf_codec, _escape_key, infer_structure
        import mooncake_core.structured as ours
        assert MISSING is ours.MISSING and infer_structure is ours.infer_structure
        assert _choose_leaf_codec is ours.choose_leaf_codec and _escape_key is ours.escape_key
        print("ok")
    """)
    assert out.strip() == "ok"
