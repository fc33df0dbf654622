"""``openkbp-dicom serve``: the DICOM node, with real clients on real sockets (127.0.0.1).

pynetdicom is the client of most tests, DCMTK's ``echoscu`` and ``storescu`` of a few (skipped
with the reason when DCMTK is not installed); a pynetdicom Storage SCP (``tests/kit/node.py``)
stands in for the planning system and keeps what the node sends. One small model (trained once per
test run) predicts, and one small phantom patient is written; every patient is a copy of it under new UIDs.
Every wait is bounded.
"""

import concurrent.futures
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")
pytest.importorskip("pynetdicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from click.testing import CliRunner  # noqa: E402

from provided_code.apps.dicom_cli import main  # noqa: E402
from provided_code.infra.atomic import folder_temporaries  # noqa: E402
from provided_code.apps.node.journal import FAILED, FAILED_SEND, OK, Journal  # noqa: E402
from provided_code.apps.node.predictor import ModelPredictor  # noqa: E402
from provided_code.apps.node.sender import parse_destination  # noqa: E402
from provided_code.apps.node import reactor  # noqa: E402
from provided_code.apps.node.server import Node, NodeSettings, server_ssl_context  # noqa: E402
from tests.kit import held_node  # noqa: E402
from tests.kit.repo import REPO  # noqa: E402
from tests.kit.skips import requires_sample  # noqa: E402
from tests.kit.node import (  # noqa: E402
    LOCALHOST,
    OTHER_HOST,
    Listener,
    associate_from,
    binds,
    client_ae,
    clone_patient,
    ct_of,
    echo,
    free_port,
    read_patient_files,
    send,
    small_patient,
    structure_set_of,
    wait_until,
    write_files,
)

DCMTK = shutil.which("storescu") and shutil.which("echoscu")
requires_dcmtk = pytest.mark.skipif(not DCMTK, reason="DCMTK's echoscu/storescu are not installed "
                                                      "(Debian/Ubuntu: apt-get install dcmtk)")
requires_other_host = pytest.mark.skipif(not binds(OTHER_HOST), reason=f"no second loopback address ({OTHER_HOST}) to "
                                                                       f"stand for another system")
OUT_OF_RESOURCES, DATA_SET_MISMATCH, CANNOT_UNDERSTAND = 0xA700, 0xA900, 0xC000


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model


@pytest.fixture(scope="module")
def predictor(model_dir):
    with ModelPredictor(model_dir) as loaded:
        yield loaded
    keras.backend.clear_session()


@pytest.fixture(scope="module")
def phantom(tmp_path_factory):
    """One small patient's datasets: 16 CT images of 32 × 32 (every target on two or more: what the
    node's tests need, at half the objects to send and parse of 32), the structure set, the clinic's RT Dose."""
    return read_patient_files(small_patient(tmp_path_factory.mktemp("node-phantom") / "clinic", slice_step=8))


@pytest.fixture
def listener():
    listening = Listener().start()
    yield listening
    listening.stop()


@pytest.fixture
def start_node(tmp_path, predictor):
    """``start_node(**settings)``: a node in this process on a free port of 127.0.0.1 (stopped after the test)."""
    nodes = []

    def start(predict=predictor, **fields):
        fields = {"store": tmp_path / "store", "host": LOCALHOST, "port": 0, "completion_timeout": 10.0,
                  "min_free_bytes": 0, "send_backoff": 0.1, **fields}
        node = Node(NodeSettings(**fields), predict).start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()


def state(node, uid):
    row = node.journal.patient(uid)
    return row["state"] if row is not None else None


def rtstruct_uid(datasets):
    return str(structure_set_of(datasets).SOPInstanceUID)


def doses_for(listener, datasets):
    frame = str(ct_of(datasets)[0].FrameOfReferenceUID)
    return [ds for ds in listener.datasets() if ds.FrameOfReferenceUID == frame]


@pytest.mark.slow
def test_a_patient_comes_back_as_an_rt_dose_on_its_ct_grid(start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))
    assert echo(node.port)
    patient = clone_patient(phantom, 1)
    assert send(node.port, patient) == [0] * len(patient)
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient predicted and sent")
    [dose] = doses_for(listener, patient)
    ct = ct_of(patient)
    assert dose.Modality == "RTDOSE" and dose.FrameOfReferenceUID == ct[0].FrameOfReferenceUID
    assert dose.PatientID == "PHANTOM1" and dose.StudyInstanceUID == ct[0].StudyInstanceUID
    assert (dose.Rows, dose.Columns, dose.NumberOfFrames) == (32, 32, len(ct))
    lowest = min(ct, key=lambda image: float(image.ImagePositionPatient[2]))
    assert np.allclose([float(v) for v in dose.ImagePositionPatient], [float(v) for v in lowest.ImagePositionPatient])
    assert np.allclose([float(v) for v in dose.PixelSpacing], [float(v) for v in ct[0].PixelSpacing])
    values = dose.pixel_array * float(dose.DoseGridScaling)
    assert values.max() > 0
    result = node.store.result_dir(uid)
    assert {"RD.dcm", "dose.nii.gz", "dvh.csv", "dvh.json"} <= {p.name for p in result.iterdir()}
    assert '"reference"' in (result / "dvh.json").read_text()  # the clinic's RT Dose came along: compared
    assert [s for s, _ in node.journal.history(uid)] == ["receiving", "ready", "predicting", "predicted", "sent"]
    [attempt] = node.journal.sends(uid)
    assert attempt["outcome"] == "ok" and attempt["destination"] == listener.destination


@pytest.mark.slow
def test_an_uncommissioned_models_rt_dose_and_patients_journal_entry_say_so(start_node, listener, phantom, predictor):
    """The tests' model is a single run: no bands, no in-distribution check. The planner sees it in the
    RT Dose's series description, IT in the patient's journal entry (its history and its trust)."""
    assert predictor.trust.uncommissioned
    node = start_node(send_to=parse_destination(listener.destination))
    patient = clone_patient(phantom, 34)
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient predicted and sent")
    [dose] = doses_for(listener, patient)
    assert dose.SeriesDescription == f"Uncommissioned model: predicted dose, m epoch {predictor.model.epoch}"
    assert dict(node.journal.history(uid))["predicted"].endswith(
        "; uncommissioned model (no bands, no in-distribution check)")
    assert json.loads(node.journal.patient(uid)["trust"])["uncommissioned"] is True
    status = CliRunner().invoke(main, ["serve", "--status", "--store", str(node.store.root)])
    assert ("Uncommissioned model (no bands, no in-distribution check): 1 of the 1 patients predicted, the latest "
            "among them") in status.output.splitlines()


@pytest.mark.slow
def test_a_dose_above_the_plausible_ceiling_is_said_in_the_journal_the_status_and_the_rt_dose(
        start_node, listener, phantom, monkeypatch, caplog):
    """A badly trained model's 860 Gy (the model's doses plus 860 Gy inside the body): sent as always,
    and said in the log, the patient's journal entry, --status and the RT Dose's Dose Comment."""
    from provided_code.deployed_model import DeployedModel

    predict_doses = DeployedModel.predict

    def implausible(self, arrays, *args, **kwargs):
        return predict_doses(self, arrays, *args, **kwargs) + np.where(arrays.possible_dose_mask, 860, 0).astype(
            np.float32)

    monkeypatch.setattr(DeployedModel, "predict", implausible)
    node = start_node(send_to=parse_destination(listener.destination))
    patient = clone_patient(phantom, 40)
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient predicted and sent")
    found = json.loads(node.journal.patient(uid)["trust"])["dose_ceiling"]
    assert found["max_gy"] > 860 and found["ceiling_gy"] == pytest.approx(91.0)
    short = f"above the plausible ceiling ({found['max_gy']:.0f} Gy > 91 Gy)"
    assert dict(node.journal.history(uid))["predicted"].endswith(f"; {short}")
    [dose] = doses_for(listener, patient)
    assert dose.DoseComment == f"Above the plausible ceiling: {found['max_gy']:.0f} Gy > 91 Gy"
    assert any(r.levelno == logging.WARNING and "predicted dose above the plausible ceiling" in r.getMessage()
               for r in caplog.records)
    status = CliRunner().invoke(main, ["serve", "--status", "--store", str(node.store.root)]).output.splitlines()
    assert "Predictions above the plausible ceiling (doses no plan gives): 1 of the 1 patients predicted" in status
    assert any(line.startswith("    Predicted dose above the plausible ceiling: ") for line in status)


