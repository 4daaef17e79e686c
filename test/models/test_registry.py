"""Installed beside every model SGLang serves: the table of SGLang's whole model registry, with the plugin
loaded and without it (`routine_probe.py`, run in two fresh interpreters that load SGLang as a server does).

Only the architectures this project serves (`served.SERVED`) resolve to its classes and processors, and only
those reach its embedding routine; every other architecture
is SGLang's own class with SGLang's own processor (so its prompts are laid out as upstream lays them out),
reaches only SGLang's own routine (no hook wraps it), and that routine hands the language model the very
same tensors on synthetic media, with and without the plugin. A new SGLang model falls on the
upstream side by itself: nothing here names it.

Drafts: every speculative draft architecture of the registry resolves to SGLang's own class outside a server
and beside any target this project does not serve (SGLang builds `Qwen3_5ForCausalLMMTP` for InternS2 and the
text-only Qwen3.5 too), with the plugin as without it; only beside a served target whose record names it
(`served.mtp_draft_of`), or the EAGLE3 draft where positions are traced, is it this project's class.

Encoder disaggregation (slow tier, one fleet): an `--encoder-only` / `--language-only` pair of InternS2-Preview, a
model SGLang lists for encoder disaggregation and this project does not serve (SGLang's class is a Qwen3.5-MoE
subclass on SGLang's Qwen-VL processor), serves with the plugin exactly what the pair without it serves, a
request asking for video pruning in its `mm_processor_kwargs` included: none of the plugin's encoder hooks acts.
"""

import json
import os
import shutil
import time
from functools import partial
from pathlib import Path

import pytest
import requests

from sglang_evs import trace
from sglang_evs.served import EAGLE3_DRAFT, SERVED, mtp_draft_of
from sglang_evs.testing import warm_start
from sglang_evs.testing.requests import IMAGE, VIDEO, Generation, chat_prompt, generate, media_kwargs, per_request_rate
from sglang_evs.testing.server import Launch, free_port, local_url, running_servers
from sglang_evs.testing.workload import side_by_side

PROBE = Path(__file__).with_name("routine_probe.py")
# Read off SGLang 0.5.23: the models the issue of "installed beside every model" names that stay upstream's:
# Nemotron-Nano-VL (SGLang's own EVS) reaches upstream's routine through its own forward. (Qwen3-Omni and
# Qwen4-Exp, named there too, are now this project's: `served.SERVED`.)
NEIGHBOURS = ("NemotronH_Nano_VL_V2",)


