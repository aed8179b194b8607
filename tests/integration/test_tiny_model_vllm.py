"""vLLM (in-process engine) serves the tiny models from their paths and agrees with transformers:
greedy tokens equal, sampled-token logprobs (`processed_logprobs`) equal log-softmax(logits / T)."""

import gc
import os

import numpy as np
import pytest

from launch.model.tiny_model import build_tiny_model

N_NEW = 16
LOGPROB_TOL = 1e-4


def _start_llm(model_dir, **kwargs):
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=1024,
        max_num_seqs=4,
        logprobs_mode="processed_logprobs",
        **kwargs,
    )


def _stop_llm(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    cleanup_dist_env_and_memory()


@pytest.fixture(scope="module")
def engine_env():
    # In-process engine: ~1-2 s start-up instead of ~10 s for a separate engine process.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for name in ("HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS"):
            mp.setenv(name, os.environ.get(name, "1"))
        yield


@pytest.fixture(scope="class")
def text_model(tmp_path_factory, engine_env):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("text"), seed=0)
    llm = _start_llm(model_dir)
    try:
        yield model_dir, llm
    finally:
        _stop_llm(llm)
        del llm
        gc.collect()


@pytest.fixture(scope="class")
def vl_model(tmp_path_factory, engine_env):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0)
    llm = _start_llm(model_dir, limit_mm_per_prompt={"image": 1, "video": 0})
    try:
        yield model_dir, llm
    finally:
        _stop_llm(llm)
        del llm
        gc.collect()


def _prompts(tokenizer) -> list[str]:
    conversations = [
        [{"role": "user", "content": "P _ # O\nWhere is the box? Answer Up, Down, Left or Right."}],
        [{"role": "system", "content": "Think in <think></think>."}, {"role": "user", "content": "Go."}],
    ]
    return [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in conversations]


def _hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def _hf_token_logprobs(model, prompt_ids: list[int], gen: list[int], temperature: float) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + gen])).logits[0, len(prompt_ids) - 1 : -1]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs[torch.arange(len(gen)), torch.tensor(gen)].numpy()


def _sampled_logprobs(completion) -> np.ndarray:
    return np.array([lp[tok].logprob for tok, lp in zip(completion.token_ids, completion.logprobs)])


def _greedy(n: int):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=0)


class TestTextModel:
    """One engine for the class: torn down before the VL engine starts."""

    def test_vllm_chat_template_matches_transformers(self, text_model):
        from transformers import AutoTokenizer

        model_dir, llm = text_model
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "<think>hi</think>"}]
        out = llm.chat(messages, _greedy(2), use_tqdm=False)[0]
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        assert out.prompt_token_ids == expected

    def test_vllm_greedy_and_logprobs_match_transformers(self, text_model):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from vllm import SamplingParams

        model_dir, llm = text_model
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in _prompts(tokenizer)]
        requests = [{"prompt_token_ids": p} for p in prompts]

        for prompt, out in zip(prompts, llm.generate(requests, _greedy(N_NEW), use_tqdm=False)):
            completion = out.outputs[0]
            assert list(completion.token_ids) == _hf_greedy(hf, prompt, N_NEW)
            expected = _hf_token_logprobs(hf, prompt, list(completion.token_ids), temperature=1.0)
            np.testing.assert_allclose(_sampled_logprobs(completion), expected, atol=LOGPROB_TOL)

        # Sampling at T != 1: processed logprobs are those of the distribution actually sampled from.
        sampling = SamplingParams(temperature=0.7, max_tokens=N_NEW, ignore_eos=True, logprobs=0, seed=0)
        for prompt, out in zip(prompts, llm.generate(requests, sampling, use_tqdm=False)):
            completion = out.outputs[0]
            expected = _hf_token_logprobs(hf, prompt, list(completion.token_ids), temperature=0.7)
            np.testing.assert_allclose(_sampled_logprobs(completion), expected, atol=LOGPROB_TOL)


    def test_reasoning_tags_survive_vllm_detokenisation(self, text_model):
        from vllm import SamplingParams

        from launch.model.tiny_tokenizer import REASONING_TAGS

        model_dir, llm = text_model
        tokenizer = llm.get_tokenizer()
        tags = [tokenizer.convert_tokens_to_ids(t) for t in REASONING_TAGS]
        special = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|vision_start|>")]
        params = SamplingParams(
            temperature=1.0, max_tokens=24, ignore_eos=True, seed=0, allowed_token_ids=tags[:4] + special
        )
        completion = llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)[0].outputs[0]
        ids = list(completion.token_ids)
        assert set(ids) & set(tags) and set(ids) & set(special)  # both kinds were generated
        # vLLM's default skip_special_tokens=True drops the special tokens and keeps every tag.
        assert completion.text == "".join(tokenizer.convert_ids_to_tokens([i for i in ids if i in tags]))


class TestVisionModel:
    def test_vllm_generates_with_an_image_like_transformers(self, vl_model):
        from PIL import Image
        from transformers import AutoModelForImageTextToText, AutoProcessor
        from vllm import SamplingParams

        model_dir, llm = vl_model
        processor = AutoProcessor.from_pretrained(model_dir)
        hf = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
        image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 84, 3), dtype=np.uint8))
        content = [{"type": "image"}, {"type": "text", "text": "Where is the box?"}]
        messages = [{"role": "user", "content": content}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[prompt], images=[image], return_tensors="pt")

        # min_tokens / min_new_tokens: both mask EOS the same way, so lengths and tokens must agree.
        params = SamplingParams(temperature=0.0, max_tokens=N_NEW, min_tokens=N_NEW, logprobs=0)
        request = {"prompt": prompt, "multi_modal_data": {"image": image}}
        out = llm.generate(request, params, use_tqdm=False)[0]
        assert out.prompt_token_ids == inputs["input_ids"][0].tolist()  # 6 <|image_pad|> for 56x84
        hf_ids = hf.generate(**inputs, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False)
        assert list(out.outputs[0].token_ids) == hf_ids[0, inputs["input_ids"].shape[1]:].tolist()
