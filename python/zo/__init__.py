"""zo: ZeRO-Offload as a service.

The optimizer state of a PyTorch model lives on zo's CPU/NVMe servers; the
training loop stays the user's. Start with ``zo.torch.OffloadOptimizer``.
"""

from zo._native import Client, EmbeddedServer  # noqa: F401
from zo._version import __version__  # noqa: F401

__all__ = ["Client", "EmbeddedServer", "__version__"]
