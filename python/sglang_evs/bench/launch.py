"""Launch the server a benchmark talks to: on CPU through the test harness, elsewhere as given.

`server_args` are extra `sglang.launch_server` arguments. Without ``--device`` or with
``--device cpu`` the CPU harness (`sglang_evs.testing.server.running_server`) adds its CPU
arguments and environment; with any other device (``--device cuda``) the command is
``python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P SERVER_ARGS`` and
nothing CPU-specific is set.
"""

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sglang_evs import sglang_compat as sglang
from sglang_evs.testing.requests import pruning_setting
from sglang_evs.testing.server import RunningServer, running_server


def on_cpu(server_args: Sequence[str]) -> bool:
    """True unless the server's `--device` names something other than cpu (as SGLang's parser reads it)."""
    return sglang.server_flags(server_args).device in (None, "cpu")


def rate_args(pruning_rate: float | None, method: str = "evs") -> list[str]:
    """Server arguments that prune every video at ``pruning_rate`` with ``method`` (none for None)."""
    if pruning_rate is None:
        return []
    return ["--json-model-override-args", json.dumps(pruning_setting(pruning_rate, method))]


@contextmanager
def serving(
    model_path: str | Path,
    log_path: str | Path,
    server_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> Iterator[RunningServer]:
    """Start a server, wait until /health_generate answers, yield it, always stop its process group."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with running_server(model_path, log_path, server_args, env, timeout, cpu=on_cpu(server_args)) as server:
        yield server


def benchmark_model(model_path: str | Path | None, work: Path) -> Path:
    """The checkpoint a CPU benchmark serves: `model_path`, or the tiny Qwen3-VL, built once in `work`."""
    from sglang_evs.testing.tiny_model import build_tiny_model

    if model_path is not None:
        return Path(model_path)
    model = work / "qwen3-vl-tiny"
    if not model.exists():
        build_tiny_model(model, profile="tiny")
    return model
