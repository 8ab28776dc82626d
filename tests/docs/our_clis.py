"""Parse a doc's command line with our own CLI's parser, in process, without running it.

Our commands are the console scripts of pyproject.toml (each module has ``build_parser()``;
``mooncake_master`` and ``mooncake_client`` their gflags-style flag sets) and the benches, ``python3 -m bench.<role>.<name>``
(or ``python3 bench/<role>/<name>.py``). A flag a doc
uses that the code no longer has fails here, naming the doc line; other programs (vLLM,
SGLang, curl) are left to the tests that run them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def console_scripts() -> dict[str, str]:
    """name -> "module:function" from pyproject.toml's [project.scripts]."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', section, re.M))


def _bench_parser(path: str) -> Any:
    """``bench/<role>/<name>.py``'s parser, imported as the package module the docs run."""
    return importlib.import_module(path[:-len(".py")].replace("/", ".")).build_parser()


def program(words: list[str]) -> tuple[str, list[str]] | None:
    """(our program's name, its arguments) when ``words`` runs one of ours, else None."""
    if not words:
        return None
    if words[0] in console_scripts():
        return words[0], words[1:]
    if Path(words[0]).name in ("python", "python3") and len(words) > 1:
        if words[1].startswith("bench/") and words[1].endswith(".py"):
            return words[1], words[2:]
        if words[1] == "-m" and len(words) > 2 and words[2].startswith("bench."):
            return words[2].replace(".", "/") + ".py", words[3:]
    return None


def parse_error(name: str, args: list[str]) -> str | None:
    """None when our program ``name`` accepts ``args``; else the parser's message."""
    if name == "mooncake_master":
        from mooncake_core.store.flags import FlagError, HelpRequested, apply_config_file, master_flagset
        from mooncake_core.store.master_main import config_from_flags

        fs = master_flagset()
        try:
            config_from_flags(apply_config_file(fs, fs.parse(args)))
        except HelpRequested:
            return None
        except (FlagError, ValueError) as e:
            return str(e)
        return None
    if name == "mooncake_client":
        from mooncake_core.store.flags import FlagError, HelpRequested
        from mooncake_core.store.real_client_main import client_flagset

        try:
            client_flagset().parse(args)
        except HelpRequested:
            return None
        except FlagError as e:
            return str(e)
        return None
    if name.startswith("bench/"):
        parser = _bench_parser(name)
    else:
        module = console_scripts()[name].split(":")[0]
        parser = importlib.import_module(module).build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        return None if e.code in (0, None) else err.getvalue().strip() or f"exit {e.code}"
    return None
