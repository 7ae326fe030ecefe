"""`lathe launch --gpus N COMMAND ...` on this machine, through the real binary (LATHE_BIN).

Checked here, with small python3 and sh children (no GPU needed):
  - every rank sees torchrun's variables (RANK = LOCAL_RANK, WORLD_SIZE = LOCAL_WORLD_SIZE, one
    MASTER_ADDR:MASTER_PORT, a free port or --master-port) and LATHE_LAUNCHER=launch, and gets
    its own arguments untouched, options included;
  - a rank that exits 3 makes the launcher print the failure, stop a sleeping sibling long before
    its sleep ends, and exit 3; a rank that ignores SIGTERM is SIGKILLed --grace-s later;
  - SIGTERM, SIGINT or SIGHUP sent to the launcher reaches every rank (each writes a marker from its
    handler) and the exit code is the ranks' (the first non-zero); a rank still saving after the
    others stopped is given its time, --grace-s or not; a launcher killed by SIGKILL leaves no
    rank running (each gets SIGTERM from Linux);
  - while the ranks start (256 of them here), a signal to the launcher or a rank's failure stops
    the start: no further rank starts, those started get the signal (or SIGTERM), and the exit
    code is 128 + the signal (or the failing rank's); an exited rank is reaped at once, with the
    others still running; the ranks start with every signal at its default action, none blocked,
    whatever the launcher was given;
  - a command not found, one that cannot be executed, no command and --gpus 0 (or past 256) are
    errors naming them; `lathe` is this very binary (found with a PATH that holds no lathe);
  - `lathe train` on the CPU under it reads its rank as a `lathe launch` group and says to use
    mpirun (the CPU backend's collectives are MPI's), and the launcher stops with its code.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lathe_cli import LATHE, TINY_MODEL, run

ROOT = Path(__file__).resolve().parent.parent

PY = sys.executable


def launch(args, timeout=60, **kw):
    return subprocess.run([LATHE, "launch"] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, **kw)


def wait_for(paths, timeout=30.0):
    """Waits until every path exists; fails the test naming the missing ones after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(Path(p).exists() for p in paths):
            return
        time.sleep(0.02)
    missing = [str(p) for p in paths if not Path(p).exists()]
    raise AssertionError(f"not written within {timeout} s: {missing}")


