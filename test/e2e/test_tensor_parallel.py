"""`--tp-size 2` on the CPU route serves the same greedy tokens as `--tp-size 1`, with and without EVS, and
at q = 0 exactly what upstream SGLang serves at `--tp-size 2`.

Text, an image, and 6-group videos (moving, noise and static clips) at q = 0 and q = .75, each on
servers without and with chunked prefill (64-token chunks cut the videos). The unchunked TP = 2 servers (upstream's
too) build each request's multimodal inputs on rank 0 only and broadcast them to rank 1
(`--enable-broadcast-mm-inputs-process`: a pruned video's item, its keep-mask fields and unpruned layout included,
crosses as rank 0 built it). The chunked TP = 2 servers
also run the vision tower data-parallel over the TP ranks (`--mm-enable-dp-encoder`: each rank encodes
part of the batch's media, then they gather), and run in graph mode (`sglang_evs.testing.server`), as a
GPU serves by default: each rank replays SGLang's decode graphs and the prefill graphs the plugin turns
on (the plugin's server has a default that prunes, `plugin.prefill_graphs_serve_pruning`; every case names
its own rate), its all-reduces inside them. Both TP ranks prune with one keep-mask (rank 0's, broadcast), seen in the
trace.

The static clip's EVS scores after its first group are all rounding noise (its frames are the same
picture), so which 50 of its 500 tied tokens are kept depends on the last bits of the vision tower's
output, and a TP=2 vision tower sums its partial products in another order than a TP=1 one: there the
two servers may keep different tokens of the same count (measured: they do). Its ranks still agree.
"""

from collections import defaultdict

import pytest

from sglang_evs import trace
from sglang_evs.pruning.videos import PERTURB_MASKS_ENV
from sglang_evs.testing import media
from sglang_evs.testing.requests import IMAGE, VIDEO, Generation, chat_prompt, generate, logprob_gap, media_kwargs
from sglang_evs.testing.server import PRUNING_DEFAULT_ARGS, Launch, running_servers

pytestmark = pytest.mark.slow

RATES = (0.0, 0.75)
THRESHOLDS = {"moving": 0.3, "static": 0.05}  # a moving object, and a clip that keeps group 0 only
IMAGE_PRUNINGS = (("divprune", 0.75), ("dart", 0.5))


@pytest.fixture(scope="module")
def scale_media(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_media")
    kinds = ("moving", "noise", "static")
    clips = {kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=24, fps=4, seed=7) for kind in kinds}
    images = {"image": media.write_image(out / "image.png", seed=2), "large image": media.write_image(
        out / "large.png", 256, 256, seed=3)}  # fmt: skip
    return {**images, **clips}


def requests_to_compare(scale_media) -> dict[str, dict]:
    cases = {"text": {"prompt": chat_prompt(text="Count to ten.")}}
    for q in RATES:
        rate = {"mm_processor_kwargs": {"video_pruning_rate": q}}
        cases[f"image q={q}"] = {"prompt": chat_prompt(IMAGE), **media_kwargs(images=[scale_media["image"]]), **rate}
        for kind in ("moving", "noise", "static"):
            cases[f"{kind} video q={q}"] = {
                "prompt": chat_prompt(VIDEO),
                **media_kwargs(videos=[scale_media[kind]]),
                **rate,
            }
    for method, q in IMAGE_PRUNINGS:  # a 64-token image pruned (by rank 0's mask, broadcast)
        cases[f"large image {method} q={q}"] = {
            "prompt": chat_prompt(IMAGE),
            **media_kwargs(images=[scale_media["large image"]]),
            "mm_processor_kwargs": {"image_pruning_method": method, "image_pruning_rate": q},
        }
    for kind, threshold in THRESHOLDS.items():  # decided as each rank's scheduler admits the request
        cases[f"{kind} video t={threshold}"] = {
            "prompt": chat_prompt(VIDEO),
            **media_kwargs(videos=[scale_media[kind]]),
            "mm_processor_kwargs": {"video_pruning_threshold": threshold},
        }
    return cases