@pytest.mark.slow
def test_a_structure_set_naming_no_images_takes_the_ct_series_of_its_frame(start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))
    patient = clone_patient(phantom, 20)
    del structure_set_of(patient).ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence
    assert send(node.port, patient) == [0] * len(patient)
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient sent")
    assert node.journal.patient(uid)["series_uid"] == ct_of(patient)[0].SeriesInstanceUID
    assert len(doses_for(listener, patient)) == 1


@pytest.mark.slow
def test_twenty_patients_from_four_clients_are_each_predicted_and_sent_once(start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))
    patients = [clone_patient(phantom, index) for index in range(20)]

    def client(number):  # one client of four, one association per patient
        return [status for patient in patients[number::4] for status in send(node.port, patient, f"TPS{number}")]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        statuses = [status for result in pool.map(client, range(4)) for status in result]
    assert statuses == [0] * sum(map(len, patients))
    uids = [rtstruct_uid(patient) for patient in patients]
    wait_until(lambda: all(state(node, uid) == "sent" for uid in uids), 240, "all 20 patients sent")
    for patient, uid in zip(patients, uids):
        assert [s for s, _ in node.journal.history(uid)].count("predicted") == 1
        assert len(doses_for(listener, patient)) == 1
    assert len(listener.datasets()) == 20
    assert len({ds.SOPInstanceUID for ds in listener.datasets()}) == 20


@pytest.mark.slow
def test_a_node_that_cannot_listen_lets_go_of_its_store_and_another_starts_on_it(start_node):
    """The port taken: start raises, and leaves the store unlocked and no thread behind, so that
    the same process starts a node on the store at once."""
    import socket
    import threading

    taken = socket.socket()
    taken.bind((LOCALHOST, 0))
    taken.listen()
    before = {thread.name for thread in threading.enumerate()}
    try:
        with pytest.raises(OSError):
            start_node(port=taken.getsockname()[1])
    finally:
        taken.close()
    assert not {thread.name for thread in threading.enumerate()} - before
    node = start_node()
    assert node.port > 0


@pytest.mark.slow
def test_a_sop_class_it_does_not_take_is_refused_at_its_presentation_context(start_node, phantom):
    node = start_node()
    image = clone_patient(phantom, 2)[0]
    image.SOPClassUID = image.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.4"  # MR Image Storage
    ae = client_ae("TPS", ["1.2.840.10008.5.1.4.1.1.4"])
    assoc = ae.associate(LOCALHOST, node.port, ae_title="KBP")
    assert assoc.is_established
    try:
        with pytest.raises(ValueError, match="presentation context"):
            assoc.send_c_store(image)
    finally:
        assoc.release()
    assert echo(node.port)
    # it could send nothing: a refusal, journaled (once the node has seen the connection close)
    [row] = wait_until(node.journal.connections_refused, 5, "the refusal journaled")
    assert (row["kind"], row["calling_ae"]) == ("sop class", "TPS")
    assert row["reason"].startswith("nothing sent: this node refused its presentation context(s) for MR Image Storage")


@pytest.mark.slow
def test_an_undecodable_data_set_gets_a_failure_status(start_node, phantom, tmp_path, monkeypatch):
    from pynetdicom import _config
    from pydicom.filewriter import write_file_meta_info

    node = start_node()
    image = clone_patient(phantom, 3)[0]
    path = tmp_path / "broken.dcm"
    with open(path, "wb") as handle:  # a valid file meta, then an element of a VR that does not exist
        handle.write(b"\0" * 128 + b"DICM")
        write_file_meta_info(handle, image.file_meta)
        handle.write(b"\x08\x00\x16\x00ZZ\x04\x001.2\x00")
    monkeypatch.setattr(_config, "STORE_SEND_CHUNKED_DATASET", True)  # send the bytes as they are
    ae = client_ae("TPS", [])
    ae.add_requested_context(image.SOPClassUID, image.file_meta.TransferSyntaxUID)
    assoc = ae.associate(LOCALHOST, node.port, ae_title="KBP")
    try:
        status = assoc.send_c_store(path)
    finally:
        assoc.release()
    assert status.Status == CANNOT_UNDERSTAND and "cannot decode" in status.ErrorComment
    assert not any(node.store.objects.iterdir())
    assert echo(node.port)


@pytest.mark.slow
def test_a_truncated_ct_image_gets_a_failure_status(start_node, phantom):
    node = start_node()
    image = clone_patient(phantom, 4)[0]
    image.PixelData = image.PixelData[:100]
    assert send(node.port, [image]) == [CANNOT_UNDERSTAND]
    assert not any(node.store.objects.iterdir())


@pytest.mark.slow
def test_a_structure_set_in_another_frame_of_reference_fails_its_patient(start_node, phantom):
    node = start_node()
    patient = clone_patient(phantom, 5)
    structures = structure_set_of(patient)
    other = pydicom.uid.generate_uid()
    structures.ReferencedFrameOfReferenceSequence[0].FrameOfReferenceUID = other
    for roi in structures.StructureSetROISequence:
        roi.ReferencedFrameOfReferenceUID = other
    assert set(send(node.port, patient[:-1])) == {0}
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 30, "the patient failed")
    reason = node.journal.patient(uid)["reason"]
    assert reason.startswith("prediction failed:") and "frame of reference" in reason and other in reason
    assert not node.store.result_dir(uid).exists()
    assert echo(node.port)


@pytest.mark.slow
def test_a_series_that_never_comes_fails_after_the_completion_timeout(start_node, phantom):
    node = start_node(completion_timeout=0.5)
    patient = clone_patient(phantom, 6)
    assert send(node.port, [structure_set_of(patient), *ct_of(patient)[:5]]) == [0] * 6
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 10, "the patient failed")
    assert node.journal.patient(uid)["reason"] == (
        f"incomplete after 0.5 s without a new object: 5 of the 16 CT images it names arrived "
        f"(series {ct_of(patient)[0].SeriesInstanceUID}: 5 images here)")


@pytest.mark.slow
def test_a_failing_prediction_fails_its_patient_and_the_next_is_predicted(start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))
    broken, good = clone_patient(phantom, 7), clone_patient(phantom, 8)
    for roi in structure_set_of(broken).StructureSetROISequence:
        roi.ROIName = f"X_{roi.ROIName}"  # no ROI is recognised: no target
    send(node.port, broken[:-1])
    send(node.port, good[:-1])
    wait_until(lambda: state(node, rtstruct_uid(good)) == "sent", 60, "the second patient sent")
    row = node.journal.patient(rtstruct_uid(broken))
    assert row["state"] == FAILED
    assert row["reason"].startswith("prediction failed:") and "no ROI for PTV" in row["reason"]
    assert len(listener.datasets()) == 1


@pytest.mark.slow
def test_a_client_that_drops_mid_association_loses_nothing(start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))
    patient = clone_patient(phantom, 9)
    assoc = client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP")
    for dataset in patient[:10]:
        assert assoc.send_c_store(dataset).Status == 0
    assoc.dul.socket.socket.shutdown(socket.SHUT_RDWR)  # the connection drops: no release, no abort
    assoc.abort()
    assert echo(node.port)
    assert send(node.port, patient) == [0] * len(patient)  # the planning system sends the patient again
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient sent")
    assert len(doses_for(listener, patient)) == 1


