"""What the DICOM node's tests and benchmark share: small phantom patients as a planning system
exports them (with the structure set naming its CT images), copies of one under new UIDs, a
sending client, a listening Storage SCP standing in for the planning system, free ports and
bounded waits. Real sockets on 127.0.0.1 only."""

from __future__ import annotations

import copy
import socket
import threading
import time
from pathlib import Path

import numpy as np
from pydicom import dcmread
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian, generate_uid

from provided_code.sites import openkbp
from provided_code.data.phantoms import make_phantom
from tests.kit.synthetic import CT_STORAGE, RTDOSE_STORAGE, RTSTRUCT_STORAGE, write_patient

STRUCTURES = openkbp().names  # OpenKBP's channel order

LOCALHOST = "127.0.0.1"
OTHER_HOST = "127.0.0.2"  # another address of the loopback (Linux answers all of 127/8): another system's
INSTANCE_KEYWORDS = ("SOPInstanceUID", "SeriesInstanceUID", "StudyInstanceUID", "FrameOfReferenceUID",
                     "ReferencedSOPInstanceUID", "ReferencedFrameOfReferenceUID", "MediaStorageSOPInstanceUID")
SYNTAXES = [ExplicitVRLittleEndian, ImplicitVRLittleEndian]


def small_patient(folder: Path, seed: int = 5, step: int = 4, with_dose: bool = True,
                  slice_step: int | None = None) -> Path:
    """A phantom at 1/``step`` of the OpenKBP resolution along each axis (``step`` 4: a 32 × 32 CT
    of 32 slices, 8-10 mm apart; the smallest whose targets keep their contours), or along the
    slices at 1/``slice_step`` (8: 16 slices, 16-20 mm apart, each target still on two or more),
    written as a planning system exports it: CT files, ``RS.dcm`` naming every CT image it was
    drawn on, and ``RD.dcm`` with ``with_dose``. Returns ``folder``."""
    volumes = make_phantom(seed)
    steps = (step, step, slice_step or step)
    box = tuple(slice(None, None, s) for s in steps)
    masks = {name: volumes[name][box] for name in STRUCTURES}
    masks["BODY"] = volumes["possible_dose_mask"][box]
    written = write_patient(folder, volumes["ct"][box], masks, np.asarray(volumes["voxel_dimensions"]) * steps,
                            volumes["dose"][box] if with_dose else None, factor=1)
    add_image_references(written.rtstruct, written.ct_dir)
    return Path(folder)


def add_image_references(rtstruct: Path, ct_dir: Path) -> None:
    """Name the CT series and every image in the structure set, as planning systems do
    (``RTReferencedStudySequence > RTReferencedSeriesSequence > ContourImageSequence``)."""
    structure_set = dcmread(rtstruct)
    images = [dcmread(path, stop_before_pixels=True) for path in sorted(Path(ct_dir).iterdir())]
    series = Dataset()
    series.SeriesInstanceUID = images[0].SeriesInstanceUID
    series.ContourImageSequence = Sequence()
    for image in images:
        item = Dataset()
        item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = image.SOPClassUID, image.SOPInstanceUID
        series.ContourImageSequence.append(item)
    study = Dataset()
    study.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"  # Detached Study Management (retired), as TPSs write
    study.ReferencedSOPInstanceUID = images[0].StudyInstanceUID
    study.RTReferencedSeriesSequence = Sequence([series])
    structure_set.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence = Sequence([study])
    structure_set.save_as(rtstruct, enforce_file_format=True)


def read_patient_files(folder: Path) -> list[Dataset]:
    """Every DICOM file of a written patient: the CT images, then RS.dcm, then RD.dcm if there is one."""
    folder = Path(folder)
    paths = sorted((folder / "ct").iterdir()) + [folder / "RS.dcm"]
    if (folder / "RD.dcm").is_file():
        paths.append(folder / "RD.dcm")
    return [dcmread(path) for path in paths]


def _remap(dataset: Dataset, mapping: dict[str, str]) -> None:
    for element in dataset.iterall():
        if element.keyword in INSTANCE_KEYWORDS and element.value:
            element.value = mapping.setdefault(str(element.value), generate_uid())


