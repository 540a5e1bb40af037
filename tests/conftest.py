"""Test-wide: no test, nor any runbot it starts, writes the caches of the user running the tests."""

import os
import tempfile

# runbot keeps its validated settings under $XDG_CACHE_HOME/runbot (config/environment.py): the CLI tests start
# runbot as users do, and would otherwise leave that file in the real home.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="runbot-test-cache-")
