"""Code verifier: verdicts for correct / wrong / slow / crashing programs, output comparison,
checker programs, C and C++, test data by reference, and the JSON request/response."""

import json

import pytest

from minirl.verifiers import (
    CodeVerifier,
    CodeVerifierConfig,
    Limits,
    Program,
    TestCase,
    Verdict,
    available_languages,
    extract_code,
    make_request,
    outputs_match,
    put_checker,
    put_tests,
    run_tests,
    verify_request,
)

# Room for interpreter start-up on a loaded 2-core machine: a correct `a + b` program normally
# takes 0.015 CPU-s here, but one CI run (2026-11-26) measured 1.01 CPU-s for it against a 1 s
# limit, and a 2 s wall limit once timed out a correct program.
FAST = Limits(cpu_s=2.0, wall_s=4.0)
ADD_TESTS = [TestCase("1 2\n", "3\n"), TestCase("5 7\n", "12\n"), TestCase("-4 4\n", "0\n")]
ADD_PY = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.mark.parametrize(
    "code,verdict,passed",
    [
        (ADD_PY, Verdict.ACCEPTED, 3),
        (
            "a, b = map(int, input().split())\nprint(a * b if a == 1 else a + b)\n",
            Verdict.WRONG_ANSWER,
            0,
        ),
        ("a, b = map(int, input().split())\nprint(abs(a) + b)\n", Verdict.WRONG_ANSWER, 2),
        ("while True:\n    pass\n", Verdict.TIME_LIMIT, 0),
        ("import time\ntime.sleep(30)\n", Verdict.TIME_LIMIT, 0),
        ("raise SystemExit(3)\n", Verdict.RUNTIME_ERROR, 0),
        ("print(1/0)\n", Verdict.RUNTIME_ERROR, 0),
        ("def f(:\n", Verdict.RUNTIME_ERROR, 0),  # Python syntax errors are runtime errors
        ("x = bytearray(10**10)\n", Verdict.MEMORY_LIMIT, 0),
        ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", Verdict.OUTPUT_LIMIT, 0),
    ],
)
def test_python_verdicts(code, verdict, passed):
    result = run_tests(code, ADD_TESTS, FAST)
    assert result.passed == passed
    assert result.cases[-1].verdict is verdict
    assert result.reward("all") == (1.0 if verdict is Verdict.ACCEPTED else 0.0)
    if verdict is Verdict.TIME_LIMIT:
        assert "limit 2.0s" in result.cases[-1].detail


def test_stop_on_failure_and_fraction_reward():
    code = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)\n"
    stopped = run_tests(code, ADD_TESTS, FAST)
    assert [c.verdict for c in stopped.cases] == [
        Verdict.ACCEPTED,
        Verdict.ACCEPTED,
        Verdict.WRONG_ANSWER,
    ]
    first_wrong = run_tests(code, ADD_TESTS[::-1], FAST)
    assert len(first_wrong.cases) == 1 and first_wrong.reward("fraction") == 0.0
    full = run_tests(code, ADD_TESTS[::-1], FAST, stop_on_failure=False)
    assert len(full.cases) == 3
    assert full.reward("fraction") == pytest.approx(2 / 3)
    assert full.reward("all") == 0.0
    assert full.reason() == "wrong answer on test 1 (2/3 passed)"


@pytest.mark.parametrize(
    "got,expected,mode,same",
    [
        ("3\n", "3", "exact", False),
        ("3\n", "3\n", "exact", True),
        ("1 2  \n3\n\n", "1 2\n3", "lines", True),
        ("1 2\n3", "1\n2 3", "lines", False),
        ("1 2\n3", "1\n2 3", "tokens", True),
        ("1 2 3", "1 2", "tokens", False),
        ("0.3333333", "0.333333", "floats", True),
        ("0.33", "0.333333", "floats", False),
        ("1000000.1", "1000000.0", "floats", True),  # relative 1e-7
        ("yes 1.0", "yes 1", "floats", True),
        ("no 1.0", "yes 1", "floats", False),
        ("nan", "nan", "floats", True),
        ("nan", "0", "floats", False),
    ],
)
def test_outputs_match(got, expected, mode, same):
    assert outputs_match(got, expected, mode) is same


