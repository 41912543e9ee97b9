"""The child process that converts an ONNX graph to TensorFlow (run by :mod:`._tensorflow`, by its path, in a
scratch working folder): onnx2tf builds a Keras model of the graph, which is written as a SavedModel folder or as a
frozen GraphDef (``.pb``).

Network connections are refused in this process before onnx2tf is imported: onnx2tf fetches a sample of images
from GitHub when its working folder lacks one, and an export never downloads anything (the parent writes the
sample into the working folder). The process prints nothing but, on failure, one line on stderr.

Usage: ``python _tensorflow_convert.py MODEL.onnx saved_model|keras_saved_model|tfjs_saved_model|pb OUTPUT``
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys

# Run by its path, this script's folder comes first on the module path: it holds modules named like the packages
# onnx2tf imports (onnx, tflite ...), so it goes.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]
# TensorFlow's compiled code logs its CPU features and missing CUDA drivers on stderr: errors only.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# onnx2tf runs an ONNX Runtime session for its checks: on the CPU, whatever the machine has.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# The signature TensorFlow Serving (and our runtime) call.
SIGNATURE = "serving_default"
# The SavedModel that TF.js's converter reads.
TFJS_SAVED_MODEL = "tfjs_saved_model"


def _refuse_network(*args: object, **kwargs: object) -> None:
    raise OSError("network access is refused while converting to TensorFlow")


def _block_network() -> None:
    socket.socket.connect = _refuse_network  # type: ignore[method-assign]
    socket.socket.connect_ex = _refuse_network  # type: ignore[method-assign]
    socket.create_connection = _refuse_network  # type: ignore[assignment]
    socket.getaddrinfo = _refuse_network  # type: ignore[assignment]


def _keras_model(onnx_path: str, scratch: str, split_groups: bool):
    import onnx2tf

    return onnx2tf.convert(input_onnx_file_path=onnx_path, output_folder_path=scratch, not_use_onnxsim=True,
                           verbosity="error", disable_model_save=True, disable_group_convolution=split_groups)


def main(onnx_path: str, kind: str, output: str) -> None:
    _block_network()
    # onnx2tf prints its progress on stdout and its errors through its own logger; the parent reports our line.
    with contextlib.redirect_stdout(io.StringIO()):
        import tensorflow as tf
        import tf_keras

        # TF.js's conv2d takes no groups (TensorFlow's does, from the filter's depth): for TF.js, onnx2tf writes a
        # grouped convolution (YOLO11's depthwise ones) as one convolution per group.
        model = _keras_model(onnx_path, os.path.join(os.getcwd(), "onnx2tf"), split_groups=kind == TFJS_SAVED_MODEL)
        spec = [tf.TensorSpec(tensor.shape, tf.float32, name="images") for tensor in model.inputs]

        def serve(images):
            outputs = model(images)
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            return {f"output{index}": tensor for index, tensor in enumerate(outputs)}

        if kind == "keras_saved_model":
            # The reference's --keras: Keras writes the model (it loads again with tf_keras.models.load_model),
            # with the same serving signature as the plain SavedModel's.
            model.save(output, save_format="tf", signatures={SIGNATURE: tf.function(serve, input_signature=spec)})
        elif kind in ("saved_model", TFJS_SAVED_MODEL):
            # Keras' export archive tracks what the graph captures (tables and variables of onnx2tf's layers too).
            archive = tf_keras.export.ExportArchive()
            archive.track(model)
            archive.add_endpoint(name=SIGNATURE, fn=serve, input_signature=spec)
            archive.write_out(output)
        else:
            from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

            frozen = convert_variables_to_constants_v2(tf.function(serve, input_signature=spec).get_concrete_function())
            with open(output, "wb") as file:
                file.write(frozen.graph.as_graph_def().SerializeToString(deterministic=True))


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except BaseException as error:  # noqa: BLE001 - onnx2tf ends with sys.exit(1) on a graph it cannot convert
        if isinstance(error, SystemExit) and not error.code:
            raise
        print(f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}",
              file=sys.stderr)
        sys.exit(1)
