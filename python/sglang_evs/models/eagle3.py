"""SGLang's EAGLE3 draft (`LlamaForCausalLMEagle3`), unchanged but traced.

A draft whose config sets `mrope_section` reads `forward_batch.mrope_positions`, which SGLang builds for
its batch from the request's positions (exact once the keep-mask is known) and `mrope_position_delta`:
pruning needs nothing of it. The plugin answers this architecture only on a server that traces positions
(`SGLANG_EVS_TRACE` and `SGLANG_EVS_TRACE_POSITIONS=1`, `served.EAGLE3_DRAFT`), to record what
the draft was handed.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.models.graph_inputs import trace_rope_positions


class Eagle3Draft(sglang.UpstreamLlamaEagle3):
    def forward(self, input_ids, positions, forward_batch, *args, **kwargs):
        if trace.positions_enabled():
            reads_mrope = self.model.is_mrope_enabled and forward_batch.mrope_positions is not None
            trace_rope_positions("draft", forward_batch.mrope_positions if reads_mrope else positions, forward_batch)
        return super().forward(input_ids, positions, forward_batch, *args, **kwargs)


EntryClass = [Eagle3Draft]
