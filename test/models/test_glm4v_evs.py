"""GLM-4.1V and GLM-4.5V, the first family off the Qwen processor, pruned through the same mechanism (float32).

GLM's own processor writes a video as one image-token run per temporal group, each followed by
`<|end_of_image|>`, its second and `<|begin_of_image|>`; its positions come from upstream's
`get_rope_index_glm4v` (each group its own grid). The guarantees are Qwen3-VL's: q = 0 bit-identical to
upstream, exact counts, an HF oracle at the reference positions, chunked prefill and radix hits,
concurrent mixed media, usage and Prometheus counts.

The HF oracle (transformers' Glm4v and Glm4vMoe) covers one video (EVS, moving and static), a video beside an
image and two videos (GLM's image and video rows share one token id), VidCom2 and GLM-4.5V, each keeping more
than group 0; two wrong position rules (one position late, the compacted sequence renumbered) fail it. Checked
by hand: with `VideoPruner.write_positions` left out (positions as laid out before encoding), every pruned
oracle case fails.
"""

import dataclasses
from functools import cache
from pathlib import Path

import pytest
import requests
import torch

from sglang_evs import trace
from sglang_evs.methods import METHODS
from sglang_evs.testing import media
from sglang_evs.testing.chunked import assert_media_prefills_and_decodes_replayed
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.hf_reference import (
    HFReference,
    assert_masks_agree_up_to_ties,
    assert_matches_hf,
    hf_greedy_on_kept,
)
from sglang_evs.testing.requests import (
    GLM4V_IMAGE,
    GLM4V_VIDEO,
    counter_increase,
    flush_cache,
    generate,
    glm4v_chat_prompt,
    logprob_gap,
    media_kwargs,
    per_request_rate,
    pruning_metrics,
)
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.workload import send_alone, send_together

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

DENSE, MOE = "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration"
FIXTURES = {DENSE: "tiny_glm4v_dir", MOE: "tiny_glm4v_moe_dir"}
SIDE = 112  # pixels: GLM's processor makes 8 x 8 patches of 14, merged into 4 x 4 tokens per group
# A 24-frame 4 fps clip -> GLM samples 12 frames at 2 fps -> 6 groups. (With 4 groups, EVS at q = .75 keeps
# exactly group 0, where the layout laid out before encoding is already the true one.)
GROUPS, TOKENS_PER_GROUP = 6, 16
CHUNK = 29  # tokens per prefill chunk on the chunked server: cuts inside groups and on their timestamps
CHUNKED_DEFAULT = {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.5}
# Prefill graphs up to 64 tokens: SGLang's default buckets stop below a 29-token chunk, which would then not replay.
GRAPH_PREFILL_BUCKETS = ("--cuda-graph-max-bs-prefill", "64")


def evs_count(q: float) -> int:
    """The EVS kept count written out: max(tpf, int(T * tpf * (1 - q)))."""
    return max(TOKENS_PER_GROUP, int(GROUPS * TOKENS_PER_GROUP * (1 - q)))


