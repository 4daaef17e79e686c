"""Video- and image-token pruning as one mechanism that any M-RoPE model joins with a small adapter.

What applies, and what is refused:
  settings.py         which method (EVS, VidCom2), rate or threshold, token budget and per-group floor apply:
                      the server default or the request's own; an image's method (DivPrune, DART) and rate
  refusals.py         what a server's setup cannot prune with (speculation, disaggregation), why, and the errors;
                      the one request feature refused over a pruned video (input logprobs)
Tokenizer process:
  processor.py        a family's upstream SGLang processor, then `regions.prune_video_regions` for requests
                      that prune (or, under encoder disaggregation, `encoder_records.lay_out_pruned`)
  regions.py          each pruned video becomes one region of its pruned length (known before encoding),
                      positions outside it and the decode offset final, the item keyed by `keys.py`; a
                      threshold's videos are marked and left unpruned; each pruned image its first kept-count
                      pads (`prune_image_regions`)
  keys.py             a pruned video's cache key: content hash folded with how it is pruned, into the hash
                      SGLang computes anyway, where it computes it (a hook on `MultimodalDataItem.set_pad_value`):
                      the tokenizer never hashes pixels for it
  streams.py          a request's videos as one stream's segments (`video_stream`): timestamps that continue, and
                      each continued segment's context (the stream's group before it) for the model to score it by
  stream_sessions.py  what the tokenizer keeps per session: where its last video ended (a later turn's stream goes
                      on from it), committed when a turn finishes, bounded, dropped on close; its turns' lengths
  session_turns.py    a session opened and closed by its own turns (`session_params.open`, `.close`): sessions
                      behind sglang-router, which routes no `/open_session`
  usage.py            per-request counts (meta info, OpenAI usage) and Prometheus counters
Scheduler process:
  admission.py        a threshold's videos encoded as the scheduler receives the request, the prompt laid out
                      from their masks (`deletion.delete_tokens`) before SGLang builds the request
  videos.py           `PrunedVideos`: batched encoding, keep-mask (decided once per video), region fill, exact
                      positions per forward
  images.py           `PrunedImages`: an image's keep-mask (decided once per image), its kept rows, exact positions
                      per forward (the rule videos follow)
  holds.py            each video encoded once per request: its rows held from its first chunk to its last,
                      under a bound, released with the request's media (finished, aborted)
  sessions.py         a pruned video or image in a later session turn: its region positions moved with the turn's;
                      a session turn's input logprobs over its session's pruned video refused
Both:
  fields.py           what a pruned item carries between the two, and region helpers
  deletion.py         `delete_tokens`: pruned tokens deleted from a processor output (ids, spans, M-RoPE
                      rows, decode offset), for `regions.py`, `admission.py` and `encoder_records.py` alike
Encoder disaggregation (encoder servers prune, the language server lays out):
  encoder_records.py  what an encoder does to each video and records, and the layout from the records
  disaggregated.py    the hooks that carry settings and records between the servers
Prefill/decode disaggregation (each server lays the prompt out itself):
  prefill_decode.py   the layout handshake: the prefill server sends its layout with the first token, the
                      decode server compares it with its own, the prefill server the decode's KV allocation;
                      a request whose two layouts differ fails by name; and a room already cleared reads
                      as failed (an SGLang race that ended a prefill server's transfer thread)

The mechanism knows methods only through `methods.PruningMethod` (kept count before
encoding, keep-mask after; under a budget or floor `methods.limited_count` / `methods.limited_mask`) and
`methods.images.ImagePruningMethod`, and a
model family only through its `served.VideoFamily`. An adapter (models/)
declares only its upstream class, its language model class and its deepstack levels; the positions come from
upstream's own `get_rope_index`, and the mask scores every column the vision tower returns.
"""
