"""Training benchmark on this machine: prints one JSON object (seconds unless named otherwise).

    python scripts/bench_train.py [--resolution 32] [--filters 8] [--batch-size 2] [--steps 20]

Every measurement runs the project's own training step (``training/step.py``) on synthetic
phantoms in a fresh process, so that process-wide settings (oneDNN, logical CPU devices) and peak
memory are each measurement's own; all of them in one run, side by side. Where a measurement names
no network (the main run's), it is the default one (the residual U-Net since issue 40; figures in
docs/performance.md measured before that are the generator's, as they say):

- time to first step (trace + compile + step) and steady samples per second: XLA against not,
  float32 against mixed_float16, TensorFlow's oneDNN CPU kernels (``TF_ENABLE_ONEDNN_OPTS=1``)
  against TensorFlow's default for this processor and against oneDNN off;
- two logical CPU devices (the processor split in two, as ``--devices 2`` does without GPUs: the
  same code path as two GPUs, sharing these cores, so this says what the strategy costs, not what
  GPUs gain), with XLA and without;
- at 64³ (16 filters, batch 4, one op at a time, so that the peak does not depend on which ops
  the scheduler happens to run together): the memory a training step needs beyond what the
  process held before it, with and without ``--recompute``, and their step times (the median of
  three alternating runs of each, as for the next two comparisons). ``step_memory_mb_*``: the
  peak of TensorFlow's CPU allocator during steady steps minus what it held before them (live
  tensors: what the activations kept for the backward pass change). ``step_rss_mb_*``: peak
  resident memory from before the first step to the last, minus resident memory before it; on a
  CPU that is dominated by oneDNN's memory pool and the first step's one-time tracing and
  primitive creation, so it says little about activations;
- ``--accumulate 2`` against 1, per batch;
- at 64³ (``--part body`` runs only these; ``--filters``, default 8): the v2 generator, the residual
  U-Net and the residual U-Net with the physics channel, one step of each in turn in one process;
  ``--part widths`` the same for the generator and the width arms of ``scripts/ablation.py --table width``
  (``WIDTH_ARMS``), each step's ratio to the generator's;
- at 64³ with 16 filters (``--part network`` runs only these): the DVH term (``--dvh-weight 0.2``)
  against the masked MAE alone (one step of each in turn, in one process), and, as medians of
  three alternating runs, instance against batch norm, the beam channel
  (``--beams 9``) against none, and ``--preset v2``'s whole recipe (the generator's) against v1's
  (``step_s_v2_over_v1``; the residual U-Net against the generator is ``--part body``'s);
- full augmentation (flip, rotate, shift; drawn by the input pipeline, applied in the step) with
  the masked loss, against neither, both fed by the real input pipeline, at the benchmark's
  config and at 64³ (at least 40 steps); and the
  seconds one ``--score-every`` scoring takes (prediction at the benchmark's config, back to 128³,
  the challenge's scores) for the phantoms;
- (``--part trace`` runs only these) the first training step, and a short run of the command
  line, with the step's functions traced with autograph on (TensorFlow's default) and off (the
  project's);
- (``--part inputs`` runs only these) the input layer's first call (trace and run): a prostate
  model's 35 beam slots against 1, OpenKBP's nine beams with the physics channel against without;
- the first XLA step with Keras's built-in AveragePooling3D against the project's separable one
  (the generator's final smoothing: ``--preset v2``'s network);
- the input pipeline's share of the fastest step (the pipeline the default recipe trains with: the
  possible-dose mask for the masked loss, the default augmentation's draws), and the fetch time of
  a batch at 128³.

CPU figures only; nothing here says what a GPU does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# -- in a child process: one measurement --------------------------------------------------------
def child(spec: dict) -> dict:
    """One measurement in this fresh process: settings first (oneDNN, logical devices), then the
    kind's own function."""
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()  # leaves TF_ENABLE_ONEDNN_OPTS alone when the parent set or removed it
    if spec.get("onednn") == "default":
        os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)
    from provided_code.training.strategy import make_placement

    strategy = make_placement(str(spec.get("devices", 1))).strategy  # before TF starts
    import tensorflow as tf

    if "autograph" in spec:  # --part trace: every tf.function of the step made with autograph on or off
        plain = tf.function
        tf.function = lambda *args, **options: plain(*args, **{**options, "autograph": spec["autograph"]})
    if spec.get("sequential"):  # one op at a time: a peak that does not depend on thread scheduling
        tf.config.threading.set_inter_op_parallelism_threads(1)
    kinds = {"run": child_run, "fetch": child_fetch, "parameters": child_parameters, "score": child_score, "step": child_step,
             "loss_pair": child_loss_pair, "bodies": child_bodies, "inputs": child_inputs}
    return kinds[spec.get("kind", "step")](spec, strategy)


