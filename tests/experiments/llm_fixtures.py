"""A tiny random Llama checkpoint with a real (byte-level BPE) tokenizer and chat template, built offline.

Saved with ``save_pretrained`` into a folder, it is a "local path" model for :mod:`experiments.models`,
and small enough that the needle experiment runs end to end in seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SENTENCES = [
    "Startups grow by making something people want.",
    "The hardest part of writing an essay is deciding what to leave out!",
    "Why do founders underestimate how long things take?",
    "Most good ideas look bad at first, which is why they are still available.",
    "A city is a machine for meeting people.",
]


def haystack_text(n_sentences: int = 400) -> str:
    """Deterministic prose: the sentences above, cycled and numbered, wrapped like the essays."""
    parts = [f"{SENTENCES[i % len(SENTENCES)][:-1]} (note {i}){SENTENCES[i % len(SENTENCES)][-1]}" for i in range(n_sentences)]
    return "".join(p + ("\n" if i % 3 == 2 else " ") for i, p in enumerate(parts)).strip()


def build_tokenizer(training_text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([training_text], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_llama(folder: Path, seed: int = 0, head_dim: int = 16, num_layers: int = 2) -> Path:
    """Write a random Llama (``num_layers`` layers, 4 heads, 2 KV heads, ``head_dim``) and its tokenizer into
    ``folder``. Runs over every method config need ``num_layers >= 5``: vLLM's presets keep 2 layers per side in 16 bits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(haystack_text(50) + " The best thing to do in San Francisco is eat a sandwich.")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
