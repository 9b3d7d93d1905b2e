"""What zo.torch answers for DeepSpeed's names it does not have: NotInZo,
with why and what to do instead, for the engine's calls and for the
submodules and calls of zo.torch imported as deepspeed."""


class NotInZo(NotImplementedError, AttributeError):
    """A DeepSpeed name zo does not have, and why (an AttributeError too, so
    hasattr() and getattr(..., default) still answer)."""

    __module__ = "zo.torch"  # its public name: tracebacks and pickles say zo.torch.NotInZo


# DeepSpeed's engine calls that have no meaning here, and what to do instead.
_ENGINE_NAMES_ZO_LACKS = {
    "no_sync": "zo's engine never all-reduces gradients between ranks (the servers sum every "
               "rank's gradients at each accumulation boundary), so there is nothing to "
               "suspend: drop the no_sync() context",
    "set_gradient_accumulation_boundary": "zo's engine counts micro-batches itself "
                                          "(gradient_accumulation_steps in the config)",
    "module_state_dict": "use engine.module.state_dict(); the optimizer state is on the servers",
}


# DeepSpeed's submodules and calls that zo.torch, imported as deepspeed, does
# not have.
_DEEPSPEED_NAMES_ZO_LACKS = {
    "zero": "deepspeed.zero (zero.Init, GatheredParameters, ZeRO-3 partitioning) is not in zo: "
            "zo keeps the whole model's 16-bit weights on each worker and the optimizer state "
            "on the servers; build the model normally",
    "comm": "deepspeed.comm is not in zo: zo's workers need no collectives; use "
            "torch.distributed for your own",
    "pipe": "deepspeed.pipe is not in zo.torch: pipeline stages are zo-train's "
            "(--pipeline-stages)",
    "moe": "deepspeed.moe is not in zo",
    "ops": "deepspeed.ops (its fused kernels and CPU Adam) is not in zo: the servers run the "
           "optimizer from the config",
    "checkpointing": "deepspeed.checkpointing is not in zo: use torch.utils.checkpoint",
    "init_inference": "deepspeed.init_inference is not in zo: zo trains",
}