def write_clip(path: Path, kind: str, seed: int = 3) -> Path:
    return media.write_clip(path, kind, num_frames=24, fps=4, seed=seed, height=SIDE, width=SIDE)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("glm4v_clips")
    return {kind: write_clip(out / f"{kind}.mp4", kind) for kind in media.CLIP_KINDS}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("glm4v_images")
    return [media.write_image(out / f"image{seed}.png", SIDE, SIDE, seed=seed) for seed in (0, 1)]


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory) -> dict:
    """Started together: {(architecture, "on"): the plugin's server (default rate 0, metrics on, traced),
    (architecture, "off"): upstream's, "chunked": the plugin's GLM-4.1V in 29-token chunks with VidCom2 at
    q = .5 as its default, "graphs": the plugin's GLM-4.5V with EVS at q = .5 as its default}; {"trace", name}:
    the plugin servers' trace files. The chunked and graphs servers run in graph mode
    (`sglang_evs.testing.server`), as a GPU serves by default: SGLang's decode graphs and the prefill graphs the
    plugin turns on for GLM where the server's default prunes replay."""
    work = tmp_path_factory.mktemp("glm4v")
    dirs = {architecture: request.getfixturevalue(fixture) for architecture, fixture in FIXTURES.items()}
    plans, launches = [], []
    for architecture, plugin in [(a, p) for a in FIXTURES for p in ("on", "off")]:
        traced = {"SGLANG_EVS_TRACE": str(work / f"trace-{architecture}.jsonl")}
        env = traced if plugin == "on" else {"SGLANG_PLUGINS": "none"}
        args = ["--dtype", "float32", *(["--enable-metrics"] if plugin == "on" else [])]
        plans.append((architecture, plugin))
        launches.append(Launch(dirs[architecture], work / f"{architecture}-{plugin}.log", args, env))
    chunked = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), *GRAPH_PREFILL_BUCKETS]
    chunked += ["--json-model-override-args", str(CHUNKED_DEFAULT).replace("'", '"')]
    plans.append("chunked")
    traced = {"SGLANG_EVS_TRACE": str(work / "trace-chunked.jsonl")}
    launches.append(Launch(dirs[DENSE], work / "chunked.log", chunked, traced, graph_mode=True))
    plans.append("graphs")
    traced = {"SGLANG_EVS_TRACE": str(work / "trace-graphs.jsonl")}
    graphs = ["--dtype", "float32", "--json-model-override-args", '{"video_pruning_rate": 0.5}']
    launches.append(Launch(dirs[MOE], work / "graphs.log", graphs, traced, graph_mode=True))
    with running_servers(*launches) as started:
        out: dict = dict(zip(plans, started, strict=True))
        out.update({("trace", architecture): work / f"trace-{architecture}.jsonl" for architecture in FIXTURES})
        out.update({("trace", name): work / f"trace-{name}.jsonl" for name in ("chunked", "graphs")})
        out["dirs"] = dirs
        yield out


@pytest.fixture(params=list(FIXTURES))
def architecture(request) -> str:
    return request.param


def video(server, clip: Path, q: float | None = None, method: str = "evs", **extra):
    kwargs = per_request_rate(q, method) if q is not None else {}
    prompt = glm4v_chat_prompt(GLM4V_VIDEO)
    return generate(server.base_url, prompt, **media_kwargs(videos=[clip]), **kwargs, **extra)[0]


# --- no pruning: bit-identical to upstream


def parity_cases(clips, images) -> dict[str, tuple[str, dict]]:
    return {
        "text": (glm4v_chat_prompt(text="Count the objects."), {}),
        "image": (glm4v_chat_prompt(GLM4V_IMAGE), media_kwargs(images=[images[0]])),
        "video": (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["moving"]])),
        "image+video": (
            glm4v_chat_prompt(GLM4V_IMAGE, GLM4V_VIDEO),
            media_kwargs(images=[images[1]], videos=[clips["noise"]]),
        ),
    }


@pytest.mark.parametrize("case", ["text", "image", "video", "image+video"])
def test_q0_is_bit_identical_to_upstream(servers, architecture, clips, images, case):
    """The plugin's server at its default rate 0 and upstream SGLang, each from an empty radix cache."""
    prompt, kwargs = parity_cases(clips, images)[case]
    replies = []
    for plugin in ("on", "off"):
        flush_cache(servers[architecture, plugin].base_url)
        replies.append(generate(servers[architecture, plugin].base_url, prompt, **kwargs)[0])
    ours, upstream = replies
    assert ours == upstream  # tokens, logprobs, top logprobs, prompt and cached tokens
    if "video" in case:
        assert ours.meta["video_tokens"] == GROUPS * TOKENS_PER_GROUP


def test_the_plugin_serves_glm_through_its_adapter(servers, architecture, clips):
    video(servers[architecture, "on"], clips["static"], 0.5)
    (allocated,) = trace.read(servers["trace", architecture], "graph_inputs_allocated")
    assert allocated["model"] == architecture and allocated["deepstack_ptr"] is None
    calls = [c for c in trace.read(servers["trace", architecture], "language_model_inputs") if c["mode"] == "EXTEND"]
    assert calls and {c["positions_ptr"] for c in calls} == {allocated["positions_ptr"]}


