"""Running a functional model's training forward pass in pieces.

Two reasons to cut the graph, both about a training step, neither about the model's weights or
its saved form (checkpoints are the same either way):

- **XLA between synchronisation points.** Synchronised batch norm all-reduces its statistics
  across replicas; under ``tf.distribute`` on this stack that all-reduce cannot sit inside a
  nested ``tf.function(jit_compile=True)`` (it needs a ``merge_call``). So with several replicas,
  each run of layers between two batch-norm layers becomes one XLA-compiled function, and the
  batch-norm layers run between them (their gradient all-reduce included). One replica compiles
  the whole step instead (see ``step.py``).
- **Recomputation.** Each encoder and decoder block (layers named ``encoder_<k>_*`` /
  ``decoder_<k>_*``) runs under :func:`recompute`: the backward pass runs the block again from
  its inputs instead of keeping its activations. Layers that draw random numbers (dropout) are
  never inside a recomputed block, since the second run would draw other numbers.
"""

from __future__ import annotations

import re
from typing import Callable

import keras
import tensorflow as tf
from keras import tree

_BLOCK = re.compile(r"^((?:encoder|decoder)_\d+)_")
# Layers recomputed with a neighbouring block: the input unpacking with the first encoder block (so
# that only the compact uint16 inputs are kept, 4 bytes a voxel instead of 44), the output layers
# with the last decoder block.
_BLOCK_OF_LAYER = {"compact_inputs": "encoder_1", "dose_conv": "decoder_0", "dose_smooth": "decoder_0",
                   "dose": "decoder_0"}


def is_sync_layer(layer) -> bool:
    """Layers whose training call all-reduces across replicas."""
    return isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized


def _draws_random_numbers(layer) -> bool:
    return isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)


def _ordered_nodes(model: keras.Model) -> list:
    """The model's computing nodes in an order that respects their dependencies."""
    if not hasattr(model, "_nodes_by_depth"):
        raise TypeError(f"Invalid `model`. Expected a functional Keras model. Received: model={type(model).__name__}")
    nodes = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        nodes += [node for node in model._nodes_by_depth[depth] if node.operation and not node.is_input]
    return nodes


def _call_training(node, values: dict):
    args, kwargs = node.arguments.fill_in(values)
    if "training" in getattr(node.operation, "_call_context_args", ()):
        kwargs["training"] = True
    return node.operation(*args, **kwargs)


class _Piece:
    """A run of nodes executed together; ``inputs``/``outputs`` are the ids of the symbolic tensors
    that cross its border. ``run(*inputs) -> outputs`` runs its nodes (replaced for compiled or
    recomputed pieces)."""

    def __init__(self, nodes: list, consumers: dict[int, set[int]], model_outputs: set[int]):
        self.nodes = nodes
        inside = {id(node) for node in nodes}
        produced = {id(t) for node in nodes for t in node.outputs}
        self.inputs = list(dict.fromkeys(id(t) for node in nodes for t in node.input_tensors
                                         if id(t) not in produced))
        self.outputs = [id(t) for node in nodes for t in node.outputs
                        if id(t) in model_outputs or consumers.get(id(t), set()) - inside]
        self.run = self._run_nodes

    def _run_nodes(self, *values):
        local = dict(zip(self.inputs, values))
        for node in self.nodes:
            for tensor, value in zip(node.outputs, tree.flatten(_call_training(node, local))):
                local[id(tensor)] = value
        return [local[i] for i in self.outputs]


def _run_in_order(pieces: list, values: dict) -> None:
    """Run ``pieces`` one after another, reading and adding tensors by symbolic id in ``values``."""
    for piece in pieces:
        for tensor_id, value in zip(piece.outputs, piece.run(*[values[i] for i in piece.inputs])):
            values[tensor_id] = value


def _split(nodes: list, key: Callable) -> list[list]:
    """Consecutive runs of nodes with the same ``key(node)``; a key of None stands alone."""
    runs: list[list] = []
    previous = object()
    for node in nodes:
        current = key(node)
        if runs and current is not None and current == previous:
            runs[-1].append(node)
        else:
            runs.append([node])
        previous = current
    return runs


