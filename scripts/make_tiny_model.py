#!/usr/bin/env python3
"""Build a tiny Llama model with random weights and a locally trained byte-level BPE tokenizer.

Why: no model can be downloaded on the test machines, yet the vLLM end-to-end tests need a real
model directory that vLLM loads like any Hugging Face checkpoint. The weights are random (fixed
seed), so the text is gibberish, but greedy decoding is deterministic -- which is all the tests
need to prove the KV handed from prefill to decode is what decode uses.

Shape: hidden 64, 2 attention heads (head size 32, which vLLM's CPU attention backend
supports), 2 layers, vocab ~512. Runs in seconds. Needs ``transformers`` and ``tokenizers``
(both come with vLLM; run it with the vLLM venv's python).

    python scripts/make_tiny_model.py /tmp/tiny-llama
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


def build(out_dir: str, vocab_size: int = 512, hidden: int = 64, heads: int = 2, layers: int = 2,
          intermediate: int = 128, max_pos: int = 2048, seed: int = 0) -> None:
    """Write config, random weights (safetensors) and tokenizer to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if hidden % heads:
        raise SystemExit(f"--hidden ({hidden}) must be divisible by --heads ({heads})")
    head = hidden // heads
    if head not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
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
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_pos, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                      tie_word_embeddings=False, torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger-than-default init so logits differ clearly between tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
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
    ap = argparse.ArgumentParser(description="Create a tiny random-weight Llama + BPE tokenizer for vLLM tests.")
    ap.add_argument("out_dir", help="directory to write the model into (created if missing)")
    ap.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary size (default 512)")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    ap.add_argument("--heads", type=int, default=2, help="attention heads; head size = hidden/heads (default 2)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="RNG seed for the tokenizer corpus and weights")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    build(a.out_dir, vocab_size=a.vocab_size, hidden=a.hidden, heads=a.heads, layers=a.layers, seed=a.seed)
    print(f"tiny model written to {a.out_dir} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
