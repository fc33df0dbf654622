"""The answer's way back: an RT Dose sent by C-STORE to the planning system or PACS.

One association per attempt; a failed attempt (refused association, no answer, a failure status)
is retried after a delay that doubles from ``--send-backoff`` up to a ceiling, for
``--send-retry-hours`` after the first failed one (``send_queue``; the node journals each one). Over TLS, a connection that fails is
tried once more without DICOM to say what failed: the destination's certificate not trusted (by
``--tls-ca``), a certificate for another name, no TLS at all, or this node's certificate refused.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import ssl

from pydicom import dcmread
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from pynetdicom import AE, evt

from provided_code.errors import UserError

AE_TITLE = re.compile(r"[\x20-\x5b\x5d-\x7e]{1,16}")  # DICOM AE: 16 characters of default repertoire, no backslash
SUCCESS_STATUSES = {0x0000}
WARNING_STATUSES = {0xB000, 0xB006, 0xB007}  # coercion of data elements, elements discarded, data set mismatch
MAX_BACKOFF_S = 300.0
NAME_MISMATCH_CODES = {62, 64}  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
NO_TLS_REASONS = {"WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING", "RECORD_LAYER_FAILURE",
                  "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"}  # the peer answered in no TLS


class SendError(UserError, RuntimeError):
    """An attempt that did not deliver the RT Dose; the message says why in one line."""


def check_ae_title(value: str, what: str) -> str:
    text = str(value).strip()
    if not AE_TITLE.fullmatch(text):
        raise UserError(f"Invalid `{what}`. Expected an AE title of 1 to 16 characters (no backslash or control "
                        f"characters). Received: {what}={value!r}")
    return text


@dataclasses.dataclass(frozen=True)
class Destination:
    ae_title: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.ae_title}@{host}:{self.port}"


def parse_destination(text: str) -> Destination:
    """``AE@HOST:PORT`` (an IPv6 host in brackets) as a :class:`Destination`."""
    ae, at, address = str(text).rpartition("@")
    host, colon, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not at or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"Invalid `send_to`. Expected AE@HOST:PORT, e.g. TPS@10.0.0.5:104. Received: send_to={text!r}")
    return Destination(check_ae_title(ae, "send_to"), host, int(port))


def backoff_delay(attempt: int, first: float, ceiling: float = MAX_BACKOFF_S) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...): ``first``, doubling, at most ``ceiling``."""
    return min(first * 2.0 ** (attempt - 1), ceiling)


def client_ssl_context(cert: os.PathLike | str, key: os.PathLike | str, ca: os.PathLike | str) -> ssl.SSLContext:
    """TLS for sending: the destination's certificate checked against ``ca``; ours presented."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class NoDelayAE(AE):
    """A pynetdicom AE whose associations set TCP_NODELAY: pynetdicom writes a C-STORE's command and
    data set separately, and without it each message waits for the peer's delayed ACK (about 40 ms
    on Linux)."""

    def _create_socket(self, assoc, address, tls_args):  # pynetdicom's hook for the requestor's socket
        sock = super()._create_socket(assoc, address, tls_args)
        sock.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def no_delay_ae(ae_title: str) -> NoDelayAE:
    """A :class:`NoDelayAE` calling as ``ae_title``."""
    return NoDelayAE(ae_title=ae_title)


def send_file(path: os.PathLike | str, destination: Destination, calling_ae: str,
              ssl_context: ssl.SSLContext | None = None, timeout: float = 30.0) -> str:
    """Send the DICOM file at ``path`` by C-STORE; returns the outcome's detail, raises
    :class:`SendError` when it was not stored."""
    dataset = dcmread(path)
    syntaxes = list(dict.fromkeys([dataset.file_meta.TransferSyntaxUID, ExplicitVRLittleEndian,
                                   ImplicitVRLittleEndian]))
    ae = no_delay_ae(calling_ae)
    ae.add_requested_context(dataset.SOPClassUID, syntaxes)
    ae.connection_timeout = ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = timeout
    tls = (ssl_context, destination.host) if ssl_context is not None else None
    connected = []
    try:
        assoc = ae.associate(destination.host, destination.port, ae_title=destination.ae_title, tls_args=tls,
                             evt_handlers=[(evt.EVT_CONN_OPEN, lambda event: connected.append(True))])
    except (OSError, ssl.SSLError) as error:
        raise SendError(f"cannot connect to {destination}: {error}") from None
    if not assoc.is_established:
        tls_failure = tls_failure_of(destination, ssl_context, timeout) if ssl_context and not connected else None
        if tls_failure:
            raise SendError(f"{destination}: TLS failed, {tls_failure}")
        what = ("cannot be reached (no connection)" if not connected else "refused the association"
                if assoc.is_rejected else "aborted the association" if assoc.is_aborted
                else "did not answer the association request")
        raise SendError(f"{destination} {what}")
    try:
        status = assoc.send_c_store(dataset)
    except (OSError, ValueError, RuntimeError) as error:
        raise SendError(f"sending to {destination} failed: {error}") from None
    finally:
        if assoc.is_established:
            assoc.release()
    if not status or "Status" not in status:
        raise SendError(f"{destination} gave no answer to the C-STORE (connection lost or timed out)")
    code = int(status.Status)
    comment = str(status.get("ErrorComment", "") or "")
    if code in SUCCESS_STATUSES:
        return "status 0x0000"
    if code in WARNING_STATUSES:
        return f"stored with warning status 0x{code:04X}{': ' + comment if comment else ''}"
    raise SendError(f"{destination} answered status 0x{code:04X}{': ' + comment if comment else ''}")


def tls_failure_of(destination: Destination, ssl_context: ssl.SSLContext, timeout: float = 10.0) -> str | None:
    """Why a TLS connection to ``destination`` fails, in words: ``certificate not trusted``, ``name
    mismatch``, ``no TLS`` or ``this node's certificate refused`` (each with OpenSSL's reason); None
    when no TCP connection opens at all, or the handshake succeeds now."""
    try:
        raw = socket.create_connection((destination.host, destination.port), timeout=min(timeout, 10.0))
    except OSError:
        return None
    with raw:
        try:
            with ssl_context.wrap_socket(raw, server_hostname=destination.host):
                return None
        except ssl.SSLCertVerificationError as error:
            kind = "name mismatch" if error.verify_code in NAME_MISMATCH_CODES else "certificate not trusted"
            return f"{kind}: {error.verify_message}"
        except ssl.SSLError as error:
            reason = error.reason or type(error).__name__
            if reason in NO_TLS_REASONS or isinstance(error, ssl.SSLEOFError):
                return f"no TLS (the destination answered the handshake in plain text or closed: {reason})"
            if "ALERT" in reason:
                return f"this node's certificate refused ({reason})"
            return f"handshake failed: {reason}"
        except OSError as error:  # reset or silent: a listener that speaks no TLS
            return f"no TLS (the destination did not answer the handshake: {error.strerror or type(error).__name__})"
