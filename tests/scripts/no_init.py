"""Forgets to call init_process_group."""

import torch

print("training alone", torch.ones(1).sum().item(), flush=True)