@pytest.mark.slow
def test_a_destination_down_then_up_gets_the_rt_dose_later(start_node, phantom):
    later = Listener(port=free_port())
    node = start_node(send_to=parse_destination(later.destination), send_backoff=0.1)
    patient = clone_patient(phantom, 10)
    send(node.port, patient)
    uid = rtstruct_uid(patient)
    wait_until(lambda: len(node.journal.sends(uid)) >= 2, 60, "two failed attempts")
    assert state(node, uid) == "predicted"
    later.start()
    try:
        wait_until(lambda: state(node, uid) == "sent", 30, "sent once the destination is up")
        outcomes = [row["outcome"] for row in node.journal.sends(uid)]
        assert outcomes[-1] == OK and set(outcomes[:-1]) == {FAILED_SEND}
        assert node.journal.sends(uid)[0]["detail"] == f"{later.destination} cannot be reached (no connection)"
        assert len(later.datasets()) == 1
    finally:
        later.stop()


@pytest.mark.slow
def test_a_destination_that_stays_down_fails_the_patient_when_its_retry_window_ends(start_node, phantom):
    node = start_node(send_to=parse_destination(f"PLANNING@{LOCALHOST}:{free_port()}"), send_retry_for=0.5,
                      send_backoff=0.05)
    patient = clone_patient(phantom, 11)
    send(node.port, patient)
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 60, "the patient failed")
    sends = node.journal.sends(uid)
    assert len(sends) >= 3 and sends[-1]["started"] - sends[0]["started"] == pytest.approx(0.5, abs=0.25)
    reason = node.journal.patient(uid)["reason"]
    assert reason.startswith("not sent to PLANNING@") and f"within 0.5 s of its first failed attempt ({len(sends)} " \
        f"attempts; --send-retry-hours)" in reason
    assert (node.store.result_dir(uid) / "RD.dcm").is_file()  # the prediction stays in the store


@pytest.mark.slow
def test_below_the_free_disk_floor_objects_are_refused_out_of_resources(start_node, phantom):
    node = start_node(min_free_bytes=2**62)
    patient = clone_patient(phantom, 12)
    assert send(node.port, patient[:3]) == [OUT_OF_RESOURCES] * 3
    assert not any(node.store.objects.iterdir()) and not any(node.store.incoming.iterdir())
    assert node.journal.summary()["objects"] == {}
    assert echo(node.port)


@pytest.mark.slow
def test_an_object_over_the_size_limit_is_refused_out_of_resources(start_node, phantom):
    node = start_node(max_object_bytes=1000)
    assert send(node.port, clone_patient(phantom, 13)[:1]) == [OUT_OF_RESOURCES]
    assert not any(node.store.objects.iterdir())


@pytest.mark.slow
def test_a_calling_ae_title_not_allowed_is_rejected_at_association(start_node, caplog):
    node = start_node(allow=("TPS", "PACS"))
    assert echo(node.port, calling="PACS")
    assoc = client_ae("INTRUDER").associate(LOCALHOST, node.port, ae_title="KBP")
    assert assoc.is_rejected
    assoc = client_ae("TPS").associate(LOCALHOST, node.port, ae_title="OTHER")  # not this node's AE title
    assert assoc.is_rejected
    wait_until(lambda: len(node.journal.connections_refused()) == 2, 5, "both refusals logged and journaled")
    refusals = [r.getMessage() for r in caplog.records if r.name == "provided_code.apps.node.server" and "Refused" in r.msg]
    assert len(refusals) == 2 and "calling AE title 'INTRUDER' is not in --allow" in refusals[0]
    assert "called AE title 'OTHER' is not 'KBP'" in refusals[1]
    assert echo(node.port, calling="TPS")
    # journaled: IT asks the journal whether the planning system tried
    rows = [(row["kind"], row["peer"], row["calling_ae"], row["called_ae"], row["reason"])
            for row in node.journal.connections_refused()]
    assert rows == [("association", LOCALHOST, "INTRUDER", "KBP", "calling AE title 'INTRUDER' is not in --allow"),
                    ("association", LOCALHOST, "TPS", "OTHER", "called AE title 'OTHER' is not 'KBP'")]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Invalid value for VR UI:UserWarning")  # pydicom again, as the client encodes it
@pytest.mark.parametrize("keyword", ["SeriesInstanceUID", "SOPInstanceUID"])
def test_a_uid_with_path_characters_writes_nothing_outside_the_store(start_node, phantom, tmp_path, keyword):
    node = start_node()
    image = clone_patient(phantom, 14)[0]
    with pytest.warns(UserWarning, match="Invalid value for VR UI"):
        setattr(image, keyword, "../../../uid-escape-7f3a")  # a name no test's folder has
    if keyword == "SOPInstanceUID":
        image.file_meta.MediaStorageSOPInstanceUID = image.SOPInstanceUID
    assert send(node.port, [image]) == [CANNOT_UNDERSTAND]
    assert [p for p in tmp_path.parent.rglob("*uid-escape-7f3a*")] == []
    assert not any(node.store.objects.iterdir())


@pytest.mark.slow
def test_a_patient_whose_send_attempts_ran_out_is_sent_once_when_its_objects_come_again(start_node, phantom):
    later = Listener(port=free_port())
    settings = {"send_to": parse_destination(later.destination), "send_retry_for": 0.1, "send_backoff": 0.05}
    node = start_node(**settings)
    patient = clone_patient(phantom, 22)
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 60, "the patient failed: its sends ran out")
    later.start()
    try:
        assert send(node.port, [structure_set_of(patient)]) == [0]  # the planning system sends it again
        assert send(node.port, ct_of(patient)[:2]) == [0, 0]  # and CT images of it
        wait_until(lambda: doses_for(later, patient), 30, "the RT Dose sent once its objects came again")
        wait_until(lambda: state(node, uid) == "sent", 10, "the patient sent")
        node.stop()
        node = start_node(**settings)  # restarted on the same store
        wait_until(lambda: node.sends is not None and not node.sends.queued(), 10, "nothing left to send")
        assert state(node, uid) == "sent" and len(doses_for(later, patient)) == 1
        outcomes = [row["outcome"] for row in node.journal.sends(uid)]
        assert outcomes[-1] == OK and len(outcomes) >= 3 and set(outcomes[:-1]) == {FAILED_SEND}
    finally:
        later.stop()


@pytest.mark.slow
def test_a_destination_down_for_more_than_ten_attempts_gets_the_rt_dose_once_it_is_back(start_node, phantom,
                                                                                          tmp_path):
    """As a mail server: the sends go on with back-off (a day by default), --status shows what waits
    and when it next tries, and the RT Dose goes out once the destination is back, once, unasked."""
    later = Listener(port=free_port())
    node = start_node(send_to=parse_destination(later.destination), send_backoff=0.02, send_backoff_max=0.05)
    patient = clone_patient(phantom, 37)
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: len(node.journal.sends(uid)) >= 12, 60, "12 failed attempts (10 used to be the most)")
    assert state(node, uid) == "predicted"
    status = CliRunner().invoke(main, ["serve", "--status", "--store", str(tmp_path / "store")])
    assert "Sends waiting: 1 (next attempt, attempts so far, gives up)" in status.output
    [line] = [line for line in status.output.splitlines() if line.startswith(f"  PHANTOM37 {uid}: next ")]
    assert " attempt(s), gives up " in line and line.endswith(f"; last: {later.destination} cannot be reached "
                                                              f"(no connection)")
    later.start()
    try:
        wait_until(lambda: state(node, uid) == "sent", 30, "sent once the destination is back")
        time.sleep(0.3)  # a second send would be due by now
        assert len(doses_for(later, patient)) == 1
        assert [row["outcome"] for row in node.journal.sends(uid)].count(OK) == 1
        assert node.sends.queued() == {}
    finally:
        later.stop()


