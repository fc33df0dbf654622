"""Sending an RT Dose back: the destination's spelling, the back-off, and C-STORE to a real
listener (127.0.0.1), in plain DICOM and over TLS."""

import shutil
import subprocess
from pathlib import Path

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


# TLS: what failed, said


def _openssl(*args, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_request(folder: Path, name: str, subject: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=folder)


def _signed(folder: Path, name: str, names: str) -> tuple[Path, Path]:
    """A certificate for ``names`` (subjectAltName) signed by the folder's CA, and its key."""
    _key_and_request(folder, name, f"/CN={name}")
    (folder / f"{name}.ext").write_text(f"subjectAltName={names}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
             "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=folder)
    return folder / f"{name}.pem", folder / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA; the node's certificate and a listener's for 127.0.0.1 it signed; one it signed for another
    host; and a self-signed one no one trusts (by the openssl command)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make test certificates")
    folder = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "1", "-subj", "/CN=Test CA", cwd=folder)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "rogue.key", "-out", "rogue.pem", "-days", "1", "-subj", "/CN=localhost", "-addext",
             "subjectAltName=DNS:localhost,IP:127.0.0.1", cwd=folder)
    return {"ca": folder / "ca.pem", "node": _signed(folder, "node", "DNS:localhost,IP:127.0.0.1"),
            "planning": _signed(folder, "planning", "DNS:localhost,IP:127.0.0.1"),
            "other": _signed(folder, "other", "DNS:otherhost"), "rogue": (folder / "rogue.pem", folder / "rogue.key")}


def _send_over_tls(rtdose, pki, listener_certificate):
    from provided_code.apps.node.sender import client_ssl_context
    from provided_code.apps.node.server import server_ssl_context

    context = server_ssl_context(*listener_certificate) if listener_certificate else None
    listener = Listener(ssl_context=context).start()
    try:
        return send_file(rtdose, parse_destination(listener.destination), "KBP",
                         client_ssl_context(*pki["node"], pki["ca"]), timeout=10)
    finally:
        listener.stop()


def test_over_tls_a_listener_the_ca_signed_stores_the_file(rtdose, pki):
    assert _send_over_tls(rtdose, pki, pki["planning"]) == "status 0x0000"


def test_over_tls_a_certificate_the_ca_did_not_sign_is_not_trusted(rtdose, pki):
    with pytest.raises(SendError, match=r"PLANNING@127\.0\.0\.1:\d+: TLS failed, certificate not trusted: "
                                        r"self.signed certificate"):
        _send_over_tls(rtdose, pki, pki["rogue"])


def test_over_tls_a_certificate_for_another_host_is_a_name_mismatch(rtdose, pki):
    with pytest.raises(SendError, match=r": TLS failed, name mismatch: IP address mismatch"):
        _send_over_tls(rtdose, pki, pki["other"])


def test_over_tls_a_listener_without_tls_is_said_to_speak_none(rtdose, pki):
    with pytest.raises(SendError, match=r": TLS failed, no TLS \("):
        _send_over_tls(rtdose, pki, None)


def test_over_tls_no_listener_at_all_is_no_connection(rtdose, pki):
    from provided_code.apps.node.sender import client_ssl_context

    with pytest.raises(SendError, match=r"cannot be reached \(no connection\)$"):
        send_file(rtdose, Destination("PLANNING", LOCALHOST, free_port()), "KBP",
                  client_ssl_context(*pki["node"], pki["ca"]), timeout=10)
