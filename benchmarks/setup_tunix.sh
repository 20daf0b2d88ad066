#!/usr/bin/env bash
# The Tunix environment for benchmarks/trl_side_by_side.py (the tunix variants): a virtual
# environment of its own, so Tunix's dependencies can never move minirl's pins.
#
#   bash benchmarks/setup_tunix.sh [VENV]        # default VENV: .venv-tunix beside the repository
#   python benchmarks/trl_side_by_side.py --variants minirl,tunix --tunix-python VENV/bin/python
#
# google-tunix 0.1.7 from PyPI (Python >= 3.11) with the JAX, Flax and transformers pip resolves
# for it; the versions are printed at the end (measured 2026-11-28: jax 0.10.2, flax 0.12.8,
# transformers 5.12.1, the same JAX as minirl's). No torch: Tunix loads the safetensors itself.
set -euo pipefail
VENV="${1:-$(cd "$(dirname "$0")/.." && pwd)/.venv-tunix}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Tunix needs Python >= 3.11"'
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "google-tunix==0.1.7"
"$VENV/bin/python" -c 'import tunix.rl.grpo.drgrpo_learner'  # it imports
"$VENV/bin/pip" list 2>/dev/null | grep -E -i '^(google-tunix|jax|jaxlib|flax|optax|transformers) '
echo "TUNIX_PYTHON=$VENV/bin/python"
