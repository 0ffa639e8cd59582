"""The memory tool counts what it knows and refuses what it does not (issue 62, part 5): every expert of a mixture,
weights saved quantized, prompts beyond the model's positions, a card below any real one; the project's packaged
SmolLM2 and its presets offline; a --help that wraps to the terminal and examples (its own and docs/MEMORY.md's) that
run. The configs are config.json files written here; parameter counts and bytes are worked out by hand from them."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from grpo.run.assembly.gpu_memory_check import check_gpu_memory

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
           "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768}
# per layer: q 4096·4096 + k 4096·1024 + v 4096·1024 + o 4096·4096 = 41,943,040; 8 experts · 3 · 4096 · 14336 =
# 1,409,286,144; norms 2 · 4096. 32 layers; embeddings + untied head 2 · 32000 · 4096; final norm 4096.
MIXTRAL_PARAMS = 32 * (41_943_040 + 1_409_286_144 + 8_192) + 262_144_000 + 4_096
# a dense model of the same config (one MLP of intermediate_size), as the tool counted it before
MIXTRAL_AS_DENSE = 32 * (41_943_040 + 176_160_768 + 8_192) + 262_144_000 + 4_096
LLAMA8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
           "max_position_embeddings": 8192}
# decoder linears: 32 · (41,943,040 + 3 · 4096 · 14336) = 32 · 218,103,808; other: norms 32 · 8192 + 4096, embeddings
# and head 2 · 128256 · 4096
LLAMA8B_LINEAR = 32 * 218_103_808
LLAMA8B_OTHER = 32 * 8_192 + 4_096 + 2 * 128_256 * 4_096
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "max_position_embeddings": 8192}
# per layer: q 576·576 + k 576·192 + v 576·192 + o 576·576 = 884,736; MLP 3 · 576 · 1536 = 2,654,208; norms 1,152.
# 30 layers; tied embeddings 49152 · 576; final norm 576 (SmolLM2-135M's published 134,515,008)
SMOLLM2_PARAMS = 30 * (884_736 + 2_654_208 + 1_152) + 49_152 * 576 + 576


def model_dir(tmp_path: Path, config: dict, name: str = "model") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def tool(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = check_gpu_memory(list(argv))
        except SystemExit as e:  # argparse's refusals and --help
            code = e.code
    return code, out.getvalue() + err.getvalue()


def gib(text: str, row: str) -> float:
    return float(re.search(rf"^\s*{re.escape(row)}\s+([\d.]+)$", text, re.M).group(1))


def base_params(text: str) -> int:
    return int(re.search(r"params: base ([\d,]+)", text).group(1).replace(",", ""))


def test_a_mixture_of_experts_counts_every_experts_weights(tmp_path):
    code, text = tool("--estimate", "--set", f"model.name={model_dir(tmp_path, MIXTRAL)}", "--set", "model.lora=true",
                      "--gpu-mem", "160")
    assert code == 0, text
    assert base_params(text) == MIXTRAL_PARAMS != MIXTRAL_AS_DENSE, text
    assert gib(text, "base weights") == pytest.approx(MIXTRAL_PARAMS * 2 / GIB, abs=0.01)  # bf16: about 87 GiB


def test_gptq_weights_are_counted_at_their_bits_and_an_unknown_quantization_is_refused(tmp_path):
    gptq = {**LLAMA8B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    code, text = tool("--estimate", "--set", f"model.name={model_dir(tmp_path, gptq)}", "--set", "model.lora=true",
                      "--gpu-mem", "80")
    assert code == 0, text
    # 4 bits a weight, and per group of 128 a 16-bit scale and a 4-bit zero point; the rest in bf16
    weights = LLAMA8B_LINEAR * (4 / 8 + (2 + 4 / 8) / 128) + LLAMA8B_OTHER * 2
    assert gib(text, "base weights") == pytest.approx(weights / GIB, abs=0.01), text
    for i, q in enumerate([{"quant_method": "hqq", "nbits": 4}, {"quant_method": "gptq"}]):
        folder = model_dir(tmp_path, {**LLAMA8B, "quantization_config": q}, f"q{i}")
        code, text = tool("--estimate", "--set", f"model.name={folder}", "--set", "model.lora=true")
        assert code == 2 and "quantization_config" in text and "refused" in text and "FITS" not in text, text
        assert f"quant_method={q['quant_method']!r}" in text, text


def test_the_packaged_smollm2_its_presets_and_its_config_are_known_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    counted = []
    for argv in (["--set", f"model.name={model_dir(tmp_path, SMOLLM2)}"], ["--set", "model.name=smollm2-135m-instruct"],
                 ["--preset", "smollm2-demo"], ["--preset", "smollm2-dual"]):
        code, text = tool("--estimate", *argv)
        assert code == 0 and "FITS" in text, text
        counted.append(base_params(text))
    assert counted == [SMOLLM2_PARAMS] * 4


def test_a_prompt_beyond_the_models_positions_and_a_card_below_any_real_one_are_refused(tmp_path):
    folder = model_dir(tmp_path, SMOLLM2)
    code, text = tool("--estimate", "--set", f"model.name={folder}", "--data.max_prompt_tokens", "100000000")
    assert code == 2 and "FITS" not in text, text
    assert "data.max_prompt_tokens=100000000" in text and "max_position_embeddings=8192" in text, text
    for small in ("1e-9", "0.5"):
        code, text = tool("--estimate", "--gpu-mem", small)
        assert code == 2 and "--gpu-mem" in text and "FITS" not in text, text


def test_the_help_wraps_to_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, text = tool("--help")
    assert code == 0
    assert max(len(line) for line in text.splitlines()) <= 80, text


def examples(text: str) -> list[list[str]]:
    """The tool's command lines in `text` (its --help or a doc), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in text.splitlines():
        if not line.strip().startswith(("grpo-check-gpu-memory", "python check_gpu_memory.py")):
            continue
        words = shlex.split(line.split("#", 1)[0])
        if words[:1] == ["grpo-check-gpu-memory"]:
            found.append(words[1:])
        elif words[:2] == ["python", "check_gpu_memory.py"]:
            found.append(words[2:])
    return found


def test_every_example_in_the_help_and_the_memory_doc_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples' relative paths are a checkout's
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, help_text = tool("--help")
    doc = (ROOT / "docs" / "MEMORY.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    ran = examples(help_text) + examples(doc)
    assert len(ran) >= 10 and any("--model_name_or_path" in argv for argv in ran)
    for argv in ran:
        code, text = tool(*argv)
        assert code == 0, (argv, text)
