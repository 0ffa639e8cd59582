"""The one tokenisation path: templated prompts, padding, the TrainBatch layout and SFT examples."""

import pytest
import torch

from grpo.models.modeling import build_tiny_tokenizer
from grpo.models.tokens import collate, encode_prompt, left_pad, right_pad, sft_example, show_mask

CORPUS = ["the answer is yes", "the answer is no", "who was more likely to forget the keys?"] * 5


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(CORPUS, vocab_size=300)


def ids_of(tok, text):
    """Plain tokenisation of a string in which the special tokens are written out."""
    return tok(text, add_special_tokens=False)["input_ids"]


def test_encode_prompt_matches_hand_written_template(tok):
    messages = [{"role": "user", "content": "who forgot?"}]
    ids = encode_prompt(tok, messages)
    assert ids == ids_of(tok, "<|user|>who forgot?<|end|><|assistant|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")


def test_system_prompt_is_a_leading_system_turn_or_merged(tok):
    messages = [{"role": "user", "content": "hi"}]
    assert encode_prompt(tok, messages, "Be fair.") == ids_of(tok,
                                                              "<|system|>Be fair.<|end|><|user|>hi<|end|><|assistant|>")
    with_system = [{"role": "system", "content": "Old."}, {"role": "user", "content": "hi"}]
    assert encode_prompt(tok, with_system, "New.") == ids_of(
        tok, "<|system|>New.\n\nOld.<|end|><|user|>hi<|end|><|assistant|>")


def test_template_without_system_role_gets_system_text_in_first_user_turn(tok):
    no_system = build_tiny_tokenizer(CORPUS, vocab_size=300)
    no_system.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<|user|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    ids = encode_prompt(no_system, [{"role": "user", "content": "hi"}], "Be fair.")
    assert ids == ids_of(tok, "<|user|>Be fair.\n\nhi<|end|><|assistant|>")


def test_encode_prompt_accepts_the_v4_list_form():
    class ListTemplate:
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return [7, 8, 9]

    assert encode_prompt(ListTemplate(), [{"role": "user", "content": "a"}]) == [7, 8, 9]


def test_missing_chat_template_is_a_clear_error(tok):
    bare = build_tiny_tokenizer(CORPUS, vocab_size=300)
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        encode_prompt(bare, [{"role": "user", "content": "a"}])


def test_sft_example_uses_the_rollout_prompt_and_ends_with_eos(tok):
    messages = [{"role": "user", "content": "who forgot?"}]
    prompt_ids, completion_ids = sft_example(tok, messages, "the answer is no", system_prompt="S")
    assert prompt_ids == encode_prompt(tok, messages, "S")
    assert completion_ids == ids_of(tok, "the answer is no") + [tok.convert_tokens_to_ids("<|end|>")]
    assert completion_ids[-1] == tok.eos_token_id


def test_left_and_right_pad_by_hand():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = right_pad([[1, 2, 3], [4]], pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_collate_layout_by_hand():
    input_ids, attention, completion_mask, p = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0)
    assert p == 3
    assert input_ids.tolist() == [[5, 6, 7, 9, 10, 0], [0, 0, 8, 11, 12, 13]]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert completion_mask.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert completion_mask.dtype == torch.float32


def test_collate_masked_tokens_are_exactly_the_sampled_ids(tok):
    prompts = [encode_prompt(tok, [{"role": "user", "content": c}]) for c in ["a", "a much longer question here"]]
    completions = [[40, 41, tok.eos_token_id], [42]]
    input_ids, attention, completion_mask, p = collate(prompts, completions, tok.pad_token_id)
    assert p == max(len(x) for x in prompts)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        picked = input_ids[row, p:][completion_mask[row].bool()].tolist()
        assert picked == completion
        assert input_ids[row, p - len(prompt):p].tolist() == prompt  # prompt right-aligned against column P
        assert attention[row].sum().item() == len(prompt) + len(completion)


def test_collate_rejects_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="prompts but"):
        collate([[1]], [[2], [3]], 0)
    with pytest.raises(ValueError, match="prompt is empty"):
        collate([[]], [[2]], 0)


def test_show_mask_brackets_the_trained_tokens(tok):
    prompt = ids_of(tok, "<|user|>hi<|end|><|assistant|>")
    completion = ids_of(tok, "no") + [tok.eos_token_id]
    input_ids, _, completion_mask, _ = collate([prompt], [completion], tok.pad_token_id)
    shown = show_mask(tok, input_ids[0], completion_mask[0])
    trained = "".join(f"[{tok.decode([i])}]" for i in completion)
    assert shown == "<|user|>hi<|end|><|assistant|>" + trained
    assert shown.endswith("[<|end|>]")
    assert "\x1b[32m" in show_mask(tok, input_ids[0], completion_mask[0], color=True)
