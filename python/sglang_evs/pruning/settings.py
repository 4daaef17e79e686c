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
    return _selected(getattr(request_obj, "mm_processor_kwargs", None) or {}) or default


def chat_processor_kwargs(chat_template_kwargs: dict | None, mm_processor_kwargs: dict | None) -> dict | None:
    """A chat request's `mm_processor_kwargs`, given the pruning setting its `chat_template_kwargs` name
    when it names none itself (its own wins: `chat_template_kwargs` may hold a server-wide default)."""
    carried = {m.setting: v for m in METHODS.values() if (v := (chat_template_kwargs or {}).get(m.setting)) is not None}
    if not carried or method_from_settings(mm_processor_kwargs or {}) is not None:
        return mm_processor_kwargs
    return {**(mm_processor_kwargs or {}), **carried}


def refuse_unsupported(pruning: Pruning, speculative: bool) -> None:
    if pruning.prunes and speculative:
        setting = pruning.method.setting
        raise ValueError(
            f"{setting}={pruning.setting_value}: video pruning ({pruning.method.name}) is not supported with "
            f"speculative decoding yet; unset {setting} (or set {PRUNING_RATE_SETTING} to 0) or disable "
            "speculative decoding"
        )
