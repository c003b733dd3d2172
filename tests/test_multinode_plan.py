"""The decisions a placed run makes before step 1 when its processes leave the driver's machine
(``ulorl.scale.multinode``, pure): where rank 0's tracking store comes from, and whether every node
sees the run directory. The same checks on a real 2-node Ray cluster: tests/test_multinode_ray.py."""

from __future__ import annotations

import pytest

from ulorl.scale.layout import PlacementError
from ulorl.scale.multinode import RunDirProbe, answer_probe, one_per_node, served_params, store_plan

DRIVER = {"node_id": "a" * 40, "node_ip": "10.0.0.1"}
SAME_NODE = dict(DRIVER)
OTHER_NODE_SAME_MACHINE = {"node_id": "b" * 40, "node_ip": "10.0.0.1"}
OTHER_MACHINE = {"node_id": "c" * 40, "node_ip": "10.0.0.2"}
STORE = "sqlite:////runs/mlflow.db"


def test_rank0_on_the_driver_node_or_a_server_uri_writes_directly():
    assert store_plan(STORE, DRIVER, SAME_NODE, "127.0.0.1") == "direct"
    assert store_plan("http://10.0.0.1:5000", DRIVER, OTHER_MACHINE, "127.0.0.1") == "direct"


def test_rank0_elsewhere_gets_the_store_served():
    assert store_plan(STORE, DRIVER, OTHER_NODE_SAME_MACHINE, "127.0.0.1") == "serve"   # loopback reaches it
    assert store_plan(STORE, DRIVER, OTHER_MACHINE, "10.0.0.1") == "serve"              # served beyond loopback
    assert store_plan("/runs/mlflow.db", DRIVER, OTHER_MACHINE, "0.0.0.0") == "serve"


def test_loopback_server_for_another_machine_is_refused_with_the_command_that_works():
    with pytest.raises(PlacementError) as exc:
        store_plan(STORE, DRIVER, OTHER_MACHINE, "127.0.0.1")
    msg = str(exc.value)
    assert "tracking.server_host=10.0.0.1" in msg and "10.0.0.2" in msg and STORE in msg
    assert "--tracking-uri http://" in msg


def test_run_dir_probe_names_the_node_that_does_not_see_it(tmp_path):
    run = tmp_path / "run"
    probe = RunDirProbe.create(run)
    ok = answer_probe(str(probe.path), probe.token, DRIVER, ["trainer.0"])
    assert ok["read"] and (probe.path.parent / ok["reply"]).is_file()
    blind = answer_probe(str(tmp_path / "elsewhere" / probe.token), probe.token, OTHER_MACHINE,
                         ["trainer.1", "engine.0"])
    assert not blind["read"] and "FileNotFoundError" in blind["error"]
    probe.check([ok])
    with pytest.raises(PlacementError) as exc:
        probe.check([ok, blind])
    msg = str(exc.value)
    assert "node 10.0.0.2" in msg and "cccccccccccc" in msg and str(run) in msg and "trainer.1, engine.0" in msg
    # a node that read the token but wrote its answer somewhere the driver does not see
    private = {**ok, "node_id": "d" * 40, "reply": "not-here"}
    with pytest.raises(PlacementError, match="does not see it"):
        probe.check([private])
    probe.remove()
    assert not (run / ".node-check").exists()


def test_one_actor_answers_per_node_with_every_role_placed_there():
    infos = [DRIVER, OTHER_MACHINE, DRIVER]
    assert one_per_node(infos, ["trainer.0", "trainer.1", "engine.0"]) == {
        DRIVER["node_id"]: (0, ["trainer.0", "engine.0"]), OTHER_MACHINE["node_id"]: (1, ["trainer.1"])}


def test_served_params_record_how_rank0_reached_the_store():
    assert served_params("direct", None, False) == {"placement.tracking": "direct"}
    assert served_params("serve", "http://10.0.0.1:5000", True) == {
        "placement.tracking": "server", "placement.tracking_server": "http://10.0.0.1:5000",
        "placement.tracking_auth": "basic"}
