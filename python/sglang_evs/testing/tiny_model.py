"""Write a random-weight VLM checkpoint that HF transformers and SGLang both load, offline.

    python -m sglang_evs.testing.tiny_model OUT_DIR [--architecture ARCH] [--profile tiny|small]
        [--config-json '{"text_config": {"num_hidden_layers": 3}}'] [--seed 0]
    python -m sglang_evs.testing.tiny_model OUT_DIR --eagle3-draft-for TARGET

This module is the entry: the registry (`BUILDERS`: architecture -> a builder with one call,
`builder(out_dir, profile, seed, config_overrides, **options)`, see `TinyBuilder`), `build_tiny_model` and
the CLI. Each family is a module of its own beside the shared core (`tiny_core.py`), its docstring
describing it:
  tiny_qwen_vl.py      Qwen3VLForConditionalGeneration (default), Qwen3VLMoeForConditionalGeneration,
                       Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration,
                       Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration (MTP head)
  tiny_glm4v.py        Glm4vForConditionalGeneration, Glm4vMoeForConditionalGeneration
  tiny_gemma3.py       Gemma3ForConditionalGeneration (not pruned by the plugin)
  tiny_llava.py        LlavaForConditionalGeneration (not pruned by the plugin)
  tiny_qwen3_omni.py   Qwen3OmniMoeForConditionalGeneration (the thinker)
  tiny_qwen4_exp.py    Qwen4ExpForConditionalGeneration
  tiny_nemotron_vl.py  NemotronH_Nano_VL_V2 (config and tokenizer only)
  tiny_eagle3.py       LlamaForCausalLMEagle3: an EAGLE3 draft for a tiny Qwen3-VL (option `target_dir`;
                       `--eagle3-draft-for`)
A new family is a module of its own: `Architecture` entries for the shared path (`tiny_core.build`,
registered as `SharedPathBuilder`s), or a `build(out_dir, config_overrides, seed, profile)` and `PROFILES`
of its own (registered as an `OwnBuilder`); then one line in this module's registry.

Profiles:
  tiny   seconds on CPU; for correctness tests. Every architecture has one.
  small  Qwen3-VL, Qwen2.5-VL, Qwen3.5, Qwen4-Exp, Qwen3-Omni and GLM-4.1V: a language model that dominates
         prefill time, for performance ratios such as EVS time-to-first-token, with the vision tower tiny
         (their modules give the shapes).
  balanced  Qwen3-VL: small's language model under a tower with Qwen3-VL-2B's vision:language cost.

--config-json overrides config fields: top-level keys, and dicts under "text_config" /
"vision_config" merged into those sub-configs (nested dicts such as rope_parameters merge too).
A key that neither the config class nor the profile knows is an error.
"""

import argparse
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from sglang_evs.testing import (
    tiny_core,
    tiny_gemma3,
    tiny_glm4v,
    tiny_llava,
    tiny_nemotron_vl,
    tiny_qwen3_omni,
    tiny_qwen4_exp,
    tiny_qwen_vl,
)
from sglang_evs.testing.tiny_core import PROFILES, build_tokenizer
from sglang_evs.testing.tiny_eagle3 import build_eagle3_draft
from sglang_evs.testing.tiny_qwen_vl import DEFAULT_ARCHITECTURE, MTP_BLOCK_SCALE, QWEN_ARCHITECTURES, mtp_layers

__all__ = [
    "BUILDERS", "DEFAULT_ARCHITECTURE", "EAGLE3_ARCHITECTURE", "MTP_BLOCK_SCALE", "QWEN_ARCHITECTURES",
    "Eagle3DraftBuilder", "OwnBuilder", "SharedPathBuilder", "TinyBuilder", "build_config", "build_eagle3_draft",
    "build_tiny_model", "build_tiny_qwen3_vl", "build_tokenizer", "builders_digest", "main", "mtp_layers",
]  # fmt: skip


class TinyBuilder(Protocol):
    """How every architecture's tiny checkpoint is made: `builder(out_dir, profile, seed, config_overrides,
    **options)` writes it to out_dir and returns the path; `profiles` are the profiles it has."""

    profiles: tuple[str, ...]

    def __call__(
        self, out_dir: str | Path, profile: str = "tiny", seed: int = 0,
        config_overrides: Mapping[str, Any] | None = None, **options: Any,
    ) -> Path: ...  # fmt: skip


