"""Remote verifier: service in a subprocess on 127.0.0.1 (a real VerifierPool running sandboxed
programs) and the client. Remote scores equal local scores; test data travels once, by hash; a
killed and restarted service costs retries, not rollouts; auth, malformed bodies and size limits
get the right status codes."""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time

import pytest

from minirl.types import Score
from minirl.verifiers import CodeVerifier, TestRepository, put_tests
from minirl.verifiers.code_verifier import put_checker
from scale.remote_verifier import ClientConfig, RemoteVerifier, RemoteVerifierError
from scale.verifier_service import ServiceConfig, VerifierService

TOKEN = "test-token-0123456789"
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
SUB = "a, b = map(int, input().split())\nprint(a - b)"
SLOW = "import time\ntime.sleep(1.0)\na, b = map(int, input().split())\nprint(a + b)"
FAST_RETRIES = ClientConfig(backoff_s=0.05, backoff_max_s=1.0, max_attempts=10, timeout_s=60)


@pytest.fixture
def local(tmp_path):
    """A local repository with two problems: plain tests, and tests with a nested object and a
    checker. Returns (repository, meta of problem 1, meta of problem 2)."""
    repo = TestRepository(tmp_path / "local")
    plain = put_tests(repo, [("1 2\n", "3\n"), ("5 6\n", "11\n")])
    big_input = repo.put(b"40 2\n")
    nested = repo.put({"cases": [{"input_sha256": big_input, "output": "42\n"}]})
    checker = put_checker(repo, "python", "import sys\nsys.exit(0)\n")  # accepts anything
    return repo, {"tests": plain}, {"tests": nested, "checker": checker}


def rollouts_for(make_rollout, meta1, meta2, n=8):
    texts = [ADD, SUB, "no code at all", ADD]
    return [make_rollout(texts[i % 4], meta1 if i % 2 == 0 else meta2, uid=i) for i in range(n)]


def raw(url: str, method: str, path: str, body: bytes, token: str | None = TOKEN):
    host, port = url.removeprefix("http://").split(":")
    assert host == "127.0.0.1"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Length": str(len(body))}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    status, payload = response.status, json.loads(response.read())
    conn.close()
    return status, payload


def test_remote_scores_equal_local_and_test_data_travels_once(
    tmp_path, start_service, make_rollout, local
):
    repo, meta1, meta2 = local
    service = start_service(tmp_path / "remote", TOKEN)
    client = RemoteVerifier(service.url, TOKEN, repository=repo, config=FAST_RETRIES)
    assert client.health()["status"] == "ok"
    rollouts = rollouts_for(make_rollout, meta1, meta2)
    expected = CodeVerifier(repo).score(rollouts)
    assert [s.reward for s in expected] == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]

    assert client.score(rollouts) == expected
    assert client.stats["uploads"] == 4  # plain tests, nested tests, their input, the checker
    first = client.stats["bytes_sent"]
    assert client.score(rollouts) == expected  # known now: nothing is uploaded again
    assert client.stats["uploads"] == 4 and client.stats["retries"] == 0
    assert client.stats["bytes_sent"] - first < first


def test_bytes_by_reference_vs_by_value(tmp_path, make_rollout):
    """RLAX §6.1: links instead of test data. 4 problems with ~65 KB of tests each, 8 samples
    per problem, requests of 8 rollouts, two epochs. By reference the tests travel once; by value
    every request carries the tests its rollouts need. (The verifier is a stub: only bytes are
    measured here; the subprocess tests above and below run real programs.)"""
    repo = TestRepository(tmp_path / "local")
    metas = []
    for p in range(4):
        cases = [(f"{i} {p}\n" + "x" * 2000 + "\n", f"{i + p}\n") for i in range(32)]
        metas.append({"tests": put_tests(repo, cases)})
    rollouts = [make_rollout(ADD, metas[i % 4], uid=i) for i in range(32)]
    test_bytes = sum(len(repo.get(m["tests"])) for m in metas)
    sent = {}
    with VerifierService(_Echo(), TestRepository(tmp_path / "remote"), TOKEN) as service:
        for by_value in (False, True):
            config = ClientConfig(by_value=by_value, max_items=8)
            client = RemoteVerifier(service.url, TOKEN, repository=repo, config=config)
            epochs = []
            for _ in range(2):
                before = client.stats["bytes_sent"]
                assert client.score(rollouts) == [Score(float(len(ADD)), "echo")] * 32
                epochs.append(client.stats["bytes_sent"] - before)
            sent[by_value] = epochs
            if not by_value:
                assert client.stats["upload_bytes"] == test_bytes  # each file exactly once
    (ref1, ref2), (val1, val2) = sent[False], sent[True]
    print(
        f"\n32 rollouts/epoch, 4 problems, {test_bytes / 1e3:.0f} KB of tests: by reference "
        f"{ref1 / 1e3:.1f} KB (epoch 1, with the one-time upload), {ref2 / 1e3:.1f} KB (epoch 2); "
        f"by value {val2 / 1e3:.1f} KB per epoch: {val2 / ref2:.0f}x more"
    )
    assert val1 == val2 and ref2 < ref1
    assert val2 > 20 * ref2  # each request of 8 carries 4 test files by value


