"""A stand-in for a CPU-only torch build (tests of the agent's no-GPU path)."""

__version__ = "2.99.0+cpu"


class version:  # noqa: N801 (mirrors torch.version)
    cuda = None


class cuda:  # noqa: N801 (mirrors torch.cuda)
    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 0
