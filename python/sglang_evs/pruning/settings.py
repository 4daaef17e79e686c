"""Which pruning method and rate apply to a request: the server's default, or the request's own.

vLLM's two settings: `video_pruning_method` ("evs" | "vidcom2", default "evs") and
`video_pruning_rate` q in [0, 1), the fraction of video tokens pruned, for either method.
The server default comes from the model config (`--json-model-override-args`, or
`python -m sglang_evs.launch_server --video-pruning-method M --video-pruning-rate Q`); a request's
`mm_processor_kwargs` may name the method, the rate or both, and what it leaves out is the
server's. A chat request may also name them in `chat_template_kwargs`, the field sglang-router
forwards (0.3.2 rebuilds requests and drops `mm_processor_kwargs`); `chat_processor_kwargs` moves
over those `mm_processor_kwargs` does not name. `video_retention_ratio` (this project's former
VidCom2 setting) is refused with what to write instead. What a server's setup cannot prune with, and the
errors that refuse it, are `refusals.py`'s.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from sglang_evs.methods import (
    DEFAULT_METHOD,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PruningMethod,
    check_pruning_rate,
    method_named,
)

RETIRED_SETTING = "video_retention_ratio"
# Every key the plugin reads from a config or a request: the retired one too, to refuse it by name.
READ_SETTINGS = (PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING, RETIRED_SETTING)


@dataclass(frozen=True)
class Pruning:
    method: PruningMethod
    rate: float  # q in [0, 1); 0 prunes nothing, whatever the method

    @property
    def prunes(self) -> bool:
        return self.rate > 0.0


NO_PRUNING = Pruning(DEFAULT_METHOD, 0.0)


def pruning_from(settings: Mapping[str, object], default: Pruning) -> Pruning:
    """The method and rate `settings` name, each falling back to `default`'s; ValueError naming the
    setting when a value is invalid or the retired `video_retention_ratio` is given."""
    if settings.get(RETIRED_SETTING) is not None:
        raise ValueError(
            f"{RETIRED_SETTING} is no longer read: write {PRUNING_METHOD_SETTING}='vidcom2' and "
            f"{PRUNING_RATE_SETTING}=1 - {RETIRED_SETTING} (vLLM's settings)"
        )
    name, rate = settings.get(PRUNING_METHOD_SETTING), settings.get(PRUNING_RATE_SETTING)
    return Pruning(
        default.method if name is None else method_named(name),
        default.rate if rate is None else check_pruning_rate(rate),
    )


def server_pruning(hf_config) -> Pruning:
    """The server-wide default; raises ValueError naming the setting if it is invalid."""
    return pruning_from({key: getattr(hf_config, key, None) for key in READ_SETTINGS}, NO_PRUNING)


def request_pruning(request_obj, default: Pruning) -> Pruning:
    """The request's own settings over `default` (ValueError naming the setting if invalid)."""
    return pruning_from(getattr(request_obj, "mm_processor_kwargs", None) or {}, default)


def chat_processor_kwargs(chat_template_kwargs: dict | None, mm_processor_kwargs: dict | None) -> dict | None:
    """A chat request's `mm_processor_kwargs`, given the pruning settings its `chat_template_kwargs` name
    that it does not name itself (its own win: `chat_template_kwargs` may hold a server-wide default)."""
    own = {key: value for key, value in (mm_processor_kwargs or {}).items() if value is not None}
    carried = {key: value for key in READ_SETTINGS if (value := (chat_template_kwargs or {}).get(key)) is not None}
    return {**carried, **own} if carried.keys() - own.keys() else mm_processor_kwargs
