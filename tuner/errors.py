"""Nightshift's exception types.

Three kinds of failure are kept apart (see STYLE.md): a failed measurement is data (a record
with an error class, never an exception), running out of budget ends a loop normally, and
user or infrastructure errors are raised as the types below, ``from`` their cause.
"""


class NightshiftError(Exception):
    """Base class of every error Nightshift raises on purpose."""


class UserInputError(NightshiftError):
    """Bad input from the command line or a config: the message says what to do.

    The CLI prints it as one line and exits with code 2.
    """


def install_hint(extra: str) -> str:
    """How to install one of the package's extras (``onnx``, ``torch``, ``bench``, ``cuda``): from
    the checkout, since Nightshift is not on a package index yet."""
    return f"pip install -e '.[{extra}]' in Nightshift's checkout"


class UnknownModelError(UserInputError):
    """A model name, file or factory that cannot be loaded."""


class UnknownDeviceError(UserInputError):
    """A device string that does not name a device Nightshift can target."""


class DatabaseError(NightshiftError):
    """The tuning database cannot be opened, read or written."""


class JobConflict(UserInputError):
    """A job of that name already runs on the device (another process started it first)."""


class CudaToolchainError(NightshiftError):
    """CUDA kernels cannot be built or run here (no runtime library, no nvcc or NVRTC)."""