ENV_DUMP = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "LATHE_LAUNCHER", "LAUNCH_TEST_KEPT"]
out = {k: os.environ.get(k) for k in keys}
out["argv"] = sys.argv[1:]
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(out, f)
"""


def test_ranks_see_torchrun_variables(tmp_path):
    env = dict(os.environ, LAUNCH_TEST_KEPT="yes", RANK="99")
    p = launch(["--gpus", 3, "--", PY, "-c", ENV_DUMP, tmp_path, "--gpus", "7", "--help"],
               env=env)
    assert p.returncode == 0, p.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    ports = {s["MASTER_PORT"] for s in seen}
    assert len(ports) == 1, ports
    port = int(ports.pop())
    assert 1 <= port <= 65535
    for r, s in enumerate(seen):
        assert s == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3",
                     "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "LATHE_LAUNCHER": "launch",
                     "LAUNCH_TEST_KEPT": "yes",
                     "argv": [str(tmp_path), "--gpus", "7", "--help"]}, s

    # A given port, and a command without `--` before it.
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    p = launch(["--gpus", 2, "--master-port", 29999, PY, "-c", ENV_DUMP, fixed])
    assert p.returncode == 0, p.stderr
    for r in range(2):
        assert json.loads((fixed / f"rank{r}.json").read_text())["MASTER_PORT"] == "29999"


def test_failing_rank_stops_the_others(tmp_path):
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1': sys.exit(3)\n"
            "time.sleep(30)\n")
    t0 = time.monotonic()
    p = launch(["--gpus", 2, PY, "-c", code], timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 3, p.stderr
    assert took < 10, f"the sleeping rank was not stopped: the launcher took {took:.1f} s"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("lathe: error: launch: rank 1")]
    assert len(lines) == 1, p.stderr
    assert " exited with status 3; stopping the other rank" in lines[0], lines[0]


def test_killed_rank_gives_128_plus_signal(tmp_path):
    # Rank 0 dies once rank 1 runs (`exec`: the rank is the sleep itself, so the SIGTERM that
    # stops it leaves no sleep behind holding the launcher's output open).
    code = ('if [ "$RANK" = 0 ]; then while [ ! -e "$0/ready.1" ]; do sleep 0.01; done; '
            'kill -9 $$; fi; : > "$0/ready.1"; exec sleep 30')
    p = launch(["--gpus", 2, "sh", "-c", code, tmp_path])
    assert p.returncode == 137, p.stderr
    assert "lathe: error: launch: rank 0 (pid " in p.stderr
    assert "was killed by SIGKILL; stopping the other rank" in p.stderr


def test_rank_ignoring_sigterm_is_killed_after_grace(tmp_path):
    ready = tmp_path / "ready"
    code = ("import os, signal, sys, time\n"
            f"ready = {str(ready)!r}\n"
            "if os.environ['RANK'] == '0':\n"
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    open(ready, 'w').close()\n"
            "    time.sleep(30)\n"
            "while not os.path.exists(ready): time.sleep(0.01)\n"
            "sys.exit(5)\n")
    t0 = time.monotonic()
    p = launch(["--gpus", 2, "--grace-s", 1, PY, "-c", code], timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 5, p.stderr
    assert 1.0 <= took < 10, f"took {took:.1f} s; want the 1 s grace, then SIGKILL"
    assert "rank 1 (pid " in p.stderr and "exited with status 5" in p.stderr, p.stderr
    assert "rank 0 (pid " in p.stderr and "sending SIGKILL" in p.stderr, p.stderr


# Each rank writes ready.R once its handler is in place; the handler writes sig.R and exits with
# the rank's code (rank 0: 0, the others 128 + the signal, as `lathe train` does).
HANDLER = """
import os, signal, sys, time
d, rank = sys.argv[1], os.environ["RANK"]
def on_signal(sig, frame):
    # Written then renamed: a reader that sees the file sees its content.
    with open(os.path.join(d, "sig." + rank + ".tmp"), "w") as f:
        f.write(str(sig))
    os.replace(os.path.join(d, "sig." + rank + ".tmp"), os.path.join(d, "sig." + rank))
    sys.exit(0 if rank == "0" else 128 + sig)
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGHUP, on_signal)
open(os.path.join(d, "ready." + rank), "w").close()
time.sleep(30)
sys.exit(9)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_launcher_reaches_every_rank(tmp_path, sig):
    n = 3
    proc = subprocess.Popen([LATHE, "launch", "--gpus", str(n), PY, "-c", HANDLER, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for([tmp_path / f"ready.{r}" for r in range(n)])
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    for r in range(n):
        assert (tmp_path / f"sig.{r}").read_text() == str(int(sig)), f"rank {r}"
    assert proc.returncode == 128 + sig, err
    assert "lathe: error:" not in err, err  # the ranks' ends after a user's signal are expected


def test_ranks_stopping_after_a_signal_get_their_time(tmp_path):
    """After a forwarded SIGTERM, rank 1 ends at once with 143 while rank 0 takes longer than
    --grace-s to finish (as rank 0 writing a checkpoint's model does): it is not killed."""
    code = ("import os, signal, sys, time\n"
            f"d = {str(tmp_path)!r}\n"
            "rank = os.environ['RANK']\n"
            "def on_term(sig, frame):\n"
            "    if rank == '0':\n"
            "        time.sleep(1.5)\n"
            "        open(os.path.join(d, 'saved'), 'w').close()\n"
            "    sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, on_term)\n"
            "open(os.path.join(d, 'ready.' + rank), 'w').close()\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([LATHE, "launch", "--gpus", "2", "--grace-s", "0.2", PY, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for([tmp_path / "ready.0", tmp_path / "ready.1"])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert (tmp_path / "saved").exists(), err
    assert "SIGKILL" not in err and "lathe: error:" not in err, err


def test_killed_launcher_leaves_no_orphans(tmp_path):
    n = 2
    proc = subprocess.Popen([LATHE, "launch", "--gpus", str(n), PY, "-c", HANDLER, str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for([tmp_path / f"ready.{r}" for r in range(n)])
        proc.kill()
        proc.wait(timeout=10)
        wait_for([tmp_path / f"sig.{r}" for r in range(n)])  # SIGTERM from PR_SET_PDEATHSIG
    finally:
        if proc.poll() is None:
            proc.kill()
    for r in range(n):
        assert (tmp_path / f"sig.{r}").read_text() == str(int(signal.SIGTERM))


def test_bad_commands_are_errors_naming_them(tmp_path):
    p = launch(["--gpus", 2, "no_such_command_for_lathe_launch", "x"])
    assert p.returncode == 2, p.stderr
    assert ("lathe: error: launch: command 'no_such_command_for_lathe_launch' not found"
            in p.stderr), p.stderr

    plain = tmp_path / "not_executable.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    p = launch(["--gpus", 2, plain])
    assert p.returncode == 2, p.stderr
    assert f"lathe: error: launch: cannot execute '{plain}' for rank 0: Permission denied" \
        in p.stderr, p.stderr

    p = launch(["--gpus", 2])
    assert p.returncode == 2, p.stderr
    assert "lathe: error: launch: no command to start" in p.stderr, p.stderr
    p = launch(["--gpus", 0, "true"])
    assert p.returncode == 2, p.stderr
    assert "--gpus 0" in p.stderr, p.stderr
    p = launch(["--gpus", 100000, "true"])
    assert p.returncode == 2 and "--gpus 100000: one machine's ranks, at most 256" in p.stderr, \
        p.stderr
    p = launch(["true"])  # --gpus is required
    assert p.returncode != 0
    assert "--gpus" in p.stderr, p.stderr


def test_lathe_is_this_binary():
    # PATH holds no lathe, so `lathe` can only be the launcher's own file.
    env = dict(os.environ, PATH="/usr/bin:/bin")
    p = launch(["--gpus", 2, "lathe", "doctor", "--json"], env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    reports = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(reports) == 2, p.stdout


def test_help_relates_to_other_launchers():
    p = run(["launch", "--help"])
    for word in ["--gpus", "--master-port", "--grace-s", "torchrun", "srun", "mpirun",
                 "docs/DISTRIBUTED.md", "Exit codes"]:
        assert word in p.stdout, word


def test_cpu_train_ranks_see_a_lathe_launch_group(tmp_path):
    docs = tmp_path / "c.jsonl"
    docs.write_text("".join(json.dumps({"text": f"the quick brown fox {i} jumps. " * 8}) + "\n"
                            for i in range(40)))
    tokenizer = ROOT / "tests" / "fixtures" / "convert" / "hf" / "tokenizer.json"
    run(["prepare", "--tokenizer", tokenizer, "--input", docs, "--output-prefix", tmp_path / "d",
         "--append-eod"])
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL + "train:\n  steps: 2\n  device: cpu\n  threads: 1\n"
                      f"data.path: {tmp_path / 'd'}\ndata.tokenizer: {tokenizer}\n")
    p = launch(["--gpus", 2, "lathe", "train", config, "--run-dir", tmp_path / "run"])
    assert p.returncode == 1, p.stderr
    # The rank that fails first makes the launcher stop the other, which may not get to print.
    said = [r for r in range(2) if
            (f"lathe: error: rank {r} of 2 (local rank {r}, lathe launch): the CPU backend's "
             "collectives are MPI's, and lathe launch starts processes that MPI does not know; "
             "start the 2 ranks with `mpirun -np 2 lathe ...`") in p.stderr]
    assert said, p.stderr
    assert "lathe: error: launch: rank " in p.stderr and " exited with status 1" in p.stderr


# Many ranks, so that starting them all takes a while: a signal or a failure that arrives meanwhile
# must stop the start, not wait for the last rank.
MANY = 256


def started_pids(d):
    return [int(f.read_text()) for f in Path(d).glob("pid.*") if f.read_text().strip()]


def assert_gone(pids):
    """The launcher reaps every rank before it exits: none is left, running or a zombie."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_signal_before_ranks_start_starts_none(tmp_path):
    """A SIGTERM that reaches the launcher before it starts any rank (here: pending, blocked, as
    the launcher is executed): no rank starts, and the launcher exits 143."""
    go = ("import os, signal, sys\n"
          "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
          "os.kill(os.getpid(), signal.SIGTERM)\n"
          "os.execv(sys.argv[1], sys.argv[1:])\n")
    p = subprocess.run([PY, "-c", go, LATHE, "launch", "--gpus", "3", "sh", "-c",
                        ': > "$0/started.$RANK"', str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 143, p.stderr
    assert not list(tmp_path.glob("started.*")), "ranks started after the signal"
    assert "lathe: error:" not in p.stderr, p.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_ranks_start_stops_the_start(tmp_path, sig):
    # Rank 0 signals the launcher as soon as it runs, while the launcher starts the other ranks.
    code = ('echo $$ > "$0/pid.$RANK.tmp" && mv "$0/pid.$RANK.tmp" "$0/pid.$RANK"; '
            f'if [ "$RANK" = 0 ]; then kill -{int(sig)} $PPID; fi; exec sleep 30')
    t0 = time.monotonic()
    p = launch(["--gpus", MANY, "sh", "-c", code, tmp_path], timeout=60)
    took = time.monotonic() - t0
    started = started_pids(tmp_path)
    assert p.returncode == 128 + sig, p.stderr
    assert took < 20, f"the ranks were not stopped: the launcher took {took:.1f} s"
    # Starting every rank after the signal would leave (nearly) all of them a pid file.
    assert len(started) < MANY // 2, f"{len(started)} of {MANY} ranks started after the signal"
    assert "lathe: error:" not in p.stderr, p.stderr
    assert_gone(started)


def test_a_signal_the_launcher_was_given_ignored_stays_ignored(tmp_path):
    """Under nohup the launcher ignores SIGHUP: one sent while the ranks start neither stops the
    start nor reaches the ranks (each started ignoring it too)."""
    def nohup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    code = ('if [ "$RANK" = 0 ]; then kill -HUP $PPID; fi; '
            'echo $$ > "$0/pid.$RANK.tmp" && mv "$0/pid.$RANK.tmp" "$0/pid.$RANK"')
    p = launch(["--gpus", MANY, "sh", "-c", code, tmp_path], timeout=60, preexec_fn=nohup)
    assert p.returncode == 0, p.stderr
    assert len(started_pids(tmp_path)) == MANY, p.stderr


def test_failure_while_ranks_start_stops_the_start(tmp_path):
    code = ('if [ "$RANK" = 0 ]; then exit 3; fi; '
            'echo $$ > "$0/pid.$RANK.tmp" && mv "$0/pid.$RANK.tmp" "$0/pid.$RANK"; exec sleep 30')
    t0 = time.monotonic()
    p = launch(["--gpus", MANY, "--grace-s", 5, "sh", "-c", code, tmp_path], timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 3, p.stderr
    assert took < 20, f"the ranks were not stopped: the launcher took {took:.1f} s"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("lathe: error: launch: rank 0")]
    assert len(lines) == 1, p.stderr
    assert " exited with status 3" in lines[0], lines[0]
    # "; stopping the other K ranks": K counts the ranks running when rank 0's end was seen.
    others = 0
    if "; stopping the other rank" in lines[0]:
        others = 1
    elif "; stopping the other " in lines[0]:
        others = int(lines[0].split("; stopping the other ")[1].split()[0])
    assert others < MANY // 2, f"rank 0's end was seen after {others} more ranks started"
    assert_gone(started_pids(tmp_path))


def test_rank_that_cannot_start_stops_those_started(tmp_path):
    """Rank 0 holds its own script open for writing, so that executing it for a later rank fails
    (Text file busy): the ranks started are stopped and reaped before the launcher exits 2."""
    script = tmp_path / "rank.sh"
    script.write_text('#!/bin/sh\n'
                      'echo $$ > "$(dirname "$0")/pid.$RANK"\n'
                      # `command`: a failed redirection (Text file busy too, while another rank
                      # executes this script) does not end the shell, which tries again
                      'if [ "$RANK" = 0 ]; then\n'
                      '  until command exec 3>>"$0" 2>/dev/null; do :; done\n'
                      'fi\n'
                      'exec sleep 20\n')
    script.chmod(0o755)
    p = launch(["--gpus", MANY, "--grace-s", 5, script], timeout=60)
    if p.returncode == 0:  # every rank had started before rank 0 opened the script
        pytest.skip("no start failed: every rank started before rank 0 held its script")
    assert p.returncode == 2, p.stderr
    assert f"lathe: error: launch: cannot execute '{script}' for rank " in p.stderr, p.stderr
    assert ": Text file busy" in p.stderr, p.stderr
    assert_gone(started_pids(tmp_path))


def test_exited_rank_is_reaped_while_others_run(tmp_path):
    # Rank 1 exits at once; rank 0 watches its pid until the launcher has reaped it (no zombie).
    code = ("import os, sys, time\n"
            f"d = {str(tmp_path)!r}\n"
            "pid_file = os.path.join(d, 'pid.1')\n"
            "if os.environ['RANK'] == '1':\n"
            "    with open(pid_file + '.tmp', 'w') as f: f.write(str(os.getpid()))\n"
            "    os.replace(pid_file + '.tmp', pid_file)\n"
            "    sys.exit(0)\n"
            "deadline = time.monotonic() + 30\n"
            "while not os.path.exists(pid_file) and time.monotonic() < deadline: time.sleep(0.01)\n"
            "pid = open(pid_file).read()\n"
            "state = 'gone'\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            "        state = open('/proc/' + pid + '/stat').read().rsplit(')', 1)[1].split()[0]\n"
            "    except FileNotFoundError:\n"
            "        state = 'gone'\n"
            "        break\n"
            "    time.sleep(0.01)\n"
            "open(os.path.join(d, 'rank1'), 'w').write(state)\n")
    p = launch(["--gpus", 2, PY, "-c", code], timeout=60)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "rank1").read_text() == "gone", "rank 1 stayed a zombie while rank 0 ran"


def test_ranks_start_with_no_mask_and_the_ignores_they_were_given(tmp_path):
    def given():  # what a parent may hand the launcher: ignored and blocked signals
        for sig in signal.valid_signals():  # pytest may itself run with some ignored
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGQUIT, signal.SIGTERM})

    code = 'exec grep -E "^Sig(Blk|Ign):" /proc/self/status > "$0/status.$RANK"'
    p = subprocess.run([LATHE, "launch", "--gpus", "2", "sh", "-c", code, str(tmp_path)],
                       capture_output=True, text=True, timeout=60, preexec_fn=given)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        fields = dict(ln.split(":\t") for ln in (tmp_path / f"status.{r}").read_text().split("\n")
                      if ln)
        # nothing blocked; SIGHUP still ignored (nohup), SIGCHLD at its default
        assert fields == {"SigBlk": "0000000000000000",
                          "SigIgn": f"{1 << (signal.SIGHUP - 1):016x}"}, (r, fields)
