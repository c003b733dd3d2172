"""gpu_check's colocated stage: listed, run by default after the vLLM stages, GPU only (on a CPU it says why
instead of starting vLLM, whose CPU build has no sleep mode)."""

from __future__ import annotations

from ulorl.bench import gpu_check as gc
from ulorl.rollout.engines.vllm import COLOCATE_CPU_MESSAGE


def test_colocated_stage_is_a_default_stage_with_its_needs():
    assert "vllm_colocate" in gc.DEFAULT_STAGES
    assert gc.STAGES.index("vllm_colocate") > gc.STAGES.index("vllm")
    assert gc.NEEDS["vllm_colocate"] == ("model",) and "vllm" in gc.REQUIRES["vllm_colocate"]
    assert gc.STAGE_FNS["vllm_colocate"] is gc.stage_vllm_colocate and gc.LIMIT_S["vllm_colocate"] > 0


def test_colocated_stage_on_cpu_says_why_and_starts_nothing(tmp_path):
    ctx = gc.StageContext(tmp_path, "cpu", steps=1, long_row_path="chunked")
    assert gc.stage_vllm_colocate(ctx) == {"ran": False, "note": COLOCATE_CPU_MESSAGE}