def _phantoms(spec: dict):
    """Four phantoms at 128³, and at the spec's resolution."""
    import shutil
    import tempfile

    from provided_code.data.cache import load_split
    from provided_code.data.phantoms import write_phantom_split
    from provided_code.data.resample import downsample_split
    from provided_code.sites import openkbp

    workdir = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        write_phantom_split(workdir / "train-pats", 4)
        full = load_split(workdir / "train-pats", cache_dir=workdir / "cache", workers=1, site=openkbp())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return full, downsample_split(full, spec["resolution"])


def child_run(spec: dict, strategy) -> dict:
    """A short run of the command line in this process (``--part trace``): six phantoms, two epochs
    of the preset's recipe, scored at the last; its seconds from the call to its end (data cached,
    model built, steps traced and run, checkpoints and scores written)."""
    import shutil
    import tempfile
    import time

    from provided_code.apps.cli import main as cli
    from provided_code.data.phantoms import write_phantom_split

    workdir = Path(tempfile.mkdtemp(prefix="bench-run-"))
    try:
        write_phantom_split(workdir / "data" / "train-pats", 4)
        write_phantom_split(workdir / "data" / "validation-pats", 2, first_number=201)
        start = time.perf_counter()
        cli(["--data-dir", str(workdir / "data"), "--results-dir", str(workdir / "results"), "--cache-dir",
             str(workdir / "cache"), "--preset", spec["preset"], "--resolution", str(spec["resolution"]), "--filters",
             str(spec["filters"]), "--batch-size", str(spec["batch_size"]), "--epochs", "2", "--xla", "off"],
            standalone_mode=False)
        return {"run_s": time.perf_counter() - start}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def child_fetch(spec: dict, strategy) -> dict:
    """Seconds to pull one element from the input pipeline training uses with the default recipe
    (masked loss: the possible-dose mask; the default augmentation's draws)."""
    import time

    import numpy as np

    from provided_code.config import TrainConfig
    from provided_code.training.feeds import training_input

    _, arrays = _phantoms(spec)
    defaults = TrainConfig(batch_size=spec["batch_size"], accumulate=spec.get("accumulate", 1))
    iterator = iter(training_input(strategy, arrays, defaults, defaults.spec, first_epoch=0, epochs=40))
    next(iterator)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        next(iterator)
        times.append(time.perf_counter() - start)
    del iterator  # a from_generator iterator left mid-stream blocks the interpreter's exit
    return {"fetch_s": float(np.mean(times))}  # the mean: the pipeline's throughput, waits included


def child_parameters(spec: dict, strategy) -> dict:
    """The default network's parameters at the default 128³ and 64 filters (its body as configured)."""
    from provided_code.config import TrainConfig
    from provided_code.networks.build import build_network

    return {"parameters": build_network(TrainConfig().spec).count_params()}


def child_score(spec: dict, strategy) -> dict:
    """One --score-every scoring of the phantoms, after a warm-up one."""
    import shutil
    import tempfile
    import time

    import keras
    import tensorflow as tf

    from provided_code.config import TrainConfig
    from provided_code.networks.build import build_network
    from provided_code.run_folder import RunFolder
    from provided_code.training.validation_scores import Validation, ValidationScores

    full, low = _phantoms(spec)
    keras.utils.set_random_seed(0)
    model_spec = TrainConfig(resolution=spec["resolution"], filters=spec["filters"]).spec
    model = build_network(model_spec)
    predict_batch = tf.function(lambda inputs: model(inputs, training=False))
    scoring = ValidationScores(Validation(low, full), spec["batch_size"], score_every=1, epochs=2,
                               folder=RunFolder(tempfile.mkdtemp(prefix="bench-score-")), model=model,
                               predict_batch=predict_batch, spec=model_spec)
    try:
        scoring.start()
        scoring.measure(0)  # traces the prediction; saves best.keras
        start = time.perf_counter()
        scoring.measure(1)
        return {"score_s": time.perf_counter() - start, "patients": len(full)}
    finally:
        shutil.rmtree(scoring.folder.path, ignore_errors=True)