@pytest.mark.slow  # ~10 s: a service killed and restarted mid-run
def test_killed_and_restarted_service_costs_retries_not_rollouts(
    tmp_path, start_service, make_rollout, local
):
    repo, meta1, meta2 = local
    service = start_service(tmp_path / "remote1", TOKEN)
    rollouts = rollouts_for(make_rollout, meta1, meta2)
    rollouts[2].text = SLOW  # the second request (items 2, 3) takes > 1 s: killed in flight
    expected = CodeVerifier(repo).score(rollouts)
    config = ClientConfig(backoff_s=0.1, backoff_max_s=2.0, max_attempts=12, max_items=2)
    client = RemoteVerifier(service.url, TOKEN, repository=repo, config=config)
    result: list = []
    worker = threading.Thread(target=lambda: result.extend(client.score(rollouts)))
    worker.start()
    deadline = time.monotonic() + 60
    while raw(service.url, "GET", "/health", b"")[1]["batches"] < 1:  # first request done
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    time.sleep(0.3)  # the slow second request is being scored now
    service.kill()
    time.sleep(0.5)
    start_service(tmp_path / "remote2", TOKEN, port=service.port)  # same port, EMPTY repository
    worker.join(120)
    assert not worker.is_alive()
    assert result == expected  # every rollout scored, none lost or zeroed
    assert client.stats["retries"] >= 1
    assert client.stats["uploads"] > 4  # the new service needed the test data again
    assert client.stats["unscored"] == 0


def test_unreachable_service_zeroes_rollouts_after_the_retry_budget(make_rollout, local):
    repo, meta1, _ = local
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ClientConfig(backoff_s=0.01, backoff_max_s=0.02, max_attempts=3, timeout_s=2)
    client = RemoteVerifier(f"http://127.0.0.1:{port}", TOKEN, repository=repo, config=config)
    scores = client.score([make_rollout(ADD, meta1, uid=i) for i in range(3)])
    assert len(scores) == 3 and all(s.reward == 0.0 for s in scores)
    assert all(s.reason.startswith("remote verifier: unavailable after 3 attempts") for s in scores)
    assert client.stats["retries"] == 2 and client.stats["unscored"] == 3


def test_wrong_token_is_401_and_malformed_bodies_are_400(
    tmp_path, start_service, make_rollout, local
):
    service = start_service(tmp_path / "remote", TOKEN)
    body = json.dumps({"items": [{"task": "code", "text": ADD, "meta": {}}]}).encode()
    assert raw(service.url, "POST", "/score", body, token="wrong-token-xyz")[0] == 401
    assert raw(service.url, "POST", "/score", body, token=None)[0] == 401
    assert raw(service.url, "PUT", "/objects/" + "0" * 64, b"x", token="nope-nope")[0] == 401
    status, reply = raw(service.url, "POST", "/score", b"{not json")
    assert status == 400 and "malformed" in reply["error"]
    for bad in (
        {"items": 5},
        {"items": [{"text": 3}]},
        [1, 2],
        {"items": [], "objects": {"ab": {}}},
    ):
        assert raw(service.url, "POST", "/score", json.dumps(bad).encode())[0] == 400, bad
    status, _ = raw(service.url, "PUT", "/objects/" + "0" * 64, b"bytes that hash elsewhere")
    assert status == 400
    assert raw(service.url, "POST", "/score", body)[0] == 200  # the right token works
    client = RemoteVerifier(service.url, "wrong-token-xyz", repository=local[0])
    with pytest.raises(RemoteVerifierError, match="401"):
        client.score([make_rollout(ADD, local[1])])


# ---- protocol details, against an in-process service (fast; still real HTTP on 127.0.0.1)


class _Echo:
    """A trivial verifier: reward = len(text)."""

    def score(self, rollouts):
        return [Score(float(len(r.text)), "echo") for r in rollouts]


def test_oversized_requests_get_413_and_the_client_splits_them(tmp_path, make_rollout):
    repo = TestRepository(tmp_path / "remote")
    with VerifierService(_Echo(), repo, TOKEN, ServiceConfig(max_body_bytes=2000)) as service:
        assert raw(service.url, "POST", "/score", b"x" * 5000)[0] == 413
        client = RemoteVerifier(service.url, TOKEN, config=FAST_RETRIES)
        rollouts = [make_rollout("y" * 300, {}, uid=i) for i in range(12)]  # ~4 KB in one request
        rollouts.append(make_rollout("z" * 5000, {}, uid=99))  # too big even alone
        scores = client.score(rollouts)
    assert [s.reward for s in scores[:12]] == [300.0] * 12
    assert scores[12].reward == 0.0 and "HTTP 413" in scores[12].reason


