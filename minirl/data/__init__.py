"""What the controller needs about data: the `Task` and `Verifier` interfaces, the prompt
mixture and the filters. The built-in tasks and dataset files that implement `Task` are above
the core, in minirl/tasks/.

    from minirl.data import Mixture
    from minirl.tasks import get_task
    task = get_task("countdown")
    prompt = task.prompt(0, "train")          # deterministic from (task, split, index)
    scores = task.verifier.score(rollouts)    # reads rollout.text

See docs/tasks.md for what each task's demonstrations teach and what only the reward teaches.
"""

from minirl.data.filters import FillStats, PrefilterReport, dynamic_filter, fill_batch, prefilter
from minirl.data.mixture import Mixture
from minirl.data.task_api import Task, TaskRouter, Verifier

__all__ = [
    "FillStats",
    "Mixture",
    "PrefilterReport",
    "Task",
    "TaskRouter",
    "Verifier",
    "dynamic_filter",
    "fill_batch",
    "prefilter",
]