@pytest.mark.slow
def test_it_pushes_a_patient_whose_sends_gave_up_and_it_is_sent_once(start_node, phantom, tmp_path):
    later = Listener(port=free_port())
    node = start_node(send_to=parse_destination(later.destination), send_retry_for=0.2, send_backoff=0.05)
    patient = clone_patient(phantom, 38)
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 60, "the patient failed: its sends gave up")
    later.start()
    try:
        pushed = CliRunner().invoke(main, ["serve", "--resend", uid, "--store", str(tmp_path / "store")])
        assert pushed.exit_code == 0, pushed.output
        assert pushed.output == f"Patient PHANTOM38 (structure set {uid}): its sends had given up: queued to send now\n"
        wait_until(lambda: state(node, uid) == "sent", 10, "sent within a second of the push")
        again = CliRunner().invoke(main, ["serve", "--resend", "PHANTOM38", "--store", str(tmp_path / "store")])
        assert again.exit_code == 1 and "already sent (to PLANNING@" in again.output
        time.sleep(1.5)  # the send thread has looked at the journal again
        assert len(doses_for(later, patient)) == 1
    finally:
        later.stop()
    unknown = CliRunner().invoke(main, ["serve", "--resend", "NOONE", "--store", str(tmp_path / "store")])
    assert unknown.exit_code == 1 and "No patient with structure set UID or PatientID 'NOONE'" in unknown.output


@pytest.mark.slow
@requires_other_host
def test_a_client_is_served_while_fifty_idle_connections_and_ten_idle_associations_are_held(
        start_node, listener, phantom):
    node = start_node(send_to=parse_destination(listener.destination))  # the limits' defaults
    idle = [socket.create_connection((LOCALHOST, node.port)) for _ in range(50)]  # connected, never a word
    # held by 5 systems at another address (at most --max-per-caller's 5 each, --max-per-address's 10 in all), 2 each
    held = [associate_from(OTHER_HOST, node.port, f"TPS{k % 5}") for k in range(10)]
    try:
        assert all(assoc.is_established for assoc in held)
        assert echo(node.port)
        patient = clone_patient(phantom, 23)
        assert send(node.port, patient) == [0] * len(patient)
        wait_until(lambda: state(node, rtstruct_uid(patient)) == "sent", 60, "the patient predicted and sent")
        assert len(doses_for(listener, patient)) == 1
    finally:
        for assoc in held:
            assoc.release()
        for connection in idle:
            connection.close()


def _cpu_seconds(threads) -> float:
    """The processor time the threads have used, each by its own clock (a thread that ended: none)."""
    total = 0.0
    for thread in threads:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError):
            pass
    return total


@pytest.mark.slow
@requires_other_host
def test_ten_idle_associations_cost_the_node_under_five_percent_of_a_core(start_node):
    """Each association the node accepts has two threads (pynetdicom's DUL and association); idle,
    they wait on the socket. Measured by the node's threads' own clocks (those two of each
    association, its accept loop, its workers), not the test's clients'. (What pynetdicom's accept
    loop costs in a process holding much more, its garbage collection every 6 s, scripts/bench_node.py
    measures: a tenth of a core there, under a hundredth here.)"""
    node = start_node()
    held = [associate_from(OTHER_HOST, node.port, f"TPS{k % 5}") for k in range(10)]  # another system's 10
    try:
        assert all(assoc.is_established for assoc in held)
        accepted = wait_until(lambda: len(node._server.active_associations) == 10 and node._server.active_associations,
                              5, "the 10 associations accepted")
        threads = [thread for assoc in accepted for thread in (assoc, assoc.dul)] + [
            thread for thread in threading.enumerate() if thread.name.startswith("node-")]
        before, start = _cpu_seconds(threads), time.monotonic()
        time.sleep(2.0)
        cost = (_cpu_seconds(threads) - before) / (time.monotonic() - start)
        assert cost < 0.05, f"10 idle associations took {cost:.1%} of a core"
        assert echo(node.port)  # and they hold up no one
    finally:
        for assoc in held:
            assoc.release()


@pytest.mark.slow
def test_pynetdicom_calls_the_waiting_hooks_of_an_idle_association(start_node, monkeypatch):
    """reactor.py changes only where pynetdicom's loops wait: its DUL loop's ``_is_transport_event``
    and its association loop's ``_reactor_checkpoint.wait()``. Both entered, a few times a second
    (not 1,000): a pynetdicom that stopped calling either fails here (and the idle test)."""
    entered = {reactor.WaitingDUL: 0, reactor.WaitingCheckpoint: 0}
    for cls in entered:
        def counted(self, _original=cls.await_activity, _cls=cls):
            entered[_cls] += 1
            return _original(self)
        monkeypatch.setattr(cls, "await_activity", counted)
    node = start_node()
    held = client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP")
    try:
        assert held.is_established
        [accepted] = wait_until(lambda: node._server.active_associations, 5, "the association accepted")
        assert type(accepted.dul) is reactor.WaitingDUL and accepted.dul._run_loop_delay == 0
        assert type(accepted._reactor_checkpoint) is reactor.WaitingCheckpoint
        time.sleep(0.5)
        before = dict(entered)
        time.sleep(2.0)
        turns = {cls.__name__: entered[cls] - before[cls] for cls in entered}
        assert all(1 <= n <= 20 for n in turns.values()), turns
    finally:
        held.release()
    accepted.join(5)
    assert not accepted.is_alive() and accepted.dul._wake_in.fileno() == -1  # its wake-up sockets closed


@pytest.mark.slow
def test_a_pynetdicom_without_a_hook_fails_the_node_at_start(start_node, monkeypatch):
    from pynetdicom.dul import DULServiceProvider
    monkeypatch.delattr(DULServiceProvider, "_is_transport_event")
    with pytest.raises(RuntimeError, match="_is_transport_event"):
        start_node()


