"""``--cpu-times=FILE`` (tests/kit/cpu_times.py, wired in by tests/conftest.py): a small generated
suite run in this process (pytester) under the option, as tests/conftest.py registers it."""

import json
import textwrap

pytest_plugins = ("pytester",)

# The generated suite's conftest: tests/conftest.py's option and its registration, not a copy of them
HOOKS = "from tests.conftest import pytest_addoption, pytest_configure\n"


def test_each_test_is_one_line_with_its_own_processor_time_and_its_processes(pytester, tmp_path):
    """A test that computes for 0.5 s of processor time, one that sleeps 0.5 s and one whose child
    process computes for 0.5 s. Lower bounds of 0.4 s (the clocks tick in hundredths); the sleeper's
    own time under 0.25 s (nothing else computes in this process while it sleeps)."""
    pytester.makeconftest(HOOKS)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_generated=textwrap.dedent("""
        import subprocess, sys, time

        BURN = "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"

        def test_computes():
            exec(BURN)

        def test_sleeps():
            time.sleep(0.5)

        def test_starts_a_process_that_computes():
            subprocess.run([sys.executable, "-c", BURN], check=True)
    """))
    times = tmp_path / "times" / "cpu.jsonl"
    times.parent.mkdir()
    times.write_text('{"id": "left from an earlier run"}\n')
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--cpu-times={times}")
    result.assert_outcomes(passed=3)
    lines = {row["id"].split("::")[-1]: row for row in map(json.loads, times.read_text().splitlines())}
    assert sorted(lines) == ["test_computes", "test_sleeps", "test_starts_a_process_that_computes"]
    assert lines["test_computes"]["self"] >= 0.4
    assert lines["test_sleeps"]["self"] < 0.25 and lines["test_sleeps"]["wall"] >= 0.5
    assert lines["test_starts_a_process_that_computes"]["children"] >= 0.4
