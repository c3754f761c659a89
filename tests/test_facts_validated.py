"""Data that passed a schema once on this host is not validated again (gpudask.facts.validated):
the scheduler does not import jsonschema before it listens, when the same facts passed before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import base_env

from gpudask import session
from gpudask.facts import validated
from gpudask.facts.loader import FactsError, remembered_error, schema
from gpudask.facts.sections import FactsSection, section_error

SECTION = FactsSection("ports", {"type": "object", "properties": {"n": {"type": "integer", "x-accepts": "an integer"}},
                                 "required": ["n"]}, lambda facts: {"n": 1})


def _validations() -> int:
    return session.current().counts["facts schema"]


def test_a_value_that_passed_is_not_validated_again_in_a_new_process(own_state_dir):
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None and _validations() == 1
    session.reset()  # what a new process of this user on this host starts from
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None and _validations() == 0
    assert (own_state_dir / validated.FILE).stat().st_mode & 0o077 == 0  # private, like the directory
    assert section_error("probed", SECTION, {"n": 3}, "demo") is None and _validations() == 1  # other data
    assert section_error("probed", SECTION, {"n": True}, "demo") is not None  # True is not 1: its own digest


def test_what_failed_is_never_remembered_and_always_said(own_state_dir):
    for _ in range(2):
        error = section_error("probed", SECTION, {"n": "two"}, "demo")
        assert isinstance(error, FactsError) and "key 'sections.ports.n'" in str(error)
        session.reset()
    assert not validated.passed_before(validated.digest(dict(SECTION.schema), {"n": "two"}))


def test_the_same_data_against_another_schema_is_validated(own_state_dir):
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None
    stricter = FactsSection("ports", {**SECTION.schema, "properties": {"n": {"type": "integer", "minimum": 5}}},
                            SECTION.probe)
    session.reset()
    assert section_error("probed", stricter, {"n": 2}, "demo") is not None


@pytest.mark.parametrize("content", ["not json", json.dumps({"rules": 99, "valid": ["0" * 64]}),
                                     json.dumps({"rules": validated.RULES, "valid": "all"}), json.dumps([1, 2])])
def test_a_record_that_is_not_ours_is_ignored_and_everything_validated(own_state_dir, content):
    own_state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (own_state_dir / validated.FILE).write_text(content)
    (own_state_dir / validated.FILE).chmod(0o600)
    assert remembered_error(schema(), {"schema": 2}, "a facts file") is not None  # still refused: validated in full
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None and _validations() == 2


def test_a_record_other_users_can_write_is_not_trusted(own_state_dir):
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None
    (own_state_dir / validated.FILE).chmod(0o666)
    session.reset()
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None and _validations() == 1


def test_an_unusable_state_directory_means_validating_every_time(own_state_dir):
    own_state_dir.mkdir(parents=True)
    own_state_dir.chmod(0o777)  # other users could write it: gpudask refuses to use it
    for _ in range(2):
        assert section_error("probed", SECTION, {"n": 2}, "demo") is None
        session.reset()
    assert section_error("probed", SECTION, {"n": 2}, "demo") is None and _validations() == 1
    assert not (own_state_dir / validated.FILE).exists()


@pytest.mark.process
def test_a_scheduler_started_again_imports_no_jsonschema_before_it_listens(tmp_path):
    """The plan a scheduler makes before it listens: the first time on a host it validates the
    probed facts sections (jsonschema imported), the second time it finds them remembered."""
    script = textwrap.dedent("""
        import json, sys
        import distributed
        from gpudask import bootstrap, session
        bootstrap.plan_host("tcp", None, planner="scheduler")
        print(json.dumps({"jsonschema": "jsonschema" in sys.modules,
                          "validations": session.current().counts["facts schema"]}))
    """)
    env = base_env(TMPDIR=str(tmp_path))
    env.pop("XDG_RUNTIME_DIR", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                      timeout=120, check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["jsonschema"] and runs[0]["validations"] >= 1, runs
    assert runs[1] == {"jsonschema": False, "validations": 0}, runs
    assert os.path.exists(tmp_path / f"gpudask-{os.getuid()}" / validated.FILE)
