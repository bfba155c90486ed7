""".ci/run's last lines: each failed test of a real pytest run's JUnit report, named with the first line of its
assertion or error (devtools/ci_failures.py), so that CI's last screen says why it failed; and a test that hangs
fails alone at its ceiling, with its stack printed, while the run goes on (pyproject.toml's pytest-timeout)."""

import subprocess
import sys
import textwrap

from devtools import ci_failures
from tests.conftest import ROOT

FAILING_MODULE = textwrap.dedent('''
    import pytest

    def test_passes():
        assert True

    def test_counts_wrong():
        assert 1 + 1 == 3, "the sum is off"

    @pytest.fixture
    def broken():
        raise RuntimeError("the fixture could not start its server")

    def test_with_a_broken_fixture(broken):
        pass

    class TestGroup:
        def test_in_a_class(self):
            raise KeyError("missing")
''')


def junit_of(tmp_path, source: str):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_sample.py").write_text(source)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "-p", "no:django",
                    "-p", "no:cacheprovider", "-q", f"--junitxml={report}", "-o", "junit_family=xunit1",
                    str(tmp_path / "test_sample.py")], cwd=tmp_path, capture_output=True, timeout=120)
    return report


def test_each_failed_test_is_named_with_the_first_line_of_its_error(tmp_path, capsys):
    report = junit_of(tmp_path, FAILING_MODULE)

    assert ci_failures.main([f"SQLite={report}"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("    SQLite: FAILED test_sample.py::test_counts_wrong: AssertionError: the sum is off")
    assert lines[1] == ("    SQLite: FAILED test_sample.py::test_with_a_broken_fixture (error outside the test body): "
                        "failed on setup with \"RuntimeError: the fixture could not start its server\"")
    assert lines[2] == "    SQLite: FAILED test_sample.py::TestGroup::test_in_a_class: KeyError: 'missing'"


def test_a_clean_report_prints_nothing_and_a_missing_one_is_a_failure(tmp_path, capsys):
    report = junit_of(tmp_path, "def test_passes():\n    assert True\n")

    assert ci_failures.main([f"SQLite={report}"]) == 0
    assert capsys.readouterr().out == ""
    assert ci_failures.main([f"PostgreSQL={tmp_path / 'never-written.xml'}"]) == 1
    assert "PostgreSQL: no test report (pytest did not finish" in capsys.readouterr().out


HANGING_MODULE = textwrap.dedent('''
    import time

    import pytest

    @pytest.mark.timeout(2)
    def test_hangs():
        time.sleep(3600)

    def test_after_it():
        assert True
''')


def test_a_hanging_test_fails_alone_at_its_ceiling_with_its_stack_and_the_run_goes_on(tmp_path, capsys):
    """With this project's own pytest configuration (the `signal` method), as `make test` runs it."""
    (tmp_path / "test_hanging.py").write_text(HANGING_MODULE)
    report = tmp_path / "report.xml"
    result = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                             str(tmp_path), "-p", "no:cacheprovider", "-p", "no:django", f"--junitxml={report}",
                             "-o", "junit_family=xunit1", str(tmp_path / "test_hanging.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert "1 failed, 1 passed" in result.stdout, result.stdout + result.stderr
    assert "Timeout" in result.stdout and "time.sleep(3600)" in result.stdout  # the stack where it hung
    assert ci_failures.main([f"SQLite={report}"]) == 1
    assert "FAILED test_hanging.py::test_hangs: Failed: Timeout" in capsys.readouterr().out
