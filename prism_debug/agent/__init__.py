"""The agent inside the real rank's process: configuration, iteration tracking, events."""
