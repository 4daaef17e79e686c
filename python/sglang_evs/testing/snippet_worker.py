"""A long-lived interpreter that runs snippets of Python one after another, each in a namespace of its own.

    python -m sglang_evs.testing.snippet_worker REQUESTS REPLIES

REQUESTS and REPLIES are named pipes: one JSON string (the snippet's source) per line in, one
`{"ok": bool, "out": str}` per line out (`out`: what the snippet printed, or its traceback). Forked from a warm
interpreter (`warm_start`), SGLang is imported once per environment instead of once per test; the CPU runtime's
fixes act at import, whatever imported a module first, so a snippet sees the wiring a fresh interpreter has.
"""

import contextlib
import io
import json
import sys
import traceback


def serve(requests_path: str, replies_path: str) -> None:
    with open(requests_path) as requests, open(replies_path, "w") as replies:
        for line in requests:
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(json.loads(line), "<snippet>", "exec"), {"__name__": "__snippet__"})
                ok = True
            except BaseException:  # noqa: BLE001 - a snippet's failure is its test's, reported with its traceback
                ok = False
                out.write(traceback.format_exc())
            replies.write(json.dumps({"ok": ok, "out": out.getvalue()}) + "\n")
            replies.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
