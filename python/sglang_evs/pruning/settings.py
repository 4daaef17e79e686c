"""Which pruning applies to a request: the server's default, or the request's own.

vLLM's two settings: `video_pruning_method` ("evs" | "vidcom2", default "evs") and
`video_pruning_rate` q in [0, 1), the fraction of video tokens pruned, for either method. Beside them,
two limits on the count (`methods.limits`): `video_token_budget` N (at most N tokens per video, 0: none)
and `video_pruning_min_tokens_per_group` k (no temporal group keeps fewer than k, 0: none); and
`video_pruning_threshold` t in [0, 2] (EVS: keep group 0 and what changed by more than t), which decides the
count in place of the rate, by the content (`methods.threshold`): one setting names a rate or a threshold,
not both, and a request naming a rate sets aside a server's default threshold (and the other way round).
A request's `video_stream` (true: its videos are consecutive segments of one stream, `pruning/streams.py`) is
a request's alone, never a server default.
The server default comes from the model config (`--json-model-override-args`, or
`python -m sglang_evs.launch_server --video-pruning-method M --video-pruning-rate Q ...`); a request's
`mm_processor_kwargs` may name any of them, and what it leaves out is the server's. A chat request may
also name them in `chat_template_kwargs`, the field sglang-router forwards (0.3.2 rebuilds requests and
drops `mm_processor_kwargs`); `chat_processor_kwargs` moves over those `mm_processor_kwargs` does not
name. A key in the settings' namespace (`video_pruning_*`, `video_token_*`) that is none of them, a
misspelling, is refused naming the ones that exist; `video_retention_ratio` (this project's former
VidCom2 setting) is refused with what to write instead. What a server's setup cannot prune with, and the
errors that refuse it, are `refusals.py`'s.

Images have settings of their own, read the same ways (`ImagePruning`): `image_pruning_method` ("divprune" |
"dart", default "divprune") and `image_pruning_rate` q in [0, 1), off by default (`methods.images`).
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sglang_evs.methods import (
    DEFAULT_METHOD,
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    STREAM_SETTING,
    TOKEN_BUDGET_SETTING,
    PruningMethod,
    check_pruning_rate,
    check_pruning_threshold,
    check_token_count,
    limited_count,
    method_named,
)
from sglang_evs.methods.images import (
    DEFAULT_IMAGE_METHOD,
    IMAGE_PRUNING_METHOD_SETTING,
    IMAGE_PRUNING_RATE_SETTING,
    ImagePruningMethod,
    check_image_pruning_rate,
    image_method_named,
)

RETIRED_SETTING = "video_retention_ratio"
SETTINGS = (
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    TOKEN_BUDGET_SETTING,
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_THRESHOLD_SETTING,
    STREAM_SETTING,
)
IMAGE_SETTINGS = (IMAGE_PRUNING_METHOD_SETTING, IMAGE_PRUNING_RATE_SETTING)
# Every key the plugin reads from a config or a request: the retired one too, to refuse it by name.
READ_SETTINGS = (*SETTINGS, *IMAGE_SETTINGS, RETIRED_SETTING)
NAMESPACE = ("video_pruning_", "video_token_", "image_pruning_")  # a key so named and not a setting: a misspelling
NOT_SETTINGS = frozenset({"video_token_id", "video_token_index"})  # model-config token ids with the prefix


@dataclass(frozen=True)
class Pruning:
    method: PruningMethod
    rate: float  # q in [0, 1); 0 prunes nothing, whatever the method
    token_budget: int = 0  # N: at most N tokens per video; 0: none (a budget alone prunes)
    min_tokens_per_group: int = 0  # k: no temporal group keeps fewer; 0: none (raises the count, never prunes)
    threshold: float | None = None  # t in [0, 2], EVS only: decides the count in place of the rate; None: none
    stream: bool = False  # the request's videos are consecutive segments of one stream (`pruning/streams.py`)

    @property
    def prunes(self) -> bool:
        return self.rate > 0.0 or self.token_budget > 0 or self.threshold is not None

    @property
    def follows_content(self) -> bool:
        """Whether the count is known only once the vision encoder has run (a threshold)."""
        return self.threshold is not None

    @property
    def limits_count(self) -> bool:
        """Whether a budget or a floor changes what the rate alone keeps (in some video)."""
        return bool(self.token_budget or self.min_tokens_per_group)

    def kept_count(self, tokens_per_group: int, num_groups: int) -> int:
        """Tokens kept of a video of `num_groups` groups of `tokens_per_group` (`methods.limited_count`)."""
        return limited_count(self.method, tokens_per_group, num_groups, self.rate, self.token_budget,
                             self.min_tokens_per_group)  # fmt: skip

    def named(self) -> str:
        """The settings that prune, as a request writes them, for errors: e.g. `video_pruning_rate=0.5`."""
        alone = not (self.token_budget or self.follows_content)
        named = [f"{PRUNING_THRESHOLD_SETTING}={self.threshold}"] if self.follows_content else []
        named += [f"{PRUNING_RATE_SETTING}={self.rate}"] if self.rate or alone else []
        named += [f"{TOKEN_BUDGET_SETTING}={self.token_budget}"] if self.token_budget else []
        named += [f"{MIN_TOKENS_PER_GROUP_SETTING}={self.min_tokens_per_group}"] if self.min_tokens_per_group else []
        return ", ".join(named)


NO_PRUNING = Pruning(DEFAULT_METHOD, 0.0)


def is_pruning_key(key: object) -> bool:
    """Whether a key is this module's to read or refuse: a setting, the retired one, or a key of the settings'
    namespace (a misspelling)."""
    return isinstance(key, str) and (key in READ_SETTINGS or (key.startswith(NAMESPACE) and key not in NOT_SETTINGS))


def unknown_settings(settings: Mapping[str, object]) -> list[str]:
    """The keys of `settings` in the pruning settings' namespace that are no setting (misspellings)."""
    return [key for key in settings if is_pruning_key(key) and key not in READ_SETTINGS]


