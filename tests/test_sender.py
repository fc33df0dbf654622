"""Sending an RT Dose back: the destination's spelling, the back-off, and C-STORE to a real
listener (127.0.0.1)."""

import pytest

pytest.importorskip("pynetdicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.errors import UserError  # noqa: E402
from provided_code.apps.node.sender import (  # noqa: E402
    MAX_BACKOFF_S,
    Destination,
    SendError,
    backoff_delay,
    parse_destination,
    send_file,
)
from tests.kit.node import LOCALHOST, Listener, free_port  # noqa: E402


def test_destinations_are_ae_at_host_colon_port():
    assert parse_destination("TPS@10.0.0.5:104") == Destination("TPS", "10.0.0.5", 104)
    assert parse_destination("PACS_1@[::1]:11112") == Destination("PACS_1", "::1", 11112)
    assert str(parse_destination("PACS_1@[::1]:11112")) == "PACS_1@[::1]:11112"


@pytest.mark.parametrize("text", ["TPS", "TPS@host", "@host:104", "TPS@:104", "TPS@host:0", "TPS@host:70000",
                                  "WAY_TOO_LONG_AE_TITLE@host:104", "T\\PS@host:104"])
def test_other_spellings_are_refused(text):
    with pytest.raises(UserError, match="Invalid `send_to`"):
        parse_destination(text)


def test_the_back_off_doubles_up_to_its_ceiling():
    assert [backoff_delay(n, 5.0) for n in range(1, 5)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff_delay(30, 5.0) == MAX_BACKOFF_S


@pytest.fixture
def rtdose(tmp_path):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    dataset = Dataset()
    dataset.file_meta = FileMetaDataset()
    dataset.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset.SOPClassUID = dataset.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.481.2"
    dataset.SOPInstanceUID = dataset.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    dataset.Modality = "RTDOSE"
    path = tmp_path / "RD.dcm"
    dataset.save_as(path, enforce_file_format=True)
    return path


def test_a_file_is_stored_by_the_listener(rtdose):
    listener = Listener().start()
    try:
        assert send_file(rtdose, parse_destination(listener.destination), "KBP", timeout=10) == "status 0x0000"
        [received] = listener.datasets()
        assert received.Modality == "RTDOSE"
    finally:
        listener.stop()


def test_a_failure_status_is_a_send_error_naming_it(rtdose):
    listener = Listener(status=0xA700).start()
    try:
        with pytest.raises(SendError, match=r"PLANNING@127\.0\.0\.1:\d+ answered status 0xA700"):
            send_file(rtdose, parse_destination(listener.destination), "KBP", timeout=10)
    finally:
        listener.stop()


def test_no_listener_is_a_send_error(rtdose):
    with pytest.raises(SendError, match="cannot be reached"):
        send_file(rtdose, Destination("PLANNING", LOCALHOST, free_port()), "KBP", timeout=10)


def test_a_refused_association_is_a_send_error(rtdose):
    listener = Listener(ae_title="PLANNING").start()
    try:
        with pytest.raises(SendError, match="refused the association"):
            send_file(rtdose, Destination("SOMEONE", LOCALHOST, listener.port), "KBP", timeout=10)
    finally:
        listener.stop()
