"""Test tooling: a reference server that prunes by the keep-masks another server decided.

A server laid out another way (other ranks, another split of the tower) is compared with this one under the masks
it decided: the scores of a nearly static clip tie to within rounding, and two layouts' roundings may break such a
tie apart (docs/architecture.md). The reference server's processes import `pinned_site/sitecustomize.py` at start
(`server_env` puts it on their `PYTHONPATH`), which makes `PrunedVideos` take a video's mask from the JSON file
`PINNED_MASKS_ENV` names ({key: kept rows}) where it names the video (`pinned_first`); nothing of this is in the
plugin itself.
"""

import json
import os
from pathlib import Path

import torch

PINNED_MASKS_ENV = "SGLANG_EVS_TEST_PINNED_MASKS"
SITE = Path(__file__).with_name("pinned_site")


def server_env(masks_path: str | Path) -> dict[str, str]:
    """The environment a reference server is started with: the masks file, and the site hook on its path."""
    path = os.pathsep.join(filter(None, (str(SITE), os.environ.get("PYTHONPATH"))))
    return {PINNED_MASKS_ENV: str(masks_path), "PYTHONPATH": path}


def pinned_mask(key: int, rows: int) -> torch.Tensor | None:
    """The [rows] bool mask the file names for the video `key`, or None."""
    path = os.environ.get(PINNED_MASKS_ENV)
    kept = json.loads(Path(path).read_text()).get(str(key)) if path and Path(path).exists() else None
    if kept is None:
        return None
    mask = torch.zeros(rows, dtype=torch.bool)
    mask[kept] = True
    return mask


def pinned_first(decide):
    """`PrunedVideos._compute_keep_mask` (`decide`) made to take the file's mask where it names the video."""

    def keep_mask_pinned_first(videos, item, rows: torch.Tensor) -> torch.Tensor:
        pinned = pinned_mask(item.hash, videos._own_rows(item, rows).shape[0])
        return decide(videos, item, rows) if pinned is None else pinned.to(rows.device)

    return keep_mask_pinned_first
