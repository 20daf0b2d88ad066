"""minirl: a compact, readable reference implementation of distributed RL for LLM post-training.

See README.md for the map of the package. The public API is listed in `__all__`; importing
`minirl` stays cheap (no JAX work at import time).
"""

__version__ = "0.1.0"

from minirl.types import Batch, Prompt, Rollout, Score  # noqa: E402

__all__ = ["Batch", "Prompt", "Rollout", "Score", "__version__"]