@pytest.mark.slow
def test_one_caller_holding_its_allowance_locks_out_no_one_else(start_node):
    """--max-per-caller: a calling AE title at one address gets that many associations at once; one
    more is rejected (transient, local limit exceeded) and journaled, while another caller is served."""
    node = start_node(max_associations=4, max_per_caller=2)
    held = [client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP") for _ in range(2)]
    try:
        assert all(assoc.is_established for assoc in held)
        extra = client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP")
        assert extra.is_rejected
        answer = extra.acceptor.primitive
        assert (answer.result, answer.diagnostic) == (0x02, 0x02)  # transient, local limit exceeded
        started = time.monotonic()
        assert echo(node.port, calling="PACS")
        assert time.monotonic() - started < 1.0
        [row] = node.journal.connections_refused()
        assert (row["kind"], row["calling_ae"], row["peer"]) == ("limit", "TPS", LOCALHOST)
        assert row["reason"] == f"'TPS' at {LOCALHOST} holds 2 associations, the most --max-per-caller allows"
    finally:
        for assoc in held:
            assoc.release()
    wait_until(lambda: echo(node.port), 10, "TPS served again once it let go")


@pytest.mark.slow
@requires_other_host
def test_one_address_under_four_ae_titles_takes_its_allowance_and_the_planning_system_is_served(start_node, phantom):
    """--max-per-address (10 by default): one host under four AE titles, each within --max-per-caller
    (5), gets 10 of the 20 --max-associations; the others are rejected (transient) and journaled,
    and the planning system, at its own address, is served."""
    node = start_node()  # the limits' defaults
    held = [associate_from(OTHER_HOST, node.port, f"ROGUE{k % 4}") for k in range(20)]
    try:
        established = [assoc for assoc in held if assoc.is_established]
        assert len(established) == 10 and sum(assoc.is_rejected for assoc in held) == 10
        answers = {(a.acceptor.primitive.result, a.acceptor.primitive.diagnostic) for a in held if a.is_rejected}
        assert answers == {(0x02, 0x02)}  # transient, local limit exceeded
        assert echo(node.port, calling="TPS")
        patient = clone_patient(phantom, 39)
        assert send(node.port, ct_of(patient)[:2]) == [0, 0]
        rows = node.journal.connections_refused()
        assert {(row["kind"], row["peer"], row["reason"]) for row in rows} == {
            ("limit", OTHER_HOST, f"{OTHER_HOST} holds 10 associations, the most --max-per-address allows (whatever "
                                  f"their calling AE titles)")}
        assert sum(row["times"] for row in rows) == 10
    finally:
        for assoc in held:
            if assoc.is_established:
                assoc.release()


@pytest.mark.slow
def test_a_client_that_keeps_reconnecting_silently_is_one_line_and_a_summary(start_node, caplog):
    caplog.set_level(logging.INFO, logger="provided_code.apps.node")
    node = start_node(acse_timeout=0.1)
    for _ in range(8):  # a client connecting, saying nothing, reconnecting once closed
        with socket.create_connection((LOCALHOST, node.port)) as silent:
            silent.settimeout(10)
            assert silent.recv(1) == b""  # closed by the node
    node.stop()  # its windows closed: the repeats summed up
    lines = [r.getMessage() for r in caplog.records if "no association request" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith(f"Closed a connection from {LOCALHOST}:")
    assert lines[1] == (f"Closed a connection from {LOCALHOST}: no association request within 0.1 s (--acse-timeout): "
                        f"7 more time(s) within 60 s")


@pytest.mark.slow
def test_an_association_over_the_limit_is_refused_for_load_with_its_address(start_node, caplog):
    node = start_node(max_associations=2)
    held = [client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP") for _ in range(2)]
    try:
        third = client_ae("TPS").associate(LOCALHOST, node.port, ae_title="KBP")
        assert all(assoc.is_established for assoc in held) and third.is_rejected
        answer = third.acceptor.primitive
        assert (answer.result, answer.diagnostic) == (0x02, 0x02)  # transient, local limit exceeded
    finally:
        for assoc in held:
            assoc.release()
    [refusal] = [r.getMessage() for r in caplog.records if "Refused an association" in r.getMessage()]
    assert refusal.startswith(f"Refused an association from {LOCALHOST}:") and refusal.endswith(
        ": 2 associations open, the most --max-associations allows")
    # a released association's thread ends a moment after the release returns: until then it counts
    wait_until(lambda: echo(node.port), 10, "an echo served once the held associations were released")


@pytest.mark.slow
def test_a_connection_that_requests_no_association_in_time_is_closed(start_node, caplog):
    caplog.set_level(logging.INFO, logger="provided_code.apps.node.server")
    node = start_node(acse_timeout=0.5)
    with socket.create_connection((LOCALHOST, node.port)) as silent:
        silent.settimeout(10)
        assert silent.recv(1) == b""  # closed by the node
    assert any("no association request within 0.5 s" in r.getMessage() for r in caplog.records)
    assert echo(node.port)


@pytest.mark.slow
def test_beyond_the_pending_limit_the_oldest_waiting_connection_is_closed(start_node, caplog):
    node = start_node(max_pending=3)
    first = socket.create_connection((LOCALHOST, node.port))
    wait_until(lambda: len(node._server._waiting) == 1, 5, "the first connection waiting")
    others = [socket.create_connection((LOCALHOST, node.port)) for _ in range(3)]
    try:
        first.settimeout(10)
        assert first.recv(1) == b""  # the oldest, closed to make room
        assert any("--max-pending" in r.getMessage() for r in caplog.records)
        assert echo(node.port)
    finally:
        for connection in [first, *others]:
            connection.close()


@pytest.mark.slow
def test_a_refused_ct_image_is_journaled_with_its_patient_and_named_in_the_patients_failure(start_node, phantom,
                                                                                             caplog):
    node = start_node(completion_timeout=0.5)
    patient = clone_patient(phantom, 24)
    broken = ct_of(patient)[3]
    expected = len(broken.PixelData)
    broken.PixelData = broken.PixelData[:100]
    assert send(node.port, patient[:-1]).count(CANNOT_UNDERSTAND) == 1
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == FAILED, 10, "the patient failed")
    refused = f"CT {broken.SOPInstanceUID} (status 0xC000: pixel data of 100 bytes, expected {expected})"
    assert node.journal.patient(uid)["reason"].endswith(
        f"15 of the 16 CT images it names arrived (series {broken.SeriesInstanceUID}: 15 images here); 1 refused: "
        f"{refused}")
    [row] = node.journal.refusals()
    assert (row["patient_id"], row["series_uid"], row["modality"], row["calling_ae"]) == (
        "PHANTOM24", broken.SeriesInstanceUID, "CT", "TPS")
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Refused CT")]
    assert line == (f"Refused CT {broken.SOPInstanceUID} of patient PHANTOM24 from TPS, status 0xC000: pixel data of "
                    f"100 bytes, expected {expected}")


@pytest.mark.slow
def test_the_import_warnings_reach_the_log_and_the_patients_journal_entry(start_node, phantom, caplog):
    node = start_node()
    patient = clone_patient(phantom, 25)
    larynx = next(roi for roi in structure_set_of(patient).StructureSetROISequence if roi.ROIName == "Larynx")
    larynx.ROIName = "Kehlkopf"  # no name the site knows: the import goes on without it, and says so
    send(node.port, patient[:-1])
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "predicted", 60, "the patient predicted")
    row = node.journal.patient(uid)
    assert "missing: Larynx" in row["warnings"].splitlines() and "import warning" in row["reason"]
    lines = [r.getMessage() for r in caplog.records]
    assert f"Patient PHANTOM25 (structure set {uid}), import: missing: Larynx" in lines


@pytest.mark.slow
def test_the_node_predicts_with_the_model_it_loaded_and_holds_its_folder_against_training(
        start_node, listener, phantom, tiny_model, tmp_path):
    from provided_code.errors import RunLockedError
    from provided_code.run_folder import RunFolder

    served = tmp_path / "results" / "m"
    shutil.copytree(tiny_model, served)
    with ModelPredictor(served) as predictor:
        with pytest.raises(RunLockedError, match=rf"in use by another run \(pid {os.getpid()} .*a DICOM node"):
            RunFolder(served).lock("training").__enter__()
        shutil.rmtree(served / "models")  # what a training run started meanwhile would replace
        node = start_node(predict=predictor, send_to=parse_destination(listener.destination))
        patient = clone_patient(phantom, 26)
        send(node.port, patient[:-1])
        wait_until(lambda: state(node, rtstruct_uid(patient)) == "sent", 60, "the patient predicted and sent")
        node.stop()
    with RunFolder(served).lock("training"):  # released with the predictor
        pass


@pytest.mark.slow
def test_a_node_serving_a_cross_validated_model_predicts_with_its_folds_and_holds_each(
        start_node, listener, phantom, cv_model, tmp_path):
    """The folds of a cross-validated model serve together (the deployed ensemble): each fold's folder
    is held against training while the node serves, and the patient's RT Dose says so."""
    from provided_code.errors import RunLockedError
    from provided_code.run_folder import RunFolder

    served = tmp_path / "results" / "cv"
    shutil.copytree(cv_model, served)
    with ModelPredictor(served) as predictor:
        assert predictor.model.averages and [m.name for m in predictor.model.members] == ["cv-fold-1", "cv-fold-2"]
        assert predictor.model.label == "2 folds"
        for fold in ("fold-1", "fold-2"):
            with pytest.raises(RunLockedError, match=r"a DICOM node"):
                RunFolder(served / fold).lock("training").__enter__()
        node = start_node(predict=predictor, send_to=parse_destination(listener.destination))
        patient = clone_patient(phantom, 28)
        send(node.port, patient[:-1])
        wait_until(lambda: state(node, rtstruct_uid(patient)) == "sent", 60, "the patient predicted and sent")
        node.stop()
    doses = [dataset for _, dataset in listener.received if dataset.Modality == "RTDOSE"]
    assert len(doses) == 1 and doses[0].SeriesDescription.endswith("cv 2 folds")


@requires_sample
@pytest.mark.slow
def test_a_real_patient_without_ptv63_is_served_with_default_flags(start_node, listener, tmp_path):
    """OpenKBP's pt_10 has PTV70 and PTV56 and no PTV63 (as 109 of the challenge's 200 training
    patients), sent as a planning system exports it: the node predicts it with default flags, its
    journal keeps the import's warning, and its RT Dose comes back."""
    from provided_code.data.csv_io import read_patient
    from provided_code.sites import openkbp
    from tests.kit.repo import SAMPLE_DIR
    from tests.kit.synthetic import write_patient

    source = read_patient(SAMPLE_DIR / "train-pats" / "pt_10", site=openkbp())
    names = openkbp().names
    masks = {name: (source.structure_masks >> bit) & 1 == 1 for bit, name in enumerate(names)}
    masks = {name: mask for name, mask in masks.items() if mask.any()}
    assert "PTV63" not in masks
    masks["BODY"] = source.possible_dose_mask
    clinic = write_patient(tmp_path / "clinic", source.ct, masks, source.voxel_dimensions, None, factor=1)
    node = start_node(send_to=parse_destination(listener.destination))
    patient = read_patient_files(clinic.rtstruct.parent)
    assert set(send(node.port, patient)) == {0}
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 120, "the real patient predicted and sent")
    doses = [dataset for _, dataset in listener.received if dataset.Modality == "RTDOSE"]
    assert len(doses) == 1 and doses[0].FrameOfReferenceUID == clinic.frame_of_reference_uid
    warnings = Journal(tmp_path / "store" / "journal.sqlite").patient(uid)["warnings"]
    assert "PTV63: no ROI (optional for site openkbp)" in warnings
