"""``TF_CONFIG``, the machines of a ``--multi-worker`` run, read before TensorFlow loads (the
command line reads it, so that a bad one fails in one line before any work). Imports nothing of
TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import os

from provided_code.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The machines of a ``--multi-worker`` run, as ``TF_CONFIG`` describes them."""

    workers: list[str]  # "host:port" of every worker
    index: int  # this worker's

    @property
    def is_chief(self) -> bool:
        """Worker 0 is the chief: the one that holds the run's lock and writes checkpoints and logs."""
        return self.index == 0


def read_tf_config(environ=os.environ) -> Cluster:
    """The cluster of ``TF_CONFIG``; a one-line ConfigError if bad. Read once per process (the
    command line reads it before TensorFlow loads, and hands it on)."""
    text = environ.get("TF_CONFIG")
    if not text:
        raise ConfigError("--multi-worker needs TF_CONFIG, e.g. TF_CONFIG='{\"cluster\": {\"worker\": "
                          "[\"hostA:12345\", \"hostB:12345\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}' "
                          "(see docs/distributed.md)")
    try:
        spec = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"Invalid TF_CONFIG: not JSON ({error}). Received: TF_CONFIG={text!r}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"Invalid TF_CONFIG: expected a JSON object. Received: TF_CONFIG={text!r}")
    workers = (spec.get("cluster") or {}).get("worker") if isinstance(spec.get("cluster"), dict) else None
    if not (isinstance(workers, list) and workers and all(isinstance(w, str) and ":" in w for w in workers)):
        raise ConfigError(f"Invalid TF_CONFIG: expected cluster.worker, a list of \"host:port\". "
                          f"Received: cluster={spec.get('cluster')!r}")
    extra = sorted(set(spec["cluster"]) - {"worker"})
    if extra:
        raise ConfigError(f"Invalid TF_CONFIG: only \"worker\" tasks are used (worker 0 is the chief). "
                          f"Received cluster task types: {extra}")
    task = spec.get("task")
    if not isinstance(task, dict):
        raise ConfigError(f"Invalid TF_CONFIG: no task (expected \"task\": {{\"type\": \"worker\", \"index\": N}}). "
                          f"Received: TF_CONFIG={text!r}")
    if task.get("type") != "worker":
        raise ConfigError(f"Invalid TF_CONFIG: task.type must be \"worker\". Received: task={task!r}")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ConfigError(f"Invalid TF_CONFIG: task.index must be 0..{len(workers) - 1} for "
                          f"{len(workers)} workers. Received: task={task!r}")
    return Cluster(workers, index)