@dataclass(frozen=True)
class SharedPathBuilder:
    """A family built by the shared path (`tiny_core.build`) from its `tiny_core.Architecture` entry; it also
    writes the profile, seed and overrides (sglang_evs_profile.json)."""

    architecture: str
    arch: tiny_core.Architecture

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(self.arch.profiles)

    def __call__(
        self, out_dir: str | Path, profile: str = "tiny", seed: int = 0,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> Path:  # fmt: skip
        out = tiny_core.build(out_dir, self.architecture, self.arch, profile, config_overrides, seed)
        provenance: dict[str, Any] = {"profile": profile, "seed": seed}
        if self.architecture != DEFAULT_ARCHITECTURE or config_overrides:
            provenance |= {"architecture": self.architecture, "config_overrides": dict(config_overrides or {})}
        (out / "sglang_evs_profile.json").write_text(json.dumps(provenance))
        return out

    def config(self, profile: str, tokenizer=None, config_overrides: Mapping[str, Any] | None = None) -> Any:
        """The config at the profile, wired to the tokenizer, with the overrides merged in."""
        return tiny_core.build_config(self.architecture, self.arch, profile, tokenizer, config_overrides)


@dataclass(frozen=True)
class OwnBuilder:
    """A family that writes its checkpoint itself: its module's `build(out_dir, config_overrides, seed,
    profile)` and `PROFILES`."""

    family: ModuleType

    @property
    def profiles(self) -> tuple[str, ...]:
        return tuple(self.family.PROFILES)

    def __call__(
        self, out_dir: str | Path, profile: str = "tiny", seed: int = 0,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> Path:  # fmt: skip
        return self.family.build(out_dir, config_overrides, seed, profile)


EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class Eagle3DraftBuilder:
    """An EAGLE3 draft for the tiny Qwen3-VL at the option `target_dir` (`tiny_eagle3.build_eagle3_draft`):
    its shapes are the target's, so it has one profile and takes no overrides."""

    profiles: tuple[str, ...] = ("tiny",)

    def __call__(
        self, out_dir: str | Path, profile: str = "tiny", seed: int = 0,
        config_overrides: Mapping[str, Any] | None = None, *, target_dir: str | Path | None = None,
    ) -> Path:  # fmt: skip
        tiny_core.profile_of(dict.fromkeys(self.profiles), profile, EAGLE3_ARCHITECTURE)
        if target_dir is None or config_overrides:
            raise ValueError("an EAGLE3 draft takes its shapes from target_dir (the target), not from overrides")
        return build_eagle3_draft(out_dir, target_dir, seed)


# The registry: architecture -> its builder, one protocol for every family.
BUILDERS: dict[str, TinyBuilder] = {
    **{
        architecture: SharedPathBuilder(architecture, arch)
        for family in (tiny_qwen_vl, tiny_gemma3, tiny_llava, tiny_glm4v)
        for architecture, arch in family.ARCHITECTURES.items()
    },
    **{
        family.ARCHITECTURE: OwnBuilder(family)
        for family in (
            tiny_qwen3_omni,
            tiny_nemotron_vl,  # config and tokenizer only: served with --load-format dummy
            tiny_qwen4_exp,
        )
    },
    EAGLE3_ARCHITECTURE: Eagle3DraftBuilder(),
}


def build_tiny_model(
    out_dir: str | Path,
    architecture: str = DEFAULT_ARCHITECTURE,
    profile: str = "tiny",
    config_overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
    **options: Any,
) -> Path:
    """Write the architecture's checkpoint to out_dir through its builder (`BUILDERS`): config, seeded random
    bf16 weights, tokenizer, processor and chat template, as the family's module describes."""
    return BUILDERS[architecture](out_dir, profile, seed, config_overrides, **options)


def build_config(
    architecture: str, profile: str, tokenizer=None, config_overrides: Mapping[str, Any] | None = None
) -> Any:
    """The architecture's config at the profile, wired to the tokenizer, with the overrides merged in (the
    shared-path families: their builder's `config`)."""
    builder = BUILDERS[architecture]
    if not isinstance(builder, SharedPathBuilder):
        raise ValueError(f"{architecture} writes its config itself: build it with build_tiny_model")
    return builder.config(profile, tokenizer, config_overrides)


def build_tiny_qwen3_vl(out_dir: str | Path, profile: str = "tiny", seed: int = 0) -> Path:
    """The default architecture; kept for the demo and the benchmark sweep."""
    return build_tiny_model(out_dir, profile=profile, seed=seed)


def builders_digest() -> str:
    """A digest of the modules whose text decides a checkpoint's bytes (this entry, the shared core and each
    family's): a cache of built checkpoints keyed on it is rebuilt when any of them changes."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("tiny_*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--architecture", choices=list(BUILDERS), default=DEFAULT_ARCHITECTURE)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="tiny")
    parser.add_argument("--config-json", type=json.loads, default={}, help="config overrides, a JSON object")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eagle3-draft-for", metavar="TARGET", default=None,
                        help="write an EAGLE3 draft for the tiny Qwen3-VL at TARGET instead of a model")  # fmt: skip
    args = parser.parse_args()
    if args.eagle3_draft_for:
        draft = build_tiny_model(args.out_dir, EAGLE3_ARCHITECTURE, seed=args.seed, target_dir=args.eagle3_draft_for)
        print(f"wrote an EAGLE3 draft to {draft}")
        return
    path = build_tiny_model(args.out_dir, args.architecture, args.profile, args.config_json, args.seed)
    print(f"wrote {args.architecture} ({args.profile}) to {path}")


if __name__ == "__main__":
    main()