@pytest.mark.slow
def test_a_patient_outside_the_training_cohort_is_flagged_in_the_log_the_journal_the_status_and_the_rt_dose(
        start_node, listener, phantom, commissioned_cv, tmp_path, caplog):
    """A commissioned model's node: the patient's in-distribution check (its p-value below the
    cohort's alpha, made so here: alpha 0.99, every training score -1) goes to a warning with its reasons, the patient's journal entry
    and --status, and the RT Dose sent says "Outside the training cohort" first."""
    import json

    from tests.kit.runs import rewrite_commissioning_file

    served = tmp_path / "results" / "cv"
    shutil.copytree(commissioned_cv, served)
    cohort = json.loads((served / "commissioning" / "cohort.json").read_text())
    rewrite_commissioning_file(served, "cohort.json", {**cohort, "alpha": 0.99, "scores": [-1.0] * len(cohort["scores"])})
    with ModelPredictor(served, band=0.5) as predictor:
        assert predictor.trust.bands is not None and predictor.trust.cohort["alpha"] == 0.99
        node = start_node(predict=predictor, send_to=parse_destination(listener.destination))
        patient = clone_patient(phantom, 29)
        send(node.port, patient[:-1])
        uid = rtstruct_uid(patient)
        wait_until(lambda: state(node, uid) == "sent", 60, "the patient predicted and sent")
        trust, history = json.loads(node.journal.patient(uid)["trust"]), dict(node.journal.history(uid))
        node.stop()
    assert trust["band"] == 0.5 and trust["inside"] is False and trust["p_value"] == 1 / 5 and trust["alpha"] == 0.99
    assert history["predicted"].endswith("; 50 % bands; outside the training cohort")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"Patient PHANTOM29 (structure set {uid}): Outside the training cohort (p = 0.200, alpha 0.99" \
           in "\n".join(warned)
    status = CliRunner().invoke(main, ["serve", "--status", "--store", str(tmp_path / "store")])
    assert status.exit_code == 0, status.output
    assert "Predictions outside the training cohort: 1 of the 1 checked" in status.output
    lines = status.output.splitlines()
    at = next(k for k, line in enumerate(lines) if f"PHANTOM29 sent {uid}" in line)
    assert lines[at + 1].startswith("    Outside the training cohort (p = 0.200, alpha 0.99; flagged by ")
    doses = [dataset for _, dataset in listener.received if dataset.Modality == "RTDOSE"]
    assert [d.SeriesDescription for d in doses] == ["Outside the training cohort: predicted dose, cv 2 folds"]


@pytest.mark.slow
def test_the_store_is_the_owners_only_whatever_the_umask(start_node, listener, phantom, tmp_path):
    umask = os.umask(0)
    try:
        node = start_node(send_to=parse_destination(listener.destination))
        patient = clone_patient(phantom, 27)
        send(node.port, patient)
        wait_until(lambda: state(node, rtstruct_uid(patient)) == "sent", 60, "the patient predicted and sent")
    finally:
        os.umask(umask)
    store = tmp_path / "store"
    modes = {path: path.stat().st_mode & 0o777 for path in [store, *store.rglob("*")]}
    assert {mode for path, mode in modes.items() if path.is_dir()} == {0o700}
    assert {mode for path, mode in modes.items() if path.is_file()} == {0o600}
    assert len(modes) > 40  # objects, results, the journal


@pytest.mark.slow
def test_a_full_disk_is_one_short_log_line(start_node, phantom, caplog, monkeypatch):
    node = start_node()
    image = clone_patient(phantom, 28)[0]

    def full(series, instance, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(node.store.incoming / f"{instance}.1234.abcd.tmp"))

    monkeypatch.setattr(node.store, "write_object", full)
    assert send(node.port, [image]) == [OUT_OF_RESOURCES]
    [record] = [r for r in caplog.records if r.getMessage().startswith("Refused")]
    assert record.exc_info is None and record.getMessage() == (
        f"Refused CT {image.SOPInstanceUID} of patient PHANTOM28 from TPS, status 0xA700: cannot write the object: "
        f"[Errno 28] No space left on device: {image.SOPInstanceUID}.1234.abcd.tmp")


@pytest.mark.slow
def test_a_prediction_failing_with_a_traceback_in_its_message_is_one_log_line(start_node, phantom, caplog):
    def failing(ct_dir, rtstruct, out_dir, rtdose=None):
        raise RuntimeError("Graph execution error:\n\nDetected at node 'conv3d' defined at (most recent call last):\n"
                           '  File "train.py", line 1, in <module>\n' * 20)

    failing.rtdose_file = "RD.dcm"
    node = start_node(predict=failing)
    patient = clone_patient(phantom, 29)
    send(node.port, patient[:-1])
    wait_until(lambda: state(node, rtstruct_uid(patient)) == FAILED, 30, "the patient failed")
    reason = "prediction failed: RuntimeError: Graph execution error:"
    assert node.journal.patient(rtstruct_uid(patient))["reason"] == reason
    # the journal says FAILED an instant before the worker logs it
    wait_until(lambda: [r for r in caplog.records if "failed:" in r.getMessage()], 10, "the failure logged")
    [record] = [r for r in caplog.records if "failed:" in r.getMessage()]
    assert record.getMessage() == f"Patient PHANTOM29 (structure set {rtstruct_uid(patient)}) failed: {reason}"


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key (by the openssl command)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a test certificate")
    cert, key = folder / "node.pem", folder / "node.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.slow
