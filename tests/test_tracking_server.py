"""The driver's MLflow server: loopback without auth by default, basic auth beyond loopback or forced."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from ulorl.sweep.server import MlflowServer, is_loopback


def test_auth_follows_the_listening_address():
    store = "sqlite:////tmp/never-started.db"
    assert not MlflowServer(store).auth and MlflowServer(store).client_env() == {}
    assert MlflowServer(store, host="0.0.0.0").auth
    assert MlflowServer(store, host="10.1.2.3", port=5000).uri == "http://10.1.2.3:5000"
    with pytest.raises(ValueError, match="beyond loopback"):
        MlflowServer(store, host="0.0.0.0", auth=False)
    # one machine: plain file artifacts (readable with the SQLite URI); cluster mode: proxied (the server
    # started below serves them)
    assert not MlflowServer(store).proxy_artifacts
    assert MlflowServer(store, auth=True).proxy_artifacts and MlflowServer(store, host="0.0.0.0").proxy_artifacts
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("0.0.0.0")


def test_forced_auth_refuses_unauthenticated_writes_and_proxies_artifacts(tmp_path, monkeypatch):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with MlflowServer(store, auth=True) as srv:
        req = urllib.request.Request(f"{srv.uri}/api/2.0/mlflow/experiments/create",
                                     data=json.dumps({"name": "intruder"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401
        for k, v in srv.client_env().items():
            monkeypatch.setenv(k, v)
        client = MlflowClient(srv.uri)
        exp = client.create_experiment("ok")
        run = client.create_run(exp)
        client.log_text(run.info.run_id, "hello", "notes/a.txt")
        assert client.get_experiment(exp).artifact_location.startswith("mlflow-artifacts:")
        password = srv.client_env()["MLFLOW_TRACKING_PASSWORD"]
        log_path = srv.log_path
    assert not MlflowClient(store).get_experiment_by_name("intruder")
    assert list((tmp_path / "mlflow-artifacts").rglob("a.txt"))  # the server wrote it beside the store
    assert password not in log_path.read_text()
    assert os.environ.get("MLFLOW_TRACKING_PASSWORD") == password  # only through the environment we set
