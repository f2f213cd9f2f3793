"""What users do with runs: ``profiling`` (one slice per rank class, then the
graph) and the ``graph_cache`` that profiles a job once, scenarios
(``scenario_run`` runs and judges one, ``scenario_lint`` answers what lint
asks of this machine), incidents (``incident``, with torch's own analyzer in
``fr_analyzer``) and local calibration (``local_bench``)."""
