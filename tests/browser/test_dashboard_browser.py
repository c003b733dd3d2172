"""The dashboard in a real headless Chromium, driven over the DevTools protocol.

Starts ``ulorl-dashboard`` on a free port against a store of REAL short training / eval runs that
share one run name, plus two sweep parent runs of one sweep name, the newer with an S = 1 reference
trial like the headline sweep's (tests/dashboard_stores.py), opens every page by its own URL (and
the root URL, which must land on /runs), waits until Streamlit finished the script run and the
page's charts / tables rendered, saves a full-page PNG of each, and fails if a page shows a
Streamlit exception box or a dialog ("Page not found"). Per page it checks what the page is for:
Speedup states S = 4 against S = 1 with a ratio, Benchmarks draws bars of visible thickness and
length on a value axis with one short label per run, Curves' legend labels are unique and short,
Sweep shows the newest sweep run's trials.

Screenshots go to the test's tmp dir and are copied to ``$ULORL_DASHBOARD_SHOTS``
(default ``<tmp>/dashboard_shots``). Needs Debian's ``chromium`` (``apt-get install -y chromium``).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cdp import Browser, find_chromium
from dashboard_stores import SPEEDUP_S4_VS_S1, build_real_store, cached_store

# page url path -> (title, JS expression counting the elements that must be rendered, minimum)
CHART = '[data-testid="stVegaLiteChart"] svg'
TABLE = '[data-testid="stDataFrame"] canvas'
PAGES: dict[str, tuple[str, str, int]] = {
    "runs": ("Runs", TABLE, 1),
    "curves": ("Curves", CHART, 2),
    "speedup": ("Speedup", CHART, 2),
    "benchmarks": ("Benchmarks", CHART, 1),
    "sweep": ("Sweep", CHART, 2),   # parallel coordinates + history (importance hidden: < 8 trials)
    # opened on the DMMPT training run (?run=...): its sampled responses must render
    "detail": ("Run detail", ".ulorl-sample", 1),
}
EXCEPTION = '[data-testid="stException"]'
SCRIPT_DONE = ("(() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
               " return !!a && a.dataset.testScriptState === 'notRunning'"
               " && a.dataset.testConnectionState === 'CONNECTED'; })()")


def _count(selector: str) -> str:
    return f"document.querySelectorAll({json.dumps(selector)}).length"


def _layout_signature() -> str:
    return ("JSON.stringify([Array.from(document.querySelectorAll('[data-testid=\"stMain\"]')).map(e => e.scrollHeight),"
            f" {_count(CHART)}, {_count(TABLE)}, {_count('.ulorl-sample')},"
            " document.querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState])")


def _wait_stable(browser: Browser, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
    """Wait until the page layout (scroll height, chart / table counts) stops changing."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        sig = browser.evaluate(_layout_signature())
        if sig != last:
            last, since = sig, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def _health(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/_stcore/health")
        return conn.getresponse().read().strip() == b"ok"
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    return cached_store(tmp_path_factory, "real", build_real_store)


@pytest.fixture(scope="module")
def server(real_store, tmp_path_factory):
    """``ulorl-dashboard --port 0 --json`` against the real-run store; yields the base URL."""
    script = Path(sys.executable).with_name("ulorl-dashboard")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "ulorl.cli.dashboard"]
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd + ["--tracking-uri", real_store["uri"], "--port", "0", "--json"],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while not _health(info["port"]):
            assert proc.poll() is None, f"ulorl-dashboard exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"dashboard not healthy after 60 s: {log.read_text()}"
            time.sleep(0.3)
        yield info["url"]
    finally:
        proc.send_signal(signal.SIGTERM)  # the CLI exec'd into streamlit: this PID is the server
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.fail("no chromium on PATH: install Debian's chromium (apt-get update && apt-get install -y chromium)")
    b = Browser(binary)
    yield b
    b.close()


def test_every_page_renders_in_chromium(server, browser, real_store, tmp_path):
    shots_dir = Path(os.environ.get("ULORL_DASHBOARD_SHOTS", Path(tempfile.gettempdir()) / "dashboard_shots"))
    shots_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    for path, (title, ready, minimum) in PAGES.items():
        t0 = time.monotonic()
        browser.reset_viewport()
        query = f"?run={real_store['train_dynamic']}" if path == "detail" else ""
        browser.navigate(f"{server}/{path}{query}")   # every page by its own URL, /runs included
        browser.wait_for(SCRIPT_DONE, timeout_s=90)
        browser.wait_for(f"Array.from(document.querySelectorAll('h1')).some(h => h.innerText.includes({json.dumps(title)}))",
                         timeout_s=60)
        browser.wait_for(f"{_count(ready)} >= {minimum} || {_count(EXCEPTION)} > 0", timeout_s=60)
        _wait_stable(browser)
        shot = browser.screenshot(tmp_path / f"{path}.png")
        shutil.copy(shot, shots_dir / shot.name)
        errors = browser.evaluate(f"Array.from(document.querySelectorAll({json.dumps(EXCEPTION)})).map(e => e.innerText)")
        report[path] = {"rendered": browser.evaluate(_count(ready)), "exceptions": errors,
                        "png_bytes": shot.stat().st_size, "seconds": round(time.monotonic() - t0, 1)}
        assert not errors, f"page {path} shows a Streamlit exception: {errors}"
        dialogs = browser.evaluate("Array.from(document.querySelectorAll('[role=\"dialog\"]')).map(e => e.innerText)")
        assert not dialogs, f"page {path} shows a dialog: {dialogs}"
        assert shot.stat().st_size > 10_000, f"screenshot of {path} looks empty"
        if path in SERIES_CHECKS:
            report[path]["series"] = SERIES_CHECKS[path](browser, real_store)
    print(json.dumps(report, indent=1))


