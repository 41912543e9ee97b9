"""In-process tests of inplace_doctor: watch(), check_step(), run_with_report() and their fidelity."""

from __future__ import annotations

import gc
import io
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable

import pytest
import torch
from inplace_doctor import (
    InplaceWarning,
    SavedTensorModifiedError,
    Tracker,
    check_step,
    is_inplace_error,
    run_with_report,
    watch,
)
from inplace_doctor.frames import display_path
from torch import nn

# Reports show paths relative to the working directory (pytest's), like this file's own.
THIS_FILE = display_path(__file__, os.getcwd())
LINE: dict[str, int] = {}  # filled by the helpers below: name -> line number of interest


def _lineno() -> int:
    return sys._getframe(1).f_lineno


def output_saved() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    y = x.sigmoid()
    LINE["output_saved.save"] = _lineno() - 1
    y.mul_(2)
    LINE["output_saved.mod"] = _lineno() - 1
    y.sum().backward()


def input_saved_then_rebound() -> None:
    x = torch.randn(3, requires_grad=True)
    h = x * 1
    y = h * h
    h.add_(1)
    del h
    y.sum().backward()


def view_saved() -> None:
    x = torch.randn(3, 3, requires_grad=True)
    h = x * 1
    h2 = h[0]
    y = h2 * h2
    h[0].add_(1)
    y.sum().backward()


def leaf_saved() -> None:
    w = torch.randn(4, requires_grad=True)
    y = (torch.randn(4, requires_grad=True) * w).sum()
    with torch.no_grad():
        w.add_(1)
    y.backward()


def out_argument() -> None:
    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    torch.add(torch.ones(3), 1, out=y.detach())
    y.sum().backward()


def foreach_step() -> None:
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    y = (x * w).sum()
    w.grad = torch.ones(3)
    torch.optim.SGD([w], lr=0.1, foreach=True).step()
    y.backward()


def bfloat16_saved() -> None:
    x = torch.randn(3, requires_grad=True, dtype=torch.bfloat16)
    y = x.sigmoid()
    y.add_(1)
    y.sum().backward()


def autocast_saved() -> None:
    layer = nn.Linear(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(torch.randn(2, 4)).exp()
    y.mul_(2)
    y.float().sum().backward()


def integer_index_saved() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    index = torch.zeros(3, 1, dtype=torch.long)
    y = x.gather(1, index)
    index.add_(1)
    y.sum().backward()


def torchscript_saved() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(_gated)
    w = torch.randn(3, requires_grad=True)
    for _ in range(3):  # the profiling executor builds its differentiable graph after two runs
        scripted(torch.randn(3, requires_grad=True), w).sum().backward()
    out = scripted(torch.randn(3, requires_grad=True), w)
    with torch.no_grad():
        w.add_(1)
    out.sum().backward()


def _gated(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * w) * w


def _message(fn: Callable[[], None]) -> str:
    with pytest.raises(RuntimeError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize(
    "fn",
    [
        output_saved,
        input_saved_then_rebound,
        view_saved,
        leaf_saved,
        out_argument,
        foreach_step,
        bfloat16_saved,
        autocast_saved,
        integer_index_saved,
        torchscript_saved,
    ],
)
def test_watch_raises_pytorchs_exact_error(fn: Callable[[], None]) -> None:
    plain = _message(fn)
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch():
            fn()
    assert str(info.value) == plain
    if fn is torchscript_saved:
        assert "which is output 5 of torch::jit::(anonymous namespace)::DifferentiableGraph," in plain
    if fn in (bfloat16_saved, autocast_saved):
        assert "[CPUBFloat16Type [" in plain
    assert isinstance(info.value, RuntimeError) and is_inplace_error(info.value)
    assert info.value.reports and info.value.reports[0].modified_by


def test_report_fields_and_note() -> None:
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch():
            output_saved()
    report = info.value.reports[0]
    assert report.saved_by.op == "aten::sigmoid"
    assert report.saved_by.line == LINE["output_saved.save"]
    assert report.saved_by.code == "y = x.sigmoid()"
    assert report.saved_by.file == THIS_FILE
    assert [(m.op, m.line) for m in report.modified_by] == [("aten::mul_", LINE["output_saved.mod"])]
    assert (report.tensor.shape, report.tensor.saved_version, report.tensor.current_version) == ([3, 4], 0, 1)
    assert report.to_dict()["tensor"]["dtype"] == "torch.float32"
    assert f"saved by:    aten::sigmoid at {THIS_FILE}:" in report.format()
    assert any("saved by" in note for note in getattr(info.value, "__notes__", []))


def test_check_step_reports_modification_that_does_not_raise() -> None:
    def step() -> None:
        x = torch.randn(4, requires_grad=True)
        aux = x.exp()
        aux.add_(1)
        (x * 2).sum().backward()

    with pytest.warns(InplaceWarning):
        reports = check_step(step)
    assert len(reports) == 1
    assert reports[0].severity == "warning"
    assert reports[0].saved_by.op == "aten::exp"
    assert reports[0].modified_by[0].op == "aten::add_"


def test_check_step_reports_hidden_data_write() -> None:
    def step() -> None:
        layer = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        out = layer(torch.randn(2, 3)).sum()
        layer[2].weight.data.mul_(0.5)
        out.backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InplaceWarning)
        reports = check_step(step)
    assert len(reports) == 1
    assert "without a version bump" in reports[0].error
    assert ".data" in reports[0].fix


def test_check_step_is_silent_for_clean_training_step() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Flatten())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        loss = model(torch.randn(2, 3, 8, 8)).sigmoid().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    with warnings.catch_warnings():
        warnings.simplefilter("error", InplaceWarning)
        assert check_step(step) == [] and check_step(step) == []


