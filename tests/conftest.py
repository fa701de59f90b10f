import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers
def pytest_collection_modifyitems(config, items):
    from tests.budget import load_costs, over_budget

    for item in over_budget(items, load_costs()):  # each family's compile budget (tests/budget.py)
        item.add_marker(pytest.mark.sweep)
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU available")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ck_cache")


@pytest.fixture(autouse=True)
def _seeded_cpu_generator(request):
    """Each test draws its CPU random data from a seed of its own id: random inputs, the same on every run, so a
    test that fails for some draws fails every time (or never) instead of one CI run in a hundred. The CUDA
    generators stay unseeded (the GPU tests' fresh inputs)."""
    import zlib

    import torch

    torch.random.default_generator.manual_seed(zlib.crc32(request.node.nodeid.encode()))
