"""zo.dpu.compensation "worker" in zo.torch: with DPU, step s computes on
version s - 2 moved by step s - 1's update, which the worker can form
because it still holds step s - 1's gradient (docs/architecture.md,
"Compensation"):

    W = a * last + b * before - c * grad

last and before are the last two versions pulled, grad the gradient the
loop pushed for step s - 1 (still in each .grad when step() pulls), and
(a, b, c) per tensor come from the servers (the step's decision, the
moments' size). A skipped step s - 1 gives a = 1, b = c = 0; b = 0 where
the version before is not held (the first delayed step, after a restore).
"""

import torch


class DelayedStepCompensation:
    """The last two versions pulled, as pulled, on each parameter's device
    in the job's dtype (two more copies of the model), and the weights each
    step computes on, written into the parameters."""

    def __init__(self, params, dtype):
        self._last = [torch.empty(p.shape, dtype=dtype, device=p.device) for p in params]
        self._before = [torch.empty_like(t) for t in self._last]
        self._last_version = -1
        self._before_version = -1

    def forget(self):
        """A restore, a roll-back or a move: the versions kept may not be the
        job's any more; the next pull brings one whole."""
        self._last_version = self._before_version = -1

    def apply(self, client, step, pulled, changed, params, grads_of_step_before):
        """After client.pull_for_step(step) wrote `pulled` (host buffers in
        the job's dtype, one per parameter; `changed` as it said): keeps the
        version and writes the weights `step` computes on into `params`.
        `grads_of_step_before`: each .grad holds what was pushed for step - 1
        (step() pulls right after pushing); otherwise (a restore, the first
        load) the gradient part is left out."""
        version = client.last_pulled_version
        with torch.no_grad():
            if changed or self._last_version < 0:
                self._last, self._before = self._before, self._last
                self._before_version = self._last_version if changed else -1
                for kept, src in zip(self._last, pulled):
                    kept.copy_(src, non_blocking=True)
            self._last_version = version
            if not (step >= 2 and version == step - 2):  # not delayed: the version itself
                for p, kept in zip(params, self._last):
                    p.copy_(kept)
                return
            have_before = self._before_version == version - 1
            terms = client.step_compensation(step - 1, have_before)
            for i, (p, (a, b, c)) in enumerate(zip(params, terms)):
                w = self._last[i].float() * a  # not in place: .float() of fp32 is itself
                if b != 0:
                    w.add_(self._before[i].float(), alpha=b)
                # A zero coefficient leaves its term out: a skipped step's
                # gradient may be inf.
                if c != 0 and grads_of_step_before and p.grad is not None:
                    w.add_(p.grad.float(), alpha=-c)
                p.copy_(w)
