"""Every ```python block of README.md and docs/*.md runs: each in a fresh interpreter (with
the built package), in a fresh temporary directory as its working directory, and fails the
test naming the file and line of the snippet if it raises or does not finish. Functions a
snippet defines named `test_*` are called after it, as pytest would.

A snippet that is a fragment (it uses a `db` from an earlier one, or runs until Ctrl-C) is an
expected failure, listed in KNOWN_FAILING by file and line with the reason, until the docs are
fixed; one listed that runs fails the test, so the list does not outlive the fix."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Longest a snippet may run.
SNIPPET_SECONDS_MAX = 120

# (file relative to the repository root, line of the opening fence): why it fails, and what
# its error output says (a listed snippet failing another way is a failure).
KNOWN_FAILING: dict = {}

FENCE = re.compile(r"^```python\s*$")


def snippets():
    """(file relative to the root, line of the opening fence, code) of each python block."""
    found = []
    for document in DOCUMENTS:
        lines = document.read_text(encoding="utf-8").splitlines()
        relative = document.relative_to(ROOT).as_posix()
        i = 0
        while i < len(lines):
            if FENCE.match(lines[i]):
                start = i + 1
                end = start
                while end < len(lines) and lines[end].strip() != "```":
                    end += 1
                assert end < len(lines), f"{relative}:{i + 1}: a ```python block never closed"
                found.append((relative, i + 1, "\n".join(lines[start:end]) + "\n"))
                i = end
            i += 1
    return found


SNIPPETS = snippets()


def test_the_documents_have_python_snippets():
    assert any(file == "README.md" for file, _, _ in SNIPPETS)


def test_every_known_failing_entry_names_a_snippet():
    """An entry whose snippet moved (the docs changed) would hide nothing: refresh it."""
    where = {(file, line) for file, line, _ in SNIPPETS}
    assert set(KNOWN_FAILING) <= where, set(KNOWN_FAILING) - where


@pytest.mark.parametrize(
    "file, line, code", SNIPPETS, ids=[f"{file}:{line}" for file, line, _ in SNIPPETS]
)
def test_snippet_runs(tmp_path, file, line, code):
    # Tracebacks name the document and the line of the snippet's first line of code.
    source = "\n" * line + code
    # A snippet that defines pytest tests has them called too: defining one proves nothing.
    runner = (
        "import sys\n"
        "source = sys.stdin.read()\n"
        "scope = {'__name__': '__main__'}\n"
        "exec(compile(source, sys.argv[1], 'exec'), scope)\n"
        "for name, value in list(scope.items()):\n"
        "    if name.startswith('test_') and callable(value):\n"
        "        value()\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", runner, file],
            input=source,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=SNIPPET_SECONDS_MAX,
        )
        failure = None if result.returncode == 0 else result.stderr.strip()
    except subprocess.TimeoutExpired:
        failure = f"still running after {SNIPPET_SECONDS_MAX} s"
    known = KNOWN_FAILING.get((file, line))
    if failure is not None and known is not None:
        reason, says = known
        if says in failure:
            pytest.xfail(f"{file}:{line}: {reason}")
        pytest.fail(
            f"the snippet at {file}:{line}, known to fail ({reason}), failed otherwise:\n"
            f"{failure}",
            pytrace=False,
        )
    if failure is not None:
        pytest.fail(f"the snippet at {file}:{line} failed:\n{failure}", pytrace=False)
    assert known is None, (
        f"the snippet at {file}:{line} runs now: remove it from KNOWN_FAILING ({known[0]})"
    )