def test_with_certificates_it_speaks_tls_only_and_a_silent_client_holds_no_one_up(start_node, tmp_path):
    cert, key = _certificate(tmp_path)
    node = start_node(tls_cert=cert, tls_key=key, network_timeout=5)
    client = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection((LOCALHOST, node.port)):  # connected, never says a word
        assert echo(node.port, tls=(client, "localhost"))
    assert not echo(node.port, timeout=2)  # plain DICOM on the TLS port


@pytest.mark.slow
def test_with_a_ca_clients_need_a_certificate_and_the_rt_dose_goes_back_over_tls(start_node, phantom, tmp_path):
    cert, key = _certificate(tmp_path)  # self-signed: its own CA, for the node, the client and the listener
    planning = Listener(ssl_context=server_ssl_context(cert, key, cert)).start()
    try:
        node = start_node(tls_cert=cert, tls_key=key, tls_ca=cert, send_to=parse_destination(planning.destination),
                          network_timeout=5)
        anonymous = ssl.create_default_context(cafile=str(cert))
        assert not echo(node.port, tls=(anonymous, "localhost"), timeout=2)
        known = ssl.create_default_context(cafile=str(cert))
        known.load_cert_chain(str(cert), str(key))
        patient = clone_patient(phantom, 19)
        assert send(node.port, patient, tls=(known, "localhost")) == [0] * len(patient)
        wait_until(lambda: state(node, rtstruct_uid(patient)) == "sent", 60, "the patient sent over TLS")
        assert len(doses_for(planning, patient)) == 1
    finally:
        planning.stop()


def _rogue_client(folder: Path) -> ssl.SSLContext:
    folder.mkdir()
    cert, key = _certificate(folder)  # another self-signed certificate: no CA the node knows signed it
    context = ssl.create_default_context(cafile=str(cert))
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(str(cert), str(key))
    return context


