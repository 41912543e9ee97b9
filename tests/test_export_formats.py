"""Export formats are plug-ins: one registry entry per format is all the exporter, the runtime loader and
the trust check know about formats."""

from __future__ import annotations

import json

import pytest

from yolotrain.interop import export
from yolotrain.interop.backends import BACKENDS, NOT_RUNNABLE, is_exported
from yolotrain.interop.formats import REGISTRY, ExportFormat, ExportJob
from yolotrain.interop.formats._common import staged
from yolotrain.interop.trust import needs_trust


def write_metadata(job: ExportJob) -> None:
    """A format that stores only the metadata and what the writer was given, as JSON."""
    with staged(job.out) as path:
        path.write_text(json.dumps({**job.metadata, "example": list(job.example.shape),
                                    "job_dynamic_batch": job.dynamic_batch}))


def test_a_registered_format_is_exported_through_its_entry(model, tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, "probe", ExportFormat(name="probe", suffix=".probe", title="Probe",
                                                        write=write_metadata, half=True,
                                                        read_metadata=lambda path: json.loads(path.read_text())))
    path = export(model, "probe", out=tmp_path / "m.probe", img_size=64, half=True)
    written = json.loads(path.read_text())
    assert (written["precision"], written["img_size"], written["example"]) == ("fp16", "[64, 64]", [1, 3, 64, 64])
    # Not dynamic: the graph is fixed at batch 1 whatever was asked, in the metadata and for the writer.
    assert written["dynamic_batch"] == "false" and written["job_dynamic_batch"] is False
    with pytest.raises(ValueError, match="int8 \\(--int8\\) export is available for onnx, openvino, tflite, not probe"):
        export(model, "probe", out=tmp_path / "other.probe", img_size=64, int8=True, data=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.probe"]


def test_every_format_is_runnable_or_says_why_and_its_suffix_is_known():
    assert set(REGISTRY) == {"coreml", "engine", "executorch", "mnn", "ncnn", "onnx", "openvino", "paddle", "pb",
                             "saved_model", "tfjs", "tflite", "torchscript"}
    for name, spec in REGISTRY.items():
        assert (spec.runtime is None) != (spec.not_runnable is None), name
        assert is_exported(f"model{spec.suffix}")
        assert needs_trust(f"model{spec.suffix}") == (name in ("engine", "paddle", "pb", "saved_model",
                                                                       "torchscript"))
    assert set(BACKENDS) | set(NOT_RUNNABLE) == {spec.suffix for spec in REGISTRY.values()}
