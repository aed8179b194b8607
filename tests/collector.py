"""The learner's side of the trajectory stream for actor tests and benchmarks: a thread that
polls a real ``TrajectoryReceiver``, keeps each trajectory and releases it (returns credit)."""

import threading
import time

from transport.stream import TrajectoryReceiver


class Collector:
    """Receives on an ephemeral loopback port (``address``) until ``close``."""

    def __init__(self, window_bytes: int = 1 << 20) -> None:
        self.receiver = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=window_bytes)
        self.address = self.receiver.address
        self.items: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for actor, traj, nbytes in self.receiver.poll(0.05):
                    self.items.append(traj)
                    self.receiver.release(actor, nbytes)
        finally:
            self.receiver.close()

    def wait_for(self, n: int, timeout_s: float = 60.0) -> list:
        deadline = time.monotonic() + timeout_s
        while len(self.items) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.items)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
