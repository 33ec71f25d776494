"""docs/how-to-change-a-workflow-with-documents.md, performed step by step.

The how-to is run as written, in order, in two walks (the command line, then
Python). Its fenced blocks are the steps:

* a block under ``<!-- file: PATH -->`` shows a file of this repository: the
  block must be that file (a YAML document) or a part of it (a module);
* a ``console`` block is ``$ python manage.py ...`` commands, each followed by
  its exact output: each command runs as its own ``manage.py`` process (in
  the documents' folder) and its stdout plus its ``CommandError`` line must
  be the lines shown;
* a ``python`` block is executed, statement by statement, in one namespace
  per walk; a statement that is an expression followed by ``# value`` must
  evaluate to that literal value.

So every command, call and output the how-to shows is checked, and a
change in a message or a hash shows here first.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from vertique_workflow import document_plans, scope_rules, tables

from .conftest import ROOT, run_manage

HOWTO = ROOT / "docs" / "how-to-change-a-workflow-with-documents.md"
FOLDER = ROOT / "tests" / "documents" / "howto"
PYTHON_WALK = "## The same from Python"

BLOCK = re.compile(
    r"(?:<!-- file: (?P<file>\S+) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.DOTALL
)


def blocks(text: str) -> list[tuple[str | None, str, str]]:
    """``(file, language, body)`` of every fenced block, in order."""
    return [(m["file"], m["lang"], m["body"]) for m in BLOCK.finditer(text)]


def walks() -> tuple[list[tuple[str | None, str, str]], list[tuple[str | None, str, str]]]:
    """The blocks of the command-line walk (with its setup) and of the Python walk."""
    text = HOWTO.read_text("utf-8")
    assert PYTHON_WALK in text
    before, after = text.split(PYTHON_WALK, 1)
    return blocks(before), blocks(after)


def check_file(path: str, body: str) -> None:
    content = (ROOT / path).read_text("utf-8")
    if path.endswith((".yaml", ".yml", ".json")):
        assert body == content, f"the how-to's {path} differs from the file"
    else:
        assert body in content, f"the how-to's excerpt of {path} is not in the file"


def run_console(body: str) -> int:
    """Run each ``$ python manage.py`` command of a console block; compare its output."""
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            prefix = "$ python manage.py "
            assert line.startswith(prefix), line
            commands.append((line[len(prefix) :], []))
        else:
            assert commands, f"output before any command: {line!r}"
            commands[-1][1].append(line)
    for command, expected in commands:
        result = run_manage(
            *shlex.split(command),
            dbname=connection.settings_dict["NAME"],
            schema=tables.SCHEMA,
            check=False,
            cwd=FOLDER,
            extra_env={"PYTHONPATH": str(ROOT)},
        )
        errors = [e for e in result.stderr.splitlines() if e.startswith("CommandError: ")]
        shown = [line.rstrip() for line in result.stdout.splitlines()] + errors
        assert shown == [line.rstrip() for line in expected], (command, result.stderr)
        assert result.returncode == (1 if errors else 0), (command, result.stderr)
    return len(commands)


def run_python(body: str, namespace: dict[str, Any]) -> int:
    """Execute a python block; ``expression  # literal`` statements are checked."""
    lines = body.splitlines()
    checked = 0
    for statement in ast.parse(body).body:
        source = ast.get_source_segment(body, statement)
        assert source is not None
        last = lines[statement.end_lineno - 1]  # type: ignore[operator]
        _, hash_mark, comment = last.partition("  # ")
        if isinstance(statement, ast.Expr) and hash_mark:
            value = eval(compile(ast.Expression(statement.value), "<how-to>", "eval"), namespace)
            assert value == ast.literal_eval(comment.strip()), source
            checked += 1
        else:
            exec(compile(ast.Module([statement], []), "<how-to>", "exec"), namespace)
    return checked


def perform(walk: list[tuple[str | None, str, str]]) -> dict[str, int]:
    namespace: dict[str, Any] = {}
    done = {"file": 0, "console": 0, "python": 0, "checked": 0}
    for path, language, body in walk:
        if path is not None:
            check_file(path, body)
            done["file"] += 1
        elif language == "console":
            done["console"] += run_console(body)
        elif language == "python":
            done["checked"] += run_python(body, namespace)
            done["python"] += 1
        else:
            raise AssertionError(f"a {language} block the walk cannot perform")
    return done


@pytest.fixture
def in_documents_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The how-to reads ``parcel-v1.yaml`` from where the commands run."""
    monkeypatch.chdir(FOLDER)
    document_plans._reset()
    scope_rules._reset()


@pytest.mark.django_db(transaction=True)
def test_the_command_line_walk(in_documents_folder: None) -> None:
    command_line, _ = walks()
    done = perform(command_line)
    # the file excerpts, the v1 setup, every subcommand of the walk, the checked values
    assert done == {"file": 3, "console": 15, "python": 5, "checked": 6}


@pytest.mark.django_db(transaction=True)
def test_the_python_walk(in_documents_folder: None) -> None:
    _, python = walks()
    done = perform(python)
    assert done == {"file": 0, "console": 0, "python": 4, "checked": 9}


def test_the_walks_cover_every_document_subcommand_and_lifecycle_step() -> None:
    command_line, python = walks()
    commands = {
        shlex.split(line)[4]
        for _, language, body in command_line
        if language == "console"
        for line in body.splitlines()
        if line.startswith("$ python manage.py workflow_definitions ")
    }
    assert commands == {"load", "validate", "publish", "activate", "show", "list"} | {
        "deprecate",
        "retire",
    }
    calls = "".join(body for _, _, body in python)
    for call in (
        "compile_document(",
        "registry.load_document_outcome(",
        "registry.publish(",
        "registry.activate(",
        "registry.deprecate(",
        "registry.retire(",
    ):
        assert call in calls, call
    assert Path(FOLDER / "parcel-v2.yaml").exists()
