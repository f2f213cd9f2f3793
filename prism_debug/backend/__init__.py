"""The torch.distributed adapter: the prism ProcessGroup, its Work, value policies, install."""
