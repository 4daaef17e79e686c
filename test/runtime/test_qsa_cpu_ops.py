"""The QSA stand-ins (`runtime/qsa.py`) against upstream SGLang's own Triton kernel, and their wiring.

The oracle for `gather_qsa_compressed_keys` is the Triton kernel SGLang 0.5.23 launches on a GPU
(`qsa.kernel.gather_qsa_compressed_keys`), executed by Triton's interpreter (`TRITON_INTERPRET=1`,
in a fresh process; the file is loaded afresh, as the CPU route rebinds the module's name). Both
fill a fresh `new_empty` output; in the oracle process `new_empty` is made to fill with a sentinel
byte, so the whole output is compared byte for byte, rows neither writes included. Cases: bf16 /
fp32 / fp8 pools, int32 and int64 slot tables (with -1 padding past each sequence and a row stride
wider than the table), empty sequences, host `total_blocks` smaller than the device offsets say
(rows past it are never written), and a sequence longer than the kernel's grid.
"""

import textwrap

import torch

from sglang_evs.runtime import qsa

ORACLE = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch
    import sglang.srt.layers.attention.qsa.kernel as patched
    from sglang_evs.runtime import qsa

    # on the CPU route the import fixes rebind the module's gather: load upstream's file afresh beside it
    spec = importlib.util.spec_from_file_location("upstream_qsa_kernel", patched.__file__)
    kernel = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    assert kernel.gather_qsa_compressed_keys is not qsa.gather_qsa_compressed_keys

    plain_new_empty = torch.Tensor.new_empty
    def sentinel_empty(self, *args, **kwargs):
        return plain_new_empty(self, *args, **kwargs).view(torch.uint8).fill_(0xAB).view(self.dtype)
    torch.Tensor.new_empty = sentinel_empty

    mismatched, worst, written = [], 0, 0
    cases = [  # (dtype, ratio, kv_heads, dim, counts, total_blocks cut, max_blocks, table dtype)
        (torch.bfloat16, 2, 1, 32, [3, 0, 5], 0, None, torch.int32),
        (torch.float32, 4, 2, 16, [1, 7, 2, 4], 0, None, torch.int64),
        (torch.bfloat16, 2, 2, 64, [6, 4], 3, None, torch.int32),  # host total smaller than the offsets
        (torch.float8_e4m3fn, 2, 1, 32, [2, 9], 0, None, torch.int32),
        (torch.bfloat16, 2, 1, 16, [70, 5], 0, 3, torch.int32),  # the grid covers 64 blocks per sequence
        (torch.float32, 8, 1, 8, [0, 0], 0, None, torch.int32),
    ]
    for case, (dtype, ratio, heads, dim, counts, cut, max_blocks, table_dtype) in enumerate(cases):
        g = torch.Generator().manual_seed(case)
        pool_slots = 40
        compressed = torch.randn(pool_slots, heads, dim, generator=g).to(dtype)
        width = (max(counts) + 1) * ratio
        table = torch.randint(0, pool_slots * ratio, (len(counts), width + 5), generator=g).to(table_dtype)
        for i, k in enumerate(counts):
            table[i, k * ratio + 1 :] = -1  # padding past the sequence
        table = table[:, :width]  # row stride wider than the table, as a slice of the full page table
        cu = torch.tensor([0] + counts).cumsum(0).int()
        total = max(int(cu[-1]) - cut, 0)
        blocks = max(counts) if max_blocks is None else max_blocks
        outs = [fn(compressed, table, cu, total, blocks, ratio)
                for fn in (kernel.gather_qsa_compressed_keys, qsa.gather_qsa_compressed_keys)]
        a, b = (o.contiguous().view(torch.uint8) for o in outs)
        if outs[0].shape != outs[1].shape or outs[0].dtype != outs[1].dtype or not torch.equal(a, b):
            mismatched.append(case)
        written += int((a != 0xAB).any(-1).any(-1).sum())
        worst = max(worst, float((outs[0].float() - outs[1].float()).abs().nan_to_num(0).max()) if total else 0.0)
    print("RESULT " + json.dumps({"mismatched": mismatched, "worst": worst, "written_rows": written}))
    """
)


def test_gather_matches_upstream_triton_byte_for_byte(triton_interpreter):
    result = triton_interpreter(ORACLE)
    assert result["mismatched"] == [] and result["worst"] == 0.0
    assert result["written_rows"] > 80  # the cases did write rows (64 of the 70 in the long one)


def test_gather_semantics_on_a_small_case():
    """Block b of sequence i is compressed[table[i, b * ratio] // ratio], packed at cu[i] + b."""
    compressed = torch.arange(10 * 1 * 4, dtype=torch.float32).view(10, 1, 4)
    table = torch.tensor([[6, 7, 2, 3, -1, -1], [11, 10, 19, 18, 4, 5]], dtype=torch.int32)
    out = qsa.gather_qsa_compressed_keys(compressed, table, torch.tensor([0, 2, 5], dtype=torch.int32), 5, 3, 2)
    torch.testing.assert_close(out, compressed[[3, 1, 5, 9, 2]])


def test_qsa_modules_get_the_stand_ins_on_cpu(cpu_route):
    """A fresh interpreter, as SGLang's scheduler: the indexer gains CPU forwards, both gather names are ours."""
    code = """
        import sglang.srt.layers.attention.qsa.metadata as metadata
        import sglang.srt.layers.attention.qsa.kernel as kernel
        from sglang.srt.layers.attention.qsa.qsa_indexer import QSAIndexer
        from sglang_evs.runtime import qsa
        assert QSAIndexer.forward_cpu is QSAIndexer.forward_native is qsa.forward_cpu  # AMX or not
        gather = qsa.gather_qsa_compressed_keys
        assert metadata.gather_qsa_compressed_keys is kernel.gather_qsa_compressed_keys is gather
        print("wired")
    """
    stdout = cpu_route(code)
    assert "wired" in stdout
