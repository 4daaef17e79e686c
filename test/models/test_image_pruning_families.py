"""Images pruned on every other family the plugin serves, each against transformers' own model of that family.

Qwen3-VL is `test_image_pruning.py`; here Qwen2-VL, Qwen2.5-VL, Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE (hybrid),
GLM-4.1V (GLM's own processor and positions), Qwen3-Omni (its thinker: a Qwen3-VL-MoE with an audio tower) and
Qwen4-Exp (bfloat16, the only dtype SGLang serves it in). One plugin server per family, all started together, in
float32 but Qwen4-Exp, with 32-token prefill chunks (every prompt's first chunk ends inside its first image) and no
server default: each request names its rate and method in `mm_processor_kwargs`. Every forward's rotary positions
are traced.

Per family and method, two unseen images (a decided mask is remembered per image and setting, and traced once)
in one request at q = .5, the same request at q = 0, and the first again (a radix hit):
  - the prompt drops by exactly the pruned count, max(1, int(N * .5)) kept per image, and the reply reports both;
  - the masks the server decided (`image_keep_mask` trace events) are the plain oracle's (`divprune_kept`,
    `dart_kept`) on transformers' own tower rows of that family, every column it returns (Qwen3-VL-MoE's and
    Qwen3-Omni's deepstack levels as further columns, which is what the server scores);
  - every prefill chunk and decode step, of the first request and of its radix hit, handed the language model
    exactly the positions of transformers' `get_rope_index` on the unpruned prompt with the pruned columns deleted
    (then index + delta + pruned count): integers, which no dtype's rounding blurs;
  - the served greedy tokens and logprobs are transformers' model given those kept rows at those positions, and
    the q = 0 reply is transformers' on the whole prompt (the two implementations' own distance, the baseline);
    on the float32 families two wrong position rules are farther from what was served than the tolerance;
  - the radix hit is served the same.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglang_evs import trace
from sglang_evs.testing import media
from sglang_evs.testing.chunked import traced_request
from sglang_evs.testing.compare import assert_same_greedy
from sglang_evs.testing.dart_oracle import dart_kept
from sglang_evs.testing.divprune_oracle import divprune_kept
from sglang_evs.testing.hf_reference import (
    HF_LOGPROB_TOLERANCE,
    HFReference,
    MediaPrompt,
    assert_matches_hf,
    assert_served_at_the_rules_positions,
    hf_greedy_on_prompt,
    hf_image_prompt,
)
from sglang_evs.testing.requests import (
    GLM4V_IMAGE,
    IMAGE,
    Generation,
    chat_prompt,
    generate,
    glm4v_chat_prompt,
    logprob_gap,
    media_kwargs,
)
from sglang_evs.testing.server import Launch, running_servers

pytestmark = pytest.mark.slow  # eight servers: the full suite only (see pyproject.toml)

CHUNK = 32
Q = 0.5
ORACLES = {"divprune": divprune_kept, "dart": dart_kept}
# SGLang keeps the Gated DeltaNet conv state between prefill chunks in bfloat16 unless told otherwise
# (`test_hybrid_families.HYBRID_ENV`): the hybrid families' servers keep it in float32.
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}


@dataclass(frozen=True)
class Family:
    """A family's checkpoint (its fixture), the methods it is checked with, its prompt, and how close transformers
    must come: ``tolerance`` in logprobs; ``follow``, HF continues with the served tokens (each of which must then be
    HF's best up to ``tolerance``), where the two implementations round near-ties apart."""

    fixture: str
    methods: tuple[str, ...] = ("divprune",)
    prompt: Callable[..., str] = chat_prompt
    image: str = IMAGE  # its image placeholder
    dtype: str = "float32"
    env: dict[str, str] = field(default_factory=dict)
    tolerance: float = HF_LOGPROB_TOLERANCE
    follow: bool = False


BOTH = ("divprune", "dart")
FAMILIES = {
    "qwen2_vl": Family("tiny_qwen2_vl_dir", BOTH),
    "qwen2_5_vl": Family("tiny_qwen2_5_vl_dir"),
    "qwen3_vl_moe": Family("tiny_qwen3_vl_moe_dir", BOTH),
    "qwen3_5": Family("tiny_qwen3_5_dir", BOTH, env=HYBRID_ENV),
    "qwen3_5_moe": Family("tiny_qwen3_5_moe_dir", env=HYBRID_ENV),
    # SGLang's GLM-4.1V tower and transformers' round apart by 3e-3 in logprobs with nothing pruned (measured here at
    # q = 0; `test_glm4v_evs.GLM_HF_TOLERANCE`), so two tokens that close may swap: HF follows the served ones.
    "glm4v": Family("tiny_glm4v_dir", BOTH, glm4v_chat_prompt, GLM4V_IMAGE, tolerance=1e-2, follow=True),
    "qwen3_omni": Family("tiny_qwen3_omni_dir", BOTH),
    # bfloat16 only (SGLang builds its n-gram embeddings and hyper-connections in bfloat16 whatever --dtype says):
    # HF follows the served tokens within `test_hybrid_families.Checkpoint`'s bfloat16 tolerance (measured here:
    # 0.03, pruned or not); the positions test is what tells exact from inexact there.
    "qwen4_exp": Family("tiny_qwen4_exp_dir", dtype="bfloat16", env=HYBRID_ENV, tolerance=0.35, follow=True),
}
CASES = [(family, method) for family, spec in FAMILIES.items() for method in spec.methods]
SEEDS = {"divprune": 70, "dart": 80}  # per method: each server sees each image once per setting


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory) -> dict:
    """{family: (server, trace path, checkpoint)}, started together."""
    work = tmp_path_factory.mktemp("image_families")
    plans, launches = [], []
    for family, spec in FAMILIES.items():
        model_dir = request.getfixturevalue(spec.fixture)
        trace_path = work / f"trace-{family}.jsonl"
        args = ["--dtype", spec.dtype, "--chunked-prefill-size", str(CHUNK)]
        env = {**spec.env, trace.ENV: str(trace_path), trace.POSITIONS_ENV: "1"}
        launches.append(Launch(model_dir, work / f"{family}.log", args, env))
        plans.append((family, trace_path, model_dir))
    with running_servers(*launches) as started:
        yield {plan[0]: (server, *plan[1:]) for plan, server in zip(plans, started, strict=True)}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, list[Path]]:
    """Per method, a wide (256 x 320) and a tall (320 x 192) image no other test sends."""
    out = tmp_path_factory.mktemp("family_images")
    return {
        method: [media.write_image(out / f"wide-{method}.png", 256, 320, seed),
                 media.write_image(out / f"tall-{method}.png", 320, 192, seed + 1)]
        for method, seed in SEEDS.items()
    }  # fmt: skip


