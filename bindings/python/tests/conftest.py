import os
from typing import Iterator

import pytest

import llminfer

MODEL_ENV = "LLMINFER_TEST_MODEL"
# Small enough for quick sessions on two cores; every test prompt fits.
TEST_CTX = 512
TEST_THREADS = 2


def model_path() -> str:
    path = os.environ.get(MODEL_ENV)
    if not path:
        pytest.skip(f"{MODEL_ENV} is not set: tests that need a model are skipped")
    return path


@pytest.fixture(scope="session")
def model() -> Iterator[llminfer.Model]:
    with llminfer.Model(model_path()) as loaded:
        yield loaded


@pytest.fixture()
def session(model: llminfer.Model) -> Iterator[llminfer.Session]:
    with llminfer.Session(model, n_threads=TEST_THREADS, n_ctx=TEST_CTX) as opened:
        yield opened


def drain(session: llminfer.Session, max_steps: int = 2000) -> None:
    """Steps until the session has no request left."""
    for _ in range(max_steps):
        if session.step():
            continue
        stats = session.stats()
        if stats.n_running == 0 and stats.n_waiting == 0:
            return
    raise AssertionError("the session did not become idle")
