"""The fenced code blocks of the Markdown docs, their markers, and the commands in them (pure).

A ``bash`` block a user may copy is either run by a test or marked as not runnable here, with
the reason, by an HTML comment on the nearest non-blank line above its fence (invisible once
rendered)::

    <!-- doc-test: vllm-1p1d -->          run by the doc test of that name (tests/docs)
    <!-- not-run: needs a GPU -->         not runnable here; the reason is required

Every location is reported as ``file:line`` of the doc, so a block that drifts from the code
fails CI pointing at the line to fix.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

#: languages whose blocks are commands a user copies into a shell
SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*(doc-test|not-run)\s*:\s*(.*?)\s*-->\s*$")
_ANY_MARKER = re.compile(r"^\s*<!--\s*([\w-]+)\s*:")
#: command separators of a shell line (shlex with punctuation_chars yields them as tokens)
_SEPARATORS = frozenset({";", "&&", "||", "&", "|", ";;"})
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Marker:
    kind: str   # "doc-test" or "not-run"
    value: str  # the doc test's name, or why the block cannot run here


@dataclass(frozen=True)
class DocBlock:
    path: str          # as given (relative to the repository root)
    line: int          # 1-based line of the opening fence
    lang: str
    text: str          # the block's content, without the fences
    marker: Marker | None
    marker_error: str = ""  # a comment that looks like a marker but is not a valid one

    def where(self, offset: int = 0) -> str:
        """``file:line`` of the block's ``offset``-th content line (0 = first line inside)."""
        return f"{self.path}:{self.line + 1 + offset}"


@dataclass(frozen=True)
class Command:
    """One simple command of a block: its words (after joining continuation lines, dropping
    comments, and the ``NAME=value`` prefixes), the environment prefixes, and its line offset."""
    offset: int
    words: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    background: bool


def _marker_above(lines: list[str], fence_idx: int) -> tuple[Marker | None, str]:
    i = fence_idx - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0:
        return None, ""
    m = _MARKER.match(lines[i])
    if m:
        kind, value = m.group(1), m.group(2)
        if not value:
            return None, f"empty {kind} marker"
        return Marker(kind, value), ""
    other = _ANY_MARKER.match(lines[i])
    if other and other.group(1) in ("doctest", "doc_test", "not_run", "notrun", "norun", "skip", "no-run"):
        return None, f"unknown marker {other.group(1)!r} (use doc-test: or not-run:)"
    return None, ""


def extract_blocks(text: str, path: str) -> list[DocBlock]:
    """Every fenced block of a Markdown text, in order. A fence closes with the same character,
    at least as long, and no info string (CommonMark); an unclosed block runs to the end."""
    lines = text.splitlines()
    out: list[DocBlock] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = re.match(r"^ {0,3}(" + re.escape(fence[0]) + "{" + str(len(fence)) + r",})\s*$", lines[i])
            if close:
                break
            ln = lines[i]
            body.append(ln[indent:] if ln[:indent].strip() == "" else ln.lstrip())
            i += 1
        marker, err = _marker_above(lines, start)
        out.append(DocBlock(path, start + 1, lang, "\n".join(body), marker, err))
        i += 1
    return out


def marker_problems(blocks: list[DocBlock], langs: frozenset[str] = SHELL_LANGS) -> list[str]:
    """What is wrong with the markers: a shell block with none (or a malformed one)."""
    problems = []
    for b in blocks:
        if b.lang not in langs:
            continue
        if b.marker_error:
            problems.append(f"{b.where(-1)}: {b.marker_error}")
        elif b.marker is None:
            problems.append(f"{b.where(-1)}: ```{b.lang} block has no marker: put `<!-- doc-test: NAME -->` "
                            f"(and a test of that name in tests/docs) or `<!-- not-run: WHY -->` above it")
    return problems


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(offset of the first physical line, the line with ``\\``-continuations joined)."""
    out: list[tuple[int, str]] = []
    acc: list[str] = []
    first = 0
    for n, ln in enumerate(text.splitlines()):
        if not acc:
            first = n
        if ln.rstrip().endswith("\\") and not ln.lstrip().startswith("#"):
            acc.append(ln.rstrip()[:-1])
            continue
        acc.append(ln)
        out.append((first, ln if len(acc) == 1 else " ".join(a.strip() for a in acc)))
        acc = []
    if acc:
        out.append((first, " ".join(a.strip() for a in acc)))
    return out


def _tokens(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def commands(text: str) -> list[Command]:
    """The simple commands of a shell block, in order (a quote left open continues on the next
    line, as in the shell). A quote never closed raises ValueError naming the line offset."""
    out: list[Command] = []
    pending: tuple[int, str] | None = None  # a quote still open: the shell reads on
    for offset, line in logical_lines(text):
        if pending is not None:
            offset, line = pending[0], pending[1] + "\n" + line
        try:
            toks = _tokens(line)
        except ValueError:
            pending = (offset, line)
            continue
        pending = None
        cur: list[str] = []
        for t in [*toks, ";"]:
            if t in _SEPARATORS:
                if cur:
                    env = []
                    while cur and _ASSIGN.match(cur[0]):
                        k, _, v = cur.pop(0).partition("=")
                        env.append((k, v))
                    if cur or env:
                        out.append(Command(offset, tuple(cur), tuple(env), t == "&"))
                cur = []
            else:
                cur.append(t)
    if pending is not None:
        raise ValueError(f"line +{pending[0]}: unclosed quote: {pending[1]!r}")
    return out


def expand(words: tuple[str, ...], variables: dict[str, str]) -> list[str]:
    """``$NAME`` / ``${NAME}`` replaced from ``variables`` (an unquoted multi-word value splits
    into words, as the shell does); unknown names are left as they are."""
    out: list[str] = []
    for w in words:
        whole = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", w)
        if whole and whole.group(1) in variables:
            out.extend(shlex.split(variables[whole.group(1)]))
            continue
        out.append(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                          lambda m: variables.get(m.group(1), m.group(0)), w))
    return out


def assignments(cmds: list[Command]) -> dict[str, str]:
    """Variables a block sets on lines of their own (``ARGS="..."``), for ``expand``."""
    return {k: v for c in cmds if not c.words for k, v in c.env}


def inline_spans(text: str, path: str) -> list[tuple[str, str]]:
    """(``file:line``, text) of every inline code span outside fenced blocks: commands quoted
    in a sentence (``mooncake_master --port 50051``) are copied as often as blocks."""
    out: list[tuple[str, str]] = []
    fence: str | None = None
    for n, ln in enumerate(text.splitlines(), 1):
        m = _FENCE.match(ln)
        if m:
            if fence is None:
                fence = m.group(2)
            elif m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) and not m.group(3):
                fence = None
            continue
        if fence is None:
            out.extend((f"{path}:{n}", span) for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", ln))
    return out


#: Run-by-run history, kept as it ran: its commands name the bench paths and flags of their day.
HISTORY = ("docs/benchmarks-log.md",)


def doc_files(root: Path) -> list[Path]:
    """README.md and docs/*.md under ``root``, less the history."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [f for f in files if str(f.relative_to(root)) not in HISTORY]


def load_docs(root: Path) -> list[DocBlock]:
    """The blocks of the docs under ``root`` (:func:`doc_files`)."""
    blocks: list[DocBlock] = []
    for f in doc_files(root):
        blocks.extend(extract_blocks(f.read_text(encoding="utf-8"), str(f.relative_to(root))))
    return blocks