def probes(*plugins: str) -> dict[str, dict]:
    """The table with the plugin "on" and "off", each from its own interpreter forked from the warm one (SGLang
    imported, no plugin loaded: the probe loads it, or not, as a fresh interpreter would)."""
    tables = {}
    for plugin in plugins:
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", **({"SGLANG_PLUGINS": "none"} if plugin == "off" else {})}
        done = warm_start.run(str(PROBE), [plugin], env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        tables[plugin] = json.loads(done.stdout.strip().splitlines()[-1])
    return tables


@pytest.fixture(scope="module")
def probed() -> dict[str, dict]:
    return probes("on", "off")


@pytest.fixture(scope="module")
def tables(probed) -> dict[str, dict]:
    return {plugin: table["models"] for plugin, table in probed.items()}


@pytest.fixture(scope="module")
def drafts(probed) -> dict[str, dict]:
    return {plugin: table["drafts"] for plugin, table in probed.items()}


def test_the_table_covers_the_whole_registry(tables):
    on, off = tables["on"], tables["off"]
    assert on.keys() == off.keys() and len(on) > 250
    reaching = {arch for arch, row in on.items() if row["routines"]}
    ours = {arch for arch, row in on.items() if row["resolved"].startswith("sglang_evs.")}
    counts = {
        "classes": len(on),
        "reach a routine": len(reaching),
        "to this project's routine": sum("sglang_evs" in on[arch]["routines"] for arch in reaching),
        "to upstream's only": sum(on[arch]["routines"] == ["upstream"] for arch in reaching),
    }
    print(f"registry table: {counts}")
    assert counts["to this project's routine"] == len(SERVED)
    assert counts["to upstream's only"] == len(reaching) - len(SERVED) > 40
    assert ours == SERVED.keys() & on.keys()  # a draft is ours beside a served target only (below)


def test_every_other_architecture_is_upstreams_with_the_same_inputs(tables):
    on, off = tables["on"], tables["off"]
    others = sorted(on.keys() - SERVED.keys())
    changed = [arch for arch in others if on[arch] != off[arch]]
    assert not changed, {arch: (on[arch], off[arch]) for arch in changed[:5]}
    assert all(on[arch]["resolved"].startswith("sglang.srt.models.") for arch in others)
    assert sum(bool(on[arch]["received"]) for arch in others) > 40  # the synthetic media ran through them


def test_no_routine_is_wrapped(tables):
    for plugin, table in tables.items():
        names = {name for row in table.values() for name in row["routines"]}
        assert names <= {"upstream", "sglang_evs"}, (plugin, names)


def test_this_projects_classes_reach_its_routine_and_processor(tables):
    for arch in SERVED:
        row = tables["on"][arch]
        assert row["resolved"].startswith("sglang_evs.models.") and "sglang_evs" in row["routines"], arch
        assert row["processor"].startswith("sglang_evs.pruning.processor:"), arch
        assert "sglang_evs" not in tables["off"][arch]["routines"], arch
    assert sum(row["processor"] is not None for row in tables["off"].values()) > 60  # the multimodal models


@pytest.mark.parametrize("arch", NEIGHBOURS)
def test_the_neighbours_named_in_the_issue_stay_upstream(tables, arch):
    row = tables["on"][arch]
    assert row["routines"] == ["upstream"] and row["resolved"].startswith("sglang.srt.models.")
    assert len(row["received"]) == 2 and row == tables["off"][arch]  # both call shapes, digests equal


def ours_for(draft: str, key: str) -> bool:
    """Whether the plugin should answer `draft` at `key` ("target|traced"): beside a served target whose record
    names it, or (the EAGLE3 draft) beside a served target with positions traced."""
    target, traced = key.split("|")
    if target not in SERVED:
        return False
    mtp = mtp_draft_of(target)
    return (mtp is not None and mtp.architecture == draft) or (draft == EAGLE3_DRAFT.architecture and traced == "True")


def test_every_draft_is_sglangs_own_beside_a_target_not_served(drafts):
    on, off = drafts["on"], drafts["off"]
    assert on.keys() == off.keys() and len(on) > 30
    assert {"Qwen3_5ForCausalLMMTP", "Qwen4ExpForCausalLMMTP", EAGLE3_DRAFT.architecture} <= on.keys()
    assert all(row.keys() == on["Qwen3_5ForCausalLMMTP"].keys() for row in on.values())
    for draft, row in on.items():
        assert all(cls.startswith("sglang.srt.models.") for cls in off[draft].values()), draft
        for key, cls in row.items():
            if key.split("|")[0] not in SERVED:  # no server, InternS2, text-only Qwen3.5, Llama
                assert cls == off[draft][key], (draft, key, cls)


def test_a_served_target_gets_the_draft_its_record_names_and_sglangs_for_any_other(drafts):
    on, off = drafts["on"], drafts["off"]
    swapped = {(draft, key) for draft, row in on.items() for key, cls in row.items() if cls != off[draft][key]}
    assert swapped == {(draft, key) for draft, row in on.items() for key in row if ours_for(draft, key)}
    assert all(on[draft][key].startswith("sglang_evs.models.") for draft, key in swapped)
    assert {draft for draft, _ in swapped} == {
        "Qwen3_5ForCausalLMMTP",
        "Qwen4ExpForCausalLMMTP",
        EAGLE3_DRAFT.architecture,
    }


# --- encoder disaggregation of a model this project does not serve ----------------------------------------

# A model SGLang 0.5.23 serves under encoder disaggregation (`arg_groups/pd_disaggregation_hook.py`'s list) that
# the CPU route runs and a tiny checkpoint exists of: InternS2-Preview, SGLang's Qwen3.5-MoE subclass. Its encoder
# takes images only (SGLang's encoder preprocessor decodes videos for Qwen and GLM models alone).
NOT_OURS_ON_THE_ENCODER_LIST = "InternS2PreviewForConditionalGeneration"


@pytest.fixture(scope="module")
def tiny_interns2_dir(tiny_qwen3_5_moe_dir, tmp_path_factory) -> Path:
    """The tiny Qwen3.5-MoE checkpoint under InternS2-Preview's architecture and model type (SGLang's own config
    class, `InternS2PreviewConfig`, a Qwen3.5-MoE config, reads it; its weights are the same modules)."""
    out = tmp_path_factory.mktemp("tiny_interns2") / "model"
    shutil.copytree(tiny_qwen3_5_moe_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = [NOT_OURS_ON_THE_ENCODER_LIST]
    config["model_type"] = config["vision_config"]["model_type"] = "intern_s2_preview"
    (out / "config.json").write_text(json.dumps(config))
    return out


def encoder_path_requests(media: Path) -> dict[str, tuple[str, dict]]:
    """In the order sent. The video goes last: SGLang's encoder fails it, and SGLang's language scheduler then
    stops (it takes the length of the failed request's prompt ids, which it has none of); the plugin answers that
    failure for its own models only (`disaggregated.reportable_failed_request`)."""
    image, images = (
        media_kwargs(images=[media / "image.png"]),
        media_kwargs(images=[media / "image.png", media / "image2.png"]),
    )
    return {
        "text": (chat_prompt(text="Count the objects."), {}),
        "image": (chat_prompt(IMAGE), image),
        "two images asking evs q=0.5": (chat_prompt(IMAGE, IMAGE), {**images, **per_request_rate(0.5)}),
        "image asking vidcom2 q=0.75": (chat_prompt(IMAGE), {**image, **per_request_rate(0.75, "vidcom2")}),
        "image asking a rate no pruning reads (1.5)": (chat_prompt(IMAGE), {**image, **per_request_rate(1.5)}),
        "video": (chat_prompt(VIDEO), media_kwargs(videos=[media / "moving.mp4"])),
    }


def answer(base_url: str, prompt: str, kwargs: dict) -> Generation | str:
    """The reply, or what the client got instead (the server's refusal, or the connection lost)."""
    try:
        return generate(base_url, prompt, **kwargs)[0]
    except (RuntimeError, requests.RequestException) as failure:
        return f"{type(failure).__name__}: {failure}"


@pytest.fixture(scope="module")
def encoder_pairs(tiny_interns2_dir, media_dir, tmp_path_factory) -> dict:
    """{side: {request: reply}, (side, "alive"): whether its language server served on} from two pairs, each an
    encoder and its language server, the four started together (the encoders' ports chosen here): the plugin's
    ("on", traced) and upstream's ("off", SGLANG_PLUGINS=none on both servers)."""
    folder = tmp_path_factory.mktemp("encoder_pairs")
    envs = {"on": {trace.ENV: str(folder / "trace-on.jsonl")}, "off": {"SGLANG_PLUGINS": "none"}}
    args = ["--dtype", "float32"]
    ports = {side: free_port() for side in envs}
    encoders = [Launch(tiny_interns2_dir, folder / f"encoder-{side}.log", [*args, "--encoder-only"], env,
                       port=ports[side]) for side, env in envs.items()]  # fmt: skip
    languages = [Launch(tiny_interns2_dir, folder / f"language-{side}.log",
                        [*args, "--language-only", "--encoder-urls", local_url(ports[side])], env)
                 for side, env in envs.items()]  # fmt: skip
    out: dict = {"trace": folder / "trace-on.jsonl"}
    with running_servers(*encoders, *languages) as servers:
        encoder_servers, language_servers = servers[:2], servers[2:]

        def serve(side: str, server) -> None:
            out[side] = {
                name: answer(server.base_url, *case) for name, case in encoder_path_requests(media_dir).items()
            }
            time.sleep(2)  # a scheduler that fails exits within a second (SIGQUIT to its server)
            out[side, "alive"] = server.alive()

        # the two pairs, each its own stream of requests
        side_by_side(*(partial(serve, side, server) for side, server in zip(envs, language_servers, strict=True)))
        pairs = zip(envs, encoder_servers, language_servers, strict=True)
        out["logs"] = {side: encoder.log() + language.log() for side, encoder, language in pairs}
    return out


@pytest.mark.slow
def test_an_encoder_pair_of_a_model_not_ours_serves_as_upstreams_pair(encoder_pairs):
    """Tokens, every logprob and top-5 logprob, prompt lengths, what failed and how: the same with the plugin as
    without it. Requests that ask for video pruning are served as SGLang serves them (a rate no pruning reads
    included: the plugin's check of it is its own models'); the encoder's failure stops both language servers."""
    on, off = encoder_pairs["on"], encoder_pairs["off"]
    assert on == off
    assert all(isinstance(on[name], Generation) for name in list(on)[:-1]), on
    seen = [(g.output_ids, g.logprobs, g.prompt_tokens) for g in (on["image asking vidcom2 q=0.75"], on["image"])]
    assert seen[0] == seen[1]  # nothing read the setting (the repeat is a radix hit: cached tokens differ)
    assert "Remote end closed connection" in on["video"]
    assert encoder_pairs["on", "alive"] is encoder_pairs["off", "alive"] is False
    assert "plugin loaded" in encoder_pairs["logs"]["on"] and "plugin loaded" not in encoder_pairs["logs"]["off"]
    written = encoder_pairs["trace"].read_text().splitlines() if encoder_pairs["trace"].exists() else []
    assert not {json.loads(line)["event"] for line in written} & {"encoder_pruned", "encoder_sent", "keep_mask"}
