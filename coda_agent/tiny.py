"""Tiny, randomly initialised Qwen2.5-VL checkpoints for tests and CPU smoke runs.

Built from the real `transformers` classes (Qwen2_5_VLConfig / Qwen2_5_VLForConditionalGeneration, the real
Qwen2-VL image processor) with a small byte-level BPE tokenizer trained here, which
carries the special tokens and chat template that Qwen2.5-VL uses. Nothing is downloaded. The weights are
random, so the text is gibberish: what this exercises is every code path between a screenshot and an action.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2.5-VL's chat template (images and text parts; a default system turn when there is none).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus() -> list[str]:
    from . import prompts

    base = [
        prompts.PLANNER_SYSTEM,
        prompts.PLANNER_ONLY_SYSTEM,
        prompts.UITARS_COMPUTER_USE,
        "Thought: Click the Console tab. Action: click(start_box='(235,512)') left_double right_single "
        "drag hotkey(key='ctrl c') type(content='x:=2+3\\n') scroll wait() finished DONE FAIL ANS WAIT",
        "pyautogui.click(640, 400) pyautogui.write('sin(x)') pyautogui.press('enter') 0123456789 ()[]{},.:;'\"",
        "KAlgebra Console Dictionary Variables Calculator 2D Graph 3D Graph plot function derivative",
    ]
    return base * 4


def build_tiny_qwen2_5_vl(
    out_dir: str | Path,
    vocab_size: int = 800,
    text_layers: int = 2,
    hidden: int = 64,
    vision_depth: int = 2,
    max_pixels: int = 64 * 28 * 28,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen2.5-VL checkpoint (config, safetensors, tokenizer, processor) to `out_dir`.
    `max_pixels` bounds the image size the processor resizes to (64*28*28: a 1280x800 screen -> 252x392)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _corpus(),
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, model_max_length=32768
    )
    tok.chat_template = CHAT_TEMPLATE
    image_proc = Qwen2VLImageProcessorPil(size={"shortest_edge": 4 * 28 * 28, "longest_edge": max_pixels})

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    heads = 4
    head_dim = hidden // heads
    half = head_dim // 2
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=text_layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": mrope},
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=hidden,
            fullatt_block_indexes=[vision_depth - 1],
            window_size=112,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    image_proc.save_pretrained(out)
    return out