@pytest.mark.parametrize("drip", ["headers", "body"])
def test_a_client_that_drips_its_request_is_cut_off_after_read_timeout(tmp_path, drip):
    """read_timeout_s bounds reading the whole request: a byte every 0.2 s had kept a request
    (and its thread) open as long as the client liked, the socket's timeout being per read."""
    head = f"POST /score HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 99\r\n\r\n"
    config = ServiceConfig(read_timeout_s=1.0)
    with VerifierService(_Echo(), TestRepository(tmp_path / "r"), TOKEN, config) as service:
        host, port = service.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            if drip == "body":
                conn.sendall(head.encode())
            start = time.monotonic()
            for byte in head.encode() if drip == "headers" else b" " * 99:
                assert time.monotonic() - start < 8, "still reading after 8 s"
                if _closed(conn):
                    break
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        assert 0.9 < time.monotonic() - start < 3


def _closed(conn: socket.socket) -> bool:
    if not select.select([conn], [], [], 0)[0]:
        return False  # open, nothing to read
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True  # reset


def test_data_the_client_cannot_provide_zeroes_only_its_rollouts(tmp_path, make_rollout, local):
    repo, meta1, _ = local
    unknown = {"tests": "f" * 64}
    with VerifierService(_Echo(), TestRepository(tmp_path / "remote"), TOKEN) as service:
        client = RemoteVerifier(service.url, TOKEN, repository=repo, config=FAST_RETRIES)
        scores = client.score([make_rollout("abc", meta1), make_rollout("abcd", unknown)])
        status, reply = raw(
            service.url,
            "POST",
            "/score",
            json.dumps({"items": [{"task": "t", "text": "", "meta": unknown}]}).encode(),
        )
    assert scores[0] == Score(3.0, "echo")
    assert scores[1].reward == 0.0 and "not in the local repository" in scores[1].reason
    assert status == 404 and reply["missing"] == ["f" * 64]


def test_meta_that_is_not_json_is_a_zero_not_a_crash(tmp_path, make_rollout):
    with VerifierService(_Echo(), TestRepository(tmp_path / "r"), TOKEN) as service:
        client = RemoteVerifier(service.url, TOKEN)
        scores = client.score([make_rollout("ab", {"x": object()}), make_rollout("abc", {})])
    assert scores[0].reward == 0.0 and "JSON" in scores[0].reason
    assert scores[1] == Score(3.0, "echo")


@pytest.mark.parametrize("kwargs", [{"port": -1}, {"max_items": 0}, {"read_timeout_s": 0}])
def test_service_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        ServiceConfig(**kwargs)


def test_client_refuses_non_http_urls():
    with pytest.raises(ValueError, match="http://host:port"):
        RemoteVerifier("ftp://127.0.0.1:1", TOKEN)


def test_the_service_runs_your_reward_function_and_rows_that_carry_their_tests(
    tmp_path, make_rollout
):
    """Issue #34: `--verifier my_reward.py:score` and code rows with their own tests work behind
    the service as in-process: build_verifier (what `python -m scale.launch verifier
    --verifier ...` runs) loads the function by path in the pool's worker."""
    from scale.verifier_service import build_verifier

    reward = tmp_path / "my_reward.py"
    reward.write_text(
        "def score(completion, row):\n    return float(row['answer'] in completion)\n"
    )
    repo = TestRepository(tmp_path / "remote")
    rows = [make_rollout("it is 7", {"fields": {"answer": "7"}}, uid=0)]
    rows.append(make_rollout("it is 8", {"fields": {"answer": "7"}}, uid=1))
    pool = build_verifier(f"{reward}:score", repo, workers=1, item_timeout_s=20)
    with pool, VerifierService(pool, repo, TOKEN) as service:
        assert RemoteVerifier(service.url, TOKEN).score(rows) == [Score(1.0, ""), Score(0.0, "")]
    code = build_verifier("code", repo, workers=1, item_timeout_s=20)
    inline = {"cases": [{"input": "1 2\n", "output": "3\n"}]}
    with code, VerifierService(code, repo, TOKEN) as service:
        scores = RemoteVerifier(service.url, TOKEN).score(
            [make_rollout(SUB, inline)] + [make_rollout(ADD, inline)]
        )
    assert [s.reward for s in scores] == [0.0, 1.0]


@pytest.mark.parametrize(
    "name, says",
    [
        ("nope", "unknown verifier 'nope'"),
        ("rm:/some/reward-model", "a reward model runs in one process"),
        ("missing.py:score", "missing.py"),
    ],
)
def test_a_verifier_the_service_cannot_build_is_one_line(tmp_path, capsys, name, says):
    """Before any port is bound: exit 2 and one line naming --verifier (a KeyError or
    ValueError traceback before)."""
    from scale.verifier_service import main

    with pytest.raises(SystemExit) as stop:
        main(["--repository", str(tmp_path / "tests"), "--verifier", name, "--port", "0"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"--verifier {name}: " in err and says in err
