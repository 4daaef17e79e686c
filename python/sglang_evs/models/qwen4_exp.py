"""Qwen4-Exp adapter: videos prunable, positions in the fixed buffers.

Upstream subclasses Qwen3-VL (the same vision tower, processor and M-RoPE layout, so the Qwen-VL
video family) on a Qwen3.5-style hybrid language model with hyper-connections, per-layer embeddings
(PLE) and n-gram embeddings, which read the prompt's token ids (`forward_batch.input_ids`: after
pruning, the kept ones, as transformers' model reads them given the pruned prompt). Released towers
have no deepstack levels. Everything else is `models/adapter.py`, except one step of upstream's
forward kept here: the hyper-connection streams replace the logits output's hidden states (what its
MTP draft reads).

Served with its MTP head (`--speculative-algorithm NEXTN`), the draft is `Qwen4ExpMTP` below: upstream's,
given the target's M-RoPE positions as Qwen3.5's is (`qwen3_5.ReadsTargetPositions`).
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs
from sglang_evs.models.qwen3_5 import ReadsTargetPositions


class Qwen4ExpVLModel(ReadsGraphInputs, sglang.UpstreamQwen4ExpVLModel):
    pass


class Qwen4ExpForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen4Exp):
    language_model_cls = Qwen4ExpVLModel

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False,
                pp_proxy_tensors=None):  # fmt: skip
        output = super().forward(input_ids, positions, forward_batch, input_embeds, get_embedding, pp_proxy_tensors)
        streams = self.model.last_hc_hidden_states
        if streams is not None and isinstance(output, sglang.LogitsProcessorOutput):
            output.hidden_states = streams
        return output


class Qwen4ExpMTP(ReadsTargetPositions, sglang.UpstreamQwen4ExpMTP):
    """The NEXTN draft of Qwen4-Exp (one MTP layer with its hyper-connections)."""


EntryClass = [Qwen4ExpForConditionalGeneration, Qwen4ExpMTP]
