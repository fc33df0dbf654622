"""The test run's temporary folder at its end (tests/kit/made_once.py's leave_only, as tests/conftest.py
wires it in): a small generated suite run in this process (pytester), under tests/conftest.py's own hooks."""

import textwrap

pytest_plugins = ("pytester",)


def test_a_run_leaves_only_its_failed_tests_folders(pytester, monkeypatch):
    """The material made once for the run, a module fixture's folder and a passed test's folder go;
    the failed test's folder stays, as it was."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):  # a run without workers, inside this one
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport, pytest_sessionfinish\n")
    pytester.makepyfile(test_generated=textwrap.dedent("""
        import pytest
        from tests.kit.made_once import made_once

        def weights(folder):
            folder.mkdir()
            (folder / "weights").write_bytes(bytes(1000))

        @pytest.fixture(scope="session")
        def material(tmp_path_factory):
            return made_once(tmp_path_factory, "material", weights)

        @pytest.fixture(scope="module")
        def module_folder(tmp_path_factory):
            folder = tmp_path_factory.mktemp("module-material")
            (folder / "archive").write_text("an archive")
            return folder

        def test_passes(material, module_folder, tmp_path):
            (tmp_path / "mine").write_text("passed")
            assert (material / "weights").stat().st_size == 1000

        def test_fails(material, module_folder, tmp_path):
            (tmp_path / "mine").write_text("failed")
            assert not (material / "weights").exists()
    """))
    base = pytester.path / "basetemp"  # given: pytest itself leaves it whole (it empties it at the next start)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", f"--basetemp={base}")
    result.assert_outcomes(passed=1, failed=1)
    # (and pytest's link to a test's newest folder, test_failscurrent)
    assert [path.name for path in base.iterdir() if not path.is_symlink()] == ["test_fails0"]
    assert (base / "test_fails0" / "mine").read_text() == "failed"
