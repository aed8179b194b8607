"""Token scores in chunks of positions (learner/models.py's scored_head) equal the plain
full-logits computation, values and gradients, and never keep a whole batch's logits for the
backward."""

import pytest
import torch

from learner.models import chunk_positions, token_logprobs, token_scores

VOCAB = 301


@pytest.fixture(scope="module")
def llama():
    """A small random Llama with tied input and output embeddings (as SmolLM2 has)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # logits spread enough that rounding cannot flip an argmax
        model.lm_head.weight.mul_(8.0)
    return model


def _ids(batch=3, length=37, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _greedy_after_random(model, batch=3, random=12, length=37):
    """Rows of ``random`` random tokens then the model's greedy continuation: tokens that were and
    were not their distribution's most likely."""
    with torch.no_grad():
        return model.generate(_ids(batch, random), max_new_tokens=length - random, do_sample=False,
                              min_new_tokens=length - random, pad_token_id=0)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_scores_equal_the_full_logits(llama, chunk):
    ids = _greedy_after_random(llama)
    with torch.no_grad():
        plain = token_scores(llama, ids, 0.7, entropy=True, top=True, chunk=0)
        chunked = token_scores(llama, ids, 0.7, entropy=True, top=True, chunk=chunk)
    assert chunked.logp.shape == ids.shape and (chunked.logp[:, 0] == 0).all()
    torch.testing.assert_close(chunked.logp, plain.logp, rtol=0, atol=2e-5)
    torch.testing.assert_close(chunked.entropy, plain.entropy, rtol=0, atol=2e-5)
    assert torch.equal(chunked.top, plain.top) and chunked.top[:, 12:].all() and not chunked.top[:, :12].all()
    logits = llama(input_ids=ids).logits[:, :-1].float() / 0.7  # and both equal the definition
    naive = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(chunked.logp[:, 1:], naive, rtol=0, atol=2e-5)
    assert type(llama.lm_head).forward is llama.lm_head.forward.__func__  # the layer restored


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_gradients_equal_the_full_logits(llama, entropy_grad):
    ids, weights = _ids(seed=2), torch.randn(3, 37, generator=torch.Generator().manual_seed(3))

    def grads(chunk):
        llama.zero_grad()
        logp, ent = token_logprobs(llama, ids, 1.3, entropy=True, entropy_grad=entropy_grad, chunk=chunk)
        loss = (logp * weights).sum() - 0.1 * ent.sum()
        loss.backward()
        assert ent.requires_grad == entropy_grad
        return {n: p.grad.clone() for n, p in llama.named_parameters()}

    plain, chunked = grads(0), grads(5)
    assert plain.keys() == chunked.keys()
    for name in plain:
        scale = max(1.0, float(plain[name].abs().max()))  # float32 rounding grows with the values
        torch.testing.assert_close(chunked[name], plain[name], rtol=1e-4, atol=2e-6 * scale, msg=name)


def test_no_whole_batch_logits_are_kept_for_the_backward(llama):
    """What autograd saves: the plain path keeps (B, L - 1, V) float logits; the chunked path
    keeps at most ``chunk`` positions' worth of any vocabulary-wide tensor."""
    ids = _ids(batch=4, length=65)

    def widest_saved(chunk):
        saved = []

        def pack(t):
            saved.append(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, ent = token_logprobs(llama, ids, 1.0, entropy=True, entropy_grad=True, chunk=chunk)
        (logp.sum() + ent.sum()).backward()
        return max((s.numel() for s in saved if s and s[-1] == VOCAB and len(s) > 1), default=0)

    assert widest_saved(0) >= 4 * 64 * VOCAB
    assert widest_saved(16) <= 16 * VOCAB


def test_a_model_whose_logits_are_changed_after_the_layer_is_scored_whole():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          final_logit_softcapping=5.0)
    model = Gemma2ForCausalLM(config).eval()
    ids = _ids(batch=2, length=9)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
        scored = token_logprobs(model, ids, 1.0, chunk=4)[0]
    naive = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(scored[:, 1:], naive, rtol=0, atol=2e-5)


def test_chunks_hold_a_given_amount_of_logits():
    assert chunk_positions(49152, 256) == 1365  # SmolLM2's vocabulary: 192 KiB a position
    assert chunk_positions(1024, 1) == 256 and chunk_positions(10**9, 1) == 1
    assert chunk_positions(1024, 0) == 0  # never chunked
