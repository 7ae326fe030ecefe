"""The README's claims table points at evidence that exists, and its command table at commands
that exist.

  * every `file::test` the "Claims and their evidence" table names is a test function in that
    file under tests/, and every file it names exists;
  * every link from the table into docs/ names an existing file and, with a #fragment, a heading
    of that file (GitHub's anchor rule: lower case, punctuation other than - and _ dropped,
    spaces as -);
  * every command of the README's command table answers --help with exit status 0, and every
    --flag the table shows for it is in that help.
"""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATHE = os.environ.get("LATHE_BIN", str(ROOT / "build" / "lathe"))
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title):
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else len(README)]


def anchor(heading):
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def test_named_tests_exist():
    claims = section("Claims and their evidence")
    rows = [line for line in claims.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 15, claims
    named = 0
    for row in rows:
        current = None
        for m in re.finditer(r"`(test_\w+\.py)?(?:::(test_\w+))?`", row):
            file, test = m.groups()
            if file:
                current = file
                assert (ROOT / "tests" / file).exists(), f"README names tests/{file}, which does not exist"
            if test:
                assert current, f"README names ::{test} without a file before it: {row}"
                text = (ROOT / "tests" / current).read_text(encoding="utf-8")
                assert re.search(rf"^def {test}\(", text, re.M), f"tests/{current} has no {test}"
                named += 1
    assert named >= 30, named


def test_links_into_docs_exist():
    claims = section("Claims and their evidence")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", claims)
    assert links
    for path, frag in links:
        target = ROOT / path
        assert target.exists(), f"README links {path}, which does not exist"
        if frag:
            headings = [anchor(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)]
            assert frag in headings, f"README links {path}#{frag}: no such heading"


def test_every_command_in_the_table_has_help():
    commands = re.findall(r"^\| `lathe ([a-z]+(?: [a-z]+)?)", section("Commands"), re.M)
    assert len(commands) >= 10, commands
    for c in commands:
        p = subprocess.run([LATHE, *c.split(), "--help"], capture_output=True, text=True)
        assert p.returncode == 0 and "Usage" in p.stdout + p.stderr, (c, p.stdout, p.stderr)


def test_flags_in_the_command_table_exist():
    checked = 0
    for row in section("Commands").splitlines():
        if not row.startswith("| `lathe "):
            continue
        first_cell = row.split("` |", 1)[0]
        for usage in re.findall(r"`?(lathe [^`]+)", first_cell):
            words = usage.split()
            if words[1] == "align":  # `lathe align terms|embed|...|run ...`: every subcommand
                commands = [["align", c] for c in words[2].split("|")]
            else:
                commands = [[w for w in words[1:3] if re.fullmatch(r"[a-z]+", w)]]
            text = ""
            for c in commands:
                p = subprocess.run([LATHE, *c, "--help"], capture_output=True, text=True)
                assert p.returncode == 0, (c, p.stderr)
                text += p.stdout + p.stderr
            for flag in re.findall(r"--[a-z][a-z-]*", usage):
                assert re.search(re.escape(flag) + r"(?![a-z-])", text), \
                    f"README shows `{usage}`, but {flag} is not in its --help"
                checked += 1
    assert checked >= 30, checked
