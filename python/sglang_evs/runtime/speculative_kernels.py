"""Pure-torch bodies of the `sgl_kernel` ops that SGLang 0.5.23's EAGLE / NEXTN worker calls on CPU.

Each function keeps the argument names and order of its call site in
`sglang/kernels/ops/speculative/{cache_locs,eagle,spec_tree}.py` and writes its
outputs in place, as the CUDA kernels do. Batches on the CPU route are small, so
per-request loops are fine where a vectorised form would be harder to read.

Draft-tree conventions (`spec_tree.py`): a request's n = draft_token_num verify
tokens are node 0 (the last committed token) and n - 1 selected draft tokens;
`retrieve_next_token[b, i]` is node i's first child, `retrieve_next_sibling[b, i]`
its next sibling (-1: none), `retrieve_index[b, i]` its row in the flattened batch.
"""

import torch


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """out_cache_loc [B * topk * num_cols] = each request's KV slots from seq_len on."""
    width = topk * num_cols
    for i, (req, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[req, start : start + width]


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """out_cache_loc = req_to_token[req, start:end] of each request, packed in batch order."""
    packed = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        out_cache_loc[packed : packed + end - start] = req_to_token[req, start:end]
        packed += end - start


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """bonus_tokens [B] = each request's last accepted token (row b of accept_tokens, stride accept_stride)."""
    last = torch.arange(accept_lens.numel()) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[last].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """accept_out_cache_loc[:k] = out_cache_loc at the k accepted rows (accept_index != -1, in order)."""
    accepted = accept_index.reshape(-1)
    accepted = accepted[accepted != -1].long()
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The verify tree of each request from the draft's selections.

    parent_list [B, topk * (depth - 1) + 1]: the flat draft index of each step's parent;
    selected_index [B, n - 1]: the flat draft index of each selected token; verified_seq_len [B].
    Writes positions [B * n] (seq_len + depth in the tree), the retrieve_* links [B, n] and
    tree_mask: tree_mask_mode 0 (FULL_MASK) [sum(seq_len) * n + B * n * n] rows over prefix and
    tree, else (QLEN_ONLY) [B * n * n] rows over the tree only.
    """
    n = draft_token_num
    batch = verified_seq_len.shape[0]
    seq_lens = verified_seq_len.tolist()
    prefix_before = (torch.cumsum(verified_seq_len, 0) - verified_seq_len).tolist()
    parents = parent_list.reshape(batch, -1).tolist()
    selected = selected_index.reshape(batch, -1).tolist()
    links = (retrieve_index, retrieve_next_token, retrieve_next_sibling)
    index, next_token, next_sibling = (t.view(batch, n) for t in links)
    pos = positions.view(batch, n)
    mask = tree_mask.view(-1)
    full_mask = int(tree_mask_mode) == 0

    def node_of(b: int, draft_index: int) -> int | None:
        """The tree node (1..n-1) holding flat draft index draft_index, or None if it was not selected."""
        for node in range(n - 1):
            if selected[b][node] == draft_index:
                return node + 1
        return None

    def parent_node(b: int, node: int) -> int | None:
        step = selected[b][node - 1] // topk
        return 0 if step == 0 else node_of(b, parents[b][step])

    for b in range(batch):
        pos[b, 0] = seq_lens[b]
        for node in range(n - 1, 0, -1):
            index[b, node] = b * n + node
            parent = parent_node(b, node)
            if parent is not None:
                first_child = int(next_token[b, parent])
                next_token[b, parent] = node
                if first_child != -1:
                    next_sibling[b, node] = first_child
        index[b, 0] = b * n
        for node in range(n):
            if full_mask:
                row = n * n * b + prefix_before[b] * n + (seq_lens[b] + n) * node + seq_lens[b]
            else:
                row = n * n * b + n * node
            mask[row] = True  # node 0
            mask[row + 1 : row + n] = False
            if node == 0:
                continue
            ancestor, level = node, 0
            for _ in range(depth):
                level += 1
                mask[row + ancestor] = True
                parent = parent_node(b, ancestor)
                if not parent:  # 0 (the root) or not selected
                    break
                ancestor = parent
            pos[b, node] = seq_lens[b] + level


def verify_tree_greedy_cpu(
    *,
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy acceptance: from node 0, follow the child whose token equals the target's argmax.

    candidates [B, n] tokens of the tree; target_predict [B * n] the target's argmax after each node;
    writes accept_index [B, steps + 1] (rows of the accepted path), accept_token_num [B] (drafts
    accepted) and predicts [B * n] (the target's token after each accepted row, the bonus included).
    """
    batch, n = candidates.shape
    index, next_token, next_sibling = (
        t.view(batch, n) for t in (retrive_index, retrive_next_token, retrive_next_sibling)
    )
    target = target_predict.reshape(-1)
    for b in range(batch):
        row = int(index[b, 0])
        accept_index[b, 0] = row
        accepted, node = 0, 0
        for _ in range(1, accept_index.shape[1]):
            wanted = int(target[row])
            child = int(next_token[b, node])
            while child != -1 and int(candidates[b, child]) != wanted:
                child = int(next_sibling[b, child])
            if child == -1:
                break
            predicts[row] = wanted
            accepted += 1
            node, row = child, int(index[b, child])
            accept_index[b, accepted] = row
        accept_token_num[b] = accepted
        predicts[row] = int(target[row])


def fused_mamba_state_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: torch.Tensor | None = None,
) -> None:
    """Commit each request's state after its last accepted draft token.

    dst [layers, slots, ...]; src [layers, rows, steps, ...]; per request r: if
    step_indices_raw[r] >= 0, dst[:, dst_indices_raw[r]] = src[:, row_r, step_indices_raw[r]]
    with row_r = src_indices_raw[r] (None: r). Out-of-range indices are skipped, as the kernel does.
    """
    steps = step_indices_raw.long()
    rows = torch.arange(steps.numel()) if src_indices_raw is None else src_indices_raw.long()
    slots = dst_indices_raw.long()
    ok = (steps >= 0) & (steps < src.shape[2]) & (rows >= 0) & (rows < src.shape[1])
    ok &= (slots >= 0) & (slots < dst.shape[1])
    dst[:, slots[ok]] = src[:, rows[ok], steps[ok]].to(dst.dtype)
