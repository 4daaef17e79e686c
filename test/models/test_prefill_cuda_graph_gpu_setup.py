"""The GPU test's setup, dry-run on CPU: it must not break unnoticed on machines without a GPU."""

import argparse
from pathlib import Path

import pytest

from sglang_evs.runtime.gpu_route import SERVER_ARGS
from sglang_evs.testing.gpu import without_graphs
from sglang_evs.testing.prefill_graph_gpu import (
    CHECKS,
    CHUNK,
    PRUNED,
    all_cases,
    cases,
    concurrent_batch,
    gpu_server_args,
    serving_all,
)
from sglang_evs.testing.server import CPU_ROUTE_ENV, server_environment


def test_gpu_server_gets_no_cpu_route_even_from_a_cpu_test_process():
    base = {"PATH": "/bin", "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    env = server_environment(cpu=False, extra={"SGLANG_EVS_TRACE": "/tmp/t", "SGLANG_EVS_GPU_ROUTE": "1"}, base=base)
    assert not set(CPU_ROUTE_ENV) & set(env)
    assert env["HF_HUB_OFFLINE"] == "1" and env["SGLANG_EVS_GPU_ROUTE"] == "1" and env["PATH"] == "/bin"
    assert server_environment(cpu=True, base={})["SGLANG_USE_CPU_ENGINE"] == "1"


def parsed(argv: list[str]):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(["--model-path", "m", *argv])


def test_gpu_server_arguments_parse_in_sglang_in_bfloat16_on_triton():
    graphs, eager = parsed(gpu_server_args()), parsed(without_graphs(gpu_server_args()))
    for args in (graphs, eager):
        assert args.device == "cuda" and args.dtype == "bfloat16" and args.chunked_prefill_size == CHUNK
        assert args.attention_backend == "triton"
    assert graphs.cuda_graph_backend_prefill is None and graphs.cuda_graph_backend_decode is None  # SGLang's defaults
    assert eager.cuda_graph_backend_prefill == "disabled" and eager.cuda_graph_backend_decode == "disabled"


def test_route_arguments_select_the_triton_backend_without_flashinfer():
    args = SERVER_ARGS
    assert args[args.index("--attention-backend") + 1] == "triton"
    assert args[args.index("--sampling-backend") + 1] == "pytorch"
    assert not any("flashinfer" in value for value in args if not value.startswith("--"))


def test_cases_cover_q0_both_methods_and_every_media_mix(media_dir):
    requests = all_cases(media_dir)
    assert len(requests) == 3 + 2 * len(PRUNED) and {m for m, _ in PRUNED} == {"evs", "vidcom2"}
    settings = {(k.get("mm_processor_kwargs") or {}).get("video_pruning_method") for _, k in requests.values()}
    assert settings == {None, "evs", "vidcom2"}
    assert all("mm_processor_kwargs" not in kwargs for _, kwargs in cases(media_dir).values())  # upstream's too
    assert len({prompt for prompt, _ in requests.values()}) == len(requests)  # each prefilled, not a radix hit
    _, batch = concurrent_batch(media_dir)
    files = [
        Path(f) for _, kwargs in requests.values() for key in ("image_data", "video_data") for f in kwargs.get(key, [])
    ]
    files += [Path(f) for key in ("image_data", "video_data") for row in batch[key] for f in row]
    assert files and all(f.exists() for f in files)


@pytest.mark.slow
def test_gpu_checks_pass_on_cpu_servers_in_graph_mode(tiny_model_dir, media_dir, tmp_path, capsys):
    """The GPU module's servers, requests and every one of its checks, run on CPU servers in graph mode
    (SGLang's graph runners replaying on CPU stand-ins) in bfloat16: what only a GPU can run is the device."""
    with serving_all(tiny_model_dir, media_dir, tmp_path, on_gpu=False) as served:
        for check in CHECKS:
            check(served)
    printed = capsys.readouterr().out
    assert "largest logprob gap" in printed and "decode steps replayed" in printed
