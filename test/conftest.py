"""Shared fixtures: the tiny checkpoints (Qwen3-VL and the other Qwen VLMs), synthetic media, and a CPU server.

The test command (scripts/run_tests.sh) exports the CPU environment
(scripts/cpu_env.sh) before Python starts, so the CPU runtime's import hook
is active in this process and in every server it launches.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"


def build_cached_model(
    profile: str = "tiny", architecture: str | None = None, overrides: dict | None = None, variant: str = ""
) -> Path:
    """Build the checkpoint once per version of the builder; later runs reuse it. `variant` names
    the config `overrides` in the cache."""
    from sglang_evs.testing import tiny_model

    architecture = architecture or tiny_model.DEFAULT_ARCHITECTURE
    name = f"{architecture}-{profile}{'-' + variant if variant else ''}-{tiny_model.builders_digest()}"
    out = CACHE / "models" / name
    if not out.exists():  # built aside and renamed, so an interrupted build leaves nothing half-written
        partial = out.with_name(out.name + f".partial-{os.getpid()}")
        tiny_model.build_tiny_model(partial, architecture, profile, overrides)
        try:
            partial.rename(out)
        except OSError:  # another test process (a pytest-xdist worker) built the same checkpoint first
            shutil.rmtree(partial)
    return out


@pytest.fixture
def cpu_graph_stand_ins(monkeypatch) -> None:
    """Graph mode's stand-ins for torch's graph API (`runtime/cpu_graph.py`) in this process, for one test."""
    import torch

    from sglang_evs.runtime.cpu_graph import stand_in_for_cuda_graphs

    monkeypatch.setattr(torch.cuda, "CUDAGraph", torch.cuda.CUDAGraph)
    for name in ("graph_pool_handle", "graph", "is_current_stream_capturing", "synchronize"):
        monkeypatch.setattr(torch.cpu, name, getattr(torch.cpu, name, None), raising=False)
    stand_in_for_cuda_graphs()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return build_cached_model("tiny")


@pytest.fixture(scope="session")
def tiny_qwen3_vl_moe_dir() -> Path:
    return build_cached_model("tiny", "Qwen3VLMoeForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen2_vl_dir() -> Path:
    return build_cached_model("tiny", "Qwen2VLForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir() -> Path:
    return build_cached_model("tiny", "Qwen2_5_VLForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen3_5_dir() -> Path:
    return build_cached_model("tiny", "Qwen3_5ForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen3_5_moe_dir() -> Path:
    return build_cached_model("tiny", "Qwen3_5MoeForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen3_vl_six_layers_dir() -> Path:
    """Qwen3-VL with six language-model layers (pipeline stages; the layers an EAGLE3 draft reads)."""
    return build_cached_model("tiny", overrides=SIX_LAYERS, variant="six-layers")


SIX_LAYERS = {"text_config": {"num_hidden_layers": 6}, "vision_config": {"depth": 3}}
MTP_HEAD = {"text_config": {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}}


@pytest.fixture(scope="session")
def tiny_qwen3_5_mtp_dir() -> Path:
    """The tiny Qwen3.5 with the MTP layer released configs declare, made for drafts that are accepted."""
    return build_cached_model("tiny", "Qwen3_5ForConditionalGeneration", MTP_HEAD, "mtp")


@pytest.fixture(scope="session")
def tiny_qwen3_5_moe_mtp_dir() -> Path:
    return build_cached_model("tiny", "Qwen3_5MoeForConditionalGeneration", MTP_HEAD, "mtp")


@pytest.fixture(scope="session")
def tiny_gemma3_dir() -> Path:
    return build_cached_model("tiny", "Gemma3ForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_glm4v_dir() -> Path:
    return build_cached_model("tiny", "Glm4vForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_glm4v_moe_dir() -> Path:
    return build_cached_model("tiny", "Glm4vMoeForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen3_omni_dir() -> Path:
    return build_cached_model("tiny", "Qwen3OmniMoeForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_nemotron_vl_dir() -> Path:
    """Config and tokenizer only (`--load-format dummy`): transformers has no Nemotron-Nano-VL to draw weights."""
    return build_cached_model("tiny", "NemotronH_Nano_VL_V2")


@pytest.fixture(scope="session")
def tiny_qwen4_exp_dir() -> Path:
    """Weights drawn by transformers' Qwen4-Exp, written without its indexer; served in bfloat16."""
    return build_cached_model("tiny", "Qwen4ExpForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen4_exp_mtp_dir() -> Path:
    """A tiny Qwen4-Exp whose config declares an MTP layer, as released ones do (its weights left out:
    transformers' Qwen4-Exp has no module for it; served with `--speculative-draft-load-format dummy`)."""
    mtp = {"text_config": {"mtp_num_hidden_layers": 1}}
    return build_cached_model("tiny", "Qwen4ExpForConditionalGeneration", mtp, "mtp")


@pytest.fixture(scope="session")
def tiny_llava_dir() -> Path:
    return build_cached_model("tiny", "LlavaForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen3_5_deepstack_dirs() -> tuple[Path, Path]:
    """The tiny Qwen3.5 with a third vision layer, with and without deepstack levels on its three
    layers (SGLang serves them; transformers ignores them); otherwise the same weights."""
    with_levels = {"vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 1, 2]}}
    without = {"vision_config": {"depth": 3}}
    return (
        build_cached_model("tiny", "Qwen3_5ForConditionalGeneration", with_levels, "deepstack"),
        build_cached_model("tiny", "Qwen3_5ForConditionalGeneration", without, "depth3"),
    )


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory) -> Path:
    from sglang_evs.testing import media

    out = tmp_path_factory.mktemp("media")
    media.write_image(out / "image.png", seed=0)
    media.write_image(out / "image2.png", seed=5)
    for kind in media.CLIP_KINDS:
        media.write_clip(out / f"{kind}.mp4", kind, num_frames=8, fps=4)
    if media.video_writer() == "pyav":  # the GPU machine has no PyAV: no sound there, no test of it either
        media.write_tone(out / "tone.m4a")
    return out


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory):
    """One float32 plugin server on the tiny model with its metrics on, shared by every test that needs a
    default server (their results do not depend on what else it served: radix hits are exact)."""
    from sglang_evs.testing.server import running_server

    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(tiny_model_dir, log, ["--dtype", "float32", "--enable-metrics"]) as server:
        yield server


def pytest_configure(config):
    """CPU tests need the CPU route in this process (the runtime's import hook starts with Python);
    a GPU run (`pytest -m gpu ...` on a CUDA machine) must not have it."""
    gpu_run = config.option.markexpr == "gpu"
    cpu_route = os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"
    if not cpu_route and not gpu_run:
        raise pytest.UsageError("run the CPU tests through scripts/run_tests.sh (it sets the CPU environment)")
    if cpu_route and gpu_run:
        raise pytest.UsageError("GPU tests run without the CPU environment: do not source scripts/cpu_env.sh")
    if not cpu_route or not _runs_a_tier(config):
        return
    xdist_controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not xdist_controller:  # the controller of pytest-xdist's workers runs no test
        _prestart_warm_interpreters()
    if "not slow" not in config.option.markexpr and not hasattr(config, "workerinput"):
        from sglang_evs.testing import user_install  # the full tier's user install: mostly pip's waits

        user_install.start(REPO)


def _runs_a_tier(config) -> bool:
    """Whether this session runs the whole test folder (a tier of scripts/run_tests.sh), not chosen modules."""
    chosen = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return all(path == REPO / "test" for path in chosen) and not config.option.collectonly


def _prestart_warm_interpreters() -> None:
    """A tier starts servers of both kinds, eager and graph mode: their warm interpreters import SGLang on the
    second core while this one collects and runs the unit tests (about 10 s each, otherwise waited for)."""
    import tempfile

    from sglang_evs.testing import server, warm_start

    logs = Path(tempfile.mkdtemp(prefix="sglang-evs-warm-"))
    for graph_mode in (False, True):
        env = server.server_environment(True, server.graph_mode_env(graph_mode))
        warm_start.prestart(env, str(logs / f"graph-{graph_mode}.log"))


def pytest_sessionfinish(session) -> None:
    """A pytest-xdist worker hands its warm interpreters to the controller, which prints the summary."""
    from sglang_evs.testing import warm_start

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["warm_started"] = json.dumps([len(warm_start.started), warm_start.why_started()])


_workers_warm: list[tuple[int, list[str]]] = []


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, on the controller
def pytest_testnodedown(node, error) -> None:
    if "warm_started" in getattr(node, "workeroutput", {}):
        _workers_warm.append(json.loads(node.workeroutput["warm_started"]))


def pytest_terminal_summary(terminalreporter) -> None:
    """What the session paid for interpreters importing SGLang: keep new tests on the environments already warm."""
    from sglang_evs.testing import warm_start

    for count, whys in _workers_warm or [(len(warm_start.started), warm_start.why_started())]:
        if count:
            terminalreporter.write_sep("-", f"{count} warm interpreters started (about 10 s each)")
            for index, why in enumerate(whys, start=2):
                terminalreporter.write_line(f"{index}: {why}")
