"""Make a tiny random-weight Llama (2 layers, hidden 64, one 64-wide attention head) with a
byte-level BPE tokenizer trained on local text, for a real vLLM to serve without any model hub.
Deterministic for the same text (fixed seed). Usage:
    python make-tiny-llama.py OUT_DIR TEXT_FILE...

The output is gibberish, but it is real tokens streamed by a real engine. Special tokens are kept
out of the output: the output embedding is untied and its rows for the special tokens are zero,
so their logit is 0 while some ordinary token's is far above it (greedy decoding of a random model
otherwise tends to repeat the prompt's last token, a special one, and stream empty content), and
the chat template adds no special token.
"""
import json
import os
import sys

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def main() -> int:
    out, texts = sys.argv[1], sys.argv[2:]
    if not texts:
        print("usage: make-tiny-llama.py OUT_DIR TEXT_FILE...", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)

    bpe = ByteLevelBPETokenizer()
    bpe.train(files=texts, vocab_size=2048, min_frequency=2, special_tokens=SPECIAL, show_progress=False)
    bpe.save(os.path.join(out, "tokenizer.json"))
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(out, "tokenizer.json"),
        unk_token="<unk>", bos_token="<s>", eos_token="</s>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    tok.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for t in SPECIAL:
            model.lm_head.weight[tok.convert_tokens_to_ids(t)].zero_()
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}, f)
    print(f"tiny llama in {out}: vocab {len(tok)}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
