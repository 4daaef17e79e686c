"""SGLang's HTTP app as each tokenizer worker of `--tokenizer-worker-num` > 1 runs it, with the plugin loaded.

With several tokenizer workers SGLang serves HTTP from worker processes (uvicorn's, or Granian's) that start as
fresh interpreters, import the app by its path (`SGLANG_HTTP_SERVER_APP_PATH`) and each build a
`TokenizerWorker`, where the multimodal processor runs and each response's meta info is built. SGLang calls
`load_plugins()` in the launching process, the scheduler, the detokenizer and the DP controller, never there:
without it a worker runs SGLang's own processor, so a video it tokenizes is served unpruned whatever the request
or the server's default asks, with no pruning counts. At startup the plugin points that path at this module
(`plugin.load_plugin_in_tokenizer_workers`, `plugin.TOKENIZER_WORKER_APP_PATH`), which loads SGLang's plugins
and then hands over SGLang's own app.
"""

from sglang_evs import sglang_compat as sglang

sglang.resolve("load_plugins")()
app = sglang.resolve("http_server_app")
