"""A real rank's process, from the controller's side: what it is asked to do
(``options``), where its files live (``paths``), which Python runs it
(``interpreter``), its share of a torchrun job (``torchrun``), how it is
started and what it leaves (``start``), its process and the relay of its output (``children``)
and the report its run ends with (``report``).

Everything above — snapshots (``capture``), sessions (``controller``) and the
user-level workflows (``workflows``) — builds on these."""
