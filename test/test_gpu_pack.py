"""scripts/gpu_wheels.py's checks and packing, on made-up wheels (the real set: test/test_gpu_rehearsal.py)."""

import importlib.util
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / "scripts" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_wheels)


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), size: int = 0) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", metadata)
        z.writestr("padding", b"\0" * size)  # stored, not deflated: the file is about this large
    return path


def test_a_requirement_must_be_carried_or_on_the_image(tmp_path):
    wheels = [
        wheel(tmp_path, "fastapi", "1.0", ("starlette>=1", "pydantic", "colorama; sys_platform == 'win32'")),
        wheel(tmp_path, "starlette", "1.0", ("anyio",)),
        wheel(tmp_path, "sglang", "0.5.23", ("torch==2.14.1", "sglang-kernel==0.4.10", "fastapi", "mystery")),
    ]
    problems = gpu_wheels.check(wheels, image={"anyio"})
    assert any("requires pydantic" in p for p in problems), problems
    assert any("requires mystery" in p for p in problems), problems
    assert not any("colorama" in p or "torch" in p or "sglang-kernel" in p for p in problems), problems
    assert len(problems) == 2


def test_two_versions_of_one_distribution_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    wheels = [wheel(tmp_path, "orjson", "3.13.0"), wheel(tmp_path / "a", "orjson", "3.12.0")]
    assert any("two wheels of orjson" in p for p in gpu_wheels.check(wheels, image=set()))


def test_runs_are_packed_largest_first_within_the_budget(tmp_path):
    mib = gpu_wheels.MIB
    wheels = [wheel(tmp_path, f"w{i}", "1", size=s * mib) for i, s in enumerate((40, 10, 15, 5))]
    runs = gpu_wheels.pack(wheels, budget=61 * mib)
    assert [sorted(w.name[:2] for w in run) for run in runs] == [["w0", "w2", "w3"], ["w1"]]
    with pytest.raises(SystemExit, match="alone is over"):
        gpu_wheels.pack(wheels, budget=30 * mib)


def test_every_carried_wheel_is_pinned_and_not_on_the_image():
    pins = gpu_wheels.names_in(REPO / "scripts" / "gpu_pack" / "wheels.txt")
    image = set(gpu_wheels.names_in(REPO / "scripts" / "gpu_pack" / "image-all.txt"))
    assert all("==" in pin for pin in pins), pins
    names = {gpu_wheels.canonicalize_name(pin.split("==")[0]) for pin in pins}
    assert not names & image, names & image
    assert "sglang" in names and not names & gpu_wheels.NOT_CARRIED