@dataclass
class Served:
    pruned: Generation
    unpruned: Generation
    repeat: Generation
    masks: list[list[int]]  # per image, the kept indices the server traced
    positions: list[list[dict]]  # the `rope_positions` events of the pruned request and of its repeat
    model_dir: Path
    paths: list[Path]  # the images


@pytest.fixture(scope="module")
def results() -> dict:
    return {}


@pytest.fixture
def served(servers, images, results, family, method) -> Served:
    """The case's three requests (q = .5, q = 0, q = .5 again), sent once per module."""
    if (family, method) not in results:
        server, trace_path, model_dir = servers[family]
        spec, paths = FAMILIES[family], images[method]
        prompt = spec.prompt(spec.image, spec.image)

        def ask(q: float) -> Generation:
            settings = {"image_pruning_rate": q, "image_pruning_method": method}
            return generate(server.base_url, prompt, **media_kwargs(images=paths), mm_processor_kwargs=settings)[0]

        traced = len(trace.read(trace_path, "image_keep_mask"))
        pruned, events = traced_request(trace_path, lambda: ask(Q))
        masks = [event["kept"] for event in trace.read(trace_path, "image_keep_mask")[traced:]]
        unpruned = ask(0.0)
        repeat, repeat_events = traced_request(trace_path, lambda: ask(Q))
        positions = [events["rope_positions"], repeat_events["rope_positions"]]
        results[family, method] = Served(pruned, unpruned, repeat, masks, positions, model_dir, paths)
    return results[family, method]


def hf_prompt(served: Served, family: str, keep_kept: Callable, q: float = Q) -> MediaPrompt:
    spec = FAMILIES[family]
    prompt = spec.prompt(spec.image, spec.image)
    return hf_image_prompt(served.model_dir, served.paths, keep_kept, q, prompt, spec.dtype)


@pytest.fixture
def hf_side(served, family, method) -> tuple[MediaPrompt, list[list[int]]]:
    """(transformers' prompt with the served masks applied, the oracle's masks on its rows, in order)."""
    oracle_masks = []

    def served_mask(rows: list[list[float]], count: int) -> list[int]:
        oracle_masks.append(sorted(ORACLES[method](rows, count)))
        return served.masks[len(oracle_masks) - 1]

    return hf_prompt(served, family, served_mask), oracle_masks


def hf_reply(prompt: MediaPrompt, family: str, reply: Generation, **controls) -> HFReference:
    """HF's greedy reply to ``prompt``, following ``reply``'s tokens where the family says so (`Family.follow`)."""
    return hf_greedy_on_prompt(prompt, forced=reply.output_ids if FAMILIES[family].follow else None, **controls)


