"""How many pytest processes `make test` starts (devtools/stack.py): the whole suite or a folder shares one more than
one per core (two at least, four at most), named files or tests run in one, and PI_TEST_PROCESSES overrides it."""

import pytest

from devtools import stack


@pytest.mark.parametrize("cores, processes", [(1, 2), (2, 2), (3, 3), (16, 4)])
def test_a_whole_run_takes_a_process_per_core(monkeypatch, cores, processes):
    monkeypatch.delenv("PI_TEST_PROCESSES", raising=False)
    monkeypatch.setattr(stack.os, "cpu_count", lambda: cores)
    assert stack.test_processes([]) == processes
    assert stack.test_processes(["--durations=15", "-m", "database"]) == processes
    assert stack.test_processes(["tests/receiver"]) == processes  # a part of the suite (a folder)


def test_named_files_and_tests_run_in_one_process_and_the_variable_overrides(monkeypatch):
    monkeypatch.delenv("PI_TEST_PROCESSES", raising=False)
    monkeypatch.setattr(stack.os, "cpu_count", lambda: 2)
    assert stack.test_processes(["tests/site/test_suite_processes.py"]) == 1
    assert stack.test_processes(["tests/site/test_suite_processes.py::test_named_files", "-x"]) == 1
    assert stack.test_processes(["-n", "2"]) == 1  # the caller drives pytest-xdist itself
    monkeypatch.setenv("PI_TEST_PROCESSES", "1")
    assert stack.test_processes([]) == 1
    monkeypatch.setenv("PI_TEST_PROCESSES", "2")
    assert stack.test_processes(["tests/site/test_suite_processes.py"]) == 2
