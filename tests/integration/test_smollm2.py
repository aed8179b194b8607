"""SmolLM2-135M-Instruct through model=smollm2_135m with no model hub: the package's GGUF file,
converted once into the model cache (the install does it; the first use otherwise), is the real
chat model: its architecture, its ChatML template, and a coherent greedy answer."""

import os

import pytest
import torch

from launch.config.compose import compose
from launch.model import packaged
from launch.model.hub import hub_access


@pytest.fixture(scope="module")
def smollm2():
    return packaged.obtain(compose(["model=smollm2_135m"]).model.package)


def test_the_preset_goes_on_from_the_converted_package_without_a_hub(smollm2, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = hub_access(compose(["model=smollm2_135m"]))
    assert cfg.model.path == str(smollm2) and os.environ["HF_HUB_OFFLINE"] == "1"
    record = packaged.check(smollm2, cfg.model.package)
    assert record["quantisation"].startswith("MOSTLY_Q4_1") and record["parameters"] == 134_515_008


def test_the_converted_model_is_the_chat_model(smollm2):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(smollm2)
    assert (config.model_type, config.vocab_size, config.num_hidden_layers, config.hidden_size,
            config.num_key_value_heads, config.tie_word_embeddings) == ("llama", 49152, 30, 576, 3, True)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
