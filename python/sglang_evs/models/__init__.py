"""SGLang model classes of sglang-evs, registered under the upstream architecture names.

`registry.py` maps architecture names to the classes here; the classes are
imported only in the process that builds the model.
"""