# --- counts


@pytest.mark.parametrize("q", [0.25, 0.5, 0.75, 0.8])  # at .8, 19 tokens: past group 0 (at .9 only group 0)
def test_prompt_tokens_drop_by_exactly_the_pruned_count(servers, architecture, clips, q):
    server = servers[architecture, "on"]
    unpruned = video(server, clips["moving"], 0.0)
    assert unpruned.meta["video_tokens"] == GROUPS * TOKENS_PER_GROUP
    pruned = video(server, clips["moving"], q)
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - evs_count(q))
    assert pruned.meta["video_tokens"] == pruned.meta["video_tokens_after_pruning"] == evs_count(q)
    assert pruned.meta["video_tokens_before_pruning"] == GROUPS * TOKENS_PER_GROUP


def test_vidcom2_keeps_its_own_count(servers, clips):
    """VidCom2 per request: max(T, int(T * tpf * (1 - q))) tokens, a different count from EVS's at q = .9."""
    server = servers[DENSE, "on"]
    unpruned = video(server, clips["noise"], 0.0)
    pruned = video(server, clips["noise"], 0.9, method="vidcom2")
    kept = max(GROUPS, int(GROUPS * TOKENS_PER_GROUP * 0.1))
    assert kept != evs_count(0.9)
    assert pruned.meta["video_pruning_method"] == "vidcom2" and pruned.meta["video_tokens"] == kept
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - kept)


def test_a_one_frame_video_is_one_group_kept_whole(servers, clips, tmp_path):
    """GLM's sampler repeats a lone frame into one temporal group (Qwen's needs two frames: `served.GLM4V`
    says one is enough). Beside a six-group video pruned at q = .5, it keeps its group whole: the request's
    video tokens are its 16 and the other video's EVS count, and the prompt drops by that video's pruned
    count only."""
    server = servers[DENSE, "on"]
    one = media.write_clip(tmp_path / "one.mp4", "moving", num_frames=1, fps=4, seed=9, height=SIDE, width=SIDE)
    prompt, kwargs = glm4v_chat_prompt(GLM4V_VIDEO, GLM4V_VIDEO), media_kwargs(videos=[one, clips["moving"]])
    unpruned, pruned = (generate(server.base_url, prompt, **kwargs, **per_request_rate(q))[0] for q in (0.0, 0.5))
    assert unpruned.meta["video_tokens"] == TOKENS_PER_GROUP + GROUPS * TOKENS_PER_GROUP
    assert pruned.meta["video_tokens"] == TOKENS_PER_GROUP + evs_count(0.5)
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - evs_count(0.5))


def test_images_are_never_pruned(servers, architecture, images, clips):
    """GLM writes video rows with the image token: an image beside a video pruned at q = .9 keeps every row
    (the prompt drops by exactly the video's pruned count, and the image's reported rows are q = 0's)."""
    server = servers[architecture, "on"]
    prompt = glm4v_chat_prompt(GLM4V_IMAGE, GLM4V_VIDEO)
    kwargs = media_kwargs(images=images[:1], videos=[clips["moving"]])
    unpruned, pruned = (generate(server.base_url, prompt, **kwargs, **per_request_rate(q))[0] for q in (0.0, 0.9))
    assert pruned.prompt_tokens == unpruned.prompt_tokens - (GROUPS * TOKENS_PER_GROUP - evs_count(0.9))
    assert pruned.meta["image_tokens"] == unpruned.meta["image_tokens"] > 0


