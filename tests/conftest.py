"""A pytest run in which no test passed is not a pass.

pytest exits 0 when every test was skipped and 5 when none was collected; CTest would show either
as passed. This hook turns such a run into a failure (exit 1), naming the skip reasons, with one
exception: when every skip says the test needs CUDA, a GPU or a CUDA build of lathe (the reason
starts with NEEDS_CUDA, as in `pytest.skip(NEEDS_CUDA + "no GPU here")`), the run exits
SKIPPED_EXIT, which tests/CMakeLists.txt gives CTest as SKIP_RETURN_CODE, so that CTest lists the
file as skipped. Tests import the prefix: `from conftest import NEEDS_CUDA`.
"""

import pytest

NEEDS_CUDA = "needs CUDA: "
SKIPPED_EXIT = 77

_passed = 0
_skips = []


def _note_skip(report):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole (a module-level pytest.skip/importorskip)
        _note_skip(report)


def pytest_runtest_logreport(report):
    global _passed
    if report.passed and report.when == "call":
        _passed += 1
    elif report.skipped and not hasattr(report, "wasxfail"):  # an expected failure is no skip
        _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) or _passed:
        return
    if session.config.option.collectonly:  # nothing was meant to run
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter else print
    if _skips and all(reason.startswith(NEEDS_CUDA) for _, reason in _skips):
        write(f"conftest: no test passed, all {len(_skips)} need CUDA: "
              f"exit {SKIPPED_EXIT} (skipped)")
        session.exitstatus = SKIPPED_EXIT
        return
    write(f"conftest: FAILED: no test passed ({len(_skips)} skipped):")
    for nodeid, reason in _skips:
        write(f"  {nodeid}: {reason}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
