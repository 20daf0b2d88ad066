"""Trainer-side sharded checkpoints with Orbax: each process of a trainer job writes and reads
only the shards of params and optimizer state its own devices hold.

    ckpts = TrainerCheckpoints("gs://bucket/run/trainer")   # or a local directory
    ckpts.save(step, trainer)       # on every process of the trainer job (a collective)
    ckpts.restore(step, trainer)    # into the trainer's own layout, shard by shard
    ckpts.keep_only(steps)          # drop every step not in `steps` (the controller's choice)

Orbax (on TensorStore) writes each array as a zarr array, every process its own chunks, and
commits a step by renaming its directory once every process has finished, so a step directory
either holds a whole checkpoint or does not exist. Nothing passes through the controller: it
keeps its own snapshot (counters, buffer, prompt stream) in its run directory with a reference
to the trainer's step, written after the trainer's save returned (scale/launch.py). A crash
between the two leaves a trainer step the controller never referenced; the resume goes back to
the controller's last checkpoint, restores that step here, and `discard_after` drops the newer
one before the steps after it are redone.

A restore reads into the arrays the trainer already holds (their shapes, dtypes and shardings
are the target), so a checkpoint written by one mesh is read by the same mesh layout; the values
are bit for bit those saved (tests/scale/test_mesh.py, 1 process x 4 devices and 2 processes x
2 devices).
"""

from __future__ import annotations

from typing import Any

from minirl.configlib import optional_import

__all__ = ["TrainerCheckpoints"]


def _abstract(tree: Any) -> Any:
    """The restore target: shape, dtype and sharding of each array the trainer holds now."""
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class TrainerCheckpoints:
    """Orbax checkpoints of a minirl Trainer's state, one directory per step under `directory`
    (a local path or a gs:// / s3:// URL that TensorStore reaches)."""

    def __init__(self, directory: str):
        ocp = optional_import("orbax.checkpoint", "scale", "Orbax trainer checkpoints")

        self.directory = directory
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True)
        self._manager = ocp.CheckpointManager(
            directory, options=options, item_names=("state", "meta")
        )

    def steps(self) -> list[int]:
        self._manager.reload()  # another process may have written or deleted steps
        return sorted(self._manager.all_steps())

    def _agreed_steps(self, why: str) -> list[int]:
        """The steps on disk as every process of the job sees them, before any of them deletes
        one. Deleting is a collective: a process that listed after another had already removed a
        step's directory would skip that delete and the job's next collective would mismatch.
        So every process lists, then all wait for each other, then they act on the same list."""
        import jax
        from jax.experimental import multihost_utils

        steps = self.steps()
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"minirl TrainerCheckpoints {why}")
        return steps

    def save(self, step: int, trainer) -> int:
        """Write the trainer's params, optimizer state and counters as `step` (every process of
        the job calls this; it returns once the step is committed). A step already there (left
        by an attempt the controller never checkpointed) is replaced."""
        import orbax.checkpoint as ocp

        state = trainer.state_dict(host=False)
        if step in self._agreed_steps("save"):
            self._manager.delete(step)
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(
                    {"params": state["params"], "opt_state": state["opt_state"]}
                ),
                meta=ocp.args.JsonSave(
                    {"step": state["step"], "skipped_nonfinite": state["skipped_nonfinite"]}
                ),
            ),
        )
        self._manager.wait_until_finished()
        return step

    def restore(self, step: int, trainer) -> None:
        """Put the trainer back to `step`: every process reads the shards its devices hold."""
        import orbax.checkpoint as ocp

        if step not in self.steps():
            raise LookupError(
                f"{self.directory} has no trainer checkpoint for step {step} "
                f"(it has {self.steps()})"
            )
        now = trainer.state_dict(host=False)
        target = _abstract({"params": now["params"], "opt_state": now["opt_state"]})
        got = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        trainer.load_state_dict({**got["state"], **got["meta"]})

    def discard_after(self, step: int) -> list[int]:
        """Delete the steps after `step` (a resumed run redoes them); returns them."""
        later = [s for s in self._agreed_steps("discard_after") if s > step]
        for s in later:
            self._manager.delete(s)
        return later

    def keep_only(self, steps) -> list[int]:
        """Delete every step not in `steps` (the controller's checkpoints decide); returns them."""
        keep = set(steps)
        gone = [s for s in self._agreed_steps("keep_only") if s not in keep]
        for s in gone:
            self._manager.delete(s)
        return gone

    def close(self) -> None:
        self._manager.close()
