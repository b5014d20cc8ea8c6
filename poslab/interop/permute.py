"""RoPE layout conversion: Meta's interleaved q/k rows <-> Hugging Face's half-split rows.

RoPE rotates pairs of coordinates of every query/key head. Meta's original Llama code (like
RoFormer and GPT-J) pairs ``(2i, 2i+1)`` ("interleaved"); Hugging Face's Llama, GPT-NeoX and
poslab's default pair ``(i, i + d/2)`` ("half"). The two are the same model once the rows of the q and
k projections are permuted inside every head, which is what Hugging Face's
``convert_llama_weights_to_hf.py`` and torchtune's ``tune_to_hf`` do::

    W.view(n_heads, d/2, 2, dim).transpose(1, 2).reshape(n_heads * d, dim)   # interleaved -> half

Forgetting this permutation is the most reported RoPE interop bug (transformers#25199, TinyLlama#24,
nanotron#427): the model loads, runs, and produces garbage.

Su et al. 2021, RoFormer (https://arxiv.org/abs/2104.09864).
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.checks import is_int, positive_int

LAYOUTS = ("half", "interleaved")


def permute_rope(weight: Tensor, n_heads: int, to: str = "half", rotary_dim: int | None = None) -> Tensor:
    """Permute q or k projection rows between the interleaved and half-split RoPE layouts.

    Args:
        weight: a q or k projection weight ``[n_heads * d_k, in_features]`` or its bias ``[n_heads * d_k]``
            (for GQA keys pass the number of key/value heads as ``n_heads``).
        n_heads: heads stacked in the rows.
        to: ``"half"`` (Meta/interleaved rows -> Hugging Face/half-split rows) or ``"interleaved"``
            (the inverse).
        rotary_dim: rotate only the first ``rotary_dim`` coordinates of each head (partial rotary,
            GPT-J/GPT-NeoX); the rest of every head is left in place. ``None`` = the whole head.

    Returns:
        A new tensor of the same shape and dtype.

    Raises:
        ValueError: unknown ``to``, rows not divisible by ``n_heads``, odd or oversized rotary dim.
    """
    if to not in LAYOUTS:
        raise ValueError(f"to={to!r} is not allowed; choose one of {list(LAYOUTS)}")
    if not isinstance(weight, Tensor) or weight.dim() not in (1, 2):
        raise ValueError(
            "weight must be a [rows, in] matrix or a [rows] bias, "
            f"got {getattr(weight, 'shape', type(weight).__name__)}"
        )
    positive_int("n_heads", n_heads)
    rows = weight.shape[0]
    if rows % n_heads:
        raise ValueError(f"weight has {rows} rows, not divisible by n_heads={n_heads}")
    head_dim = rows // n_heads
    rot = head_dim if rotary_dim is None else rotary_dim
    if not is_int(rot) or rot <= 0 or rot % 2 or rot > head_dim:
        raise ValueError(f"rotary_dim must be an even integer in (0, head_dim={head_dim}], got {rotary_dim!r}")
    rest = weight.shape[1:]
    heads = weight.reshape(n_heads, head_dim, *rest)  # [h, d_k, (in)]
    rotated, passed = heads[:, :rot], heads[:, rot:]  # [h, r, (in)], [h, d_k - r, (in)]
    if to == "half":  # row 2i+j (pair i, member j) -> row j*r/2 + i
        rotated = rotated.reshape(n_heads, rot // 2, 2, *rest).transpose(1, 2)  # [h, 2, r/2, (in)]
    else:  # row j*r/2 + i -> row 2i+j
        rotated = rotated.reshape(n_heads, 2, rot // 2, *rest).transpose(1, 2)  # [h, r/2, 2, (in)]
    rotated = rotated.reshape(n_heads, rot, *rest)  # [h, r, (in)]
    return torch.cat((rotated, passed), dim=1).reshape(weight.shape).contiguous()  # [h*d_k, (in)]


def relayout_rope(model: torch.nn.Module, to: str) -> torch.nn.Module:
    """A copy of a RoPE :class:`poslab.GPT` switched to layout ``to`` with the same function.

    The q and k rows of every fused ``qkv`` projection are permuted with :func:`permute_rope` and the
    scheme's ``layout`` is changed, so the copy's logits equal the original's.

    Args:
        model: a ``poslab.GPT`` whose ``position`` is the ``rope`` scheme.
        to: ``"half"`` or ``"interleaved"``.

    Returns:
        A new ``poslab.GPT`` (the original is untouched).
    """
    from poslab.nn.model import GPT, GPTConfig

    if not isinstance(model, GPT):
        raise TypeError(f"relayout_rope takes a poslab.GPT, got {type(model).__name__}")
    if to not in LAYOUTS:
        raise ValueError(f"to={to!r} is not allowed; choose one of {list(LAYOUTS)}")
    cfg = model.config
    if cfg.position != "rope":
        raise ValueError(f"relayout_rope needs a model with position='rope', this one has position={cfg.position!r}")
    rope = model.position.config
    values = cfg.to_dict()
    values["position_config"] = {**dict(cfg.position_config), "layout": to}
    new = GPT(GPTConfig.from_dict(values)).to(device=model.tok_emb.weight.device, dtype=model.tok_emb.weight.dtype)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if rope.layout != to:
        q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for i in range(cfg.n_layer):
            for suffix in ("weight", "bias"):
                key = f"blocks.{i}.attn.qkv.{suffix}"
                if key not in state:
                    continue
                q, k, v = state[key].split((q_rows, kv_rows, kv_rows), dim=0)  # rows of q | k | v
                q = permute_rope(q, cfg.n_head, to, rope.rotary_dim)
                k = permute_rope(k, cfg.kv_heads, to, rope.rotary_dim)
                state[key] = torch.cat((q, k, v), dim=0)
    new.load_state_dict(state)
    new.train(model.training)
    return new
