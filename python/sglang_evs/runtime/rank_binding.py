"""Core groups for the scheduler ranks of a multi-rank server on SGLang's CPU route.

SGLang's CPU route binds every scheduler rank (tp * dp * pp of them) to the cores that
`SGLANG_CPU_OMP_THREADS_BIND` gives it ("0-3|4-7": rank 0 on cores 0-3, rank 1 on 4-7). Unset, it
allows one rank per NUMA node and stops at startup (utils/numa_utils.py) when more are asked for, so
the CPU launchers (`python -m sglang_evs.launch_server`, the test and benchmark harness) set one
contiguous core group per rank when the caller did not, and say so.
"""

import logging
import os
from collections.abc import Mapping, Sequence

THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"

logger = logging.getLogger(__name__)
_binding_logged: set[str] = set()


def ranks_asked(server_args: Sequence[str]) -> int:
    """Scheduler ranks the server arguments ask for: tp * dp * pp (1 when none is given), as SGLang's parser reads
    them (`sglang_compat.server_flags`)."""
    from sglang_evs.sglang_compat import server_flags

    flags = server_flags(server_args)
    return flags.tp_size * flags.dp_size * flags.pp_size


def core_groups(ranks: int, cores: Sequence[int]) -> list[list[int]]:
    """The cores split into `ranks` contiguous groups, the first ones a core larger where they do not
    divide evenly. With fewer cores than ranks, ranks share cores round-robin ([[0], [1], [0], [1]] for
    4 ranks on 2 cores)."""
    cores = sorted(cores)
    if len(cores) < ranks:
        return [[cores[rank % len(cores)]] for rank in range(ranks)]
    size, extra = divmod(len(cores), ranks)
    groups, start = [], 0
    for rank in range(ranks):
        end = start + size + (rank < extra)
        groups.append(cores[start:end])
        start = end
    return groups


def thread_binding(ranks: int, cores: Sequence[int]) -> str:
    """A `SGLANG_CPU_OMP_THREADS_BIND` value: `core_groups` written "0-3|4-7"-style ("0,1,2,3|4,5,6,7")."""
    return "|".join(",".join(map(str, group)) for group in core_groups(ranks, cores))


def cpu_rank_environment(server_args: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """`SGLANG_CPU_OMP_THREADS_BIND` for a multi-rank CPU server whose caller did not set it; logged once."""
    ranks = ranks_asked(server_args)
    if ranks <= 1 or env.get(THREADS_BIND_ENV):
        return {}
    binding = thread_binding(ranks, sorted(os.sched_getaffinity(0)))
    if binding not in _binding_logged:
        _binding_logged.add(binding)
        # with a binding SGLang cannot size each rank's KV cache from the machine's memory
        sizing = "" if any(a.startswith("--max-total-tokens") for a in server_args) else "; give --max-total-tokens"
        logger.warning(
            "%d CPU ranks: %s=%s (set it to choose the cores yourself)%s", ranks, THREADS_BIND_ENV, binding, sizing
        )
    return {THREADS_BIND_ENV: binding}