def test_sparse_tensors_written_in_place_are_left_alone() -> None:
    """Sparse tensors have no single storage to track; a step that updates one in place is clean."""
    w = torch.randn(3, 2, requires_grad=True)
    adjacency = torch.eye(4, 3).to_sparse()
    counts = torch.zeros(4, 3).to_sparse()

    def step() -> None:
        out = torch.sparse.mm(adjacency, w)  # saves the sparse operand for backward
        counts.add_(adjacency)
        out.sigmoid().sum().backward()

    assert check_step(step) == [] and check_step(step) == []
    assert counts.to_dense().sum().item() == 6


def test_foreach_ops_keep_their_version_bump_under_watch() -> None:
    w = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        before = w._version
        torch._foreach_add_([w], [torch.ones(3)])
        plain = w._version - before
        with watch():
            torch._foreach_add_([w], [torch.ones(3)])
    assert plain == 1 and w._version - before == 2


def test_gradients_are_unchanged_under_watch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 2), nn.Softmax(dim=1))
    x = torch.randn(5, 4)
    model(x).pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with watch():
        model(x).pow(2).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(expected, model.parameters()))


def test_graphs_built_under_watch_are_freed() -> None:
    with watch() as tracker:
        x = torch.randn(3, requires_grad=True)
        y = x.sigmoid() * 2
        ref = weakref.ref(y)
        del y
        gc.collect()
        assert ref() is None
        for _ in range(3000):
            (x.exp() * x).sum().backward()
        tracker._sweep()
        assert tracker._index == {}


def test_nested_watch_shares_tracker() -> None:
    with watch() as outer, watch() as inner:
        assert inner is outer


def test_run_with_report_prints_and_reraises() -> None:
    stream = io.StringIO()
    with pytest.raises(SavedTensorModifiedError):
        run_with_report(output_saved, file=stream)
    assert f"modified by: aten::mul_ at {THIS_FILE}:" in stream.getvalue()
    assert run_with_report(lambda a, b: a + b, 1, b=2) == 3


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(ValueError, match="boom"):
        with watch():
            raise ValueError("boom")
    assert not is_inplace_error(ValueError("boom"))


