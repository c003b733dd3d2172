"""The dashboard in a real headless Chromium, driven over the DevTools protocol.

Starts ``ulorl-dashboard`` on a free port against a store of REAL short training / eval runs that
share one run name, plus two sweep parent runs of one sweep name (tests/dashboard_stores.py), loads
every page, waits until Streamlit finished the script run and the page's charts / tables
rendered, saves a full-page PNG of each, and fails if a page shows a Streamlit exception box.

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
from dashboard_stores import build_real_store, cached_store

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
        browser.navigate(f"{server}/{'' if path == 'runs' else path}{query}")   # the default page lives at /
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


# Text of the legend labels / x-axis labels of the page's first chart (Vega renders SVG text).
LEGEND = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
          "?.querySelectorAll('.role-legend-label text') || []).map(t => t.textContent)")
X_LABELS = ("Array.from(document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
            "?.querySelectorAll('.role-axis-label text') || []).map(t => t.textContent)")
LINES = ("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[0]"
         "?.querySelectorAll('.mark-line path').length || 0")
SELECT = ("(() => { const e = document.querySelector('[data-testid=\"stSelectbox\"]'); if (!e) return '';"
          " return e.textContent + ' ' + Array.from(e.querySelectorAll('input')).map(i => i.value).join(' '); })()")


def _curves(browser: Browser, store: dict) -> dict:
    """The 6 newest training runs (all named ``quickstart``): 6 distinct legend entries."""
    legend = browser.evaluate(LEGEND)
    assert len(legend) == 6 and len(set(legend)) == 6, legend
    assert all(label.startswith("quickstart (") for label in legend), legend
    return {"legend": legend}


def _benchmarks(browser: Browser, store: dict) -> dict:
    """One bar group per run: as many distinct x labels as runs with a held-out result (11)."""
    labels = browser.evaluate(X_LABELS)
    runs = [x for x in labels if x.startswith("quickstart (")]
    assert len(runs) == len(set(runs)) == 10, labels   # 2 real + 8 sweep trials; + the eval run's label
    return {"x_labels": labels}


def _sweep(browser: Browser, store: dict) -> dict:
    """The newest sweep run only: its 4 trials are 4 lines in the parallel coordinates."""
    select = browser.evaluate(SELECT)
    assert store["sweep_B"][:8] in select and "(4 trials)" in select, select
    lines = browser.evaluate(LINES)
    assert lines == 4, lines
    return {"select": select, "parallel_lines": lines}


SERIES_CHECKS = {"curves": _curves, "benchmarks": _benchmarks, "sweep": _sweep}
