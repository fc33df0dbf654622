"""The checks that keep the quick tier quick (tests/kit/tiers.py), as tests/conftest.py wires them in:
a small generated suite run in this process (pytester), under tests/conftest.py's own hooks."""

import textwrap

import pytest

from provided_code.run_folder import RunFolder
from provided_code.training import train as training

pytest_plugins = ("pytester",)

# The generated suite's conftest: the hooks of tests/conftest.py itself, not a copy of them
HOOKS = ("from tests.conftest import pytest_collection_modifyitems, pytest_runtest_call, pytest_runtest_setup, "
         "pytest_runtest_teardown\n")


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(HOOKS)
    pytester.makeini("[pytest]\nmarkers =\n    slow: the slow tier\n")
    return pytester


def test_an_unmarked_test_of_a_fixture_that_trains_stops_the_collection_naming_it(suite):
    suite.makepyfile(test_generated=textwrap.dedent("""
        import pytest
        from provided_code.training.train import train

        @pytest.fixture
        def model():
            return train(None)

        @pytest.fixture
        def numbers():
            return [1, 2]

        def test_reads_the_model(model):
            pass

        @pytest.mark.slow
        def test_reads_the_model_in_the_slow_tier(model):
            pass

        def test_adds(numbers):
            assert sum(numbers) == 3
    """))
    result = suite.runpytest_inprocess("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refused = [line for line in result.stderr.lines if "which trains or predicts" in line]
    assert refused == ["test_generated.py::test_reads_the_model uses the fixture 'model', which trains or predicts: "
                       "mark it @pytest.mark.slow (the quick tier, bash scripts/test --quick, leaves such tests out)"]


def test_an_unmarked_test_that_trains_or_loads_a_trained_model_fails_and_a_marked_one_may(suite):
    """The training epochs and the model loading are the package's own: refused outside the slow
    tier (even when the test catches the refusal), called as they are inside it (here without
    arguments: their TypeError); a test that stands a model in with monkeypatch leaves nothing
    behind."""
    suite.makepyfile(test_generated=textwrap.dedent("""
        import pytest
        from provided_code.run_folder import RunFolder
        from provided_code.training import train as training

        @pytest.fixture
        def epochs_run():  # (a name the collection's check does not look for: the setup's guard finds it)
            training.run_epochs()

        def test_trains():
            training.run_epochs()

        def test_trains_in_its_setup(epochs_run):
            pass

        def test_loads_a_trained_model():
            RunFolder.load_trained_model()

        def test_trains_expecting_an_error():  # as a test of a command line's exit code would
            with pytest.raises(Exception):
                training.run_epochs()

        def test_stands_a_model_in(monkeypatch):  # as tests of the clinic's path do: the guard's put back after
            monkeypatch.setattr(RunFolder, "load_trained_model", lambda *args: "a stand-in")
            assert RunFolder.load_trained_model() == "a stand-in"

        @pytest.mark.slow
        def test_trains_in_the_slow_tier():
            with pytest.raises(TypeError):
                training.run_epochs()
            with pytest.raises(TypeError):
                RunFolder.load_trained_model()
    """))
    guarded = training.run_epochs, RunFolder.load_trained_model  # this test's own guard's
    result = suite.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    assert (training.run_epochs, RunFolder.load_trained_model) == guarded  # nothing left behind
    result.assert_outcomes(passed=2, failed=3, errors=1)
    for test, did in [("test_trains", "trains (training epochs ran)"),
                      ("test_trains_expecting_an_error", "trains (training epochs ran)"),
                      ("test_trains_in_its_setup", "trains (training epochs ran)"),
                      ("test_loads_a_trained_model", "loads a trained model")]:
        result.stdout.fnmatch_lines([f"*HeavyTestError: test_generated.py::{test} {did}: mark it @pytest.mark.slow*"])


def test_an_unmarked_test_whose_python_process_loads_tensorflow_fails(suite, tmp_path):
    """A child that maps TensorFlow's library (here a file named as it is, mapped by a child that loads
    no TensorFlow: a second, not TensorFlow's import) fails the test; a child that maps nothing of it
    does not."""
    library = tmp_path / "libtensorflow_framework.so.2"
    library.write_bytes(b"\0" * 4096)
    suite.makepyfile(test_generated=textwrap.dedent(f"""
        import subprocess, sys

        MAP = ("import mmap, sys, time; handle = open(sys.argv[1], 'rb'); "
               "mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ); time.sleep(0.5)")

        def test_maps_tensorflow():
            subprocess.run([sys.executable, "-c", MAP, {str(library)!r}], check=True)

        def test_maps_something_else():
            subprocess.run([sys.executable, "-c", MAP, {str(__file__)!r}], check=True)
    """))
    result = suite.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*HeavyTestError: test_generated.py::test_maps_tensorflow ran a Python process of "
                                 "its own that loaded TensorFlow (-c import mmap*): mark it @pytest.mark.slow*"])
