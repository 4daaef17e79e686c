"""Which pruning method and rate apply to a request: the server's default, or the request's own.

Two settings, vLLM's names, at most one of them at a time:
  - `video_pruning_rate` q in [0, 1): EVS;
  - `video_retention_ratio` r in (0, 1]: VidCom2 at q = 1 - r.
The server default comes from the model config (`--json-model-override-args`); a request's
`mm_processor_kwargs` may name either setting, whatever method the server default uses.
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


def refuse_unsupported(pruning: Pruning, speculative: bool) -> None:
    if pruning.prunes and speculative:
        setting = pruning.method.setting
        raise ValueError(
            f"{setting}={pruning.setting_value}: video pruning ({pruning.method.name}) is not supported with "
            f"speculative decoding yet; unset {setting} (or set {PRUNING_RATE_SETTING} to 0) or disable "
            "speculative decoding"
        )
