"""The controller: starts the real ranks (or restores them from a snapshot or
a cut), follows them to their end and owns their debugging session —
``launch`` (``run`` and ``restore``, what the public API calls), ``ranks``
(several real ranks under one controller), ``session`` and ``ranks_session``
(the bus and the verbs only the controller answers), ``no_session`` (a run
without a bus)."""
