"""CPU runtime support: lets SGLang 0.5.23 serve on a machine without a GPU.

`bootstrap` runs from a `.pth` file in every Python process of the CPU route (the
`sglang-evs-cpu-route` distribution, `scripts/cpu_route/setup.py`; a GPU install has no such
file) and installs the lazy import hook in `import_fixes`. Each fix fires only where it is needed:
the SGLang ones when `SGLANG_USE_CPU_ENGINE=1` and no real `sgl_kernel` is
installed, the torchvision one only when torchvision's own ops failed to load.
On a GPU install none of them does anything.
"""