def serve_all(server, cases: dict[str, dict]) -> dict[str, Generation]:
    out = {}
    for name, case in cases.items():
        case = dict(case)
        out[name] = generate(server.base_url, case.pop("prompt"), max_new_tokens=12, **case)[0]
    return out


def served_tokens(results: dict[str, Generation]) -> dict[str, tuple[list[int], int]]:
    return {name: (out.output_ids, out.prompt_tokens) for name, out in results.items()}


UNPRUNED = ("text", "image q=0.0", "moving video q=0.0", "noise video q=0.0", "static video q=0.0")


BROADCAST_MM_INPUTS = "--enable-broadcast-mm-inputs-process"


@pytest.fixture(
    scope="module", params=[None, 64], ids=["whole-prefill-broadcast-mm-inputs", "chunked-64-dp-encoder-graphs"]
)
def served(request, tiny_model_dir, tiny_server, tmp_path_factory, scale_media):
    """Every case from a TP=1 server (the session's, unchunked: chunking is exact, so it is the reference
    for both settings) and a TP=2 server, the q = 0 cases from upstream at TP=2 (one server after the
    other), and the TP=2 server's log and trace."""
    chunk = request.param
    args = ["--dtype", "float32"] + (["--chunked-prefill-size", str(chunk)] if chunk else [])
    tp2 = ["--tp-size", "2"] + (["--mm-enable-dp-encoder"] if chunk else [BROADCAST_MM_INPUTS])
    cases = requests_to_compare(scale_media)
    folder = tmp_path_factory.mktemp(f"tp_{chunk}")
    default = list(PRUNING_DEFAULT_ARGS) if chunk else []  # the plugin's prefill graphs on in graph mode
    plans = {
        # rank 1 inverts its own masks before the ranks agree (PERTURB_MASKS_ENV): rank 0's must win
        2: ([*tp2, *default], {trace.ENV: str(folder / "trace-tp2.jsonl"), PERTURB_MASKS_ENV: "1"}, cases),
        "upstream": (tp2, {"SGLANG_PLUGINS": "none"}, {name: cases[name] for name in UNPRUNED}),
    }
    results, logs = {1: serve_all(tiny_server, cases)}, {}
    launches = [
        Launch(tiny_model_dir, folder / f"tp-{name}.log", [*args, *extra], env, graph_mode=chunk is not None)
        for name, (extra, env, _) in plans.items()
    ]
    with running_servers(*launches) as servers:
        for server, (name, (_, _, sent)) in zip(servers, plans.items(), strict=True):
            results[name] = serve_all(server, sent)
            logs[name] = server.log()
    return {"results": results, "log": logs[2], "upstream log": logs["upstream"], "trace": folder / "trace-tp2.jsonl",
            "chunk": chunk}  # fmt: skip


TIE_BOUND = "static video q=0.75"  # every score after group 0 within rounding noise (module docstring)


# In graph mode the plugin's server (its default prunes) prefills under graphs, which upstream keeps off for
# Qwen3-VL, its q = 0 requests too: a replay is padded to its bucket, and a CPU GEMM rounds a row differently
# with the row count (~1e-6 in logprobs).
GRAPH_TOLERANCE = 1e-4


def test_tp2_at_q0_is_bit_identical_to_upstream_tp2(served):
    upstream, ours = served["results"]["upstream"], served["results"][2]
    for name in UNPRUNED:
        if served["chunk"] is None:
            assert ours[name] == upstream[name], name  # tokens, every logprob and top-5 logprob, prompt length
        else:
            assert (ours[name].output_ids, ours[name].prompt_tokens) == (
                upstream[name].output_ids,
                upstream[name].prompt_tokens,
            )
            assert logprob_gap(ours[name], upstream[name]) < GRAPH_TOLERANCE, name


