"""The CPU nms registered for torchvision, against a brute-force reference."""

import torch

from sglang_evs.runtime.torch_ops import nms_cpu


def brute_force_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
        return inter / (area(a) + area(b) - inter)

    keep: list[int] = []
    for i in sorted(range(len(boxes)), key=lambda i: -scores[i].item()):
        if all(iou(boxes[i].tolist(), boxes[k].tolist()) <= threshold for k in keep):
            keep.append(i)
    return keep


def test_nms_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        xy = torch.rand(30, 2, generator=gen) * 50
        wh = torch.rand(30, 2, generator=gen) * 20 + 1
        boxes = torch.cat([xy, xy + wh], dim=1)
        scores = torch.rand(30, generator=gen)
        assert nms_cpu(boxes, scores, 0.4).tolist() == brute_force_nms(boxes, scores, 0.4)
