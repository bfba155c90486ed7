"""The failed tests of pytest's JUnit reports, one line each: the test and the first line of its assertion or error.
.ci/run prints them last, so that the last screen of CI's output says why it failed.

    python3 -m devtools.ci_failures LABEL=REPORT.xml [LABEL=REPORT.xml ...]

Standard library only: it runs whatever became of the virtualenv.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

LINE_MAX = 300


def failures(report: Path) -> list[str]:
    """`<test id>: <first line>` for each test that failed or errored (in setup, call or teardown)."""
    found = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        for outcome in ("failure", "error"):
            problem = case.find(outcome)
            if problem is None:
                continue
            test = _test_id(case)
            text = (problem.get("message") or problem.text or "").strip()
            first = next((line.strip() for line in text.splitlines() if line.strip()), "(no message)")
            where = "" if outcome == "failure" else " (error outside the test body)"
            found.append(f"{test}{where}: {first[:LINE_MAX]}")
    return found


def _test_id(case) -> str:
    """`tests/x/test_y.py::[Class::]name`, from xunit1's file attribute (.ci/run asks for it) and the class name."""
    classname = case.get("classname", "")
    path = case.get("file") or classname.replace(".", "/") + ".py"
    owner = classname.rsplit(".", 1)[-1]
    within = f"{owner}::" if case.get("file") and owner != Path(path).stem else ""
    return f"{path}::{within}{case.get('name', '')}"


def main(argv: list[str]) -> int:
    """Prints each part's failed tests; exit 1 when any part failed or has no readable report."""
    bad = False
    for argument in argv:
        label, _, path = argument.partition("=")
        report = Path(path)
        if not report.is_file():
            print(f"    {label}: no test report (pytest did not finish; see its output above)")
            bad = True
            continue
        try:
            failed = failures(report)
        except ElementTree.ParseError as error:
            print(f"    {label}: the test report is unreadable ({error})")
            bad = True
            continue
        for line in failed:
            print(f"    {label}: FAILED {line}")
        bad = bad or bool(failed)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