def pruning_from(settings: Mapping[str, object], default: Pruning) -> Pruning:
    """The settings `settings` name, each falling back to `default`'s; ValueError naming the setting when a
    value is invalid, a key of the namespace is no setting, the retired `video_retention_ratio` is given, a
    rate and a threshold are both given, or a threshold with another method than EVS (it is EVS's score)."""
    if settings.get(RETIRED_SETTING) is not None:
        raise ValueError(
            f"{RETIRED_SETTING} is no longer read: write {PRUNING_METHOD_SETTING}='vidcom2' and "
            f"{PRUNING_RATE_SETTING}=1 - {RETIRED_SETTING} (vLLM's settings)"
        )
    unknown = unknown_settings(settings)
    if unknown:
        kind = "image" if all(key.startswith("image_") for key in unknown) else "video"
        raise ValueError(
            f"unknown {kind} pruning setting{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: "
            f"the settings are {', '.join((*SETTINGS, *IMAGE_SETTINGS))}"
        )
    name, rate = settings.get(PRUNING_METHOD_SETTING), settings.get(PRUNING_RATE_SETTING)
    budget, floor = settings.get(TOKEN_BUDGET_SETTING), settings.get(MIN_TOKENS_PER_GROUP_SETTING)
    threshold = settings.get(PRUNING_THRESHOLD_SETTING)
    if rate is not None and threshold is not None:
        raise ValueError(
            f"{PRUNING_RATE_SETTING}={rate} and {PRUNING_THRESHOLD_SETTING}={threshold}: name one; a threshold "
            "decides the kept count by the content, a rate by a fixed share"
        )
    # the count's decider named here sets the default's other decider aside
    default_rate = default.rate if threshold is None else 0.0
    default_threshold = default.threshold if rate is None else None
    pruning = Pruning(
        default.method if name is None else method_named(name),
        default_rate if rate is None else check_pruning_rate(rate),
        default.token_budget if budget is None else check_token_count(budget, TOKEN_BUDGET_SETTING),
        default.min_tokens_per_group if floor is None else check_token_count(floor, MIN_TOKENS_PER_GROUP_SETTING),
        default_threshold if threshold is None else check_pruning_threshold(threshold),
    )
    stream = settings.get(STREAM_SETTING)
    if stream is not None and not isinstance(stream, bool):
        raise ValueError(f"{STREAM_SETTING} must be true or false, got {stream!r}")
    if stream:
        if pruning.method != DEFAULT_METHOD:
            raise ValueError(
                f"{STREAM_SETTING} prunes a stream as EVS scores it (each segment's first group against the stream's "
                f"group before it) and takes {PRUNING_METHOD_SETTING}='{DEFAULT_METHOD.name}', not "
                f"{pruning.method.name!r}"
            )
        pruning = replace(pruning, stream=True)
    if pruning.follows_content and pruning.method != DEFAULT_METHOD:
        raise ValueError(
            f"{PRUNING_THRESHOLD_SETTING}={pruning.threshold} is EVS's dissimilarity and takes "
            f"{PRUNING_METHOD_SETTING}='{DEFAULT_METHOD.name}', not {pruning.method.name!r}"
        )
    return pruning


