"""minirl's data layer: built-in tasks, JSONL datasets, the prompt mixture and filters.

    from minirl.data import get_task, list_tasks, Mixture, FileTask
    task = get_task("countdown")
    prompt = task.prompt(0, "train")          # deterministic from (task, split, index)
    scores = task.verifier.score(rollouts)    # reads rollout.text

See docs/tasks.md for what each task's demonstrations teach and what only the reward teaches.
"""

from minirl.data.files import FileReport, FileTask, PromptFile
from minirl.data.filters import FillStats, PrefilterReport, dynamic_filter, fill_batch, prefilter
from minirl.data.mixture import Mixture
from minirl.data.tasks import Task, TaskRouter, Verifier, get_task, list_tasks

__all__ = [
    "FillStats",
    "FileReport",
    "FileTask",
    "Mixture",
    "PrefilterReport",
    "Task",
    "TaskRouter",
    "Verifier",
    "dynamic_filter",
    "fill_batch",
    "get_task",
    "list_tasks",
    "PromptFile",
    "prefilter",
]
