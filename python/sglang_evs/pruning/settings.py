"""Which pruning method and rate apply to a request: the server's default, or the request's own.

Two settings, vLLM's names, at most one of them at a time:
  - `video_pruning_rate` q in [0, 1): EVS;
  - `video_retention_ratio` r in (0, 1]: VidCom2 at q = 1 - r.
The server default comes from the model config (`--json-model-override-args`); a request's
`mm_processor_kwargs` may name either setting, whatever method the server default uses.
A chat request may also name it in `chat_template_kwargs`, the field sglang-router forwards
(0.3.2 rebuilds requests and drops `mm_processor_kwargs`); `chat_processor_kwargs` moves it over
when `mm_processor_kwargs` names none.
"""

from dataclasses import dataclass

from sglang_evs.evs import METHODS, PRUNING_RATE_SETTING, PruningMethod, method_from_settings
from sglang_evs.evs.methods import EVS


@dataclass(frozen=True)
class Pruning:
    method: PruningMethod
    rate: float  # q in [0, 1); 0 prunes nothing, whatever the method
    setting_value: object  # what the user set: q for EVS, the retention ratio for VidCom2

    @property
    def prunes(self) -> bool:
        return self.rate > 0.0


NO_PRUNING = Pruning(EVS, 0.0, 0.0)


def _selected(settings: dict) -> Pruning | None:
    found = method_from_settings(settings)
    if found is None:
        return None
    method, rate = found
    return Pruning(method, rate, settings[method.setting])


def server_pruning(hf_config) -> Pruning:
    """The server-wide default; raises ValueError naming the setting if it is invalid."""
    settings = {method.setting: getattr(hf_config, method.setting, None) for method in METHODS.values()}
    return _selected(settings) or NO_PRUNING


def request_pruning(request_obj, default: Pruning) -> Pruning:
    """The request's own setting if it gives one (ValueError naming it if invalid), else `default`."""
    return pruning_from_kwargs(getattr(request_obj, "mm_processor_kwargs", None), default)


def pruning_from_kwargs(mm_processor_kwargs: dict | None, default: Pruning) -> Pruning:
    """The setting a request's `mm_processor_kwargs` give (ValueError naming it if invalid), else `default`."""
    return _selected(mm_processor_kwargs or {}) or default


def chat_processor_kwargs(chat_template_kwargs: dict | None, mm_processor_kwargs: dict | None) -> dict | None:
    """A chat request's `mm_processor_kwargs`, given the pruning setting its `chat_template_kwargs` name
    when it names none itself (its own wins: `chat_template_kwargs` may hold a server-wide default)."""
    carried = {m.setting: v for m in METHODS.values() if (v := (chat_template_kwargs or {}).get(m.setting)) is not None}
    if not carried or method_from_settings(mm_processor_kwargs or {}) is not None:
        return mm_processor_kwargs
    return {**(mm_processor_kwargs or {}), **carried}


def conflicting_setup(server_args) -> str | None:
    """What of a server's setup video pruning cannot run with, named for the error; None: nothing.

    - speculative decoding: its draft and verify steps know nothing of pruned positions;
    - encoder disaggregation: a `--language-only` server takes its media embeddings from an
      `--encoder-only` one, unpruned, and lays the prompt out from the grid alone, so neither the
      pruned layout nor the keep-mask would be built (a request's rate would be silently ignored);
    - prefill/decode disaggregation: never run with pruning (SGLang's KV transfer engines need RDMA or a
      GPU; its prefill server refuses the test backend), so not proven exact.
    """
    if getattr(server_args, "speculative_algorithm", None) is not None:
        return "speculative decoding"
    mode = getattr(server_args, "disaggregation_mode", "null")
    if mode in ("prefill", "decode"):
        return f"prefill/decode disaggregation (--disaggregation-mode {mode})"
    return next((role for attr, role in DISAGGREGATED_ROLES.items() if getattr(server_args, attr, False)), None)


# ServerArgs attribute (also set on an encoder server's model config) -> the role, as errors name it
DISAGGREGATED_ROLES = {
    "encoder_only": "encoder disaggregation (--encoder-only)",
    "language_only": "encoder disaggregation (--language-only)",
}


def refuse_unsupported(pruning: Pruning, conflict: str | None) -> None:
    """ValueError naming the setting and `conflict` (a `conflicting_setup` answer) if both are there."""
    if pruning.prunes and conflict is not None:
        setting = pruning.method.setting
        raise ValueError(
            f"{setting}={pruning.setting_value}: video pruning ({pruning.method.name}) is not supported with "
            f"{conflict} yet; unset {setting} (or set {PRUNING_RATE_SETTING} to 0) or serve without {conflict}"
        )