def test_the_unchunked_servers_broadcast_rank_0s_multimodal_inputs(served):
    """SGLang logs its resolved arguments: the flag reached both TP = 2 servers (where a pruned video's inputs
    built on rank 0 only serve the tokens of TP = 1, `test_tp2_greedy_tokens_equal_tp1`)."""
    broadcast = served["chunk"] is None
    for log in (served["log"], served["upstream log"]):
        assert ("'enable_broadcast_mm_inputs_process': True" in log) == broadcast


def test_in_graph_mode_both_ranks_replay_media_prefills_and_decodes(served):
    replays = trace.read(served["trace"], "graph_replay")
    if served["chunk"] is None:  # the eager servers
        assert replays == []
        return
    for rank in {event["pid"] for event in trace.read(served["trace"], "keep_mask")}:
        mine = [r for r in replays if r["pid"] == rank]
        assert any(r["phase"] == "prefill" and r["media"] for r in mine), rank
        assert any(r["phase"] == "decode" for r in mine), rank


def test_tp2_greedy_tokens_equal_tp1(served):
    tp1, tp2 = served_tokens(served["results"][1]), served_tokens(served["results"][2])
    assert tp1.keys() == tp2.keys()
    for name in tp1.keys() - {TIE_BOUND}:
        assert tp2[name] == tp1[name], name
    assert tp2[TIE_BOUND][1] == tp1[TIE_BOUND][1]  # the same kept count
    assert tp1["moving video q=0.75"][1] == tp1["moving video q=0.0"][1] - (600 - 150)  # EVS pruned 450


def test_both_tp_ranks_prune_with_rank_0s_mask(served):
    """Rank 1 computed the inverse of each mask (test-only perturbation); both ranks kept rank 0's."""
    by_item, differed, admitted = defaultdict(dict), defaultdict(dict), set()
    for event in trace.read(served["trace"], "keep_mask"):
        by_item[event["item"]][event["pid"]] = event["kept"]
        differed[event["item"]][event["pid"]] = event["own_differed"]
        if event.get("at_admission"):
            admitted.add(event["item"])
    assert by_item, "no keep-mask was traced"
    for item, masks in by_item.items():
        assert len(masks) == 2  # one per TP rank
        first, second = masks.values()
        assert first == second and (item in admitted or len(first) == 150)
        assert sorted(differed[item].values()) == [False, True]  # rank 1's own mask lost to rank 0's
    assert len(by_item) == 3 + len(THRESHOLDS)  # the three clips at q = .75, the two thresholds at admission
    assert len(admitted) == len(THRESHOLDS)


def test_both_tp_ranks_prune_images_with_rank_0s_mask(served):
    """As for videos: rank 1 inverted its own image masks; both ranks kept rank 0's, 16 and 32 of the 64 tokens."""
    by_item, differed = defaultdict(dict), defaultdict(dict)
    for event in trace.read(served["trace"], "image_keep_mask"):
        by_item[event["item"]][event["pid"]] = event["kept"]
        differed[event["item"]][event["pid"]] = event["own_differed"]
    assert len(by_item) == len(IMAGE_PRUNINGS)
    for item, masks in by_item.items():
        first, second = masks.values()
        assert first == second and len(first) in (16, 32)
        assert sorted(differed[item].values()) == [False, True]
    tp1 = served["results"][1]  # the processor scales both images to 64 tokens
    assert tp1["large image divprune q=0.75"].prompt_tokens == tp1["image q=0.0"].prompt_tokens - 64 + 16


def test_each_rank_got_its_own_core_and_gloo_reduces(served):
    log = served["log"]
    assert "numa_index=0, world_size=2, local_omp_cpuid=0" in log
    assert "numa_index=1, world_size=2, local_omp_cpuid=1" in log
    # SGLang's shared-memory all-reduce needs its Intel AMX / arm64 CPU kernels; without them the
    # TP all-reduce and all-gather go through torch.distributed on the gloo group.
    assert "shared memory based AllReduce is disabled" in log
