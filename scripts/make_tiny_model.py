#!/usr/bin/env python3
"""Build a tiny random-weight model (Llama, DeepSeek-V2 MLA, Granite-4.0-H hybrid or Llama with sliding-window
layers) with a locally trained byte-level BPE tokenizer.

Why: no model can be downloaded on the test machines, yet the vLLM end-to-end tests need a real
model directory that vLLM loads like any Hugging Face checkpoint. The weights are random (fixed
seed), so the text is gibberish, but greedy decoding is deterministic -- which is all the tests
need to prove the KV handed from prefill to decode is what decode uses.

Shape: hidden 64, 2 attention heads (head size 32, which vLLM's CPU attention backend
supports), 2 layers, vocab ~512. Runs in seconds. Needs ``transformers`` and ``tokenizers``
(both come with vLLM; run it with the vLLM venv's python).

Other families (``--arch``), for the model shapes deployments serve:

* ``deepseek_v2``: multi-head latent attention (MLA), the KV cache one 576-wide latent per token
  (``kv_lora_rank`` 512 + rope 64, what DeepSeek and Kimi use and the only width vLLM's CPU MLA
  kernel takes), dense MLPs, bf16 (vLLM CPU's MLA path);
* ``llama_sliding``: Llama with sliding-window attention layers (window 64 tokens) and
  full-attention layers interleaved (``layer_types``, as Gemma-2/3, Mistral and gpt-oss style
  models mix them); vLLM's hybrid KV cache manager keeps one KV cache group per kind;
* ``granite_hybrid``: Granite-4.0-H style, Mamba2 layers and attention layers interleaved
  (``layer_types``), dense MLPs; vLLM serves it with its hybrid KV cache manager (one KV cache
  group per layer kind). vLLM CPU 0.32 serves it with ``--no-enable-prefix-caching``; with prefix
  caching (Mamba cache mode ``align``) a prompt of 100 tokens crashes its Mamba2 kernel.

    python scripts/make_tiny_model.py /tmp/tiny-llama
    python scripts/make_tiny_model.py --arch deepseek_v2 /tmp/tiny-mla
    python scripts/make_tiny_model.py --arch llama_sliding /tmp/tiny-sliding
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def _corpus(n_lines: int, seed: int) -> list[str]:
    """Synthetic English-ish text: enough variety for a few hundred BPE merges."""
    rng = random.Random(seed)
    words = ("the a of to and in is that for it as was with on be by this are from at or an have not "
             "mooncake cache block token prefill decode transfer engine store memory kv layer head "
             "model request server proxy latency throughput batch vector tensor stream queue node "
             "alpha beta gamma delta one two three four five six seven eight nine ten").split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) + "." for _ in range(n_lines)]


ARCHS = ("llama", "deepseek_v2", "granite_hybrid", "llama_sliding")
#: the sliding window of ``llama_sliding``'s window layers, in tokens (two 32-token blocks)
SLIDING_WINDOW = 64


def _model(arch: str, vocab: int, hidden: int, heads: int, layers: int, intermediate: int, max_pos: int):
    """The untrained Hugging Face model of family ``arch`` (weights initialised by the caller)."""
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_pos,
                  bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    if arch == "deepseek_v2":
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

        # all layers dense (first_k_dense_replace = layers): MoE adds nothing to the KV layout
        cfg = DeepseekV2Config(**common, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                               qk_nope_head_dim=32, v_head_dim=32, first_k_dense_replace=layers,
                               n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                               moe_intermediate_size=intermediate, torch_dtype="bfloat16")
        return DeepseekV2ForCausalLM(cfg)
    if arch == "granite_hybrid":
        from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

        kinds = ["mamba" if i % 2 == 0 else "attention" for i in range(layers)]
        cfg = GraniteMoeHybridConfig(**common, layer_types=kinds, num_local_experts=0,
                                     shared_intermediate_size=intermediate,
                                     mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1,
                                     mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
                                     position_embedding_type="rope", torch_dtype="float32")
        return GraniteMoeHybridForCausalLM(cfg)
    from transformers import LlamaConfig, LlamaForCausalLM

    if arch == "llama_sliding":  # vLLM's Llama reads ``layer_types``: window layers and full ones interleaved
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        return LlamaForCausalLM(LlamaConfig(**common, torch_dtype="float32", layer_types=kinds,
                                            sliding_window=SLIDING_WINDOW))
    return LlamaForCausalLM(LlamaConfig(**common, torch_dtype="float32"))


def build(out_dir: str, vocab_size: int = 512, hidden: int = 64, heads: int = 2, layers: int = 2,
          intermediate: int = 128, max_pos: int = 2048, seed: int = 0, arch: str = "llama") -> None:
    """Write config, random weights (safetensors) and tokenizer to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if arch not in ARCHS:
        raise SystemExit(f"--arch {arch!r} is not one of {', '.join(ARCHS)}")
    if hidden % heads:
        raise SystemExit(f"--hidden ({hidden}) must be divisible by --heads ({heads})")
    head = hidden // heads
    if arch.startswith("llama") and head not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
        print(f"warning: head size {head} may not be supported by vLLM's CPU attention backend "
              "(use 32, 64, 80, ...)", file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.model_max_length = max_pos
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    model = _model(arch, len(fast), hidden, heads, layers, intermediate, max_pos)
    with torch.no_grad():  # larger-than-default init so logits differ clearly between tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    if arch == "deepseek_v2":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    # A trivial chat template so /v1/chat/completions works too.
    tc_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(tc_path) as f:
        tc = json.load(f)
    tc["chat_template"] = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant: {% endif %}")
    with open(tc_path, "w") as f:
        json.dump(tc, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Create a tiny random-weight model (Llama, DeepSeek-V2 MLA, "
                                 "Granite-4.0-H hybrid or sliding-window Llama) + BPE tokenizer for vLLM tests.")
    ap.add_argument("out_dir", help="directory to write the model into (created if missing)")
    ap.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size (default 512)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    ap.add_argument("--heads", type=int, default=2, help="attention heads; head size = hidden/heads (default 2)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--arch", choices=ARCHS, default="llama",
                    help="model family: llama (default), deepseek_v2 (MLA latent KV, bf16), granite_hybrid "
                         "(Mamba2 + attention layers) or llama_sliding (sliding-window + full attention layers)")
    ap.add_argument("--seed", type=int, default=0, help="RNG seed for the tokenizer corpus and weights")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    build(a.out_dir, vocab_size=a.vocab_size, hidden=a.hidden, heads=a.heads, layers=a.layers, seed=a.seed,
          arch=a.arch)
    print(f"tiny model written to {a.out_dir} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
