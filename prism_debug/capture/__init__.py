"""Snapshots of a live rank, from the controller's side: taking them with
CRIU at an iteration boundary and restoring them as a child (``snapshots``),
recording them off the controller's loop (``recorder``), and the
``run --history K`` ring that ``back`` and ``reverse-continue`` step through
(``history`` decides, ``ring`` does it on disk).

The store, the manifest and the image format are ``prism_debug.snapshot``'s."""
