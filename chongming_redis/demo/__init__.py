"""``chongming-redis demo``: the narrated multi-process demo.

``run.py`` drives it (a private Redis, worker processes, 300 tasks, stop / pause / resume from
outside, a SIGKILLed worker whose tasks end LOST and are retried); ``app.py`` is the task app
the demo's workers run; ``store.py`` opens (and afterwards removes) the store it runs on.
"""
