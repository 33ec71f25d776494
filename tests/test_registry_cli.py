"""``manage.py workflow_definitions`` for documents: validate, load, publish, show, list.

Each command runs as its own process (``run_manage``) against the test
database, as an operator runs it, so the rows the tests set up are committed
(transactional tests) and every refusal is seen as the operator sees it: the
exit status and one ``CommandError`` line on stderr.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from vertique_workflow import tables
from vertique_workflow.models import WorkflowDefinition, WorkflowDefinitionActivation
from vertique_workflow.store import documents

from .conftest import run_manage, table_counts

HOWTO = Path(__file__).parent / "documents" / "howto"
V1 = "tests/documents/howto/parcel-v1.yaml"
V2 = "tests/documents/howto/parcel-v2.yaml"
T = tables.sql_names()

pytestmark = pytest.mark.django_db(transaction=True)


def cli(*args: str, check: bool = True, **env: Any) -> subprocess.CompletedProcess[str]:
    """``manage.py workflow_definitions <args>`` in a process of its own."""
    return run_manage(
        "workflow_definitions",
        *args,
        dbname=connection.settings_dict["NAME"],
        schema=tables.SCHEMA,
        check=check,
        extra_env={"VERTIQUE_TEST_SETTINGS_JSON": json.dumps(env)} if env else None,
    )


def refused(*args: str, **env: Any) -> str:
    """The one error line of a refused command (exit status 1, nothing on stdout after it)."""
    result = cli(*args, check=False, **env)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), result.stderr
    return lines[0].removeprefix("CommandError: ")


def plan_hash(path: str) -> str:
    from vertique_workflow.definitions.documents import compile_document

    return compile_document(Path(path).read_text("utf-8"), format="yaml").plan_hash


def status(version: int, scope: str = "default") -> str:
    return WorkflowDefinition.objects.get(
        scope_key=scope, definition_id="parcel", definition_version=version
    ).status


def bad_document(tmp_path: Path) -> tuple[Path, int]:
    """parcel v1 with a ``next`` naming no step; returns the file and that line."""
    text = (HOWTO / "parcel-v1.yaml").read_text("utf-8")
    text = text.replace("next: await_pickup", "next: await_pikcup")
    path = tmp_path / "parcel-bad.yaml"
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index("    next: await_pikcup") + 1
    return path, line


# --------------------------------------------------------------------------
# validate
# --------------------------------------------------------------------------


def test_validate_prints_id_version_and_hash_and_writes_nothing():
    before = table_counts()
    result = cli("validate", V1, V2)
    assert result.stdout.splitlines() == [
        f"{V1}: parcel v1 hash {plan_hash(V1)[:12]} (valid)",
        f"{V2}: parcel v2 hash {plan_hash(V2)[:12]} (valid)",
    ]
    assert table_counts() == before


def test_validate_names_the_file_and_line_of_a_bad_document_and_exits_1(tmp_path):
    bad, line = bad_document(tmp_path)
    result = cli("validate", V1, str(bad), check=False)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{V1}: parcel v1 hash {plan_hash(V1)[:12]} (valid)"]
    errors = result.stderr.strip().splitlines()
    assert errors[0] == f"{bad}:{line}: steps.pack.next: unknown step 'await_pikcup'"
    assert errors[1] == "CommandError: 1 of 2 document(s) invalid"


# --------------------------------------------------------------------------
# load, publish, show
# --------------------------------------------------------------------------


def test_load_writes_a_candidate_publish_makes_it_available_and_show_prints_its_text():
    result = cli("load", V1)
    assert result.stdout.splitlines() == [
        f"default/parcel v1 loaded as CANDIDATE (hash {plan_hash(V1)[:12]}, from {V1})"
    ]
    assert status(1) == "CANDIDATE"
    stored = WorkflowDefinition.objects.get(definition_id="parcel")
    assert (stored.kind, stored.source_location) == ("DOCUMENT", V1)
    assert not WorkflowDefinitionActivation.objects.exists()

    assert cli("publish", "parcel", "1").stdout == "default/parcel v1 published (AVAILABLE)\n"
    assert status(1) == "AVAILABLE"
    assert cli("show", "parcel", "1").stdout == (HOWTO / "parcel-v1.yaml").read_text("utf-8")


def test_load_with_publish_and_activate_does_all_three_and_says_so():
    result = cli("load", V1, "--scope", "eu", "--publish", "--activate")
    assert result.stdout.splitlines() == [
        f"eu/parcel v1 loaded as CANDIDATE (hash {plan_hash(V1)[:12]}, from {V1})",
        "eu/parcel v1 published (AVAILABLE)",
        "scope eu: parcel now starts eu/parcel v1",
    ]
    assert status(1, "eu") == "AVAILABLE"
    record = WorkflowDefinitionActivation.objects.get(scope_key="eu", definition_id="parcel")
    assert (record.target_scope_key, record.definition_version) == ("eu", 1)


def test_loading_the_same_text_again_is_unchanged_and_writes_nothing():
    cli("load", V2, "--scope", "eu")
    before = table_counts()
    again = cli("load", V2, "--scope", "eu")
    assert again.stdout == "eu/parcel v2 unchanged (CANDIDATE): the same text is stored\n"
    assert table_counts() == before
    # published meanwhile: the same command with --publish --activate converges
    cli("publish", "parcel", "2", "--scope", "eu")
    result = cli("load", V2, "--scope", "eu", "--publish", "--activate")
    assert result.stdout.splitlines() == [
        "eu/parcel v2 unchanged (AVAILABLE): the same text is stored",
        "eu/parcel v2 already AVAILABLE: not published again",
        "scope eu: parcel now starts eu/parcel v2",
    ]


def test_another_text_under_a_loaded_key_is_refused_and_writes_nothing(tmp_path):
    cli("load", V1, "--scope", "eu")
    changed = tmp_path / "parcel-v1.yaml"
    changed.write_text((HOWTO / "parcel-v1.yaml").read_text("utf-8") + "# edited\n", "utf-8")
    before = table_counts()
    message = refused("load", str(changed), "--scope", "eu")
    assert message.startswith(
        "definition eu/parcel v1 already exists (DOCUMENT, CANDIDATE) with another text "
        "(stored digest "
    )
    assert message.endswith("nothing was written: load a changed document as a new version")
    assert table_counts() == before


def test_a_bad_document_is_refused_with_its_file_and_line_and_writes_nothing(tmp_path):
    bad, line = bad_document(tmp_path)
    before = table_counts()
    assert refused("load", str(bad), "--scope", "eu", "--publish", "--activate") == (
        f"{bad}:{line}: steps.pack.next: unknown step 'await_pikcup'"
    )
    assert table_counts() == before


def test_the_format_comes_from_the_file_name_unless_given(tmp_path):
    text = (HOWTO / "parcel-v1.yaml").read_text("utf-8")
    odd = tmp_path / "parcel.txt"
    odd.write_text(text, encoding="utf-8")
    before = table_counts()
    assert refused("load", str(odd)) == (
        f"{odd}: not a workflow document: the file name must end in .yaml, .yml or .json"
    )
    assert refused("load", str(tmp_path / "missing.yaml")).startswith(
        f"{tmp_path / 'missing.yaml'}: cannot read the file"
    )
    assert table_counts() == before
    assert "loaded as CANDIDATE" in cli("load", str(odd), "--format", "yaml").stdout
    assert WorkflowDefinition.objects.get(definition_id="parcel").document_format == "yaml"


def test_activate_needs_an_available_version_and_says_what_was_done():
    result = cli("load", V1, "--scope", "eu", "--activate", check=False)
    assert result.returncode == 1
    assert result.stdout.startswith("eu/parcel v1 loaded as CANDIDATE")
    assert result.stderr.strip() == (
        "CommandError: eu/parcel v1 is CANDIDATE, not activated: only an AVAILABLE "
        "version can be activated (add --publish)"
    )
    assert not WorkflowDefinitionActivation.objects.exists()


def test_publish_and_show_of_unknown_versions_and_code_rows_are_refused():
    cli("load", V1)
    before = table_counts()
    assert refused("publish", "parcel", "7") == (
        "INVALID_TRANSITION: definition default/parcel v7 does not exist"
    )
    assert refused("publish", "parcel", "1", "--scope", "eu") == (
        "INVALID_TRANSITION: definition eu/parcel v1 does not exist"
    )
    assert refused("show", "parcel", "7") == "workflow definition default/parcel v7 does not exist"
    cli("publish", "parcel", "1")
    assert refused("publish", "parcel", "1") == (
        "INVALID_TRANSITION: definition default/parcel v1 is AVAILABLE, not CANDIDATE"
    )
    cli("sync")  # the code workflows of tests.flows: CODE rows
    assert (
        refused("show", "order", "1")
        == "workflow definition default/order v1 is a CODE row: no document"
    )
    assert table_counts()["definitions"] > before["definitions"]


def test_show_refuses_altered_text_and_an_oversized_row_without_printing_them():
    cli("load", V1, "--scope", "eu")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['definitions']} SET document_text = document_text || '# tampered' "
            "WHERE scope_key = 'eu' AND definition_id = 'parcel'"
        )
    result = cli("show", "parcel", "1", "--scope", "eu", check=False)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.strip() == (
        "CommandError: definition eu/parcel v1: drift: the stored document text does not "
        "match its document_digest (it was changed after it was written); it was not returned"
    )
    size = len((HOWTO / "parcel-v1.yaml").read_bytes())
    message = refused("show", "parcel", "1", "--scope", "eu", DOCUMENT_INPUT_LIMIT=64)
    assert message.startswith(f"definition eu/parcel v1: the stored document has {size + 10} ")
    assert message.endswith("for DOCUMENT_INPUT_LIMIT 64; it was not read")


# --------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------


def test_list_shows_the_kind_and_the_failure_mark():
    cli("load", V1, "--scope", "eu", "--publish")
    cli("load", V2, "--scope", "eu")
    documents.record_failure("eu", "parcel", 2, "STATE_TYPE_NOT_EXTENDED")
    lines = [line.split() for line in cli("list", "--id", "parcel").stdout.splitlines()]
    assert lines == [
        [
            "SCOPE",
            "ID",
            "VERSION",
            "STATUS",
            "KIND",
            "HASH",
            "LIVE",
            "FAILED",
            "CONTRACT",
            "FAILURE",
        ],
        [
            "eu",
            "parcel",
            "1",
            "AVAILABLE",
            "DOCUMENT",
            plan_hash(V1)[:12],
            "0",
            "0",
            "parcel.v1",
            "-",
        ],
        [
            "eu",
            "parcel",
            "2",
            "CANDIDATE",
            "DOCUMENT",
            plan_hash(V2)[:12],
            "0",
            "0",
            "parcel.v1",
            "STATE_TYPE_NOT_EXTENDED",
        ],
    ]
