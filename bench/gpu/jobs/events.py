"""Side channel from a job to the driver (bench/gpu/run_jobs.sh): one line per event in
$JOB_EVENTS (a file outside the log), so the driver knows when a moment is live without
anything showing in the job's own output."""

from __future__ import annotations

import os
import time


def event(name: str, **kv) -> None:
    path = os.environ.get("JOB_EVENTS")
    if not path:
        return
    extra = " ".join(f"{k}={v}" for k, v in kv.items())
    with open(path, "a") as f:
        f.write(f"{time.time():.3f} {name} {extra}".rstrip() + "\n")