DIVISOR_CHECKER = """import sys
inp, out, ans = (open(p).read().split() for p in sys.argv[1:4])
n = int(inp[0])
try:
    d = int(out[0])
except (IndexError, ValueError):
    print("not a number"); sys.exit(2)
ok = len(out) == 1 and 1 < d < n and n % d == 0
print("ok" if ok else f"{d} is not a proper divisor of {n}")
sys.exit(0 if ok else 1)
"""
DIVISOR_TESTS = [TestCase("12\n", "2\n"), TestCase("35\n", "5\n")]
MIN_DIVISOR = "n = int(input())\nprint(min(d for d in range(2, n) if n % d == 0))\n"


@pytest.mark.parametrize(
    "code,verdict",
    [
        ("n = int(input())\nprint(max(d for d in range(2, n) if n % d == 0))\n", Verdict.ACCEPTED),
        (MIN_DIVISOR, Verdict.ACCEPTED),
        ("print(4)\n", Verdict.WRONG_ANSWER),  # right for 12, wrong for 35
        ("print('x')\n", Verdict.WRONG_ANSWER),  # presentation error counts as wrong
    ],
)
def test_python_checker_accepts_any_valid_answer(code, verdict):
    result = run_tests(code, DIVISOR_TESTS, FAST, checker=Program("python", DIVISOR_CHECKER))
    assert result.cases[-1].verdict is verdict
    if verdict is Verdict.WRONG_ANSWER and code == "print(4)\n":
        assert result.passed == 1
        assert result.cases[-1].detail == "4 is not a proper divisor of 35"


def test_broken_checker_is_a_checker_error_not_a_pass():
    crash = run_tests("print(2)", DIVISOR_TESTS[:1], FAST, checker=Program("python", "1/0"))
    assert crash.cases[0].verdict is Verdict.CHECKER_ERROR
    bad_exit = run_tests(
        "print(2)", DIVISOR_TESTS[:1], FAST, checker=Program("python", "raise SystemExit(7)")
    )
    assert bad_exit.cases[0].verdict is Verdict.CHECKER_ERROR
    no_compile = run_tests("print(2)", DIVISOR_TESTS[:1], FAST, checker=Program("c", "int main( {"))
    assert no_compile.error is Verdict.CHECKER_ERROR and no_compile.reward() == 0.0


def test_compiled_languages_available_here():
    assert available_languages() == ["python", "c", "cpp"]  # gcc and g++ are on this machine


def test_c_and_cpp_programs():
    c_add = '#include <stdio.h>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);}'
    assert run_tests(c_add, ADD_TESTS, FAST, language="c").all_passed
    cpp_add = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"
    assert run_tests(cpp_add, ADD_TESTS, FAST, language="cpp").all_passed
    broken = run_tests("int main() { return x; }", ADD_TESTS, FAST, language="c")
    assert broken.error is Verdict.COMPILE_ERROR and "undeclared" in broken.reason()
    segfault = run_tests("int main(){ int *p = 0; return *p; }", ADD_TESTS, FAST, language="c")
    assert segfault.cases[0].verdict is Verdict.RUNTIME_ERROR
    assert "exit -11" in segfault.cases[0].detail  # SIGSEGV


def test_c_checker_program():
    checker = """#include <stdio.h>
int main(int argc, char **argv) {
  long n, d; FILE *in = fopen(argv[1], "r"), *out = fopen(argv[2], "r");
  fscanf(in, "%ld", &n);
  if (fscanf(out, "%ld", &d) != 1) return 2;
  return (d > 1 && d < n && n % d == 0) ? 0 : 1;
}"""
    good = run_tests("print(7)", [TestCase("35\n", "5\n")], FAST, checker=Program("c", checker))
    bad = run_tests("print(6)", [TestCase("35\n", "5\n")], FAST, checker=Program("c", checker))
    assert good.all_passed and bad.cases[0].verdict is Verdict.WRONG_ANSWER


@pytest.mark.parametrize(
    "text,language,code",
    [
        ("```python\nprint(1)\n```", "python", "print(1)"),
        ("first\n```py\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```", "python", "print(2)"),
        ("```cpp\nint main(){}\n```\n```python\nprint(3)\n```", "cpp", "int main(){}"),
        ("```\nprint(4)\n```", "python", "print(4)"),
        ("print(5)", "python", "print(5)"),
        ("```python\nprint(6)", "python", "print(6)"),  # unclosed: the model hit its limit
        ("```rust\nfn main(){}\n```", "python", None),
        ("", "python", None),
    ],
)
def test_extract_code(text, language, code):
    assert extract_code(text, language) == code


