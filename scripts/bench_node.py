"""The DICOM node against ``openkbp-dicom predict`` on the same files; prints one JSON object.

    python scripts/bench_node.py [--model-dir results/unet] [--step 1] [--repeats 3] [--patients 20] [--clients 4]

Without ``--model-dir`` a small model is trained first on phantoms (4 filters, 32³, 1 epoch, as the
tests train: their light body, ``tests/kit/runs.py``). Everything runs in this process on 127.0.0.1; the listener is a pynetdicom Storage
SCP standing in for the planning system (``tests/kit/node.py``; needs the dev extra).

- ``node_s_received_to_sent``: one phantom patient (CT, RTSTRUCT naming its images, the clinic's
  RT Dose; ``--step 1``: a 128 × 128 CT of 128 slices, 4 a 32 × 32 CT of 32) sent by one client to
  a node whose model is loaded and warm: from the answer to the last C-STORE (the last object
  received) to the listener's C-STORE handler holding the RT Dose (it acknowledges on return).
  The median of ``--repeats`` patients, each a copy of the phantom under new UIDs; with its stages
  from the journal (to ``ready``, the prediction, from ``predicted`` to the listener) and
  ``node_s_outside_prediction``, what the node adds to the prediction.
- ``predict_s``: ``predict_dicom_patient`` (what ``openkbp-dicom predict --no-plots`` runs, without
  TensorFlow's start-up) on the same files with the same loaded model, after a warm-up; median of
  as many runs, alternating with the node's. ``ratio`` = node / predict.
- ``patients_per_minute``: the load test's setup: ``--patients`` small patients (``--step 4``) from
  ``--clients`` concurrent clients, one association per patient; from the first association to the
  last RT Dose received.
- ``idle``: a whole small patient (``--step 4``) sent by DCMTK's ``storescu`` (pynetdicom's client
  when DCMTK is absent), from the end of the send (the client's exit) to the RT Dose at the
  listener, median of ``--repeats``: with nothing else connected, and while ``--idle-connections``
  TCP connections that never say a word and ``--idle-associations`` associations that never send
  are held open (each reopened at once when the node closes it, as a client that insists would);
  and the load test again under that idle load.
- ``idle_associations_cpu``: the processor time of this process (the node, its listener) over
  ``--idle-seconds`` with nothing connected, then while ``--idle-associations`` associations (each
  from an AE title of its own) are held idle by another process: ``cost_of_a_core`` is the
  difference, as a fraction of one core (the acceptance: under 0.05 for 10).
- ``one_caller_holds_its_allowance``: one AE title (``HOG``) holds its ``--max-per-caller``
  associations idle (and asks for one more, which the node rejects); ``echo_s`` is how long another
  client (``TPS``) takes from its association request to its C-ECHO answered (median of
  ``--repeats``; the acceptance: under 1 s).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class IdleLoad:
    """``connections`` TCP connections that send nothing and ``associations`` associations that send
    nothing, held open on ``port`` by a process of their own (its polling threads do not share the
    node's interpreter): each one the node closes is reopened. The associations call as ``IDLE0``,
    ``IDLE1``, ... (each a caller of its own, as many systems would be), or all as ``calling``."""

    def __init__(self, port: int, connections: int, associations: int, calling: str | None = None):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self._stop, self._ready = context.Event(), context.Event()
        self._reopened = context.Value("i", 0)
        titles = [calling or f"IDLE{k}" for k in range(associations)]
        self._process = context.Process(target=_hold_idle, args=(port, connections, titles, self._stop,
                                                                  self._ready, self._reopened), daemon=True)

    def __enter__(self) -> "IdleLoad":
        self._process.start()
        if not self._ready.wait(120):
            raise RuntimeError("the idle connections and associations were not all established")
        return self

    @property
    def reopened(self) -> int:
        return self._reopened.value

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._process.join(30)


def _hold_idle(port, connections, titles, stop, ready, reopened) -> None:
    """:class:`IdleLoad`'s process."""
    import select
    import socket

    sys.path.insert(0, str(REPO))
    from tests.kit.node import client_ae

    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    clients = [client_ae(title, timeout=120) for title in titles]
    assocs = [client.associate("127.0.0.1", port, ae_title="KBP") for client in clients]
    if all(assoc.is_established for assoc in assocs):
        ready.set()
    while not stop.wait(0.2):
        readable, _, _ = select.select(sockets, [], [], 0)
        for closed in readable:  # the node closed it (a silent connection has nothing else to read)
            closed.close()
            sockets[sockets.index(closed)] = socket.create_connection(("127.0.0.1", port))
            reopened.value += 1
        for k, assoc in enumerate(assocs):
            if not assoc.is_established:
                assocs[k] = clients[k].associate("127.0.0.1", port, ae_title="KBP")
                reopened.value += 1
    for assoc in assocs:
        if assoc.is_established:
            assoc.release()
    for sock in sockets:
        sock.close()


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                platform.machine())


