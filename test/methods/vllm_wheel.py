"""vLLM's released pruning functions, fetched at test time (nothing of vLLM is in this repository).

`released_module("evs")` / `released_module("vidcom2")` return
`vllm/multimodal/video_prune/{evs,vidcom2}.py` of the vLLM 0.33.0 wheel on PyPI,
imported as standalone modules (both are pure torch: they import only torch).
The two files are cached in `<repo>/.cache/vllm-0.33.0/` (git-ignored) and reused.

The wheel is 336 MB, and only two small members are needed, so they are read
with HTTP range requests (the zip index, then the two members; under 1 MB
in all) from the wheel URL that pip resolves for `vllm==0.33.0` at test time
(`pip install --dry-run --report`: whatever index pip is configured with).
If that fails, `pip download --no-deps vllm==0.33.0` fetches the whole wheel
into a temporary folder, the two files are extracted, the wheel is deleted.
When neither works `VllmUnavailable` is raised, and the tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from functools import cache
from pathlib import Path
from types import ModuleType

VERSION = "0.33.0"
MEMBERS = {name: f"vllm/multimodal/video_prune/{name}.py" for name in ("evs", "vidcom2")}
CACHE = Path(__file__).resolve().parents[2] / ".cache" / f"vllm-{VERSION}"


class VllmUnavailable(RuntimeError):
    """The released vLLM files could not be fetched (no registry access, or the download failed)."""


class _HttpRangeFile(io.RawIOBase):
    """Read-only, seekable view of a remote file through HTTP Range requests (what zipfile needs)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url, self.timeout, self.pos = url, timeout, 0
        head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
        self.size = int(head.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            if response.status != 206:  # a server or proxy that ignores Range would send all 336 MB
                raise OSError(f"no range support (HTTP {response.status})")
            data = response.read()
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def wheel_url() -> str:
    """The URL pip would download `vllm==0.33.0`'s wheel from (each member's CRC is checked when read)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
           "--report", "-", f"vllm=={VERSION}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmUnavailable(f"`pip install --dry-run --report - vllm=={VERSION}` failed: {last}")
    return json.loads(done.stdout)["install"][0]["download_info"]["url"]


def _read_members(wheel: zipfile.ZipFile) -> dict[str, bytes]:
    return {name: wheel.read(member) for name, member in MEMBERS.items()}


def _fetch_by_range() -> dict[str, bytes]:
    with zipfile.ZipFile(io.BufferedReader(_HttpRangeFile(wheel_url()), buffer_size=1 << 16)) as wheel:
        return _read_members(wheel)


def _fetch_by_pip() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, f"vllm=={VERSION}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if done.returncode or not wheels:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise VllmUnavailable(f"`pip download --no-deps vllm=={VERSION}` failed: {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            return _read_members(wheel)


_failures: list[VllmUnavailable] = []  # tried and failed in this process: not again


def fetch() -> dict[str, Path]:
    """Paths of the cached files, fetching them first if needed; raises VllmUnavailable."""
    paths = {name: CACHE / f"{name}.py" for name in MEMBERS}
    if all(p.is_file() for p in paths.values()):
        return paths
    if _failures:
        raise _failures[0]
    try:
        files = _fetch()
    except VllmUnavailable as err:
        _failures.append(err)
        raise
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = paths[name].with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(paths[name])
    return paths


def _fetch() -> dict[str, bytes]:
    try:
        files = _fetch_by_range()
    except Exception as range_error:  # any failure: try pip itself
        try:
            files = _fetch_by_pip()
        except VllmUnavailable as pip_error:
            raise VllmUnavailable(f"range read: {range_error}; {pip_error}") from pip_error
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError) as pip_error:
            raise VllmUnavailable(f"range read: {range_error}; pip download: {pip_error}") from pip_error
    return files


@cache
def released_module(name: str) -> ModuleType:
    """vLLM 0.33.0's `video_prune/<name>.py` as a module; raises VllmUnavailable."""
    path = fetch()[name]
    spec = importlib.util.spec_from_file_location(f"released_vllm_{VERSION.replace('.', '_')}_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # pure torch: needs no stub of other vllm modules
    return module
