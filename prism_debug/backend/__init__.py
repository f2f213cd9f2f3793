"""The torch.distributed adapter: the prism ProcessGroup, its Work, value policies, install.

Its iteration tracker (``tracker.py``) is pure and in the core's import test:
this file imports nothing, so importing the tracker brings in no torch.
"""