def test_what_pruning_saved_is_reported_per_request_and_per_server(servers, architecture, tmp_path):
    server = servers[architecture, "on"]
    before = pruning_metrics(server.base_url)
    served = video(server, write_clip(tmp_path / "unseen.mp4", "noise", seed=41), 0.75)
    delta = counter_increase(before, pruning_metrics(server.base_url))
    unpruned = GROUPS * TOKENS_PER_GROUP
    assert served.meta["video_tokens_before_pruning"] == delta["video_tokens_before_pruning"] == unpruned
    assert served.meta["video_tokens_after_pruning"] == delta["video_tokens_after_pruning"] == evs_count(0.75)
    assert delta["pruned_videos"] == 1


def test_a_bad_rate_gets_400_and_the_server_serves_on(servers, clips):
    server = servers[DENSE, "on"]
    before = video(server, clips["noise"], 0.5)
    for rate in (1.5, "fast"):
        body = {
            "text": glm4v_chat_prompt(GLM4V_VIDEO),
            "video_data": [str(clips["noise"])],
            "mm_processor_kwargs": {"video_pruning_rate": rate},
            "sampling_params": {"max_new_tokens": 2},
        }
        response = requests.post(f"{server.base_url}/generate", json=body, timeout=120)
        assert response.status_code == 400 and "video_pruning_rate must be a number in [0, 1)" in response.text
    after = video(server, clips["noise"], 0.5)
    assert (after.output_ids, after.prompt_tokens) == (before.output_ids, before.prompt_tokens)


# --- the independent oracle: HF transformers' GLM-4.1V given the kept rows at its own positions


@cache
def hf(model_dir: str, architecture: str = DENSE):
    import transformers

    model = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, transformers.AutoProcessor.from_pretrained(model_dir)


