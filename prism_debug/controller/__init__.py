"""The controller: starts the real ranks (or restores them from a snapshot or
a cut), follows them to their end and owns their debugging session —
``launch`` (``run``, what the public API calls), ``restore`` (a new run from
a snapshot or a cut), ``ranks`` (several real ranks under one controller),
``follow`` (the one loop that follows the ranks, one or several),
``replace`` (a console's restore), ``session`` and ``ranks_session`` (the bus
and the verbs only the controller answers), ``no_session`` (a run without a
bus)."""
