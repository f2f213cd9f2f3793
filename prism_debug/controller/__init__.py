"""The controller: starts the real ranks (or restores them from a snapshot or
a cut), follows them to their end and owns their debugging session —
``launch`` (``run``, what the public API calls), ``restore`` (a new run from
a snapshot or a cut), ``ranks`` (several real ranks under one controller),
``follow`` (the one loop that follows the ranks, one or several),
``replace`` (a console's restore), ``session`` (the one session type, for
one rank or several) with what a snapshot is in it — ``rank_verbs`` (one
rank's) or ``cut_verbs`` (a cut of several) — and ``no_session`` (a run
without a bus)."""