def child_step(spec: dict, strategy) -> dict:
    """Training steps: the first (trace, compile, step) and the steady ones; memory around them."""
    import dataclasses
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from provided_code.config import TrainConfig
    from provided_code.data.batches import fit_vectors
    from provided_code.data.tf_dataset import take_element
    from provided_code.infra.environment import describe_cpu_kernels
    from provided_code.losses import loss_function
    from provided_code.presets import PRESETS
    from provided_code.training.hardware import describe_devices
    from provided_code.training.feeds import training_input
    from provided_code.training.memory import current_rss_mb, peak_rss_mb, reset_peak_rss
    from provided_code.training.model import new_model
    from provided_code.training.step import TrainStep

    _, arrays = _phantoms(spec)
    resolution, batch, accumulate = spec["resolution"], spec["batch_size"], spec.get("accumulate", 1)
    replicas = strategy.num_replicas_in_sync
    keras.mixed_precision.set_global_policy(spec.get("policy", "float32"))
    keras.utils.set_random_seed(0)
    recipe = PRESETS[spec["preset"]] if "preset" in spec else {}  # a preset: its network, loss and augmentation
    config = TrainConfig(resolution=resolution, filters=spec["filters"], batch_size=batch, accumulate=accumulate,
                         **{**recipe, **spec.get("network", {})})
    if spec.get("patient_beams"):  # the run's angles again, but as each patient's own (a model input)
        arrays = dataclasses.replace(arrays, beam_angles=np.tile(np.float32(config.gantry_angles), (len(arrays), 1)))
        config = dataclasses.replace(config, beam_slots=config.beams)
    augment = spec.get("augment")  # absent: one fixed element; False / True: the input pipeline without / with
    if not recipe:  # the plain MAE, or with "augment" full augmentation and the masked MAE
        config = dataclasses.replace(config, loss="masked-mae" if augment else "mae",
                                     augment="flip,rotate,shift" if augment else "none")
    with strategy.scope():
        model = new_model(config.spec, config.learning_rate, keras_pooling=spec.get("builtin_pool", False))
        model.optimizer.build(model.trainable_variables)
    fed_by_pipeline = augment is not None or bool(recipe)
    inputs = config.spec.inputs
    arrays = fit_vectors(arrays, inputs)  # the per-patient vectors, once (as training makes them)
    step = TrainStep(model, strategy, batch, xla=spec.get("xla", False), accumulate=accumulate,
                     recompute=spec.get("recompute", False), spec=config.spec,
                     loss_fn=loss_function(config.loss, config.dvh_weight, config.spec))
    rows = np.arange(batch * replicas * accumulate) % len(arrays)
    weights = np.full(rows.size, 1.0 / rows.size, np.float32)
    per_replica = rows.reshape(accumulate, replicas, batch)

    def value_fn(context):
        r = context.replica_id_in_sync_group
        return take_element(arrays, per_replica[:, r].reshape(-1), weights[:per_replica[:, r].size], inputs)

    if fed_by_pipeline:  # as in training: new patients and draws every step
        pipeline = iter(training_input(strategy, arrays, config, config.spec, first_epoch=0, epochs=spec["steps"] + 1))
        next_element = lambda: next(pipeline)  # noqa: E731
    else:  # one element, fed again and again: the step alone
        element = strategy.experimental_distribute_values_from_function(value_fn)
        next_element = lambda: element  # noqa: E731
    rss_before = current_rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    float(step.train(next_element()))  # trace, compile, first step
    first = time.perf_counter() - start
    rss_after_first = peak_rss_mb()
    device = "CPU:0"
    try:  # TensorFlow tracks its CPU allocator only with oneDNN on
        tf.config.experimental.reset_memory_stats(device)
        live_before = tf.config.experimental.get_memory_info(device)["current"]
    except ValueError:
        live_before = None
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        loss = step.train(next_element())
    float(loss)
    if fed_by_pipeline:
        del pipeline  # release the pipeline before the interpreter exits
    step_s = (time.perf_counter() - start) / spec["steps"]
    live_peak = tf.config.experimental.get_memory_info(device)["peak"] if live_before is not None else None
    return {"first_step_s": first, "step_s": step_s, "samples_per_s": rows.size / step_s,
            "step_memory_mb": (live_peak - live_before) / 2**20 if live_before is not None else None,
            "step_rss_mb": max(rss_after_first, peak_rss_mb()) - rss_before, "cpu_kernels": describe_cpu_kernels(),
            "device": describe_devices()[0]}


