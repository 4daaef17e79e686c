"""Installed beside every model SGLang serves: the table of SGLang's whole model registry, with the plugin
loaded and without it (`routine_probe.py`, run in two fresh interpreters that load SGLang as a server does).

Only the architectures this project serves (`served.SERVED`) resolve to its classes and processors, and only
those reach its embedding routine; every other architecture
is SGLang's own class with SGLang's own processor (so its prompts are laid out as upstream lays them out),
reaches only SGLang's own routine (no hook wraps it), and that routine hands the language model the very
same tensors on synthetic media, with and without the plugin. A new SGLang model falls on the
upstream side by itself: nothing here names it.

Drafts: every speculative draft architecture of the registry resolves to SGLang's own class outside a server
and beside any target this project does not serve (SGLang builds `Qwen3_5ForCausalLMMTP` for InternS2 and the
text-only Qwen3.5 too), with the plugin as without it; only beside a served target whose record names it
(`served.mtp_draft_of`), or the EAGLE3 draft where positions are traced, is it this project's class.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.served import EAGLE3_DRAFT, SERVED, mtp_draft_of

PROBE = Path(__file__).with_name("routine_probe.py")
# Read off SGLang 0.5.23: the models the issue of "installed beside every model" names that stay upstream's:
# Nemotron-Nano-VL (SGLang's own EVS) reaches upstream's routine through its own forward. (Qwen3-Omni and
# Qwen4-Exp, named there too, are now this project's: `served.SERVED`.)
NEIGHBOURS = ("NemotronH_Nano_VL_V2",)


def probes(*plugins: str) -> dict[str, dict]:
    """The table with the plugin "on" and "off", each from its own fresh interpreter, the two at once (each
    spends its ~10 s importing SGLang's model registry on one core)."""
    running = {}
    for plugin in plugins:
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
        if plugin == "off":
            env["SGLANG_PLUGINS"] = "none"
        running[plugin] = subprocess.Popen(
            [sys.executable, str(PROBE), plugin], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    tables = {}
    for plugin, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
        tables[plugin] = json.loads(out.strip().splitlines()[-1])
    return tables


@pytest.fixture(scope="module")
def probed() -> dict[str, dict]:
    return probes("on", "off")


@pytest.fixture(scope="module")
def tables(probed) -> dict[str, dict]:
    return {plugin: table["models"] for plugin, table in probed.items()}


@pytest.fixture(scope="module")
def drafts(probed) -> dict[str, dict]:
    return {plugin: table["drafts"] for plugin, table in probed.items()}


def test_the_table_covers_the_whole_registry(tables):
    on, off = tables["on"], tables["off"]
    assert on.keys() == off.keys() and len(on) > 250
    reaching = {arch for arch, row in on.items() if row["routines"]}
    ours = {arch for arch, row in on.items() if row["resolved"].startswith("sglang_evs.")}
    counts = {
        "classes": len(on),
        "reach a routine": len(reaching),
        "to this project's routine": sum("sglang_evs" in on[arch]["routines"] for arch in reaching),
        "to upstream's only": sum(on[arch]["routines"] == ["upstream"] for arch in reaching),
    }
    print(f"registry table: {counts}")
    assert counts["to this project's routine"] == len(SERVED)
    assert counts["to upstream's only"] == len(reaching) - len(SERVED) > 40
    assert ours == SERVED.keys() & on.keys()  # a draft is ours beside a served target only (below)


def test_every_other_architecture_is_upstreams_with_the_same_inputs(tables):
    on, off = tables["on"], tables["off"]
    others = sorted(on.keys() - SERVED.keys())
    changed = [arch for arch in others if on[arch] != off[arch]]
    assert not changed, {arch: (on[arch], off[arch]) for arch in changed[:5]}
    assert all(on[arch]["resolved"].startswith("sglang.srt.models.") for arch in others)
    assert sum(bool(on[arch]["received"]) for arch in others) > 40  # the synthetic media ran through them


def test_no_routine_is_wrapped(tables):
    for plugin, table in tables.items():
        names = {name for row in table.values() for name in row["routines"]}
        assert names <= {"upstream", "sglang_evs"}, (plugin, names)


def test_this_projects_classes_reach_its_routine_and_processor(tables):
    for arch in SERVED:
        row = tables["on"][arch]
        assert row["resolved"].startswith("sglang_evs.models.") and "sglang_evs" in row["routines"], arch
        assert row["processor"].startswith("sglang_evs.pruning.processor:"), arch
        assert "sglang_evs" not in tables["off"][arch]["routines"], arch
    assert sum(row["processor"] is not None for row in tables["off"].values()) > 60  # the multimodal models


@pytest.mark.parametrize("arch", NEIGHBOURS)
def test_the_neighbours_named_in_the_issue_stay_upstream(tables, arch):
    row = tables["on"][arch]
    assert row["routines"] == ["upstream"] and row["resolved"].startswith("sglang.srt.models.")
    assert len(row["received"]) == 2 and row == tables["off"][arch]  # both call shapes, digests equal


def ours_for(draft: str, key: str) -> bool:
    """Whether the plugin should answer `draft` at `key` ("target|traced"): beside a served target whose record
    names it, or (the EAGLE3 draft) beside a served target with positions traced."""
    target, traced = key.split("|")
    if target not in SERVED:
        return False
    mtp = mtp_draft_of(target)
    return (mtp is not None and mtp.architecture == draft) or (draft == EAGLE3_DRAFT.architecture and traced == "True")


def test_every_draft_is_sglangs_own_beside_a_target_not_served(drafts):
    on, off = drafts["on"], drafts["off"]
    assert on.keys() == off.keys() and len(on) > 30
    assert {"Qwen3_5ForCausalLMMTP", "Qwen4ExpForCausalLMMTP", EAGLE3_DRAFT.architecture} <= on.keys()
    assert all(row.keys() == on["Qwen3_5ForCausalLMMTP"].keys() for row in on.values())
    for draft, row in on.items():
        assert all(cls.startswith("sglang.srt.models.") for cls in off[draft].values()), draft
        for key, cls in row.items():
            if key.split("|")[0] not in SERVED:  # no server, InternS2, text-only Qwen3.5, Llama
                assert cls == off[draft][key], (draft, key, cls)


def test_a_served_target_gets_the_draft_its_record_names_and_sglangs_for_any_other(drafts):
    on, off = drafts["on"], drafts["off"]
    swapped = {(draft, key) for draft, row in on.items() for key, cls in row.items() if cls != off[draft][key]}
    assert swapped == {(draft, key) for draft, row in on.items() for key in row if ours_for(draft, key)}
    assert all(on[draft][key].startswith("sglang_evs.models.") for draft, key in swapped)
    assert {draft for draft, _ in swapped} == {
        "Qwen3_5ForCausalLMMTP",
        "Qwen4ExpForCausalLMMTP",
        EAGLE3_DRAFT.architecture,
    }
