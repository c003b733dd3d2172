"""Scale path helpers: side environments and launchers for vLLM, DeepSpeed and Ray.

Nothing here is imported by the core package; each module is run or imported on demand (no ray,
deepspeed or vllm import at package import)::

    ulorl-train EXP.yaml --ray [--address ray://host:10001]   # ulorl.scale.placement (Ray actors, driver)
    ulorl-train EXP.yaml --dry-run                             # ulorl.scale.layout (placement arithmetic)

The GPU check and the other measurement tools are in ``ulorl.bench`` (``ulorl-bench gpu-check``).
"""
