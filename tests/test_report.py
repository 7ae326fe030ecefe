"""`lathe report` over two tiny CPU training runs and a baseline-style JSONL file: the HTML page
holds one SVG path per run in each plot, labelled axes, the legend names, the escaped
config.yaml, no script and no http(s) address; headless Chromium renders it to a PNG that is not
one colour."""
import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from corpus import write_gcide_jsonl
from lathe_cli import TINY_MODEL_2L, run, tokenize_corpus


TINY = TINY_MODEL_2L + """
train:
  steps: 6
  micro_batch_size: 2
  log_interval: 1
  eval_interval: 3
  eval_iters: 1
  threads: 2
optimizer:
  lr: 3.0e-3
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("report_corpus")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 300)
    cfg = d / "tiny.yaml"
    cfg.write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    runs = d / "runs"
    run(["train", cfg, "--run-dir", runs / "fast"])
    run(["train", cfg, "--run-dir", runs / "slow", "--set", "optimizer.lr=1.0e-3"])
    # A baseline's log: step and loss only, and a name that must be escaped.
    base = d / "base<&>.jsonl"
    base.write_text("".join(json.dumps({"step": s, "loss": 6.0 - 0.1 * s}) + "\n"
                            for s in range(1, 7)))
    out = d / "report.html"
    p = run(["report", runs / "fast", runs / "slow", base, "--output", out])
    assert p.stdout.strip() == str(out)
    return d, out.read_text()


def svgs(html):
    return re.findall(r"<svg .*?</svg>", html, re.S)


def plot(html, title):
    found = [s for s in svgs(html) if f">{title}</text>" in s]
    assert len(found) == 1, title
    return found[0]


def test_one_path_per_series(report):
    _, html = report
    loss = plot(html, "training loss against step")
    assert re.findall(r'data-series="([^"]*)"', loss) == ["fast", "slow", "base&lt;&amp;&gt;.jsonl"]
    assert loss.count("<path ") == 3
    # Six logged steps: one move and five line commands per run.
    for d in re.findall(r' d="([^"]*)"', loss):
        assert d.count("M") == 1 and d.count(" L") == 5
    # The baseline has no "tokens" or "lr": only the two runs there.
    assert plot(html, "training loss against tokens").count("<path ") == 2
    assert plot(html, "learning rate against step").count("<path ") == 2
    valid = plot(html, "validation loss against step")
    assert valid.count("<path ") == 2
    for name in ["gradient norm", "tokens/s", "device memory in use (bytes)"]:
        for x in ["step", "tokens"]:
            assert plot(html, f"{name} against {x}").count("<path ") == 2
    # MFU is logged on CUDA only.
    assert "MFU against" not in html


def test_axes_and_legend(report):
    _, html = report
    for s in svgs(html):
        x = re.findall(r'class="x-label"[^>]*>([^<]*)<', s)
        y = re.findall(r'class="y-label"[^>]*>([^<]*)<', s)
        assert x in (["step"], ["tokens"]) and len(y) == 1 and y[0]
        legend = re.findall(r'class="legend"[^>]*>([^<]*)<', s)
        assert legend == re.findall(r'data-series="([^"]*)"', s)
    # Training and validation loss, lr, grad norm, tokens/s, memory: against step and tokens.
    assert len(svgs(html)) == 12


def test_summary_config_and_no_scripts(report):
    d, html = report
    assert "<script" not in html.lower()
    assert not re.search(r"https?:", html)
    rows = re.findall(r"<tr><td>(.*?)</td>.*?<td>(\d+/[^<]*)</td>.*?<td>([^<]*)</td></tr>", html)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("fast", "6/6", "finished"), ("slow", "6/6", "finished"),
        ("base&lt;&amp;&gt;.jsonl", "6/—", "JSONL file")]
    config = (d / "runs" / "fast" / "config.yaml").read_text()
    assert ("<pre class=\"config\">" + config.replace("&", "&amp;").replace("<", "&lt;")
            .replace(">", "&gt;").replace('"', "&quot;").replace("'", "&#39;") + "</pre>") in html
    # The memory plan lathe train printed before step 1 (RUN/memory_plan.txt), per run folder.
    plan = (d / "runs" / "fast" / "memory_plan.txt").read_text()
    assert "parameters" in plan and "total" in plan, plan
    assert "<h2>fast: memory plan</h2>" in html
    assert plan.splitlines()[-1].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in html


def test_errors(report, tmp_path):
    p = run(["report", tmp_path / "nowhere", "--output", tmp_path / "r.html"], check=False)
    assert p.returncode != 0 and p.stderr.startswith("lathe: error:")
    assert str(tmp_path / "nowhere") in p.stderr
    assert not (tmp_path / "r.html").exists()


def png_colours(path):
    """The set of distinct RGB(A) pixels of an 8-bit non-interlaced PNG, decoded here."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and interlace == 0 and ctype in (2, 6)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    prev, colours = bytearray(stride), set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp))
        prev = line
    return colours


def test_chromium_renders_the_curves(report, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/install-deps.sh installs Debian's "
                    "chromium): the rendering is not checked")
    d, _ = report
    png = tmp_path / "report.png"
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--screenshot={png}", "--window-size=1000,900",
                        f"file://{d / 'report.html'}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    colours = png_colours(png)
    # White page, black text, grey grid and the series' colours (first two of the palette).
    assert len(colours) > 10
    for rgb in [(0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28)]:
        assert any(c[:3] == bytes(rgb) for c in colours), rgb
