"""A stand-in for a CUDA build of torch on a machine without the NVIDIA driver."""

__version__ = "2.99.0+cu130"


class version:  # noqa: N801
    cuda = "13.0"


class cuda:  # noqa: N801
    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 0

    @staticmethod
    def init() -> None:
        raise RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
            "and installed a driver from http://www.nvidia.com/Download/index.aspx"
        )
