"""The test tooling: tiny random checkpoints (`tiny_model`), synthetic media, servers and requests, and the
helpers the tests share (oracles, the HF reference, comparisons), imported from here rather than from test
modules."""