def _count_dispatched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the name of every operator the tracker's dispatch mode sees."""
    seen: list[str] = []
    original = Tracker.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch protocol
        seen.append(func._schema.name)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(Tracker, "__torch_dispatch__", counting)
    return seen


def test_backward_and_step_after_backward_skip_the_dispatch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _count_dispatched(monkeypatch)
    model = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch():
        loss = model(torch.randn(5, 4)).pow(2).sum()
        forward = len(seen)
        loss.backward()
        opt.step()
    # What remains after forward is the gradient seed, the profiler's record_function ops
    # around the step, and nothing from the engine or the per-parameter AdamW loop.
    assert forward > 0 and len(seen) - forward < 8, seen[forward:]
    assert not any(name.startswith("aten::add") for name in seen[forward:])


def test_create_graph_keeps_the_dispatch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _count_dispatched(monkeypatch)
    with watch():
        x = torch.randn(3, requires_grad=True)
        y = x.exp().sum()
        before = len(seen)
        (grad,) = torch.autograd.grad(y, x, create_graph=True)
        during = len(seen) - before
        grad.sum().backward()
    assert during > 0


def test_write_in_backward_hook_is_named_with_both_lines() -> None:
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch():
            h = x.exp()
            saved_line = _lineno() - 1
            out = h * 3

            def bump(grad: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    h.add_(1)
                LINE["bump"] = _lineno() - 1
                return grad

            out.register_hook(bump)
            out.sum().backward()
            assert sys.getprofile() is None
    (report,) = info.value.reports
    assert (report.saved_by.op, report.saved_by.line) == ("aten::exp", saved_line)
    (site,) = report.modified_by
    assert (site.op, site.line, site.in_backward, site.thread) == ("aten::add_", LINE["bump"], True, "MainThread")
    assert report.observed and report.notes == []
    assert "(during backward)" in report.format()


def test_backward_leaves_no_profiler_behind_and_keeps_one_already_there() -> None:
    calls: list[str] = []

    def profiler(frame, event, arg):  # noqa: ANN001, ANN202 - sys.setprofile protocol
        calls.append(event)

    with watch():
        x = torch.randn(3, requires_grad=True)
        x.exp().sum().backward()
        assert sys.getprofile() is None
        sys.setprofile(profiler)
        try:
            x.exp().sum().backward()
            assert sys.getprofile() is profiler
        finally:
            sys.setprofile(None)
    assert calls


def test_write_from_a_thread_started_under_watch_names_the_thread() -> None:
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch():
            probs = x.sigmoid()

            def shift() -> None:
                with torch.no_grad():
                    probs.sub_(0.5)
                LINE["shift"] = _lineno() - 1

            worker = threading.Thread(target=shift, name="normaliser")
            worker.start()
            worker.join()
            probs.sum().backward()
    (site,) = info.value.reports[0].modified_by
    assert (site.line, site.thread, site.in_backward) == (LINE["shift"], "normaliser", False)
    assert info.value.reports[0].to_dict()["modified_by"][0]["thread"] == "normaliser"


def test_threads_outlive_the_watch_untracked() -> None:
    """A worker started under watch() keeps running after it; its writes are then just executed."""
    results: list[float] = []
    go = threading.Event()

    def later() -> None:
        go.wait(10)
        results.append(torch.ones(2).mul_(3).sum().item())

    with watch():
        worker = threading.Thread(target=later)
        worker.start()
    go.set()
    worker.join()
    assert results == [6.0]


class _FailingStep(torch.optim.Optimizer):
    """Updates its parameters in place, then raises: its step post-hooks never run."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch.optim signature
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(0.1)
        raise ValueError("step failed")


def test_tracking_resumes_after_an_optimizer_step_raises() -> None:
    w = nn.Parameter(torch.randn(3))
    opt = _FailingStep([w])
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch() as tracker:
            (w * 2).sum().backward()
            with pytest.raises(ValueError, match="step failed"):
                opt.step()
            assert tracker._aside == "step"  # off the stack, its post-hook never ran
            output_saved()
    (report,) = info.value.reports
    assert report.saved_by.line == LINE["output_saved.save"]
    assert [site.line for site in report.modified_by] == [LINE["output_saved.mod"]]


def test_engine_entry_is_restored_when_the_last_watch_exits() -> None:
    from inplace_doctor.torch_shim import backward_entry_wrapped

    original = torch.autograd.graph._engine_run_backward
    assert not backward_entry_wrapped()
    with watch():
        assert backward_entry_wrapped()
        with watch():
            assert backward_entry_wrapped()
        assert backward_entry_wrapped()
    assert torch.autograd.graph._engine_run_backward is original
    assert torch.autograd._engine_run_backward is original

    # Watches on two threads overlap: the entry stays wrapped until both have exited.
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with watch():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(10)
    with watch():
        pass
    assert backward_entry_wrapped()
    release.set()
    thread.join()
    assert torch.autograd.graph._engine_run_backward is original


def test_finding_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from inplace_doctor import mode

    monkeypatch.setattr(mode, "MAX_FINDINGS", 3)

    def step() -> None:
        x = torch.randn(4, requires_grad=True)
        for power in range(6):  # six distinct (save, modify) line pairs: exec'd code, one line each
            exec(f"aux = (x + {power}).exp()\naux.add_(1)", {"x": x})
        x.sum().backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InplaceWarning)
        with watch() as tracker:
            step()
            assert len(tracker.findings) == 3 and tracker.dropped_findings == 3


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_model_is_compiled_and_reported_without_recompile_warnings(backend: str) -> None:
    try:
        _check_compiled_model(backend)
    finally:
        torch._dynamo.reset()  # nothing compiled outlives the test (dynamo's caches are noisy at exit)


def _check_compiled_model(backend: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    compiled = torch.compile(model, backend=backend)

    def step(size: int, modify: bool) -> None:
        probs = compiled(torch.randn(size, 4)).sigmoid()
        if modify:
            probs.add_(1)
        probs.sum().backward()

    for size in range(3, 6):  # compiled once per shape, then reused
        step(size, False)
    plain = _message(lambda: step(3, True))
    torch._dynamo.reset()  # compile again, now under watch()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SavedTensorModifiedError) as info:
            with watch():
                for size in range(3, 9):
                    step(size, False)
                step(3, True)
    assert str(info.value) == plain
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # compiled, not run eagerly
    assert not [w for w in caught if "dynamo" in str(w.message).lower() or "recompil" in str(w.message).lower()]
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    for hook in (Tracker.__torch_dispatch__, Tracker._pack, Tracker._unpack):
        assert _debug_get_cache_entry_list(hook.__code__) == []  # dynamo never compiled the doctor itself
    (site,) = info.value.reports[0].modified_by
    assert site.code == "probs.add_(1)"


def test_unobserved_write_is_said_so_in_json_and_text() -> None:
    """A thread started before watch() is not tracked: the report says the bump was not observed."""
    x = torch.randn(3, requires_grad=True)
    shared: dict[str, torch.Tensor] = {}
    ready, go = threading.Event(), threading.Event()

    def early_writer() -> None:
        ready.set()
        go.wait(10)
        with torch.no_grad():
            shared["y"].add_(1)

    writer = threading.Thread(target=early_writer)
    writer.start()
    ready.wait(10)
    with pytest.raises(SavedTensorModifiedError) as info:
        with watch():
            shared["y"] = x.exp()
            go.set()
            writer.join()
            shared["y"].sum().backward()
    data = info.value.reports[0].to_dict()
    assert (data["observed"], data["modified_by"], data["severity"]) == (False, [], "error")
    assert len(data["notes"]) == 1 and "a thread started before it" in data["notes"][0]
    assert "note:        1 version bump(s)" in info.value.reports[0].format()
