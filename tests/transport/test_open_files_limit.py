"""A process that keeps a Peer per instance raises its open-files limit to the hard one."""

import subprocess
import sys

PROBE = """
import resource
from dsi.transport.sockets import peers_context
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
ctx = peers_context()
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
ctx.term()
"""


def test_a_peers_context_raises_the_soft_limit_to_the_hard_one():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    soft, hard = (int(v) for v in done.stdout.split())
    assert soft == (hard if hard != -1 else 256)  # RLIM_INFINITY (-1): left as it was
