"""The watchdog (src/dist/watchdog.h) under mpirun: a rank that never reaches a collective.

dist_mpi_tests' MpiWatchdog test, started here with LATHE_TEST_WATCHDOG_MS, has rank 1 sleep for
minutes while the other ranks wait at a barrier armed with that timeout. Each waiting rank's
watchdog must print its one line (rank, host, the wait, the timeout, the likely cause), abort the
MPI job, and mpirun must exit with the watchdog's status (124) within the timeout plus mpirun's own
start and stop, long before rank 1 would wake.
"""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("LATHE_BUILD_DIR", REPO / "build"))
BINARY = BUILD_DIR / "dist_mpi_tests"
WATCHDOG_EXIT_CODE = 124  # kWatchdogExitCode, src/dist/watchdog.h
TIMEOUT_MS = 1000
# mpirun's start (about 0.5 s here), the timeout, one poll, the abort: far below rank 1's sleep.
BOUND_S = 20


@pytest.mark.parametrize("ranks", [2, 3])
def test_watchdog_ends_a_job_whose_rank_never_joins(ranks):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: install OpenMPI (scripts/install-deps.sh)"
    assert BINARY.exists(), f"{BINARY} not built (ninja -C {BUILD_DIR} dist_mpi_tests)"
    env = dict(os.environ, LATHE_TEST_WATCHDOG_MS=str(TIMEOUT_MS), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    start = time.monotonic()
    command = [mpirun, "-np", str(ranks), "--oversubscribe", "-x", "LATHE_TEST_WATCHDOG_MS",
               str(BINARY), "--gtest_filter=MpiWatchdog.*"]
    p = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - start
    out = p.stdout + p.stderr
    assert p.returncode == WATCHDOG_EXIT_CODE, out
    assert elapsed < BOUND_S, f"{elapsed:.1f} s\n{out}"
    assert "the watchdog did not end the job" not in out, out
    line = re.compile(
        r"^lathe: error: rank (\d+) of %d on host \S+: barrier of the watchdog test did not "
        r"complete within 1 s \(parallel\.timeout_s\); another rank has probably died, hung or "
        r"run out of memory: look for its error above or in the launcher's output$" % ranks, re.M)
    named = {int(m.group(1)) for m in line.finditer(out)}
    # At least one waiting rank fired before MPI_Abort ended the others; rank 1 never waits.
    assert named, out
    assert 1 not in named, out
