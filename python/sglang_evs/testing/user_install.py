"""The install a GPU user makes, made on this CPU machine: `pip install sglang-evs` (the wheel built from this
checkout) into a fresh virtual environment, with the dependencies pip resolves for it (SGLang 0.5.23 and the torch
and transformers it declares: PyPI's builds, torch's a CUDA build), and the CPU route's start-up hook beside it to
serve on the CPU.

The environment takes pip about 7 minutes and 11 GB (torch's CUDA libraries), most of it waiting on the registry:
a full test run starts it in the background at once (`start`), at a low priority, and its tests wait for it
(`result`). It is kept under `.cache/` for the next run of the same requirements (the wheel's own and this
Python's); the freshly built wheel is reinstalled each time.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

# What pip says when it cannot reach the registry (it then also says "No matching distribution found", as it does
# for a pin no release satisfies: that alone is a broken requirement, and fails)
UNREACHABLE = (
    "NewConnectionError", "Max retries exceeded", "ConnectTimeoutError", "ProxyError", "Network is unreachable",
    "Temporary failure in name resolution", "Name or service not known", "Connection refused",
)  # fmt: skip
LOW_PRIORITY = ("nice", "-n", "10")  # the suite's own processes first: pip mostly waits on the network anyway


class Unreachable(Exception):
    """The registry cannot give this install here."""


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project at `source`, built with pip in `out` (no build isolation: nothing downloaded)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out),
         str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def pip(python: Path, *args: str, timeout: float = 1800) -> None:
    """`pip install args` in the environment of `python`: Unreachable where pip could not reach the registry,
    RuntimeError for any other failure (a requirement no release satisfies among them)."""
    done = subprocess.run([*LOW_PRIORITY, str(python), "-m", "pip", "install", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0 and any(sign in done.stderr for sign in UNREACHABLE):
        raise Unreachable(done.stderr.strip()[-500:])
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def make(root: Path) -> Path:
    """The user's environment for the checkout at `root` (made, or reused from `.cache/`): its python."""
    wheels = Path(tempfile.mkdtemp(prefix="sglang-evs-user-wheels-"))
    wheel, cpu_route = build_wheel(root, wheels / "plugin"), build_wheel(root / "scripts" / "cpu_route", wheels / "cpu")
    requirements = (root / "pyproject.toml").read_text() + sys.version
    venv = root / ".cache" / f"user-install-{hashlib.sha256(requirements.encode()).hexdigest()[:12]}"
    python, stamp = venv / "bin" / "python", venv / "resolved"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time: pytest-xdist's controller and a worker both ask
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            pip(python, str(wheel))  # as a user would: the plugin, and what its requirements bring
            stamp.write_text("")
        pip(python, "--no-deps", "--force-reinstall", str(wheel), str(cpu_route))
    return python


_made: dict[Path, Future] = {}


def start(root: Path) -> None:
    """Begin making the environment in a background thread of this process (a daemon: a session that ends
    first does not wait for pip; an environment left unfinished has no stamp and is made again next time)."""
    if root in _made:
        return
    made = _made[root] = Future()

    def run() -> None:
        try:
            made.set_result(make(root))
        except BaseException as error:  # noqa: BLE001 - handed to whoever asks for the result
            made.set_exception(error)

    threading.Thread(target=run, name="user-install", daemon=True).start()


def result(root: Path) -> Path:
    """The environment's python, once made (begun here if `start` was not called); raises what making it raised."""
    start(root)
    return _made[root].result()
