"""Prepare, here, the wheels the GPU machine lacks to serve SGLang 0.5.23 with sglang-evs on the GPU route.

The GPU machine has no network: what it lacks travels inside the working tree, at most 64 MiB per device
call (tracked files included). This script downloads the pinned set (scripts/gpu_pack/wheels.txt, Python 3.12
manylinux x86_64, no dependencies), builds this project's own wheels (sglang-evs, the GPU route's .pth
distribution when scripts/gpu_route exists, the decord-over-OpenCV reader), checks that every requirement of a
carried wheel is either carried or on the machine's image (scripts/gpu_pack/image-all.txt) unless left out on
purpose (NOT_CARRIED), and packs them into runs of at most the budget (`.whl/run1`, `.whl/run2`, ...), printing
each run's size; it fails where a run would not fit. Idempotent (downloads are reused).
    python scripts/gpu_wheels.py [--out .whl] [--limit-mib 64]
Then on the device: `run` with carry [".whl/run1"] and `bash scripts/gpu_run.sh` (docs/gpu-route.md).
"""

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "scripts" / "gpu_pack"
MIB = 1 << 20
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64",
]  # fmt: skip
# The GPU machine: CPython 3.12.3 on Linux x86_64 (for evaluating requirement markers).
MARKERS = {
    **default_environment(),
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "python_version": "3.12",
    "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
    "platform_machine": "x86_64", "extra": "",
}  # fmt: skip
# SGLang 0.5.23's requirements that are not carried, and why: the GPU route serves without them
# (test/test_gpu_rehearsal.py serves through exactly this set).
NOT_CARRIED = {
    # CUDA kernel packages, built for torch 2.14.1 (the machine has 2.11.0): the GPU route stands in for them
    "sglang-kernel", "flashinfer-python", "flash-attn-4", "humming-kernels", "nvidia-cutlass-dsl",
    "nvidia-mathdx", "nvshmem4py-cu13", "quack-kernels", "sgl-deep-ep", "sgl-deep-gemm", "sgl-flash-mla",
    "tilelang", "torch-memory-saver", "kernels", "deepseek-recipe", "tml-renderers",
    # the machine's own versions are used: torch 2.11.0, torchaudio 2.11.0, transformers 5.17.0, numba, ...
    "torch", "torchaudio", "transformers", "numba", "timm",
    # cuda-python is a meta package over cuda-bindings, which the machine has
    "cuda-python",
    # video: torchcodec (with FFmpeg) is replaced by decord's API over the machine's OpenCV (sglang-evs-decord-cv2)
    "torchcodec",
    # other grammar backends, other API front ends, hubs, tools: not imported on the serving path
    "llguidance", "outlines", "openai-harmony", "anthropic", "smg-grpc-servicer", "mistral-common",
    "modelscope", "blobfile", "datasets", "easydict", "py-spy", "watchfiles", "zstandard",
}  # fmt: skip


def names_in(path: Path) -> list[str]:
    """The non-comment lines of a list file, comments after `#` stripped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def download(pins: list[str], cache: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           "--abi", "abi3", "--abi", "none", *platforms, "-d", str(cache), *pins]  # fmt: skip
    # PIP_CONSTRAINT emptied: a machine-wide constraint file (torch caps) has no say over this set.
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    noise = re.compile(r"is ignored: it is neither a file nor a directory|^\s*$")
    sys.stderr.write("".join(line + "\n" for line in out.stderr.splitlines() if not noise.search(line)))
    if out.returncode:
        sys.exit(f"pip download failed ({out.returncode})")


def distribution_name(source: Path) -> str:
    """The name a local source distributes under: its PEP 621 `[project]` name, else its `setup.py`'s."""
    pyproject = source / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text()).get("project", {}) if pyproject.is_file() else {}
    if "name" in project:
        return project["name"]
    return re.search(r'name="([^"]+)"', (source / "setup.py").read_text()).group(1)


def build(source: Path, cache: Path) -> None:
    """A local distribution's wheel into `cache` (replacing an older build of it)."""
    declared = distribution_name(source)
    name = canonicalize_name(declared).replace("-", "_")
    for old in cache.glob(f"{name}-*.whl"):
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
           "--no-build-isolation", "-w", str(cache), str(source)]  # fmt: skip
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_CONSTRAINT": ""}, cwd=REPO)
    for leftover in ("build",):  # setuptools' build folder beside the sources
        shutil.rmtree(source / leftover, ignore_errors=True)


def requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(z.read(metadata).decode())
    out = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(MARKERS):
            out.append(req)
    return out


def check(wheels: list[Path], image: set[str]) -> list[str]:
    """Problems: two versions of one distribution, or a requirement neither carried nor on the image."""
    problems = []
    carried: dict[str, Path] = {}
    for wheel in wheels:
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        if name in carried:
            problems.append(f"two wheels of {name}: {carried[name].name}, {wheel.name}")
        carried[name] = wheel
    for name, wheel in carried.items():
        for req in requirements(wheel):
            wanted = canonicalize_name(req.name)
            if wanted in carried or wanted in image:
                continue
            if name == "sglang" and wanted in NOT_CARRIED:
                continue
            problems.append(f"{wheel.name} requires {req}: neither carried nor on the GPU machine's image")
    return problems


def tree_bytes() -> int:
    """What travels besides carried paths: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode:  # not a git checkout: assume the 6 MiB the tree is given
        return 6 * MIB
    files = listed.stdout.split(b"\0")
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def pack(wheels: list[Path], budget: int) -> list[list[Path]]:
    """First fit, largest first: as few runs as the budget allows."""
    runs: list[list[Path]] = []
    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = wheel.stat().st_size
        if size > budget:
            sys.exit(f"{wheel.name} ({size / MIB:.1f} MiB) alone is over a run's budget ({budget / MIB:.1f} MiB)")
        for run in runs:
            if sum(w.stat().st_size for w in run) + size <= budget:
                run.append(wheel)
                break
        else:
            runs.append([wheel])
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / ".whl"), help="ignored folder for the runs (default .whl)")
    parser.add_argument("--limit-mib", type=float, default=64, help="what one device call may carry, tree included")
    parser.add_argument("--margin-mib", type=float, default=1, help="kept free for files written before the run")
    args = parser.parse_args()
    out = Path(args.out)
    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)

    pins = names_in(PACK / "wheels.txt")
    download(pins, cache)
    local = [REPO, PACK / "decord_cv2"]
    if (REPO / "scripts" / "gpu_route" / "setup.py").is_file():
        local.append(REPO / "scripts" / "gpu_route")
    else:
        print("note: scripts/gpu_route/setup.py not on this branch: the GPU route's .pth wheel is not carried")
    for source in local:
        build(source, cache)

    pinned = {canonicalize_name(Requirement(p).name): Requirement(p) for p in pins}
    local_names = {"sglang-evs", "sglang-evs-decord-cv2", "sglang-evs-gpu-route"}
    wheels = []
    for wheel in sorted(cache.glob("*.whl")):
        name, version, *_ = parse_wheel_filename(wheel.name)
        name = canonicalize_name(name)
        if name in local_names or (name in pinned and version in pinned[name].specifier):
            wheels.append(wheel)
    missing = sorted(set(pinned) - {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels})
    problems = check(wheels, set(names_in(PACK / "image-all.txt")))
    problems += [f"{name}: pinned in wheels.txt, no wheel downloaded" for name in missing]
    if problems:
        sys.exit("wheel set incomplete:\n  " + "\n  ".join(problems))

    tree = tree_bytes()
    budget = int(args.limit_mib * MIB) - tree - int(args.margin_mib * MIB)
    runs = pack(wheels, budget)
    for old in out.glob("run*"):
        shutil.rmtree(old)
    total = 0
    print(f"working tree: {tree / MIB:.2f} MiB; budget per run: {budget / MIB:.2f} MiB")
    for i, run in enumerate(runs, 1):
        folder = out / f"run{i}"
        folder.mkdir()
        for wheel in run:
            os.link(wheel, folder / wheel.name)
        size = sum(w.stat().st_size for w in run)
        total += size
        print(f"run{i}: {len(run)} wheels, {size / MIB:.2f} MiB (+ tree {tree / MIB:.2f} = "
              f"{(size + tree) / MIB:.2f} MiB of {args.limit_mib:g})")  # fmt: skip
        for wheel in sorted(run, key=lambda w: -w.stat().st_size):
            print(f"  {wheel.stat().st_size / MIB:7.2f} MiB  {wheel.name}")
    print(f"total: {len(wheels)} wheels, {total / MIB:.2f} MiB in {len(runs)} run(s)")
    if len(runs) > 1:
        print("note: more than one run: scripts/gpu_run.sh installs the runs carried in one call only; carry fewer")


if __name__ == "__main__":
    main()
