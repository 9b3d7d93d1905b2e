"""Copies between CUDA parameters and page-locked host memory that never stop
the CPU.

A gradient is copied on a side stream, after the work that made it, and an
event marks its bytes' arrival: the optimizer hands it to the client only
then, while the backward's kernels keep being queued. (A synchronize per
parameter made the GPU idle once per parameter: 63 ms of a GPT-2 small
backward that computes in 27 ms, bench/anchors/README.md, "On a GPU".)
Weights go up on the compute stream, so the next forward reads them in
order, and the page-locked buffers they came from are written again only
once those copies are done.
"""

import collections

import torch


class GradientDownloads:
    """CUDA gradients on their way into page-locked buffers, in the order
    they were staged (events on one stream complete in that order)."""

    def __init__(self):
        self._streams = {}  # device -> the side stream its copies run on
        self._pending = collections.deque()  # (index, buffer, event, source)

    def stage(self, index, grad, buffer):
        """Queues the copy of `grad` (a CUDA tensor of buffer's dtype and
        shape) into page-locked `buffer`; `grad` is kept until it is done."""
        stream = self._streams.get(grad.device)
        if stream is None:
            stream = self._streams[grad.device] = torch.cuda.Stream(device=grad.device)
        stream.wait_stream(torch.cuda.current_stream(grad.device))
        with torch.cuda.stream(stream):
            buffer.copy_(grad, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        self._pending.append((index, buffer, done, grad))

    def arrived(self, wait=False):
        """Yields (index, buffer) of each staged gradient whose bytes are in
        its buffer, oldest first: those there now, or with `wait` all."""
        while self._pending:
            index, buffer, done, _ = self._pending[0]
            if wait:
                done.synchronize()
            elif not done.query():
                return
            self._pending.popleft()
            yield index, buffer

    def settle(self):
        """Waits for every queued copy (they read the gradients: the caller
        is about to change them), keeping them staged."""
        for stream in self._streams.values():
            stream.synchronize()

    def discard(self):
        """Drops what is staged, once no copy still writes a buffer."""
        self.settle()
        self._pending.clear()


class WeightUploads:
    """Remembers the upload of a step's weights, so the page-locked buffers
    they came from are not written before the GPU has read them."""

    def __init__(self):
        self._done = []

    def uploaded(self, devices):
        """The weights were queued on each device's current stream."""
        self._done = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._done.append(event)

    def wait(self):
        for event in self._done:
            event.synchronize()
        self._done = []