def child_loss_pair(spec: dict, strategy) -> dict:
    """The DVH term's cost inside one process: one model, two training steps (the masked MAE alone,
    and with ``spec["dvh_weight"]`` × the DVH term) on the same fixed element, one step of each in
    turn, ``spec["rounds"]`` times; the ratio of each pair, and their median. On a busy host the
    same step time varied by ±20 % between fresh processes, and by more between blocks of steps
    seconds apart; a pair of steps a tenth of a second apart sees the same conditions. Also the
    term's own time: its value and its gradient with respect to the prediction."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from provided_code.config import TrainConfig
    from provided_code.data.tf_dataset import take_element
    from provided_code.losses import dvh_difference, loss_function
    from provided_code.training.model import new_model
    from provided_code.training.step import TrainStep

    _, arrays = _phantoms(spec)
    batch = spec["batch_size"]
    keras.utils.set_random_seed(0)
    config = TrainConfig(resolution=spec["resolution"], filters=spec["filters"],
                         **{"dropout": 0.2, **spec.get("network", {})})
    with strategy.scope():
        model = new_model(config.spec, config.learning_rate)
        model.optimizer.build(model.trainable_variables)
    rows = np.arange(batch) % len(arrays)
    fixed = take_element(arrays, rows, np.full(batch, 1.0 / batch, np.float32), config.spec.inputs, with_mask=True)
    element = strategy.experimental_distribute_values_from_function(lambda context: fixed)
    steps = {name: TrainStep(model, strategy, batch, xla=False, spec=config.spec,
                             loss_fn=loss_function("masked-mae", weight, config.spec))
             for name, weight in (("none", 0.0), ("dvh", spec["dvh_weight"]))}
    for step in steps.values():
        float(step.train(element))  # trace, first step
        float(step.train(element))
    times = {name: [] for name in steps}
    for _ in range(spec["rounds"]):
        for name, step in steps.items():
            start = time.perf_counter()
            float(step.train(element))
            times[name].append(time.perf_counter() - start)
    ratios = np.array(times["dvh"]) / np.array(times["none"])

    term_element = {name: tf.constant(fixed[name]) for name in ("dose", "structure_masks")}
    predicted = tf.Variable(term_element["dose"] * 0.9)

    @tf.function
    def term():
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(dvh_difference(term_element, predicted, len(config.spec.site.names)))
        return value, tape.gradient(value, predicted)

    float(term()[0])
    term_times = []
    for _ in range(spec["rounds"]):
        start = time.perf_counter()
        float(term()[0])
        term_times.append(time.perf_counter() - start)
    return {"step_s": {name: float(np.median(values)) for name, values in times.items()},
            "dvh_over_none": float(np.median(ratios)),
            "dvh_over_none_quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
            "dvh_term_s": float(np.median(term_times))}


# -- in the parent: every measurement, side by side --------------------------------------------
def measure(spec: dict, env_changes: dict | None = None) -> dict:
    env = dict(os.environ)
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                            text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"measurement {spec} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def alternating(specs: dict[str, dict], repeats: int = 3) -> dict:
    """Each spec ``repeats`` times in fresh processes, alternating, and the median of each figure:
    differences of a few percent sit within one run's noise on these machines."""
    samples = {name: [] for name in specs}
    for _ in range(repeats):
        for name, spec in specs.items():
            samples[name].append(measure(spec))
    runs = {}
    for name, results in samples.items():
        runs[name] = {"step_s": statistics.median(result["step_s"] for result in results),
                      "step_s_each": [result["step_s"] for result in results]}
        if results[0]["step_memory_mb"] is not None:
            runs[name]["step_memory_mb"] = statistics.median(result["step_memory_mb"] for result in results)
            runs[name]["step_memory_mb_each"] = [result["step_memory_mb"] for result in results]
        runs[name]["step_rss_mb"] = statistics.median(result["step_rss_mb"] for result in results)
    return runs


def augment_comparison(base: dict) -> dict:
    """Plain and augmented steps, at the benchmark's config and at 64³."""
    return {**alternating({"plain": dict(base, augment=False), "augment": dict(base, augment=True)}),
            **alternating({"plain_64": dict(base, resolution=64, augment=False),
                           "augment_64": dict(base, resolution=64, augment=True)})}