@dataclass(frozen=True)
class ImagePruning:
    method: ImagePruningMethod
    rate: float  # q in [0, 1); 0 prunes nothing, whatever the method

    @property
    def prunes(self) -> bool:
        return self.rate > 0.0


NO_IMAGE_PRUNING = ImagePruning(DEFAULT_IMAGE_METHOD, 0.0)


def image_pruning_from(settings: Mapping[str, object], default: ImagePruning) -> ImagePruning:
    """The image settings `settings` name, each falling back to `default`'s; ValueError naming the setting when a
    value is invalid (a misspelt key of the namespace is `pruning_from`'s to refuse)."""
    name, rate = settings.get(IMAGE_PRUNING_METHOD_SETTING), settings.get(IMAGE_PRUNING_RATE_SETTING)
    return ImagePruning(
        default.method if name is None else image_method_named(name),
        default.rate if rate is None else check_image_pruning_rate(rate),
    )


def server_image_pruning(hf_config) -> ImagePruning:
    """The server-wide image default; raises ValueError naming the setting if it is invalid."""
    return image_pruning_from({key: getattr(hf_config, key, None) for key in IMAGE_SETTINGS}, NO_IMAGE_PRUNING)


def request_image_pruning(request_obj, default: ImagePruning) -> ImagePruning:
    """The request's own image settings over `default` (ValueError naming the setting if invalid)."""
    return image_pruning_from(getattr(request_obj, "mm_processor_kwargs", None) or {}, default)


def server_pruning(hf_config) -> Pruning:
    """The server-wide default; raises ValueError naming the setting if it is invalid."""
    if getattr(hf_config, STREAM_SETTING, None) is not None:
        raise ValueError(f"{STREAM_SETTING} marks one request's videos as one stream: it is no server default")
    return pruning_from({key: getattr(hf_config, key, None) for key in READ_SETTINGS}, NO_PRUNING)


def request_pruning(request_obj, default: Pruning) -> Pruning:
    """The request's own settings over `default` (ValueError naming the setting if invalid)."""
    return pruning_from(getattr(request_obj, "mm_processor_kwargs", None) or {}, default)


def chat_processor_kwargs(chat_template_kwargs: dict | None, mm_processor_kwargs: dict | None) -> dict | None:
    """A chat request's `mm_processor_kwargs`, given the pruning settings its `chat_template_kwargs` name
    that it does not name itself (its own win: `chat_template_kwargs` may hold a server-wide default).
    Every key of the settings' namespace comes over, so that a misspelt one is refused as in
    `mm_processor_kwargs`."""
    own = {key: value for key, value in (mm_processor_kwargs or {}).items() if value is not None}
    carried = {
        key: value for key, value in (chat_template_kwargs or {}).items() if is_pruning_key(key) and value is not None
    }
    return {**carried, **own} if carried.keys() - own.keys() else mm_processor_kwargs