def clone_patient(datasets: list[Dataset], index: int) -> list[Dataset]:
    """Copies of a patient's datasets under new instance, series, study and frame UIDs (the
    references among them kept) and PatientID ``PHANTOM<index>``."""
    mapping: dict[str, str] = {}
    clones = []
    for dataset in datasets:
        clone = copy.deepcopy(dataset)
        _remap(clone, mapping)
        if hasattr(clone, "file_meta"):
            clone.file_meta.MediaStorageSOPInstanceUID = clone.SOPInstanceUID
        clone.PatientID = f"PHANTOM{index}"
        clones.append(clone)
    return clones


def structure_set_of(datasets: list[Dataset]) -> Dataset:
    return next(ds for ds in datasets if ds.SOPClassUID == RTSTRUCT_STORAGE)


def ct_of(datasets: list[Dataset]) -> list[Dataset]:
    return [ds for ds in datasets if ds.SOPClassUID == CT_STORAGE]


def write_files(datasets: list[Dataset], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for number, dataset in enumerate(datasets):
        dataset.save_as(folder / f"{number:04d}.dcm", enforce_file_format=True)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOCALHOST, 0))
        return probe.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """``predicate()``'s first true value within ``timeout`` seconds, else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)


def client_ae(calling: str = "TPS", sop_classes=(CT_STORAGE, RTSTRUCT_STORAGE, RTDOSE_STORAGE), timeout: float = 20):
    from pynetdicom.sop_class import Verification

    from provided_code.apps.node.sender import no_delay_ae

    ae = no_delay_ae(calling)  # a planning system's client sends without Nagle's delay
    ae.add_requested_context(Verification)
    for sop_class in sop_classes:
        ae.add_requested_context(sop_class, SYNTAXES)
    ae.connection_timeout = ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = timeout
    return ae


def binds(address: str) -> bool:
    """Whether a socket can be bound to ``address`` (Linux's loopback answers all of 127/8; others
    may answer 127.0.0.1 alone)."""
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def associate_from(address: str, port: int, calling: str = "TPS", called: str = "KBP"):
    """An association with the node on ``port`` from the local ``address`` (a system at another
    address than the tests' other clients), as ``calling``."""
    return client_ae(calling).associate(LOCALHOST, port, ae_title=called, bind_address=(address, 0))


def send(port: int, datasets: list[Dataset], calling: str = "TPS", called: str = "KBP", tls=None) -> list[int]:
    """C-STORE ``datasets`` in one association; their statuses (-1: no answer)."""
    ae = client_ae(calling, sorted({str(ds.SOPClassUID) for ds in datasets}))
    assoc = ae.associate(LOCALHOST, port, ae_title=called, tls_args=tls)
    assert assoc.is_established, f"association with the node on port {port} not established"
    statuses = []
    try:
        for dataset in datasets:
            status = assoc.send_c_store(dataset)
            statuses.append(int(status.Status) if status and "Status" in status else -1)
    finally:
        assoc.release()
    return statuses


def echo(port: int, calling: str = "TPS", called: str = "KBP", tls=None, timeout: float = 5) -> bool:
    ae = client_ae(calling, (), timeout=timeout)
    try:
        assoc = ae.associate(LOCALHOST, port, ae_title=called, tls_args=tls)
    except OSError:
        return False
    if not assoc.is_established:
        return False
    status = assoc.send_c_echo()
    assoc.release()
    return bool(status) and status.Status == 0


class Listener:
    """A Storage SCP standing in for the planning system: keeps every dataset it is sent, with the
    time it arrived, and answers ``status``."""

    def __init__(self, port: int = 0, ae_title: str = "PLANNING", status: int = 0x0000, ssl_context=None):
        self.port, self.ae_title, self.status, self.ssl_context = port, ae_title, status, ssl_context
        self.received: list[tuple[float, Dataset]] = []
        self._lock = threading.Lock()
        self._server = None

    def start(self) -> "Listener":
        from pynetdicom import AE, evt

        from provided_code.apps.node.server import start_server

        ae = AE(ae_title=self.ae_title)
        ae.add_supported_context(RTDOSE_STORAGE, SYNTAXES)
        ae.require_called_aet = True
        self._server = start_server(ae, (LOCALHOST, self.port), [(evt.EVT_C_STORE, self._on_store)], self.ssl_context)
        self.port = self._server.server_address[1]
        return self

    def _on_store(self, event) -> int:
        dataset = event.dataset
        dataset.file_meta = event.file_meta
        with self._lock:
            self.received.append((time.time(), dataset))
        return self.status

    def datasets(self) -> list[Dataset]:
        with self._lock:
            return [dataset for _, dataset in self.received]

    @property
    def destination(self) -> str:
        return f"{self.ae_title}@{LOCALHOST}:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
