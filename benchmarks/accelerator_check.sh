#!/usr/bin/env bash
# One accelerator check (issues #36, #37): decode and prefill against their roofline, the train
# step, `minirl train` for 30 steps and the GPU lane of the tests, in one JSON naming the card.
# benchmarks/accelerator_check.py says what each row measures; docs/engine.md "On a GPU" how to
# read it.
#
#   bash benchmarks/accelerator_check.sh wheels      # on a machine with PyPI: the wheels a GPU
#                                                    # image may lack, into .whl/ (git-ignored)
#   bash benchmarks/accelerator_check.sh [OPTIONS]   # on the GPU machine; OPTIONS go to the
#                                                    # driver (--small, --budget S, --skip KINDS)
#
# The GPU machine needs no network: a .whl/ folder beside this repository's root, if present,
# is installed into a private directory first. The JSON and the log (accelerator_check.json,
# accelerator_check.log) go to $OUT when OUT is set, else to benchmarks/results/. Set
# MINIRL_COMMIT to the commit checked (the copy on the GPU machine may have no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS="multiprocess==0.70.19 dill==0.4.1"  # minirl train's worker pool; absent on some GPU images

if [ "${1:-}" = wheels ]; then
    mkdir -p .whl
    exclude=$(git rev-parse --git-path info/exclude 2>/dev/null) &&
        { grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"; }
    # shellcheck disable=SC2086
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $WHEELS
fi

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/minirl-site .whl/*.whl || echo "[check] could not install .whl/*.whl"
    export PYTHONPATH=/tmp/minirl-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# The child processes (minirl train, the test lane) need GPU memory while the driver holds its
# own: allocate on demand instead of taking 75% of the card up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/minirl-jax-cache}
DIR=${OUT:-benchmarks/results}
mkdir -p "$DIR"

{
    echo "[check] $("$PY" --version 2>&1); nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
    "$PY" benchmarks/accelerator_check.py --out "$DIR/accelerator_check.json" "$@"
    status=$?
    echo "[check] exit $status"
    exit $status
} 2>&1 | tee "$DIR/accelerator_check.log"
