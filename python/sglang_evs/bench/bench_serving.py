"""`python -m sglang.bench_serving`, runnable without the `datasets` package (see `datasets_shim`).

    python -m sglang_evs.bench.bench_serving ARGS...   # exactly the CLI of sglang.bench_serving

With `datasets` installed (any regular SGLang install) the two commands are the same program.
"""

import warnings

from sglang_evs.bench.datasets_shim import ensure_datasets_importable


def main() -> None:
    ensure_datasets_importable()
    warnings.filterwarnings("ignore", category=FutureWarning, module="sglang")
    from sglang.benchmark.serving import cli_main

    cli_main()


if __name__ == "__main__":
    main()
