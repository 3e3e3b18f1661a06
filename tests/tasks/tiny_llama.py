"""The tiny random HF Llama the TRL parity tests compare zoo with (torch and transformers are
imported by the caller, which skips without them)."""

from __future__ import annotations


def tiny_llama(seed: int, vocab_size: int):
    """A 2-layer grouped-query Llama in float32, eval mode, drawn from `seed` (ids: pad 0, bos 1,
    eos 2)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).float().eval()
