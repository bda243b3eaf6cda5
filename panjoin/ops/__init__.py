"""Operating a running cluster: Prometheus metrics (:mod:`panjoin.ops.metrics`), fed
by the durations the engine keeps (:mod:`panjoin.ops.timings`), and the manager's live
status page (:mod:`panjoin.ops.page`, its HTML and uPlot under ``static/``). The
engine, the workers and the pipeline only report to them; none of them serves HTTP
itself. The terminal view is ``panjoin status`` (:mod:`panjoin.cli.status`)."""
