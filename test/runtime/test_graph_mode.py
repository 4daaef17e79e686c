"""Graph mode (`runtime/graph_mode.py`): what it changes in a fresh CPU-route interpreter, and the ops it adds
against upstream's own functions, eagerly and replayed from a `CpuGraph` after the batch changed."""

import json

import pytest

from sglang_evs.runtime.graph_mode import GRAPH_MODE_ENV

WIRING = """
    import json, torch
    from sglang.srt.model_executor.cuda_graph_config import default_cuda_graph_config
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    try:
        fill = TorchNativeAttnBackend.get_cuda_graph_seq_len_fill_value(None)
    except NotImplementedError:  # SGLang's: the torch-native backend has no graph support
        fill = None
    print(json.dumps({
        "prefill": str(default_cuda_graph_config().prefill.backend),
        "cuda_graph": torch.cuda.CUDAGraph.__name__,
        "cpu_graph_modes": [m.name for m in ForwardMode if m.is_cpu_graph()],
        "fill": fill,
    }))
"""


@pytest.mark.parametrize("graph_mode", [False, True])
def test_only_the_graph_mode_environment_changes_sglang(cpu_route, graph_mode):
    got = json.loads(cpu_route(WIRING, **({GRAPH_MODE_ENV: "1"} if graph_mode else {})).splitlines()[-1])
    if graph_mode:  # as on CUDA
        assert got["prefill"].endswith("breakable") and got["cuda_graph"] == "CpuGraphSegment"
        assert set(got["cpu_graph_modes"]) >= {"DECODE", "TARGET_VERIFY"} and got["fill"] == 1
    else:  # SGLang's CPU defaults, untouched
        assert got["prefill"].endswith("disabled") and got["cuda_graph"] == "CUDAGraph"
        assert got["cpu_graph_modes"] == ["DECODE"] and got["fill"] is None


OPS = """
    import json, torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.moe import fused_moe_native
    from sglang_evs.runtime import graph_mode
    from sglang_evs.runtime.cpu_graph import CpuGraph

    torch.manual_seed(0)
    backend = object.__new__(TorchNativeAttnBackend)
    H, KH, D, slots, reqs, width = 4, 2, 8, 128, 6, 16
    k_cache, v_cache = torch.randn(slots, KH, D), torch.randn(slots, KH, D)
    req_to_token = torch.randperm(slots)[: reqs * width].view(reqs, width).int()
    gaps = {}

    def attention(kind, bs, lens, prefix):
        tokens = int(sum(lens)) if kind == "extend" else bs
        q, out = torch.randn(tokens, H, D), torch.zeros(tokens, H, D)
        args = (q, out, k_cache, v_cache, req_to_token, torch.arange(bs), torch.tensor(lens))
        if kind == "extend":
            args += (torch.tensor(prefix), torch.tensor([l - p for l, p in zip(lens, prefix)]))
        return args

    for kind in ("decode", "extend"):
        ours = getattr(TorchNativeAttnBackend, f"_run_sdpa_forward_{kind}")
        upstream = graph_mode._upstream[kind]
        extra = {"causal": True} if kind == "extend" else {}
        # eagerly: the op is upstream's function
        args = attention(kind, 3, [5, 9, 2], [2, 6, 0])
        want = upstream(backend, *args[:1], args[1].clone(), *args[2:], scaling=0.3, enable_gqa=True, **extra)
        got = ours(backend, *args, scaling=0.3, enable_gqa=True, **extra)
        gaps[kind] = float((got - want).abs().max())
        # replayed: a graph captured on one batch, replayed after its lengths and requests changed in place
        args = attention(kind, 3, [5, 9, 2], [2, 6, 0])
        graph = CpuGraph()
        with graph:
            ours(backend, *args, scaling=0.3, enable_gqa=True, **extra)
        fresh = attention(kind, 3, [7, 3, 11], [0, 1, 8])
        if kind == "decode":  # same shapes: new rows, requests and lengths copied into the static tensors
            for static, new in zip(args, fresh):
                static.copy_(new)
            graph.replay()
            want = upstream(backend, *fresh[:1], fresh[1].clone(), *fresh[2:], scaling=0.3, enable_gqa=True)
            gaps[kind + " replay"] = float((args[1] - want).abs().max())
            gaps[kind + " replay reads live lengths"] = float((args[1] - got).abs().max())

    # a draft-extend graph's padded batch: no prefix lengths, a padding row at seq_len 1 (the fill) under 3 tokens
    q, out = torch.randn(6, H, D), torch.zeros(6, H, D)
    TorchNativeAttnBackend._run_sdpa_forward_extend(
        backend, q, out, k_cache, v_cache, req_to_token, torch.tensor([1, 0]), torch.tensor([7, 1]), None,
        torch.tensor([3, 3]), scaling=0.3, enable_gqa=True, causal=True)
    want = graph_mode._upstream["extend"](
        backend, q[:3], torch.zeros(3, H, D), k_cache, v_cache, req_to_token, torch.tensor([1]), torch.tensor([7]),
        torch.tensor([4]), torch.tensor([3]), scaling=0.3, enable_gqa=True, causal=True)
    gaps["draft extend, padded"] = float((out[:3] - want).abs().max())

    # MoE: routing replayed on live tokens, not the capture's
    experts, hidden, inter, k = 4, 8, 6, 2
    layer = torch.nn.Module()
    layer.num_experts = experts
    layer.w13_weight = torch.randn(experts, 2 * inter, hidden)
    layer.w2_weight = torch.randn(experts, hidden, inter)
    config = type("Config", (), {"apply_router_weight_on_input": False, "activation": "silu",
                                 "gemm1_alpha": None, "gemm1_clamp_limit": None})()
    def routed(tokens):
        x = torch.randn(tokens, hidden)
        ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).int()  # k distinct each
        return x, torch.rand(tokens, k), ids
    x, w, ids = routed(5)
    graph = CpuGraph()
    with graph:
        out = fused_moe_native.moe_forward_native(layer, x, (w, ids, None), config)
    x2, w2, ids2 = routed(5)
    ids2 = (ids2 + 1) % experts  # other experts than at capture
    for static, new in ((x, x2), (w, w2), (ids, ids2)):
        static.copy_(new)
    graph.replay()
    want = graph_mode._upstream["moe"](layer, x2, (w2, ids2, None), config)
    gaps["moe replay"] = float((out - want).abs().max())
    print(json.dumps(gaps))
"""


