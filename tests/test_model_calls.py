"""grpo/models/model_calls: the KV cache keyword and the returned cache across transformers versions (5.24 renamed
`past_key_values` to `cache` in forward's arguments and outputs; reading one name only, every model of the other
versions looks like it takes no cache and shared prompts turn themselves off)."""

from types import SimpleNamespace

import torch

from grpo.models.model_calls import cache_kwarg, returned_cache


class NewStyle(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return input_ids


class OldStyle(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return input_ids


class NoCache(torch.nn.Module):
    def forward(self, input_ids=None, **kwargs):
        return input_ids


class Peft(torch.nn.Module):
    """A PEFT-like wrapper: forward takes (*args, **kwargs), the base model is behind get_base_model()."""

    def __init__(self, base: torch.nn.Module):
        super().__init__()
        self.base = base

    def get_base_model(self) -> torch.nn.Module:
        return self.base

    def forward(self, *args, **kwargs):
        return self.base(*args, **kwargs)


class Ddp(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_the_cache_keyword_is_the_one_the_base_models_forward_names():
    assert cache_kwarg(NewStyle()) == "cache"
    assert cache_kwarg(OldStyle()) == "past_key_values"
    assert cache_kwarg(NoCache()) is None
    assert cache_kwarg(Ddp(Peft(NewStyle()))) == "cache"
    assert cache_kwarg(Ddp(Peft(OldStyle()))) == "past_key_values"
    assert cache_kwarg(Peft(NoCache())) is None


def test_the_returned_cache_is_read_under_either_name():
    new, old = object(), object()
    assert returned_cache(SimpleNamespace(cache=new, past_key_values=None)) is new
    assert returned_cache(SimpleNamespace(past_key_values=old)) is old


def test_a_transformers_model_names_a_cache_keyword_it_takes():
    """Whatever the installed transformers calls it, a Llama model takes a KV cache (so shared prompts apply)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.models.logprobs import shared_prompt_blocker

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert cache_kwarg(model) is not None
    assert shared_prompt_blocker(model, training=True) is None