def training_forward(model: keras.Model, compile_segments: bool, recompute_blocks: bool) -> Callable:
    """``forward(inputs) -> outputs``: the model's training call, cut as the flags say.

    With neither flag this is ``model(inputs, training=True)``.
    """
    if not (compile_segments or recompute_blocks):
        return lambda inputs: model(inputs, training=True)
    nodes = _ordered_nodes(model)
    consumers: dict[int, set[int]] = {}  # symbolic tensor id -> ids of the nodes that read it
    for node in nodes:
        for tensor in node.input_tensors:
            consumers.setdefault(id(tensor), set()).add(id(node))
    model_outputs = {id(t) for t in model.outputs}

    def piece(piece_nodes: list) -> _Piece:
        return _Piece(piece_nodes, consumers, model_outputs)

    def block_of(node):
        if _draws_random_numbers(node.operation):
            return None
        match = _BLOCK.match(node.operation.name)
        return match.group(1) if match else _BLOCK_OF_LAYER.get(node.operation.name)

    def segment_key(node):
        return None if is_sync_layer(node.operation) else "segment"

    def runner(piece_nodes: list) -> _Piece:
        """A piece of ``piece_nodes``, XLA-compiled between sync points if asked."""
        whole = piece(piece_nodes)
        if not compile_segments:
            return whole
        parts = [piece(run) for run in _split(piece_nodes, segment_key)]
        for part in parts:
            if not is_sync_layer(part.nodes[0].operation):
                part.run = tf.function(part.run, jit_compile=True, reduce_retracing=True)

        def run_parts(*values):
            local = dict(zip(whole.inputs, values))
            _run_in_order(parts, local)
            return [local[i] for i in whole.outputs]

        whole.run = run_parts
        return whole

    if recompute_blocks:
        pieces = [runner(run) for run in _split(nodes, block_of)]
        for block in pieces:
            if block_of(block.nodes[0]) is not None:
                block.run = (lambda inner: lambda *values: recompute(inner, list(values)))(block.run)
    else:
        pieces = [runner(nodes)]

    def forward(inputs):
        values = {id(t): v for t, v in zip(model.inputs, model._standardize_inputs(inputs))}
        _run_in_order(pieces, values)
        outputs = [values[id(t)] for t in model.outputs]
        return outputs[0] if len(outputs) == 1 else outputs

    return forward


def recompute(fn: Callable[..., list], inputs: list) -> list:
    """``fn(*inputs)`` whose activations are recomputed in the backward pass instead of kept.

    The second run happens inside a ``keras.StatelessScope``, so its state updates (batch norm's
    moving statistics) are dropped: each is applied once, by the forward run. ``fn`` must draw no
    random numbers. The recomputation waits for the upstream gradient (a control dependency), so
    that it runs during the backward pass rather than alongside the forward one. Integer inputs
    (the compact uint16 volumes) get no gradient.
    """

    @tf.custom_gradient
    def block(*args):
        outputs = fn(*args)

        def grad(*upstream, variables=None):
            with tf.control_dependencies([tf.reshape(upstream[0], [-1])[:1]]):
                again_args = [tf.identity(arg) for arg in args]
            differentiable = [arg for arg in again_args if arg.dtype.is_floating]
            variables = list(variables or [])
            with tf.GradientTape() as tape:
                tape.watch(differentiable)
                tape.watch(variables)
                with keras.StatelessScope():
                    again = fn(*again_args)
            grads = iter(tape.gradient(again, differentiable + variables, output_gradients=list(upstream),
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO))
            input_grads = [next(grads) if arg.dtype.is_floating else None for arg in again_args]
            return input_grads, list(grads)

        return (outputs[0] if len(outputs) == 1 else outputs), grad

    result = block(*inputs)
    return list(result) if isinstance(result, (list, tuple)) else [result]