def child_bodies(spec: dict, strategy) -> dict:
    """The bodies' step times inside one process (``--part body``): the v2 network (the generator),
    the residual U-Net, and the residual U-Net with the physics channel, each on the same fixed
    element with the masked MAE, one step of each in turn, ``spec["rounds"]`` times: the medians of
    each round's ratios, and each one's median step time and first step (trace and step)."""
    import time

    import keras
    import numpy as np

    from provided_code.config import TrainConfig
    from provided_code.data.batches import fit_vectors
    from provided_code.data.tf_dataset import take_element
    from provided_code.losses import loss_function
    from provided_code.presets import PRESETS
    from provided_code.training.model import new_model
    from provided_code.training.step import TrainStep

    _, arrays = _phantoms(spec)
    batch = spec["batch_size"]
    residual = {"arch": "resunet", "dropout": 0.0, "widths": "1,2,4,8,8,8", "head": "softplus"}
    bodies = {"generator": {}, "resunet": residual, "resunet_physics": {**residual, "physics": True}}
    if spec.get("widths"):  # --part widths: the width arms of docs/recipe.md's comparison against the generator
        bodies = {"generator": {}, **{name: {**residual, "arch": arch, "widths": widths}
                                      for name, (arch, widths) in WIDTH_ARMS.items()}}
    steps, elements, first, parameters = {}, {}, {}, {}
    for name, network in bodies.items():
        keras.utils.set_random_seed(0)
        config = TrainConfig(resolution=spec["resolution"], filters=spec["filters"], **{**PRESETS["v2"], **network})
        with strategy.scope():
            model = new_model(config.spec, config.learning_rate)
            model.optimizer.build(model.trainable_variables)
        parameters[name] = model.count_params()
        fitted = fit_vectors(arrays, config.spec.inputs)
        fixed = take_element(fitted, np.arange(batch) % len(arrays), np.full(batch, 1.0 / batch, np.float32),
                             config.spec.inputs, with_mask=True)
        elements[name] = strategy.experimental_distribute_values_from_function(lambda context, fixed=fixed: fixed)
        steps[name] = TrainStep(model, strategy, batch, xla=False, spec=config.spec,
                                loss_fn=loss_function("masked-mae", 0.0, config.spec))
        start = time.perf_counter()
        float(steps[name].train(elements[name]))
        first[name] = time.perf_counter() - start
        float(steps[name].train(elements[name]))
    times = {name: [] for name in bodies}
    for _ in range(spec["rounds"]):
        for name, step in steps.items():
            start = time.perf_counter()
            float(step.train(elements[name]))
            times[name].append(time.perf_counter() - start)
    ratio = lambda a, b: float(np.median(np.array(times[a]) / np.array(times[b])))  # noqa: E731
    result = {"parameters": parameters, "first_step_s": first,
              "step_s": {name: float(np.median(values)) for name, values in times.items()}}
    if spec.get("widths"):
        return {**result, "step_s_over_generator": {name: ratio(name, "generator") for name in bodies}}
    return {**result, "step_s_resunet_over_generator": ratio("resunet", "generator"),
            "step_s_physics_over_none": ratio("resunet_physics", "resunet")}


# --part widths: name -> (--arch, --widths), the arms of scripts/ablation.py --table width
WIDTH_ARMS = {"resunet": ("resunet", "1,2,4,8,8,8"), "resunet_f4": ("resunet", "0.5,1,2,4,4,4"),
              "thin": ("resunet", "0.25,1,2,4,8,8"), "thin_capped": ("resunet", "0.25,0.5,1,2,4,4"),
              "half_capped": ("resunet", "0.5,0.5,1,2,4,4"), "plain_half_capped": ("plain", "0.5,0.5,1,2,4,4")}


