"""Fixtures for scale/ tests: verifier services in subprocesses on 127.0.0.1, and rollouts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minirl.types import Prompt, Rollout
from minirl.verifiers.pool import remove_stale_scratch
from scale.launch import wait_for_output

ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """`python -m scale.verifier_service` in its own process group (so killing it also kills its
    pool workers). Only ever binds 127.0.0.1."""

    def __init__(self, repository: Path, token: str, port: int = 0, workers: int = 2):
        self.repository, self.token, self.port, self.workers = repository, token, port, workers
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> str:
        cmd = [
            sys.executable,
            "-m",
            "scale.verifier_service",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--repository",
            str(self.repository),
            "--verifier",
            "code",
            "--workers",
            str(self.workers),
            "--item-timeout",
            "20",
        ]
        env = {**os.environ, "MINIRL_VERIFIER_TOKEN": self.token, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            self.url, _ = wait_for_output(self.proc, r" on (http://\S+)\n", timeout)
        except RuntimeError as e:
            self.kill()  # its pool workers too (wait_for_output kills only the service itself)
            raise RuntimeError(
                f"service did not start: {e} {self.proc.stderr.read()[-2000:]!r}"
            ) from None
        self.port = int(self.url.rsplit(":", 1)[-1])
        assert self.url.startswith("http://127.0.0.1:")
        return self.url

    def stop(self) -> None:
        """SIGTERM: the service closes its pool and removes its temp files; then kill()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the service and everything it started (its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
            for stream in (self.proc.stdout, self.proc.stderr):
                stream.close()
        if self.proc is not None:
            try:  # pool workers left in the group (they exit on EOF; make sure)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None


@pytest.fixture
def start_service():
    started: list[ServiceProcess] = []

    def start(repository: Path, token: str, port: int = 0) -> ServiceProcess:
        service = ServiceProcess(repository, token, port)
        started.append(service)
        service.start()
        return service

    yield start
    for service in started:
        service.stop()
    remove_stale_scratch()  # what services killed by a test left behind


@pytest.fixture
def make_rollout():
    def make(text: str, meta: dict, uid: int = 0, task: str = "code") -> Rollout:
        prompt = Prompt(uid=uid, task=task, text="", tokens=np.zeros(1, np.int32), meta=meta)
        zeros = np.zeros(1, np.int32)
        return Rollout(prompt, 0, zeros, np.zeros(1, np.float32), zeros, "eos", text=text)

    return make
