"""Repository-wide pytest policy.

With COREFARM_REQUIRE_TOOLS=1 (set by scripts/test.sh, hence CI) a test that
would skip because a tool, a package or the corefarm binary is missing fails
instead, naming what is missing: the suite can never pass by skipping.
"""
import os

import pytest


def _required() -> bool:
    return os.environ.get("COREFARM_REQUIRE_TOOLS") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _required() and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"COREFARM_REQUIRE_TOOLS=1 but the test would skip: {reason}"


def pytest_collectreport(report):
    # A whole module skipped at import (pytest.importorskip at top level).
    if _required() and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"COREFARM_REQUIRE_TOOLS=1 but the module would be skipped: {reason}"