def hf_pruned_greedy(
    model_dir: Path, prompt: str, clips: list[Path], keep_masks: list, images: tuple[Path, ...] = (),
    architecture: str = DENSE, steps: int = 8, shift_from_video: int = 0, shift_text_back: bool = False,
) -> HFReference:  # fmt: skip
    """The reference rule from transformers' own GLM-4.1V / GLM-4.5V (``architecture``): the frames SGLang's GLM
    sampler picks, HF's processor and towers, ``keep_masks[i](rows, grid, m, q)`` over video i's rows, the kept
    tokens at the positions HF's `get_rope_index` gives them in the unpruned sequence (images whole). Controls:
    ``shift_from_video`` moves every token from the first video row on by that many positions (a one-position
    error); ``shift_text_back`` moves the text after the video back by the pruned count (a rule that renumbers
    the compacted sequence)."""
    from PIL import Image
    from sglang.srt.multimodal.processors.glm4v import glm_processor_video_config, glm_sample_and_decode_sync
    from sglang.srt.utils.common import load_video

    model, processor = hf(str(model_dir), architecture)
    sampler = processor.video_processor
    sampled = [
        glm_sample_and_decode_sync(load_video(str(clip), use_gpu=False), glm_processor_video_config(sampler), sampler)
        for clip in clips
    ]
    inputs = processor(
        text=[prompt], images=[Image.open(path).convert("RGB") for path in images] or None,
        videos=[frames for frames, _ in sampled], video_metadata=[metadata for _, metadata in sampled],
        do_sample_frames=False, return_tensors="pt",
    )  # fmt: skip
    ids, types = inputs["input_ids"][0], inputs["mm_token_type_ids"][0]
    grids, merge = inputs["video_grid_thw"], model.config.vision_config.spatial_merge_size
    with torch.no_grad():
        positions, delta = model.model.get_rope_index(
            ids[None], inputs["mm_token_type_ids"], image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=grids
        )
        embeds = model.model.language_model.embed_tokens(ids)
        if images:
            image_rows = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
            embeds[types == 1] = torch.cat(list(image_rows.pooler_output))
        rows = torch.cat(list(model.model.get_video_features(inputs["pixel_values_videos"], grids).pooler_output))
        per_video = rows.split([int(grid.prod()) // merge**2 for grid in grids])
        is_row = types == 2  # the videos' rows (image tokens between the video markers)
        keep = torch.ones_like(ids, dtype=torch.bool)
        videos = zip(keep_masks, per_video, grids, strict=True)
        keep[is_row] = torch.cat([mask(x, grid, merge, None) for mask, x, grid in videos])
        embeds[is_row] = rows
        shifts = (shift_from_video, shift_text_back)
        return hf_greedy_on_kept(model, embeds, positions, delta, keep, is_row, steps, *shifts)


def unseen_clip(servers, kind: str, tag: str) -> Path:
    """A clip no earlier request sent, so the server encodes it and traces its keep-mask."""
    seed = 2000 + sum(map(ord, f"{kind}{tag}"))
    return write_clip(servers["trace", DENSE].parent / f"unseen-{kind}-{tag}.mp4", kind, seed=seed)


def served_masks(trace_path: Path, count: int) -> list:
    """The keep-masks of the server's last `count` encoded videos, in order, as `hf_pruned_greedy` masks."""
    kept = [event["kept"] for event in trace.read(trace_path, "keep_mask")[-count:]]
    assert len(kept) == count, "fewer videos encoded than sent: send unseen clips"

    def mask_of(indices: list[int]):
        def mask(rows, *_):
            out = torch.zeros(rows.shape[0], dtype=torch.bool)
            out[indices] = True
            return out

        return mask

    return [mask_of(indices) for indices in kept]


# SGLang's GLM-4.1V and transformers' differ by up to 1.1e-3 in logprob with nothing pruned (measured at q = 0 on
# these clips: the same weights through other kernels, the tower's interpolated position table among them), so
# the tolerance is GLM's own; a one-position error moves logprobs by 0.4 or more (the control below).
GLM_HF_TOLERANCE = 1e-2


@pytest.mark.parametrize("q", [0.0, 0.5, 0.75])
@pytest.mark.parametrize("kind", ["moving", "static"])
def test_greedy_tokens_equal_hf_oracle(servers, q, kind):
    """HF given the server's keep-mask (which must be the EVS oracle's on HF's rows, up to ties); at q = 0
    every row, which measures how far the two implementations are apart with nothing pruned."""
    clip = unseen_clip(servers, kind, f"q{q}")
    reply = video(servers[DENSE, "on"], clip, q)
    seen = {}

    def checked(rows, grid, merge, _):
        served = served_masks(servers["trace", DENSE], 1)[0](rows)
        seen["served"], seen["args"] = served, (rows, grid, merge, q)
        return served

    def every_row(rows, *_):
        return torch.ones(rows.shape[0], dtype=torch.bool)

    prompt = glm4v_chat_prompt(GLM4V_VIDEO)
    reference = hf_pruned_greedy(servers["dirs"][DENSE], prompt, [clip], [checked if q else every_row])
    assert_matches_hf(reply, reference, GLM_HF_TOLERANCE)
    if q:
        assert_masks_agree_up_to_ties(seen["served"], *seen["args"])


# (name, architecture, images, video kinds, method, q): GLM writes image and video rows with one token id, so
# a video beside an image, and two videos, must each find their own rows; GLM-4.5V against transformers' MoE.
MIXED_ORACLE_CASES = {
    "image+video": (DENSE, 1, ["noise"], "evs", 0.5),
    "two videos": (DENSE, 0, ["moving", "noise"], "evs", 0.5),
    "vidcom2": (DENSE, 0, ["moving"], "vidcom2", 0.75),
    "glm45v video": (MOE, 0, ["moving"], "evs", 0.75),
    "glm45v image+video": (MOE, 1, ["noise"], "vidcom2", 0.5),
}


@pytest.mark.parametrize("case", list(MIXED_ORACLE_CASES))
def test_mixed_prompts_equal_hf_oracle(servers, images, case):
    """HF given the server's keep-masks (each keeps the method's count, past group 0), every kept row at its
    unpruned position, images whole."""
    architecture, image_count, kinds, method, q = MIXED_ORACLE_CASES[case]
    clips = [unseen_clip(servers, kind, f"{case}-{i}") for i, kind in enumerate(kinds)]
    shown = tuple(images[:image_count])
    prompt = glm4v_chat_prompt(*[GLM4V_IMAGE] * image_count, *[GLM4V_VIDEO] * len(clips))
    reply = generate(
        servers[architecture, "on"].base_url, prompt, **media_kwargs(images=list(shown), videos=clips),
        **per_request_rate(q, method),
    )[0]  # fmt: skip
    masks = served_masks(servers["trace", architecture], len(clips))
    counts = [int(mask(torch.empty(GROUPS * TOKENS_PER_GROUP)).sum()) for mask in masks]
    assert counts == [METHODS[method].retained_token_count(TOKENS_PER_GROUP, GROUPS, q)] * len(clips)
    assert min(counts) > TOKENS_PER_GROUP, "keeps more than group 0, so the layout before encoding is not already right"
    reference = hf_pruned_greedy(servers["dirs"][architecture], prompt, clips, masks, shown, architecture)
    assert_matches_hf(reply, reference, GLM_HF_TOLERANCE)


@pytest.mark.parametrize("control", ["one position", "renumbered"])
def test_the_tolerance_tells_a_position_error(servers, control):
    """Two wrong position rules on the server's own keep-mask: every token from the video on one position
    late, and the text after the video renumbered back by the pruned count."""
    clip = unseen_clip(servers, "moving", f"control-{control}")
    reply = video(servers[DENSE, "on"], clip, 0.75)
    wrong = {"shift_from_video": 1} if control == "one position" else {"shift_text_back": True}
    prompt = glm4v_chat_prompt(GLM4V_VIDEO)
    masks = served_masks(servers["trace", DENSE], 1)
    reference = hf_pruned_greedy(servers["dirs"][DENSE], prompt, [clip], masks, **wrong)
    assert logprob_gap(reply, reference) > 10 * GLM_HF_TOLERANCE


def test_the_visualizer_scores_the_frames_the_server_encodes(servers, monkeypatch):
    """`python -m sglang_evs.visualize` on a GLM checkpoint samples as GLM's processor does: its grid is the
    server's, and the server's mask is the EVS oracle's on the rows the visualizer scored, up to ties (HF's
    tower against SGLang's)."""
    from sglang_evs import visualize

    evs, scored = visualize.METHODS["evs"], {}

    def recording(rows, grid, merge, rate):
        scored["args"] = rows, grid, merge, rate
        return evs.retention_mask(rows, grid, merge, rate)

    monkeypatch.setitem(visualize.METHODS, "evs", dataclasses.replace(evs, retention_mask=recording))
    clip = unseen_clip(servers, "moving", "visualize")
    reply = video(servers[DENSE, "on"], clip, 0.5)
    kept = visualize.kept_tokens(servers["dirs"][DENSE], clip, 0.5)
    t, gh, gw = kept.grid
    assert (t, gh * gw // kept.merge**2) == (GROUPS, TOKENS_PER_GROUP)
    assert int(kept.mask.sum()) == reply.meta["video_tokens"] == evs_count(0.5)
    assert_masks_agree_up_to_ties(served_masks(servers["trace", DENSE], 1)[0](kept.mask), *scored["args"])


# --- chunked prefill, radix hits, several media per request and per batch


def test_29_token_chunks_and_radix_repeats_equal_one_chunk(servers, clips, images):
    """The chunked server prunes by its default (VidCom2, q = .5) and by a request's own EVS rate; the
    reference is the one-chunk server given the same settings per request. Each case twice: the repeat
    hits the radix cache."""
    image = images[0]
    two_videos = glm4v_chat_prompt(GLM4V_IMAGE, GLM4V_VIDEO, GLM4V_VIDEO)
    cases = [
        (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["moving"]]), CHUNKED_DEFAULT),
        (two_videos, media_kwargs(images=[image], videos=[clips["noise"], clips["moving"]]), CHUNKED_DEFAULT),
        (two_videos, media_kwargs(images=[image], videos=[clips["static"], clips["noise"]]), per_request_rate(0.75)),
    ]
    for prompt, kwargs, setting in cases:
        flush_cache(servers[DENSE, "on"].base_url)
        default = setting is CHUNKED_DEFAULT
        asked = per_request_rate(0.5, "vidcom2") if default else setting
        want = generate(servers[DENSE, "on"].base_url, prompt, **kwargs, **asked)[0]
        own = {} if default else setting  # the chunked server's default, or the request's own
        first, again = (generate(servers["chunked"].base_url, prompt, **kwargs, **own)[0] for _ in range(2))
        assert again.cached_tokens > 0, "no radix hit"
        for got in (first, again):
            assert_same_greedy(got, want, f"{CHUNK}-token chunks vs one, {setting}")
        method = "vidcom2" if default else "evs"
        assert (first.meta["video_pruning_method"], want.meta["video_pruning_method"]) == (method, method)
    assert_media_prefills_and_decodes_replayed(servers["trace", "chunked"])


def test_glm45v_in_graph_mode_prunes_as_in_eager_mode(servers, clips, images):
    """GLM-4.5V (MoE) in graph mode against the same model eager: pruned videos, beside an image too."""
    cases = [
        (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["moving"]]), per_request_rate(0.75)),
        (glm4v_chat_prompt(GLM4V_IMAGE, GLM4V_VIDEO), media_kwargs(images=[images[0]], videos=[clips["noise"]]),
         per_request_rate(0.5, "vidcom2")),
        (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["static"]]), per_request_rate(0.0)),
    ]  # fmt: skip
    for prompt, kwargs, setting in cases:
        want = generate(servers[MOE, "on"].base_url, prompt, **kwargs, **setting)[0]
        got = generate(servers["graphs"].base_url, prompt, **kwargs, **setting)[0]
        assert got.prompt_tokens == want.prompt_tokens
        assert_same_greedy(got, want, f"GLM-4.5V graph mode vs eager, {setting}")
    assert_media_prefills_and_decodes_replayed(servers["trace", "graphs"])


