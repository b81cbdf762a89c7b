"""The autouse leak check catches a test that leaves a task running."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_CONFTEST = Path(__file__).parents[1] / "conftest.py"


def test_a_leaked_task_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_CONFTEST.read_text())
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\nasyncio_mode = "auto"\n'
        'asyncio_default_fixture_loop_scope = "function"\nfilterwarnings = ["error"]\n'
    )
    pytester.makepyfile(
        """
        import asyncio

        async def test_leaks():
            asyncio.get_running_loop().create_task(asyncio.sleep(3600), name="forgotten")

        async def test_clean():
            await asyncio.sleep(0)

        def test_sync():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "asyncio")
    # The leaking test's body passes; its teardown is the error.
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_leaks*", "*left 1 asyncio task(s) running: forgotten*"]
    )