def test_root_url_lands_on_the_runs_page_at_its_own_url(server, browser):
    browser.reset_viewport()
    browser.navigate(f"{server}/")
    browser.wait_for(SCRIPT_DONE, timeout_s=90)
    browser.wait_for("Array.from(document.querySelectorAll('h1')).some(h => h.innerText.includes('Runs'))",
                     timeout_s=60)
    browser.wait_for("location.pathname === '/runs'", timeout_s=30)
    dialogs = browser.evaluate("Array.from(document.querySelectorAll('[role=\"dialog\"]')).map(e => e.innerText)")
    assert not dialogs, dialogs


# Text of the legend labels / x-axis labels of the page's first chart (Vega renders SVG text).
LEGEND = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
          "?.querySelectorAll('.role-legend-label text') || []).map(t => t.textContent)")
LINES = ("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
         "?.querySelectorAll('.mark-line path').length || 0")
SELECT = ("(() => { const e = document.querySelector('[data-testid=\"stSelectbox\"]'); if (!e) return '';"
          " return e.textContent + ' ' + Array.from(e.querySelectorAll('input')).map(i => i.value).join(' '); })()")


def _curves(browser: Browser, store: dict) -> dict:
    """The 6 newest training runs (all named ``quickstart``): 6 distinct, short legend entries, whole
    (not cut with an ellipsis): the two plain runs by name and id, sweep trials by role and swept values."""
    legend = browser.evaluate(LEGEND)
    assert len(legend) == 6 and len(set(legend)) == 6, legend
    assert all(len(label) <= 40 and not label.endswith("…") for label in legend), legend
    assert f"quickstart ({store['train_dynamic'][:8]})" in legend, legend
    assert "reference non_segmented" in legend and any(x.startswith("search tau=") for x in legend), legend
    return {"legend": legend}


# Bars of the page's first chart (Vega-Lite names the first layer's marks ``layer_0_marks``): their
# rendered boxes, and the tick labels of its axes.
BARS = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
        "?.querySelectorAll('.layer_0_marks path') || []).map(p => { const b = p.getBBox(); "
        "return [b.width, b.height]; })")
AXES = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
        "?.querySelectorAll('.role-axis') || []).map(a => Array.from(a.querySelectorAll('.role-axis-label text'))"
        ".map(t => t.textContent))")


def _benchmarks(browser: Browser, store: dict) -> dict:
    """Horizontal bars: one short, distinct label per run on the y axis (12: 2 real runs, 9 sweep trials,
    the eval run), a numeric avg@k axis, bars at least 4 px thick and visibly long."""
    axes = browser.evaluate(AXES)
    numeric = [a for a in axes if a and all(x.replace(".", "", 1).isdigit() for x in a)]
    labels = next((a for a in axes if a and a not in numeric), [])
    assert numeric and len(numeric[0]) >= 2, axes                       # the value axis has ticks
    assert len(labels) == len(set(labels)) == 12, labels
    assert all(len(x) <= 40 for x in labels), labels
    bars = browser.evaluate(BARS)
    assert len(bars) >= 12, bars
    assert all(h >= 4 for _, h in bars), bars                           # thickness
    assert sum(w >= 2 for w, _ in bars) >= len(bars) - 2, bars          # length (a score of 0 draws none)
    return {"labels": labels, "value_axis": numeric[0], "bars": bars}


def _speedup(browser: Browser, store: dict) -> dict:
    """The sweep group: S = 4 against its S = 1 reference, with the ratio and why it is below 1."""
    text = browser.evaluate("document.querySelector('[data-testid=\"stMain\"]').innerText")
    ratio = f"{SPEEDUP_S4_VS_S1:.2f}x wall time per step"
    assert "S = 4 vs S = 1" in text and ratio in text, text[:2000]
    assert "compaction on a CPU" in text and "ulorl-sim paper" in text, text[:2000]
    return {"ratio": ratio}


def _sweep(browser: Browser, store: dict) -> dict:
    """The newest sweep run only: its 5 trials (3 search, the S = 1 reference, the baseline) are 5 lines
    in the parallel coordinates."""
    select = browser.evaluate(SELECT)
    assert store["sweep_B"][:8] in select and "(5 trials)" in select, select
    lines = browser.evaluate(LINES)
    assert lines == 5, lines
    return {"select": select, "parallel_lines": lines}


SERIES_CHECKS = {"curves": _curves, "benchmarks": _benchmarks, "speedup": _speedup, "sweep": _sweep}
