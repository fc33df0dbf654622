"""The node's store: UIDs checked before they name a file, objects and results written whole."""

import os

import pytest

from provided_code.apps.node.store import InvalidUIDError, Store, check_uid


@pytest.mark.parametrize("uid", ["1", "1.2.840.10008.5.1.4.1.1.2", "2.25.1" + "0" * 58])
def test_uids_of_digits_and_dots_are_accepted(uid):
    assert check_uid(uid, "SOPInstanceUID") == uid


@pytest.mark.parametrize("uid", ["", "../../etc", "1.2/3", "1..2", ".1.2", "1.2.", "1.2\x00", "1.2 3", "1.2\\3",
                                 "C:1.2", "1." + "2" * 63, None])
def test_anything_else_is_refused_naming_the_field(uid):
    with pytest.raises(InvalidUIDError, match=r"^Invalid `SeriesInstanceUID`\. Expected a UID of digits and dots"):
        check_uid(uid, "SeriesInstanceUID")


def test_objects_land_under_their_series_and_instance_uids_whole(tmp_path):
    store = Store(tmp_path / "store")
    path = store.write_object("1.2.3", "1.2.3.4", b"DICM" * 10)
    assert path == tmp_path / "store" / "objects" / "1.2.3" / "1.2.3.4.dcm" and path.read_bytes() == b"DICM" * 10
    store.write_object("1.2.3", "1.2.3.4", b"again")  # the same instance sent again replaces it whole
    assert path.read_bytes() == b"again" and not any(store.incoming.iterdir())


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    store = Store(tmp_path / "store")
    with pytest.raises(TypeError):
        store.write_object("1.2.3", "1.2.3.4", "not bytes")
    assert not any(store.incoming.iterdir()) and not (store.objects / "1.2.3" / "1.2.3.4.dcm").exists()


def test_a_bad_uid_writes_nothing(tmp_path):
    store = Store(tmp_path / "store")
    for series, instance in (("../..", "1.2"), ("1.2", "../../x"), ("1.2", "1.2/../../x")):
        with pytest.raises(InvalidUIDError):
            store.write_object(series, instance, b"x")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_result_is_committed_by_one_rename_and_replaces_the_earlier_one(tmp_path):
    store = Store(tmp_path / "store")
    for content in ("first", "second"):
        staging = store.staging_dir("1.2.5")
        (staging / "RD.dcm").write_text(content)
        final = store.commit_result(staging, "1.2.5")
    assert (final / "RD.dcm").read_text() == "second" and [p.name for p in store.results.iterdir()] == ["1.2.5"]


def test_what_a_crash_left_half_written_is_removed_at_start(tmp_path):
    store = Store(tmp_path / "store")
    (store.incoming / "1.2.3.4.123.abcd.tmp").write_bytes(b"half")
    (store.staging_dir("1.2.5") / "RD.dcm").write_bytes(b"half")
    store.result_dir("1.2.6").mkdir()
    assert store.clean_temporaries() == 2
    assert not any(store.incoming.iterdir()) and [p.name for p in store.results.iterdir()] == ["1.2.6"]


@pytest.fixture
def no_umask():
    """The most permissive umask there is, for the test's duration."""
    umask = os.umask(0)
    yield
    os.umask(umask)


def test_the_store_is_the_owners_only_whatever_the_umask(tmp_path, no_umask):
    store = Store(tmp_path / "store")
    path = store.write_object("1.2.3", "1.2.3.4", b"DICM")
    staging = store.staging_dir("1.2.5")
    (staging / "patient").mkdir()
    (staging / "patient" / "ct.csv").write_text("0,1")  # as the clinic's writers do: with the umask's permissions
    store.commit_result(staging, "1.2.5")
    modes = {p.relative_to(store.root).as_posix(): p.stat().st_mode & 0o777
             for p in [store.root, *store.root.rglob("*")]}
    assert modes[path.relative_to(store.root).as_posix()] == 0o600
    assert {mode for name, mode in modes.items() if (store.root / name).is_dir()} == {0o700}
    assert {mode for name, mode in modes.items() if (store.root / name).is_file()} == {0o600}


def test_an_earlier_store_open_to_all_is_closed_at_start(tmp_path):
    (tmp_path / "store" / "objects").mkdir(parents=True)
    os.chmod(tmp_path / "store", 0o755)
    Store(tmp_path / "store")
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700
