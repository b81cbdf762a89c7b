from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest

from kmm.kube import client

from . import fakeapi


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is too deep.
    path = pathlib.Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_api() -> fakeapi.FakeAPI:
    return fakeapi.FakeAPI()


@pytest.fixture
async def api(fake_api: fakeapi.FakeAPI) -> AsyncIterator[client.Client]:
    async for started in fakeapi.started(fake_api):
        yield started
