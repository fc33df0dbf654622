"""Running a functional model's training forward pass in pieces, for recomputation
(``--recompute``): about a training step only, not the model's weights or its saved form
(checkpoints are the same either way).

Each block that the network declares (``block_of(layer name)``, for the U-Net
:func:`provided_code.networks.unet.block_of`) runs under :func:`recompute`: the backward pass runs
the block again from its inputs instead of keeping its activations. Blocks without batch norm
(whose samples do not meet: every block under instance norm) run one sample at a time, forward and
backward: the unpacked input, 11 or more float32 channels at full resolution, is the largest
tensor of the step, and this way only one sample of it exists at any time.

Why not ``tf.recompute_grad`` or Keras's rematerialisation as they are: the second run must not
update batch norm's moving statistics a second time (here it runs in a ``keras.StatelessScope``);
the blocks' uint16 inputs have no gradient, which ``tf.recompute_grad`` requires of every input;
and neither runs a block one sample at a time.

Keras internals, here only: Keras 3 has no public view of a functional model's graph, so this
module reads it as Keras runs a call (``Function._run_through_graph``): ``_nodes_by_depth`` (the nodes
in order, :func:`_ordered_nodes`) and, of each node (``keras.src.ops.node.Node``), ``operation``,
``is_input``, ``input_tensors``, ``outputs`` and ``arguments.fill_in`` (the call's arguments with
the values of this run, :func:`_node_runner`). A Keras upgrade that changes them fails the
``--recompute`` tests (``tests/test_step.py``, the same losses and weights as without it), not a
run silently.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import keras
import tensorflow as tf
from keras import tree

Run = Callable[..., list]  # run(*input values) -> output values


def _draws_random_numbers(layer) -> bool:
    return isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)


def _takes_training(layer) -> bool:
    return "training" in inspect.signature(layer.call).parameters


def _ordered_nodes(model: keras.Model) -> list:
    """The model's computing nodes in an order that respects their dependencies."""
    if not hasattr(model, "_nodes_by_depth"):
        raise TypeError(f"Invalid `model`. Expected a functional Keras model. Received: model={type(model).__name__}")
    nodes = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        nodes += [node for node in model._nodes_by_depth[depth] if node.operation and not node.is_input]
    return nodes


@dataclasses.dataclass
class _Piece:
    """A run of nodes executed together; ``inputs``/``outputs``: the ids of the symbolic tensors
    that cross its border."""

    nodes: list
    inputs: list[int]
    outputs: list[int]

    @classmethod
    def of(cls, nodes: list, consumers: dict[int, set[int]], model_outputs: set[int]) -> "_Piece":
        inside = {id(node) for node in nodes}
        produced = {id(t) for node in nodes for t in node.outputs}
        inputs = list(dict.fromkeys(id(t) for node in nodes for t in node.input_tensors if id(t) not in produced))
        outputs = [id(t) for node in nodes for t in node.outputs
                   if id(t) in model_outputs or consumers.get(id(t), set()) - inside]
        return cls(nodes, inputs, outputs)


def _node_runner(piece: _Piece) -> Run:
    """Run the piece's nodes in training mode, one after another."""
    training = [_takes_training(node.operation) for node in piece.nodes]

    def run(*values):
        local = dict(zip(piece.inputs, values))
        for node, takes_training in zip(piece.nodes, training):
            args, kwargs = node.arguments.fill_in(local)
            if takes_training:
                kwargs["training"] = True
            for tensor, value in zip(node.outputs, tree.flatten(node.operation(*args, **kwargs))):
                local[id(tensor)] = value
        return [local[i] for i in piece.outputs]

    return run


def _run_in_order(parts: list[tuple[_Piece, Run]], values: dict) -> None:
    """Run each part on the tensors of ``values`` (by symbolic id) and add its outputs there."""
    for piece, run in parts:
        for tensor_id, value in zip(piece.outputs, run(*[values[i] for i in piece.inputs])):
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


def training_forward(model: keras.Model, recompute_blocks: bool,
                     block_of: Callable[[str], str | None] | None = None) -> Callable:
    """``forward(inputs) -> outputs``: the model's training call, its blocks recomputed if asked.

    ``block_of``: the recompute block of a layer name (needed with ``recompute_blocks``; a model
    in which it finds no block is refused, rather than silently recomputing nothing). Without
    ``recompute_blocks`` this is ``model(inputs, training=True)``.
    """
    if not recompute_blocks:
        return lambda inputs: model(inputs, training=True)
    nodes = _ordered_nodes(model)
    consumers: dict[int, set[int]] = {}  # symbolic tensor id -> ids of the nodes that read it
    for node in nodes:
        for tensor in node.input_tensors:
            consumers.setdefault(id(tensor), set()).add(id(node))
    model_outputs = {id(t) for t in model.outputs}

    def piece(piece_nodes: list) -> _Piece:
        return _Piece.of(piece_nodes, consumers, model_outputs)

    if block_of is None:
        raise ValueError("Invalid `block_of`. Expected the network's block map with recompute_blocks. Received: None")

    def block(node):
        return None if _draws_random_numbers(node.operation) else block_of(node.operation.name)

    parts, recomputed = [], 0
    for run in _split(nodes, block):
        part = piece(run)
        if block(run[0]) is None:
            parts.append((part, _node_runner(part)))
        else:
            by_sample = not any(isinstance(node.operation, keras.layers.BatchNormalization) for node in run)
            parts.append((part, _recomputed(_node_runner(part), by_sample)))
            recomputed += 1
    if not recomputed:
        raise ValueError(f"--recompute found no block in model {model.name!r}: its layer names match none of "
                         f"the network's blocks (was a layer renamed?)")
    inputs_in_order = list(model.inputs)

    def forward(inputs):
        values = {id(t): v for t, v in zip(inputs_in_order, tree.flatten(inputs))}
        _run_in_order(parts, values)
        outputs = [values[id(t)] for t in model.outputs]
        return outputs[0] if len(outputs) == 1 else outputs

    return forward


def recompute(fn: Run, inputs: list, by_sample: bool = False) -> list:
    """``fn(*inputs)`` whose activations are recomputed in the backward pass instead of kept.

    The second run happens inside a ``keras.StatelessScope``, so its state updates (batch norm's
    moving statistics) are dropped: each is applied once, by the forward run. ``fn`` must draw no
    random numbers. Integer inputs (the compact uint16 volumes) get no gradient.

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
            with tf.control_dependencies(previous):  # sample k starts after sample k - 1's outputs exist
                part = [tf.identity(value) for value in part]
            previous = fn(*part)
            part_outputs.append(previous)
        outputs = [tf.concat(pieces, axis=0) for pieces in zip(*part_outputs)]  # one piece: no copy

        def grad(*upstream, variables=None):
            variables = list(variables or [])
            # The recomputation depends only on the block's inputs, so the graph could schedule it
            # during the forward pass, which would keep its activations alive as long as not
            # recomputing does. Making the first recomputed sample wait for (one element of) the
            # upstream gradient ties it to the backward pass; each later sample waits for the one
            # before, so that one sample's activations exist at a time.
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


def _recomputed(run: Run, by_sample: bool) -> Run:
    return lambda *values: recompute(run, list(values), by_sample)


def _batch_parts(values, parts: int) -> list[list]:
    """``values`` (batch-major tensors of ``parts`` samples) one sample at a time; or whole, for 1."""
    if parts == 1:
        return [list(values)]
    return [[value[i:i + 1] for value in values] for i in range(parts)]