def _tls_1_1_client(folder: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 offers TLS 1.1 at security level 0 only
    with pytest.warns(DeprecationWarning):
        context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
    return context


@pytest.mark.parametrize("client, reason", [
    ("no certificate", "the client presented no certificate (--tls-ca requires one) (PEER_DID_NOT_RETURN_A_CERTIFICATE)"),
    ("rogue CA", "the client's certificate is not signed by --tls-ca (CERTIFICATE_VERIFY_FAILED)"),
    ("TLS 1.1", "the client offered only TLS older than 1.2 (UNSUPPORTED_PROTOCOL)"),
    ("plain TCP", "the client spoke no TLS (plain DICOM on the TLS port?) ("),
])
@pytest.mark.slow
def test_a_failed_tls_handshake_is_journaled_with_what_failed(start_node, tmp_path, caplog, client, reason):
    cert, key = _certificate(tmp_path)
    node = start_node(tls_cert=cert, tls_key=key, tls_ca=cert, network_timeout=5)
    if client == "no certificate":
        tls = (ssl.create_default_context(cafile=str(cert)), "localhost")
    elif client == "rogue CA":
        tls = (_rogue_client(tmp_path / "rogue"), "localhost")
    elif client == "TLS 1.1":
        tls = (_tls_1_1_client(tmp_path), "localhost")
    else:
        tls = None
    assert not echo(node.port, tls=tls, timeout=2)
    [row] = wait_until(node.journal.connections_refused, 5, "the refusal journaled")
    assert (row["kind"], row["peer"]) == ("tls", LOCALHOST) and row["reason"].startswith(reason)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TLS handshake with")]
    assert line.startswith(f"TLS handshake with {LOCALHOST}:") and line.endswith(f" failed: {row['reason']}")


@pytest.mark.slow
def test_a_second_node_on_the_same_store_is_refused(start_node):
    from provided_code.errors import RunLockedError

    start_node()
    with pytest.raises(RunLockedError, match="is in use by another run .*a DICOM node.*give this node another --store"):
        start_node()


@pytest.mark.slow
def test_status_prints_the_journal(start_node, phantom, tmp_path):
    node = start_node(completion_timeout=0.3)
    patient = clone_patient(phantom, 15)
    send(node.port, [structure_set_of(patient)])
    wait_until(lambda: state(node, rtstruct_uid(patient)) == FAILED, 10, "the patient failed")
    result = CliRunner().invoke(main, ["serve", "--status", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "Objects received: 1 (RTSTRUCT 1)" in result.output and "Patients: 1, failed 1" in result.output
    assert f"PHANTOM15 failed {rtstruct_uid(patient)}: incomplete after 0.3 s" in result.output
    missing = CliRunner().invoke(main, ["serve", "--status", "--store", str(tmp_path / "nothing")])
    assert missing.exit_code == 1 and "no journal here" in missing.output


def test_serve_help_loads_neither_tensorflow_nor_the_node():
    probe = ("import sys\nfrom provided_code.apps.dicom_cli import main\n"
             "try:\n    main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('tensorflow', 'keras', 'pynetdicom', 'provided_code.apps.node.server') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "--send-to TEXT" in result.stdout and "--completion-timeout" in result.stdout
    assert "--send-retry-hours" in result.stdout and "--resend" in result.stdout
    assert all(f"--{option}" in result.stdout for option in ("max-associations", "max-per-caller", "max-per-address",
                                                            "max-pending", "acse-timeout", "network-timeout"))
    assert "LOADED []" in result.stdout


# DCMTK, a client no one here wrote


def _dcmtk(*args) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@requires_dcmtk
def test_dcmtk_echoscu_is_answered(start_node):
    node = start_node()
    result = _dcmtk("echoscu", "-aet", "TPS", "-aec", "KBP", LOCALHOST, str(node.port))
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@requires_dcmtk
def test_dcmtk_storescu_sends_a_whole_patient_and_the_rt_dose_comes_back(start_node, listener, phantom, tmp_path):
    node = start_node(send_to=parse_destination(listener.destination))
    patient = clone_patient(phantom, 16)
    folder = write_files(patient, tmp_path / "export")
    result = _dcmtk("storescu", "-aet", "TPS", "-aec", "KBP", "+sd", LOCALHOST, str(node.port), str(folder))
    assert result.returncode == 0, result.stderr
    uid = rtstruct_uid(patient)
    wait_until(lambda: state(node, uid) == "sent", 60, "the patient sent")
    [dose] = doses_for(listener, patient)
    assert dose.NumberOfFrames == len(ct_of(patient)) and (dose.Rows, dose.Columns) == (32, 32)


@pytest.mark.slow
@requires_dcmtk
def test_dcmtk_storescus_ordinary_proposals_warn_no_one_and_are_said_once(start_node, phantom, tmp_path, caplog):
    """storescu proposes some 120 storage classes; a send that stores what the node takes used none of
    the others: no warning, one line at info for the caller, not repeated."""
    caplog.set_level(logging.INFO, logger="provided_code.apps.node")
    node = start_node()
    for index in (35, 36):
        folder = write_files(ct_of(clone_patient(phantom, index))[:2], tmp_path / f"export-{index}")
        result = _dcmtk("storescu", "-aet", "TPS", "-aec", "KBP", "+sd", LOCALHOST, str(node.port), str(folder))
        assert result.returncode == 0, result.stderr
    wait_until(lambda: not node._server.active_associations, 10, "both associations ended")
    assert node.journal.connections_refused() == []
    node.stop()
    records = [r for r in caplog.records if r.name.startswith("provided_code.apps.node")]
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    [line] = [r.getMessage() for r in records if "proposed" in r.getMessage()]
    assert line.startswith(f"Association from TPS at {LOCALHOST}:") and " this node does not take, unused (" in line
    assert len(line) < 300


@pytest.mark.slow
@requires_dcmtk
def test_dcmtk_echoscu_with_an_ae_title_not_allowed_is_rejected(start_node):
    node = start_node(allow=("TPS",))
    result = _dcmtk("echoscu", "-aet", "INTRUDER", "-aec", "KBP", LOCALHOST, str(node.port))
    assert result.returncode != 0 and "Rejected" in result.stderr + result.stdout


# The node as a process, killed


def _serve(model_dir, store, port, destination, hold=None, *options):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = open(store.parent / f"node-{port}-{hold is not None}.log", "ab")
    # with a hold file: the node whose commits wait while it exists (tests/kit/held_node.py)
    start = ([sys.executable, "-m", "provided_code.apps.dicom_cli"] if hold is None else
             [sys.executable, "-c", held_node.COMMAND, str(hold)])
    command = [*start, "serve", "--model-dir", str(model_dir), "--store",
               str(store), "--host", LOCALHOST, "--port", str(port), "--send-to", destination,
               "--completion-timeout", "30", "--send-backoff", "0.2", "--min-free-mb", "0", *options]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    log.close()
    try:
        wait_until(lambda: process.poll() is not None or echo(port, timeout=2), 120, "the node answering C-ECHO",
                   interval=0.2)
    except AssertionError:
        process.kill()
        raise
    assert process.poll() is None, (store.parent / f"node-{port}-{hold is not None}.log").read_text()[-2000:]
    return process


@pytest.mark.slow
def test_killed_mid_receive_and_mid_prediction_the_restarted_node_sends_each_patient_once(
        model_dir, listener, phantom, tmp_path):
    store, port, hold = tmp_path / "store", free_port(), tmp_path / "hold"
    hold.touch()
    first, second = clone_patient(phantom, 17), clone_patient(phantom, 18)
    node = _serve(model_dir, store, port, listener.destination, hold=hold)
    try:
        send(port, first)
        journal = Journal(store / "journal.sqlite", readonly=True)
        wait_until(lambda: (journal.patient(rtstruct_uid(first)) or {"state": ""})["state"] == "predicting", 60,
                   "the first patient predicting")
        staged = store / "results" / rtstruct_uid(first)  # its folder-to-be: the staging folder beside it
        wait_until(lambda: [t for t in folder_temporaries(staged) if (t / "RD.dcm").exists()], 60,
                   "its outputs written, not committed")
        assoc = client_ae("TPS").associate(LOCALHOST, port, ae_title="KBP")
        for dataset in [structure_set_of(second), *ct_of(second)[:10]]:
            assert assoc.send_c_store(dataset).Status == 0
        node.send_signal(signal.SIGKILL)  # mid-receive (the association is open) and mid-prediction
        node.wait(30)
        assoc.abort()
        journal.close()
    finally:
        node.kill()
    node = _serve(model_dir, store, port, listener.destination)
    try:
        assert send(port, second) == [0] * len(second)  # the planning system sends the patient again
        journal = Journal(store / "journal.sqlite", readonly=True)
        uids = [rtstruct_uid(first), rtstruct_uid(second)]
        wait_until(lambda: all(journal.patient(uid)["state"] == "sent" for uid in uids), 120, "both patients sent")
        for patient, uid in zip((first, second), uids):
            assert len(doses_for(listener, patient)) == 1
            assert [s for s, _ in journal.history(uid)].count("predicted") == 1
            assert [row["outcome"] for row in journal.sends(uid)] == ["ok"]
        assert "ready" in [s for s, _ in journal.history(uids[0])][3:]  # back to ready after the kill
        assert len(listener.datasets()) == 2
        assert not list(store.glob("results/.*")) and not any((store / "incoming").iterdir())
        journal.close()
        node.send_signal(signal.SIGTERM)
        assert node.wait(60) == 0
    finally:
        node.kill()


def _node_lines(log: Path) -> list[str]:
    """The node's log lines (TensorFlow's own start-up lines, in another format, left out)."""
    return [line for line in log.read_text(errors="replace").splitlines() if not re.match(r"[IWEF]\d{4} ", line)]


def _lines_of(log: Path, action, settle: float = 1.0) -> list[str]:
    """The log lines written while ``action()`` runs and until the log is quiet for ``settle`` seconds."""
    before = len(_node_lines(log))
    action()
    count, quiet_since = len(_node_lines(log)), time.monotonic()
    while time.monotonic() - quiet_since < settle:
        time.sleep(0.1)
        if len(_node_lines(log)) != count:
            count, quiet_since = len(_node_lines(log)), time.monotonic()
    return _node_lines(log)[before:]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Invalid value for VR UI:UserWarning")  # pydicom again, as the client encodes it
def test_whatever_a_client_sends_each_event_is_one_log_line(model_dir, listener, phantom, tmp_path):
    from pynetdicom import AE
    from pydicom.uid import MRImageStorage

    store, port = tmp_path / "store", free_port()
    node = _serve(model_dir, store, port, listener.destination)
    log = tmp_path / f"node-{port}-False.log"
    try:
        def mr_only():  # a client offering an MR image only: refused at association, no C-STORE
            ae = AE(ae_title="TPS")
            ae.add_requested_context(MRImageStorage)
            assoc = ae.associate(LOCALHOST, port, ae_title="KBP")
            if assoc.is_established:
                assoc.release()

        [line] = _lines_of(log, mr_only)
        assert "refused its presentation context(s) for MR Image Storage" in line
        image = clone_patient(phantom, 30)[0]
        with pytest.warns(UserWarning, match="Invalid value for VR UI"):
            image.SOPInstanceUID = image.file_meta.MediaStorageSOPInstanceUID = "../../../escape"
        [line] = _lines_of(log, lambda: send(port, [image]))
        assert line.endswith("Refused CT ../../../escape of patient PHANTOM30 from TPS, status 0xC000: invalid "
                             "SOPInstanceUID (digits and dots only)")
        plain, escaped = clone_patient(phantom, 31), clone_patient(phantom, 32)
        for dataset in escaped:
            dataset.PatientID = "PHANTOM\x1b[31m32"
        sent = {"plain": plain, "escaped": escaped}
        lines = {name: _lines_of(log, lambda: (send(port, patient[:-1]), wait_until(
            lambda: doses_for(listener, patient), 60, "the RT Dose sent")), settle=2.0)
            for name, patient in sent.items()}
        assert len(lines["escaped"]) == len(lines["plain"])  # no line more for the ESC byte
        assert len([line for line in lines["escaped"] if "Patient PHANTOM?[31m32 " in line]) >= 5  # waiting ... sent
        assert all(re.match(r"\d\d:\d\d:\d\d [A-Z]+ ", line) and line.isprintable() and len(line) < 500
                   for line in [*lines["plain"], *lines["escaped"]])
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)


@pytest.mark.slow
def test_a_training_run_on_the_model_a_node_serves_is_refused_in_one_line_and_the_node_keeps_serving(
        tiny_model, phantom_data, listener, phantom, tmp_path):
    served = tmp_path / "results" / "m"
    shutil.copytree(tiny_model, served)
    store, port = tmp_path / "store", free_port()
    node = _serve(served, store, port, listener.destination)
    try:
        training = subprocess.run(
            [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data), "--results-dir",
             str(served.parent), "--model-name", "m", "--start-over", "--epochs", "2", "--cache-dir",
             str(tmp_path / "cache")], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        assert training.returncode == 1
        [line] = [line for line in training.stderr.splitlines() if line.startswith("Error:")]
        assert line.startswith(f"Error: {served} is in use by another run (pid {node.pid} on ")
        assert "a DICOM node" in line
        assert (served / "models" / "config.json").is_file() and not list(served.glob("abandoned-*"))
        patient = clone_patient(phantom, 33)
        assert send(port, patient[:-1]) == [0] * (len(patient) - 1)
        wait_until(lambda: doses_for(listener, patient), 60, "the RT Dose sent")
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)