def train_small_model(workdir: Path) -> Path:
    import keras

    from provided_code.config import TrainConfig
    from provided_code.data.phantoms import write_phantom_split
    from provided_code.training.train import train
    from tests.kit.runs import LIGHT_BODY

    write_phantom_split(workdir / "data" / "train-pats", 4, first_number=1)
    write_phantom_split(workdir / "data" / "validation-pats", 2, first_number=201)
    train(TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=1, xla="off", score_every=0, data_dir=str(workdir / "data"),
                      results_dir=str(workdir / "results"), model_name="m", cache_dir=str(workdir / "cache")))
    keras.backend.clear_session()
    return workdir / "results" / "m"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="a trained run (default: train a small one)")
    parser.add_argument("--step", type=int, default=1, help="phantom voxels per CT pixel for the latency (1: 128²)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--patients", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle-connections", type=int, default=50)
    parser.add_argument("--idle-associations", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))  # the tests' kit (tests/kit/): not installed with the package
    from provided_code.infra.environment import configure_tensorflow, cpu_flags

    configure_tensorflow()
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pynetdicom").setLevel(logging.CRITICAL)
    from provided_code.apps.clinic import predict_dicom_patient
    from provided_code.apps.node.predictor import ModelPredictor
    from provided_code.apps.node.sender import parse_destination
    from provided_code.apps.node.server import GARBAGE_EVERY_S, Node, NodeSettings
    from tests.kit.node import (Listener, client_ae, clone_patient, ct_of, echo, read_patient_files, send,
                                small_patient, structure_set_of, wait_until, write_files)

    def export(patient, folder: Path) -> tuple[Path, Path, Path]:
        """The patient as files: (CT folder, RS.dcm, RD.dcm)."""
        write_files(ct_of(patient), folder / "ct")
        structure_set_of(patient).save_as(folder / "RS.dcm", enforce_file_format=True)
        patient[-1].save_as(folder / "RD.dcm", enforce_file_format=True)
        return folder / "ct", folder / "RS.dcm", folder / "RD.dcm"

    workdir = Path(tempfile.mkdtemp(prefix="bench-node-"))
    try:
        model_dir = args.model_dir or train_small_model(workdir / "model")
        predictor = ModelPredictor(model_dir)
        listener = Listener().start()
        node = Node(NodeSettings(store=workdir / "store", host="127.0.0.1", port=0, min_free_bytes=0,
                                 send_to=parse_destination(listener.destination)), predictor).start()
        try:
            phantom = read_patient_files(small_patient(workdir / "clinic", step=args.step))
            assert phantom[-1].Modality == "RTDOSE"
            warm = clone_patient(phantom, 0)  # a warm-up of both paths, each on a copy of its own
            send(node.port, warm)
            wait_until(lambda: len(listener.datasets()) == 1, 300, "the warm-up patient sent")
            ct_dir, rtstruct, rtdose = export(clone_patient(phantom, 0), workdir / "warm")
            predict_dicom_patient(predictor.model, ct_dir, rtstruct, workdir / "warm-out", rtdose=rtdose, plots=False)
            node_s, predict_s, stages = [], [], []
            for repeat in range(1, args.repeats + 1):
                patient = clone_patient(phantom, repeat)
                frame = str(ct_of(patient)[0].FrameOfReferenceUID)
                assoc = client_ae("TPS").associate("127.0.0.1", node.port, ae_title="KBP")
                statuses = [int(assoc.send_c_store(dataset).Status) for dataset in patient]
                last = time.time()  # the answer to the last C-STORE: the node holds the last object
                assoc.release()
                assert set(statuses) == {0}, statuses
                received = wait_until(lambda: [t for t, ds in listener.received if ds.FrameOfReferenceUID == frame],
                                      300, "the RT Dose at the listener", interval=0.002)
                node_s.append(received[0] - last)
                times = dict(node.journal._query(
                    "SELECT state, MAX(time) FROM history WHERE structure_set_uid = ? GROUP BY state",
                    (str(structure_set_of(patient).SOPInstanceUID),)))
                stages.append({"to_ready_s": times["ready"] - last, "predict_s": times["predicted"] - times["predicting"],
                               "to_listener_s": received[0] - times["predicted"]})
                ct_dir, rtstruct, rtdose = export(patient, workdir / f"files-{repeat}")
                start = time.perf_counter()
                predict_dicom_patient(predictor.model, ct_dir, rtstruct, workdir / f"out-{repeat}", rtdose=rtdose,
                                      plots=False)
                predict_s.append(time.perf_counter() - start)

            small = read_patient_files(small_patient(workdir / "small", step=4))

            def load(first: int) -> float:
                """Seconds for ``--patients`` small patients from ``--clients`` clients, to the last RT Dose."""
                patients = [clone_patient(small, first + i) for i in range(args.patients)]
                before = len(listener.datasets())
                start = time.time()

                def client(number):
                    for patient in patients[number::args.clients]:
                        send(node.port, patient, calling=f"TPS{number}")

                with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                    list(pool.map(client, range(args.clients)))
                wait_until(lambda: len(listener.datasets()) == before + args.patients, 1200, "every patient sent",
                           interval=0.01)
                return max(t for t, _ in listener.received) - start

            load_s = load(1000)

            def send_end_to_rt_dose(number: int) -> float:
                """A whole small patient by storescu (or pynetdicom): from the end of the send to its RT Dose."""
                patient = clone_patient(small, number)
                frame = str(ct_of(patient)[0].FrameOfReferenceUID)
                folder = write_files(patient, workdir / f"storescu-{number}")
                if shutil.which("storescu"):
                    result = subprocess.run(["storescu", "-aet", "TPS", "-aec", "KBP", "+sd", "127.0.0.1",
                                             str(node.port), str(folder)], capture_output=True, text=True, timeout=300)
                    assert result.returncode == 0, result.stderr
                else:
                    assert set(send(node.port, patient)) == {0}
                ended = time.time()
                received = wait_until(lambda: [t for t, ds in listener.received if ds.FrameOfReferenceUID == frame],
                                      300, "the RT Dose at the listener", interval=0.002)
                return received[0] - ended

            quiet = [send_end_to_rt_dose(2000 + k) for k in range(args.repeats)]
            with IdleLoad(node.port, args.idle_connections, args.idle_associations) as idle:
                busy = [send_end_to_rt_dose(3000 + k) for k in range(args.repeats)]
                busy_load_s = load(4000)
                reopened = idle.reopened

            def cpu_fraction() -> float:
                """This process's processor time over --idle-seconds, as a fraction of one core."""
                time.sleep(GARBAGE_EVERY_S + 1.0)  # what came before settles: associations that ended are collected
                cpu, wall = time.process_time(), time.monotonic()
                time.sleep(args.idle_seconds)
                return (time.process_time() - cpu) / (time.monotonic() - wall)

            cpu_none = cpu_fraction()
            with IdleLoad(node.port, 0, args.idle_associations):
                wait_until(lambda: len(node._server.active_associations) >= args.idle_associations, 60,
                           "the idle associations accepted")
                cpu_held = cpu_fraction()

            per_caller = node.settings.max_per_caller
            with IdleLoad(node.port, 0, per_caller, calling="HOG"):
                extra = client_ae("HOG").associate("127.0.0.1", node.port, ae_title="KBP")
                hog_rejected = extra.is_rejected
                if extra.is_established:
                    extra.release()
                echo_s = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    assert echo(node.port, calling="TPS", timeout=30), "TPS not served while HOG holds its allowance"
                    echo_s.append(time.perf_counter() - start)
        finally:
            node.stop()
            listener.stop()
        ct = ct_of(phantom)
        print(json.dumps({
            "ct_shape": [int(ct[0].Rows), int(ct[0].Columns), len(ct)], "repeats": args.repeats,
            "node_s_received_to_sent": statistics.median(node_s), "node_s_runs": node_s,
            "node_stages_median": {key: statistics.median(stage[key] for stage in stages) for key in stages[0]},
            "node_s_outside_prediction": statistics.median(n - stage["predict_s"] for n, stage in zip(node_s, stages)),
            "predict_s": statistics.median(predict_s), "predict_s_runs": predict_s,
            "ratio": statistics.median(node_s) / statistics.median(predict_s),
            "load": {"patients": args.patients, "clients": args.clients, "ct_shape": [32, 32, 32], "seconds": load_s,
                     "patients_per_minute": args.patients / load_s * 60},
            "idle": {"client": "storescu" if shutil.which("storescu") else "pynetdicom", "ct_shape": [32, 32, 32],
                     "connections": args.idle_connections, "associations": args.idle_associations,
                     "reopened_during": reopened,
                     "send_end_to_rt_dose_s": {"none_idle": statistics.median(quiet),
                                               "idle_held": statistics.median(busy)},
                     "runs": {"none_idle": quiet, "idle_held": busy},
                     "load_patients_per_minute_idle_held": args.patients / busy_load_s * 60},
            "idle_associations_cpu": {"associations": args.idle_associations, "seconds": args.idle_seconds,
                                      "none_held": cpu_none, "held": cpu_held,
                                      "cost_of_a_core": max(cpu_held - cpu_none, 0.0)},
            "one_caller_holds_its_allowance": {"max_per_caller": per_caller, "max_associations":
                                               node.settings.max_associations, "one_more_rejected": hog_rejected,
                                               "echo_s": statistics.median(echo_s), "echo_s_runs": echo_s},
            "model": str(args.model_dir or "small model trained here (4 filters, 32³, 1 epoch)"),
            "cores": os.cpu_count(), "cpu_model": cpu_model(), "cpu_flags": cpu_flags(),
        }, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
