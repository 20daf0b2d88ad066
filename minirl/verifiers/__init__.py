"""Verifiers: turn rollouts into rewards (math answers, sandboxed code with tests/checkers).

Map of this package (each file says more in its docstring):
  (the Verifier protocol and CallableVerifier are the core's: minirl/data/verifier_api.py)
  registry.py       verifiers by name (get_verifier, register_verifier); a dataset's
                    (dataset_verifier, row_targets)
  math_extract.py   extract_answer(text, mode), normalize_answer(s)
  math_parse.py     LaTeX -> whitelisted AST -> exact/float value (never eval)
  math_equal.py     math_equal(candidate, reference): exact/rational/tolerant/symbolic
  math_verifier.py  MathVerifier (meta["answer"])
  repository.py     TestRepository: content-addressed test data, verified on read
  sandbox.py        run_sandboxed(...): limits + isolation for one untrusted program (threat model)
  isolation.py      the child side: namespaces, mounts, rlimits, per-run uids, cleanup
  code_runner.py    run_tests(code, tests, limits) -> Verdicts; checkers; output comparison
  code_verifier.py  CodeVerifier (meta["tests"] by sha, or a dataset row's own tests), JSON
                    request/response
  launcher.py       the process that forks sandboxed programs for a multi-threaded caller
  reward_function.py  RewardFunction("file.py:function"): your own reward function, by path
  pool.py           VerifierPool: parallel scoring, per-item timeout, crashed workers replaced
"""

from minirl.data.verifier_api import CallableVerifier, Verifier, as_score
from minirl.verifiers.code_runner import (
    CaseVerdict,
    Program,
    TestCase,
    Verdict,
    Verdicts,
    available_languages,
    outputs_match,
    run_tests,
)
from minirl.verifiers.code_verifier import (
    CodeVerifier,
    CodeVerifierConfig,
    extract_code,
    make_request,
    put_checker,
    put_tests,
    verify_request,
)
from minirl.verifiers.math_equal import math_equal
from minirl.verifiers.math_extract import extract_answer, normalize_answer
from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig, score_math
from minirl.verifiers.pool import PoolConfig, VerifierPool
from minirl.verifiers.registry import (
    dataset_verifier,
    get_verifier,
    register_verifier,
    row_targets,
    verifier_names,
)
from minirl.verifiers.repository import (
    CorruptObjectError,
    ObjectNotFoundError,
    RepositoryError,
    TestRepository,
)
from minirl.verifiers.reward_function import RewardFunction
from minirl.verifiers.sandbox import Limits, RunResult, SandboxConfig, isolation_mode, run_sandboxed

__all__ = [
    "CallableVerifier",
    "CaseVerdict",
    "CodeVerifier",
    "CodeVerifierConfig",
    "CorruptObjectError",
    "Limits",
    "MathVerifier",
    "MathVerifierConfig",
    "ObjectNotFoundError",
    "PoolConfig",
    "Program",
    "RepositoryError",
    "RewardFunction",
    "RunResult",
    "SandboxConfig",
    "TestCase",
    "TestRepository",
    "Verdict",
    "Verdicts",
    "Verifier",
    "VerifierPool",
    "as_score",
    "available_languages",
    "dataset_verifier",
    "extract_answer",
    "extract_code",
    "get_verifier",
    "isolation_mode",
    "make_request",
    "math_equal",
    "normalize_answer",
    "outputs_match",
    "put_checker",
    "put_tests",
    "register_verifier",
    "row_targets",
    "run_sandboxed",
    "run_tests",
    "score_math",
    "verifier_names",
    "verify_request",
]
