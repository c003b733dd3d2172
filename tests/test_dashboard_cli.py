"""``ulorl-dashboard``: command line, URI resolution, port checks, and a real server start."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


from ulorl.cli import dashboard as cli

REPO = Path(__file__).resolve().parents[1]


def test_dry_run_json_is_one_object_with_absolute_uri(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--dry-run", "--json", "--tracking-uri", "sqlite:///rel.db", "--port", "8600"]) == 0
    out = capsys.readouterr()
    info = json.loads(out.out)                         # exactly one JSON object on stdout
    assert info["tracking_uri"] == f"sqlite:///{tmp_path.resolve() / 'rel.db'}"
    assert info["url"] == "http://127.0.0.1:8600" and info["app"] == str(REPO / "dashboard" / "app.py")
    cmd = info["command"]
    assert cmd[1:5] == ["-m", "streamlit", "run", str(REPO / "dashboard" / "app.py")]
    for flag, value in (("--server.address", "127.0.0.1"), ("--server.port", "8600"), ("--server.headless", "true"),
                        ("--browser.gatherUsageStats", "false")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "no MLflow store" in out.err                # the store does not exist yet: said on stderr


def test_default_uri_from_environment_and_free_port(capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert cli.main(["--dry-run", "--json", "--port", "0"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tracking_uri"] == "http://127.0.0.1:5000" and 0 < info["port"] < 65536


def test_bad_and_busy_ports_are_errors(capsys):
    assert cli.main(["--port", "70000"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert cli.main(["--port", str(port), "--tracking-uri", "sqlite:////nonexistent/x.db"]) == 2
    assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_app_files_exist():
    assert cli.find_app() == REPO / "dashboard" / "app.py"
    assert cli.PACKAGED_APP.is_file()   # used when the package is installed without the repository


def test_server_starts_serves_and_stops(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = subprocess.Popen([sys.executable, "-m", "ulorl.cli.dashboard", "--tracking-uri", f"sqlite:///{db}",
                             "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        deadline = time.monotonic() + 60
        body = b""
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=2)
            try:
                conn.request("GET", "/_stcore/health")
                body = conn.getresponse().read()
                if body == b"ok":
                    break
            except OSError:
                time.sleep(0.3)
            finally:
                conn.close()
        assert body == b"ok", proc.stderr.read() if proc.poll() is not None else "not healthy in 60 s"
        conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=5)
        conn.request("GET", "/")
        page = conn.getresponse()
        assert page.status == 200 and b"<html" in page.read().lower()
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc in (0, -signal.SIGTERM)
    assert not db.exists()                            # serving an empty state creates no store