def per_image_tokens(prompt: MediaPrompt) -> list[int]:
    """Each image's pads in transformers' layout (its runs of the image token)."""
    steps = prompt.is_pad.int().diff()
    return ((steps == -1).nonzero().flatten() - (steps == 1).nonzero().flatten()).tolist()


@pytest.mark.parametrize(("family", "method"), CASES)
def test_prompt_tokens_drop_by_the_pruned_count(served, family, method):
    before, kept = served.unpruned.meta["image_tokens"], [len(mask) for mask in served.masks]
    assert len(kept) == 2, f"{len(kept)} image masks traced for two unseen images"
    pruned = served.pruned.meta
    assert pruned["image_tokens_before_pruning"] == before and "image_tokens_before_pruning" not in served.unpruned.meta
    assert pruned["image_tokens"] == pruned["image_tokens_after_pruning"] == sum(kept)
    assert pruned["image_pruning_method"] == method and pruned["image_pruning_rate"] == Q
    assert served.unpruned.prompt_tokens - served.pruned.prompt_tokens == before - sum(kept)


@pytest.mark.parametrize(("family", "method"), CASES)
def test_served_masks_are_the_oracles_on_transformers_rows(served, hf_side, family, method):
    prompt, oracle_masks = hf_side
    tokens = per_image_tokens(prompt)
    assert sum(tokens) == served.unpruned.meta["image_tokens"]
    assert [len(mask) for mask in served.masks] == [max(1, int(n * (1 - Q))) for n in tokens]
    assert [sorted(mask) for mask in served.masks] == oracle_masks


@pytest.mark.parametrize(("family", "method"), CASES)
def test_every_forward_is_at_the_rules_positions(served, hf_side, family, method):
    """Every prefill chunk and decode step of the pruned request and of its radix hit: the kept tokens at their
    positions in transformers' unpruned layout, every later token at its index plus the unpruned decode offset
    plus the pruned count. The control: every token from the middle of the prompt on one position later."""
    prompt, _ = hf_side
    rule, offset = prompt.positions[:, 0, prompt.keep], prompt.delta + int((~prompt.keep).sum())
    first_events, repeat_events = served.positions
    assert_served_at_the_rules_positions(((served.pruned, first_events), (served.repeat, repeat_events)), rule, offset)


@pytest.mark.parametrize(("family", "method"), CASES)
def test_served_equals_transformers_given_the_kept_rows(served, hf_side, family, method):
    prompt, _ = hf_side
    reference = hf_reply(prompt, family, served.pruned)
    assert_matches_hf(served.pruned, reference, FAMILIES[family].tolerance)


@pytest.mark.parametrize(("family", "method"), CASES)
def test_unpruned_equals_transformers(served, family, method):
    """The baseline: with nothing pruned, served and transformers within the same tolerance (measured: as far apart
    as pruned, the two implementations' own distance)."""
    reference = hf_reply(
        hf_prompt(served, family, lambda rows, count: list(range(count)), 0.0), family, served.unpruned
    )
    assert_matches_hf(served.unpruned, reference, FAMILIES[family].tolerance)


def distance(served: Generation, reference: HFReference) -> float:
    """How far HF under a control is from what was served: infinite where it would choose other tokens; else its
    logprobs' largest gap, or where it followed the served tokens, that or its largest preference for another."""
    if reference.tokens != served.output_ids:
        return float("inf")
    preferred = reference.best_logprobs or reference.logprobs
    return max(logprob_gap(served, reference), *(b - g for b, g in zip(preferred, reference.logprobs, strict=True)))


@pytest.mark.parametrize(("family", "method"), [case for case in CASES if FAMILIES[case[0]].dtype == "float32"])
def test_the_tolerance_tells_a_position_error(served, hf_side, family, method):
    """HF on the served masks under two wrong rules, every token from the first image's first row on one position
    late, and the text after the last image renumbered back by the pruned count (the compacted sequence's own
    numbering), is farther from what was served than the tolerance. Float32 only: in bfloat16 (Qwen4-Exp) rounding
    moves logprobs about as much as a one-position error (`test_hybrid_families`); the positions test tells there."""
    prompt, _ = hf_side
    tolerance = FAMILIES[family].tolerance
    one_off = distance(served.pruned, hf_reply(prompt, family, served.pruned, shift_from_video=1))
    renumbered = distance(served.pruned, hf_reply(prompt, family, served.pruned, shift_text_back=True))
    assert one_off > tolerance and renumbered > 10 * tolerance, (one_off, renumbered)


@pytest.mark.parametrize(("family", "method"), CASES)
def test_a_radix_hit_is_served_the_same(served, family, method):
    assert served.pruned.prompt_tokens > CHUNK and served.repeat.cached_tokens > CHUNK
    assert served.repeat.prompt_tokens == served.pruned.prompt_tokens
    assert_same_greedy(served.repeat, served.pruned, "radix hit vs first")
