"""The routine is model-agnostic, and calls `post_process` on every forward."""

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from sglang_evs.multimodal import embed_routine
from sglang_evs.multimodal.contract import FetchedEmbedding

MODEL_NAMES = re.compile(r"qwen|llava|gemma|llama|intern|kimi|minicpm|glm|deepseek|nemotron|phi|mistral|pixtral", re.I)


def test_routine_module_names_no_model_and_no_deepstack():
    source = Path(embed_routine.__file__).read_text()
    assert not MODEL_NAMES.search(source), MODEL_NAMES.search(source)
    assert "deepstack" not in source.lower()


@dataclass
class _Mode:
    decode: bool

    def is_decode(self) -> bool:
        return self.decode

    def is_target_verify(self) -> bool:
        return False


@dataclass
class _Batch:
    forward_mode: _Mode
    seq_lens_cpu: torch.Tensor
    input_embeds: torch.Tensor | None = None
    extend_prefix_lens_cpu: list | None = None

    def contains_mm_inputs(self) -> bool:
        return False


class _LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def forward(self, input_ids, forward_batch, input_embeds, **kwargs):
        assert input_ids is None and not any(isinstance(v, torch.Tensor) for v in kwargs.values())
        return input_embeds


class _Model(nn.Module):
    """Adds a constant row at token 1 through post_process, as a model-specific hook would."""

    implements_post_process_contract = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def post_process(self, fetched, layout):
        self.calls.append((len(fetched), layout.num_tokens))
        layout.forward_batch.touched = True
        mask = torch.zeros(layout.num_tokens, 1, dtype=torch.bool)
        mask[1] = True
        return [*fetched, FetchedEmbedding("test", torch.full((1, 4), 7.0), mask)]


def test_post_process_runs_on_decode_and_its_rows_are_scattered():
    lm, model = _LanguageModel(), _Model()
    batch = _Batch(_Mode(decode=True), seq_lens_cpu=torch.tensor([5, 9, 3]))
    ids = torch.tensor([1, 2, 3])
    out = embed_routine.general_mm_embed_routine(ids, batch, lm, model, positions=None)
    assert model.calls == [(0, 3)] and batch.touched
    assert torch.equal(out[1], torch.full((4,), 7.0))
    assert torch.equal(out[0], lm.embed.weight[1]) and torch.equal(out[2], lm.embed.weight[3])


def test_result_lands_in_a_preexisting_static_buffer():
    static = torch.zeros(2, 4)
    batch = _Batch(_Mode(decode=True), seq_lens_cpu=torch.tensor([4, 4]), input_embeds=static)
    out = embed_routine.embed_inputs(torch.tensor([0, 5]), batch, _LanguageModel(), _Model())
    assert out.data_ptr() == static.data_ptr() and torch.equal(static[1], torch.full((4,), 7.0))


def test_layout_in_decode_describes_each_request():
    batch = _Batch(_Mode(decode=True), seq_lens_cpu=torch.tensor([5, 9]))
    layout = embed_routine.batch_layout(batch, torch.tensor([1, 2]))
    assert layout.requests == [(None, 4, 1), (None, 8, 1)] and layout.num_tokens == 2


class _UpstreamStyleModel(nn.Module):
    """SGLang's Qwen2.5-VL has a `post_process` placeholder with other arguments; it is not ours."""

    def post_process(self, inputs_embeds, modalities, embeddings, indices, forward_batch):
        raise AssertionError("a post_process outside the contract was called")


def test_post_process_outside_the_contract_is_left_alone():
    batch = _Batch(_Mode(decode=True), seq_lens_cpu=torch.tensor([4]))
    lm = _LanguageModel()
    out = embed_routine.embed_inputs(torch.tensor([3]), batch, lm, _UpstreamStyleModel())
    assert torch.equal(out, lm.embed.weight[3:4])
