"""The doc-block extractor (pure), and the checks on every doc that need no process: each shell
block is run by a doc test or marked not runnable with a reason, and each of our commands in
any block (run or not) parses with the code's own CLI parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from .doc_blocks import (
    assignments, commands, doc_files, expand, extract_blocks, inline_spans, load_docs, logical_lines, marker_problems,
)
from .doc_runs import RUNS
from .our_clis import console_scripts, parse_error, program

REPO = Path(__file__).resolve().parents[2]
BLOCKS = load_docs(REPO)
SHELL = [b for b in BLOCKS if b.lang == "bash"]


# ---------------------------------------------------------------------------- extractor
DOC = """\
# Title

Text.

<!-- not-run: needs a GPU -->
```bash
pip install x
```

<!-- doc-test: demo -->

```bash
mooncake_demo \\
    --size 8MiB   # a comment
```

````markdown
```bash
not a block of its own
```
````

```python
print("no marker needed")
```

<!-- notrun: typo -->
```bash
echo unmarked
```
"""


def test_blocks_lines_languages_and_markers() -> None:
    bs = extract_blocks(DOC, "x.md")
    assert [(b.line, b.lang) for b in bs] == [(6, "bash"), (12, "bash"), (17, "markdown"), (23, "python"), (28, "bash")]
    assert bs[0].marker is not None and (bs[0].marker.kind, bs[0].marker.value) == ("not-run", "needs a GPU")
    assert bs[1].marker is not None and (bs[1].marker.kind, bs[1].marker.value) == ("doc-test", "demo")
    assert bs[1].text == "mooncake_demo \\\n    --size 8MiB   # a comment"
    assert bs[2].text == "```bash\nnot a block of its own\n```"  # a longer fence holds a shorter one
    assert bs[1].where(1) == "x.md:14"
    assert bs[4].marker is None and "unknown marker 'notrun'" in bs[4].marker_error


def test_marker_problems_name_file_and_line() -> None:
    problems = marker_problems(extract_blocks(DOC, "x.md"))
    assert problems == ["x.md:28: unknown marker 'notrun' (use doc-test: or not-run:)"]
    bare = marker_problems(extract_blocks("text\n```bash\nls\n```\n", "y.md"))
    assert len(bare) == 1 and bare[0].startswith("y.md:2: ```bash block has no marker")
    empty = marker_problems(extract_blocks("<!-- not-run: -->\n```bash\nls\n```\n", "z.md"))
    assert empty == ["z.md:2: empty not-run marker"]


def test_unclosed_fence_runs_to_the_end() -> None:
    [b] = extract_blocks("```bash\nls\nmore", "u.md")
    assert b.text == "ls\nmore"


def test_commands_split_like_the_shell() -> None:
    text = ('A="--x 1 --y 2"   # set\n'
            'VLLM_X=0 prog $A --port 8100 \\\n  --cfg \'{"a": 1}\' &\n'
            'one && two; three | four\n'
            "\n# a comment line\n"
            "five --json '{\"k\":\n  \"v\"}'\n")
    cs = commands(text)
    assert [(c.offset, c.words, c.background) for c in cs] == [
        (0, (), False),
        (1, ("prog", "$A", "--port", "8100", "--cfg", '{"a": 1}'), True),
        (3, ("one",), False), (3, ("two",), False), (3, ("three",), False), (3, ("four",), False),
        (6, ("five", "--json", '{"k":\n  "v"}'), False)]  # a quote keeps its newline and indent
    assert cs[1].env == (("VLLM_X", "0"),)
    v = assignments(cs)
    assert v == {"A": "--x 1 --y 2"}
    assert expand(cs[1].words, v) == ["prog", "--x", "1", "--y", "2", "--port", "8100", "--cfg", '{"a": 1}']
    assert expand(("${A}x", "$UNKNOWN"), v) == ["--x 1 --y 2x", "$UNKNOWN"]
    assert logical_lines("a \\\n b\nc") == [(0, "a b"), (2, "c")]
    with pytest.raises(ValueError, match=r"line \+0: unclosed quote"):
        commands("echo 'never closed")


def test_inline_spans_outside_fences() -> None:
    text = "Run `mooncake_master --port 1` and `x`.\n```bash\n`not inline`\n```\n``a`b`` then `c`\n"
    assert inline_spans(text, "d.md") == [("d.md:1", "mooncake_master --port 1"), ("d.md:1", "x"), ("d.md:5", "c")]


def test_our_programs_are_recognised() -> None:
    scripts = console_scripts()
    assert {"mooncake_master", "mooncake_proxy", "mooncake_demo"} <= set(scripts)
    assert program(["mooncake_proxy", "--port", "1"]) == ("mooncake_proxy", ["--port", "1"])
    assert program(["python3", "-m", "bench.robustness.chaos", "--help"]) == ("bench/robustness/chaos.py", ["--help"])
    assert program(["python", "bench/robustness/chaos.py", "--help"]) == ("bench/robustness/chaos.py", ["--help"])
    assert parse_error("bench/robustness/chaos.py", ["--duration", "60"]) is None
    assert parse_error("bench/robustness/chaos.py", ["--no-such-flag"]) is not None
    assert program(["curl", "-s"]) is None and program(["python", "-m", "vllm"]) is None
    assert parse_error("mooncake_proxy", ["--no-such-flag"]) is not None
    assert "no_such_flag" in (parse_error("mooncake_master", ["--no_such_flag=1"]) or "")
    assert parse_error("mooncake_master", ["--port=1234"]) is None


# ---------------------------------------------------------------------------- the docs themselves
def test_every_shell_block_is_run_or_marked() -> None:
    assert SHELL, "no ```bash blocks found: is the extractor broken?"
    assert marker_problems(BLOCKS) == []


def test_every_doc_test_name_has_a_run_and_every_run_a_block() -> None:
    named = {b.marker.value: b.where(-1) for b in SHELL if b.marker and b.marker.kind == "doc-test"}
    missing = {n: w for n, w in named.items() if n not in RUNS}
    assert not missing, f"doc-test markers without a run in tests/docs/doc_runs.py: {missing}"
    unused = set(RUNS) - set(named)
    assert not unused, f"runs in tests/docs/doc_runs.py whose doc block is gone: {sorted(unused)}"
    per_name: dict[str, int] = {}
    for b in SHELL:
        if b.marker and b.marker.kind == "doc-test":
            per_name[b.marker.value] = per_name.get(b.marker.value, 0) + 1
    assert all(n == 1 for n in per_name.values()), f"a doc-test name marks two blocks: {per_name}"


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.where(-1))
def test_our_commands_in_the_docs_parse(block) -> None:
    """Run or not, a block's commands of ours use flags the code has (and values it takes)."""
    cmds = commands(block.text)
    variables = assignments(cmds)
    bad = []
    for c in cmds:
        prog = program(expand(c.words, variables))
        if prog is not None:
            err = parse_error(*prog)
            if err:
                bad.append(f"{block.where(c.offset)}: {prog[0]}: {err.splitlines()[-1]}")
    assert not bad, "\n".join(bad)


def test_inline_commands_use_flags_that_exist() -> None:
    """Commands quoted in sentences (``mooncake_master --port 50051 ...``) often stand for a
    family (``--policy NAME``, ``[--quick]``), so only a flag the program does not have fails."""
    docs = doc_files(REPO)
    bad, checked = [], 0
    for f in docs:
        for where, span in inline_spans(f.read_text(encoding="utf-8"), str(f.relative_to(REPO))):
            try:
                cmds = commands(span)
            except ValueError:
                continue
            for c in cmds:
                prog = program([w.strip("[]") for w in c.words])
                if prog is None or not prog[1]:
                    continue
                checked += 1
                err = parse_error(*prog) or ""
                if "unrecognized arguments" in err or "unknown flag" in err:
                    bad.append(f"{where}: `{span}`: {err.splitlines()[-1]}")
    assert checked > 5, "no inline commands found: is inline_spans broken?"
    assert not bad, "\n".join(bad)
