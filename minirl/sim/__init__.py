"""A pod on a laptop: the real controller and scheduler on simulated parts and virtual time.

Nothing is trained. The engine's replicas keep their requests in the real scheduler, the
controller makes every batching, staleness and reload decision with its own code, and each
part's work takes the time a cost model says (issue #17; docs/sim.md):

    costs.py     device presets (datasheet numbers), the roofline of decode / prefill / train
    workload.py  prompts, completion lengths (log-normal, fixed, a run's own), a verifier
    parts.py     VirtualClock, SimEngine (replicas over minirl.inference.scheduler), SimTrainer, SimStore
    run.py       simulate(setup, steps): lockstep through Controller.step, async as events
    calibrate.py "this machine": per-call costs fitted to a real lockstep run, and its twin

`minirl plan` (minirl/sim/plan.py) is the command line over it.

Nothing in minirl's training path imports this package.
"""