def test_concurrent_mixed_requests_equal_each_alone(servers, architecture, clips, images):
    """Eight mixed requests (two videos in one, video before and after an image, text only, different rates)
    each alone from an empty cache, then all at once: a prefill forward held the media of two of them."""
    image, image2 = images
    prompt = glm4v_chat_prompt
    cases = [
        (prompt(GLM4V_VIDEO, GLM4V_IMAGE), media_kwargs(images=[image], videos=[clips["moving"]]), 0.75),
        (prompt(GLM4V_IMAGE, GLM4V_VIDEO), media_kwargs(images=[image2], videos=[clips["noise"]]), 0.5),
        # laid out by a threshold as the scheduler admits it (GLM writes video rows with the image token)
        (
            prompt(GLM4V_VIDEO, GLM4V_VIDEO),
            media_kwargs(videos=[clips["noise"], clips["moving"]]),
            {"video_pruning_threshold": 0.3},
        ),
        (prompt(GLM4V_IMAGE), media_kwargs(images=[image]), 0.75),
        (prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["static"]]), 0.9),
        (prompt(text="Count the objects."), {}, 0.75),
        (
            prompt(GLM4V_VIDEO, GLM4V_IMAGE, GLM4V_VIDEO),
            media_kwargs(images=[image2], videos=[clips["static"], clips["noise"]]),
            0.25,
        ),
        (prompt(GLM4V_VIDEO), media_kwargs(videos=[clips["moving"]]), 0.0),
    ]
    server = servers[architecture, "on"]
    alone = send_alone(server.base_url, cases)
    together, (shared_forwards, cached, prompt_tokens) = send_together(
        server.base_url, cases, servers["trace", architecture]
    )
    assert shared_forwards > 0 and cached < prompt_tokens // 4, (shared_forwards, cached, prompt_tokens)
    decided = alone[2].meta
    assert 0 < decided["video_tokens_after_pruning"] < decided["video_tokens_before_pruning"]
    for one, many in zip(alone, together, strict=True):
        assert many.prompt_tokens == one.prompt_tokens
        assert_same_greedy(many, one, "batched vs alone")
