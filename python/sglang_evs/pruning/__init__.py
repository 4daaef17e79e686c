"""Video-token pruning as one mechanism that any M-RoPE model joins with a small adapter.

Tokenizer process:
  processor.py  SGLang's Qwen-VL processor, then `regions.prune_video_regions` for requests that prune
  settings.py   which method (EVS, VidCom2) and rate apply: the server default or the request's own
  regions.py    each pruned video becomes one region of its pruned length (known before encoding),
                positions outside it and the decode offset final, the item's hash folded with the
                method and rate
  usage.py      per-request counts (meta info, OpenAI usage) and Prometheus counters
Scheduler process:
  videos.py     `PrunedVideos`: batched encoding, keep-mask, region fill, exact positions per forward
Both:
  fields.py     what a pruned item carries between the two, and region helpers

The mechanism knows methods only through `methods.PruningMethod` (kept count before
encoding, keep-mask after). An adapter (models/) declares only its upstream class, its language model class and its
deepstack levels; the positions come from upstream's own `get_rope_index`, and the mask scores
every column the vision tower returns.
"""
