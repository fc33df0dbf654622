"""What a built network costs, counted from its own layers (no device needed): forward
multiply-accumulates per sample and the device memory one training step needs. Pure arithmetic
on a Keras model's layer shapes; it runs nothing.

- :func:`forward_macs`: every convolution's multiply-accumulates for one sample's forward pass
  (``Conv3D``: output voxels × kernel voxels × input channels × output channels / groups;
  ``Conv3DTranspose``: input voxels × kernel voxels × input × output channels). Normalisations,
  activations, additions and the input unpacking are left out: on any of the bodies they are
  under 1 % of the convolutions' count. The backward pass costs about twice the forward.
- :func:`memory_estimate`: the weights, their gradients and Adam's two moments (float32, 16
  bytes a parameter), plus every layer's output for the whole batch in the layer's compute dtype
  (float16 under ``mixed_float16``, float32 for the head and the input unpacking): what the
  backward pass keeps when every activation is kept, an upper bound of what TensorFlow keeps
  (convolution workspace comes on top). With ``block_of`` (the body's recompute blocks), also
  what ``--recompute`` keeps: the tensors that cross a block's border for the whole batch, plus
  the largest block's own outputs for one sample.

GB are 10^9 bytes. An estimate by arithmetic, not a measurement.
"""

from __future__ import annotations

import math
from typing import Callable

BYTES_PER_PARAMETER = 16  # float32 weight, gradient and Adam's two moments
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "uint16": 2, "uint32": 4, "int32": 4}
GPU_HEADROOM = 0.9  # the share of a card's memory a step may plan on (the rest: CUDA context, cuDNN
#                     workspace, the allocator's fragmentation)


def _volume(shape) -> int:
    return math.prod(int(d) for d in shape)


def layer_macs(layer) -> int:
    """One sample's forward multiply-accumulates of ``layer`` (0 for anything but a 3D convolution)."""
    kind = type(layer).__name__
    if kind not in ("Conv3D", "Conv3DTranspose"):
        return 0
    kernel = _volume(layer.kernel_size)
    channels_in = int(layer.input.shape[-1])
    channels_out = int(layer.filters)
    if kind == "Conv3DTranspose":
        return _volume(layer.input.shape[1:-1]) * kernel * channels_in * channels_out
    groups = int(getattr(layer, "groups", 1) or 1)
    return _volume(layer.output.shape[1:-1]) * kernel * channels_in * channels_out // groups


def forward_macs(model) -> int:
    """One sample's forward multiply-accumulates over every convolution of ``model``."""
    return sum(layer_macs(layer) for layer in model.layers)


def macs_by_resolution(model) -> dict[int, int]:
    """:func:`forward_macs` split by each convolution's output edge (voxels along the first axis):
    where in the U-Net the arithmetic is."""
    split: dict[int, int] = {}
    for layer in model.layers:
        macs = layer_macs(layer)
        if macs:
            edge = int(layer.output.shape[1])
            split[edge] = split.get(edge, 0) + macs
    return dict(sorted(split.items(), reverse=True))


def _tensor_bytes(tensor, batch: int, dtype: str) -> int:
    return batch * _volume(tensor.shape[1:]) * DTYPE_BYTES[dtype]


def memory_estimate(model, batch_size: int, block_of: Callable[[str], str | None] | None = None) -> dict:
    """``model``'s training memory at ``batch_size`` (see the module): ``parameters``,
    ``static_gb``, ``activations_gb``, ``total_gb``, ``fits_24_gb`` / ``fits_80_gb`` (under
    ``GPU_HEADROOM`` of an RTX 3090's / an H100's memory) and, with ``block_of``,
    ``recompute_activations_gb``, ``recompute_total_gb`` and ``recompute_fits_24_gb``. Build the
    model under the dtype policy it trains with: its layers' compute dtypes are what is counted."""
    import keras

    activations, boundary, per_block = 0, 0, {}
    consumers: dict[int, set] = {}
    block = block_of or (lambda name: None)
    for layer in model.layers:
        for node in layer._inbound_nodes:
            for tensor in node.input_tensors:
                consumers.setdefault(id(tensor), set()).add(block(layer.name) or layer.name)
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        for tensor in outputs:
            size = _tensor_bytes(tensor, batch_size, layer.compute_dtype)
            activations += size
            owner = block(layer.name) or layer.name
            if consumers.get(id(tensor), set()) - {owner} or tensor is model.output:
                boundary += size
            per_block[owner] = per_block.get(owner, 0) + size // batch_size
    parameters = int(model.count_params())
    static = BYTES_PER_PARAMETER * parameters
    total = static + activations
    result = {"parameters": parameters, "static_gb": round(static / 1e9, 3),
              "activations_gb": round(activations / 1e9, 2), "total_gb": round(total / 1e9, 2),
              "fits_24_gb": total < GPU_HEADROOM * 24e9, "fits_80_gb": total < GPU_HEADROOM * 80e9}
    if block_of is not None:
        recompute = boundary + max(per_block.values())
        result.update(recompute_activations_gb=round(recompute / 1e9, 2),
                      recompute_total_gb=round((static + recompute) / 1e9, 2),
                      recompute_fits_24_gb=static + recompute < GPU_HEADROOM * 24e9)
    return result
