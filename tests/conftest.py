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


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU available")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ck_cache")
