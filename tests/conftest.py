import os
import sys

import torch

# tests import the flat modules of the project root
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(2)

import pytest


@pytest.fixture(scope="session")
def base():
    """The warm-started tiny base model (built once into .cache, about a minute on 2 cores, then read from disk)."""
    import tiny
    model, tok, _ = tiny.load_or_build()
    return model, tok
