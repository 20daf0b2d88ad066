"""TestRepository: content addressing, verification on read, safe references."""

import hashlib
import os

import pytest

from minirl.verifiers import (
    CorruptObjectError,
    ObjectNotFoundError,
    RepositoryError,
    TestRepository,
)
from minirl.verifiers.repository import canonical_json


def test_put_get_bytes_and_objects(repo):
    sha = repo.put(b"hello")
    assert sha == hashlib.sha256(b"hello").hexdigest()
    assert repo.get(sha) == b"hello"
    obj = {"cases": [{"output": "3", "input": "1 2"}], "name": "añadir"}
    osha = repo.put(obj)
    assert osha == hashlib.sha256(canonical_json(obj)).hexdigest()
    assert repo.get_json(osha) == obj
    assert (
        repo.put({"name": "añadir", "cases": [{"input": "1 2", "output": "3"}]}) == osha
    )  # key order
    assert repo.has(sha) and not repo.has("0" * 64) and not repo.has("../x")


def test_put_is_idempotent_and_atomic(repo):
    sha = repo.put(b"x" * 1000)
    assert repo.put(b"x" * 1000) == sha
    files = [f for _, _, fs in os.walk(repo.root) for f in fs]
    assert files == [sha]  # one object, no temp files left


def test_constructor_has_no_side_effects(tmp_path):
    TestRepository(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_corruption_is_detected_on_read(repo):
    sha = repo.put(b"the right bytes")
    with open(os.path.join(repo.root, sha[:2], sha), "wb") as f:
        f.write(b"the wrong bytes")
    with pytest.raises(CorruptObjectError, match="corrupt"):
        repo.get(sha)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "A" * 64, "abc", "", None, 42, "g" * 64])
def test_references_are_validated_before_touching_disk(repo, bad):
    with pytest.raises(RepositoryError, match="sha256"):
        repo.get(bad)


def test_missing_and_non_json_objects(repo):
    with pytest.raises(ObjectNotFoundError):
        repo.get("f" * 64)
    sha = repo.put(b"\xff not json")
    with pytest.raises(RepositoryError, match="not JSON"):
        repo.get_json(sha)
