"""A joblib pool (loky) whose worker is killed while it sends its result: part of the message is in the result pipe,
the rest never comes, and loky's result thread waits for it forever (tests/test_worker_watch.py).

    python tests/data/wedged_pool.py <repo> <seconds the other job takes> watch|nowatch

With ``watch``, experiments.run.worker_watch watches the workers, as every launch of experiments.train does.
"""

import os
import signal
import sys
import threading
import time

sys.path.insert(0, sys.argv[1])
from joblib import Parallel, delayed


class CutOff:
    """A result that, as it is pickled for sending, stops the launcher, lets the send fill the pipe, then resumes
    the launcher and kills its own worker: part of the message is in the pipe, the rest never comes."""

    def __init__(self, n):
        self.n = n

    def __reduce__(self):
        parent = os.getppid()

        def cut():
            time.sleep(1.0)  # the send is blocked on the full pipe by now
            os.kill(parent, signal.SIGCONT)
            os.kill(os.getpid(), signal.SIGKILL)

        os.kill(parent, signal.SIGSTOP)
        threading.Thread(target=cut, daemon=True).start()
        return (bytes, (b"\x01" * self.n,))


def job(i):
    if i == 0:
        time.sleep(1.0)  # the other worker has its task by now
        return CutOff(32 * 1024 * 1024)
    time.sleep(float(sys.argv[2]))
    return i


if __name__ == "__main__":
    from experiments.run.worker_watch import watch_workers

    if sys.argv[3] == "watch":
        watch_workers()
    results = Parallel(n_jobs=2)(delayed(job)(i) for i in range(2))
    print([len(r) if isinstance(r, bytes) else r for r in results], flush=True)
