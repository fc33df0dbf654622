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
  never inside a recomputed block, since the second run would draw other numbers. The input
  unpacking and the first convolution form a block of their own, and blocks without batch norm
  (whose samples do not meet) run one sample at a time, forward and backward: the unpacked
  input, 11 float32 channels at full resolution, is the largest tensor of the step, and this way
  only one sample of it exists at any time.
"""

from __future__ import annotations

import re
from typing import Callable

import keras
import tensorflow as tf
from keras import tree

_BLOCK = re.compile(r"^((?:encoder|decoder)_\d+)_")
# Blocks named by layer, ahead of the pattern: the input unpacking with the first convolution (so
# that only the compact uint16 inputs are kept, 4 bytes a voxel instead of 44, and without the
# first batch norm, so that it can run one sample at a time); the output layers with the last
# decoder block.
_BLOCK_OF_LAYER = {"compact_inputs": "inputs", "encoder_1_conv": "inputs", "dose_conv": "decoder_0",
                   "dose_smooth": "decoder_0", "dose": "decoder_0"}


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
        name = node.operation.name
        match = _BLOCK.match(name)
        return _BLOCK_OF_LAYER.get(name, match.group(1) if match else None)

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
                by_sample = not any(isinstance(node.operation, keras.layers.BatchNormalization) for node in block.nodes)
                block.run = _recomputed(block.run, by_sample)
    else:
        pieces = [runner(nodes)]

    def forward(inputs):
        values = {id(t): v for t, v in zip(model.inputs, model._standardize_inputs(inputs))}
        _run_in_order(pieces, values)
        outputs = [values[id(t)] for t in model.outputs]
        return outputs[0] if len(outputs) == 1 else outputs

    return forward


def recompute(fn: Callable[..., list], inputs: list, by_sample: bool = False) -> list:
    """``fn(*inputs)`` whose activations are recomputed in the backward pass instead of kept.

    The second run happens inside a ``keras.StatelessScope``, so its state updates (batch norm's
    moving statistics) are dropped: each is applied once, by the forward run. ``fn`` must draw no
    random numbers. The recomputation waits for the upstream gradient (a control dependency), so
    that it runs during the backward pass rather than alongside the forward one. Integer inputs
    (the compact uint16 volumes) get no gradient.

    ``by_sample``: ``fn`` treats each sample on its own (no batch norm), so both runs go one
    sample at a time, each waiting for the one before, and only one sample's activations exist at
    once; the weights' gradients are the sum over samples. Needs a known batch size (otherwise
    the batch runs whole).
    """
    batch = inputs[0].shape[0] if by_sample else None
    parts = batch if isinstance(batch, int) and batch > 1 else 1  # runs of one sample, or the whole batch

    @tf.custom_gradient
    def block(*args):
        part_outputs, previous = [], []
        for part in _batch_parts(args, parts):
            with tf.control_dependencies(previous):
                part = [tf.identity(value) for value in part]
            previous = fn(*part)
            part_outputs.append(previous)
        outputs = [tf.concat(pieces, axis=0) for pieces in zip(*part_outputs)]  # one piece: no copy

        def grad(*upstream, variables=None):
            variables = list(variables or [])
            part_grads, previous = [], [tf.reshape(upstream[0], [-1])[:1]]
            for part, part_upstream in zip(_batch_parts(args, parts), _batch_parts(upstream, parts)):
                with tf.control_dependencies(previous):
                    again_args = [tf.identity(arg) for arg in part]
                differentiable = [arg for arg in again_args if arg.dtype.is_floating]
                with tf.GradientTape() as tape:
                    tape.watch(differentiable)
                    tape.watch(variables)
                    with keras.StatelessScope():
                        again = fn(*again_args)
                previous = tape.gradient(again, differentiable + variables, output_gradients=list(part_upstream),
                                         unconnected_gradients=tf.UnconnectedGradients.ZERO)
                part_grads.append(previous)
            floating = len(differentiable)
            input_grads = iter([tf.concat(pieces, axis=0) for pieces in zip(*(g[:floating] for g in part_grads))])
            variable_grads = [tf.add_n(list(pieces)) for pieces in zip(*(g[floating:] for g in part_grads))]
            return [next(input_grads) if arg.dtype.is_floating else None for arg in args], variable_grads

        return (outputs[0] if len(outputs) == 1 else outputs), grad

    result = block(*inputs)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _recomputed(run: Callable[..., list], by_sample: bool) -> Callable[..., list]:
    return lambda *values: recompute(run, list(values), by_sample)


def _batch_parts(values, parts: int) -> list[list]:
    """``values`` (batch-major tensors of ``parts`` samples) one sample at a time; or whole, for 1."""
    if parts == 1:
        return [list(values)]
    return [[value[i:i + 1] for value in values] for i in range(parts)]
