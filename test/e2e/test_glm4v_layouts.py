"""GLM-4.1V and GLM-4.5V under `--pp-size 2` and `--tp-size 2`: q = 0 bit-identical to upstream with the same
flags, pruning equal to one server.

The same checks as `test_pipeline_parallel.py` and `test_tensor_parallel.py` run for Qwen3-VL, on the family
with its own processor, dense and MoE: 64-token chunks that cut every video, 6-group clips, float32. Per model
five servers, started together: upstream and the plugin at pp = 2 and at tp = 2, and the plugin on one rank
(the reference for pruning). Requests sent alone are compared exactly against upstream; a batch request's
requests may share their forwards differently from run to run (pipeline micro-batches), so there and against
another split of the layers (pp = 1) tokens and prompt lengths are exact and logprobs within 1e-4. A
TP = 2 server sums partial products in another order than one rank, so against one rank its tokens are compared.
"""

import pytest

from sglang_evs.testing import media
from sglang_evs.testing.compare import assert_close
from sglang_evs.testing.requests import (
    GLM4V_IMAGE,
    GLM4V_VIDEO,
    glm4v_chat_prompt,
    media_kwargs,
    per_request_rate,
    serve,
)
from sglang_evs.testing.server import Launch, run_to_exit, running_servers

pytestmark = pytest.mark.slow

ARGS = ["--dtype", "float32", "--chunked-prefill-size", "64"]
SIDE = 112  # 4 x 4 tokens per temporal group
SETTINGS = {"q=0": {}, "evs q=0.75": per_request_rate(0.75), "vidcom2 q=0.75": per_request_rate(0.75, "vidcom2")}


@pytest.fixture(scope="module")
def glm_media(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("glm_layouts")
    clips = {
        kind: media.write_clip(out / f"{kind}.mp4", kind, num_frames=24, fps=4, seed=5, height=SIDE, width=SIDE)
        for kind in ("moving", "noise")
    }
    return {"image": media.write_image(out / "image.png", SIDE, SIDE, seed=4), **clips}


def cases(files: dict) -> dict[str, tuple[str, dict]]:
    return {
        "text": (glm4v_chat_prompt(text="Count to five."), {}),
        "image": (glm4v_chat_prompt(GLM4V_IMAGE), media_kwargs(images=[files["image"]])),
        "video": (glm4v_chat_prompt(GLM4V_VIDEO), media_kwargs(videos=[files["moving"]])),
        "image+video": (
            glm4v_chat_prompt(GLM4V_IMAGE, GLM4V_VIDEO),
            media_kwargs(images=[files["image"]], videos=[files["noise"]]),
        ),
    }


def batch(files: dict) -> dict:
    alone = cases(files)
    return {
        "text": [alone[name][0] for name in ("image", "text", "video")],
        "image_data": [[str(files["image"])], [], []],
        "video_data": [[], [], [str(files["noise"])]],
    }


MODELS = {"Glm4vForConditionalGeneration": "tiny_glm4v_dir", "Glm4vMoeForConditionalGeneration": "tiny_glm4v_moe_dir"}


@pytest.fixture(scope="module", params=list(MODELS))
def served(request, glm_media, tmp_path_factory) -> dict:
    """{(server, setting): results} for one model."""
    model_dir = request.getfixturevalue(MODELS[request.param])
    folder = tmp_path_factory.mktemp(f"layouts-{request.param}")
    upstream = {"SGLANG_PLUGINS": "none"}
    plans = {
        "upstream pp2": (["--pp-size", "2"], upstream, ["q=0"]),
        "plugin pp2": (["--pp-size", "2"], {}, list(SETTINGS)),
        "upstream tp2": (["--tp-size", "2"], upstream, ["q=0"]),
        "plugin tp2": (["--tp-size", "2"], {}, ["q=0", "evs q=0.75"]),
        "plugin one rank": ([], {}, list(SETTINGS)),
    }
    launches = [
        Launch(model_dir, folder / f"{name.replace(' ', '-')}.log", [*ARGS, *extra], env)
        for name, (extra, env, _) in plans.items()
    ]
    out = {}
    with running_servers(*launches) as servers:
        for server, (name, (_, _, settings)) in zip(servers, plans.items(), strict=True):
            for setting in settings:
                out[name, setting] = serve(server.base_url, cases(glm_media), batch(glm_media), SETTINGS[setting])
    return out


@pytest.mark.parametrize("layout", ["pp2", "tp2"])
def test_q0_is_bit_identical_to_upstream_with_the_same_layout(served, layout):
    ours, upstream = served[f"plugin {layout}", "q=0"], served[f"upstream {layout}", "q=0"]
    assert ours.keys() == upstream.keys()
    for name in upstream.keys() - {"batch"}:
        assert ours[name] == upstream[name], name  # tokens, every logprob and top-5 logprob, prompt length
    for mine, theirs in zip(ours["batch"], upstream["batch"], strict=True):
        assert_close(mine, theirs, "batch")


@pytest.mark.parametrize("setting", ["evs q=0.75", "vidcom2 q=0.75"])
def test_pruned_pp2_equals_one_rank(served, setting):
    one, pp2 = served["plugin one rank", setting], served["plugin pp2", setting]
    for name in one.keys() - {"batch"}:
        assert_close(pp2[name], one[name], name)
    for two, single in zip(pp2["batch"], one["batch"], strict=True):
        assert_close(two, single, "batch")
    unpruned = served["plugin pp2", "q=0"]
    assert pp2["video"].prompt_tokens < unpruned["video"].prompt_tokens  # pruning ran
    assert pp2["image"].prompt_tokens == unpruned["image"].prompt_tokens  # images never pruned


def test_pruned_tp2_serves_the_tokens_of_one_rank(served):
    one, tp2 = served["plugin one rank", "evs q=0.75"], served["plugin tp2", "evs q=0.75"]
    for name in one.keys() - {"batch"}:
        assert (tp2[name].output_ids, tp2[name].prompt_tokens) == (one[name].output_ids, one[name].prompt_tokens)
    assert [g.output_ids for g in tp2["batch"]] == [g.output_ids for g in one["batch"]]
    assert tp2["video"].prompt_tokens < served["plugin tp2", "q=0"]["video"].prompt_tokens


def test_encoder_disaggregation_stops_at_startup_as_upstream_does(tiny_glm4v_dir):
    """SGLang 0.5.23 serves encoder disaggregation for none of GLM-4.1V / GLM-4.5V (its list has GLM-5-Next);
    with the plugin loaded an `--encoder-only` server still stops at startup, naming the architecture."""
    result = run_to_exit(tiny_glm4v_dir, ["--dtype", "float32", "--encoder-only"])
    assert result.returncode != 0
    assert "Glm4vForConditionalGeneration is not supported for encoder disaggregation" in result.stdout + result.stderr
