"""The child process that converts a traced TorchScript graph to a Paddle inference model (run by :mod:`.paddle`,
by its path, in a scratch working folder): X2Paddle translates the graph into Paddle code, runs that code and saves
the static program it builds (``inference_model/model.json`` with its ``model.pdiparams`` weights).

Network connections are refused in this process before X2Paddle is imported: X2Paddle reports each conversion to
Baidu unless told not to (it is told), and an export never touches the network. X2Paddle writes its progress on
stdout and stderr; the process prints nothing but, on failure, one line on stderr.

Usage: ``python _paddle_convert.py MODEL.torchscript 1,3,H,W OUTPUT_FOLDER``
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import warnings

# Run by its path, this script's folder comes first on the module path: it holds modules named like packages
# X2Paddle imports (onnx ...), so it goes.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]
# Paddle builds the program on the CPU, whatever the machine has.
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _refuse_network(*args: object, **kwargs: object) -> None:
    raise OSError("network access is refused while converting to PaddlePaddle")


def block_network() -> None:
    """Every way Python opens a connection (requests' too, through these) refused in this process."""
    socket.socket.connect = _refuse_network  # type: ignore[method-assign]
    socket.socket.connect_ex = _refuse_network  # type: ignore[method-assign]
    socket.create_connection = _refuse_network  # type: ignore[assignment]
    socket.getaddrinfo = _refuse_network  # type: ignore[assignment]


def teach_ones_like() -> None:
    """X2Paddle 1.6 translates ``aten::zeros_like`` but not ``aten::ones_like`` (the anchor-free heads' objectness
    column): a ``paddle.ones_like`` layer of the input's dtype, or of the one asked for."""
    from x2paddle.op_mapper.pytorch2paddle import aten

    def aten_ones_like(mapper, graph, node):
        scope_name = mapper.normalize_scope_name(node)
        output_name = mapper._get_outputs_name(node)[0]
        inputs_name, inputs_node = mapper._get_inputs_name(node)
        mapper._check_input(graph, inputs_node[0], inputs_name[0], [output_name], scope_name)
        dtype = mapper.attrs.get(inputs_name[1]) if len(inputs_name) > 1 else None
        attrs = {} if dtype is None else {"dtype": aten.dtype_dict[dtype]}
        graph.add_layer("paddle.ones_like", inputs={"x": inputs_name[0]}, outputs=[output_name],
                        scope_name=scope_name, **attrs)
        return [inputs_name[0]], [output_name]

    if not hasattr(aten, "aten_ones_like"):
        aten.aten_ones_like = aten_ones_like


def teach_unflatten() -> None:
    """X2Paddle 1.6 translates ``aten::flatten`` but not ``aten::unflatten`` (the pose head splits its keypoint rows
    into keypoints and their x, y, visibility): a ``paddle.reshape`` to the input's shape, read as the program runs,
    with the split side replaced by the sizes. Not ``paddle.unflatten``: it spells out the input's other sides as the
    program is built, when two of them are still unknown (-1), and a reshape takes one at most."""
    from x2paddle.op_mapper.pytorch2paddle import aten

    def aten_unflatten(mapper, graph, node):
        scope_name = mapper.normalize_scope_name(node)
        output_name = mapper._get_outputs_name(node)[0]
        inputs_name, inputs_node = mapper._get_inputs_name(node)
        mapper._check_input(graph, inputs_node[0], inputs_name[0], [output_name], scope_name)
        axis, sizes = mapper.attrs[inputs_name[1]], list(mapper.attrs[inputs_name[2]])
        measured, shape, before, split, after, parts, new_shape = (f"{output_name}_{part}" for part in (
            "measured", "shape", "before", "split", "after", "parts", "new_shape"))
        # The sides after the split: none when the split is the last side (axis -1).
        rest = axis + 1 if axis + 1 != 0 else 2**31 - 1
        for kernel, inputs, outputs, attrs in (
                ("paddle.shape", {"input": inputs_name[0]}, measured, {}),
                ("paddle.cast", {"x": measured}, shape, {"dtype": "paddle.int64"}),  # as paddle.assign's sizes
                ("prim.slice", {"input": shape}, before, {"start": 0, "end": axis, "step": 1}),
                ("prim.slice", {"input": shape}, after, {"start": rest, "end": 2**31 - 1, "step": 1}),
                # (not paddle.to_tensor: X2Paddle takes every one of those for an input of the program)
                ("paddle.assign", {}, split, {"x": sizes}),
                ("prim.list", {"input0": before, "input1": split, "input2": after}, parts, {}),
                ("paddle.concat", {"x": parts}, new_shape, {"axis": 0}),
                ("paddle.reshape", {"x": inputs_name[0], "shape": new_shape}, output_name, {})):
            graph.add_layer(kernel, inputs=inputs, outputs=[outputs], scope_name=scope_name, **attrs)
        return [inputs_name[0]], [output_name]

    if not hasattr(aten, "aten_unflatten"):
        aten.aten_unflatten = aten_unflatten


def main(torchscript_path: str, shape: str, output: str) -> None:
    block_network()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from x2paddle.convert import pytorch2paddle

        teach_ones_like()
        teach_unflatten()
        graph = torch.jit.load(torchscript_path, map_location="cpu")
        example = torch.zeros(*(int(side) for side in shape.split(",")))
        # Tracing a traced graph gives it back as it is: X2Paddle reads the graph the parent traced.
        pytorch2paddle(module=graph, save_dir=output, jit_type="trace", input_examples=[example],
                       disable_feedback=True)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except BaseException as error:  # noqa: BLE001 - X2Paddle ends with sys.exit on a graph it cannot translate
        if isinstance(error, SystemExit) and not error.code:
            raise
        print(f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}",
              file=sys.stderr)
        sys.exit(1)
