"""desync_at.py's model, in a module of the user's own: a snapshot keeps its
source too, and a reload diffs it."""

import torch

WIDTH = 16


def make_model():
    return torch.nn.Linear(WIDTH, WIDTH)
