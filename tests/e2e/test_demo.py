"""``toolrail demo`` (what ``make demo`` runs) as a newcomer sees it: three jobs that succeed, a quiet console, and
what to try next (issue 27).

From a fresh shell: no ``TOOLRAIL_*`` variable (the demo registers its own tool), no ``REDIS_URL`` (its own
Redis). Its stderr holds no third-party warning (Celery's root ``SecurityWarning``, transformers' ``FutureWarning``
or weight-loading progress bar); it ends with the README's next commands. The whole demo is ``slow`` (40 s on a
quiet 2-core machine, 70 s on a busy one: SmolLM2 decides on CPU); the default suite keeps the quiet console of
its worker on test_end_to_end's stack: a deciding worker started as the demo starts it, its model loaded, its output
free of warnings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from executor.job_client import NEXT_STEPS

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
#: What third-party noise looks like on a console: a warning's category or its source line, a progress bar.
NOISE = re.compile(r"Warning\b|warnings\.warn|Loading weights|it/s\]")


@pytest.mark.slow
def test_demo_succeeds_quietly_and_says_what_next(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLRAIL_") and k not in {"REDIS_URL", "PYTHONPATH"}}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    out = subprocess.run(["toolrail", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
                         check=False)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.stdout.count("status: succeeded") == 3, out.stdout
    noise = [line for line in out.stderr.splitlines() if NOISE.search(line)]
    assert not noise, "\n".join(noise)
    assert out.stdout.rstrip().endswith("\n".join(NEXT_STEPS)), out.stdout[-1500:]
    readme = (ROOT / "README.md").read_text()
    for line in NEXT_STEPS[1:]:  # each next step is a command the README prints
        command = line.split("  #")[0].strip()
        assert command in readme, command
