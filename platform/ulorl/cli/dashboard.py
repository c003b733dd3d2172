"""``ulorl-dashboard [--tracking-uri URI] [--port P]`` — the Streamlit comparison dashboard.

Runs ``streamlit run dashboard/app.py`` headless on 127.0.0.1 with the store passed as
``MLFLOW_TRACKING_URI`` (default: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<abs ./mlflow.db>``).
The process becomes the Streamlit server (exec), so its PID is the server's: SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from ulorl.jsonout import emit_json, json_command
from ulorl.tracking import resolve_tracking_uri
from ulorl.tracking.uri import is_loopback

REPO_APP = Path(__file__).resolve().parents[3] / "dashboard" / "app.py"
PACKAGED_APP = Path(__file__).resolve().parents[1] / "dashboard" / "entry" / "app.py"
OPTUNA_ENV = "ULORL_OPTUNA_STORAGE"


def find_app() -> Path:
    """``dashboard/app.py`` of the source checkout (editable install), else the packaged copy."""
    return REPO_APP if REPO_APP.is_file() else PACKAGED_APP


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def port_in_use(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return True
    return False


def streamlit_command(app: Path, port: int, address: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(app),
        "--server.address", address, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
        "--server.runOnSave", "false", "--browser.serverAddress", address, "--client.toolbarMode", "minimal",
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ulorl-dashboard",
        description="Compare UloRL runs tracked in MLflow: runs, curves, speedup, benchmarks, sweeps, samples.",
        epilog="Example: ulorl-dashboard --tracking-uri sqlite:///mlflow.db --port 8501",
    )
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--port", type=int, default=8501, help="port on 127.0.0.1 (0 = any free port; default 8501)")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--optuna-storage", help=f"Optuna storage URL for the Sweep page's importance (or ${OPTUNA_ENV})")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (url, tracking_uri, app, command) on stdout; the server's own "
                        "output then goes to stderr")
    return p


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    uri = resolve_tracking_uri(args.tracking_uri)
    app = find_app()
    if not app.is_file():
        print(f"ulorl-dashboard: app file not found: {app}", file=sys.stderr)
        return 2
    if args.port < 0 or args.port > 65535:
        print(f"ulorl-dashboard: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    port = free_port(args.address) if args.port == 0 else args.port
    if not args.dry_run and port_in_use(args.address, port):
        print(f"ulorl-dashboard: port {port} on {args.address} is in use; pass another --port (0 = any free)",
              file=sys.stderr)
        return 2
    from ulorl.cli.checks import tracking_uri_problem, uri_source

    problem = tracking_uri_problem(uri, uri_source(args.tracking_uri))
    if problem:
        print(f"ulorl-dashboard: {problem}", file=sys.stderr)
        return 2
    if not is_loopback(args.address):
        print(f"ulorl-dashboard: warning: --address {args.address} serves the MLflow store {uri} (every run, its "
              f"params, metrics and sampled text) without authentication to anyone who can reach this machine on "
              f"port {port}; to look from another machine, keep the default 127.0.0.1 and tunnel: "
              f"ssh -L {port}:127.0.0.1:{port} <this host>", file=sys.stderr)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        print(f"ulorl-dashboard: no MLflow store at {uri[len('sqlite:///'):]} yet; the pages show an empty "
              "state until runs are written (ulorl-train experiments/quickstart.yaml)", file=sys.stderr)
    cmd = streamlit_command(app, port, args.address)
    url = f"http://{args.address}:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    if args.optuna_storage:
        env[OPTUNA_ENV] = args.optuna_storage
    if args.json:
        emit_json({"url": url, "port": port, "tracking_uri": uri, "app": str(app), "command": cmd,
                   "dry_run": bool(args.dry_run)})
    if args.dry_run:
        if not args.json:
            print(" ".join(cmd))
            print(f"MLFLOW_TRACKING_URI={uri}")
        return 0
    print(f"ulorl-dashboard: serving {uri} at {url} (Ctrl-C stops)", file=sys.stderr, flush=True)
    os.execve(sys.executable, cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