def child_inputs(spec: dict, strategy) -> dict:
    """``--part inputs``: the input layer's first call in a new ``tf.function`` (its trace and one
    run, as each run's training, evaluation and prediction functions meet it) at the spec's
    resolution, batch 2, for: a prostate model's 35 beam slots (9 used), the same with 1 slot, and
    OpenKBP's nine run-wide beams without and with the physics channel; the cases in turn,
    ``rounds`` times, medians. With the beams summed in a loop of the graph, 35 slots cost about
    what 1 does."""
    import time

    import numpy as np
    import tensorflow as tf

    from provided_code.networks.layers import CompactInputs, site_unpacking
    from provided_code.sites import load_site

    size, rng = spec["resolution"], np.random.default_rng(0)
    ct = tf.constant(rng.integers(0, 4096, (2, size, size, size)).astype(np.uint16))
    masks = tf.constant(rng.integers(0, 64, (2, size, size, size)).astype(np.uint16))
    voxel_mm = tf.constant([[3.5, 3.5, 2.0], [3.0, 3.0, 2.5]], tf.float32)

    def angles(slots):
        used = np.full((2, slots), np.nan, np.float32)
        used[:, :min(9, slots)] = (np.arange(min(9, slots)) * 40.0)[None]
        return tf.constant(used)

    prostate = site_unpacking(load_site("prostate"))
    nine_beams = dict(beam_angles=[k * 40.0 for k in range(9)], prescription=True, **site_unpacking(load_site("openkbp")))
    cases = {"prostate_35_slots": (dict(beam_slots=35, **prostate), [ct, masks, angles(35)]),
             "prostate_1_slot": (dict(beam_slots=1, **prostate), [ct, masks, angles(1)]),
             "openkbp_9_beams": (nine_beams, [ct, masks]),
             "openkbp_9_beams_physics": (dict(nine_beams, physics=True), [ct, masks, voxel_mm])}
    samples = {name: [] for name in cases}
    for _ in range(spec["rounds"]):
        for name, (settings, inputs) in cases.items():
            layer = CompactInputs(**settings)
            first = tf.function(lambda values: layer(values))
            start = time.perf_counter()
            np.asarray(first(inputs))
            samples[name].append(time.perf_counter() - start)
    seconds = {f"first_call_s_{name}": statistics.median(values) for name, values in samples.items()}
    return {**seconds, "first_call_each": samples,
            "slots_35_over_1": seconds["first_call_s_prostate_35_slots"] / seconds["first_call_s_prostate_1_slot"],
            "physics_over_none": seconds["first_call_s_openkbp_9_beams_physics"] / seconds["first_call_s_openkbp_9_beams"]}


def body_comparison(batch_size: int, filters: int, rounds: int, widths: bool = False) -> dict:
    """At 64³ (``--part body``, ``--part widths``): :func:`child_bodies`, one process."""
    config = {"resolution": 64, "filters": filters, "batch_size": batch_size, "rounds": rounds, "widths": widths}
    from provided_code.infra.environment import cpu_flags

    return {"body_config": config, "cpu_flags": cpu_flags(), **measure(dict(config, kind="bodies"))}


def network_comparison(batch_size: int) -> dict:
    """At 64³, 16 filters: the DVH term against none (the masked MAE; one step of each in turn in one
    process, :func:`child_loss_pair`); in fresh processes, medians of three alternating runs
    of each: instance against batch norm, the beam channel against none (MAE on one fixed
    element), per-patient beam channels against the run-wide table (the same nine angles, one fixed
    element), and ``--preset v2``'s whole recipe (network, inputs, loss, augmentation, through
    the input pipeline) against v1's (both on the generator: :func:`body_comparison` compares the bodies)."""
    from provided_code.presets import PRESETS, preset_network

    # every network but the presets' is v1's (the generator, batch norm, no extra channel) plus the one change
    v1 = preset_network("v1")
    plain = {"resolution": 64, "filters": 16, "batch_size": batch_size, "steps": 20}
    config = dict(plain, network=v1)
    beams = dict(config, network={**v1, "beams": 9})
    loss_pair = measure(dict(config, kind="loss_pair", dvh_weight=0.2, rounds=100))
    runs = {"loss_pair_64": loss_pair,
            **alternating({"batch_norm_64": config,
                           "instance_norm_64": dict(config, network={**v1, "norm": "instance"})}),
            **alternating({"no_beams_64": config, "beams_64": beams}),
            **alternating({"run_beams_64": beams, "patient_beams_64": dict(beams, patient_beams=True)}),
            **alternating({"preset_v1_64": dict(plain, preset="v1"), "preset_v2_64": dict(plain, preset="v2")})}
    ratio = lambda a, b: runs[a]["step_s"] / runs[b]["step_s"]  # noqa: E731
    return {"network_config": config, "v2_preset": PRESETS["v2"],
            "step_s_dvh_loss_over_none": loss_pair["dvh_over_none"],
            "step_s_dvh_loss_over_none_quartiles": loss_pair["dvh_over_none_quartiles"],
            "dvh_term_s": loss_pair["dvh_term_s"],
            "step_s_instance_over_batch_norm": ratio("instance_norm_64", "batch_norm_64"),
            "step_s_beams_over_none": ratio("beams_64", "no_beams_64"),
            "step_s_patient_beams_over_run_beams": ratio("patient_beams_64", "run_beams_64"),
            "step_s_v2_over_v1": ratio("preset_v2_64", "preset_v1_64"),
            "network_runs": runs}