def test_attention_and_moe_ops_are_upstreams_and_replay_on_the_live_batch(cpu_route):
    gaps = json.loads(cpu_route(OPS, **{GRAPH_MODE_ENV: "1"}).splitlines()[-1])
    assert gaps["decode"] == gaps["extend"] == 0.0  # eagerly, bit for bit upstream's
    assert gaps["decode replay"] == 0.0  # the replay read the new requests and lengths
    assert gaps["decode replay reads live lengths"] > 1e-3  # ... and they did change the answer
    assert gaps["moe replay"] == 0.0  # routed as the live tokens are
    assert gaps["draft extend, padded"] == 0.0  # the padding row (seq_len 1 < its 3 tokens) did not stop it


RESOLVE = """
    import json
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang_evs import sglang_compat

    load_plugins()  # as `sglang.launch_server` does before it resolves (none under SGLANG_PLUGINS=none)
    backends = {}
    for name, argv in json.loads(CASES):
        server_args = prepare_server_args(argv)
        server_args.resolve_once()
        backends[name] = str(resolving_view(server_args).cuda_graph_config.prefill.backend).rsplit(".", 1)[-1]
    print(json.dumps({"backends": backends, "allowlist": sglang_compat.BREAKABLE_CUDA_GRAPH_MM_ARCHS}))
"""


def test_prefill_graphs_resolve_as_upstreams_unless_the_servers_default_prunes(
    cpu_route, tiny_model_dir, tiny_qwen3_5_dir, tiny_qwen3_omni_dir, tiny_gemma3_dir
):
    """Server-argument resolution in graph mode (prefill graphs breakable by default, as on CUDA), with the plugin
    and without it: the plugin turns prefill graphs on only for its architectures off SGLang's allowlist whose
    server default prunes (`plugin.prefill_graphs_serve_pruning`); a server at q = 0 resolves as upstream's,
    and SGLang's allowlist itself is left as it is."""
    from sglang_evs.testing.server import cpu_server_args

    prunes = ["--json-model-override-args", '{"video_pruning_rate": 0.5}']
    cases = {
        "qwen3_vl q=0": (tiny_model_dir, []),
        "qwen3_vl q=0.5": (tiny_model_dir, prunes),
        "qwen3_vl q=0 by flag": (tiny_model_dir, ["--cuda-graph-backend-prefill", "breakable"]),
        "qwen3_5 q=0 (on SGLang's allowlist)": (tiny_qwen3_5_dir, []),
        "qwen3_omni q=0": (tiny_qwen3_omni_dir, []),
        "qwen3_omni q=0.5": (tiny_qwen3_omni_dir, prunes),
        "gemma3 (not served)": (tiny_gemma3_dir, []),
    }
    argv = [
        (name, ["--model-path", str(path), *cpu_server_args(path), *extra]) for name, (path, extra) in cases.items()
    ]
    code = f"    CASES = {json.dumps(json.dumps(argv))}" + RESOLVE  # indented as the snippet is
    # the plugin's run in the module's graph-mode interpreter (its other snippets load no plugin and read no hook)
    resolved = {
        plugin: json.loads(cpu_route(code, **{GRAPH_MODE_ENV: "1", **env}).splitlines()[-1])
        for plugin, env in (("on", {}), ("off", {"SGLANG_PLUGINS": "none"}))
    }
    ours, upstream = resolved["on"]["backends"], resolved["off"]["backends"]
    assert ours == {**upstream, "qwen3_vl q=0.5": "breakable", "qwen3_omni q=0.5": "breakable"}, (ours, upstream)
    assert upstream["qwen3_vl q=0"] == upstream["qwen3_vl q=0.5"] == "disabled"  # upstream keeps Qwen3-VL eager
    assert upstream["qwen3_omni q=0"] == upstream["qwen3_omni q=0.5"] == "disabled"  # and Qwen3-Omni
    assert upstream["qwen3_vl q=0 by flag"] == upstream["qwen3_5 q=0 (on SGLang's allowlist)"] == "breakable"
    assert resolved["on"]["allowlist"] == resolved["off"]["allowlist"]
