"""GPTConfig's defaults: the ``auto`` backend and the exact GELU (a converted GPT-2 keeps its tanh GELU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import D_MODEL, N_HEADS, VOCAB, on_backend
from torch.testing import assert_close

from poslab import GPT, GPTConfig
from poslab.nn import attention
from poslab.nn.gpt_config import MLPConfig

pytestmark = pytest.mark.usefixtures("single_thread")


def test_gpt_backend_defaults_to_auto() -> None:
    """``auto`` lets a GPT on CUDA take flex; on CPU it is sdpa, bit for bit."""
    assert GPTConfig().attention.backend == "auto"
    assert attention.resolve_backend("auto", torch.device("cpu")) == "sdpa"
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=N_HEADS, n_embd=D_MODEL, block_size=16, position="alibi")
    ).eval()
    idx = torch.randint(0, VOCAB, (1, 12))
    assert_close(model(idx), on_backend(model, "sdpa", idx), atol=0, rtol=0)


def test_new_models_use_exact_gelu_and_gpt2_keeps_tanh() -> None:
    """The exact GELU by default (``gelu_tanh`` costs 2.3x its CPU time); GPT-2's ``gelu_new`` converts to
    ``gelu_tanh``."""
    cfg = GPTConfig()
    assert cfg.mlp.activation == "gelu" and GPTConfig(mlp=MLPConfig(kind="swiglu")).mlp.activation == "silu"
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=N_HEADS, n_embd=D_MODEL, block_size=16))
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 3, D_MODEL)
    assert_close(mlp(x), mlp.down(F.gelu(mlp.up(x))), atol=0, rtol=0)
    transformers = pytest.importorskip("transformers")
    from poslab.interop.hf import from_hf

    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    )
    assert from_hf(hf).config.mlp.activation == "gelu_tanh"  # GPT-2's gelu_new
