"""The GPU test's setup, dry-run on CPU: it must not break unnoticed on machines without a GPU."""

from pathlib import Path

from test_prefill_cuda_graph_gpu import BACKENDS, NO_DEEPSTACK, cases, gpu_server_args

from sglang_evs.testing.server import CPU_ROUTE_ENV, server_environment


def test_gpu_server_gets_no_cpu_route_even_from_a_cpu_test_process():
    base = {"PATH": "/bin", "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    env = server_environment(cpu=False, extra={"SGLANG_EVS_TRACE": "/tmp/t"}, base=base)
    assert not set(CPU_ROUTE_ENV) & set(env)
    assert env["HF_HUB_OFFLINE"] == "1" and env["SGLANG_EVS_TRACE"] == "/tmp/t" and env["PATH"] == "/bin"
    assert server_environment(cpu=True, base={})["SGLANG_USE_CPU_ENGINE"] == "1"


def test_gpu_server_arguments_parse_in_sglang():
    import argparse

    from sglang.srt.server_args import ServerArgs

    for backend in (*BACKENDS, "disabled"):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        argv = ["--model-path", "m", *gpu_server_args(backend), "--json-model-override-args", NO_DEEPSTACK]
        args = ServerArgs.from_cli_args(parser.parse_args(argv))
        assert args.device == "cuda" and args.chunked_prefill_size == 64


def test_cases_cover_both_rates_and_every_media_mix(media_dir):
    requests = cases(media_dir)
    rates = {kwargs["mm_processor_kwargs"]["video_pruning_rate"] for _, kwargs in requests}
    assert rates == {0.0, 0.75} and len(requests) == 6
    files = [Path(f) for _, kwargs in requests for key in ("image_data", "video_data") for f in kwargs.get(key, [])]
    assert files and all(f.exists() for f in files)
