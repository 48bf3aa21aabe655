"""An app whose one task writes the modules its worker process has loaded:
``tests.support.modules_app:app`` (``tests/test_cli_lazy.py``). ``loaded`` takes ``{"path":
...}`` and writes ``sorted(sys.modules)`` there as JSON (to a temporary name first, then renamed:
a reader never sees half a list)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("modules-test")


@app.task()
def loaded(ctx: TaskContext, params: Any) -> None:
    path = params["path"]
    with open(f"{path}.tmp", "w") as out:
        json.dump(sorted(sys.modules), out)
    os.replace(f"{path}.tmp", path)
