"""The first run reproduces: converting a catalog model (grpo/models/pretrained.py) happens only in the first run of a
name, after the run was seeded, and initialising the model it converts draws random numbers; the run then sampled
other completions than every later run of the same command and seed. A conversion now leaves python's, numpy's and
torch's random states as it found them."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

import grpo.models.pretrained as P
from tests.test_real_model import FAKE, NAME, fake_convert, fake_distribution


def states() -> tuple:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def drawing_convert(source: Path, out: Path) -> None:
    """A converter that draws from every generator, as building a model from its config does."""
    random.random(), np.random.rand(), torch.rand(3), torch.nn.Linear(4, 4)
    fake_convert(source, out)


def test_a_conversion_leaves_every_random_state_as_it_found_it(tmp_path, monkeypatch):
    monkeypatch.setitem(P.CATALOG, FAKE, fake_distribution(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    before = states()
    folder = P.resolve_model_name(FAKE, root=tmp_path / "cache", convert=drawing_convert)  # converts
    assert same(before, states())
    assert P.resolve_model_name(FAKE, root=tmp_path / "cache", convert=drawing_convert) == folder  # loads
    assert same(before, states())
    first = torch.rand(4)  # what a seeded run draws next: the same whether it converted or not
    torch.manual_seed(0)
    assert torch.equal(first, torch.rand(4))


def test_converting_smollm2_into_a_fresh_cache_draws_nothing(tmp_path):
    """The real conversion (SmolLM2-135M's GGUF, about 0.5 GB written): it did draw (from_config's initialisation)."""
    try:
        P.check_model_name(NAME)
    except P.ModelPackageMissing as e:
        pytest.skip(f"real-model tests skipped: {e}")
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    before = states()
    folder = Path(P.resolve_model_name(NAME, root=tmp_path / "cache"))
    assert P.verify_folder(folder, P.locate_source(NAME, P.CATALOG[NAME])[1]) is None
    assert same(before, states())
