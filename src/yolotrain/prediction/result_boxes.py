"""A detection result's boxes: the ``[n, 4]`` tensor they always were, answering YOLO tooling's names too."""

from __future__ import annotations

import copy
from typing import Any

import torch


class Boxes(torch.Tensor):
    """The ``[n, 4]`` x1, y1, x2, y2 pixel boxes of a result, as a tensor (indexing, ``tolist()``, ``numpy()``,
    arithmetic and torch functions work as on any tensor and give plain tensors), with the attributes users of
    YOLO tooling expect of ``result.boxes``:

    - ``xyxy``: the boxes ``[n, 4]``; ``xywh``: centre x, centre y, width, height ``[n, 4]``;
    - ``conf``: the scores ``[n]``; ``cls``: the class ids ``[n]`` (long);
    - ``data``: ``[n, 6]`` rows x1, y1, x2, y2, conf, cls (in the boxes' dtype), not torch's ``Tensor.data``
      (the tensor without its autograd history: results have none).

    Made by :meth:`of`; the detections' scores and classes are the result's own tensors.
    """

    # Operations give plain tensors: a slice or a sum of boxes has no scores or classes of its own.
    __torch_function__ = torch._C._disabled_torch_function_impl

    _conf: torch.Tensor
    _cls: torch.Tensor

    @staticmethod
    def of(xyxy: torch.Tensor, conf: torch.Tensor, cls: torch.Tensor) -> Boxes:
        """``xyxy`` ``[n, 4]`` (its storage, not a copy) as :class:`Boxes` with the detections' ``conf`` and
        ``cls`` (``[n]`` each)."""
        if xyxy.ndim != 2 or xyxy.shape[1] != 4 or conf.shape != (len(xyxy),) or cls.shape != (len(xyxy),):
            raise ValueError(f"boxes [n, 4] with scores and classes [n] each, got {tuple(xyxy.shape)}, "
                             f"{tuple(conf.shape)} and {tuple(cls.shape)}")
        boxes = xyxy.as_subclass(Boxes)
        boxes._conf, boxes._cls = conf, cls
        return boxes

    def __deepcopy__(self, memo: dict[int, Any]) -> Boxes:
        # torch's copy makes new tensors through new_empty, which operations leave plain.
        return Boxes.of(copy.deepcopy(self.xyxy, memo), copy.deepcopy(self._conf, memo),
                        copy.deepcopy(self._cls, memo))

    @property
    def xyxy(self) -> torch.Tensor:
        """x1, y1, x2, y2 ``[n, 4]``: the boxes as a plain tensor (the same storage)."""
        return self.as_subclass(torch.Tensor)

    @property
    def xywh(self) -> torch.Tensor:
        """Centre x, centre y, width, height ``[n, 4]``."""
        xyxy = self.xyxy
        return torch.cat(((xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]), 1)

    @property
    def conf(self) -> torch.Tensor:
        """The detections' scores ``[n]``."""
        return self._conf

    @property
    def cls(self) -> torch.Tensor:
        """The detections' class ids ``[n]``."""
        return self._cls

    @property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        """``[n, 6]``: x1, y1, x2, y2, conf, cls."""
        xyxy = self.xyxy
        return torch.cat((xyxy, self._conf[:, None].to(xyxy.dtype), self._cls[:, None].to(xyxy.dtype)), 1)
