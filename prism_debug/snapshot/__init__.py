"""Snapshots of the real rank: CRIU dumps, the store, restore."""