def trace_comparison(base: dict) -> dict:
    """``--part trace``: with the step's functions traced with autograph on (TensorFlow's default)
    and off (the project's: the step's control flow is Python's), the first training step (trace
    and step) and a whole short run of the command line (:func:`child_run`), for ``--preset v2``
    (the generator) and the defaults; medians of three alternating fresh processes each."""
    from provided_code.infra.environment import cpu_flags

    runs = {}
    for preset in ("v2", "default"):
        for kind, figure in (("step", "first_step_s"), ("run", "run_s")):
            samples = {True: [], False: []}
            for _ in range(3):
                for on in (True, False):
                    samples[on].append(measure(dict(base, kind=kind, preset=preset, steps=2, autograph=on))[figure])
            for on, name in ((True, "autograph_on"), (False, "autograph_off")):
                runs[f"{figure}_{preset}_{name}"] = statistics.median(samples[on])
                runs[f"{figure}_{preset}_{name}_each"] = samples[on]
            runs[f"{figure}_{preset}_off_over_on"] = (runs[f"{figure}_{preset}_autograph_off"]
                                                      / runs[f"{figure}_{preset}_autograph_on"])
    return {"trace_config": base, "cpu_flags": cpu_flags(), **runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--filters", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--memory-resolution", type=int, default=64, help="size for the recompute comparison")
    parser.add_argument("--memory-filters", type=int, default=16, help="filters for the recompute comparison")
    parser.add_argument("--memory-batch-size", type=int, default=4, help="batch for the recompute comparison")
    parser.add_argument("--pool-resolution", type=int, default=64,
                        help="size for the built-in vs separable pooling first-step comparison (filters 4)")
    parser.add_argument("--part", choices=("all", "network", "body", "widths", "trace", "inputs"), default="all",
                        help="network: only the 64³ network and loss comparisons (the step_s_*_over_* of issue 14); "
                             "body: only the bodies' and the physics channel's step times at 64³ (--filters, "
                             "--steps rounds); widths: the width arms of docs/recipe.md's comparison against the generator, "
                             "the same way; trace: the first step with autograph on and off; inputs: the input "
                             "layer's first call (trace and run) with 35 beam slots against 1, and with the "
                             "physics channel against without (--resolution, --steps rounds)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.part == "network":
        print(json.dumps(network_comparison(args.batch_size), indent=2))
        return
    if args.part == "trace":
        print(json.dumps(trace_comparison({"resolution": args.resolution, "filters": args.filters,
                                           "batch_size": args.batch_size}), indent=2))
        return
    if args.part == "inputs":
        from provided_code.infra.environment import cpu_flags

        config = {"resolution": args.resolution, "rounds": args.steps}
        print(json.dumps({"inputs_config": config, "cpu_flags": cpu_flags(), **measure(dict(config, kind="inputs"))},
                         indent=2))
        return
    if args.part in ("body", "widths"):
        print(json.dumps(body_comparison(args.batch_size, args.filters, args.steps, args.part == "widths"), indent=2))
        return

    base = {"resolution": args.resolution, "filters": args.filters, "batch_size": args.batch_size, "steps": args.steps}
    from provided_code.presets import preset_network

    generator = preset_network("v2")  # the pooling's body
    big = {"resolution": args.memory_resolution, "filters": args.memory_filters,
           "batch_size": args.memory_batch_size, "steps": 10, "sequential": True}
    runs = {
        "onednn_on": measure(base, {"TF_ENABLE_ONEDNN_OPTS": "1"}),
        "onednn_default": measure(dict(base, onednn="default"), {"TF_ENABLE_ONEDNN_OPTS": None}),
        "onednn_off": measure(base, {"TF_ENABLE_ONEDNN_OPTS": "0"}),
        "xla": measure(dict(base, xla=True)),
        "mixed_float16": measure(dict(base, policy="mixed_float16")),
        "two_devices_no_xla": measure(dict(base, devices=2, batch_size=max(1, args.batch_size // 2))),
        "two_devices_xla": measure(dict(base, devices=2, batch_size=max(1, args.batch_size // 2), xla=True)),
        **alternating({"accumulate_1": dict(base, accumulate=1), "accumulate_2": dict(base, accumulate=2)}),
        **augment_comparison(dict(base, steps=max(args.steps, 40))),
        **alternating({"no_recompute_64": big, "recompute_64": dict(big, recompute=True)}),
        "pool_separable_xla": measure({"resolution": args.pool_resolution, "filters": 4, "batch_size": 1,
                                       "steps": 1, "xla": True, "network": generator}),
        "pool_builtin_xla": measure({"resolution": args.pool_resolution, "filters": 4, "batch_size": 1,
                                     "steps": 1, "xla": True, "builtin_pool": True, "network": generator}),
    }
    fetch = measure(dict(base, kind="fetch"))["fetch_s"]
    fetch_128 = measure(dict(base, kind="fetch", resolution=128))["fetch_s"]
    parameters = measure(dict(base, kind="parameters"))["parameters"]
    scoring = measure(dict(base, kind="score"))
    on, xla = runs["onednn_on"], runs["xla"]
    fastest = min(on["step_s"], xla["step_s"], runs["mixed_float16"]["step_s"])
    from provided_code.infra.environment import cpu_flags

    print(json.dumps({
        "config": {**base, "device": on["device"], "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
                   "cpu_flags": cpu_flags(), "cpu_kernels_by_default": runs["onednn_default"]["cpu_kernels"]},
        "samples_per_s_xla": xla["samples_per_s"],
        "samples_per_s_no_xla": on["samples_per_s"],
        "first_step_s_xla": xla["first_step_s"],
        "first_step_s_no_xla": on["first_step_s"],
        "samples_per_s_mixed_float16": runs["mixed_float16"]["samples_per_s"],
        "mixed_float16_over_float32_step_time": runs["mixed_float16"]["step_s"] / on["step_s"],
        "step_s_onednn_over_default": on["step_s"] / runs["onednn_default"]["step_s"],
        "step_s_onednn_off_over_on": runs["onednn_off"]["step_s"] / on["step_s"],
        "pool_comparison_resolution": args.pool_resolution,
        "first_step_s_xla_separable_pool": runs["pool_separable_xla"]["first_step_s"],
        "first_step_s_xla_builtin_pool": runs["pool_builtin_xla"]["first_step_s"],
        "builtin_over_separable_pool_first_step": (runs["pool_builtin_xla"]["first_step_s"]
                                                   / runs["pool_separable_xla"]["first_step_s"]),
        "steps_per_s_1_device": 1 / on["step_s"],
        "steps_per_s_2_logical_cpu_devices": 1 / runs["two_devices_no_xla"]["step_s"],
        "samples_per_s_2_logical_devices_xla": runs["two_devices_xla"]["samples_per_s"],
        "samples_per_s_2_logical_devices_no_xla": runs["two_devices_no_xla"]["samples_per_s"],
        "memory_config": big,
        "step_memory_mb_recompute": runs["recompute_64"]["step_memory_mb"],
        "step_memory_mb_no_recompute": runs["no_recompute_64"]["step_memory_mb"],
        "step_memory_recompute_over_no_recompute": (runs["recompute_64"]["step_memory_mb"]
                                                    / runs["no_recompute_64"]["step_memory_mb"]),
        "step_s_recompute": runs["recompute_64"]["step_s"],
        "step_s_no_recompute": runs["no_recompute_64"]["step_s"],
        "step_s_recompute_over_no_recompute": runs["recompute_64"]["step_s"] / runs["no_recompute_64"]["step_s"],
        "step_rss_mb_recompute": runs["recompute_64"]["step_rss_mb"],
        "step_rss_mb_no_recompute": runs["no_recompute_64"]["step_rss_mb"],
        "step_s_accumulate_2_over_1": (runs["accumulate_2"]["step_s"] / 2) / runs["accumulate_1"]["step_s"],
        "step_s_augment_and_masked_loss_over_plain": runs["augment"]["step_s"] / runs["plain"]["step_s"],
        "step_s_augment_and_masked_loss_over_plain_64": runs["augment_64"]["step_s"] / runs["plain_64"]["step_s"],
        **network_comparison(args.batch_size),
        "score_every_epoch_s": scoring["score_s"],
        "score_patients": scoring["patients"],
        "parameter_bytes_float32_at_128_filters_64": 4 * parameters,
        "batch_fetch_s": fetch,
        "input_pipeline_share": min(1.0, fetch / fastest),
        "batch_fetch_s_128": fetch_128,
        "runs": runs,
    }, indent=2))


if __name__ == "__main__":
    main()
