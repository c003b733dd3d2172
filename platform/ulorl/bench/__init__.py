"""Measurement tools: benchmarks, validation runs and one-off studies (``ulorl-bench`` subcommands).

Nothing in training, sweeps, eval or the dashboard imports this package; its modules import the
production code they measure. Each tool also runs as ``python -m ulorl.bench.<module>``:

    rollout         segment rollout, S x batching regime         ulorl-bench rollout
    weight_sync     trainer -> engine weight sync                ulorl-bench weight-sync
    memory          one training micro-step on a long row        ulorl-bench memory
    zero3           ZeRO-3 memory per rank (+ zero3_gathers)     ulorl-bench zero3-memory
    sp              activation memory per rank, SP = 1 vs N      ulorl-bench sp-memory
    verifier        reward verifier vs labelled responses        ulorl-bench verifier
    reward_cost     per-item reward cost                         ulorl-bench reward-cost
    gpu_check       GPU validation run (+ gpu_wheels)            ulorl-bench gpu-check / gpu-wheels
    traffic         control traffic of a 2-rank DeepSpeed run    ulorl-bench traffic
    entropy_effect  entropy change per token class of an update  ulorl-bench entropy-effect
    entropy_map     MPT share of the entropy change, over runs    ulorl-bench entropy-map
    fill_effect     dynamic-sampling fill off vs on              ulorl-bench fill-effect
"""