def test_code_verifier_with_data_by_reference(repo, make_rollout):
    tests = put_tests(repo, ADD_TESTS)
    checker = put_checker(repo, "python", DIVISOR_CHECKER)
    divisor_tests = put_tests(repo, DIVISOR_TESTS)
    verifier = CodeVerifier(repo, CodeVerifierConfig(limits=FAST))
    rollouts = [
        make_rollout(f"Here:\n```python\n{ADD_PY}```", {"tests": tests}),
        make_rollout("```python\nprint(3)\n```", {"tests": tests}),
        make_rollout("```python\nprint(3)\n```", {"tests": tests, "reward_mode": "fraction"}),
        make_rollout(f"```python\n{MIN_DIVISOR}```", {"tests": divisor_tests, "checker": checker}),
        make_rollout(
            '```c\n#include <stdio.h>\nint main(){puts("3");}\n```',
            {"tests": tests, "language": "c"},
        ),
        make_rollout("```python\nprint(3)\n```", {}),
        make_rollout("```python\nprint(3)\n```", {"tests": "../../etc/passwd"}),
        make_rollout("```python\nprint(3)\n```", {"tests": "ab" * 32}),
        make_rollout("```python\nprint(3)\n```", {"tests": tests, "language": "cpp"}),
        make_rollout("```python\nwhile 1: pass\n```", {"tests": tests, "time_limit_s": 0.5}),
        make_rollout("```python\nprint(3)\n```", {"tests": tests, "time_limit_s": "fast"}),
    ]
    scores = verifier.score(rollouts)
    rewards = [s.reward for s in scores]
    assert rewards == [1.0, 0.0, pytest.approx(1 / 3), 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[0].reason == "accepted (3/3 tests)"
    assert scores[1].reason == "wrong answer on test 2 (1/3 passed)"
    assert scores[4].reason == "wrong answer on test 2 (1/3 passed)"
    assert scores[5].reason.startswith("bad task meta")
    assert scores[6].reason.startswith("test data: not a sha256 reference")
    assert scores[7].reason.startswith("test data: no object")
    assert scores[8].reason == "no cpp code found"
    assert "time limit on test 1" in scores[9].reason and "limit 0.5s" in scores[9].reason
    assert scores[10].reason.startswith("bad request")


def test_corrupt_test_data_is_zero_reward_with_reason(repo, make_rollout):
    sha = put_tests(repo, ADD_TESTS)
    path = repo.root + f"/{sha[:2]}/{sha}"
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"#")
    score = CodeVerifier(repo).score([make_rollout(f"```python\n{ADD_PY}```", {"tests": sha})])[0]
    assert score.reward == 0.0 and "corrupt" in score.reason


def test_code_too_long_is_rejected_before_running(repo, make_rollout):
    sha = put_tests(repo, ADD_TESTS)
    verifier = CodeVerifier(repo, CodeVerifierConfig(max_code_bytes=100))
    score = verifier.score([make_rollout("print(1)  # " + "x" * 200, {"tests": sha})])[0]
    assert score.reason == "code longer than 100 bytes"


def test_request_and_response_are_plain_json(repo):
    sha = put_tests(repo, ADD_TESTS)
    config = CodeVerifierConfig(limits=FAST)
    request = make_request(ADD_PY, {"tests": sha, "compare": "lines"}, config)
    wire = json.loads(json.dumps(request))  # what a remote service would receive
    assert wire["tests"] == sha and "cases" not in json.dumps(wire)  # the data is not sent
    assert wire["compare"] == "lines" and wire["limits"]["cpu_s"] == FAST.cpu_s
    response = json.loads(json.dumps(verify_request(wire, repo)))
    assert response["reward"] == 1.0
    assert [c["verdict"] for c in response["verdicts"]["cases"]] == ["accepted"] * 3
    assert response["verdicts"]["passed"] == 3
    broken = verify_request({**wire, "language": "cobol"}, repo)
    assert broken["reward"] == 0.0 and broken["reason"].startswith("bad request")


def test_config_validation():
    with pytest.raises(ValueError, match="language"):
        CodeVerifierConfig(language="cobol")
    with pytest.raises(ValueError, match="compare"):
        CodeVerifierConfig(compare="fuzzy")
    with pytest.raises(ValueError, match="reward_mode"):
        CodeVerifierConfig(reward_mode="some")
    with pytest.raises(ValueError, match="cpu_s"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match="compare mode"):
        run_tests("print(1)", ADD_TESTS, compare="fuzzy")
