"""Watching a run: live status, the dashboard, metric loggers, the run directory and report.

    monitor.py   RunMonitor: the data behind /api/status, /metrics and the dashboard, read
                 through the orchestrator's and pools' status interfaces
    server.py    HttpServer (aiohttp base) and StatusServer (dashboard, /api/status, /metrics)
    web/         the dashboard page
    rundir.py    the run directory, metrics.jsonl, the terminal progress bar
    loggers.py   TensorBoard and Weights & Biases sinks of the step records
    report.py    report.html at the end of a run; plots.py draws its figures
    timeline.py  where a step's time went, from the activity log (rollout phase split, chart)
    procstat.py  CPU seconds per process and core of a process tree, sampled from /proc
"""
