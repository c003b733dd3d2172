"""Scale path helpers: side environments and launchers for vLLM, DeepSpeed and Ray.

Nothing here is imported by the core package; each module is run or imported on demand.
"""
